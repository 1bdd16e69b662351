"""Validity rules of Megatron-FSDP and layer-level activation offload, in megatron's words.

Each rule is None unless the layout turns its switch on (`Layout.fsdp`, `Layout.offload_layers`). Sources (paths
under `megatron/core/`; docs/design/megatron-fsdp-and-offload.md (a) has the full survey):
- FSDP with PP > 1: `distributed/fsdp/mcore_fsdp_adapter.py::_get_dp_tp_mesh` lays the whole world out as
  `(dp_cp ep tp)` and einops fails when PP takes a share of it (no check of its own: stricter);
- FSDP without the distributed optimizer: Megatron-LM turns it on with a warning ("Megatron-FSDP is only compatible
  with --use-distributed-optimizer. Using DistributedOptimizer...", arguments.py `validate_args`), Bridge likewise
  (`_validate_and_apply_megatron_fsdp_configs`): autotune refuses the layout that would silently become another;
- FSDP with the EP A2A overlap: `FullyShardedDataParallel.__init__` refuses the double buffer every Bridge FSDP
  recipe (and autotune) uses;
- FSDP with Muon: Megatron-LM asserts "Emerging optimizer does not support Megatron-FSDP for now."
  (arguments.py `validate_args`);
- layer offload: `transformer/transformer_config.py::__post_init__` (layers, PP, recompute, CUDA graphs, paged
  stash); megatron-core's hybrid stack (`models/hybrid/hybrid_block.py`) never opens the offload context, so a
  hybrid model offloads nothing (stricter).
"""

from __future__ import annotations

from collections.abc import Callable

from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.violations import STRICTER, Violation, violation

__all__ = ["FSDP_RULES", "fsdp_rule_checks"]

Check = Callable[[Job, Layout], Violation | None]


def fsdp_needs_pp1(job: Job, layout: Layout) -> Violation | None:
    if not layout.fsdp or layout.pp == 1:
        return None
    return violation("fsdp_needs_pp1", f"{STRICTER} Megatron-FSDP lays the whole world out as (dp_cp ep tp) "
                     "(mcore_fsdp_adapter._get_dp_tp_mesh), so with pipeline_model_parallel_size "
                     f"{layout.pp} its device mesh does not match the world and the model fails to wrap.",
                     stricter=True, fsdp=True, pp=layout.pp)


def fsdp_needs_dist_opt(job: Job, layout: Layout) -> Violation | None:
    if not layout.fsdp or layout.dist_opt:
        return None
    return violation("fsdp_needs_dist_opt", f"{STRICTER} Megatron-FSDP is only compatible with "
                     "--use-distributed-optimizer (Megatron-LM and Bridge switch it on themselves, so this layout "
                     "would run as dist_opt=true).", stricter=True, fsdp=True, dist_opt=False)


def _fsdp_ep_overlap(version: str) -> Check:
    def fsdp_ep_overlap(job: Job, layout: Layout) -> Violation | None:
        """0.19's check; 0.16.1 has none (its adapter never looks at the EP overlap): refused there as stricter,
        with 0.19's reason."""
        if not layout.fsdp or not layout.ep_overlap:
            return None
        words = ("1F1B overlap with FSDP does not support double buffer. Please set fsdp_double_buffer=False in the "
                 "ddp config. (autotune's Megatron-FSDP runs with the double buffer, as every Megatron-Bridge FSDP "
                 "recipe does)")
        if version >= "0.17":
            return violation("fsdp_ep_overlap", words, fsdp=True, ep_overlap=True)
        return violation("fsdp_ep_overlap", f"{STRICTER} megatron-core 0.19 refuses it: {words}", stricter=True,
                         fsdp=True, ep_overlap=True)
    return fsdp_ep_overlap


def _muon_no_fsdp(version: str) -> Check:
    def muon_no_fsdp(job: Job, layout: Layout) -> Violation | None:
        """Megatron-LM 0.19's assert; 0.16.1's megatron-core refuses the distributed optimizer Megatron-FSDP runs
        (`optimizer/muon.py::get_megatron_muon_optimizer`)."""
        if not layout.fsdp or not job.training.muon:
            return None
        words = ("Emerging optimizer does not support Megatron-FSDP for now." if version >= "0.17" else
                 "muon with dist optimizer is not supported. (Megatron-FSDP runs the distributed optimizer)")
        return violation("muon_no_fsdp", f"{words} (--optimizer muon)", fsdp=True, optimizer="muon")
    return muon_no_fsdp


def offload_layers_lt_num_layers(job: Job, layout: Layout) -> Violation | None:
    layers = job.model.num_layers
    if layout.offload_layers < layers:
        return None
    return violation("offload_layers_lt_num_layers", f"CPU offloading can be done only for layers less than {layers} "
                     f"(cpu_offloading_num_layers {layout.offload_layers}).",
                     offload_layers=layout.offload_layers, num_layers=layers)


def offload_needs_pp1(job: Job, layout: Layout) -> Violation | None:
    if not layout.offload_layers or layout.pp == 1:
        return None
    return violation("offload_needs_pp1", "Currently there is no support for Pipeline parallelism with CPU offloading "
                     f"(pipeline_model_parallel_size {layout.pp}, cpu_offloading_num_layers {layout.offload_layers}).",
                     offload_layers=layout.offload_layers, pp=layout.pp)


def offload_no_recompute(job: Job, layout: Layout) -> Violation | None:
    if not layout.offload_layers or layout.recompute == "none":
        return None
    return violation("offload_no_recompute", "CPU offloading does not work when activation recomputation is enabled "
                     f"(recompute {layout.recompute}, cpu_offloading_num_layers {layout.offload_layers}).",
                     offload_layers=layout.offload_layers, recompute=layout.recompute)


def offload_hybrid(job: Job, layout: Layout) -> Violation | None:
    if not layout.offload_layers or not job.model.is_hybrid:
        return None
    return violation("offload_hybrid", f"{STRICTER} megatron-core's hybrid stack (models/hybrid/hybrid_block.py) "
                     "never opens the CPU offload context, so cpu_offloading_num_layers "
                     f"{layout.offload_layers} would offload nothing.",
                     stricter=True, offload_layers=layout.offload_layers)


def _offload_cuda_graphs(version: str) -> Check:
    def offload_cuda_graphs(job: Job, layout: Layout) -> Violation | None:
        """0.19 lets full-iteration graphs through (their paged stash is refused on its own, MoE only); 0.16.1
        refuses every graph kind."""
        if not layout.offload_layers or layout.cuda_graphs == "none":
            return None
        if version >= "0.17" and layout.cuda_graphs == "full_iteration":
            if not job.model.is_moe:
                return None
            return violation("offload_cuda_graphs", "moe_paged_stash cannot be enabled with cpu_offloading. "
                             "(full-iteration CUDA graphs of a MoE model run with the paged stash; "
                             f"cpu_offloading_num_layers {layout.offload_layers})",
                             offload_layers=layout.offload_layers, cuda_graphs="full_iteration")
        return violation("offload_cuda_graphs", "CUDA graphs not supported with CPU offloading. (cuda_graph_impl "
                         f"{layout.cuda_graphs}, cpu_offloading_num_layers {layout.offload_layers})",
                         offload_layers=layout.offload_layers, cuda_graphs=layout.cuda_graphs)
    return offload_cuda_graphs


def fsdp_rule_checks(version: str) -> dict[str, Check]:
    """Rule name -> check, for the megatron-core `version` whose conditions to use."""
    return {"fsdp_needs_pp1": fsdp_needs_pp1, "fsdp_needs_dist_opt": fsdp_needs_dist_opt,
            "fsdp_ep_overlap": _fsdp_ep_overlap(version), "muon_no_fsdp": _muon_no_fsdp(version),
            "offload_layers_lt_num_layers": offload_layers_lt_num_layers,
            "offload_needs_pp1": offload_needs_pp1, "offload_no_recompute": offload_no_recompute,
            "offload_hybrid": offload_hybrid, "offload_cuda_graphs": _offload_cuda_graphs(version)}


_ADAPTER = "megatron/core/distributed/fsdp/mcore_fsdp_adapter.py"
_CONFIG = "megatron/core/transformer/transformer_config.py (__post_init__, cpu_offloading)"
FSDP_RULES: tuple[tuple[str, frozenset[str], str], ...] = (
    ("fsdp_needs_pp1", frozenset({"pp", "fsdp"}), _ADAPTER + " (_get_dp_tp_mesh); autotune is stricter"),
    ("fsdp_needs_dist_opt", frozenset({"dist_opt", "fsdp"}),
     "megatron/core/optimizer/distrib_optimizer.py (DistributedOptimizer, Megatron-FSDP's optimizer; "
     "megatron/training/arguments.py validate_args switches it on); autotune is stricter"),
    ("fsdp_ep_overlap", frozenset({"ep_overlap", "fsdp"}), _ADAPTER + " (FullyShardedDataParallel.__init__)"),
    ("muon_no_fsdp", frozenset({"fsdp"}),
     "megatron/core/optimizer/muon.py (0.16.1: get_megatron_muon_optimizer); 0.19: Megatron-LM "
     "megatron/training/arguments.py validate_args (the emerging-optimizer check, core_v0.19.2 :1684-1686)"),
    ("offload_layers_lt_num_layers", frozenset({"offload_layers"}), _CONFIG),
    ("offload_needs_pp1", frozenset({"pp", "offload_layers"}), _CONFIG),
    ("offload_no_recompute", frozenset({"recompute", "offload_layers"}), _CONFIG),
    ("offload_hybrid", frozenset({"offload_layers"}),
     "megatron/core/models/hybrid/hybrid_block.py (no offload context); autotune is stricter"),
    ("offload_cuda_graphs", frozenset({"cuda_graphs", "offload_layers"}),
     _CONFIG + "; moe_paged_stash (0.19)"),
)

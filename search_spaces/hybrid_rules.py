"""Validity rules of hybrid Mamba models (megatron-core 0.19 `models/hybrid/`, `ssm/`), in megatron-core's words.

Each rule is None for a GPT model. Sources (paths under `megatron/core/`):
- TP: `ssm/mamba_mixer.py:260` ("nheads must be evenly divisble by tp_size", sic) and `:268` (groups);
- CP: `ssm/mamba_context_parallel.py:106-130` (heads per TP rank over CP; groups per TP rank over CP, or CP over
  them, the group state then replicated);
- FP8: `ssm/mamba_mixer.py:252-256` (in_proj's output width a multiple of 16);
- the pipeline split: `models/hybrid/hybrid_layer_allocation.py::select_pipeline_segment` without '|' separators
  (an even split, or first/last stage layers with the middle stages even; VPP needs '|' separators);
- autotune does not write '|'-separated patterns, so a `pipeline_layout` string and the embedding/loss accounting
  (which the hybrid split ignores) are refused for hybrid models (stricter than megatron-core).
"""

from __future__ import annotations

from search_spaces.job import Job
from search_spaces.layout import SPLIT_FIELDS, Layout
from search_spaces.violations import STRICTER, Violation, violation

__all__ = ["mamba_divisible_by_tp", "mamba_heads_divisible_by_cp",
           "mamba_groups_vs_cp", "mamba_fp8_in_proj_width", "hybrid_vpp_needs_pipes", "hybrid_layers_split",
           "hybrid_split_fields", "hybrid_no_ep_overlap", "hybrid_block_recompute",
           "HYBRID_RULES", "mamba_tp_ok", "mamba_cp_ok"]


def mamba_tp_ok(job: Job, tp: int) -> bool:
    """Both TP rules hold (the space's generator asks this)."""
    m = job.model.mamba
    return m is None or (m.num_heads % tp == 0 and m.num_groups % tp == 0)


def mamba_cp_ok(job: Job, tp: int, cp: int) -> bool:
    """Both CP rules hold for TP-valid sizes (the space's generator asks this)."""
    m = job.model.mamba
    if m is None or cp == 1:
        return True
    groups = m.num_groups // tp
    return (m.num_heads // tp) % cp == 0 and (cp % groups == 0 if groups < cp else groups % cp == 0)


def mamba_divisible_by_tp(job: Job, layout: Layout) -> Violation | None:
    """Heads, then groups, as MambaMixer asserts them (:260, :268). One rule: the heads are a multiple of the
    groups (:272), so TP dividing the groups divides the heads, and heads that TP does not divide mean groups
    that it does not divide either."""
    m, tp = job.model.mamba, layout.tp
    if m is None or m.num_groups % tp == 0:
        return None
    if m.num_heads % tp:
        return violation("mamba_divisible_by_tp", f"nheads must be evenly divisble by tp_size (mamba_num_heads "
                         f"({m.num_heads}) must be a multiple of tensor_model_parallel_size ({tp})).",
                         mamba_num_heads=m.num_heads, tp=tp)
    return violation("mamba_divisible_by_tp", f"ngroups must be evenly divisible by tp_size (mamba_num_groups "
                     f"({m.num_groups}) must be a multiple of tensor_model_parallel_size ({tp})).",
                     mamba_num_groups=m.num_groups, tp=tp)


def mamba_heads_divisible_by_cp(job: Job, layout: Layout) -> Violation | None:
    m, tp, cp = job.model.mamba, layout.tp, layout.cp
    if m is None or cp == 1 or m.num_heads % tp or (m.num_heads // tp) % cp == 0:
        return None  # a TP that does not divide the heads is mamba_heads_divisible_by_tp's violation
    return violation("mamba_heads_divisible_by_cp", f"nheads must be evenly divisible by tp_size * cp_size "
                     f"(mamba_num_heads ({m.num_heads}) / tensor_model_parallel_size ({tp}) = {m.num_heads // tp} "
                     f"must be a multiple of context_parallel_size ({cp})).",
                     mamba_num_heads=m.num_heads, tp=tp, cp=cp)


def mamba_groups_vs_cp(job: Job, layout: Layout) -> Violation | None:
    m, tp, cp = job.model.mamba, layout.tp, layout.cp
    if m is None or cp == 1 or m.num_groups % tp:
        return None
    local = m.num_groups // tp
    if local < cp and cp % local:
        message = (f"cp_size must be evenly divisible by ngroups/tp_size (context_parallel_size ({cp}), "
                   f"mamba_num_groups ({m.num_groups}) / tensor_model_parallel_size ({tp}) = {local}).")
    elif local >= cp and local % cp:
        message = (f"ngroups must be evenly divisible by tp_size * cp_size (mamba_num_groups ({m.num_groups}) / "
                   f"tensor_model_parallel_size ({tp}) = {local}, context_parallel_size ({cp})).")
    else:
        return None
    return violation("mamba_groups_vs_cp", message, mamba_num_groups=m.num_groups, tp=tp, cp=cp)


def mamba_fp8_in_proj_width(job: Job, layout: Layout) -> Violation | None:
    m = job.model.mamba
    if m is None or job.training.precision not in ("fp8", "fp4") or m.in_proj_width % 16 == 0:
        return None
    return violation("mamba_fp8_in_proj_width", "For FP8, the innermost dimension of the Mamba layer input "
                     f"projection output tensor must be a multiple of 16 (2 * d_inner + 2 * ngroups * d_state + "
                     f"nheads = {m.in_proj_width}).", in_proj_width=m.in_proj_width)


def hybrid_vpp_needs_pipes(job: Job, layout: Layout) -> Violation | None:
    if not job.model.is_hybrid or layout.vpp is None:
        return None
    return violation("hybrid_vpp_needs_pipes", "Virtual pipeline parallelism (vp_stage != None) is not supported "
                     "when hybrid_layer_pattern has no pipe ('|') separators. Add '|' separators to define explicit "
                     f"pipeline/virtual-pipeline stage boundaries (vpp={layout.vpp}; autotune does not write them).",
                     vpp=layout.vpp)


def hybrid_layers_split(job: Job, layout: Layout) -> Violation | None:
    """select_pipeline_segment without pipes and without first/last stage layers: PP divides the layers (it
    replaces GPT's `get_num_layers_to_build` rules; the uneven split's middle stages are TransformerConfig's
    `middle_layers_divisible`, which hybrid configs run too)."""
    m, pp = job.model, layout.pp
    if not m.is_hybrid or pp == 1 or layout.pipeline_layout is not None or layout.embedding_loss_split:
        return None
    n = m.num_layers
    if layout.first_stage_layers is not None or layout.last_stage_layers is not None or n % pp == 0:
        return None
    return violation("hybrid_layers_split", f"Number of layers ({n}) must be evenly divisible by "
                     f"pipeline-model-parallel-size ({pp}) when no pipe separators are specified in the pattern.",
                     num_layers=n, pp=pp)


def hybrid_no_ep_overlap(job: Job, layout: Layout) -> Violation | None:
    """The EP A2A overlap's combined 1F1B schedule calls the model's `build_schedule_plan`
    (`pipeline_parallel/combined_1f1b.py:382`), which `GPTModel` has and `HybridModel` does not."""
    if not job.model.is_hybrid or not layout.ep_overlap:
        return None
    return violation("hybrid_no_ep_overlap", "overlap_moe_expert_parallel_comm needs the model's build_schedule_plan "
                     "(pipeline_parallel/combined_1f1b.py), which HybridModel does not have.", ep_overlap=True)


def hybrid_block_recompute(job: Job, layout: Layout) -> Violation | None:
    """Full recompute of the first `recompute_num_layers` layers of each chunk (method 'block'): megatron-core's
    `HybridStack` runs it (`hybrid_block.py`, `checkpointed_forward`), autotune's memory model does not split a hybrid
    chunk's layers into recomputed and kept ones."""
    n = job.training.recompute_num_layers
    if not job.model.is_hybrid or layout.recompute != "full" or n is None:
        return None
    return violation("hybrid_block_recompute", f"{STRICTER} autotune models full recompute of a hybrid model's every "
                     f"layer, not of the first recompute_num_layers ({n}) of each chunk.", stricter=True,
                     recompute_num_layers=n)


def hybrid_split_fields(job: Job, layout: Layout) -> Violation | None:
    if not job.model.is_hybrid or not (layout.pipeline_layout is not None or layout.embedding_loss_split):
        return None
    field = "pipeline_layout" if layout.pipeline_layout is not None else "embedding_loss_split"
    return violation("hybrid_split_fields", f"{STRICTER} a hybrid model's pipeline split is its pattern's (even, or "
                     f"first/last stage layers; '|' separators are not written), and {field} is not one of them.",
                     stricter=True, pipeline_layout=layout.pipeline_layout,
                     embedding_loss_split=layout.embedding_loss_split)


_SSM = "megatron/core/ssm/"
_ALLOC = "megatron/core/models/hybrid/hybrid_layer_allocation.py (select_pipeline_segment)"
# (name, fields read, source), appended to `rules._TABLE`
HYBRID_RULES: tuple[tuple[str, frozenset[str], str], ...] = (
    ("mamba_divisible_by_tp", frozenset({"tp"}), _SSM + "mamba_mixer.py (MambaMixer.__init__)"),
    ("mamba_heads_divisible_by_cp", frozenset({"tp", "cp"}),
     _SSM + "mamba_context_parallel.py (MambaContextParallel.__init__)"),
    ("mamba_groups_vs_cp", frozenset({"tp", "cp"}), _SSM + "mamba_context_parallel.py (MambaContextParallel.__init__)"),
    ("mamba_fp8_in_proj_width", frozenset({"tp"}), _SSM + "mamba_mixer.py (MambaMixer.__init__, FP8)"),
    ("hybrid_vpp_needs_pipes", frozenset({"pp", "vpp"}), _ALLOC),
    ("hybrid_layers_split", frozenset({"pp", "vpp"}) | SPLIT_FIELDS, _ALLOC),
    ("hybrid_split_fields", frozenset({"pp", "vpp"}) | SPLIT_FIELDS,
     _ALLOC + "; autotune is stricter: it writes no '|' patterns"),
    ("hybrid_block_recompute", frozenset({"recompute"}),
     "megatron/core/models/hybrid/hybrid_block.py (checkpointed_forward); autotune is stricter"),
    ("hybrid_no_ep_overlap", frozenset({"ep", "ep_overlap"}),
     "megatron/core/pipeline_parallel/combined_1f1b.py (build_schedule_plan: GPTModel only)"),
)

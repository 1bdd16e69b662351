"""What is trained, independent of the layout: sequence, batch, the precision recipe and the overlap switches.

Every field is a switch a real run sets, named as megatron-core / Megatron-Bridge name it, so the launch lines
can carry it (`autotune.outputs.launch`) and the cost models condition on it (`autotune.cost`). The defaults are
what Megatron-Bridge v0.3.1 (the release that pins megatron-core 0.16.1) runs for NVIDIA's published
performance tables, `scripts/performance/`:

- precision: `utils/precision.py` maps `fp8_cs` to `bf16_with_fp8_current_scaling_mixed` (`fp8_recipe="tensorwise"`,
  `fp8_param_gather=True`) and `fp8_mx` to `bf16_with_mxfp8_mixed` (`fp8_recipe="mxfp8"`, `fp8_param_gather=True`);
  FP8 attention (`fp8_dot_product_attention`) is off, as in those configs; Bridge 0.5+'s MoE full-iteration
  recipes turn it on (`perf_recipes/qwen/common.py`);
  `training/mixed_precision.py` defines both. `fp8_recipe=None` takes the GPU's own: tensorwise on Hopper,
  MXFP8 on Blackwell (the published H100 "FP8" rows are FP8-CS, the B200/GB200 "MXFP8" rows fp8_mx). `fp4` is
  `bf16_with_nvfp4_mixed` (`fp4="e2m1"`, `fp4_recipe="nvfp4"`: Transformer Engine's NVFP4BlockScaling, every
  linear layer's three GEMMs in FP4, Blackwell only, TE >= 2.7), with FP4 primary weights off (the preset turns
  `fp4_param_gather` on; the launch lines leave it off, as the memory and DP terms assume).
- `grad_reduce_in_fp32=False`: every perf config sets `mixed_precision.grad_reduce_in_fp32=False` and
  `ddp.grad_reduce_in_fp32=False` (`configs/llama/llama3_llm_pretrain.py`, `qwen3_llm_pretrain.py`,
  `deepseek_llm_pretrain.py`); the library recipes (`recipes/common.py`) keep True, Megatron-LM turns it on for bf16.
- `precision_aware_optimizer=True`, `optimizer_moments="fp32"`: `use_precision_aware_optimizer=True` is set for
  bf16 runs (`utils/overrides.py` `set_post_overrides`) with fp32 `exp_avg_dtype`/`exp_avg_sq_dtype`; only the
  DeepSeek-V3 recipe keeps bf16 moments and bf16 main grads (`recipes/deepseek/deepseek_v3.py`). megatron-core's
  and Megatron-LM's own default is off (the optimizer then gives the master weights fp32 gradient copies).
- overlap: `ddp.overlap_grad_reduce=True`, `ddp.overlap_param_gather=True` (`recipes/common.py`), `tp_comm_overlap`
  through `CommOverlapConfig(tp_comm_overlap=True)` (auto-disabled at TP 1 or without SP, `training/comm_overlap.py`),
  `overlap_moe_expert_parallel_comm` per layout (`Layout.ep_overlap`, searched), with `delay_wgrad_compute=True`
  as Bridge 0.6's perf recipes pair them (30 of 32, `CommOverlapConfig(overlap_moe_expert_parallel_comm=True,
  delay_wgrad_compute=True)`).
- loss: `cross_entropy_loss_fusion=True` with `cross_entropy_fusion_impl="te"` (every pretrain recipe, and the
  perf overrides `_set_common_perf_overrides`); megatron-core's own default is the unfused loss.
- MoE: `moe_router_force_load_balancing=False` (megatron-core's default; the performance scripts set True to
  benchmark, `scripts/performance/configs/qwen/qwen3_llm_pretrain.py`, so real training routes less evenly than
  their published rows), `moe_grouped_gemm=True`, `moe_permute_fusion=True`, `moe_token_dispatcher_type="alltoall"`
  (the model bridges); `moe_token_dispatcher=None` takes the GPU's own as Bridge 0.6's perf recipes do: the flex
  dispatcher with HybridEP on Blackwell (every MXFP8 MoE recipe on B200/GB200/GB300, `moe_flex_dispatcher_backend=
  "hybridep"`), alltoall on Hopper and Ampere.
- CUDA graphs per layout (`Layout.cuda_graphs`, searched); Transformer Engine's capture `cuda_graph_modules`, by
  default what Bridge 0.6 captures: `attn,moe_router,moe_preprocess` for MoE models, the whole layer for dense ones.
  Full-iteration graphs of a MoE model run with the paged stash and a rank capacity factor of 1.5 (Bridge 0.6
  `perf_recipes/qwen/common.py::_enable_hybridep_full_iteration_mxfp8`: `moe_paged_stash=True`,
  `moe_expert_rank_capacity_factor=1.5`), the static token buffers a captured dispatcher needs. Token dropping
  (`moe_expert_capacity_factor`, with or without padding every expert to its capacity) is off, as in megatron-core;
  NVIDIA's "tokendrop" rows set a capacity factor of 1.0.
- BF16 edge layers: `bf16_layers_at_start` / `bf16_layers_at_end` layers of the decoder run outside the FP8/FP4
  autocast (megatron-core `first_last_layers_bf16` with `num_layers_at_start_in_bf16` / `num_layers_at_end_in_bf16`;
  `fp8_utils.py::is_first_last_bf16_layer`, `fp4_utils.py::get_fp4_context`, by global layer index; a hybrid
  model's layers are its pattern's symbols, `models/hybrid/hybrid_block.py:333-365`). Off by default, as every
  perf recipe but Nemotron-3 Super's NVFP4 one (`nemotron_3_super_bf16_with_nvfp4_mixed`: the last 14 layers, none
  at the start, Bridge `MixedPrecisionConfig`'s 0) runs; Bridge's FP8-CS preset turns it on and the perf configs off.
- recompute: megatron-core's selective default recomputes `core_attn` (`TransformerConfig.recompute_modules`);
  full recompute is `uniform` over every layer unless `recompute_num_layers` gives a `block` of N layers per chunk.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from search_spaces.megatron_version import RULE_SETS, megatron_core_choice, rules_version
from search_spaces.releases import DEFAULT_RELEASE, release_names, release_rule_set, resolve_release

__all__ = ["TrainingSpec", "training_spec", "default_cuda_graph_modules", "TRAINING_FIELDS", "Precision", "FP8Recipe",
           "Dispatcher", "FlexBackend",
           "MomentDtype", "ReleaseFallback", "PRECISION_CHOICES", "FP8_RECIPES", "DISPATCHERS", "FLEX_BACKENDS",
           "CUDA_GRAPH_MODULES",
           "RECOMPUTE_MODULES"]

Precision = Literal["bf16", "fp8", "fp4"]
FP8Recipe = Literal["delayed", "tensorwise", "mxfp8", "blockwise"]
Dispatcher = Literal["alltoall", "allgather", "flex"]
FlexBackend = Literal["deepep", "hybridep", "ncclep"]
CrossEntropyFusion = Literal["te", "native", "none"]
MomentDtype = Literal["fp32", "bf16"]
Optimizer = Literal["adam", "muon"]
OPTIMIZERS: tuple[str, ...] = ("adam", "muon")
PRECISION_CHOICES: tuple[str, ...] = ("bf16", "fp8", "fp4")
FP8_RECIPES: tuple[str, ...] = ("delayed", "tensorwise", "mxfp8", "blockwise")
DISPATCHERS: tuple[str, ...] = ("alltoall", "allgather", "flex")
FLEX_BACKENDS: tuple[str, ...] = ("deepep", "hybridep", "ncclep")  # megatron-core `moe_flex_dispatcher_backend`
# megatron-core 0.19 `CudaGraphModule` (transformer/enums.py; 0.16.1's `CudaGraphScope` less full_iteration, which
# is `cuda_graph_impl="full_iteration"` now)
CUDA_GRAPH_MODULES: tuple[str, ...] = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
# megatron-core 0.16.1 `TransformerConfig.recompute_modules` (transformer_config.py)
RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                                      "shared_experts")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingSpec:
    """The training job's own settings (see the module docstring for each default's source)."""

    seq_length: int = 4096
    global_batch_size: int = 256
    precision: Precision = "bf16"
    fp8_recipe: FP8Recipe | None = None  # None: tensorwise (current scaling) on Hopper, MXFP8 on Blackwell
    fp8_param_gather: bool = True  # FP8 primary weights (fp8 only): Bridge's fp8 recipes turn it on
    fp8_dot_product_attention: bool = False  # the attention core in FP8 (fp8 only; TE's cuDNN FP8 fused attention)
    grad_reduce_in_fp32: bool = False  # fp32 main grads in the DDP buffer (4 B/param instead of 2)
    optimizer_moments: MomentDtype = "fp32"  # Adam exp_avg / exp_avg_sq dtype (precision-aware optimizer)
    precision_aware_optimizer: bool = True  # `use_precision_aware_optimizer`: bf16 grads feed the fp32 master directly
    optimizer: Optimizer = "adam"  # "muon": Newton-Schulz-orthogonalised momentum on the 2-D weights, Adam on the
    #   rest (megatron-core 0.19 `optimizer/emerging_optimizers.py`); with the layout's dist_opt, layer-wise sharded
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True  # needs the distributed optimizer (a layout without it has none to overlap)
    tp_comm_overlap: bool = True  # Transformer Engine userbuffers; only where TP > 1 and SP is on
    delay_wgrad_compute: bool = True  # with the EP A2A overlap (Layout.ep_overlap): weight gradients behind the combine
    moe_token_dispatcher: Dispatcher | None = None  # None: the GPU's own (module docstring; Job.moe_dispatcher)
    moe_flex_backend: FlexBackend | None = None  # flex dispatcher backend; None: hybridep (deepep on a flex H100 job)
    moe_rank_capacity_factor: float = 1.5  # the paged stash's per-rank token budget (full-iteration graphs of MoE)
    moe_expert_capacity_factor: float | None = None  # token dropping: an expert keeps at most this times its even
    #   share of the tokens (megatron-core `moe_expert_capacity_factor`); None: dropless
    moe_pad_expert_input_to_capacity: bool = False  # drop-and-pad: every expert runs exactly its capacity
    moe_grouped_gemm: bool = True
    moe_permute_fusion: bool = True  # TE's fused permutation keeps an int32 row map, not the token indices
    moe_router_force_load_balancing: bool = False  # benchmark routing (every EP rank gets its share); real training
    #   routes by the learned router with an aux loss, so the busiest rank carries more
    cross_entropy_fusion: CrossEntropyFusion = "te"  # Bridge: cross_entropy_loss_fusion=True, impl "te"
    cuda_graph_modules: tuple[str, ...] | None = None  # per-layer graphs capture these; () the whole layer; None:
    #   Bridge 0.6's (attn, moe_router, moe_preprocess) for MoE models, the whole layer for dense ones
    recompute_modules: tuple[str, ...] = ("core_attn",)  # what recompute="selective" recomputes
    recompute_num_layers: int | None = None  # recompute="full": None uniform over every layer; N a block per chunk
    bf16_layers_at_start: int = 0  # decoder layers kept in BF16 at the start of an FP8/FP4 run (first_last_layers_bf16)
    bf16_layers_at_end: int = 0  # ... and at its end
    # the megatron-core release the cluster runs: its validity rules and launch lines (search_spaces.megatron_version)
    megatron_core: str = field(default_factory=rules_version)
    # the NeMo / Megatron-Bridge release it runs: the throughput model's per-release factors (search_spaces.releases)
    release: str = DEFAULT_RELEASE

    def __post_init__(self) -> None:
        if type(self.seq_length) is not int or self.seq_length <= 0:
            raise ValueError(f"`seq_length > 0` must hold (an integer), but got (seq_length={self.seq_length!r}).")
        if type(self.global_batch_size) is not int or self.global_batch_size <= 0:
            raise ValueError(f"`global_batch_size > 0` must hold (an integer), but got "
                             f"(global_batch_size={self.global_batch_size!r}).")
        _one_of("precision", self.precision, PRECISION_CHOICES)
        if self.fp8_recipe is not None:
            _one_of("fp8_recipe", self.fp8_recipe, FP8_RECIPES)
            if self.precision == "bf16":
                raise ValueError(f"fp8_recipe {self.fp8_recipe} needs precision fp8 (or fp4, whose non-FP4 layers "
                                 f"it scales); at bf16 no layer runs in FP8.")
        if self.fp8_dot_product_attention and self.precision != "fp8":
            raise ValueError("fp8_dot_product_attention needs precision fp8 (Transformer Engine runs FP8 attention "
                             "inside its FP8 autocast only).")
        _one_of("optimizer_moments", self.optimizer_moments, ("fp32", "bf16"))
        _one_of("optimizer", self.optimizer, OPTIMIZERS)
        if self.optimizer == "muon" and self.optimizer_moments == "bf16":
            raise ValueError("optimizer_moments bf16 is the precision-aware optimizer's, which needs megatron-core's "
                             "distributed optimizer; Muon runs without it (its Adam weights keep fp32 moments).")
        if self.moe_token_dispatcher is not None:
            _one_of("moe_token_dispatcher", self.moe_token_dispatcher, DISPATCHERS)
        if self.moe_flex_backend is not None:
            _one_of("moe_flex_backend", self.moe_flex_backend, FLEX_BACKENDS)
        if (isinstance(self.moe_rank_capacity_factor, bool) or not isinstance(self.moe_rank_capacity_factor,
                                                                              (int, float))
                or not 1.0 <= self.moe_rank_capacity_factor <= 64.0):
            raise ValueError(f"`1 <= moe_rank_capacity_factor <= 64` must hold, but got "
                             f"{self.moe_rank_capacity_factor!r}.")
        if self.moe_expert_capacity_factor is not None and (
                isinstance(self.moe_expert_capacity_factor, bool)
                or not isinstance(self.moe_expert_capacity_factor, (int, float))
                or not 0.0 < self.moe_expert_capacity_factor <= 64.0):
            raise ValueError(f"`0 < moe_expert_capacity_factor <= 64` (or unset: dropless) must hold, but got "
                             f"{self.moe_expert_capacity_factor!r}.")
        if self.moe_pad_expert_input_to_capacity and self.moe_expert_capacity_factor is None:
            # megatron-core's own message (transformer_config.py 0.19.2 :1686-1690)
            raise ValueError("moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity")
        _one_of("cross_entropy_fusion", self.cross_entropy_fusion, ("te", "native", "none"))
        if self.cuda_graph_modules is not None:
            bad = [s for s in self.cuda_graph_modules if s not in CUDA_GRAPH_MODULES]
            if bad:
                raise ValueError(f"cuda_graph_modules must be a subset of {CUDA_GRAPH_MODULES}, "
                                 f"but got {self.cuda_graph_modules!r}.")
        unknown = [m for m in self.recompute_modules if m not in RECOMPUTE_MODULES]
        if unknown or not self.recompute_modules:
            raise ValueError(f"recompute_modules must be a non-empty subset of {RECOMPUTE_MODULES}, but got "
                             f"{self.recompute_modules!r}.")
        _one_of("megatron_core", self.megatron_core, RULE_SETS)
        _one_of("release", self.release, release_names())
        if self.recompute_num_layers is not None and (type(self.recompute_num_layers) is not int
                                                      or self.recompute_num_layers <= 0):
            raise ValueError(f"`recompute_num_layers > 0` (or unset) must hold, but got "
                             f"({self.recompute_num_layers!r}).")

        for name in ("bf16_layers_at_start", "bf16_layers_at_end"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"`{name} >= 0` must hold (an integer), but got ({name}={value!r}).")
        if self.bf16_layers_at_start or self.bf16_layers_at_end:
            if self.precision == "bf16":
                raise ValueError("bf16_layers_at_start / bf16_layers_at_end keep layers out of an FP8 or FP4 run's "
                                 "low precision; this run is bf16 already (precision fp8 or fp4 needs them).")
            if self.precision == "fp8" and self.fp8_recipe == "delayed":
                # megatron-core's own message (transformer_config.py 0.19.2 :1402-1403)
                raise ValueError("Delayed scaling does not support first / last layer in BF16.")

    @property
    def fp8(self) -> bool:
        return self.precision == "fp8"

    @property
    def bf16_edges(self) -> tuple[int, int]:
        """(first, last) decoder layers that run in BF16 in this run: megatron-core's `first_last_layers_bf16`
        counts in a low-precision run, (0, 0) in a bf16 one."""
        if self.precision == "bf16":
            return (0, 0)
        return (self.bf16_layers_at_start, self.bf16_layers_at_end)

    @property
    def fp4(self) -> bool:
        """NVFP4 training (`bf16_with_nvfp4_mixed`)."""
        return self.precision == "fp4"

    def fp8_params(self, dist_opt: bool) -> bool:
        """FP8 primary weights in effect: `fp8_param_gather`, which needs megatron-core's distributed optimizer
        ("--fp8-param-gather only supported with distributed optimizer", arguments.py), so not without the layout's
        dist_opt and never with Muon (`adam_dist_opt`)."""
        return self.fp8_param_gather and self.adam_dist_opt(dist_opt)

    @property
    def muon(self) -> bool:
        """The Muon optimizer (megatron-core's emerging optimizers)."""
        return self.optimizer == "muon"

    def adam_dist_opt(self, dist_opt: bool) -> bool:
        """Whether megatron-core's DistributedOptimizer (ZeRO-1, byte-level shards) runs: the layout's dist_opt
        with Adam. With Muon, dist_opt is the layer-wise distributed optimizer instead: Megatron-LM turns
        `use_distributed_optimizer` off for an emerging optimizer and shards it layer-wise (arguments.py 0.19.2
        :1669-1682, `LayerWiseDistributedOptimizer`), and Bridge's Muon recipes set `ddp.use_distributed_optimizer
        =False` with `optimizer="dist_muon"` (`recipes/kimi/h100/kimi_k2.py::_apply_kimi_k2_optimizer`)."""
        return dist_opt and not self.muon

    def precision_aware(self, dist_opt: bool) -> bool:
        """Whether the precision-aware optimizer runs: megatron-core supports it with the distributed optimizer
        only ("--use-precision-aware-optimizer only supported with distributed optimizer", `optimizer_config.py`),
        and bf16 moments are its feature; Muon's layer-wise optimizer is not that optimizer (`adam_dist_opt`)."""
        return self.adam_dist_opt(dist_opt) and (self.precision_aware_optimizer or self.optimizer_moments == "bf16")

    @property
    def moe_drop_padded(self) -> bool:
        """Drop-and-pad MoE (a capacity factor with every expert padded to its capacity): static shapes, which
        per-layer CUDA graphs of the MoE block need (megatron-core `transformer_config.py`)."""
        return self.moe_expert_capacity_factor is not None and self.moe_pad_expert_input_to_capacity

    def moments(self, dist_opt: bool) -> MomentDtype:
        """The Adam moments' dtype in effect: bf16 only with the precision-aware optimizer (so dist opt)."""
        return "bf16" if self.optimizer_moments == "bf16" and self.adam_dist_opt(dist_opt) else "fp32"


def default_cuda_graph_modules(is_moe: bool, hybrid: bool = False) -> tuple[str, ...]:
    """What per-layer CUDA graphs capture when the training spec does not say: Megatron-Bridge 0.6's perf recipes'
    `attn`, `moe_router`, `moe_preprocess` for MoE models (`perf_recipes/*/common.py`), the whole layer (an empty
    list) for dense ones; hybrid models add `mamba` (Bridge's `perf_recipes/nemotronh/gb200/nemotronh.py`: Nemotron-3
    `["attn", "mamba", "moe_router", "moe_preprocess"]`, Nemotron-H 56B `["mamba", "attn"]`)."""
    if is_moe:
        return ("attn", "mamba", "moe_router", "moe_preprocess") if hybrid else ("attn", "moe_router", "moe_preprocess")
    return ("attn", "mamba") if hybrid else ()


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, but got {value!r}.")


TRAINING_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(TrainingSpec))


class ReleaseFallback(UserWarning):
    """A release autotune has no factors for was replaced by the nearest one (the message says which)."""


def training_spec(**values: Any) -> TrainingSpec:
    """A TrainingSpec from keyword values; None means "the default". Unknown names raise ValueError. A `release`
    may be any NeMo tag or Bridge version (`search_spaces.releases.resolve_release`); one without factors becomes
    the nearest with a `ReleaseFallback` warning, and sets the rule set unless `megatron_core` is given."""
    unknown = sorted(set(values) - set(TRAINING_FIELDS))
    if unknown:
        raise ValueError(f"unknown training option(s) {unknown}; options are {list(TRAINING_FIELDS)}.")
    for name in ("recompute_modules", "cuda_graph_modules"):
        items = values.get(name)
        if isinstance(items, str):  # the CLI's comma-separated list
            values[name] = tuple(m.strip() for m in items.split(",") if m.strip())
        elif items is not None:
            values[name] = tuple(items)
    if values.get("megatron_core") is not None:
        values["megatron_core"] = megatron_core_choice(values["megatron_core"])
    if values.get("release") is not None:
        name, warning = resolve_release(values["release"])
        if warning is not None:
            warnings.warn(warning, ReleaseFallback, stacklevel=2)
        values["release"] = name
        if values.get("megatron_core") is None:  # the release's own megatron-core judges its layouts
            values["megatron_core"] = release_rule_set(name)
    given = values
    return TrainingSpec(**{k: v for k, v in given.items() if v is not None})

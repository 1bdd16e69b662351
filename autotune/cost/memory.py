"""Memory per GPU of a Megatron-Core training layout, by term, as a real GPU run keeps it.

    weights + gradients + optimizer + activations + workspace   = peak allocated (what "max allocated" measures)
    + overhead (CUDA context, NCCL, TE userbuffers, DeepEP / HybridEP, a full-iteration graph's pool held through
      the optimizer step, the allocator's reserve)  = device memory at the peak

Pure arithmetic on `Job` and `Layout` (no torch). Every term is one function that cites its source; the
formulas, their sources and their limits are restated in `docs/memory-model.md`. Where the parameters are:
`autotune.cost.placement` (shared with the step-time model); what activations keep:
`autotune.cost.activations`; the allowance outside the tensors: `autotune.cost.allowance`. The terms are added up in
one place, `autotune/cost/peak_memory.py` (on arrays of layouts; one layout: `autotune.cost.score.estimate_memory`),
which finds the most loaded GPU by evaluating every distinct pipeline stage at two moments of the step: the
activation peak (the first backward after the pipeline's warm-up) and the optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from autotune.cost.activation_units import UnitActivations, unit_activation_bytes
from autotune.cost.activations import ActivationAssumptions, inflight_microbatches_per_chunk
from autotune.cost.allowance import DEFAULT_ALLOWANCE, AllowanceAssumptions
from autotune.cost.efficiency import OPERAND_BYTES
from autotune.cost.muon import state_bytes as muon_state_bytes
from autotune.cost.muon import step_transient_bytes as muon_step_transient_bytes
from autotune.cost.placement import (
    EVEN,
    Split,
    StageParams,
    _stage_params_cached,
    bf16_chunk_kinds,
    bf16_stage_layers,
    chunk_kinds,
    chunk_layer_counts,
    final_norm_chunk,
    fsdp_unit_params_per_gpu,
    layer_gemm_params_per_gpu,
    nonunit_params_per_gpu,
    padded_vocab_size,
    pipeline_split,
)
from search_spaces.cluster import GPUSpec
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.model import ModelSpec
from search_spaces.training import TrainingSpec
from search_spaces.units import GIB

__all__ = [
    "MemoryAssumptions",
    "DEFAULT_ASSUMPTIONS",
    "LOCAL_SPEC_ASSUMPTIONS",
    "MemoryEstimate",
    "TERMS",
    "offload_host_bytes",
    "host_overflow_bytes",
    "memory_status",
    "offloaded_kinds",
    "microbatch_activation_terms",
    "gemm_weight_bytes_per_param",
    "graph_pool_held_bytes",
    "gradient_bytes_per_param",
    "optimizer_bytes_per_param",
]



@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryAssumptions(ActivationAssumptions):
    """Everything the formulas assume that the job and the layout do not say (see docs/memory-model.md):
    the activation assumptions, the parameter placement's conventions, and the allowance's constants."""

    make_vocab_size_divisible_by: int = 128  # megatron `--make-vocab-size-divisible-by`
    # MLA's q/kv down projections: duplicated on every TP rank in the Transformer Engine spec (GPU runs); the
    # local spec (`get_gpt_layer_local_spec`, CPU runs) makes them column-parallel, split over TP
    mla_down_proj_split: bool = False
    allowance: AllowanceAssumptions = DEFAULT_ALLOWANCE


DEFAULT_ASSUMPTIONS = MemoryAssumptions()
# megatron-core's local (non-TE) layer spec, as the CPU proxy runs it: no flash attention (fp32 softmax and its
# bf16 copy kept per score), unfused SwiGLU, MLA down projections split over TP; the proxy's norms save what TE's do
LOCAL_SPEC_ASSUMPTIONS = MemoryAssumptions(transformer_engine=False, flash_attention=False, attention_score_bytes=6.0,
                                           fused_swiglu=False, mla_down_proj_split=True)


# --- bytes per parameter (Megatron-LM `theoretical_memory_usage.py`, generalised to the recipe) ------------
def gemm_weight_bytes_per_param(training: TrainingSpec, fp8_recipe: str | None, arch: str,
                                dist_opt: bool = True) -> float:
    """Bytes a transformer-layer GEMM weight costs on its GPU, primary copy plus Transformer Engine's caches
    (`dist_opt`: the layout's, without which there are no FP8 primary weights, `TrainingSpec.fp8_params`).

    bf16: 2. FP8 (TE v2.11 `module/base.py::get_weight_workspace`, kept across micro-batches because megatron
    passes `is_first_microbatch`; `tensor/float8_tensor.py`, `tensor/mxfp8_tensor.py`):
    - without `fp8_param_gather`: the bf16 primary weight (2) plus an FP8 cache: data and transpose on Hopper
      (2), the data alone on Blackwell (1: non-TN FP8 GEMMs need no transpose), MXFP8's rowwise and columnwise
      copies with one E8M0 scale per 32 elements (2 + 2/32);
    - with `fp8_param_gather` (FP8 primary weights, `fp8_model_init`; megatron-core's DDP keeps them in a uint8
      buffer, `distributed_data_parallel.py`): 1 byte, plus the transpose on Hopper (1), plus MXFP8's second copy
      and scales (1 + 2/32). No bf16 copy exists.
    NVFP4 (`nvfp4`, TE `tensor/nvfp4_tensor.py`): the bf16 primary weight (2) plus row- and column-wise 4-bit copies
    with an E4M3 scale per 16 (2 x (0.5 + 1/16)); FP4 primary weights (`fp4_param_gather`) are not modelled.
    Embeddings, norms and routers stay bf16 (2)."""
    if fp8_recipe is None:
        return 2.0
    if fp8_recipe == "nvfp4":
        return 2.0 + 2 * OPERAND_BYTES["fp4"]
    mx = fp8_recipe == "mxfp8"
    if training.fp8_params(dist_opt) and fp8_recipe != "blockwise":
        if mx:
            return 2.0 + 2.0 / 32
        return 2.0 if arch == "hopper" else 1.0
    cache = 2.0 + 2.0 / 32 if mx else (2.0 if arch == "hopper" else 1.0)
    return 2.0 + cache


def gradient_bytes_per_param(training: TrainingSpec) -> float:
    """megatron-core's DDP grad buffer, never sharded (ZeRO-1): fp32 with `grad_reduce_in_fp32` (4 B; Megatron-LM
    turns it on for bf16, 18 = 2 + 4 + 12 in `theoretical_memory_usage.py`), else the parameters' dtype, bf16
    (2 B; Megatron-Bridge's performance configs). `distributed/param_and_grad_buffer.py`."""
    return 4.0 if training.grad_reduce_in_fp32 else 2.0


def optimizer_bytes_per_param(training: TrainingSpec, *, dist_opt: bool, shard_size: int) -> float:
    """Adam in mixed precision: the fp32 master copy (4) + exp_avg + exp_avg_sq (4 each, or 2 each in bf16 with
    the precision-aware optimizer's `exp_avg_dtype` / `exp_avg_sq_dtype`), divided by the group the distributed
    optimizer shards over. Megatron-LM: `6 + 12 / DP` with it, 18 without (2 + 4 + 12). megatron-core shards
    dense parameters over the data-parallel group *with* context parallel (`intra_dp_cp_group`, DP * CP) and
    expert parameters over the expert data-parallel group (`intra_expt_dp_group`): `optimizer/__init__.py`."""
    moments = 2 * (2.0 if training.moments(dist_opt) == "bf16" else 4.0)
    per_param = 4.0 + moments
    return per_param / shard_size if dist_opt else per_param


# --- the estimate ---------------------------------------------------------------------------------
TERMS = ("weights", "gradients", "optimizer", "activations", "workspace", "overhead")
ALLOCATED_TERMS = TERMS[:-1]


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryEstimate:
    """Peak memory of the most loaded GPU (pipeline stage `stage`), by term, in bytes.

    `allocated_bytes` (weights + gradients + optimizer + activations + workspace) is what PyTorch's allocator
    hands out at the peak, `torch.cuda.max_memory_allocated`; `total_bytes` adds `overhead` (device memory
    outside it) and is what must fit. `phase` says which moment of the step is the peak: "activations" (the
    first backward after the warm-up) or "optimizer step". `activation_terms` / `overhead_terms` break the two
    terms down by name for comparison with measured runs."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    workspace_bytes: float
    overhead_bytes: float
    stage: int
    params_per_gpu: int
    phase: str = "activations"
    overhead_terms: tuple[tuple[str, float], ...] = ()
    # `activations_bytes` by tensor (name, bytes), summed over the in-flight micro-batches of the stage
    activation_terms: tuple[tuple[str, float], ...] = field(default=(), repr=False)

    @property
    def allocated_bytes(self) -> float:
        return sum(getattr(self, f"{t}_bytes") for t in ALLOCATED_TERMS)

    @property
    def total_bytes(self) -> float:
        return self.allocated_bytes + self.overhead_bytes

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB

    @property
    def allocated_gib(self) -> float:
        return self.allocated_bytes / GIB

    @property
    def dominant(self) -> str:
        """The largest term's name."""
        return max(TERMS, key=lambda t: getattr(self, f"{t}_bytes"))

    def as_dict(self) -> dict[str, float]:
        """name -> bytes, the six terms (sum = `total_bytes`), for `Measurement.memory`."""
        return {t: getattr(self, f"{t}_bytes") for t in TERMS}

    def fits(self, gpu_memory_bytes: float) -> bool:
        return self.total_bytes <= gpu_memory_bytes


def bf16_gemm_params_per_gpu(job: Job, sp: StageParams, layout: Layout) -> int:
    """GEMM weights of the stage's BF16 layers in a low-precision run (`placement.bf16_stage_layers`): they never
    run inside the FP8/FP4 autocast, so Transformer Engine keeps no quantized copy of them (and megatron-core
    builds them outside `fp8_model_init`, `models/hybrid/hybrid_block.py:128-130`). A repeated MTP layer's
    weights count once."""
    if not job.has_bf16_layers:
        return 0
    model = job.model
    counts = bf16_stage_layers(job, layout)[sp.stage]
    per = layer_gemm_params_per_gpu(model, layout.tp, layout.ep, layout.expert_tp)
    mtp = min(counts[4], 1) if model.mtp_repeated_layer else counts[4]
    return sum(n * g for n, g in zip((*counts[:4], mtp), per, strict=True))


def _state_bytes(job: Job, sp: StageParams, layout: Layout) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes of one GPU of a stage."""
    training = job.training
    dense, expert = sp.dense_params_per_gpu, sp.expert_params_per_gpu
    bf16_gemm = bf16_gemm_params_per_gpu(job, sp, layout)
    gemm = sp.gemm_params_per_gpu - bf16_gemm
    per_gemm = gemm_weight_bytes_per_param(training, job.gemm_recipe, job.cluster.gpu.arch, dist_opt=layout.dist_opt)
    if training.muon:  # the busiest rank's Muon (8 B) and Adam (12 B) weights, layer-wise (`autotune.cost.muon`)
        optim = muon_state_bytes(job.model, sp, layout)
    else:
        optim = (optimizer_bytes_per_param(training, dist_opt=layout.dist_opt, shard_size=layout.dp * layout.cp)
                 * dense + optimizer_bytes_per_param(training, dist_opt=layout.dist_opt,
                                                     shard_size=max(1, layout.expert_dp)) * expert)
    if layout.fsdp:
        return (*fsdp_state_bytes(job, sp, layout, gemm, per_gemm), optim)
    weights = 2.0 * (dense + expert - gemm) + per_gemm * gemm
    grads = gradient_bytes_per_param(training) * (dense + expert)
    return weights, grads, optim


# Megatron-FSDP's weight and gradient pools hold two units (`fsdp_double_buffer`: `FixedPoolAllocator(size=2)`,
# `UB_BUFFER_NUM = 2`, megatron_fsdp `param_and_grad_buffer.py`); without it prefetch still keeps the current and the
# next unit gathered ("at least two FSDP units worth of un-sharded weight memory", Megatron-LM docs megatron_fsdp.md)
FSDP_UNITS_GATHERED = 2
FSDP_GRAD_BYTES = 2.0  # main grads in the parameters' dtype, bf16 (`megatron_fsdp_main_grads_dtype` None)


def fsdp_state_bytes(job: Job, sp: StageParams, layout: Layout, gemm: float, per_gemm: float) -> tuple[float, float]:
    """(weights, gradients) bytes of one GPU under Megatron-FSDP `optim_grads_params` (ZeRO-3; the table in
    docs/design/megatron-fsdp-and-offload.md (b), megatron_fsdp `param_and_grad_buffer.py::
    _init_each_parameter_group_buffers`).

    Weights: the primary copy sharded over DP x CP (dense) and expert-DP (experts) — bf16 (2 B), or with
    `fp8_param_gather` the FP8 / MXFP8 bytes of `gemm_weight_bytes_per_param` for GEMM weights (TE's quantized
    copies of a bf16 primary, without it, stay whole: the module caches them) — plus the non-unit modules
    (embedding, output layer) gathered all step and two gathered units (`FSDP_UNITS_GATHERED` x the largest layer's
    GEMM weights at `per_gemm`). Gradients: bf16 main grads sharded the same way (`grad_reduce_in_fp32` does not
    reach Megatron-FSDP), two units' gathered gradient buckets, and the non-unit gradients, whole until their
    reduce-scatter at the end of the backward. The experts' parameters count as GEMM weights."""
    training = job.training
    n_dense, n_expert = layout.dp * layout.cp, max(1, layout.expert_dp)
    dense, expert = float(sp.dense_params_per_gpu), float(sp.expert_params_per_gpu)
    quantized_primary = (job.gemm_recipe is not None and training.fp8_params(layout.dist_opt)
                         and job.gemm_recipe != "nvfp4")
    primary = per_gemm if (quantized_primary or job.gemm_recipe is None) else 2.0
    cache = per_gemm - primary  # TE's quantized copies of a bf16 primary
    expert_gemm = min(expert, gemm)
    dense_gemm = gemm - expert_gemm
    sharded = (2.0 * (dense - dense_gemm) + primary * dense_gemm) / n_dense + primary * expert_gemm / n_expert
    model = job.model
    unit = fsdp_unit_params_per_gpu(model, sp, layout.tp, layout.ep, layout.expert_tp)
    nonunit = nonunit_params_per_gpu(model, sp, layout.tp)
    weights = sharded + cache * gemm + 2.0 * nonunit + FSDP_UNITS_GATHERED * unit * per_gemm
    grads = FSDP_GRAD_BYTES * (dense / n_dense + expert / n_expert + FSDP_UNITS_GATHERED * unit + nonunit)
    return weights, grads


def _optimizer_step_bytes(job: Job, sp: StageParams, layout: Layout) -> float:
    """Transient of the optimizer step: megatron-core's mixed-precision optimizers give the fp32 master
    parameters fp32 gradients, `main_param.grad = model_grad.float()` (`optimizer/optimizer.py`,
    `optimizer/distrib_optimizer.py`), a new 4 B copy per parameter of this GPU's shard when the grad buffer is
    bf16; none when it is fp32 already or with the precision-aware optimizer (`use_precision_aware_optimizer`:
    the bf16 gradients are handed to TE's FusedAdam as they are, `decoupled_grad`). Muon's: the busiest rank's
    copies, work tensors and all-gather buffers (`muon.step_transient_bytes`)."""
    if job.training.muon:
        return muon_step_transient_bytes(job, layout, sp)
    fp32_grads = job.training.grad_reduce_in_fp32 and not layout.fsdp  # Megatron-FSDP's main grads are bf16
    if fp32_grads or job.training.precision_aware(layout.dist_opt):
        return 0.0
    if not layout.dist_opt:
        return 4.0 * sp.params_per_gpu
    dense = sp.dense_params_per_gpu / (layout.dp * layout.cp)
    return 4.0 * (dense + sp.expert_params_per_gpu / max(1, layout.expert_dp))


def graph_pool_held_bytes(full_iteration: Any, activations: Any, step: Any) -> Any:
    """Device memory full-iteration CUDA graphs keep that the eager run would give to the optimizer step.

    The captured forward-backward allocates from a private graph pool (megatron-core `full_cuda_graph.py::
    FullCudaGraphWrapper`, `torch.cuda.graph(pool=get_graph_pool(...))`), which stays reserved for the graph's
    replays: at the optimizer step its blocks are free but not reusable by eager allocations. With
    `cuda_graph_use_single_mempool=True` (megatron-core's default, which Bridge passes) an optimizer captured by
    `optimizer_cuda_graph` (`optimizer/optimizer_cuda_graph.py::OptimizerCudaGraphWrapper`) shares that pool and
    reuses them, as the eager run does; no Bridge 0.6 recipe sets `optimizer_cuda_graph` (default False), so
    the eager optimizer step's transient (`_optimizer_step_bytes`) comes on top of the pool. The pool holds the
    forward-backward's peak (`activations`, with its transients): the device peak is state + activations +
    step instead of state + max(activations, step); "max allocated" is unchanged (the pool's blocks are free),
    so the difference, min(activations, step), is device memory outside the allocated bytes. The eager
    iterations before the capture leave nothing cached (`torch.cuda.graph.__enter__` empties the cache).
    `TrainingSpec` has no `optimizer_cuda_graph`; it is taken as off. `full_iteration`: whether the layout captures
    the full iteration (a bool, or an array of layouts', with `activations` and `step`)."""
    return np.where(full_iteration, np.minimum(activations, step), 0.0)


@lru_cache(maxsize=4096)
def _candidate_stages(num_layers: int, first_dense: int, pp: int, vpp: int, split: Split = EVEN,
                      mtp: tuple[int, ...] | None = None, pattern: str | None = None,
                      edges: tuple[int, int] = (0, 0),
                      ) -> tuple[tuple[int, tuple[tuple[int, int, int], ...]], ...]:
    """Stages that can be the peak, with their chunks as (chunk index k, first layer, layers).

    In-flight micro-batches never grow with the stage index, so among stages holding the same layers
    (same dense/MoE counts per chunk, or a hybrid `pattern`'s symbol counts, same embedding/output/MTP layers)
    only the first can be the heaviest (the chunk with the decoder's final norm, `placement.final_norm_chunk`, is
    told apart too); `edges` (the BF16 edge layers, `TrainingSpec.bf16_edges`) tell stages with
    the same counts apart."""
    counts = chunk_layer_counts(num_layers, pp, vpp, split)
    starts = [sum(counts[:k]) for k in range(len(counts))]
    last = len(counts) - 1
    norm = final_norm_chunk(counts, mtp is not None)
    seen: set[tuple] = set()
    out = []
    for p in range(pp):
        chunks = tuple((k, starts[k], counts[k]) for k in range(p, len(counts), pp))
        key = tuple((k == 0, k == last, k == norm, n, chunk_kinds(pattern, first_dense, start, n), mtp[k] if mtp else 0,
                     bf16_chunk_kinds(pattern, first_dense, num_layers, edges, start, n)) for k, start, n in chunks)
        if key not in seen:
            seen.add(key)
            out.append((p, chunks))
    return tuple(out)


def _every_stage(num_layers: int, pp: int, vpp: int, split: Split = EVEN,
                 ) -> tuple[tuple[int, tuple[tuple[int, int, int], ...]], ...]:
    """Every stage with its chunks as (chunk index k, first layer, layers), in stage order."""
    counts = chunk_layer_counts(num_layers, pp, vpp, split)
    starts = [sum(counts[:k]) for k in range(len(counts))]
    return tuple((p, tuple((k, starts[k], counts[k]) for k in range(p, len(counts), pp))) for p in range(pp))


class _JobCache:
    """Per (model, training, GPU, assumptions): stage parameters and activation units by small integer keys, so
    a layout costs a few dictionary look-ups instead of hashing the model specs again."""

    __slots__ = ("stages", "units")

    def __init__(self) -> None:
        self.stages: dict[tuple, tuple[StageParams, ...]] = {}
        self.units: dict[tuple, UnitActivations] = {}


@lru_cache(maxsize=64)
def _job_cache(model: ModelSpec, training: TrainingSpec, gpu: GPUSpec, assumptions: MemoryAssumptions) -> _JobCache:
    return _JobCache()


def _lookups(job: Job, layout: Layout, assumptions: MemoryAssumptions,
             ) -> tuple[tuple[StageParams, ...], UnitActivations]:
    """This layout's stage parameters and activation units, from the per-job cache."""
    model = job.model
    cache = _job_cache(model, job.training, job.cluster.gpu, assumptions)
    tp, etp = layout.tp, layout.expert_tp
    stage_key = (tp, layout.pp, layout.vpp_size, layout.ep, etp, pipeline_split(layout))
    stages = cache.stages.get(stage_key)
    if stages is None:
        stages = cache.stages[stage_key] = _stage_params_cached(
            model, *stage_key, assumptions.make_vocab_size_divisible_by, assumptions.mla_down_proj_split)
    unit_key = (tp, layout.sp, layout.cp, layout.mbs, etp, layout.recompute, layout.cuda_graphs)
    unit = cache.units.get(unit_key)
    if unit is None:
        vocab = padded_vocab_size(model.vocab_size, tp, assumptions.make_vocab_size_divisible_by)
        unit = cache.units[unit_key] = unit_activation_bytes(job, layout, assumptions, vocab)
    return stages, unit


def _bf16_unit(job: Job, layout: Layout, assumptions: MemoryAssumptions) -> UnitActivations | None:
    """The activation units of the job at BF16 (`Job.in_bf16`), for its BF16 layers; None without any."""
    if not job.has_bf16_layers:
        return None
    return _lookups(job.in_bf16(), layout, assumptions)[1]


def bf16_chunk_terms(unit: UnitActivations, bf16: UnitActivations, kinds: tuple[int, int, int, int],
                     mtp: int) -> dict[str, float]:
    """What a chunk's BF16 layers (`kinds` as (dense, MoE, Mamba, attention-only), `mtp` MTP layers) save per
    micro-batch over the same layers in the run's precision, by tensor name (a BF16 layer keeps BF16 GEMM inputs
    where a quantized one keeps FP8/FP4 copies)."""
    dense, moe, mamba, attention = kinds
    out: dict[str, float] = {}
    for sign, u in ((1.0, bf16), (-1.0, unit)):
        rd, rm, kd, km = u._split(dense, moe)
        for terms, n in ((u.dense_terms, rd), (u.moe_terms, rm), (u.dense_kept_terms, kd), (u.moe_kept_terms, km),
                         (u.mamba_terms, mamba), (u.attention_terms, attention), (u.mtp_terms, mtp)):
            if n:
                for name, value in terms:
                    out[name] = out.get(name, 0.0) + sign * n * value
    return out


def _mtp_counts(model: ModelSpec, layout: Layout) -> tuple[int, ...] | None:
    """MTP layers per model chunk (`Layout.chunk_mtp_counts`), None for a model without them."""
    return layout.chunk_mtp_counts(model.mtp_num_layers) if model.mtp_num_layers else None


def offloaded_kinds(model: ModelSpec, k: int, count: int) -> tuple[int, int, int, int]:
    """The layers layer-level activation offload (`Layout.offload_layers` = k, megatron-core
    `cpu_offloading_num_layers`) takes off the GPU, as (dense, MoE, Mamba, attention-only) counts: the first
    min(k, count) layers of the block (TE `get_cpu_offload_context(num_layers=k, model_layers=L)`, opened around each
    layer by `TransformerBlock.forward`), whose saved tensors wait in host memory until the backward reloads them
    one layer ahead. The rules allow it at PP 1 only, where the stage's one chunk (of `count` layers) starts at
    layer 0."""
    first_dense = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    return chunk_kinds(model.hybrid_pattern, first_dense, 0, min(k, count))


def offload_host_bytes(job: Job, layout: Layout, assumptions: MemoryAssumptions = DEFAULT_ASSUMPTIONS) -> float:
    """Host memory one GPU's offloaded activations take at the end of a forward (0 without offload): the saved
    tensors of the `offloaded_kinds` layers of each in-flight micro-batch (one at PP 1); compared with
    `GPUSpec.host_memory_bytes` (`estimate` prints both)."""
    if not layout.offload_layers:
        return 0.0
    _, unit = _lookups(job, layout, assumptions)
    counts = chunk_layer_counts(job.model.num_layers, layout.pp, layout.vpp_size, pipeline_split(layout))
    microbatches = max(1, layout.num_microbatches(job.training.global_batch_size))
    inflight = inflight_microbatches_per_chunk(layout.pp, layout.vpp_size, microbatches, 0)
    dense, moe, mamba, attention = offloaded_kinds(job.model, layout.offload_layers, counts[0])
    per_microbatch = unit.chunk(dense=dense, moe=moe, has_embedding=False, has_output=False, mamba=mamba,
                                attention=attention)
    return inflight[0] * per_microbatch


def memory_status(job: Job, peak_bytes: float, capacity_bytes: float, host_bytes: float,
                  dominant: str) -> tuple[str, str]:
    """("ok" | "oom", reason) of a layout: its device peak must fit `capacity_bytes` (GPU memory minus headroom)
    and its offloaded activations (`offload_host_bytes`) the host memory per GPU, where the catalog or the cluster
    file gives it (`GPUSpec.host_memory_bytes`; unknown: not enforced, `estimate` says to check the server's)."""
    if peak_bytes > capacity_bytes:
        return "oom", (f"peak memory {peak_bytes / GIB:.1f} GiB exceeds {capacity_bytes / GIB:.1f} GiB per GPU "
                       f"(largest term: {dominant})")
    if host_overflow_bytes(job, host_bytes) > 0:
        host = float(job.cluster.gpu.host_memory_bytes or 0)
        return "oom", (f"its offloaded activations take {host_bytes / GIB:.1f} GiB of host memory per GPU, more "
                       f"than the {host / GIB:.1f} GiB each GPU has; offload fewer layers")
    return "ok", ""


def host_overflow_bytes(job: Job, host_bytes: float) -> float:
    """How far offloaded activations (`offload_host_bytes`) overflow the host memory per GPU; 0 where they fit or the
    host memory is unknown (`GPUSpec.host_memory_bytes` None: not enforced)."""
    host = job.cluster.gpu.host_memory_bytes
    return 0.0 if host is None else max(0.0, float(host_bytes) - host)


def microbatch_activation_terms(job: Job, layout: Layout, *, stage: int = 0, chunk: int = 0,
                                assumptions: MemoryAssumptions = DEFAULT_ASSUMPTIONS) -> dict[str, float]:
    """The tensors one micro-batch's forward leaves saved on one model chunk of one stage, by name, in bytes:
    what a `saved_tensors_hooks` probe around one forward measures. No pipeline in-flight factor, no transients."""
    model = job.model
    pp, vpp = layout.pp, layout.vpp_size
    if not (0 <= stage < pp and 0 <= chunk < vpp):
        raise ValueError(f"stage must be in [0, {pp}) and chunk in [0, {vpp}), but got (stage={stage}, chunk={chunk}).")
    counts = chunk_layer_counts(model.num_layers, pp, vpp, pipeline_split(layout))
    k = chunk * pp + stage
    start = sum(counts[:k])
    first_dense = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    vocab = padded_vocab_size(model.vocab_size, layout.tp, assumptions.make_vocab_size_divisible_by)
    unit = unit_activation_bytes(job, layout, assumptions, vocab)
    terms = unit.breakdown(chunks=((k, start, counts[k]),), inflight=(1,), first_dense=first_dense,
                           last=len(counts) - 1, has_output=False, has_moe=False, transients=False,
                           pattern=model.hybrid_pattern)
    return dict(terms)

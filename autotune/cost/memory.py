"""Memory per GPU of a Megatron-Core training layout: weights, gradients, optimizer, activations, overhead.

Pure arithmetic on `Job` and `Layout` (no torch). Every term is one function that cites its source; the
formulas, their sources and their known limits are restated in `docs/memory-model.md`.

Conventions (megatron-core 0.16): the vocabulary is padded to a multiple of 128 * TP
(`make_vocab_size_divisible_by`), the word embedding lives in the first stage's first chunk and the output
layer in the last stage's last chunk (a tied copy there when PP > 1), layers are split evenly over the
PP * VPP model chunks (or with the embedding and loss counted as one layer each when that is what makes
the split even, `account_for_embedding_in_pipeline_split` / `account_for_loss_in_pipeline_split`), and
MoE models' leading dense layers land wherever the split puts them (stage 0 for DeepSeek-V3).
The most loaded GPU is found by evaluating every pipeline stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache, partial

from autotune.cost.placement import (
    EVEN,
    Split,
    StageParams,
    _stage_params_cached,
    chunk_layer_counts,
    padded_vocab_size,
    pipeline_split,
)
from autotune.cost.activations import (
    ActivationAssumptions,
    UnitActivations,
    inflight_microbatches_per_chunk,
    unit_activation_bytes,
)
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.training import TrainingSpec
from search_spaces.model import ModelSpec

__all__ = [
    "MemoryAssumptions",
    "DEFAULT_ASSUMPTIONS",
    "LOCAL_SPEC_ASSUMPTIONS",
    "MemoryEstimate",
    "estimate_memory",
    "estimate_memory_per_stage",
    "microbatch_activation_terms",
    "weight_bytes_per_param",
    "gradient_bytes_per_param",
    "optimizer_bytes_per_param",
    "overhead_bytes",
]

GIB = 1024**3


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryAssumptions(ActivationAssumptions):
    """Everything the formulas assume that a `Layout` does not say, in one place (see docs/memory-model.md).

    The overhead allowance covers what no formula counts: the CUDA context with cuBLAS/cuDNN/TE kernels and
    workspaces (about 0.5 to 1 GiB on Hopper with lazy module loading), NCCL communicator buffers for the
    TP/CP/DP/EP/PP groups (about 0.5 to 2 GiB, NCCL_BUFFSIZE 4 MiB per channel and peer), the distributed
    optimizer's all-gather / reduce-scatter bucket staging, and the caching allocator's fragmentation, taken as
    a fraction of everything the formulas count (PyTorch's reserved over allocated is typically 1.05 to 1.2).
    """

    make_vocab_size_divisible_by: int = 128  # megatron `--make-vocab-size-divisible-by`
    # MLA's q/kv down projections: duplicated on every TP rank in the Transformer Engine spec (GPU runs); the
    # local spec (`get_gpt_layer_local_spec`, CPU runs) makes them column-parallel, split over TP
    mla_down_proj_split: bool = False
    fp32_main_grads: bool = True  # `grad_reduce_in_fp32` (Megatron-LM turns it on for bf16)
    cuda_context_bytes: float = 1.0 * GIB
    nccl_buffer_bytes: float = 1.5 * GIB
    fragmentation_fraction: float = 0.08


DEFAULT_ASSUMPTIONS = MemoryAssumptions()
# megatron-core's local (non-TE) layer spec, as the CPU proxy runs it: no flash attention (fp32 softmax and its
# bf16 copy kept per score), unfused SwiGLU, MLA down projections split over TP; the proxy's norms save what TE's do
LOCAL_SPEC_ASSUMPTIONS = MemoryAssumptions(flash_attention=False, attention_score_bytes=6.0, fused_swiglu=False,
                                           mla_down_proj_split=True)


# --- bytes per parameter (Megatron-LM `theoretical_memory_usage.py`) ---------------------------------
def weight_bytes_per_param(precision: str) -> float:
    """bf16 weights: 2 B/param. FP8 keeps bf16 primary weights too (megatron-core without `--fp8-param-gather`);
    the FP8 weight copies that Transformer Engine caches are counted separately, per GEMM parameter."""
    return 2.0


def fp8_weight_cache_bytes_per_gemm_param(precision: str) -> float:
    """Transformer Engine caches, per GEMM weight, an FP8 copy (1 B) and on Hopper its transpose (1 B) across
    micro-batches (`is_first_microbatch`; megatron-core keeps it unless `disable_parameter_transpose_cache`)."""
    return 2.0 if precision == "fp8" else 0.0


def gradient_bytes_per_param(assumptions: MemoryAssumptions = DEFAULT_ASSUMPTIONS) -> float:
    """fp32 main grads in megatron-core's DDP grad buffer: 4 B/param, never sharded (ZeRO-1, not ZeRO-2).
    Source: Megatron-LM `theoretical_memory_usage.py` (18 = 2 + 4 + 12), `param_and_grad_buffer.py`."""
    return 4.0 if assumptions.fp32_main_grads else 2.0


def optimizer_bytes_per_param(*, dist_opt: bool, shard_size: int) -> float:
    """Adam in mixed precision: fp32 master copy + exp_avg + exp_avg_sq = 12 B/param, divided by the group the
    distributed optimizer shards over. Megatron-LM: `6 + 12 / DP` with it, 18 without (2 + 4 + 12).
    megatron-core shards dense params over the data-parallel group *with* context parallel (`intra_dp_cp_group`,
    DP * CP) and expert params over the expert data-parallel group (`intra_expt_dp_group`) — see
    `megatron/core/optimizer/__init__.py`."""
    return 12.0 / shard_size if dist_opt else 12.0


# --- overhead ------------------------------------------------------------------------------------
def overhead_bytes(counted_bytes: float, assumptions: MemoryAssumptions = DEFAULT_ASSUMPTIONS) -> float:
    """What no formula counts: CUDA context + NCCL buffers (fixed) + allocator fragmentation (a fraction of the
    counted bytes). Values and reasoning: `MemoryAssumptions`, docs/memory-model.md."""
    fixed = assumptions.cuda_context_bytes + assumptions.nccl_buffer_bytes
    return fixed + assumptions.fragmentation_fraction * counted_bytes


# --- the estimate ---------------------------------------------------------------------------------
TERMS = ("weights", "gradients", "optimizer", "activations", "overhead")


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryEstimate:
    """Peak memory of the most loaded GPU (pipeline stage `stage`), by term, in bytes.
    `activation_terms` breaks `activations_bytes` down (name, bytes) for comparison with measured runs."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    overhead_bytes: float
    stage: int
    params_per_gpu: int
    _breakdown: Callable[[], tuple[tuple[str, float], ...]] | None = field(default=None, repr=False, compare=False)

    @property
    def activation_terms(self) -> tuple[tuple[str, float], ...]:
        """`activations_bytes` by tensor (name, bytes), summed over the in-flight micro-batches of the peak stage."""
        return self._breakdown() if self._breakdown is not None else ()

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.overhead_bytes)

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB

    @property
    def dominant(self) -> str:
        """The largest term's name."""
        return max(TERMS, key=lambda t: getattr(self, f"{t}_bytes"))

    def as_dict(self) -> dict[str, float]:
        """name -> bytes, the five terms (sum = `total_bytes`), for `Measurement.memory`."""
        return {t: getattr(self, f"{t}_bytes") for t in TERMS}

    def fits(self, gpu_memory_bytes: float) -> bool:
        return self.total_bytes <= gpu_memory_bytes


def _state_bytes(sp: StageParams, layout: Layout, precision: str, assumptions: MemoryAssumptions,
                 ) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes of one GPU of a stage."""
    dense, expert = sp.dense_params_per_gpu, sp.expert_params_per_gpu
    weights = weight_bytes_per_param(precision) * (dense + expert)
    weights += fp8_weight_cache_bytes_per_gemm_param(precision) * sp.gemm_params_per_gpu
    grads = gradient_bytes_per_param(assumptions) * (dense + expert)
    optim = optimizer_bytes_per_param(dist_opt=layout.dist_opt, shard_size=layout.dp * layout.cp) * dense
    optim += optimizer_bytes_per_param(dist_opt=layout.dist_opt, shard_size=max(1, layout.expert_dp)) * expert
    return weights, grads, optim


@lru_cache(maxsize=4096)
def _candidate_stages(num_layers: int, first_dense: int, pp: int, vpp: int, split: Split = EVEN,
                      ) -> tuple[tuple[int, tuple[tuple[int, int, int], ...]], ...]:
    """Stages that can be the peak, with their chunks as (chunk index k, first layer, layers).

    In-flight micro-batches never grow with the stage index, so among stages holding the same layers
    (same dense/MoE counts per chunk, same embedding/output) only the first can be the heaviest."""
    counts = chunk_layer_counts(num_layers, pp, vpp, split)
    starts = [sum(counts[:k]) for k in range(len(counts))]
    last = len(counts) - 1
    seen: set[tuple] = set()
    out = []
    for p in range(pp):
        chunks = tuple((k, starts[k], counts[k]) for k in range(p, len(counts), pp))
        key = tuple((k == 0, k == last, n, max(0, min(start + n, first_dense) - start)) for k, start, n in chunks)
        if key not in seen:
            seen.add(key)
            out.append((p, chunks))
    return tuple(out)


class _JobCache:
    """Per (model, training, assumptions): stage parameters and activation units by small integer keys, so a
    layout costs a few dictionary look-ups instead of hashing the model specs again."""

    __slots__ = ("stages", "units")

    def __init__(self) -> None:
        self.stages: dict[tuple, tuple[StageParams, ...]] = {}
        self.units: dict[tuple, UnitActivations] = {}


@lru_cache(maxsize=64)
def _job_cache(model: ModelSpec, training: TrainingSpec, assumptions: MemoryAssumptions) -> _JobCache:
    return _JobCache()


def _lookups(job: Job, layout: Layout, assumptions: MemoryAssumptions,
             ) -> tuple[tuple[StageParams, ...], UnitActivations]:
    """This layout's stage parameters and activation units, from the per-job cache."""
    model, training = job.model, job.training
    cache = _job_cache(model, training, assumptions)
    tp, etp = layout.tp, layout.expert_tp
    stage_key = (tp, layout.pp, layout.vpp_size, layout.ep, etp, pipeline_split(layout))
    stages = cache.stages.get(stage_key)
    if stages is None:
        stages = cache.stages[stage_key] = _stage_params_cached(
            model, *stage_key, assumptions.make_vocab_size_divisible_by, assumptions.mla_down_proj_split)
    unit_key = (tp, layout.sp, layout.cp, layout.mbs, etp, layout.recompute)
    unit = cache.units.get(unit_key)
    if unit is None:
        vocab = padded_vocab_size(model.vocab_size, tp, assumptions.make_vocab_size_divisible_by)
        unit = cache.units[unit_key] = unit_activation_bytes(model, training, layout, assumptions, vocab)
    return stages, unit


def _stage_estimate(job: Job, layout: Layout, assumptions: MemoryAssumptions, sp: StageParams,
                    unit: UnitActivations, chunks: tuple[tuple[int, int, int], ...]) -> MemoryEstimate:
    """One GPU of stage `sp.stage`: its own parameters' state plus its in-flight activations and transients."""
    model = job.model
    pp, vpp = layout.pp, layout.vpp_size
    first_dense = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    microbatches = max(1, layout.num_microbatches(job.training.global_batch_size))
    last = pp * vpp - 1
    weights, grads, optim = _state_bytes(sp, layout, job.training.precision, assumptions)
    inflight = inflight_microbatches_per_chunk(pp, vpp, microbatches, sp.stage)
    has_moe = sp.moe_layers > 0
    activations = unit.transient(has_output=sp.has_output, has_moe=has_moe)
    for (k, start, n), n_inflight in zip(chunks, inflight):
        dense = max(0, min(start + n, first_dense) - start)
        activations += n_inflight * unit.chunk(dense=dense, moe=n - dense, has_embedding=k == 0, has_output=k == last)
    counted = weights + grads + optim + activations
    breakdown = partial(unit.breakdown, chunks=chunks, inflight=inflight, first_dense=first_dense, last=last,
                        has_output=sp.has_output, has_moe=has_moe)
    return MemoryEstimate(
        weights_bytes=weights, gradients_bytes=grads, optimizer_bytes=optim, activations_bytes=activations,
        overhead_bytes=overhead_bytes(counted, assumptions), stage=sp.stage, params_per_gpu=sp.params_per_gpu,
        _breakdown=breakdown,
    )


def estimate_memory(job: Job, layout: Layout,
                    assumptions: MemoryAssumptions = DEFAULT_ASSUMPTIONS) -> MemoryEstimate:
    """Peak memory per GPU for `layout` of `job`: every distinct pipeline stage is evaluated, the heaviest returned.

    A pure function of its arguments (no torch); an infeasible layout still gets numbers (the validity rules
    say why it is infeasible). Micro-batches per step: GBS / (MBS * DP), at least 1.
    """
    model = job.model
    stages, unit = _lookups(job, layout, assumptions)
    first_dense = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    best: MemoryEstimate | None = None
    for p, chunks in _candidate_stages(model.num_layers, first_dense, layout.pp, layout.vpp_size,
                                        pipeline_split(layout)):
        est = _stage_estimate(job, layout, assumptions, stages[p], unit, chunks)
        if best is None or est.total_bytes > best.total_bytes:
            best = est
    assert best is not None
    return best


def estimate_memory_per_stage(job: Job, layout: Layout,
                              assumptions: MemoryAssumptions = DEFAULT_ASSUMPTIONS) -> tuple[MemoryEstimate, ...]:
    """The estimate for one GPU of every pipeline stage, in stage order (`estimate_memory` is their maximum)."""
    stages, unit = _lookups(job, layout, assumptions)
    counts = chunk_layer_counts(job.model.num_layers, layout.pp, layout.vpp_size, pipeline_split(layout))
    starts = [sum(counts[:k]) for k in range(len(counts))]
    return tuple(
        _stage_estimate(job, layout, assumptions, sp, unit,
                        tuple((k, starts[k], counts[k]) for k in range(sp.stage, len(counts), layout.pp)))
        for sp in stages
    )


def microbatch_activation_terms(job: Job, layout: Layout, *, stage: int = 0, chunk: int = 0,
                                assumptions: MemoryAssumptions = DEFAULT_ASSUMPTIONS) -> dict[str, float]:
    """The tensors one micro-batch's forward leaves saved on one model chunk of one stage, by name, in bytes:
    what a `saved_tensors_hooks` probe around one forward measures. No pipeline in-flight factor, no transients."""
    model, training = job.model, job.training
    pp, vpp = layout.pp, layout.vpp_size
    if not (0 <= stage < pp and 0 <= chunk < vpp):
        raise ValueError(f"stage must be in [0, {pp}) and chunk in [0, {vpp}), but got (stage={stage}, chunk={chunk}).")
    counts = chunk_layer_counts(model.num_layers, pp, vpp, pipeline_split(layout))
    k = chunk * pp + stage
    start = sum(counts[:k])
    first_dense = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    vocab = padded_vocab_size(model.vocab_size, layout.tp, assumptions.make_vocab_size_divisible_by)
    unit = unit_activation_bytes(model, training, layout, assumptions, vocab)
    terms = unit.breakdown(chunks=((k, start, counts[k]),), inflight=(1,), first_dense=first_dense,
                           last=len(counts) - 1, has_output=False, has_moe=False, transients=False)
    return dict(terms)

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
    "StageParams",
    "estimate_memory",
    "estimate_memory_per_stage",
    "microbatch_activation_terms",
    "stage_params",
    "chunk_layer_counts",
    "padded_vocab_size",
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


# --- parameter placement --------------------------------------------------------------------------
def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron's `_vocab_size_with_padding`: round up to a multiple of `divisible_by * TP`."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


Split = tuple[int | None, int | None, bool]  # (first_stage_layers, last_stage_layers, embedding_loss_split)
EVEN: Split = (None, None, False)


def pipeline_split(layout: Layout) -> Split:
    """The layout's pipeline split fields, as a hashable cache key."""
    return (layout.first_stage_layers, layout.last_stage_layers, layout.embedding_loss_split)


@lru_cache(maxsize=4096)
def chunk_layer_counts(num_layers: int, pp: int, vpp: int = 1, split: Split = EVEN) -> tuple[int, ...]:
    """Transformer layers in each of the PP * VPP model chunks, in model order (chunk k on stage k % PP).

    Exactly `Layout.chunk_layer_counts`: megatron-core's even split, its uneven split
    (`num_layers_in_first/last_pipeline_stage`) or its embedding+loss split
    (`account_for_embedding/loss_in_pipeline_split`), from `transformer_config.py` / `get_num_layers_to_build`.
    """
    first, last, embedding_loss = split
    layout = Layout(pp=pp, vpp=vpp if vpp > 1 else None, first_stage_layers=first, last_stage_layers=last,
                    embedding_loss_split=embedding_loss)
    return layout.chunk_layer_counts(num_layers)


@dataclass(frozen=True, kw_only=True, slots=True)
class StageParams:
    """Parameters of one pipeline stage (all its VPP chunks). `*_per_gpu` is what one GPU of the stage holds:
    dense parameters after the TP split (replicated norms, routers and row-parallel biases counted whole),
    expert parameters after the EP * ETP split. `dense_params` / `expert_params` are the unsplit stage totals
    (padded vocabulary). `gemm_params_per_gpu` counts transformer-layer GEMM weights only (FP8 caches)."""

    stage: int
    layers: int
    moe_layers: int
    has_embedding: bool
    has_output: bool
    dense_params: int
    expert_params: int
    dense_params_per_gpu: int
    expert_params_per_gpu: int
    gemm_params_per_gpu: int

    @property
    def params_per_gpu(self) -> int:
        return self.dense_params_per_gpu + self.expert_params_per_gpu


def _attention_params_per_gpu(model: ModelSpec, tp: int, mla_down_split: bool = False) -> tuple[int, int]:
    """One layer's attention block incl. input norm on one TP rank: (all params, GEMM weights).

    Column-parallel `linear_qkv` (weight and bias split), row-parallel `linear_proj` (bias replicated),
    norms and qk-layernorm replicated (`megatron/core/transformer/attention.py`). MLA follows the
    Transformer Engine spec: `linear_q_down_proj` / `linear_kv_down_proj` are duplicated on every TP rank
    (`parallel_mode='duplicated'`), the up projections are column-parallel (`multi_latent_attention.py`);
    `mla_down_split` counts the local spec instead, where the down projections are column-parallel too."""
    h, d, a, g = model.hidden_size, model.head_dim, model.num_attention_heads, model.query_groups
    per_dim = _norm_params_per_dim(model)
    norm = h * per_dim
    proj_bias = h if model.add_bias_linear else 0
    if model.mla is not None:
        m = model.mla
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        if m.q_lora_rank is None:
            q_gemm_rep, q_norm, q_split = 0, 0, h * a * qk
        else:
            q_gemm_rep, q_norm, q_split = h * m.q_lora_rank, m.q_lora_rank * per_dim, m.q_lora_rank * a * qk
        kv_gemm_rep, kv_norm = h * (m.kv_lora_rank + m.qk_pos_emb_head_dim), m.kv_lora_rank * per_dim
        kv_split = m.kv_lora_rank * a * (m.qk_head_dim + m.v_head_dim)
        proj = a * m.v_head_dim * h
        down = q_gemm_rep + kv_gemm_rep
        gemm = (down // tp if mla_down_split else down) + (q_split + kv_split + proj) // tp
        return norm + gemm + q_norm + kv_norm + proj_bias, gemm
    qkv = h * (a + 2 * g) * d
    proj = a * d * h
    qkv_bias = (a + 2 * g) * d if (model.add_bias_linear or model.add_qkv_bias) else 0
    qk_norm = 2 * d * per_dim if model.qk_layernorm else 0
    gemm = (qkv + proj) // tp
    return norm + gemm + qkv_bias // tp + proj_bias + qk_norm, gemm


def _norm_params_per_dim(model: ModelSpec) -> int:
    """RMSNorm keeps a weight per channel, LayerNorm a weight and a bias."""
    return 2 if model.normalization == "LayerNorm" else 1


def _mlp_params_per_gpu(model: ModelSpec, ffn: int, tp: int) -> tuple[int, int]:
    """One MLP of intermediate size `ffn` on one rank of a `tp`-way split, no norm: (all params, GEMM weights).
    fc1 column-parallel (doubled when gated; weight and bias split), fc2 row-parallel (bias replicated)."""
    h = model.hidden_size
    fc1_out = 2 * ffn if model.gated_linear_unit else ffn
    gemm = (h * fc1_out + ffn * h) // tp
    bias = fc1_out // tp + h if model.add_bias_linear else 0
    return gemm + bias, gemm


@lru_cache(maxsize=4096)
def _layer_params_per_gpu(model: ModelSpec, tp: int, ep: int, etp: int, mla_down_split: bool) -> dict[str, int]:
    """Per-GPU parameter counts of the building blocks for one (TP, EP, ETP)."""
    norm = model.hidden_size * _norm_params_per_dim(model)
    attn, attn_gemm = _attention_params_per_gpu(model, tp, mla_down_split)
    dense_mlp, dense_mlp_gemm = _mlp_params_per_gpu(model, model.ffn_hidden_size, tp)
    out = {
        "attention": attn, "attention_gemm": attn_gemm,
        "dense_mlp": norm + dense_mlp, "dense_mlp_gemm": dense_mlp_gemm,
        "moe_dense": 0, "moe_dense_gemm": 0, "experts": 0, "experts_gemm": 0,
    }
    if model.moe is not None:
        m = model.moe
        shared, shared_gemm = (0, 0)
        if m.shared_expert_ffn_hidden_size:
            shared, shared_gemm = _mlp_params_per_gpu(model, m.shared_expert_ffn_hidden_size, tp)
        gate = model.hidden_size if m.shared_expert_gate else 0
        router = model.hidden_size * m.num_experts  # replicated on every rank (`moe/router.py`)
        out["moe_dense"] = norm + router + shared + gate
        out["moe_dense_gemm"] = shared_gemm
        expert, expert_gemm = _mlp_params_per_gpu(model, m.expert_ffn_hidden_size, etp)
        local_experts = m.num_experts // ep
        out["experts"] = local_experts * expert
        out["experts_gemm"] = local_experts * expert_gemm
    return out


@lru_cache(maxsize=4096)
def _stage_params_cached(model: ModelSpec, tp: int, pp: int, vpp: int, ep: int, etp: int, split: Split,
                         divisible_by: int, mla_down_split: bool) -> tuple[StageParams, ...]:
    counts = chunk_layer_counts(model.num_layers, pp, vpp, split)
    blocks = _layer_params_per_gpu(model, tp, ep, etp, mla_down_split)
    unsplit = _layer_params_per_gpu(model, 1, 1, 1, mla_down_split)
    h = model.hidden_size
    vocab = padded_vocab_size(model.vocab_size, tp, divisible_by)
    first_dense = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    norm = h * _norm_params_per_dim(model)
    stages = []
    for p in range(pp):
        layers = moe_layers = 0
        start = 0
        for k, n in enumerate(counts):
            if k % pp == p:
                layers += n
                moe_layers += max(0, start + n - max(start, first_dense)) if model.moe is not None else 0
            start += n
        dense_layers = layers - moe_layers
        has_emb, has_out = p == 0, p == pp - 1
        dense_gpu = layers * blocks["attention"] + dense_layers * blocks["dense_mlp"]
        dense_gpu += moe_layers * blocks["moe_dense"]
        dense_all = layers * unsplit["attention"] + dense_layers * unsplit["dense_mlp"]
        dense_all += moe_layers * unsplit["moe_dense"]
        if has_emb:  # VocabParallelEmbedding rows split over TP; learned positions replicated
            dense_gpu += vocab // tp * h + model.max_position_embeddings * h
            dense_all += vocab * h + model.max_position_embeddings * h
        if has_out:  # final norm + column-parallel output layer (a tied copy when PP > 1)
            output = 0 if (model.tied_embeddings and pp == 1) else vocab * h
            dense_gpu += norm + output // tp
            dense_all += norm + output
        gemm = layers * blocks["attention_gemm"] + dense_layers * blocks["dense_mlp_gemm"]
        gemm += moe_layers * (blocks["moe_dense_gemm"] + blocks["experts_gemm"])
        stages.append(StageParams(
            stage=p, layers=layers, moe_layers=moe_layers, has_embedding=has_emb, has_output=has_out,
            dense_params=dense_all, expert_params=moe_layers * unsplit["experts"],
            dense_params_per_gpu=dense_gpu, expert_params_per_gpu=moe_layers * blocks["experts"],
            gemm_params_per_gpu=gemm,
        ))
    return tuple(stages)


def stage_params(model: ModelSpec, layout: Layout,
                 assumptions: MemoryAssumptions = DEFAULT_ASSUMPTIONS) -> list[StageParams]:
    """Parameters per pipeline stage and per GPU of that stage, for comparison with a real megatron-core model."""
    return list(_stage_params_cached(model, layout.tp, layout.pp, layout.vpp_size, layout.ep, layout.expert_tp,
                                     pipeline_split(layout), assumptions.make_vocab_size_divisible_by, assumptions.mla_down_proj_split))


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

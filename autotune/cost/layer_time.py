"""One micro-batch through one transformer layer on one GPU: GPU time term by term, host time, syncs.

A layer's forward and backward are each a `Pass`: GPU time split into compute, exposed TP / CP / EP
communication, plus the host's time to launch the pass and the device-to-host syncs in it. A pass takes
max(GPU time, host time) + syncs * sync latency (`Pass.wall_s`): the host runs ahead of the GPU until a sync
empties the queue, so a layer whose kernels are shorter than their launches runs at the host's pace (small MoE
layers at micro-batch 1); CUDA graphs replace a captured part's launches with one replay.

Symbols (Narayanan et al. 2021, arXiv 2104.04473; Korthikanti et al. 2022, arXiv 2205.05198): s sequence,
b micro-batch, h hidden, a heads, g query groups, d head dim, f FFN, t TP, c CP. Rows of the attention and dense
MLP GEMMs: b*s/c (SP all-gathers the sequence before them); activations between blocks: b*s/(c*t) rows with SP.
Backward GEMMs cost 2x the forward (dgrad + wgrad, same shapes transposed); the fused attention backward 2.5x its
forward's matmuls (FlashAttention-2, Dao 2023: 5 matmuls vs 2) and its softmax exponentials once more.
The MoE block is in `autotune/cost/moe_time.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.cost.comm import group_collective_s
from autotune.cost.efficiency import (
    OPERAND_BYTES,
    Calibration,
    GemmCost,
    attention_time_s,
    gemm_cost,
    memory_bound_time_s,
)
from search_spaces.job import Job
from search_spaces.model import ModelSpec

__all__ = ["Pass", "Shape", "shape_of", "attention_block", "dense_mlp_block", "mlp_gemms_fwd_s", "tp_exposed_s",
           "fp8_cast_s", "graphed", "FP8_CAST_BYTES", "ATTENTION_HOST_OPS", "MLP_HOST_OPS"]

BF16 = 2.0
# Transformer Engine casts a GEMM input to FP8 in its own kernel (or fused into the preceding norm): it reads the
# bf16 tensor (2 B) and writes the FP8 copy and its transpose, or MXFP8's row- and column-wise copies (1 + 1 B);
# `transformer_engine/pytorch/tensor/float8_tensor.py`, `mxfp8_tensor.py` (usage: rowwise + columnwise).
FP8_CAST_BYTES = 4.0
# NVFP4 (TE `tensor/nvfp4_tensor.py`, NVFP4Quantizer): reads the bf16 tensor (2 B), writes row- and column-wise
# 4-bit copies with an E4M3 scale per 16 elements (2 x (0.5 + 1/16) B)
FP4_CAST_BYTES = 2.0 + 2 * OPERAND_BYTES["fp4"]
# Framework-level ops launched per forward of one block, counted on megatron-core 0.16.1's TE code path
# (`transformer/transformer_layer.py`, `attention.py`, `mlp.py` with TE LayerNormLinear / Linear, fused RoPE,
# fused attention, bias-dropout-add): norm+QKV, 2 RoPE, reshapes and splits (~6), attention, projection, BDA, and
# their autocast / amax bookkeeping. Only their product with the fitted `host_op_s` matters.
ATTENTION_HOST_OPS = 16
MLP_HOST_OPS = 8  # norm+fc1, activation, fc2, BDA, reshapes


@dataclass(frozen=True, slots=True)
class Pass:
    """One direction of one block for one micro-batch on one GPU (seconds; syncs counted)."""

    compute: float = 0.0
    tp_comm: float = 0.0
    cp_comm: float = 0.0
    ep_comm: float = 0.0
    host: float = 0.0
    syncs: int = 0

    def __add__(self, other: Pass) -> Pass:
        return Pass(self.compute + other.compute, self.tp_comm + other.tp_comm, self.cp_comm + other.cp_comm,
                    self.ep_comm + other.ep_comm, self.host + other.host, self.syncs + other.syncs)

    def scaled(self, k: float) -> Pass:
        return Pass(k * self.compute, k * self.tp_comm, k * self.cp_comm, k * self.ep_comm, k * self.host,
                    round(k * self.syncs))

    @property
    def gpu_s(self) -> float:
        return self.compute + self.tp_comm + self.cp_comm + self.ep_comm

    def wall_s(self, cal: Calibration) -> float:
        """max(GPU, host) + syncs: the host launches ahead of the GPU until a sync drains the queue."""
        return max(self.gpu_s, self.host) + self.syncs * cal.sync_s


@dataclass(frozen=True, slots=True)
class Shape:
    """What one layer's timing needs of the job and layout, resolved once."""

    job: Job
    cal: Calibration
    gemm: GemmCost  # the recipe's GEMMs (FP8 or BF16)
    tp: int
    cp: int
    ep: int
    etp: int
    mbs: int
    sp: bool
    cuda_graphs: str  # the layout's CUDA graphs (Layout.cuda_graphs)
    ep_overlap: bool  # the layout's EP A2A overlap (Layout.ep_overlap)
    rows: float  # b * s / c: rows of the attention and dense-MLP GEMMs
    tokens: float  # b * s / (c * t) with SP (else b * s / c): tokens per rank between blocks, the MoE input
    host_op_s: float

    @property
    def model(self) -> ModelSpec:
        return self.job.model

    @property
    def quantized(self) -> bool:
        """GEMM inputs are quantised (FP8 or NVFP4): casts, and TE's per-expert quantisation kernels."""
        return self.job.training.precision in ("fp8", "fp4")


def shape_of(job: Job, cal: Calibration, tp: int, cp: int, ep: int, etp: int, mbs: int, sp: bool,
             cuda_graphs: str = "none", ep_overlap: bool = False) -> Shape:
    s = job.training.seq_length
    rows = mbs * s / cp
    return Shape(job=job, cal=cal, gemm=gemm_cost(job.cluster.gpu, job.training.precision, job.gemm_recipe, cal),
                 tp=tp, cp=cp, ep=ep, etp=etp, mbs=mbs, sp=sp, cuda_graphs=cuda_graphs, ep_overlap=ep_overlap,
                 rows=rows, tokens=rows / tp if sp else rows, host_op_s=cal.arch(job.cluster.gpu).host_op_s)


def graphed(x: Shape, part: str) -> bool:
    """Whether the layout's CUDA graphs capture `part` ('attn', 'mlp', 'moe_router', 'moe_preprocess', 'moe',
    'mamba'): full-iteration graphs capture every part; per-layer graphs (`local`, `transformer_engine`) the job's
    `cuda_graph_modules` (empty: the whole layer's static parts, never a dropless MoE block,
    megatron-core `transformer/cuda_graphs.py`; a Mamba layer whole, `ssm/mamba_layer.py:108-110`). A drop-and-pad
    MoE block under an empty scope is captured too by megatron-core's code (`transformer_layer.py::
    create_mcore_cudagraph_manager`, "cudagraph the entire layer"), but costed eager here: of the only published
    runs with it (five 25.09 rows, core 0.14 local graphs), the three whose host ops matter are predicted -6..0%
    with them counted and +20..+34% graphed (2026-12-04, `bench/bench_throughput.py`)."""
    if x.cuda_graphs == "none":
        return False
    if x.cuda_graphs == "full_iteration":
        return True
    modules = x.job.cuda_graph_modules
    if not modules:
        return part in ("attn", "mlp", "mamba")
    return part in modules


def host_s(x: Shape, ops: float, part: str) -> float:
    """Host time of `ops` framework ops of one part's forward; one graph replay when per-layer CUDA graphs capture
    it; none under full-iteration graphs, which replay the whole step at once (`FullCudaGraphWrapper`: one launch
    per iteration, in the step's fixed overhead)."""
    if x.cuda_graphs == "full_iteration":
        return 0.0
    return x.host_op_s * (1.0 if graphed(x, part) else ops)


def fp8_cast_s(x: Shape, elements: float) -> float:
    """FP8 (or NVFP4) quantisation of GEMM inputs of `elements` values (0 in BF16 runs)."""
    if not x.quantized:
        return 0.0
    per = FP4_CAST_BYTES if x.job.training.fp4 else FP8_CAST_BYTES
    return memory_bound_time_s(per * elements, gpu=x.job.cluster.gpu, cal=x.cal)


def tp_exposed_s(x: Shape, comm_s: float, overlap_gemm_s: float) -> float:
    """TP communication left on the critical path: with Transformer Engine's userbuffers overlap
    (`tp_comm_overlap`, which needs SP) the fitted exposed share, and never less than what the GEMMs it overlaps
    cannot cover (cross-domain TP outlasts them); without it all of it."""
    if comm_s <= 0:
        return 0.0
    if x.job.training.tp_comm_overlap and x.sp:
        return max(x.cal.tp_overlap_exposed * comm_s, comm_s - overlap_gemm_s)
    return comm_s


def _tp_collectives_s(x: Shape) -> float:
    """One TP all-gather or reduce-scatter (SP) of the block input, b*s/c x h bf16 elements; without SP one
    all-reduce is two of these (Shoeybi et al. 2019 Fig. 4; Korthikanti et al. 2022 Sec. 4.2.2)."""
    if x.tp <= 1:
        return 0.0
    return group_collective_s(x.rows * x.model.hidden_size * BF16, x.tp, 1, x.job.cluster, x.cal)


def _tp_passes(x: Shape) -> tuple[float, float]:
    """(forward, backward) collectives of one block, in bf16 block-input units: SP 2 + 3 (the backward all-gathers
    the input again for the weight gradient), plain TP one all-reduce each way (2 + 2 ring passes). With SP in an
    FP8 or NVFP4 run, Transformer Engine quantises the GEMM input before it all-gathers it (`module/layernorm_linear.py`
    with `distributed.py::gather_along_first_dim` and the input quantizer), so the forward's all-gather and the
    backward's re-gather move `OPERAND_BYTES` per element instead of 2; the reduce-scatters stay bf16."""
    if not x.sp:
        return (2.0, 2.0)
    q = OPERAND_BYTES.get(x.job.training.precision, BF16) / BF16
    return (1.0 + q, 2.0 + q)


def _elementwise_s(x: Shape, nbytes: float) -> float:
    return memory_bound_time_s(nbytes, gpu=x.job.cluster.gpu, cal=x.cal)


def attention_gemms_fwd_s(x: Shape) -> tuple[float, float, float]:
    """(all forward GEMMs, MLA up-projection GEMMs, input elements of the FP8 GEMMs) of one attention block.

    GQA: each rank holds a/t query heads and g/t KV groups (one replicated group when t > g, megatron-core
    `get_num_query_groups_per_partition`). MLA: down projections replicated, up projections and the output split
    by t (`multi_latent_attention.py`, TE spec)."""
    m, gemm, rows, t = x.model, x.gemm, x.rows, x.tp
    h, a = m.hidden_size, m.num_attention_heads
    if m.mla is not None:
        y = m.mla
        qk = y.qk_head_dim + y.qk_pos_emb_head_dim
        up = gemm.time_s(rows, a * (y.qk_head_dim + y.v_head_dim) / t, y.kv_lora_rank)
        elements = rows * (h + y.kv_lora_rank + a * y.v_head_dim / t)
        if y.q_lora_rank is None:
            down = gemm.time_s(rows, a * qk / t, h)
        else:
            down = gemm.time_s(rows, y.q_lora_rank, h)
            up += gemm.time_s(rows, a * qk / t, y.q_lora_rank)
            elements += rows * y.q_lora_rank
        down += gemm.time_s(rows, y.kv_lora_rank + y.qk_pos_emb_head_dim, h)
        proj = gemm.time_s(rows, h, a * y.v_head_dim / t)
        return down + up + proj, up, elements
    d, g = m.head_dim, m.query_groups
    g_local = g / t if g >= t else 1
    qkv = gemm.time_s(rows, (a / t + 2 * g_local) * d, h)
    proj = gemm.time_s(rows, h, a * d / t)
    return qkv + proj, 0.0, rows * (h + a * d / t)


def attended_keys(m: ModelSpec, s: int) -> float:
    """Keys a query attends to, averaged over the queries and the layers: s/2 under the causal mask; a w-token
    sliding window (megatron-core `window_size=(w-1, 0)`) about w - w^2/(2s) of them, on the layers that use it
    (`ModelSpec.is_sliding_window_layer`: GPT-OSS every other layer, Mistral all)."""
    full = s / 2
    w = m.sliding_window
    if w is None or w >= s:
        return full
    windowed = w - w * w / (2 * s)
    n = m.num_layers
    share = sum(1 for i in range(n) if m.is_sliding_window_layer(i)) / n
    return share * windowed + (1 - share) * full


def _attention_core_fwd(m: ModelSpec, rows: float, s: int, t: int) -> tuple[float, float]:
    """(matmul FLOPs, softmax exponentials) of the causal attention core per GPU and forward: scores rows * keys *
    (a/t) (`attended_keys`; CP splits the queries), each 2 * (d_qk + d_v) FLOPs (QK^T and PV) and one exp."""
    if m.mla is not None:
        y = m.mla
        width = y.qk_head_dim + y.qk_pos_emb_head_dim + y.v_head_dim
    else:
        width = 2 * m.head_dim
    scores = rows * attended_keys(m, s) * (m.num_attention_heads / t)
    return 2.0 * scores * width, scores


def _kv_width(m: ModelSpec, t: int) -> float:
    """Elements of K and V per token on one TP rank (what context parallelism passes around the ring)."""
    if m.mla is not None:
        y = m.mla
        return m.num_attention_heads / t * (y.qk_head_dim + y.qk_pos_emb_head_dim + y.v_head_dim)
    g = m.query_groups
    return 2 * (g / t if g >= t else 1) * m.head_dim


def attention_block(x: Shape) -> dict[str, Pass]:
    """Forward, backward and the recomputable parts of one attention block (norm, QKV, RoPE, core, projection,
    bias-dropout-add), with its TP and CP communication."""
    m, job, cal = x.model, x.job, x.cal
    gpu, s, t, c = job.cluster.gpu, job.training.seq_length, x.tp, x.cp
    h = m.hidden_size
    gemms, up_proj, fp8_elements = attention_gemms_fwd_s(x)
    flops, exps = _attention_core_fwd(m, x.rows, s, t)
    fp8_attention = job.training.fp8 and job.training.fp8_dot_product_attention
    core = attention_time_s(flops, exps, gpu=gpu, cal=cal, block_tokens=s / c, fp8=fp8_attention)
    # the backward: 2.5x the forward's matmuls (dQ, dK, dV and the recomputed QK^T; FlashAttention-2, Dao 2023) and
    # the exponentials once more (P is recomputed from the saved log-sum-exp)
    core_bwd = attention_time_s(2.5 * flops, exps, gpu=gpu, cal=cal, block_tokens=s / c, fp8=fp8_attention)
    act = x.tokens * h  # norm input and BDA on the sequence-sharded activation
    head_width = (m.num_attention_heads + 2 * (m.query_groups if m.mla is None else 0)) / t * m.head_dim
    norm = _elementwise_s(x, BF16 * 2 * act)
    elem = norm + _elementwise_s(x, BF16 * (2 * x.rows * head_width + 3 * act))  # RoPE on q, k; BDA
    cast = fp8_cast_s(x, fp8_elements)
    cf, cb = _tp_passes(x)
    one = _tp_collectives_s(x)
    cp_f = cp_b = 0.0
    if c > 1:  # ring exchange of K and V (Liu et al. 2023): forward KV, backward KV + dKV, hidden under the core
        link = job.cluster.link_for_group(c, t)
        step = x.rows * _kv_width(m, t) * BF16 / (link.bandwidth_bytes_per_s * cal.link_fraction) + link.latency_s
        cp_f = max(0.0, (c - 1) * step - cal.cp_overlap_fraction * core)
        cp_b = max(0.0, 2 * (c - 1) * step - cal.cp_overlap_fraction * core_bwd)
    ops = ATTENTION_HOST_OPS + (2 if m.qk_layernorm else 0)
    host = host_s(x, ops, "attn")
    fwd = Pass(compute=gemms + core + elem + cast, tp_comm=tp_exposed_s(x, cf * one, gemms), cp_comm=cp_f, host=host)
    bwd = Pass(compute=2 * gemms + core_bwd + 2 * elem + cast, tp_comm=tp_exposed_s(x, cb * one, 2 * gemms),
               cp_comm=cp_b, host=cal.host_backward_ratio * host)
    return {"fwd": fwd, "bwd": bwd, "core_attn": Pass(compute=core), "layernorm": Pass(compute=norm),
            "mla_up_proj": Pass(compute=up_proj)}


def mlp_gemms_fwd_s(x: Shape, rows: float, ffn: float, split: int, count: float = 1.0,
                    efficiency: float = 1.0, width: int | None = None) -> tuple[float, float]:
    """(time, FP8 input elements) of fc1 (h -> f/split, doubled when gated) and fc2 (f/split -> h) for `count`
    MLPs of `rows` rows each; h is `width` when given (LatentMoE experts: the latent size)."""
    h = x.model.hidden_size if width is None else width
    fc1 = (2 if x.model.gated_linear_unit else 1) * ffn / split
    t = (x.gemm.time_s(rows, fc1, h, count, efficiency) + x.gemm.time_s(rows, h, ffn / split, count, efficiency))
    return t, count * rows * (h + ffn / split)


def dense_mlp_block(x: Shape) -> dict[str, Pass]:
    """Forward, backward and recomputable parts of a dense MLP block (norm, fc1, activation, fc2, BDA) with TP."""
    m = x.model
    gemms, elements = mlp_gemms_fwd_s(x, x.rows, m.ffn_hidden_size, x.tp)
    gate_io = 3 if m.gated_linear_unit else 2  # SwiGLU reads 2 halves and writes 1
    norm = _elementwise_s(x, BF16 * 2 * x.tokens * m.hidden_size)
    act = _elementwise_s(x, BF16 * x.rows * gate_io * m.ffn_hidden_size / x.tp)
    elem = norm + act + _elementwise_s(x, BF16 * 3 * x.tokens * m.hidden_size)
    cast = fp8_cast_s(x, elements)
    cf, cb = _tp_passes(x)
    one = _tp_collectives_s(x)
    host = host_s(x, MLP_HOST_OPS, "mlp")
    fwd = Pass(compute=gemms + elem + cast, tp_comm=tp_exposed_s(x, cf * one, gemms), host=host)
    bwd = Pass(compute=2 * gemms + 2 * elem + cast, tp_comm=tp_exposed_s(x, cb * one, 2 * gemms),
               host=x.cal.host_backward_ratio * host)
    return {"fwd": fwd, "bwd": bwd, "layernorm": Pass(compute=norm), "mlp": fwd}

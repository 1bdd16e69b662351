"""Step time of one layout: compute, communication, pipeline bubble and optimizer, as a visible sum.

Symbols (Narayanan et al. 2021, arXiv 2104.04473; Korthikanti et al. 2022, arXiv 2205.05198):
s sequence length, b micro-batch size, h hidden size, a attention heads, g query groups, d head dim,
f FFN size, V vocabulary, L layers, t TP, p PP, v VPP, c CP, e EP, E experts, k top-k, m micro-batches.

Every term is a named function below. Model FLOPs follow Megatron-LM's
`num_floating_point_operations` (megatron/training/training.py); hardware time is derived from the
GEMM shapes each GPU runs, with the achieved-peak fractions of `autotune/cost/efficiency.py` (the only
fitted constants). The step time is

    step = m * stage_max + (p - 1) / v * stage_avg + dp_exposed + optimizer + overhead

where stage_* is one micro-batch's forward + backward (+ recompute) through a pipeline stage,
including its exposed TP, EP, CP and p2p communication. See docs/throughput-model.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from search_spaces.cluster import ClusterSpec, LinkSpec
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.training import TrainingSpec
from search_spaces.model import ModelSpec

from autotune.cost.placement import heaviest_stage
from autotune.cost.placement import stage_params as placement_stage_params
from autotune.cost.efficiency import (
    DEFAULT_CALIBRATION,
    Calibration,
    GemmCost,
    attention_time_s,
    gemm_cost,
    memory_bound_time_s,
)

__all__ = [
    "TimeEstimate",
    "MicrobatchTimes",
    "microbatch_times",
    "estimate_time",
    "model_flops_per_step",
    "forward_flops_per_token",
    "padded_vocab_size",
    "ring_collective_s",
    "group_collective_s",
    "expert_all_to_all_s",
    "pipeline_p2p_s",
    "all_to_all_s",
    "pipeline_bubble_s",
    "dp_comm_s",
    "optimizer_step_s",
    "stage_params",
    "TIME_KEYS",
]

VOCAB_DIVISOR = 128  # Megatron-LM --make-vocab-size-divisible-by default
ADAM_BYTES_PER_PARAM = 34.0  # read grad 4 + master 4 + m 4 + v 4, write master 4 + m 4 + v 4 + bf16 param 2, grad norm 4
GRAD_BYTES = 4.0  # Megatron-LM reduces gradients in fp32 for bf16 training (accumulate_allreduce_grads_in_fp32)
PARAM_BYTES = 2.0  # bf16 parameters all-gathered by the distributed optimizer

TIME_KEYS = ("compute", "recompute", "tp_comm", "ep_comm", "cp_comm", "pp_p2p", "pp_bubble", "dp_comm",
             "optimizer", "moe_routing", "overhead")


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeEstimate:
    """One layout's step time and its breakdown (seconds per step; the breakdown sums to step_time_s)."""

    step_time_s: float
    breakdown: dict[str, float]
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float
    model_flops_per_step: float

    @property
    def dominant(self) -> str:
        """The largest non-compute term (the layout's bottleneck beyond the math), or 'compute' when all are zero."""
        name = max((k for k in self.breakdown if k != "compute"), key=self.breakdown.__getitem__)
        return name if self.breakdown[name] > 0 else "compute"

    def as_dict(self) -> dict[str, float]:
        return dict(self.breakdown)


# --- model FLOPs (the MFU numerator) ---------------------------------------------------------
def padded_vocab_size(model: ModelSpec) -> int:
    """V padded to a multiple of 128 (Megatron-LM `make_vocab_size_divisible_by`, TP=1 so MFU is layout-free)."""
    return -(-model.vocab_size // VOCAB_DIVISOR) * VOCAB_DIVISOR


def _attention_forward_flops_per_token(model: ModelSpec, s: int) -> float:
    """Forward FLOPs of one attention block per token, causal (half of the s x s scores are computed)."""
    h, a = model.hidden_size, model.num_attention_heads
    if model.mla is not None:
        x = model.mla
        qk = x.qk_head_dim + x.qk_pos_emb_head_dim
        q = h * a * qk if x.q_lora_rank is None else x.q_lora_rank * (h + a * qk + 1)
        kv = x.kv_lora_rank * (h + a * (x.qk_head_dim + x.v_head_dim) + 1) + h * x.qk_pos_emb_head_dim
        proj = a * x.v_head_dim * h
        core = 0.5 * s * a * (qk + x.v_head_dim)
        return 2.0 * (q + kv + proj + core)
    d, g = model.head_dim, model.query_groups
    qkv_proj = h * (a + 2 * g) * d + a * d * h
    core = 0.5 * s * a * d * 2  # QK^T and PV, causal halving
    return 2.0 * (qkv_proj + core)


def forward_flops_per_token(model: ModelSpec, seq_length: int) -> float:
    """Forward FLOPs per token, Megatron-LM `num_floating_point_operations` / (3 * B * s).

    Per layer: GQA/MLA projections 2*h*(a+2g)*d + 2*a*d*h, causal attention core 2*s*a*d
    (QK^T and PV, halved for causality), MLP 2*h*f*(3 if gated else 2) for dense layers, and
    top-k routed experts plus shared experts for MoE layers; logits 2*h*V (padded V). Router,
    norms and embeddings are not counted (as in Megatron-LM).
    """
    h = model.hidden_size
    gate = 3 if model.gated_linear_unit else 2
    attention = model.num_layers * _attention_forward_flops_per_token(model, seq_length)
    dense_mlp = model.num_dense_mlp_layers * 2.0 * h * model.ffn_hidden_size * gate
    moe_mlp = 0.0
    if model.moe is not None:
        x = model.moe
        per_layer = 2.0 * h * gate * (x.topk * x.expert_ffn_hidden_size + x.shared_expert_ffn_hidden_size)
        moe_mlp = model.num_moe_layers * per_layer
    logits = 2.0 * h * padded_vocab_size(model)
    return attention + dense_mlp + moe_mlp + logits


@lru_cache(maxsize=256)
def model_flops_per_step(model: ModelSpec, training: TrainingSpec) -> float:
    """Model FLOPs of one iteration: 3 (forward, dgrad, wgrad) * forward FLOPs/token * GBS * s.

    Megatron-LM `num_floating_point_operations(args, batch_size)` (megatron/training/training.py,
    recent versions with causal attention); Narayanan et al. 2021 Appendix for the 3x. Recompute
    is hardware work, not model FLOPs, so it is not counted here.
    """
    tokens = training.global_batch_size * training.seq_length
    return 3.0 * forward_flops_per_token(model, training.seq_length) * tokens


# --- communication primitives ---------------------------------------------------------------
def ring_collective_s(nbytes: float, n: int, link: LinkSpec, cal: Calibration) -> float:
    """Ring all-gather or reduce-scatter of a tensor of `nbytes` over n ranks: (n-1)/n * bytes / bw + (n-1) * latency.

    An all-reduce is two of these (reduce-scatter then all-gather). Patarasuk & Yuan 2009; NCCL docs
    ("bus bandwidth").
    """
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * nbytes / (link.bandwidth_bytes_per_s * cal.link_fraction) + (n - 1) * link.latency_s


def group_collective_s(nbytes: float, n: int, stride: int, cluster: ClusterSpec, cal: Calibration) -> float:
    """All-gather or reduce-scatter over n ranks spaced `stride` apart (rank order tp-cp-ep-dp-pp).

    Inside one node: a ring on NVLink. Across nodes, hierarchical: the k = gpus_per_node / stride
    members a node holds first reduce-scatter among themselves on NVLink ((k-1)/k * bytes), then each
    runs the inter-node ring over the n/k nodes on its own NIC with 1/k of the data
    ((n/k - 1)/(n/k) * bytes / k); an all-gather is the mirror image. A group with one member per
    node (k = 1) is a plain ring on the network. NCCL's multi-NIC rings and trees reach the same
    bound (the node's NICs share the inter-node traffic); Thakur et al. 2005 for the two-phase form.
    """
    if n <= 1 or nbytes <= 0:
        return 0.0
    gpn = cluster.gpus_per_node
    if n * stride <= gpn:
        return ring_collective_s(nbytes, n, cluster.intra_node, cal)
    k = max(1, min(n, gpn // stride))
    nodes = max(1, round(n / k))
    return (ring_collective_s(nbytes, k, cluster.intra_node, cal)
            + ring_collective_s(nbytes / k, nodes, cluster.inter_node, cal))


def all_to_all_s(nbytes_per_rank: float, n: int, link: LinkSpec, cal: Calibration) -> float:
    """All-to-all where each rank holds `nbytes_per_rank`, keeps 1/n and sends the rest: (n-1)/n * bytes / bw + latency."""
    if n <= 1 or nbytes_per_rank <= 0:
        return 0.0
    return (n - 1) / n * nbytes_per_rank / (link.bandwidth_bytes_per_s * cal.link_fraction) + link.latency_s


# --- parameters per GPU (for DP communication and the optimizer) ------------------------------
def stage_params(model: ModelSpec, layout: Layout) -> tuple[float, float]:
    """(dense, expert) parameters held by one GPU of the heaviest stage: the one placement of
    `autotune.cost.placement` (the memory model's), whose heaviest stage paces the DP reduction and the
    optimizer step (MoE parallel folding for the experts, arXiv 2504.14960)."""
    heavy = heaviest_stage(placement_stage_params(model, layout))
    return float(heavy.dense_params_per_gpu), float(heavy.expert_params_per_gpu)


def dp_comm_s(job: Job, layout: Layout, cal: Calibration, params: tuple[float, float] | None = None) -> float:
    """Gradient reduce (and parameter all-gather with the distributed optimizer), before overlap.

    Dense gradients are reduced over the DP x CP group (stride t), expert gradients over the expert-DP
    group (stride e * etp). Distributed optimizer (ZeRO-1): reduce-scatter fp32 grads + all-gather bf16
    params; otherwise an all-reduce (2 ring passes) of fp32 grads. Megatron-core
    `distributed/param_and_grad_buffer.py`.
    """
    cluster = job.cluster
    dense, expert = stage_params(job.model, layout) if params is None else params
    total = 0.0
    for params, group, stride in ((dense, layout.dp * layout.cp, layout.tp),
                                  (expert, layout.expert_dp, layout.ep * layout.expert_tp)):
        if params <= 0 or group <= 1:
            continue
        if layout.dist_opt:
            total += group_collective_s(params * GRAD_BYTES, group, stride, cluster, cal)
            total += group_collective_s(params * PARAM_BYTES, group, stride, cluster, cal)
        else:
            total += 2 * group_collective_s(params * GRAD_BYTES, group, stride, cluster, cal)
    return total


def optimizer_step_s(job: Job, layout: Layout, cal: Calibration, params: tuple[float, float] | None = None) -> float:
    """Adam over this GPU's shard, memory-bound: params * ~34 B / HBM bandwidth (shard = 1/DP with dist opt)."""
    dense, expert = stage_params(job.model, layout) if params is None else params
    if layout.dist_opt:
        dense /= layout.dp * layout.cp
        expert /= max(layout.expert_dp, 1)
    return memory_bound_time_s((dense + expert) * ADAM_BYTES_PER_PARAM, gpu=job.cluster.gpu, cal=cal)


def pipeline_bubble_s(stage_s: tuple[float, ...], layout: Layout) -> float:
    """Fill and drain of a 1F1B pipeline with per-micro-batch stage times t_s: (sum t_s - max t_s) / v.

    The heaviest stage works through all m micro-batches; every other stage's one pass adds fill or
    drain time. Equal stages give (p - 1) / v * t, Narayanan et al. 2021 eq. (1) and Sec. 2.2.2
    (interleaved); with megatron-core's uneven split the heaviest stage sets the pace.
    """
    return (sum(stage_s) - max(stage_s)) / layout.vpp_size


# --- one micro-batch through one layer --------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class MicrobatchTimes:
    """One micro-batch, forward + backward, on one GPU: an average layer, the last stage's extras, p2p."""

    per_layer: dict[str, float]  # keys of TIME_KEYS; average over dense and MoE layers
    last_stage: dict[str, float]  # logits GEMM and loss, on the last stage only
    p2p_s: float  # pipeline sends of one micro-batch on one stage (all v chunks, both directions)
    overlap_window_s: float  # one layer's forward + backward compute (what DP communication can hide under)


def _attention_gemms_fwd_s(model: ModelSpec, tokens: float, t: int, gemm: GemmCost) -> float:
    """Forward GEMMs of one attention block on one GPU: QKV (column-parallel) and output projection (row-parallel).

    GQA: each rank holds a/t query heads and g/t KV groups (one replicated group when t > g,
    megatron-core `get_num_query_groups_per_partition`). MLA: down-projections are replicated,
    up-projections and the output projection are split by t (megatron-core `multi_latent_attention.py`).
    """
    h, a = model.hidden_size, model.num_attention_heads
    if model.mla is not None:
        x = model.mla
        qk = x.qk_head_dim + x.qk_pos_emb_head_dim
        if x.q_lora_rank is None:
            q = gemm.time_s(tokens, a * qk / t, h)
        else:
            q = gemm.time_s(tokens, x.q_lora_rank, h)
            q += gemm.time_s(tokens, a * qk / t, x.q_lora_rank)
        kv = gemm.time_s(tokens, x.kv_lora_rank + x.qk_pos_emb_head_dim, h)
        kv += gemm.time_s(tokens, a * (x.qk_head_dim + x.v_head_dim) / t, x.kv_lora_rank)
        proj = gemm.time_s(tokens, h, a * x.v_head_dim / t)
        return q + kv + proj
    d, g = model.head_dim, model.query_groups
    g_local = g / t if g >= t else 1
    qkv = gemm.time_s(tokens, (a / t + 2 * g_local) * d, h)
    proj = gemm.time_s(tokens, h, a * d / t)
    return qkv + proj


def _attention_core_fwd_flops(model: ModelSpec, tokens: float, s: int, t: int) -> float:
    """Causal attention core per GPU: 2 * tokens * (s/2) * (a/t) * (d_qk + d_v) (QK^T and PV; CP splits queries)."""
    a = model.num_attention_heads
    if model.mla is not None:
        x = model.mla
        width = x.qk_head_dim + x.qk_pos_emb_head_dim + x.v_head_dim
    else:
        width = 2 * model.head_dim
    return 2.0 * tokens * (s / 2) * (a / t) * width


def _kv_width(model: ModelSpec, t: int) -> float:
    """Elements of K and V per token on one TP rank (what context parallelism passes around the ring)."""
    if model.mla is not None:
        x = model.mla
        return model.num_attention_heads / t * (x.qk_head_dim + x.qk_pos_emb_head_dim + x.v_head_dim)
    g = model.query_groups
    return 2 * (g / t if g >= t else 1) * model.head_dim


def _mlp_gemms_fwd_s(model: ModelSpec, tokens: float, ffn: float, t: int, gemm: GemmCost,
                     count: float = 1.0) -> float:
    """fc1 (h -> f/t, doubled when gated) and fc2 (f/t -> h) for `count` MLPs of `tokens` rows each."""
    h = model.hidden_size
    fc1_out = (2 if model.gated_linear_unit else 1) * ffn / t
    return (gemm.time_s(tokens, fc1_out, h, count)
            + gemm.time_s(tokens, h, ffn / t, count))


def _tp_block_comm_s(tokens: float, h: int, t: int, sp: bool, cluster: ClusterSpec,
                     cal: Calibration) -> tuple[float, float]:
    """(forward, backward) TP communication of one block (attention or MLP) for one micro-batch.

    With SP: forward all-gather + reduce-scatter, backward reduce-scatter + all-gather + the input
    all-gather redone for the weight gradient (Korthikanti et al. 2022 Sec. 4.2.2): 2 + 3 ring passes.
    Without SP: one all-reduce forward, one backward (Shoeybi et al. 2019 Fig. 4): 2 + 2 ring passes.
    """
    one = group_collective_s(tokens * h * 2.0, t, 1, cluster, cal)
    return 2 * one, (3 if sp else 2) * one


def microbatch_times(job: Job, layout: Layout, cal: Calibration) -> MicrobatchTimes:
    """Forward + backward (+ recompute) of one micro-batch through one average layer, term by term.

    tokens = b * s / c rows per GEMM; backward GEMMs cost 2x forward (dgrad + wgrad, same shapes
    transposed); the attention core's backward 2.5x its forward (FlashAttention-2: 5 matmuls vs 2).
    The layer terms depend on (t, c, e, etp, b, SP, recompute) only, so they are cached across the
    layouts of a search that differ in p, v, DP or the optimizer.
    """
    memo = _memo(job, cal)
    key = (layout.tp, layout.cp, layout.ep, layout.expert_tp, layout.mbs, layout.sp and layout.tp > 1, layout.recompute)
    terms = memo.get(key)
    if terms is None:
        terms = memo[key] = _layer_terms(job, *key, cal)
    per_layer, last_stage, window = terms
    return MicrobatchTimes(per_layer=per_layer, last_stage=last_stage, p2p_s=pipeline_p2p_s(job, layout, cal),
                           overlap_window_s=window)


def pipeline_p2p_s(job: Job, layout: Layout, cal: Calibration) -> float:
    """Pipeline sends of one micro-batch on one stage: 2 * v messages (activation forward, gradient backward)
    of b*s*h/(t if SP)/c bf16 elements on the PP group's link (stride t*c*DP). Narayanan et al. 2021 Sec. 4.1."""
    if layout.pp <= 1:
        return 0.0
    link = job.cluster.link_for_group(layout.pp, layout.tp * layout.cp * layout.dp)
    h = job.model.hidden_size
    nbytes = layout.mbs * job.training.seq_length / layout.cp * (h / layout.tp if layout.sp else h) * 2.0
    return 2 * layout.vpp_size * (nbytes / (link.bandwidth_bytes_per_s * cal.link_fraction) + link.latency_s)


def expert_all_to_all_s(tokens: float, topk: int, h: int, ep: int, etp: int, cluster: ClusterSpec,
                        cal: Calibration) -> float:
    """One token dispatch (or combine) of `tokens` tokens per rank over the EP group, two-level across nodes.

    Inside a node: each rank sends (e-1)/e of its k * tokens copies of 2h bytes over NVLink. When the
    group spans n nodes, a token crosses the network once per distinct remote node among its k experts
    (node-level deduplication, as DeepEP and megatron-core's hierarchical flex dispatcher do; expected
    distinct nodes of k uniform picks: n * (1 - (1 - 1/n)^k), of which (n-1)/n are remote), and the copies
    are fanned out to experts inside each node over NVLink, concurrently:
    max(remote bytes / network bw, local bytes / NVLink bw) + latency.
    """
    if ep <= 1 or tokens <= 0:
        return 0.0
    copy_bytes = tokens * topk * 2.0 * h
    span = ep * etp
    if span <= cluster.gpus_per_node:
        return all_to_all_s(copy_bytes, ep, cluster.intra_node, cal)
    nodes = span / cluster.gpus_per_node
    remote_nodes = nodes * (1.0 - (1.0 - 1.0 / nodes) ** topk) * (nodes - 1) / nodes
    remote = tokens * remote_nodes * 2.0 * h
    local = copy_bytes * (1.0 - 1.0 / ep)  # every copy but the rank's own lands via NVLink on its final GPU
    inter, intra = cluster.inter_node, cluster.intra_node
    return max(remote / (inter.bandwidth_bytes_per_s * cal.link_fraction),
               local / (intra.bandwidth_bytes_per_s * cal.link_fraction)) + inter.latency_s


def _exposed_s(comm_s: float, exposed_fraction: float, overlap_compute_s: float) -> float:
    """Communication left on the critical path when overlapped with compute: at least the fitted
    exposed share, and at least what the compute it overlaps with cannot cover:
    max(f * comm, comm - compute). Cross-node TP or EP, whose traffic outlasts the GEMMs, stays exposed."""
    return max(exposed_fraction * comm_s, comm_s - overlap_compute_s)


_MEMOS: dict[tuple[int, int], tuple[Job, Calibration, dict]] = {}


def _memo(job: Job, cal: Calibration) -> dict:
    """Per-(job, calibration) memo of layer terms, found by identity: hashing a Job walks every nested
    spec field, which costs more than the lookup it serves. Entries hold their job and calibration, so
    an id is never reused while its entry lives."""
    key = (id(job), id(cal))
    entry = _MEMOS.get(key)
    if entry is None or entry[0] is not job or entry[1] is not cal:
        if len(_MEMOS) >= 64:
            _MEMOS.clear()
        entry = _MEMOS[key] = (job, cal, {})
    return entry[2]


def _layer_terms(job: Job, t: int, c: int, ep: int, etp: int, mbs: int, sp: bool, recompute: str,
                 cal: Calibration) -> tuple[dict[str, float], dict[str, float], float]:
    """(per-layer terms, last-stage terms, one layer's fwd + bwd compute) for one micro-batch."""
    model, cluster, training = job.model, job.cluster, job.training
    gpu, precision = cluster.gpu, training.precision
    gemm = gemm_cost(gpu, precision, cal)
    s, h = training.seq_length, model.hidden_size
    tokens = mbs * s / c
    h_act = h / t if sp else h  # hidden width of norm/dropout activations on one rank

    attn_fwd = _attention_gemms_fwd_s(model, tokens, t, gemm)
    core_fwd = attention_time_s(_attention_core_fwd_flops(model, tokens, s, t), gpu=gpu, cal=cal,
                                block_tokens=s / c)
    core_bwd = 2.5 * core_fwd
    rope = 4 * model.num_attention_heads / t * model.head_dim  # rotary on q and k: read + write, about q's width twice
    attn_elem_fwd = memory_bound_time_s(2.0 * tokens * (5 * h_act + rope), gpu=gpu, cal=cal)
    tp_f, tp_b = _tp_block_comm_s(tokens, h, t, sp, cluster, cal)

    # dense MLP layer
    gate_io = 3 if model.gated_linear_unit else 2
    dense_fwd = _mlp_gemms_fwd_s(model, tokens, model.ffn_hidden_size, t, gemm)
    dense_elem = memory_bound_time_s(2.0 * tokens * (5 * h_act + gate_io * model.ffn_hidden_size / t), gpu=gpu, cal=cal)
    # MoE layer (parallel folding: routed tokens per GPU = tokens * k / t, spread over E/e local experts)
    moe_fwd = moe_elem = moe_tp_f = moe_tp_b = a2a = 0.0
    if model.moe is not None:
        x = model.moe
        local_experts = x.num_experts / ep
        rows = tokens * x.topk * ep * etp / (t * x.num_experts)  # rows per local expert GEMM
        moe_fwd = _mlp_gemms_fwd_s(model, rows, x.expert_ffn_hidden_size, etp, gemm, count=local_experts)
        moe_fwd += gemm_cost(gpu, "bf16", cal).time_s(tokens / t, x.num_experts, h)  # router
        pairs = tokens * x.topk / t
        moe_bytes = pairs * (gate_io * x.expert_ffn_hidden_size + 4 * h) + 5 * h_act * tokens
        if x.shared_expert_ffn_hidden_size:
            moe_fwd += _mlp_gemms_fwd_s(model, tokens, x.shared_expert_ffn_hidden_size, t, gemm)
            moe_bytes += tokens * gate_io * x.shared_expert_ffn_hidden_size / t
            moe_tp_f, moe_tp_b = _tp_block_comm_s(tokens, h, t, sp, cluster, cal)
        moe_elem = memory_bound_time_s(2.0 * moe_bytes, gpu=gpu, cal=cal)
        if etp > 1:
            etp_f, etp_b = _tp_block_comm_s(pairs * etp, h, etp, True, cluster, cal)
            moe_tp_f, moe_tp_b = moe_tp_f + etp_f, moe_tp_b + etp_b
        a2a = expert_all_to_all_s(tokens / t, x.topk, h, ep, etp, cluster, cal)  # one dispatch or combine

    n_moe, n_dense = model.num_moe_layers, model.num_dense_mlp_layers
    w_moe, w_dense = n_moe / model.num_layers, n_dense / model.num_layers

    mlp_fwd = w_dense * (dense_fwd + dense_elem) + w_moe * (moe_fwd + moe_elem)
    fwd_compute = attn_fwd + core_fwd + attn_elem_fwd + mlp_fwd
    gemm_fwd = attn_fwd + w_dense * dense_fwd + w_moe * moe_fwd  # what TP communication can overlap with
    bwd_compute = 2 * (attn_fwd + attn_elem_fwd + mlp_fwd) + core_bwd
    tp_fwd = tp_f + w_dense * tp_f + w_moe * moe_tp_f
    tp_bwd = tp_b + w_dense * tp_b + w_moe * moe_tp_b
    ep_fwd, ep_bwd = w_moe * 2 * a2a, w_moe * 2 * a2a

    cp_s = 0.0
    if c > 1:
        kv_bytes = tokens * _kv_width(model, t) * 2.0
        cp_link = cluster.link_for_group(c, t)
        step = kv_bytes / (cp_link.bandwidth_bytes_per_s * cal.link_fraction) + cp_link.latency_s
        cp_total = 3 * (c - 1) * step  # forward KV, backward KV + dKV (Liu et al. 2023 ring attention)
        cp_s = max(0.0, cp_total - cal.cp_overlap_fraction * (core_fwd + core_bwd))

    if recompute == "full":  # every layer's forward again, with its communication
        recompute = (fwd_compute + _exposed_s(tp_fwd, cal.fractions(gpu).tp_comm_exposed_fraction, gemm_fwd)
                     + _exposed_s(ep_fwd, cal.ep_comm_exposed_fraction, w_moe * moe_fwd))
    elif recompute == "selective":  # the attention core (Korthikanti et al. 2022 Sec. 5)
        recompute = core_fwd
    else:
        recompute = 0.0

    per_layer = {
        "compute": fwd_compute + bwd_compute,
        "recompute": recompute,
        "tp_comm": _exposed_s(tp_fwd + tp_bwd, cal.fractions(gpu).tp_comm_exposed_fraction, 3 * gemm_fwd),
        "ep_comm": _exposed_s(ep_fwd + ep_bwd, cal.ep_comm_exposed_fraction, 3 * w_moe * moe_fwd),
        "cp_comm": cp_s,
        "moe_routing": w_moe * 2 * cal.moe_layer_overhead_s,
    }
    vocab = padded_vocab_size(model)
    logits = 3 * gemm.time_s(tokens, vocab / t, h)
    loss = memory_bound_time_s(tokens * vocab / t * 12.0, gpu=gpu, cal=cal)  # fp32 logits read/written fwd + bwd
    last_stage = {"compute": logits + loss}

    return per_layer, last_stage, fwd_compute + bwd_compute


# --- the step --------------------------------------------------------------------------------
def estimate_time(job: Job, layout: Layout, cal: Calibration = DEFAULT_CALIBRATION) -> TimeEstimate:
    """Step time, tokens/s per GPU, model TFLOP/s per GPU and MFU of `layout` on `job`.

    m = GBS / (b * DP) micro-batches; stage s runs L_s layers (`Layout.stage_layer_counts`, megatron-core's
    even or uneven split), the last stage also the logits and loss. The heaviest stage sets the steady
    state (m of its micro-batches), the others' fill and drain the bubble (`pipeline_bubble_s`). DP communication overlaps with the last micro-batch's
    backward (grad reduce-scatter) and the first micro-batch's forward (param all-gather), all but
    the last bucket (`dp_overlap_fraction`), never more than that compute.
    """
    model, training, cluster = job.model, job.training, job.cluster
    m = max(layout.num_microbatches(training.global_batch_size), 1)
    mb = microbatch_times(job, layout, cal)
    pp = layout.pp
    per_layer, last_stage = mb.per_layer, mb.last_stage
    layer_s, last_s = sum(per_layer.values()), sum(last_stage.values())
    counts = layout.stage_layer_counts(model.num_layers)
    stage_s = tuple(n * layer_s + (last_s if s == pp - 1 else 0.0) for s, n in enumerate(counts))
    heavy = max(range(pp), key=lambda s: (stage_s[s], s))  # ties: the last stage (it has the logits)
    layers_max = counts[heavy]
    breakdown = dict.fromkeys(TIME_KEYS, 0.0)
    scale = m * layers_max
    for key, value in per_layer.items():
        breakdown[key] = scale * value
    if heavy == pp - 1:
        for key, value in last_stage.items():
            breakdown[key] += m * value
    breakdown["pp_bubble"] = pipeline_bubble_s(stage_s, layout)
    if pp > 1:
        breakdown["pp_p2p"] += m * mb.p2p_s * cal.pp_p2p_exposed_fraction
    memo = _memo(job, cal)
    pkey = ("params", layout.tp, counts, layout.ep, layout.expert_tp)
    params = memo.get(pkey)
    if params is None:
        params = memo[pkey] = stage_params(model, layout)
    breakdown["dp_comm"] = _exposed_dp_s(dp_comm_s(job, layout, cal, params), mb.overlap_window_s * layers_max, cal)
    breakdown["optimizer"] = optimizer_step_s(job, layout, cal, params)
    breakdown["overhead"] += cal.step_overhead_s

    step_s = sum(breakdown.values())
    world = layout.world_size
    flops = memo.get("flops")
    if flops is None:
        flops = memo["flops"] = model_flops_per_step(model, training)
    peak = cluster.gpu.peak_flops(training.precision)
    tokens = training.global_batch_size * training.seq_length
    return TimeEstimate(
        step_time_s=step_s,
        breakdown=breakdown,
        tokens_per_s_per_gpu=tokens / step_s / world,
        tflops_per_gpu=flops / step_s / world / 1e12,
        mfu=flops / (step_s * peak * world),
        model_flops_per_step=flops,
    )


def _exposed_dp_s(comm_s: float, window_s: float, cal: Calibration) -> float:
    """DP time left on the critical path: comm - min(overlap fraction * comm, backward window)."""
    return comm_s - min(cal.dp_overlap_fraction * comm_s, window_s)


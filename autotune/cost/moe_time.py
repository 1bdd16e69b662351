"""One micro-batch through one MoE block on one GPU, from first principles.

megatron-core 0.16.1 `transformer/moe/` (MoELayer: router -> token dispatcher -> experts -> combine), with
parallel folding (Liu et al. 2025, arXiv 2504.14960): the block's input is the rank's T = b*s/(c*t) tokens
(sequence-sharded under SP); each token picks k of E experts; the E experts are spread over EP ranks, each expert's
FFN split over ETP ranks. Per forward:

- router: a T x E x h GEMM and the fused softmax / top-k (`moe_router_fusion`), memory-bound;
- permute and unpermute (`moe_permute_fusion`): read T tokens and write T*k copies of h bf16 values, and the
  mirror image with the weighted sum; memory-bound;
- dispatch and combine: `autotune.cost.comm.dispatch_s`, by dispatcher, inside and across NVLink domains;
  exposed unless `overlap_moe_expert_parallel_comm` hides them under another micro-batch's compute (`_ep_overlap`);
- experts: grouped GEMMs over E/EP local experts of R = T*k*EP*ETP/E rows each, times the busiest rank's share
  (`Calibration.moe_imbalance`, 1 when routing is forced balanced); a grouped GEMM reaches
  `grouped_gemm_fraction` of a dense one; without `moe_grouped_gemm` the experts run one after another
  (SequentialMLP), each with its own launches;
- shared experts: a dense MLP on the block's rows, split over TP;
- host: the block's framework ops, the local experts' C++ launches (TE `GroupedLinear` issues one GEMM, and in
  FP8 one quantisation, per expert), and one device-to-host sync in the forward (the dispatcher needs the
  per-expert token counts on the host: `tokens_per_expert` / TE's `m_splits`). CUDA graphs over `moe_router` and
  `moe_preprocess` replace those parts' launches with one replay.
"""

from __future__ import annotations

from autotune.cost.comm import dispatch_s, group_collective_s
from autotune.cost.efficiency import Calibration, gemm_cost, memory_bound_time_s
from autotune.cost.layer_time import BF16, Pass, Shape, fp8_cast_s, host_s, mlp_gemms_fwd_s, tp_exposed_s
from search_spaces.training import TrainingSpec

__all__ = ["moe_block", "moe_load_factor", "MOE_ROUTER_HOST_OPS", "MOE_PREPROCESS_HOST_OPS", "MOE_HOST_OPS",
           "EXPERT_KERNELS"]

# Framework ops per MoE forward, counted on megatron-core 0.16.1 (`moe_layer.py`, `router.py`, `token_dispatcher.py`,
# `experts.py` TEGroupedMLP): router GEMM, fused top-k, aux-loss bookkeeping (router); token counts, the
# dispatcher's split sizes and the host copy (preprocess); permute, two all-to-alls, chunk sorts, two grouped
# GEMMs, activation, unpermute, BDA and reshapes (the rest). Only their product with `host_op_s` matters.
MOE_ROUTER_HOST_OPS = 10
MOE_PREPROCESS_HOST_OPS = 8
MOE_HOST_OPS = 20
# C++-side kernel launches per local expert and forward: two GEMMs, and in FP8 two input quantisations
# (TE `general_grouped_gemm` / `split_quantize` loop over the experts' problems).
EXPERT_KERNELS = {"bf16": 2, "fp8": 4}
SEQUENTIAL_EXPERT_HOST_OPS = 6  # SequentialMLP: a Python loop over experts, fc1 / act / fc2 / reshapes each


def moe_load_factor(training: TrainingSpec, cal: Calibration) -> float:
    """The busiest expert's tokens over its even share: 1 with forced balanced routing, `moe_imbalance` with the
    learned router; token dropping caps it at the capacity factor, drop-and-pad runs every expert at exactly it
    (megatron-core `moe_utils.py::get_capacity`, `topk_routing_with_score_function` + `apply_router_token_dropping`)."""
    load = 1.0 if training.moe_router_force_load_balancing else cal.moe_imbalance
    cf = training.moe_expert_capacity_factor
    if cf is None:
        return load
    return cf if training.moe_pad_expert_input_to_capacity else min(load, cf)


def _dispatch_s(x: Shape) -> float:
    """One dispatch (or combine, the same size) of this rank's T tokens."""
    m = x.model.moe
    assert m is not None
    # LatentMoE dispatches the latent tokens (token_dispatcher.py:1519-1522): `expert_width`
    return dispatch_s(x.job.moe_dispatcher[0], x.tokens, m.topk, x.model.expert_width, x.tp, x.ep, x.etp,
                      x.job.cluster, x.cal)


def _exposed_s(x: Shape, comm_s: float, window_s: float) -> float:
    """One all-to-all x under one window w of the other micro-batch's compute, beyond the window: the two contend for
    SMs and HBM while they overlap (the comm kernels take SMs from the GEMMs, the GEMMs slow the comm's copies), so
    the shorter of the two is hidden only to (1 - s), s the fitted `Calibration.ep_overlap_exposed`: the pair lasts
    max(x, w) + s min(x, w), and what it adds to the window is max(s x, x - (1 - s) w)."""
    s = x.cal.ep_overlap_exposed
    return max(s * comm_s, comm_s - (1.0 - s) * window_s) if comm_s > 0 else 0.0


def _ep_overlap(x: Shape, a2a: float, pre_dispatch_f: float, mlp_f: float) -> tuple[float, float]:
    """(forward, backward) exposed EP all-to-all of one micro-batch: all four (dispatch and combine, each way)
    without `overlap_moe_expert_parallel_comm`; with it, megatron-core's 1F1B overlap runs one micro-batch's
    layer forward with another's layer backward on two streams (megatron-core 0.19
    `models/common/model_chunk_schedule_plan.py::TransformerLayerSchedulePlan.run`):

        comm:    combine_bwd      | dispatch_fwd -> dispatch_bwd      | combine_fwd
        compute: pre_dispatch_fwd | mlp_bwd -> mlp_bwd_dw -> mlp_fwd  | pre_dispatch_bwd

    so each all-to-all hides under one window: the backward's combine under the attention forward (with the router
    and permute: `pre_dispatch_f`), the forward's dispatch under the experts' backward (data and weight gradients,
    2 x `mlp_f`), the backward's dispatch under the experts' forward, the forward's combine under the attention
    backward (2 x `pre_dispatch_f`). Following the dependencies (the forward's mlp waits for its dispatch, the
    backward's attention for its dispatch, the next layer for both combines) gives the same layer time as these four
    windows. `delay_wgrad_compute` moves the experts' weight gradients to `mlp_bwd_dw`, so the backward's dispatch
    may start after the data gradients; that shortens the chain only while one all-to-all lasts between one and two
    expert forwards, and is not modelled (measured: +0.4%, Bridge skills `perf-expert-parallel-overlap`,
    `bench/data/published_sweeps.csv`). Each all-to-all and its window contend while they overlap (`_exposed_s`:
    the pair lasts max(x, w) + s min(x, w)); s is fitted with NVIDIA's two H100 A/Bs of this switch among the rows."""
    if not x.ep_overlap:
        return 2 * a2a, 2 * a2a
    fwd = _exposed_s(x, a2a, 2 * mlp_f) + _exposed_s(x, a2a, 2 * pre_dispatch_f)
    bwd = _exposed_s(x, a2a, pre_dispatch_f) + _exposed_s(x, a2a, mlp_f)
    return fwd, bwd


def moe_block(x: Shape, attention: dict[str, Pass] | None = None) -> dict[str, Pass]:
    """Forward, backward and recomputable parts of one MoE block (see the module docstring); `attention` is the
    layer's attention block, the compute the EP overlap hides the combines under (`_ep_overlap`)."""
    model, job, cal = x.model, x.job, x.cal
    m, training, gpu = model.moe, job.training, job.cluster.gpu
    assert m is not None
    h, T, k = model.hidden_size, x.tokens, m.topk
    w = model.expert_width  # what is permuted, dispatched and fed to the experts: h, or LatentMoE's latent size
    local = m.num_experts / x.ep
    imbalance = moe_load_factor(training, cal)
    rows = T * k * x.ep * x.etp / m.num_experts * imbalance  # rows per local expert on the busiest rank
    copies = T * k * imbalance  # token copies this rank sends and receives

    def mem(nbytes: float) -> float:
        return memory_bound_time_s(nbytes, gpu=gpu, cal=cal)

    # the router GEMM stays in BF16 (or FP32) in FP8 runs: TE's autocast does not cover megatron's router
    router = gemm_cost(gpu, "bf16", None, cal).time_s(T, m.num_experts, h)
    router += mem(4.0 * 3 * T * m.num_experts)  # fp32 logits: softmax, top-k, probabilities
    norm = mem(BF16 * 2 * T * h)
    permute = mem(BF16 * w * (T + copies)) + mem(4.0 * copies)  # tokens in, copies out; the row map
    unpermute = mem(BF16 * w * (T + copies)) + mem(4.0 * copies)
    grouped = 1.0 if not training.moe_grouped_gemm else cal.grouped_gemm_fraction
    experts, elements = mlp_gemms_fwd_s(x, rows, m.expert_ffn_hidden_size, x.etp, count=local, efficiency=grouped,
                                        width=w)
    gate_io = 3 if model.gated_linear_unit else 2
    act = mem(BF16 * rows * local * gate_io * m.expert_ffn_hidden_size / x.etp)
    experts_cast = fp8_cast_s(x, elements)
    shared = shared_cast = 0.0
    if m.shared_expert_ffn_hidden_size:
        shared, shared_elements = mlp_gemms_fwd_s(x, x.rows, m.shared_expert_ffn_hidden_size, x.tp)
        shared += mem(BF16 * x.rows * gate_io * m.shared_expert_ffn_hidden_size / x.tp)
        shared_cast = fp8_cast_s(x, shared_elements)
    bda = mem(BF16 * 3 * T * h)
    latent = latent_cast = 0.0
    if m.latent_size is not None:
        # LatentMoE: fc1_latent_proj (h -> L) before the dispatch and fc2_latent_proj (L -> h) after the combine,
        # duplicated TELinears on the rank's own T tokens, not split (moe/moe_layer.py:273-296, 482-483, 584-585)
        latent = x.gemm.time_s(T, m.latent_size, h) + x.gemm.time_s(T, h, m.latent_size)
        latent_cast = fp8_cast_s(x, T * (h + m.latent_size))

    a2a = _dispatch_s(x)  # dispatch; the combine is the same size
    # the dispatcher all-gathers every rank's per-expert token counts over the EP group before the host copy
    # (`MoEAlltoAllTokenDispatcher.preprocess`): E int64 counts per rank, latency-bound
    counts = group_collective_s(8.0 * m.num_experts * x.ep, x.ep, x.etp, job.cluster, cal) if x.ep > 1 else 0.0
    etp_comm = 0.0
    if x.etp > 1:  # expert-TP: the experts' output is reduce-scattered (input all-gathered) over the ETP group
        etp_comm = group_collective_s(copies * w * BF16 * x.etp, x.etp, 1, job.cluster, cal)
    shared_tp = 0.0
    if m.shared_expert_ffn_hidden_size and x.tp > 1:
        shared_tp = 2 * group_collective_s(x.rows * h * BF16, x.tp, 1, job.cluster, cal)

    compute_f = router + norm + permute + unpermute + experts + act + experts_cast + shared + shared_cast + bda
    compute_f += latent + latent_cast
    attention_f = attention["fwd"].compute if attention is not None else 0.0
    ep_f, ep_b = _ep_overlap(x, a2a, attention_f + router + norm + permute + latent + latent_cast,
                             experts + act + experts_cast + shared + shared_cast)

    full = x.cuda_graphs == "full_iteration"
    kernels = EXPERT_KERNELS["fp8" if x.quantized else "bf16"] * local
    expert_host = 0.0 if full else kernels * cal.host_kernel_s
    if not training.moe_grouped_gemm and not full:
        expert_host += SEQUENTIAL_EXPERT_HOST_OPS * local * x.host_op_s
    host = (host_s(x, MOE_ROUTER_HOST_OPS, "moe_router") + host_s(x, MOE_PREPROCESS_HOST_OPS, "moe_preprocess")
            + (0.0 if full else MOE_HOST_OPS * x.host_op_s) + expert_host)
    # full-iteration graphs of a MoE model run with the paged stash: the dispatcher's buffers are static (sized by
    # the rank capacity factor), so the token counts never travel to the host (megatron-core 0.19
    # `token_dispatcher.py` with `moe_expert_rank_capacity_factor`); otherwise one device-to-host sync per forward
    syncs = 0 if full else 1

    fwd = Pass(compute=compute_f, tp_comm=tp_exposed_s(x, shared_tp, shared) + etp_comm, ep_comm=ep_f + counts,
               host=host, syncs=syncs)
    # the backward quantises the output gradients once, as the forward its inputs
    casts = experts_cast + shared_cast + latent_cast
    bwd = Pass(compute=2 * (compute_f - casts) + casts,
               tp_comm=tp_exposed_s(x, 1.5 * shared_tp, 2 * shared) + etp_comm, ep_comm=ep_b,
               host=cal.host_backward_ratio * host)
    return {"fwd": fwd, "bwd": bwd, "layernorm": Pass(compute=norm), "moe_act": Pass(compute=act),
            "shared_experts": Pass(compute=shared + shared_cast), "moe": fwd}


"""The step-time terms of a layout: each layer's passes, the pipeline, data-parallel communication, the optimizer.

`layer_times` gives one micro-batch's forward + backward (+ recompute) through each kind of layer (dense, MoE,
Mamba, attention-only, MTP) and the last stage's logits and loss (`autotune/cost/layer_time.py`, `moe_time.py`,
`mamba_time.py`; each pass max(GPU, host)); `pipeline_p2p_s`, `dp_comm_s`, `fsdp_comm_s` and `optimizer_step_s` the
traffic and the step of a layout's stage; `pipeline_bubble_s`, `exposed_dp_s`, `fsdp_exposed_s` and
`offload_exposed_s` what of it stays on the critical path. Each is one function with its source. They are added up
in one place, `autotune/cost/step_time.py` (the visible sum, on arrays of layouts). Every fitted or assumed constant
is in `autotune/cost/efficiency.py`; see docs/throughput-model.md for the terms, their sources and the fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.cost.comm import group_collective_s, p2p_s
from autotune.cost.efficiency import DEFAULT_CALIBRATION, Calibration, gemm_cost, memory_bound_time_s
from autotune.cost.flops import padded_vocab_size
from autotune.cost.layer_time import BF16, Pass, Shape, attention_block, dense_mlp_block, fp8_cast_s, shape_of
from autotune.cost.mamba_time import mamba_block
from autotune.cost.moe_time import moe_block
from autotune.cost.muon import step_s as muon_step_s
from autotune.cost.placement import StageParams, nonunit_params_per_gpu
from search_spaces.job import Job
from search_spaces.layout import Layout

__all__ = ["TimeEstimate", "LayerTimes", "layer_times", "pipeline_bubble_s", "pipeline_p2p_s", "dp_comm_s",
           "exposed_dp_s", "fsdp_comm_s", "fsdp_exposed_s", "fsdp_units", "offload_exposed_s", "host_link_bytes_per_s",
           "optimizer_step_s", "ep_unpaired_share", "unpaired_share", "layer_vector", "LAYER_PARTS", "LAYER_VECTOR",
           "TIME_KEYS", "LAYER_KEYS", "BF16_KINDS", "bf16_job"]

TIME_KEYS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "host", "pp_p2p", "pp_bubble", "dp_comm",
             "offload", "optimizer", "overhead")
LAYER_KEYS = TIME_KEYS[:6]
# Cross-entropy bytes per logit (forward + backward): TE's fused kernel reads the bf16 logits twice (max/sum, then
# loss and gradient) and writes the gradient (3 x 2 B); megatron's native fused vocab-parallel loss works in fp32
# (read 2, write and read an fp32 copy, exp, write the gradient: ~14 B); the unfused loss ~5 fp32 passes (20 B).
LOSS_BYTES_PER_LOGIT = {"te": 6.0, "native": 14.0, "none": 20.0}
OUTPUT_HOST_OPS = 6  # final norm, output GEMM, loss, reshapes


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeEstimate:
    """One layout's step time and its breakdown (seconds per step; the breakdown sums to step_time_s), and the
    calibration's uncertainty band on tokens/s (from the leave-one-model-out residuals of the fit)."""

    step_time_s: float
    breakdown: dict[str, float]
    tokens_per_s_per_gpu: float
    tokens_per_s_per_gpu_low: float
    tokens_per_s_per_gpu_high: float
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


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """One micro-batch's forward + backward through one dense and one MoE layer, one multi-token-prediction layer,
    and the last stage's extras (seconds by LAYER_KEYS); fwd_s / bwd_s are the wall times DP communication can
    hide under. A hybrid model's layers are one block each (`ModelSpec.hybrid_pattern`): `dense` is then an `-`
    (MLP-only) layer, `moe` an `E` layer, `mamba` an `M` layer and `attention` a `*` (attention-only) layer; a GPT
    model's `mamba` and `attention` are zero (its attention is inside `dense` and `moe`)."""

    dense: dict[str, float]
    moe: dict[str, float]
    mtp: dict[str, float]
    output: dict[str, float]
    embedding_s: float
    dense_fwd_s: float
    dense_bwd_s: float
    moe_fwd_s: float
    moe_bwd_s: float
    mtp_fwd_s: float
    mtp_bwd_s: float
    mamba: dict[str, float]
    attention: dict[str, float]
    mamba_fwd_s: float = 0.0
    mamba_bwd_s: float = 0.0
    attention_fwd_s: float = 0.0
    attention_bwd_s: float = 0.0

    def vector(self) -> tuple[float, ...]:
        """Every figure in `LAYER_VECTOR` order (each part's terms by LAYER_KEYS and its forward and backward walls,
        the output layer's terms, the embedding): one row of the array the step-time assembly spreads."""
        parts = ((self.dense, self.dense_fwd_s, self.dense_bwd_s), (self.moe, self.moe_fwd_s, self.moe_bwd_s),
                 (self.mtp, self.mtp_fwd_s, self.mtp_bwd_s), (self.mamba, self.mamba_fwd_s, self.mamba_bwd_s),
                 (self.attention, self.attention_fwd_s, self.attention_bwd_s))  # in LAYER_PARTS order
        out: list[float] = []
        for terms, fwd_s, bwd_s in parts:
            out += [terms[k] for k in LAYER_KEYS]
            out += (fwd_s, bwd_s)
        out += [self.output[k] for k in LAYER_KEYS]
        out.append(self.embedding_s)
        return tuple(out)


# the kinds of layer `LayerTimes` times (a GPT model's Mamba and attention-only parts are zero), and the layout of
# `LayerTimes.vector`: per part its terms by LAYER_KEYS then its "fwd" and "bwd" walls, then the output layer's
# terms, then the embedding
LAYER_PARTS = ("dense", "moe", "mtp", "mamba", "attention")
LAYER_VECTOR: tuple[tuple[str, str], ...] = (
    *((part, key) for part in LAYER_PARTS for key in (*LAYER_KEYS, "fwd", "bwd")),
    *(("output", key) for key in LAYER_KEYS), ("embedding", ""))


def _recompute_pass(job: Job, layout: Layout, blocks: list[dict[str, Pass]]) -> Pass:
    """What the backward recomputes: the whole forward (full), or the `recompute_modules` parts (selective,
    megatron-core `TransformerConfig.recompute_modules`; Korthikanti et al. 2022 Sec. 5 for core_attn)."""
    if layout.recompute == "full":
        rec = Pass()
        for b in blocks:
            rec = rec + b["fwd"]
        n = job.training.recompute_num_layers
        if n is not None:  # block method: the first n layers of each chunk
            per_chunk = job.model.num_layers / (layout.pp * layout.vpp_size)
            rec = rec.scaled(min(1.0, n / per_chunk))
        return rec
    if layout.recompute == "selective":
        rec = Pass()
        for module in job.training.recompute_modules:
            for b in blocks:
                if module in b:
                    rec = rec + Pass(compute=b[module].gpu_s, host=b[module].host)
        return rec
    return Pass()


def _layer(job: Job, layout: Layout, blocks: list[dict[str, Pass]], cal: Calibration,
           paired: bool = False) -> tuple[dict[str, float], float, float]:
    """(breakdown, forward wall, backward wall) of one layer made of `blocks`.

    Each pass is max(GPU, host) + syncs on its own; `paired` (the EP 1F1B overlap) issues one micro-batch's forward
    and another's backward from one host thread onto two streams, layer by layer (megatron-core 0.19
    `models/common/model_chunk_schedule_plan.py::TransformerLayerSchedulePlan.run`), so the pair's wall is
    max(both GPU, both host) + syncs: one pass's host slack pays for the other's launches."""
    fwd = Pass()
    bwd = Pass()
    for b in blocks:
        fwd, bwd = fwd + b["fwd"], bwd + b["bwd"]
    rec = _recompute_pass(job, layout, blocks)
    back = bwd + rec
    if paired:
        host_total = fwd.host + back.host
        excess = max(0.0, host_total - fwd.gpu_s - back.gpu_s)
        share = fwd.host / host_total if host_total > 0 else 0.5
        fwd_s = fwd.gpu_s + share * excess + fwd.syncs * cal.sync_s
        bwd_s = back.gpu_s + (1 - share) * excess + back.syncs * cal.sync_s
    else:
        fwd_s, bwd_s = fwd.wall_s(cal), back.wall_s(cal)
    terms = {
        "compute": fwd.compute + bwd.compute,
        "recompute": rec.gpu_s,
        "tp_comm": fwd.tp_comm + bwd.tp_comm,
        "cp_comm": fwd.cp_comm + bwd.cp_comm,
        "ep_comm": fwd.ep_comm + bwd.ep_comm,
        "host": (fwd_s - fwd.gpu_s) + (bwd_s - back.gpu_s),
    }
    return terms, fwd_s, bwd_s


def layer_times(job: Job, layout: Layout, cal: Calibration = DEFAULT_CALIBRATION) -> LayerTimes:
    """Per-layer terms for the layout's (t, c, e, etp, b, SP, recompute); cached per job and calibration, since
    the layouts of a search that differ only in p, v, DP or the optimizer share them."""
    memo = _memo(job, cal)
    key = _layer_key(job, layout)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _layer_times(job, layout, cal)
    return hit


def layer_vector(job: Job, layout: Layout, cal: Calibration = DEFAULT_CALIBRATION) -> tuple[float, ...]:
    """`layer_times(job, layout, cal).vector()`, memoised with it."""
    memo = _memo(job, cal)
    key = ("vector", *_layer_key(job, layout))
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = layer_times(job, layout, cal).vector()
    return hit


def _shape_key(layout: Layout) -> tuple[Any, ...]:
    """The layout fields a layer's blocks read: `shape_of`'s arguments."""
    return (layout.tp, layout.cp, layout.ep, layout.expert_tp, layout.mbs, layout.sp and layout.tp > 1,
            layout.cuda_graphs, layout.ep_overlap)


def _layer_key(job: Job, layout: Layout) -> tuple[Any, ...]:
    """The layout fields the per-layer terms read: the shape's, the recompute and, with the block method, the chunks
    it counts layers in."""
    chunks = layout.pp * layout.vpp_size if job.training.recompute_num_layers and layout.recompute == "full" else 0
    return (*_shape_key(layout), layout.recompute, chunks)


def ep_unpaired_share(layout: Layout, microbatches: int) -> float:
    """Share of a stage's chunk forwards (and backwards) the EP 1F1B overlap cannot pair: the pipeline's warm-up
    forwards and cool-down backwards run alone. megatron-core 0.19 `pipeline_parallel/schedules.py`
    (`get_pp_rank_microbatches`): with interleaving, rank r warms up with 2 (p - 1 - r) + (v - 1) p chunk steps
    plus one more under the overlap, of m v; the mean rank's (p - 1) + (v - 1) p + 1 stands for the pipeline. Without
    pipelining one forward and one backward run alone (`combined_1f1b_schedule_for_no_pipelining`). PP without VPP
    has no overlap (`rules.ep_overlap_needs_vpp`). 0 without the overlap."""
    return float(unpaired_share(layout.ep_overlap, layout.pp, layout.vpp_size, microbatches))


def unpaired_share(ep_overlap: Any, pp: Any, vpp: Any, microbatches: Any) -> Any:
    """`ep_unpaired_share` of numbers or arrays of layouts (the EP overlap, PP, VPP size, micro-batches)."""
    warm = np.where(pp == 1, 1.0, (pp - 1) + (vpp - 1) * pp + 1)
    return np.where(ep_overlap, np.minimum(1.0, warm / (microbatches * vpp)), 0.0)


def _blocks(job: Job, layout: Layout, cal: Calibration) -> tuple[Any, ...]:
    """(shape, Mamba block, attention block, dense MLP block, MoE block, output layer terms, embedding time) of the
    layout's shape (`shape_of`'s fields: no recompute), memoised: the recompute settings of one shape share them."""
    memo = _memo(job, cal)
    shape = _shape_key(layout)
    key = ("blocks", *shape)
    hit = memo.get(key)
    if hit is not None:
        return hit
    x = shape_of(job, cal, *shape)
    attn = attention_block(x)
    mamba = mamba_block(x) if job.model.mamba is not None else None
    moe = moe_block(x, attn) if job.model.moe is not None else None
    gpu, h = job.cluster.gpu, job.model.hidden_size
    vocab = padded_vocab_size(job.model) / layout.tp
    logits = 3 * gemm_cost(gpu, "bf16", None, cal).time_s(x.rows, vocab, h)  # megatron's output layer is not FP8
    loss = memory_bound_time_s(x.rows * vocab * LOSS_BYTES_PER_LOGIT[job.training.cross_entropy_fusion],
                               gpu=gpu, cal=cal)
    full = layout.cuda_graphs == "full_iteration"
    out_host = 0.0 if full else (1 + cal.host_backward_ratio) * OUTPUT_HOST_OPS * x.host_op_s
    out_gpu = logits + loss
    output = dict.fromkeys(LAYER_KEYS, 0.0)
    output["compute"] = out_gpu
    output["host"] = max(0.0, out_host - out_gpu)
    embedding = memory_bound_time_s(3 * x.tokens * h * BF16, gpu=gpu, cal=cal)  # gather fwd, scatter-add bwd
    hit = memo[key] = (x, mamba, attn, dense_mlp_block(x), moe, output, embedding)
    return hit


def _layer_times(job: Job, layout: Layout, cal: Calibration) -> LayerTimes:
    x, mamba_blk, attn, dense_blk, moe_blk, shared_output, embedding = _blocks(job, layout, cal)
    output = dict(shared_output)
    hybrid = job.model.is_hybrid
    zero = dict.fromkeys(LAYER_KEYS, 0.0)
    mamba, mamba_f, mamba_b = _layer(job, layout, [mamba_blk], cal) if mamba_blk is not None \
        else (zero, 0.0, 0.0)
    attn_only, attn_f, attn_b = _layer(job, layout, [attn], cal) if hybrid else (zero, 0.0, 0.0)
    with_attention = [] if hybrid else [attn]  # a hybrid model's MLP and MoE layers have no attention block
    dense, dense_f, dense_b = _layer(job, layout, [*with_attention, dense_blk], cal)
    moe, moe_f, moe_b = (dense, dense_f, dense_b)
    if moe_blk is not None:
        moe, moe_f, moe_b = _layer(job, layout, [*with_attention, moe_blk], cal, paired=layout.ep_overlap)
    last = (moe, moe_f, moe_b) if job.model.moe is not None else (dense, dense_f, dense_b)
    if hybrid and job.model.mtp_num_layers:  # a hybrid MTP depth is '*E': the attention layer, then the MoE layer
        last = ({k: attn_only[k] + moe[k] for k in moe}, attn_f + moe_f, attn_b + moe_b)
    mtp, mtp_f, mtp_b = _mtp_layer(x, layout, last, output, embedding)
    return LayerTimes(dense=dense, moe=moe, mtp=mtp, output=output, embedding_s=embedding, dense_fwd_s=dense_f,
                      dense_bwd_s=dense_b, moe_fwd_s=moe_f, moe_bwd_s=moe_b, mtp_fwd_s=mtp_f, mtp_bwd_s=mtp_b,
                      mamba=mamba, attention=attn_only, mamba_fwd_s=mamba_f, mamba_bwd_s=mamba_b,
                      attention_fwd_s=attn_f, attention_bwd_s=attn_b)


def _mtp_layer(x: Shape, layout: Layout, last: tuple[dict[str, float], float, float], output: dict[str, float],
               embedding_s: float) -> tuple[dict[str, float], float, float]:
    """One multi-token-prediction layer for one micro-batch (megatron-core 0.16.1
    `transformer/multi_token_prediction.py::MultiTokenPredictionLayer.forward`, `models/gpt/gpt_model.py:608-660`):
    the embedding of the shifted tokens, `enorm` and `hnorm`, `eh_proj` (2h -> h/t, column-parallel over the
    gathered b*s/c rows), one transformer layer of the decoder's last kind (`last`: its terms and pass walls),
    `final_layernorm`, then the output layer and the loss once more."""
    terms, fwd_s, bwd_s = last
    h = x.model.hidden_size
    eh_fwd = x.gemm.time_s(x.rows, h / layout.tp, 2 * h) + fp8_cast_s(x, x.rows * 2 * h)
    norms = memory_bound_time_s(BF16 * 3 * 2 * x.tokens * h, gpu=x.job.cluster.gpu, cal=x.cal)  # read + write
    out = dict(terms)
    out["compute"] += 3 * eh_fwd + 3 * norms + embedding_s + output["compute"]
    out["host"] += output["host"]
    return out, fwd_s + eh_fwd + norms, bwd_s + 2 * eh_fwd + 2 * norms


# the LayerTimes parts a stage's BF16 layers are counted in (`placement.bf16_stage_layers`)
BF16_KINDS = ("dense", "moe", "mamba", "attention", "mtp")


def bf16_job(job: Job, cal: Calibration) -> Job | None:
    """The job at BF16 (`Job.in_bf16`, memoised with the job's layer times) when some of its layers run in BF16
    (`Job.has_bf16_layers`), else None."""
    if not job.has_bf16_layers:
        return None
    memo = _memo(job, cal)
    twin = memo.get("bf16_job")
    if twin is None:
        twin = memo["bf16_job"] = job.in_bf16()
    return twin


def pipeline_bubble_s(stages_s: Any, slowest_s: Any, vpp: Any) -> Any:
    """Fill and drain of a 1F1B pipeline with per-micro-batch stage times t_s: (sum t_s - max t_s) / v, from the
    stages' sum and the slowest (numbers or arrays of layouts).

    The heaviest stage works through all m micro-batches; every other stage's one pass adds fill or drain time.
    Equal stages give (p - 1) / v * t, Narayanan et al. 2021 eq. (1) and Sec. 2.2.2 (interleaved); with an
    uneven split the heaviest stage sets the pace.
    """
    return (stages_s - slowest_s) / vpp


def pipeline_p2p_s(job: Job, layout: Layout, cal: Calibration) -> float:
    """Pipeline traffic of one micro-batch on one stage: 2 * v messages (activation forward, gradient backward) of
    b*s*h/(t if SP)/c bf16 elements on the PP group's link (stride t*c*DP), Narayanan et al. 2021 Sec. 4.1, the
    exposed share of each, and the schedule's host work per chunk step (posting the sends and receives and waiting
    on them, megatron-core `pipeline_parallel/schedules.py`), which many small chunks make visible; full-iteration
    CUDA graphs capture the schedule with its sends and receives (`cuda_graph_impl="full_iteration"`, megatron-core
    `transformer/cuda_graphs.py::FullCudaGraphWrapper` around `forward_backward_func`), so that host work is gone."""
    if layout.pp <= 1:
        return 0.0
    link = job.cluster.link_for_group(layout.pp, layout.tp * layout.cp * layout.dp)
    h = job.model.hidden_size
    nbytes = layout.mbs * job.training.seq_length / layout.cp * (h / layout.tp if layout.sp else h) * BF16
    host = 0.0 if layout.cuda_graphs == "full_iteration" else cal.pp_step_host_s
    return 2 * layout.vpp_size * (p2p_s(nbytes, link, cal) * cal.pp_p2p_exposed + host)


def _dp_groups(layout: Layout, heavy: StageParams) -> tuple[tuple[float, int, int], ...]:
    """(parameters per GPU, group size, stride) of the dense DP x CP group (stride t) and the expert-DP group
    (stride e * etp; megatron-core `parallel_state.py` rank order tp-cp-dp-pp and etp-ep-edp-pp)."""
    return ((float(heavy.dense_params_per_gpu), layout.dp * layout.cp, layout.tp),
            (float(heavy.expert_params_per_gpu), layout.expert_dp, layout.ep * layout.expert_tp))


def dp_comm_s(job: Job, layout: Layout, cal: Calibration, heavy: StageParams) -> tuple[float, float, float]:
    """(gradient reduction, parameter all-gather, parameters in the reduced groups) before overlap.

    Distributed optimizer (ZeRO-1): reduce-scatter the gradients (bf16, or fp32 with `grad_reduce_in_fp32`) and
    all-gather the updated parameters (bf16, or FP8 with `fp8_param_gather`); otherwise all-reduce the gradients
    (two ring passes). Megatron-core `distributed/param_and_grad_buffer.py`. Muon's layer-wise optimizer
    (`autotune.cost.muon`): the gradients all-reduced, then the updated weights all-gathered."""
    t = job.training
    grad_bytes = 4.0 if t.grad_reduce_in_fp32 else 2.0
    param_bytes = 1.0 if (t.fp8 and t.fp8_params(layout.dist_opt)) else 2.0
    grads = gather = params_total = 0.0
    for params, group, stride in _dp_groups(layout, heavy):
        if params <= 0 or group <= 1:
            continue
        params_total += params
        rs = group_collective_s(params * grad_bytes, group, stride, job.cluster, cal)
        grads += rs if t.adam_dist_opt(layout.dist_opt) else 2 * rs
        if layout.dist_opt:
            gather += group_collective_s(params * param_bytes, group, stride, job.cluster, cal)
    return grads, gather, params_total


def exposed_dp_s(comm_s: np.ndarray, window_s: np.ndarray, overlap: bool | np.ndarray, params: np.ndarray,
                 cal: Calibration) -> np.ndarray:
    """DP time left on the critical path (arrays of layouts): all of it without overlap; with it, the last bucket's
    share (it starts after the last backward: `cal.dp_bucket_params` of the `params` reduced) and whatever the
    window cannot cover."""
    last_bucket = comm_s * np.minimum(1.0, cal.dp_bucket_params / np.maximum(params, 1.0))
    hidden = np.maximum(last_bucket, comm_s - window_s)
    return np.where(comm_s <= 0, 0.0, np.where(overlap, hidden, comm_s))


def fsdp_comm_s(job: Job, layout: Layout, cal: Calibration, heavy: StageParams) -> tuple[float, float, float]:
    """Megatron-FSDP (`optim_grads_params`) traffic of one micro-batch before overlap: (all-gather of the weights
    before the forward, again before the backward, reduce-scatter of the gradients after it), over the dense DP x
    CP group and the expert-DP group (`_dp_groups`). Every unit is gathered for each pass of each micro-batch and
    its gradients reduced after each backward (megatron_fsdp `megatron_fsdp.py::_pre_forward_param_unshard`,
    `_pre_backward_param_unshard`, `grad_reduce_every_bprop`); the non-unit modules stay gathered, so only their
    gradients move. Weights travel as stored: FP8 primary weights 1 B (MXFP8 one of its two copies each pass,
    1 + 1/32 B), else bf16; gradients in bf16 (`megatron_fsdp_grad_comm_dtype` None: the main grads' dtype)."""
    t = job.training
    recipe = job.gemm_recipe
    fp8_weights = recipe is not None and recipe != "nvfp4" and t.fp8_params(layout.dist_opt)
    weight_bytes = (1.0 + 1.0 / 32 if recipe == "mxfp8" else 1.0) if fp8_weights else 2.0
    nonunit = float(nonunit_params_per_gpu(job.model, heavy, layout.tp))
    ag = rs = 0.0
    for k, (params, group, stride) in enumerate(_dp_groups(layout, heavy)):
        if params <= 0 or group <= 1:
            continue
        gathered = params - nonunit if k == 0 else params
        ag += group_collective_s(max(gathered, 0.0) * weight_bytes, group, stride, job.cluster, cal)
        rs += group_collective_s(params * 2.0, group, stride, job.cluster, cal)
    return ag, ag, rs


def fsdp_exposed_s(ag_fwd: np.ndarray, ag_bwd: np.ndarray, rs: np.ndarray, units: np.ndarray,
                   fwd_window: np.ndarray, bwd_window: np.ndarray, cal: Calibration) -> np.ndarray:
    """Megatron-FSDP time one micro-batch leaves on the critical path, from its traffic (`fsdp_comm_s`), its units
    (`fsdp_units`) and the passes' walls (arrays of layouts): each unit's all-gather runs under the previous unit's
    compute and its reduce-scatter under the next unit's backward (prefetch on `side_stream_for_param_gather`,
    Megatron-LM docs megatron_fsdp.md), so what shows is the first unit's gather of each pass, the last unit's
    reduce-scatter (drained by `finish_grad_sync`), and whatever of a pass's traffic its compute cannot cover; the
    traffic that is hidden still costs the fitted share `cal.fsdp_offload_exposed` (its kernels take SMs and HBM
    bandwidth from the GEMMs they run beside)."""
    edge = (ag_fwd + ag_bwd + rs) / units  # one unit of each
    hidden = np.minimum(ag_fwd, fwd_window) + np.minimum(ag_bwd + rs, bwd_window)
    return (edge + np.maximum(0.0, ag_fwd - fwd_window) + np.maximum(0.0, ag_bwd + rs - bwd_window)
            + cal.fsdp_offload_exposed * hidden)


def fsdp_units(stage: StageParams) -> int:
    """The FSDP units of a stage (its decoder and MTP layers, at least 1): its traffic is gathered unit by unit."""
    return max(stage.layers + stage.mtp_layers, 1)


# a GPU whose host link the cluster file does not give (a YAML GPU): PCIe Gen5 x16, 64 GB/s each way
ASSUMED_HOST_LINK_BYTES_PER_S = 64e9


def host_link_bytes_per_s(job: Job) -> float:
    """The GPU's host link, one way (`GPUSpec.host_link_bytes_per_s`, else `ASSUMED_HOST_LINK_BYTES_PER_S`)."""
    return job.cluster.gpu.host_link_bytes_per_s or ASSUMED_HOST_LINK_BYTES_PER_S


def offload_exposed_s(copy_s: np.ndarray, share: np.ndarray, fwd_window: np.ndarray, bwd_window: np.ndarray,
                      cal: Calibration) -> np.ndarray:
    """Layer-level activation offload time one micro-batch leaves on the critical path (arrays of layouts): the
    offloaded layers' saved tensors (`copy_s` over the GPU's host link, `host_link_bytes_per_s`) go to the host
    during their forward and come back (one layer ahead) during their backward (Transformer Engine
    `cpu_offload.py`, copies on their own streams), hidden by those layers' compute (`share` of the pass walls)
    where the link is fast enough; the hidden copies cost the fitted share `cal.fsdp_offload_exposed` (copy engines
    and HBM beside the GEMMs)."""
    fwd, bwd = fwd_window * share, bwd_window * share
    hidden = np.minimum(copy_s, fwd) + np.minimum(copy_s, bwd)
    return np.maximum(0.0, copy_s - fwd) + np.maximum(0.0, copy_s - bwd) + cal.fsdp_offload_exposed * hidden


def optimizer_step_s(job: Job, layout: Layout, cal: Calibration, heavy: StageParams) -> float:
    """Adam over this GPU's shard (1/DP of it with the distributed optimizer), memory-bound: per parameter read
    and write the fp32 master (8 B) and both moments (2 x 2 x 4 B, or 2 B each in bf16), read the gradient (2 or
    4 B) and write the model weight (2 B, FP8 primary weights 1 B); without the precision-aware optimizer an fp32
    copy of the gradient is written and read too (8 B). megatron-core `optimizer/distrib_optimizer.py`. Muon's
    weights (`autotune.cost.muon`) keep one fp32 momentum instead of the two moments, and add the Newton-Schulz
    iterations; its layer-wise shares are uneven, so the busiest rank's step."""
    t = job.training
    moments = 2 * 2 * (2.0 if t.moments(layout.dist_opt) == "bf16" else 4.0)
    grad = 4.0 if t.grad_reduce_in_fp32 else 2.0
    weight = 1.0 if (t.fp8 and t.fp8_params(layout.dist_opt)) else 2.0
    copy = 0.0 if (t.precision_aware(layout.dist_opt) or t.grad_reduce_in_fp32) else 8.0
    per_param = 8.0 + moments + grad + weight + copy
    if t.muon:  # a Muon weight reads and writes one fp32 momentum (8 B), not Adam's two moments; the busiest rank
        return muon_step_s(job, layout, heavy, cal, per_param, per_param - moments + 8.0)
    dense, expert = float(heavy.dense_params_per_gpu), float(heavy.expert_params_per_gpu)
    if layout.dist_opt:
        dense /= layout.dp * layout.cp
        expert /= max(layout.expert_dp, 1)
    return memory_bound_time_s((dense + expert) * per_param, gpu=job.cluster.gpu, cal=cal)


_MEMOS: dict[tuple[int, int], tuple[Job, Calibration, dict]] = {}


def _memo(job: Job, cal: Calibration) -> dict:
    """Per-(job, calibration) memo found by identity: hashing a Job walks every nested spec field, which costs more
    than the lookup it serves. Entries hold their job and calibration, so an id is never reused while its entry
    lives."""
    key = (id(job), id(cal))
    entry = _MEMOS.get(key)
    if entry is None or entry[0] is not job or entry[1] is not cal:
        if len(_MEMOS) >= 64:
            _MEMOS.clear()
        entry = _MEMOS[key] = (job, cal, {})
    return entry[2]

"""Throughput terms move the right way: MoE cost per token, overlap switches, NVLink domains, dispatchers, host."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from autotune.cost.comm import dispatch_s
from autotune.cost.efficiency import DEFAULT_CALIBRATION
from autotune.cost.score import estimate_time
from autotune.cost.throughput import layer_times
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster, get_gpu
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.training import TrainingSpec

NO_HOST = replace(DEFAULT_CALIBRATION, per_arch=tuple((a, replace(f, host_op_s=1e-12)) for a, f in
                                                      DEFAULT_CALIBRATION.per_arch),
                  host_kernel_s=0.0, sync_s=0.0, pp_step_host_s=0.0)


def _job(model: str, nodes: int, gpu: str = "h100", seq: int = 4096, gbs: int = 256, **training: object) -> Job:
    return Job(model=get_model(model), cluster=build_cluster(nodes=nodes, gpu=gpu),
               training=TrainingSpec(seq_length=seq, global_batch_size=gbs, **training))  # type: ignore[arg-type]


def _moe_gpu_s_per_token(job: Job, layout: Layout, cal=NO_HOST) -> float:
    lt = layer_times(job, layout, cal)
    return sum(v for k, v in lt.moe.items() if k != "host") / (layout.mbs * job.training.seq_length)


@pytest.mark.parametrize("model", ["mixtral", "qwen3-30b-a3b", "deepseek-v3"])
def test_moe_gpu_time_per_token_falls_only_as_gemm_efficiency_allows(model: str) -> None:
    # GPU time per token of an MoE layer from mbs 1 to 8: it may fall only because GEMMs get taller (more rows per
    # expert); with d_half = 53 rows and >= 256 rows per expert at mbs 1 that is at most ~20%, never the 4x the old
    # per-layer lump gave
    job = _job(model, nodes=8)
    base = Layout(tp=1, ep=8, etp=1, dp=64, mbs=1)
    per_token = [_moe_gpu_s_per_token(job, replace(base, mbs=b)) for b in (1, 2, 4, 8)]
    assert all(later <= earlier * 1.001 for earlier, later in zip(per_token, per_token[1:], strict=False))
    assert per_token[-1] >= 0.8 * per_token[0]


def test_moe_micro_batch_gain_is_bounded_by_the_host() -> None:
    # with host time on, mbs 4 amortises the per-layer launches: a real gain (Bridge's qwen3-30b-a3b on B200:
    # mbs 1 9,691 vs mbs 4 + CUDA graphs 27,136 tokens/s/GPU), but never more than the host share and the larger
    # GEMMs' efficiency allow
    job = _job("qwen3-30b-a3b", nodes=1, gpu="b200", gbs=512, precision="fp8")
    one = estimate_time(job, Layout(tp=1, ep=8, etp=1, dp=8, mbs=1))
    four = estimate_time(job, Layout(tp=1, ep=8, etp=1, dp=8, mbs=4))
    assert one.breakdown["host"] > 0.2 * one.step_time_s  # small MoE layers at mbs 1 run at the host's pace
    gain = four.tokens_per_s_per_gpu / one.tokens_per_s_per_gpu
    saved = one.breakdown["host"] + max(0.0, one.breakdown["compute"] - four.breakdown["compute"])
    assert 1.0 < gain <= one.step_time_s / (one.step_time_s - saved) * 1.05


def test_longer_sequences_are_not_faster_per_gpu_for_moe() -> None:
    # same tokens per step; attention grows with s, nothing else shrinks per token (the old lump did)
    short = estimate_time(_job("mixtral", nodes=4, seq=4096, gbs=256), Layout(tp=2, pp=2, ep=8, dp=16, sp=True))
    long = estimate_time(_job("mixtral", nodes=4, seq=16384, gbs=64), Layout(tp=2, pp=2, ep=8, dp=16, sp=True))
    assert long.tokens_per_s_per_gpu <= short.tokens_per_s_per_gpu


OVERLAPS = ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "ep_overlap")  # the last: the layout's
CASES = [
    ("llama3-70b", 8, Layout(tp=4, pp=4, vpp=5, dp=4, sp=True, dist_opt=True)),
    ("llama3-8b", 4, Layout(tp=2, dp=16, sp=True, dist_opt=True)),
    ("mixtral", 4, Layout(tp=2, pp=2, ep=8, dp=8, sp=True, dist_opt=True)),
    ("qwen3-235b-a22b", 32, Layout(tp=2, pp=8, vpp=4, ep=32, etp=1, dp=16, sp=True, dist_opt=True,
                                   embedding_loss_split=True)),
]


@pytest.mark.parametrize(("model", "nodes", "layout"), CASES)
@pytest.mark.parametrize("switch", OVERLAPS)
def test_switching_an_overlap_off_never_makes_a_layout_faster(model, nodes, layout, switch) -> None:
    all_on: dict[str, Any] = dict.fromkeys(OVERLAPS[:-1], True)  # training switches by name (TrainingSpec checks them)
    on = _job(model, nodes=nodes, **all_on)
    layout_on = replace(layout, ep_overlap=layout.ep > 1)
    if switch == "ep_overlap":
        off, layout_off = on, layout
    else:
        switched_off: dict[str, Any] = {switch: False}
        off, layout_off = replace(on, training=replace(on.training, **switched_off)), layout_on
    assert estimate_time(off, layout_off).step_time_s >= estimate_time(on, layout_on).step_time_s


def test_dp_overlap_hides_communication() -> None:
    on = _job("llama3-8b", nodes=8)
    off = replace(on, training=replace(on.training, overlap_grad_reduce=False, overlap_param_gather=False))
    layout = Layout(tp=1, dp=64, dist_opt=True)
    assert estimate_time(off, layout).breakdown["dp_comm"] > 2 * estimate_time(on, layout).breakdown["dp_comm"]


def test_ep_inside_an_nvl72_domain_is_cheaper_than_across_b200_nodes() -> None:
    # EP 32 on GB200 NVL72 stays on NVLink (72-GPU domain); on B200 HGX it spans 4 nodes over the network
    layout = Layout(tp=1, pp=8, ep=32, etp=1, dp=32, embedding_loss_split=True)
    gb200 = _job("qwen3-235b-a22b", nodes=64, gpu="gb200", gbs=8192, precision="fp8")
    b200 = _job("qwen3-235b-a22b", nodes=32, gpu="b200", gbs=8192, precision="fp8")
    assert gb200.cluster.gpus_per_node == 4 and gb200.cluster.nvlink_domain == 72
    assert estimate_time(gb200, layout).breakdown["ep_comm"] < estimate_time(b200, layout).breakdown["ep_comm"] / 3


def test_dispatchers_across_domains() -> None:
    # 4096 tokens, top-8, h 4096, EP 32 over 4 HGX nodes: DeepEP (flex) sends a token once per remote node, so it
    # moves fewer network bytes than NCCL all-to-all, which sends every remote copy; all-gather moves everything
    cluster = build_cluster(nodes=4, gpu="h100")
    cal = DEFAULT_CALIBRATION
    flex, a2a, ag = (dispatch_s(d, 4096, 8, 4096, 1, 32, 1, cluster, cal) for d in ("flex", "alltoall", "allgather"))
    assert flex < a2a < ag
    inside = dispatch_s("alltoall", 4096, 8, 4096, 1, 8, 1, cluster, cal)
    assert inside < flex


def test_cuda_graphs_cut_host_time() -> None:
    plain = _job("qwen3-30b-a3b", nodes=1, gpu="b200", gbs=512, precision="fp8")
    layout = Layout(tp=1, ep=8, etp=1, dp=8, mbs=1)
    graphed = replace(layout, cuda_graphs="transformer_engine")  # Bridge's attn, moe_router, moe_preprocess
    assert estimate_time(plain, graphed).breakdown["host"] < estimate_time(plain, layout).breakdown["host"]


def test_forced_balance_is_faster_than_aux_loss_routing() -> None:
    aux = _job("mixtral", nodes=4)
    forced = replace(aux, training=replace(aux.training, moe_router_force_load_balancing=True))
    layout = Layout(tp=1, pp=4, ep=8, dp=8)
    assert estimate_time(forced, layout).step_time_s < estimate_time(aux, layout).step_time_s


def test_band_brackets_the_prediction() -> None:
    est = estimate_time(_job("mixtral", nodes=4), Layout(tp=1, pp=4, vpp=8, ep=8, dp=16))
    assert est.tokens_per_s_per_gpu_low < est.tokens_per_s_per_gpu < est.tokens_per_s_per_gpu_high


def test_an_mtp_layer_costs_more_than_a_moe_layer_and_lengthens_the_step() -> None:
    # deepseek-v3's MTP layer sits on the last stage (megatron-core `get_mtp_num_layers_to_build`): one more MoE
    # layer, eh_proj and a second output layer + loss, so it costs at least a MoE layer plus the logits
    job = _job("deepseek-v3", 32, seq=4096, gbs=512)
    no_mtp = replace(job, model=replace(job.model, mtp_num_layers=0))
    layout = Layout(tp=2, pp=8, ep=8, etp=1, dp=16, mbs=1, first_stage_layers=7, last_stage_layers=6)
    lt = layer_times(job, layout)
    assert sum(lt.mtp.values()) > sum(lt.moe.values()) + sum(lt.output.values()) * 0.99
    with_t, without_t = estimate_time(job, layout), estimate_time(no_mtp, layout)
    assert with_t.step_time_s > without_t.step_time_s
    assert with_t.model_flops_per_step > without_t.model_flops_per_step


# --- the Blackwell MoE recipe bundle (issue 19) --------------------------------------------------------------
def test_full_iteration_graphs_remove_the_host_the_syncs_and_the_pipeline_host_work() -> None:
    job = _job("qwen3-30b-a3b", nodes=2, gpu="gb200", gbs=512, precision="fp8")
    layout = Layout(tp=1, pp=2, vpp=4, ep=8, etp=1, dp=4, mbs=1, dist_opt=True)
    full = replace(layout, cuda_graphs="full_iteration")
    per_layer = replace(layout, cuda_graphs="transformer_engine")
    eager, graphs, te = (estimate_time(job, x) for x in (layout, full, per_layer))
    assert graphs.breakdown["host"] == 0.0 < te.breakdown["host"] < eager.breakdown["host"]
    assert graphs.breakdown["pp_p2p"] < eager.breakdown["pp_p2p"]  # the schedule's host work per chunk step is gone
    assert graphs.breakdown["compute"] == pytest.approx(eager.breakdown["compute"])


def test_delayed_wgrad_leaves_the_overlapped_all_to_all_as_it_was() -> None:
    # Bridge skills `perf-expert-parallel-overlap` measured EP overlap + delay_wgrad_compute at 31.20 s against
    # 31.31 s without it (0.4%, bench/data/published_sweeps.csv): the weight gradients move to `mlp_bwd_dw`, between
    # the two dispatches, so no all-to-all gets a larger window
    base = _job("qwen3-30b-a3b", nodes=2, gbs=1024, moe_router_force_load_balancing=True)
    layout = Layout(tp=1, pp=1, ep=16, etp=1, dp=16, mbs=1, dist_opt=True, ep_overlap=True)
    eager = replace(base, training=replace(base.training, delay_wgrad_compute=False))
    delayed_s, eager_s = (estimate_time(j, layout).step_time_s for j in (base, eager))
    assert delayed_s == pytest.approx(eager_s, rel=0.01)


def test_ep_overlap_hides_each_all_to_all_under_its_own_window() -> None:
    # megatron-core 0.19 `TransformerLayerSchedulePlan.run`: the combines hide under the other micro-batch's attention
    # (forward: 1x, backward: 2x), the dispatches under its experts (backward 2x, forward 1x); an all-to-all no window
    # covers stays exposed, and what one covers leaves `ep_overlap_exposed` of it
    from autotune.cost.layer_time import attention_block, shape_of
    from autotune.cost.moe_time import moe_block

    job = _job("deepseek-v3", nodes=32, gpu="b200", gbs=1024, precision="fp8")
    cal = DEFAULT_CALIBRATION
    plain = shape_of(job, cal, 1, 1, 64, 1, 1, False)
    overlapped = replace(plain, ep_overlap=True)
    attn = attention_block(plain)
    exposed = {name: moe_block(x, attn)["fwd"].ep_comm + moe_block(x, attn)["bwd"].ep_comm
               for name, x in (("plain", plain), ("overlap", overlapped))}
    no_attention = sum(moe_block(overlapped)[d].ep_comm for d in ("fwd", "bwd"))
    assert cal.ep_overlap_exposed * exposed["plain"] < exposed["overlap"] < no_attention < exposed["plain"]


def test_an_overlapped_all_to_all_and_its_window_contend_whichever_is_longer() -> None:
    # the pair lasts max(x, w) + s * min(x, w): the comm kernels take SMs from the GEMMs and the GEMMs slow the
    # comm's copies, so even a comm-bound pair does not get its compute for free
    from autotune.cost.layer_time import shape_of
    from autotune.cost.moe_time import _exposed_s

    cal = DEFAULT_CALIBRATION
    x = shape_of(_job("qwen3-30b-a3b", nodes=2), cal, 1, 1, 16, 1, 1, False)
    s = cal.ep_overlap_exposed
    for comm, window in ((1.0, 3.0), (3.0, 1.0), (2.0, 2.0)):
        pair = window + _exposed_s(x, comm, window)
        assert pair == pytest.approx(max(comm, window) + s * min(comm, window))
    assert _exposed_s(x, 0.0, 1.0) == 0.0


def test_the_ep_overlap_gains_what_nvidia_measured_on_h100() -> None:
    # the two published A/Bs of `overlap_moe_expert_parallel_comm` (Qwen3-30B-A3B, 16 H100, EP16; Bridge skills,
    # bench/data/published_sweeps.csv): HybridEP + TE graphs 24.71 -> 20.99 s (x1.177), alltoall without graphs
    # 41.25 -> 31.31 s (x1.317). The predicted on/off speed ratio stays within 8% of each; before the all-to-all and
    # its window contended both ways the model said x1.39 and x1.57.
    from bench.throughput_rows import sweep_rows

    rows = sweep_rows()
    for dispatcher in ("flex", "alltoall"):
        ab = [r for r in rows if r.job.training.moe_token_dispatcher == dispatcher
              and not r.job.training.delay_wgrad_compute]
        off, on = sorted(ab, key=lambda r: r.layout.ep_overlap)
        measured = on.published / off.published
        predicted = estimate_time(on.job, on.layout).tokens_per_s_per_gpu / estimate_time(off.job, off.layout) \
            .tokens_per_s_per_gpu
        assert predicted == pytest.approx(measured, rel=0.08), (dispatcher, predicted, measured)


def test_the_ep_overlap_leaves_the_pipeline_warm_up_unpaired() -> None:
    from autotune.cost.throughput import ep_unpaired_share

    flat = Layout(tp=1, pp=1, ep=16, etp=1, dp=16, mbs=1, ep_overlap=True)
    assert ep_unpaired_share(flat, 64) == pytest.approx(1 / 64)
    assert ep_unpaired_share(replace(flat, ep_overlap=False), 64) == 0.0
    # PP 8 x VPP 4, 128 micro-batches: the mean rank warms up with 7 + 3 * 8 + 1 of 512 chunk steps
    deep = Layout(tp=2, pp=8, vpp=4, ep=32, etp=1, dp=16, mbs=1, ep_overlap=True)
    assert ep_unpaired_share(deep, 128) == pytest.approx(32 / 512)
    assert ep_unpaired_share(deep, 2) == 1.0


def test_token_dropping_caps_the_busiest_expert_and_padding_runs_every_expert_at_capacity() -> None:
    from autotune.cost.moe_time import moe_load_factor

    cal = DEFAULT_CALIBRATION
    learned, forced = TrainingSpec(), TrainingSpec(moe_router_force_load_balancing=True)
    assert moe_load_factor(learned, cal) == cal.moe_imbalance and moe_load_factor(forced, cal) == 1.0
    assert moe_load_factor(replace(learned, moe_expert_capacity_factor=1.0), cal) == 1.0
    assert moe_load_factor(replace(forced, moe_expert_capacity_factor=1.5, moe_pad_expert_input_to_capacity=True),
                           cal) == 1.5
    with pytest.raises(ValueError, match="moe_expert_capacity_factor must be set"):
        TrainingSpec(moe_pad_expert_input_to_capacity=True)


def test_attention_softmax_runs_on_the_sfu_so_blackwell_ultra_speeds_it_up() -> None:
    from autotune.cost.efficiency import attention_time_s

    cal = DEFAULT_CALIBRATION
    gb200, gb300 = get_gpu("gb200"), get_gpu("gb300")
    assert gb200.sfu_exp_per_s is not None and gb300.sfu_exp_per_s is not None
    assert gb200.bf16_flops == gb300.bf16_flops and gb300.sfu_exp_per_s == pytest.approx(2.14 * gb200.sfu_exp_per_s)
    scores = 4096 * 2048 * 64.0  # one micro-batch of 4K tokens, 64 heads, causal
    flops = 2 * 256 * scores  # head dim 128: QK^T and PV
    slow, fast = (attention_time_s(flops, scores, gpu=g, cal=cal, block_tokens=4096) for g in (gb200, gb300))
    assert fast < slow
    fp8 = attention_time_s(flops, scores, gpu=gb200, cal=cal, block_tokens=4096, fp8=True)
    assert fp8 < slow  # FP8 attention halves the matmul part only
    no_exp = replace(cal, sfu_fraction=1e9)
    assert attention_time_s(flops, scores, gpu=gb200, cal=no_exp, block_tokens=4096, fp8=True) < fp8


def test_sliding_window_layers_attend_to_fewer_keys() -> None:
    from autotune.cost.layer_time import attended_keys

    oss = get_model("gpt-oss-120b")  # a 128-token window on every other layer
    full = replace(oss, sliding_window=None, window_attn_skip_freq=None)
    assert attended_keys(full, 4096) == 2048
    assert attended_keys(oss, 4096) == pytest.approx(0.5 * 2048 + 0.5 * (128 - 128 * 128 / 8192))


# --- the software release (issue 19) ----------------------------------------------------------------------
def test_a_release_without_its_own_factor_takes_the_nearest_fitted_one() -> None:
    from autotune.cost.efficiency import REFERENCE_RELEASE, Calibration, ReleaseFactors

    cal = Calibration(per_arch=DEFAULT_CALIBRATION.per_arch,
                      per_release=(("25.09", ReleaseFactors(moe=0.8)), ("26.06", ReleaseFactors(dense=1.2, moe=1.3))))
    assert cal.release_factor(REFERENCE_RELEASE, "moe") == (1.0, REFERENCE_RELEASE)
    assert cal.release_factor("26.06", "dense") == (1.2, "26.06")
    assert cal.release_factor("26.08", "moe") == (1.3, "26.06")  # nearest fitted
    assert cal.release_factor("25.11", "moe") == (0.8, "25.09")  # 25.09 and 26.02 (reference) both 1 away: earlier
    faster = cal.for_release("26.06")
    assert faster.arch(get_gpu("b200")).gemm_bf16 == pytest.approx(1.2 * cal.arch(get_gpu("b200")).gemm_bf16)
    assert faster.for_release("26.06") is faster.for_release("26.06")


def test_the_release_changes_the_prediction_and_unknown_ones_fall_back_with_a_warning() -> None:
    import warnings

    from search_spaces.releases import DEFAULT_RELEASE, resolve_release
    from search_spaces.training import ReleaseFallback, training_spec

    assert resolve_release("26.06") == ("26.06", None)
    assert resolve_release("0.5.1") == ("26.06.01", None)  # a Megatron-Bridge version
    name, warning = resolve_release("26.05")
    assert name == "26.04.01" and warning is not None and "nearest" in warning
    with pytest.raises(ValueError, match="NeMo container tag"):
        resolve_release("latest")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = training_spec(release="26.05")
    assert spec.release == "26.04.01" and spec.megatron_core == "0.19.2"
    assert any(issubclass(w.category, ReleaseFallback) for w in caught)
    assert training_spec(release="26.02").megatron_core == "0.16.1"  # its megatron-core's rules
    job = _job("qwen3-30b-a3b", nodes=1, gpu="gb200", gbs=512, precision="fp8")
    layout = Layout(tp=1, ep=8, etp=1, dp=8, mbs=4, dist_opt=True)
    newest = estimate_time(job, layout).tokens_per_s_per_gpu
    assert job.training.release == DEFAULT_RELEASE
    older = estimate_time(replace(job, training=replace(job.training, release="26.04")), layout).tokens_per_s_per_gpu
    assert older != newest


def test_the_power_limit_comes_from_the_datasheets_and_moves_no_fitted_gpu() -> None:
    """B200 and GB200 are one die rated 2.25 / 2.5 PFLOP/s at 1,000 / 1,200 W: the rate goes as TDP^0.578, so GB300
    (2.5 PFLOP/s rated, 1,400 W) sustains 1.4^0.578 * 2.25 / 2.5 of what its peak alone says, B300 1.1^0.578. At
    NVFP4 the reference B200's 9 PFLOP/s under the GPU's power limit caps Blackwell Ultra below its datasheet 15 / 14
    PFLOP/s; B200 and GB200 stay at 1 at every precision."""
    import math
    from dataclasses import replace

    from autotune.cost.efficiency import power_factor

    k = math.log(2.5 / 2.25) / math.log(1.2)
    for precision in ("bf16", "fp8", "fp4"):
        assert power_factor(get_gpu("b200"), precision) == pytest.approx(1.0)
        assert power_factor(get_gpu("gb200"), precision) == pytest.approx(1.0)
    for precision in ("bf16", "fp8"):
        assert power_factor(get_gpu("gb300"), precision) == pytest.approx(1.4**k * 2.25 / 2.5, rel=1e-9)
        assert power_factor(get_gpu("b300"), precision) == pytest.approx(1.1**k, rel=1e-9)
    assert power_factor(get_gpu("gb300"), "fp4") == pytest.approx(9.0 * 1.4**k / 15.0, rel=1e-9)  # 0.729
    assert power_factor(get_gpu("b300"), "fp4") == pytest.approx(9.0 * 1.1**k / 14.0, rel=1e-9)  # 0.676
    # the sustained NVFP4 rate itself: GB300 1.09x GB200's, not the datasheets' 1.5x
    ratio = 15.0 * power_factor(get_gpu("gb300"), "fp4") / (10.0 * power_factor(get_gpu("gb200"), "fp4"))
    assert ratio == pytest.approx((1400 / 1200) ** k, rel=1e-9)
    assert power_factor(get_gpu("h100")) == 1.0 and power_factor(replace(get_gpu("gb300"), tdp_watts=None)) == 1.0
    # a precision the GPU has no figure for keeps the BF16 curve (a cluster-YAML GPU without fp4_flops)
    assert power_factor(replace(get_gpu("gb300"), fp4_flops=None), "fp4") == pytest.approx(1.4**k * 2.25 / 2.5)


def test_layer_vector_names_each_figure_it_holds() -> None:
    # the step-time assembly reads LayerTimes through `vector()` by the names in LAYER_VECTOR
    from autotune.cost.throughput import LAYER_KEYS, LAYER_VECTOR

    job = Job(model=get_model("tiny-moe"), cluster=build_cluster(nodes=1, gpus_per_node=8),
              training=TrainingSpec(seq_length=1024, global_batch_size=16))
    lt = layer_times(job, Layout(tp=2, ep=4, dp=4, sp=True, ep_overlap=False))
    named = dict(zip(LAYER_VECTOR, lt.vector(), strict=True))
    assert named["moe", "fwd"] == lt.moe_fwd_s and named["dense", "bwd"] == lt.dense_bwd_s
    assert named["mtp", "fwd"] == lt.mtp_fwd_s and named["attention", "bwd"] == lt.attention_bwd_s
    assert named["mamba", "fwd"] == lt.mamba_fwd_s and named["embedding", ""] == lt.embedding_s
    assert all(named["moe", k] == lt.moe[k] and named["output", k] == lt.output[k] for k in LAYER_KEYS)

"""Throughput terms move the right way: MoE cost per token, overlap switches, NVLink domains, dispatchers, host."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from autotune.cost.comm import dispatch_s
from autotune.cost.efficiency import DEFAULT_CALIBRATION
from autotune.cost.throughput import estimate_time, layer_times
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
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
    # mbs 1 9,691 vs mbs 4 + CUDA graphs 27,136 tokens/s/GPU), but never more than the host share allows
    job = _job("qwen3-30b-a3b", nodes=1, gpu="b200", gbs=512, precision="fp8")
    one = estimate_time(job, Layout(tp=1, ep=8, etp=1, dp=8, mbs=1))
    four = estimate_time(job, Layout(tp=1, ep=8, etp=1, dp=8, mbs=4))
    assert one.breakdown["host"] > 0.2 * one.step_time_s  # small MoE layers at mbs 1 run at the host's pace
    gain = four.tokens_per_s_per_gpu / one.tokens_per_s_per_gpu
    assert 1.0 < gain <= one.step_time_s / (one.step_time_s - one.breakdown["host"]) * 1.05


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

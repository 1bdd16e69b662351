"""Megatron-FSDP (ZeRO-3) and layer-level activation offload in the memory and step-time models (issue 20)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from autotune.cost.efficiency import DEFAULT_CALIBRATION
from autotune.cost.layout_table import LayoutTable
from autotune.cost.memory import FSDP_UNITS_GATHERED, microbatch_activation_terms, offload_host_bytes
from autotune.cost.placement import fsdp_unit_params_per_gpu, nonunit_params_per_gpu, stage_params
from autotune.cost.score import estimate_memory, estimate_time, score_layouts
from autotune.cost.throughput import fsdp_comm_s
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import parse_layout
from search_spaces.training import TrainingSpec
from search_spaces.units import GIB


def _job(gpu: str = "gb200", nodes: int = 16, gbs: int = 256, model: str = "llama3-70b") -> Job:
    return Job(model=get_model(model), cluster=build_cluster(nodes=nodes, gpu=gpu),
               training=TrainingSpec(seq_length=8192, global_batch_size=gbs, precision="fp8", fp8_recipe="tensorwise"))


FSDP = "tp=1,pp=1,mbs=2,dist_opt=true,fsdp=true"


def _state(job: Job, text: str) -> float:
    m = estimate_memory(job, parse_layout(text, world_size=job.world_size))
    return m.weights_bytes + m.gradients_bytes + m.optimizer_bytes


def test_fsdp_state_of_llama3_70b_matches_the_hand_worked_example() -> None:
    # docs/design/megatron-fsdp-and-offload.md (b): 64 GB200, TP1, FP8 primary weights: 25.8 GB of sharded state,
    # non-units and the two-unit pools, plus the 4.2 GB of non-unit gradients held whole: 30.0 GB = 27.9 GiB
    state = _state(_job(), FSDP)
    assert state / GIB == pytest.approx(27.9, abs=0.5)
    # the distributed optimizer alone (ZeRO-1) keeps whole weights and gradients: 7x more
    assert _state(_job(), "tp=1,pp=1,mbs=2,dist_opt=true") > 7 * state


def test_fsdp_shards_everything_but_the_units_in_flight_and_the_non_units() -> None:
    job64, job32 = _job(nodes=16), _job(nodes=8)
    # state(N) = S / N + C: two DP sizes give S and C; C must be the pools and the non-units, nothing else
    s64, s32 = _state(job64, FSDP), _state(job32, FSDP)
    sharded = s32 - s64  # S/32 - S/64 = S/64
    fixed = s64 - sharded
    sp = stage_params(job64.model, parse_layout(FSDP, world_size=64))[0]
    unit = fsdp_unit_params_per_gpu(job64.model, sp, 1, 1, 1)
    nonunit = nonunit_params_per_gpu(job64.model, sp, 1)
    # FP8 tensorwise primary weights on Blackwell: 1 B per GEMM weight in the pool; bf16 non-units (weights and
    # grads, 2 + 2 B), bf16 grad pool (2 B)
    expected_fixed = FSDP_UNITS_GATHERED * unit * (1.0 + 2.0) + nonunit * (2.0 + 2.0)
    assert fixed == pytest.approx(expected_fixed, rel=1e-9)
    assert sharded > 0


def test_offload_takes_the_first_layers_saved_tensors_off_the_gpu() -> None:
    job = _job()
    base = parse_layout(FSDP, world_size=64)
    per_layer = sum(microbatch_activation_terms(job, parse_layout("tp=1,pp=1,mbs=2,dist_opt=true",
                                                                  world_size=64)).values())
    per_layer /= job.model.num_layers  # all 80 layers are alike (the embedding and loss terms are tiny here)
    a0 = estimate_memory(job, base).activations_bytes
    a40 = estimate_memory(job, replace(base, offload_layers=40)).activations_bytes
    a20 = estimate_memory(job, replace(base, offload_layers=20)).activations_bytes
    assert a0 - a40 == pytest.approx(2 * (a0 - a20), rel=1e-9)  # linear in the layers offloaded
    assert (a0 - a40) == pytest.approx(offload_host_bytes(job, replace(base, offload_layers=40)), rel=1e-9)
    assert (a0 - a40) / 40 == pytest.approx(per_layer, rel=0.02)
    terms = dict(estimate_memory(job, replace(base, offload_layers=40)).activation_terms)
    assert terms["cpu_offloaded"] == pytest.approx(-(a0 - a40), rel=1e-9)


def test_offload_is_hidden_behind_nvlink_c2c_and_exposed_over_pcie() -> None:
    # the same 40 layers: GB200's NVLink-C2C (450 GB/s each way) moves 2 x 70 GiB per micro-batch under the
    # layers' compute, so only the fitted contention share of the copies shows; B200's PCIe Gen5 (64 GB/s) cannot
    layout = parse_layout(FSDP + ",offload_layers=40", world_size=64)
    gb200 = _job("gb200")
    copies = 2 * offload_host_bytes(gb200, layout) / (gb200.cluster.gpu.host_link_bytes_per_s or 1.0)
    share = DEFAULT_CALIBRATION.fsdp_offload_exposed
    assert 0 < share < 1
    assert estimate_time(gb200, layout).breakdown["offload"] == pytest.approx(2 * share * copies, rel=1e-9)
    b200 = _job("b200", nodes=8)
    exposed = estimate_time(b200, layout).breakdown["offload"]
    link = b200.cluster.gpu.host_link_bytes_per_s
    assert link is not None
    host_s = offload_host_bytes(b200, layout) / link
    assert 0.5 * host_s < exposed / 2 < 2 * host_s  # 2 micro-batches: most of each copy shows


def test_fsdp_traffic_is_paid_every_micro_batch() -> None:
    # ZeRO-3 gathers the weights for each pass of each micro-batch: doubling the micro-batches doubles its traffic,
    # where ZeRO-1's gradient reduce-scatter and parameter all-gather happen once per step
    small, large = _job(gbs=128), _job(gbs=512)
    layout = parse_layout(FSDP, world_size=64)
    sp = stage_params(small.model, layout)[0]
    ag_fwd, ag_bwd, rs = fsdp_comm_s(small, layout, DEFAULT_CALIBRATION, sp)
    assert ag_fwd == ag_bwd and rs > ag_fwd  # bf16 gradients, FP8 weights
    t_small, t_large = estimate_time(small, layout), estimate_time(large, layout)
    assert t_large.breakdown["dp_comm"] == pytest.approx(4 * t_small.breakdown["dp_comm"], rel=1e-9)


def test_the_vectorised_scorer_scores_fsdp_and_offload_as_the_scalar_models() -> None:
    job = _job()
    layouts = [parse_layout(FSDP + extra, world_size=64) for extra in ("", ",offload_layers=40", ",offload_layers=5")]
    layouts.append(parse_layout("tp=4,pp=1,sp=true,mbs=2,dist_opt=true,offload_layers=20", world_size=64))
    scores = score_layouts(job, LayoutTable.from_layouts(layouts))
    for i, layout in enumerate(layouts):
        t, m = estimate_time(job, layout), estimate_memory(job, layout)
        assert scores.step_time_s[i] == pytest.approx(t.step_time_s, rel=1e-9)
        assert scores.breakdown["offload"][i] == pytest.approx(t.breakdown["offload"], rel=1e-9, abs=1e-12)
        assert scores.breakdown["dp_comm"][i] == pytest.approx(t.breakdown["dp_comm"], rel=1e-9)
        assert scores.total_bytes[i] == pytest.approx(m.total_bytes, rel=1e-9)


def test_a_layout_whose_offload_overflows_the_host_memory_is_refused_with_one_line(capsys) -> None:
    # issue 45: host memory per GPU is a cluster fact a layout must fit. llama3-70b at seq 8192 offloading 70 of
    # its 80 layers at MBS 4 leaves 135 GiB on the GB200 (of 186) but parks 587 GiB per GPU in its 224 GiB of host
    import json

    from autotune.cost.analytic import AnalyticBackend
    from autotune.ui.cli import main

    job = Job(model=get_model("llama3-70b"), cluster=build_cluster(nodes=16, gpu="gb200", gpus_per_node=4),
              training=TrainingSpec(seq_length=8192, global_batch_size=1024))
    texts = [f"tp=1,pp=1,dp=64,mbs={b},fsdp=true,dist_opt=true,offload_layers={k}" for b, k in ((4, 70), (1, 60))]
    layouts = [parse_layout(t, world_size=64) for t in texts]
    host = [offload_host_bytes(job, lay) for lay in layouts]
    have = job.cluster.gpu.host_memory_bytes
    assert have is not None and host[0] > have > host[1]
    measured = [AnalyticBackend().evaluate(job, lay) for lay in layouts]
    device = measured[0].memory_bytes
    assert measured[0].status == "oom" and device is not None and device < job.cluster.gpu.memory_bytes
    assert "offloaded activations take 586.8 GiB of host memory per GPU, more than the 223.5 GiB" in measured[0].reason
    assert measured[1].status == "ok"
    scores = score_layouts(job, LayoutTable.from_layouts(layouts))  # the search's table agrees
    assert list(scores.fits) == [False, True] and scores.host_bytes == pytest.approx(host)
    assert scores.measurement(0).reason == measured[0].reason
    # the verdict on a user's layout tells a host overflow by its bytes, not by the reason's wording
    from types import SimpleNamespace

    from autotune.tuning.verdicts import _host_overflows
    answer: Any = SimpleNamespace(job=job)
    assert _host_overflows(answer, measured[0]) and not _host_overflows(answer, measured[1])
    assert not _host_overflows(answer, replace(measured[0], extra={}))
    # where the catalog does not give the host memory (HGX H100), nothing is refused on it
    h100 = replace(job, cluster=build_cluster(nodes=8, gpu="h100"))
    assert h100.cluster.gpu.host_memory_bytes is None
    lay = parse_layout("tp=8,pp=1,dp=8,mbs=4,dist_opt=true,offload_layers=70", world_size=64)
    assert "host memory" not in AnalyticBackend().evaluate(h100, lay).reason
    args = ["estimate", "--model", "llama3-70b", "--nodes", "16", "--gpu", "gb200", "--gpus-per-node", "4",
            "--seq-length", "8192", "--global-batch-size", "1024", "--layout", texts[0]]
    main([*args, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "oom" and "more than the 223.5 GiB each GPU has; offload fewer layers" in out["reason"]
    # `check` applies the same rule: the device fits, the host does not, and it names the nearest that fits
    assert main(["check", *args[1:], "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["fits_in_memory"] is False and "host memory" in out["reason"] and out["nearest"] is not None
    assert out["host_gib"] == pytest.approx(host[0] / GIB)

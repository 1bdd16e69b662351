"""What the megatron backend measured, as a calibration file (`autotune/tuning/measured_calibration.py`).

- `stage_probe`: a candidate of a large cluster as a job one node runs, with each rank's exact shape (checked against
  the per-stage parameter model `autotune.cost.placement.stage_params`, itself held exact against megatron-core's
  built models in tests/test_placement*.py);
- the fit on probes and collectives recovers factors the measurements were made with (the cost model as ground truth
  under known factors: the probes' and collectives' predictions must carry the information that pins each factor);
- a measured search's GPU trials become runs of the layout and batch that ran, and the search writes
  `calibration.yaml`; a CPU proxy search writes none, and a file profiled on the proxy is refused by every verb.
The profile path end to end on the CPU proxy (real megatron-core jobs and gloo collectives on Ray Train workers) is
`test_profile_runs_end_to_end_on_the_cpu_proxy`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from autotune.cost.calibration_file import PROXY_SOURCE, apply_factors, read_calibration
from autotune.cost.efficiency import DEFAULT_CALIBRATION
from autotune.cost.placement import stage_params
from autotune.cost.score import estimate_time
from autotune.tuning.calibrate import Run, fit_factors
from autotune.tuning.driver import write_measured_calibration
from autotune.tuning.measured_calibration import collective_timings, search_runs, stage_probe
from autotune.tuning.results import CALIBRATION_YAML, TrialRecord
from autotune.ui.cli import main
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import parse_layout
from search_spaces.measurement import Measurement, Source
from search_spaces.training import TrainingSpec


def _job(model: str, nodes: int, gpu: str = "h100") -> Job:
    return Job(model=get_model(model), cluster=build_cluster(nodes=nodes, gpu=gpu), training=TrainingSpec())


@pytest.mark.parametrize("model, nodes, text", [
    ("deepseek-v3", 128, "tp=2,pp=16,ep=64,etp=1,mbs=1,sp=true,dist_opt=true"),
    ("mixtral-8x7b", 16, "tp=2,pp=4,ep=8,mbs=1,sp=true,dist_opt=true"),
    ("llama3-70b", 64, "tp=4,pp=4,vpp=5,cp=2,mbs=1,sp=true,dist_opt=true"),
])
def test_a_probe_holds_each_rank_exactly_as_the_candidate(model: str, nodes: int, text: str) -> None:
    job = _job(model, nodes)
    layout = parse_layout(text, world_size=job.world_size)
    probe = stage_probe(job, layout, gpus_per_node=8)
    assert probe.layout.pp == 1 and probe.layout.world_size <= 8
    assert (probe.layout.tp, probe.layout.cp, probe.layout.expert_tp, probe.layout.mbs) == (
        layout.tp, layout.cp, layout.expert_tp, layout.mbs)
    # the stage with the most decoder layers, MoE ones first (the probe's: module docstring of measured_calibration)
    heaviest = max(stage_params(job.model, layout), key=lambda s: (s.layers, s.moe_layers, -s.mtp_layers))
    (mine,) = stage_params(probe.job.model, probe.layout)
    # every transformer-layer GEMM weight a rank of the heaviest stage holds, the probe's rank holds: same layers,
    # same TP split, the same experts per rank
    assert mine.layers == heaviest.layers
    assert mine.gemm_params_per_gpu == heaviest.gemm_params_per_gpu
    assert mine.expert_params_per_gpu == heaviest.expert_params_per_gpu
    if job.model.moe is not None:
        assert probe.job.model.moe is not None
        assert probe.job.model.moe.num_experts // probe.layout.ep == job.model.moe.num_experts // layout.ep
        assert ("EP" in probe.note) == (probe.layout.ep != layout.ep)


def test_a_probe_that_cannot_fit_one_node_says_why() -> None:
    job = _job("llama3-405b", 128)
    layout = parse_layout("tp=8,pp=16,cp=2,mbs=1,sp=true,dist_opt=true", world_size=job.world_size)
    with pytest.raises(ValueError, match="TP x CP = 16 ranks do not fit one node of 8 GPUs"):
        stage_probe(job, layout, gpus_per_node=8)
    hybrid = _job("nemotron-h-8b", 2)
    with pytest.raises(ValueError, match="hybrid Mamba model, which the megatron backend cannot profile"):
        stage_probe(hybrid, parse_layout("tp=1,pp=1", world_size=hybrid.world_size), gpus_per_node=8)


def test_the_fit_on_probes_and_collectives_recovers_the_factors_they_were_measured_with() -> None:
    """Measured = the cost model under known factors (compute x0.85, network x0.75, host x1.3): the fit on three
    probes and the collectives of two 8-GPU nodes must find them again (the prior pulls each a little to 1)."""
    job = _job("mixtral-8x7b", 32)
    truth = {"compute": 0.85, "network": 0.75, "host": 1.3}
    true_cal = apply_factors(DEFAULT_CALIBRATION, "hopper", truth)
    runs = []
    for text in ("tp=2,pp=4,ep=8,mbs=1,sp=true,dist_opt=true", "tp=1,pp=8,ep=8,mbs=2,dist_opt=true",
                 "tp=4,pp=2,ep=4,mbs=1,sp=true,dist_opt=true"):
        probe = stage_probe(job, parse_layout(text, world_size=job.world_size), gpus_per_node=8)
        step = estimate_time(probe.job, probe.layout, true_cal).step_time_s
        runs.append(Run(job=probe.job, layout=probe.layout, step_time_s=step, label=text))
    at_hand = replace(job.cluster, nodes=2)
    measured = [{"collective": c, "bytes": b, "world": 16, "seconds": 1.0}
                for c in ("all_reduce", "all_gather", "all_to_all", "send_recv") for b in (64 * 2**20, 256 * 2**20)]
    timings = [replace(t, seconds=t.predict(true_cal)) for t in collective_timings(measured, at_hand)]
    assert len(timings) == 8
    fit = fit_factors(runs, timings=timings)
    got = dict(fit.factors)
    assert got["network"] == pytest.approx(truth["network"], rel=0.03)
    assert got["compute"] == pytest.approx(truth["compute"], rel=0.06)
    assert got["host"] == pytest.approx(truth["host"], rel=0.25)  # host time is a small share of a step
    assert max(abs(a / r.step_time_s - 1) for a, r in zip(fit.after, runs, strict=True)) < 0.02
    assert max(abs(a / t.seconds - 1) for a, t in zip(fit.timings_after, timings, strict=True)) < 0.02


def _gpu_trial(job: Job, number: int, text: str, step_s: float, *, source: Source = "megatron-gpu") -> TrialRecord:
    ran = parse_layout(text, world_size=8)
    training = TrainingSpec(seq_length=4096, global_batch_size=4 * ran.dp * ran.mbs, precision="bf16",
                            tp_comm_overlap=False)
    extra = {"run_layout": str(ran), "worker_nodes": ["node-a"] * 8,
             "ran_training": json.loads(json.dumps(asdict(training)))}  # as it comes back from a Tune trial
    m = Measurement(layout=ran, status="ok", source=source, step_time_s=step_s, tokens_per_s_per_gpu=1.0,
                    memory_bytes=1.0, extra=extra)
    return TrialRecord(number=number, origin="search", measurement=m, feasible=True, capacity_bytes=80e9)


def test_a_measured_search_on_gpus_writes_a_calibration_the_next_search_reads(tmp_path: Path) -> None:
    job = _job("llama3-8b", 4)
    true_cal = apply_factors(DEFAULT_CALIBRATION, "hopper", {"compute": 0.9, "network": 1.0, "host": 1.0})
    records = []
    for i, text in enumerate(("tp=1,pp=1,dp=8,mbs=1,dist_opt=true", "tp=2,pp=1,dp=4,mbs=2,sp=true,dist_opt=true")):
        r = _gpu_trial(job, i, text, 1.0)
        run, _ = search_runs(job, [r])
        step = estimate_time(run[0].job, run[0].layout, true_cal).step_time_s
        records.append(replace(r, measurement=replace(r.measurement, step_time_s=step)))
    runs, reason = search_runs(job, records)
    assert reason == "" and len(runs) == 2
    assert runs[0].job.world_size == 8 and runs[0].job.cluster.nodes == 1  # the GPUs that ran it, not the target
    assert runs[0].job.training.tp_comm_overlap is False  # the batch and switches that ran
    written = write_measured_calibration(job, records, tmp_path)
    assert written["file"] == str(tmp_path / CALIBRATION_YAML), written
    cal = read_calibration(written["file"])
    assert cal.source == "megatron-gpu" and cal.precisions == ("bf16",)
    assert cal.factor("compute") == pytest.approx(0.9, rel=0.03)
    assert "learned" not in written["describe"] and cal.name == CALIBRATION_YAML
    cal.calibration(job.cluster.gpu)  # a GPU-measured file applies


def test_a_cpu_proxy_search_writes_no_calibration(tmp_path: Path) -> None:
    job = _job("llama3-8b", 4)
    records = [_gpu_trial(job, 0, "tp=1,pp=1,dp=8,mbs=1", 1.0, source="megatron-cpu-proxy")]
    written = write_measured_calibration(job, records, tmp_path)
    assert written["file"] is None and "CPU proxy" in written["reason"]
    assert not (tmp_path / CALIBRATION_YAML).exists()


def test_a_file_profiled_on_the_cpu_proxy_is_refused_by_every_verb(tmp_path: Path, capsys) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text("autotune_calibration: 1\ngpu_arch: hopper\nfactors: {compute: 0.5, network: 0.5, host: 2.0}\n"
                    f"source: {PROXY_SOURCE}\n", encoding="utf-8")
    assert read_calibration(path).source == PROXY_SOURCE
    code = main(["estimate", "--model", "llama3-8b", "--nodes", "1", "--layout", "tp=1,pp=1",
                 "--calibration", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "profiled on the CPU proxy" in err and "Traceback" not in err


def test_profile_needs_a_log_or_profile(capsys) -> None:
    code = main(["calibrate", "--model", "llama3-8b", "--nodes", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "--log FILE" in err and "--profile" in err and "Traceback" not in err


@pytest.mark.slow
def test_profile_runs_end_to_end_on_the_cpu_proxy(tmp_path: Path, capsys) -> None:
    """`calibrate --profile` with real megatron-core probes and gloo collectives on Ray Train workers: each
    candidate's probe ran, each collective was timed, the factors were fitted and the file is marked as the proxy's."""
    out = tmp_path / "profiled.yaml"
    code = main(["calibrate", "--profile", "--model", "mixtral-8x7b", "--nodes", "4", "--layout",
                 "tp=2,pp=4,ep=8,etp=1,mbs=1,sp=true,dist_opt=true", "--max-workers", "4", "--output", str(out),
                 "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    import ray

    assert not ray.is_initialized()  # the Ray it started is shut down (later tests start their own clusters)
    report = json.loads(captured.out)
    assert report["source"] == PROXY_SOURCE and report["written"] is True
    (probe,) = report["probes"]
    assert probe["status"] == "ok" and probe["step_time_s"] > 0, probe
    assert probe["probe"].startswith("tp=2,pp=1") and "ep=4" in probe["probe"]  # EP 8 -> 4: one node of 4 ranks
    assert {c["label"].split()[0] for c in report["collectives"]} == {"all_reduce", "all_gather", "all_to_all",
                                                                       "send_recv"}
    assert all(c["seconds"] > 0 and math.isfinite(c["predicted_after_s"]) for c in report["collectives"])
    cal = read_calibration(out)
    assert cal.source == PROXY_SOURCE
    with pytest.raises(ValueError, match="profiled on the CPU proxy"):
        cal.calibration(build_cluster(nodes=4).gpu)
    # the same from a notebook: autotune.profile, the analytic ranking's best layout this time
    import autotune

    result = autotune.profile("mixtral-8x7b", nodes=4, top=1, max_workers=4)
    summary = result.summary()
    assert result.fit is not None and summary["source"] == PROXY_SOURCE
    assert summary["probes"][0]["status"] == "ok" and len(summary["collectives"]) == 8
    assert not ray.is_initialized()

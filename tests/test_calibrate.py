"""`python -m autotune calibrate`: logs read, factors fitted and bounded, the file every verb takes.

The logs here are reconstructed from published step times (`tests/megatron_logs.py`): a published row's tokens/s
per GPU turned back into a step time, printed in the exact format of Megatron-LM's `training_log`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from megatron_logs import bridge_summary, job_arguments, logged_tflops, megatron_lm_log, published_step_s

from autotune.cost.calibration_file import FACTOR_BOUNDS, read_calibration
from autotune.cost.efficiency import DEFAULT_CALIBRATION
from autotune.cost.score import estimate_time
from autotune.tuning.calibrate import Run, fit_factors
from autotune.tuning.training_log import parse_log, read_log, steady_step_s
from autotune.ui.cli import main
from bench.throughput_rows import load_rows


def _row():
    """A published Bridge row of Llama 3 70B on 64 H100 (FP8): Bridge's performance table of release 26.02."""
    rows = [r for r in load_rows() if r.model == "llama3-70b" and r.gpu == "h100" and r.source[:1].isdigit()
            and r.job.world_size == 64]
    assert rows, "the published Llama 3 70B H100 rows are gone from bench/throughput_rows.py"
    return rows[0]


def _steps(step_s: float, n: int = 12) -> list[float]:
    """A first line with the warm-up (x3), then steady lines with +-0.5% jitter and one checkpoint outlier."""
    ms = step_s * 1000
    steady = [ms * (1 + 0.005 * ((k % 3) - 1)) for k in range(n)]
    steady[7] = ms * 1.9  # a checkpoint save
    return [ms * 3.0, ms * 1.4, *steady]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_steady_step_drops_warmup_and_outliers() -> None:
    log = parse_log(megatron_lm_log(_steps(2.0), global_batch_size=256))
    step, lines = steady_step_s(log)
    # lines 1-3 are warm-up; of the 11 left, the 1.9x line is an outlier: the median of 10 lines at 2.0 s +-0.5%
    assert lines == 10 and step == pytest.approx(2.0, rel=0.006)


def test_reads_arguments_memory_and_throughput() -> None:
    r = _row()
    text = megatron_lm_log(_steps(3.0), global_batch_size=r.job.training.global_batch_size,
                           arguments=job_arguments(r.job, r.layout), max_allocated_mb=51234.5, tflops=412.3)
    log = parse_log(text)
    assert log.argument("tensor_model_parallel_size") == str(r.layout.tp)
    assert log.argument("world_size") == "64"
    assert log.max_allocated_mb == pytest.approx(51234.5)
    assert log.tflops_per_gpu and log.tflops_per_gpu[0] == pytest.approx(412.3)


def test_published_run_reproduced_within_3_percent(tmp_path: Path) -> None:
    """A log reconstructed from a published step time, calibrated on its own layout: the calibrated prediction is
    the published tokens/s per GPU within 3%."""
    r = _row()
    path = tmp_path / "run.log"
    path.write_text(megatron_lm_log(_steps(published_step_s(r)), global_batch_size=r.job.training.global_batch_size,
                                    arguments=job_arguments(r.job, r.layout),
                                    tflops=logged_tflops(r.job, published_step_s(r))))
    step, _ = steady_step_s(read_log(path))
    fit = fit_factors([Run(job=r.job, layout=r.layout, step_time_s=step)])
    tokens = estimate_time(r.job, r.layout, fit.calibration).tokens_per_s_per_gpu
    assert tokens == pytest.approx(r.published, rel=0.03)
    assert not fit.at_bound


def test_cli_calibrate_then_estimate_reproduces_the_published_run(capsys, tmp_path: Path) -> None:
    """The same through the CLI: calibrate on the reconstructed log (its arguments block gives the job's sizes),
    then `estimate --calibration` of that layout says the published tokens/s per GPU within 3%."""
    r = _row()
    log = tmp_path / "run.log"
    log.write_text(megatron_lm_log(_steps(published_step_s(r)), global_batch_size=r.job.training.global_batch_size,
                                   arguments=job_arguments(r.job, r.layout), max_allocated_mb=50000.0,
                                   tflops=logged_tflops(r.job, published_step_s(r))))
    out_file = tmp_path / "my-cluster.yaml"
    common = ["--model", r.model, "--gpu", r.gpu, "--release", r.release]
    code, out, err = _run(capsys, "calibrate", "--log", str(log), *common, "--output", str(out_file))
    assert code == 0, err
    assert "before" in out and "calibrated" in out and "factors: compute x" in out
    cal = read_calibration(out_file)
    assert cal.gpu_arch == "hopper" and len(cal.provenance["logs"]) == 1
    assert abs(cal.provenance["logs"][0]["error_after"]) < 0.03
    code, out, err = _run(capsys, "estimate", *common, "--nodes", "8", "--layout", str(r.layout), "--seq-length",
                          str(r.job.training.seq_length), "--global-batch-size", str(r.job.training.global_batch_size),
                          "--precision", r.job.training.precision, "--calibration", str(out_file), "--json")
    obj = json.loads(out)
    assert obj["tokens_per_s_per_gpu"] == pytest.approx(r.published, rel=0.03)
    assert obj["calibration"]["factors"] == dict(cal.factors)
    code, out, _ = _run(capsys, "estimate", *common, "--nodes", "8", "--layout", str(r.layout), "--seq-length",
                        str(r.job.training.seq_length), "--precision", "fp8", "--calibration", str(out_file))
    assert f"calibration: {out_file.name} (compute x" in out and "fitted on 1 log" in out


def test_a_megatron_bridge_log_gives_its_layout_in_its_configuration_summary(capsys, tmp_path: Path) -> None:
    """Bridge prints no arguments block but its config's non-default values (`bridge_summary`): calibrate reads the
    layout, batch and sequence from them (no --layout), reproduces the run, and refuses the log for another model."""
    r = _row()
    log = tmp_path / "bridge.log"
    log.write_text(bridge_summary(r.job, r.layout) + megatron_lm_log(
        _steps(published_step_s(r)), global_batch_size=r.job.training.global_batch_size,
        tflops=logged_tflops(r.job, published_step_s(r)), world_size=r.job.world_size))
    assert "arguments" not in log.read_text()
    common = ["--gpu", r.gpu, "--release", r.release, "--nodes", str(r.job.cluster.nodes),
              "--precision", r.job.training.precision]
    code, out, err = _run(capsys, "calibrate", "--log", str(log), "--model", r.model, *common, "--json")
    assert code == 0, err
    (logged,) = json.loads(out)["provenance"]["logs"]
    assert logged["layout"] == str(r.layout)
    assert (logged["seq_length"], logged["global_batch_size"]) == (r.job.training.seq_length,
                                                                   r.job.training.global_batch_size)
    assert abs(logged["error_after"]) < 0.03
    code, _, err = _run(capsys, "calibrate", "--log", str(log), "--model", "llama3-8b", *common)
    assert code == 2 and "another model" in err and "Traceback" not in err


def test_a_bound_holds_and_says_so(capsys, tmp_path: Path) -> None:
    """A log 5x slower than the model predicts: no factor within its bounds explains it, so each stops at a bound."""
    r = _row()
    predicted = estimate_time(r.job, r.layout, DEFAULT_CALIBRATION).step_time_s
    log = tmp_path / "slow.log"
    log.write_text(megatron_lm_log(_steps(5 * predicted), global_batch_size=r.job.training.global_batch_size,
                                   arguments=job_arguments(r.job, r.layout),
                                   tflops=logged_tflops(r.job, 5 * predicted)))
    out_file = tmp_path / "slow.yaml"
    code, out, _ = _run(capsys, "calibrate", "--log", str(log), "--model", r.model, "--release", r.release,
                        "--output", str(out_file))
    assert code == 0
    assert "held by its bound" in out and "keeps the bound" in out
    cal = read_calibration(out_file)
    assert "compute" in cal.at_bound and cal.factor("compute") == pytest.approx(FACTOR_BOUNDS[0])


def test_fewer_logs_than_factors_moves_the_least() -> None:
    """One log, three factors: the MAP fit moves the factors the log is most sensitive to, and leaves a factor the
    step time does not depend on at 1."""
    r = _row()
    fit = fit_factors([Run(job=r.job, layout=r.layout, step_time_s=published_step_s(r) * 1.1)])
    factors = dict(fit.factors)
    assert factors["compute"] < 1.0  # slower than predicted: compute reaches less of peak
    assert all(FACTOR_BOUNDS[0] <= v <= FACTOR_BOUNDS[1] for v in factors.values())
    assert sum(math.log(v) ** 2 for v in factors.values()) < 0.2**2


def _calibration_file(tmp_path: Path, **changes) -> Path:
    data = {"autotune_calibration": 1, "gpu_arch": "hopper", "factors": {"compute": 0.9, "network": 1.1, "host": 1.0},
            "at_bound": [], "provenance": {"logs": []}}
    data.update(changes)
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_estimate_applies_the_factors(capsys, tmp_path: Path) -> None:
    base = ["estimate", "--model", "llama3-8b", "--layout", "tp=1,pp=1,dist_opt=true", "--json"]
    _, out, _ = _run(capsys, *base)
    plain = json.loads(out)["tokens_per_s_per_gpu"]
    code, out, _ = _run(capsys, *base, "--calibration", str(_calibration_file(tmp_path)))
    calibrated = json.loads(out)["tokens_per_s_per_gpu"]
    assert code == 0 and calibrated < plain  # compute x0.9: slower


@pytest.mark.parametrize(("changes", "message"), [
    ({"factors": {"compute": 3.0}}, "factors.compute"),
    ({"factors": {"compute": "fast"}}, "factors.compute"),
    ({"factors": {"gpu": 1.0}}, "`factors` must map"),
    ({"gpu_arch": "volta"}, "`gpu_arch` must be one of"),
    ({"autotune_calibration": 7}, "not an autotune calibration file"),
])
def test_bad_calibration_file_is_one_line_exit_2(capsys, tmp_path: Path, changes, message) -> None:
    path = _calibration_file(tmp_path, **changes)
    code, _, err = _run(capsys, "estimate", "--model", "llama3-8b", "--layout", "tp=1", "--calibration", str(path))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_calibration_of_another_generation_is_refused(capsys, tmp_path: Path) -> None:
    path = _calibration_file(tmp_path)
    code, _, err = _run(capsys, "estimate", "--model", "llama3-8b", "--gpu", "b200", "--layout", "tp=1",
                        "--calibration", str(path))
    assert code == 2 and "fitted on hopper GPUs" in err


def test_search_and_api_name_the_calibration(capsys, tmp_path: Path) -> None:
    import autotune

    path = _calibration_file(tmp_path)
    code, out, _ = _run(capsys, "--model", "llama3-8b", "--nodes", "1", "--top", "3", "--no-progress", "--output",
                        str(tmp_path / "run"), "--calibration", str(path))
    assert code == 0 and "calibration: cal.yaml (compute x0.90, network x1.10, host x1.00; fitted on 0 logs" in out
    meta = json.loads((tmp_path / "run" / "search.json").read_text())
    assert meta["calibration"]["factors"]["compute"] == 0.9
    m = autotune.estimate("llama3-8b", "tp=1,pp=1,dist_opt=true", calibration=path)
    plain = autotune.estimate("llama3-8b", "tp=1,pp=1,dist_opt=true")
    assert m.extra["calibration"]["file"] == str(path)
    assert m.tokens_per_s_per_gpu < plain.tokens_per_s_per_gpu


def test_compute_scales_only_the_gemms_of_the_logs_precision() -> None:
    # an FP8 log says nothing of the BF16 GEMMs: its `compute` factor leaves them, and the file keeps the scope
    from autotune.cost.calibration_file import CalibrationFile, apply_factors

    base = dict(DEFAULT_CALIBRATION.per_arch)["hopper"]
    fp8 = dict(apply_factors(DEFAULT_CALIBRATION, "hopper", {"compute": 1.2}, ("fp8",)).per_arch)["hopper"]
    assert fp8.gemm_bf16 == base.gemm_bf16 and fp8.attention == pytest.approx(1.2 * base.attention)
    assert all(v == pytest.approx(1.2 * dict(base.gemm_fp8)[r]) for r, v in fp8.gemm_fp8)
    every = dict(apply_factors(DEFAULT_CALIBRATION, "hopper", {"compute": 1.2}).per_arch)["hopper"]
    assert every.gemm_bf16 == pytest.approx(1.2 * base.gemm_bf16)
    scoped = CalibrationFile(gpu_arch="hopper", factors=(("compute", 1.2),), precisions=("fp8",))
    assert "hopper fp8" in scoped.describe()


@pytest.mark.parametrize(("arguments", "graphs"), [
    ({"cuda_graph_impl": "full_iteration"}, "full_iteration"),  # megatron-core 0.19
    ({"cuda_graph_impl": "local", "cuda_graph_scope": "['full_iteration']"}, "full_iteration"),  # 0.16's spelling
    ({"cuda_graph_impl": "transformer_engine"}, "transformer_engine"),
])
def test_a_log_with_cuda_graphs_calibrates_with_them_and_credits_them(capsys, tmp_path: Path, arguments,
                                                                      graphs) -> None:
    """The log's arguments block says which CUDA graphs the run used: calibrate times the run with them (even
    where no fitted run of the generation used them), and the file it writes credits them from then on."""
    from dataclasses import replace

    r = _row()
    layout = replace(r.layout, cuda_graphs=graphs)
    step = published_step_s(r)
    log = tmp_path / "run.log"
    log.write_text(megatron_lm_log(_steps(step), global_batch_size=r.job.training.global_batch_size,
                                   arguments={**job_arguments(r.job, r.layout), **arguments},
                                   tflops=logged_tflops(r.job, step)))
    out_file = tmp_path / "cluster.yaml"
    code, out, err = _run(capsys, "calibrate", "--log", str(log), "--model", r.model, "--gpu", r.gpu, "--release",
                          r.release, "--output", str(out_file))
    assert code == 0, err
    cal = read_calibration(out_file)
    assert cal.graphs == (graphs,) and f"cuda_graphs={graphs}" in cal.provenance["logs"][0]["layout"]
    assert cal.calibration(r.job.cluster.gpu).credited_graphs("hopper", graphs) == graphs
    assert estimate_time(r.job, layout, cal.calibration(r.job.cluster.gpu)).tokens_per_s_per_gpu \
        == pytest.approx(r.published, rel=0.03)

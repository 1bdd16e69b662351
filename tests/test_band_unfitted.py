"""The tokens/s band widens where the fit saw no run of the job's kind (issue 20, item 6), and says why."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from autotune.cost.efficiency import DEFAULT_CALIBRATION, fit_group
from autotune.cost.score import estimate_time
from autotune.ui.cli import main
from bench.bench_throughput import fitted_graphs, fitted_groups
from bench.throughput_rows import load_rows
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.training import TrainingSpec


def test_the_fitted_groups_are_what_the_fitted_rows_hold() -> None:
    # efficiency.py's list is pasted from `bench_throughput.py --fit`: it must not drift from the rows it fits (the
    # hybrid rows fit only the Mamba constant; Nemotron-3 Super's NVFP4 rows leave "blackwell fp4 MoE" unfitted)
    fitted = [r for r in load_rows() if not r.held_out and not r.job.model.is_hybrid]
    assert DEFAULT_CALIBRATION.fitted_groups == fitted_groups(fitted)
    assert fit_group("hopper", "fp8", False) in DEFAULT_CALIBRATION.fitted_groups
    assert DEFAULT_CALIBRATION.fitted_graphs == fitted_graphs(fitted)


def test_a_graph_setting_no_fitted_run_of_the_generation_used_is_credited_as_the_nearest_one_seen() -> None:
    cal = DEFAULT_CALIBRATION
    # the fitted Hopper rows run no graphs or Transformer Engine's per-layer ones; Blackwell's every setting
    assert [cal.credited_graphs("hopper", g) for g in ("none", "local", "transformer_engine", "full_iteration")] \
        == ["none", "none", "transformer_engine", "transformer_engine"]
    assert cal.credited_graphs("blackwell", "full_iteration") == "full_iteration"
    assert cal.credited_graphs("ampere", "full_iteration") == "none"
    assert replace(cal, fitted_graphs=None).credited_graphs("hopper", "full_iteration") == "full_iteration"
    assert cal.uncredited_graphs(build_cluster(nodes=1, gpu="gb200").gpu, "full_iteration") is None
    why = cal.uncredited_graphs(build_cluster(nodes=1, gpu="h100").gpu, "full_iteration")
    assert why is not None and "cuda_graphs=transformer_engine" in why and "upper edge" in why


def test_one_note_names_what_each_setting_is_timed_as_offload_included() -> None:
    # the search's note and estimate's line are one message; an offloading layout cannot run per-layer graphs, so
    # on Hopper its Transformer Engine graphs are timed as none, and full-iteration ones as none or TE's
    cal = DEFAULT_CALIBRATION
    h100 = build_cluster(nodes=1, gpu="h100").gpu
    assert cal.uncredited_graph_settings(h100, [("none", False), ("transformer_engine", False)]) is None
    why = cal.uncredited_graph_settings(h100, [("transformer_engine", True)])
    assert why is not None and "uses cuda_graphs=transformer_engine" in why and "as with cuda_graphs=none " in why
    both = cal.uncredited_graph_settings(h100, [("full_iteration", False), ("full_iteration", True)])
    assert both is not None and "cuda_graphs=none or cuda_graphs=transformer_engine" in both
    assert cal.uncredited_graphs(h100, "full_iteration") == cal.uncredited_graph_settings(h100,
                                                                                         [("full_iteration", False)])


def test_full_iteration_graphs_on_hopper_keep_the_pipeline_host_work_and_the_model_figure_is_the_upper_edge() -> None:
    # issue 46, majors 1-2: llama3-70b's pick on 8 H100 nodes was tp4 pp2 vpp41 with full-iteration graphs, its PP
    # p2p term 2.36 s without graphs and 0.0004 s with them, at 61.5% MFU: no fitted Hopper run used those graphs
    job = Job(model=get_model("llama3-70b"), cluster=build_cluster(nodes=8, gpu="h100"),
              training=TrainingSpec(seq_length=4096, global_batch_size=256))
    base = dict(tp=4, pp=2, vpp=41, embedding_loss_split=True, dp=8, mbs=1, sp=True, dist_opt=True)
    full = estimate_time(job, Layout(**base, cuda_graphs="full_iteration"))  # type: ignore[arg-type]
    te = estimate_time(job, Layout(**base, cuda_graphs="transformer_engine"))  # type: ignore[arg-type]
    raw = estimate_time(job, Layout(**base, cuda_graphs="full_iteration"),  # type: ignore[arg-type]
                        replace(DEFAULT_CALIBRATION, fitted_graphs=None))
    assert raw.breakdown["pp_p2p"] < 0.01 and raw.mfu > 0.6  # what the model alone says
    assert full.step_time_s == pytest.approx(te.step_time_s) and full.breakdown == pytest.approx(te.breakdown)
    assert full.breakdown["pp_p2p"] > 2.0 and full.mfu < 0.52
    assert full.tokens_per_s_per_gpu_high == pytest.approx(raw.tokens_per_s_per_gpu_high)
    assert full.tokens_per_s_per_gpu_low == pytest.approx(te.tokens_per_s_per_gpu_low)
    # on Blackwell, where fitted runs used them, the graphs' saving stands
    gb = replace(job, cluster=build_cluster(nodes=16, gpu="gb200", gpus_per_node=4))
    assert estimate_time(gb, Layout(**base, cuda_graphs="full_iteration")).breakdown["pp_p2p"] < 0.01  # type: ignore


def _estimate(precision: str, gpu: str = "h100"):
    job = Job(model=get_model("llama3-70b"), cluster=build_cluster(nodes=8, gpu=gpu),
              training=TrainingSpec(seq_length=8192, global_batch_size=128, precision=precision))  # type: ignore
    return job, estimate_time(job, Layout(tp=8, pp=4, vpp=5, dp=2, mbs=1, sp=True, dist_opt=True))


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_an_unfitted_group_gets_a_wider_band_and_a_reason(precision: str) -> None:
    job, est = _estimate(precision)
    why = DEFAULT_CALIBRATION.unfitted(job.cluster.gpu, precision, False)
    low, high = DEFAULT_CALIBRATION.band(False)
    width = math.log(est.tokens_per_s_per_gpu_high / est.tokens_per_s_per_gpu_low)
    if precision == "bf16":  # Hopper BF16 dense: only the 2024 Megatron-LM README rows, no release table
        assert why is not None and "hopper bf16 dense" in why
        assert width == pytest.approx(DEFAULT_CALIBRATION.unfitted_band_factor * (high - low))
    else:
        assert why is None
        assert width == pytest.approx(high - low)


def test_estimate_prints_why_its_band_is_wide(capsys) -> None:
    args = ["estimate", "--model", "llama3-70b", "--nodes", "8", "--layout", "tp=8,pp=4,vpp=5,sp=true,dist_opt=true",
            "--seq-length", "8192", "--global-batch-size", "128", "--json"]
    assert main(args) == 0
    assert "hopper bf16 dense" in json.loads(capsys.readouterr().out)["band_note"]
    assert main([*args[:-1], "--precision", "fp8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["band_note"] is None
    assert main([*args[:-1], "--precision", "fp8", "--cuda-graphs", "full_iteration", "--json"]) == 0
    assert "no fitted hopper run uses cuda_graphs=full_iteration" in json.loads(capsys.readouterr().out)["band_note"]


def test_the_search_reason_names_why_its_band_is_wide() -> None:
    import numpy as np

    from autotune.tuning.ranking import decide

    tokens = np.array([100.0, 99.0, 80.0])
    d = decide(tokens, np.ones(3) * 1e9, np.zeros(3), band=(-0.3, 0.2), band_note="the fit holds no x run")
    assert d.in_band == 2 and "the fit holds no x run" in d.reason
    assert "the fit holds no" not in decide(tokens, np.ones(3) * 1e9, np.zeros(3), band=(-0.3, 0.2)).reason


def test_nvfp4_is_refused_off_blackwell_and_costs_fp4_gemms_on_it() -> None:
    from search_spaces.megatron_names import job_settings

    with pytest.raises(ValueError, match="NVFP4 training .* needs FP4 tensor cores"):
        _estimate("fp4", gpu="h100")
    fp8_job, fp8 = _estimate("fp8", gpu="gb200")
    fp4_job, fp4 = _estimate("fp4", gpu="gb200")
    assert fp4_job.gemm_recipe == "nvfp4" and fp4_job.fp8_recipe is None
    assert fp4.breakdown["compute"] < fp8.breakdown["compute"]  # FP4 GEMMs, the attention core still bf16
    settings = job_settings(fp4_job, Layout(tp=8, pp=4, vpp=5, dp=2, mbs=1, sp=True, dist_opt=True))
    assert (settings["fp4"], settings["fp4_recipe"], settings["fp8"]) == ("e2m1", "nvfp4", None)


def test_a_cluster_calibrated_on_runs_with_full_graphs_credits_them(tmp_path) -> None:
    # "unless calibration says otherwise": a log of a full-graph Hopper run is timed with its graphs, and the file
    # written from it credits them on that generation from then on
    from autotune.cost.calibration_file import CalibrationFile, read_calibration, write_calibration
    from autotune.tuning.calibrate import Run, fit_factors

    job = Job(model=get_model("llama3-70b"), cluster=build_cluster(nodes=8, gpu="h100"),
              training=TrainingSpec(seq_length=4096, global_batch_size=256))
    layout = Layout(tp=4, pp=2, vpp=41, embedding_loss_split=True, dp=8, mbs=1, sp=True, dist_opt=True,
                    cuda_graphs="full_iteration")
    raw = estimate_time(job, layout, replace(DEFAULT_CALIBRATION, fitted_graphs=None)).step_time_s
    fit = fit_factors([Run(job=job, layout=layout, step_time_s=raw)])
    assert fit.graphs == ("full_iteration",) and fit.before[0] == pytest.approx(raw)
    path = tmp_path / "cluster.yaml"
    write_calibration(path, CalibrationFile(gpu_arch=fit.arch, factors=fit.factors, graphs=fit.graphs))
    cal = read_calibration(path).calibration(job.cluster.gpu)
    assert read_calibration(path).graphs == ("full_iteration",)
    assert cal.credited_graphs("hopper", "full_iteration") == "full_iteration"
    assert estimate_time(job, layout, cal).step_time_s == pytest.approx(raw, rel=0.02)
    assert DEFAULT_CALIBRATION.credited_graphs("hopper", "full_iteration") == "transformer_engine"


def test_an_offloading_layout_with_uncredited_graphs_is_timed_as_no_graphs() -> None:
    # per-layer graphs cannot run with activation offload (megatron-core refuses them), so full-iteration graphs
    # on Hopper with offload are timed as no graphs, not as Transformer Engine's per-layer ones
    assert DEFAULT_CALIBRATION.credited_graphs("hopper", "full_iteration", offload=True) == "none"
    assert DEFAULT_CALIBRATION.credited_graphs("blackwell", "full_iteration", offload=True) == "full_iteration"
    job = Job(model=get_model("llama3-8b"), cluster=build_cluster(nodes=1, gpu="h100"),
              training=TrainingSpec(seq_length=8192, global_batch_size=128))
    base = dict(tp=1, pp=1, dp=8, mbs=1, dist_opt=True, offload_layers=8)
    full = estimate_time(job, Layout(**base, cuda_graphs="full_iteration"))  # type: ignore[arg-type]
    none = estimate_time(job, Layout(**base))  # type: ignore[arg-type]
    assert full.step_time_s == pytest.approx(none.step_time_s) and full.breakdown == pytest.approx(none.breakdown)

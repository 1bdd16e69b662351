"""The tokens/s band widens where the fit saw no run of the job's kind (issue 20, item 6), and says why."""

from __future__ import annotations

import json
import math

import pytest

from autotune.cost.efficiency import DEFAULT_CALIBRATION, fit_group
from autotune.cost.score import estimate_time
from autotune.ui.cli import main
from bench.bench_throughput import fitted_groups
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

"""NVIDIA's published Megatron-Bridge runs (25.09-26.08) at their recipes' own switches: every one is a layout
autotune accepts and predicts to fit, and the throughput model predicts them within stated tolerances, on the GPUs
it was fitted on (H100, B200, GB200) and on the ones it never saw (GB300, B300: `bench/bench_throughput.py` prints
every row). The rows: `bench/recipe_rows.py`."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.cost.score import (
    estimate_memory,  # noqa: E402
    estimate_time,  # noqa: E402
)
from bench.recipe_rows import load_recipe_rows  # noqa: E402
from bench.throughput_rows import load_rows  # noqa: E402
from search_spaces.rules import check  # noqa: E402


@pytest.fixture(scope="module")
def recipes():
    return load_recipe_rows()


@pytest.fixture(scope="module")
def errors():
    """(row, predicted / published - 1) of every published throughput row."""
    return [(r, estimate_time(r.job, r.layout).tokens_per_s_per_gpu / r.published - 1) for r in load_rows()]


def _mean_and_bias(errs: list[float]) -> tuple[float, float]:
    logs = [math.log1p(e) for e in errs]
    return sum(map(abs, errs)) / len(errs), math.expm1(sum(logs) / len(logs))


def test_every_scored_recipe_is_valid_and_fits_on_its_gpu(recipes) -> None:
    scored = [r for r in recipes if not r.skip]
    assert len(scored) >= 170 and sum(r.held_out for r in scored) >= 55
    for r in scored:
        assert not check(r.job, r.layout), (r.release, r.gpu, r.model, str(r.layout))
        est = estimate_memory(r.job, r.layout)
        assert est.fits(r.job.cluster.gpu.memory_bytes), (r.release, r.gpu, r.model, str(r.layout), est.total_gib)


def test_skipped_rows_name_what_autotune_cannot_express(recipes) -> None:
    skipped = [r for r in recipes if r.skip]
    assert all(r.job is None for r in skipped)
    reasons = " ".join(r.skip for r in skipped)
    for word in ("hybrid Mamba", "HSDP", "fine-grained activation offload"):
        assert word in reasons


def test_fsdp_and_offload_recipes_are_scored_and_their_offload_is_the_least_that_fits(recipes) -> None:
    # the Llama Megatron-FSDP recipes (issue 20, items 1 and 2): ZeRO-3 with layer-level activation offload on
    # GB200 (40 of 80 layers) and GB300 (20); each fits, and ten layers fewer would not (the recipes offload what
    # they must: GB200 181.1 of 186 GiB, GB300 251.2 of 277.5 on 2026-12-03)
    rows = [r for r in recipes if not r.skip and r.layout.fsdp]
    assert len(rows) >= 12 and {r.gpu for r in rows} >= {"gb200", "gb300", "h100"}
    offloading = [r for r in rows if r.layout.offload_layers and r.model == "LLAMA3_70B"]
    assert len(offloading) >= 10
    for r in offloading:
        capacity = r.job.cluster.gpu.memory_bytes
        assert estimate_memory(r.job, r.layout).fits(capacity), (r.release, r.gpu, str(r.layout))
        fewer = dataclasses.replace(r.layout, offload_layers=r.layout.offload_layers - 10)
        assert not estimate_memory(r.job, fewer).fits(capacity), (r.release, r.gpu, str(fewer))


def test_nvfp4_recipes_are_scored_and_predicted_on_the_gpus_held_out(recipes, errors) -> None:
    # NVFP4 (issue 20, item 3): Llama3-70B / 405B on GB200 are fitted (`blackwell.gemm_fp4`), GB300 held out;
    # measured 2026-12-04 (bench/bench_throughput.py): GB300 NVFP4 rows +1.8% to +7.7% with the power limit at
    # NVFP4 (`power_factor(gpu, "fp4")`), +18% to +24% when GB300's datasheet FP4 rate was taken at full clock;
    # held within 12% here (Nemotron-3 Super's NVFP4 rows, nothing fitted on them, are held in tests/test_hybrid.py)
    fp4 = [r for r in recipes if not r.skip and r.job.training.fp4 and not r.job.model.is_hybrid]
    assert len(fp4) >= 16 and {r.gpu for r in fp4} == {"gb200", "gb300"}
    held = [e for r, e in errors if r.job.training.fp4 and r.held_out and not r.job.model.is_hybrid]
    assert len(held) >= 8 and all(abs(e) <= 0.12 for e in held), sorted(held)


def test_recipes_carry_the_blackwell_moe_bundle(recipes) -> None:
    # 26.06+ MoE recipes on GB200/GB300: full-iteration graphs with the EP overlap, HybridEP, FP8 attention
    bundle = [r for r in recipes if not r.skip and r.full_iteration and r.arch == "moe"]
    assert len(bundle) >= 20
    for r in bundle:
        assert r.layout.ep_overlap and r.job.moe_dispatcher == ("flex", "hybridep")
        assert r.job.training.moe_router_force_load_balancing


def test_fitted_rows_are_predicted_within_ten_percent_on_average(errors) -> None:
    fitted = [e for r, e in errors if not r.held_out]
    mean, bias = _mean_and_bias(fitted)
    assert mean <= 0.10 and abs(bias) <= 0.03, (mean, bias)


def test_blackwell_ultra_is_predicted_from_its_spec_sheet(errors) -> None:
    # nothing is fitted on GB300 or B300 (103 rows, mean 8.0%, bias +0.5% on 2026-12-04; the power limit's term: BF16
    # and FP8 run faster than their datasheet peaks say on GB300 / B300, NVFP4 slower)
    held = [e for r, e in errors if r.held_out]
    mean, bias = _mean_and_bias(held)
    assert len(held) >= 55
    assert mean <= 0.12 and abs(bias) <= 0.06, (mean, bias)


def test_moe_rows_with_full_iteration_graphs_are_not_biased_low(errors) -> None:
    rows = [e for r, e in errors if r.moe and r.layout.cuda_graphs == "full_iteration"]
    mean, bias = _mean_and_bias(rows)
    assert len(rows) >= 20 and abs(bias) <= 0.08, (mean, bias)


def test_the_search_picks_at_least_the_newest_gb200_moe_recipes(recipes) -> None:
    """The 26.08 GB200 recipes of Qwen3-30B-A3B (8 GPUs, full-iteration graphs) and GPT-OSS-120B (64 GPUs): each is
    a row of the search's default space and the pick is predicted at least as fast, within the tie tolerance
    (every distinct B200 / GB200 MoE recipe: `bench/bench_recipes_in_space.py`)."""
    from bench.bench_recipes_in_space import compare

    chosen = [r for r in recipes if not r.skip and r.release == "26.08" and r.gpu == "gb200"
              and r.model in ("Qwen3_30B_a3B", "GPT OSS 120B") and r.precision == "MXFP8"]
    assert {r.model for r in chosen} == {"Qwen3_30B_a3B", "GPT OSS 120B"}
    for r in chosen:
        got = compare(r)
        assert got["recipe_in_space"], f"{r.model}: {r.layout} is not in the default space"
        assert got["pick"] is not None and got["recipe_tokens_per_s_per_gpu"] is not None
        assert got["pick_at_least_recipe"], got  # pick >= recipe * (1 - TIE_TOLERANCE)


def test_the_search_picks_at_least_the_newest_gb200_fsdp_recipe(recipes) -> None:
    """The newest GB200 Llama3-70B recipe (Megatron-FSDP with 40 layers' activations offloaded) is a row of the
    search's default space and the pick is predicted at least as fast, within the tie tolerance (every B200 /
    GB200 dense recipe: `bench/bench_recipes_in_space.py --arch dense`)."""
    from bench.bench_recipes_in_space import compare

    fsdp = [r for r in recipes if not r.skip and r.gpu == "gb200" and r.model == "LLAMA3_70B" and r.layout.fsdp]
    newest = max(fsdp, key=lambda r: r.release)
    assert newest.layout.offload_layers == 40
    got = compare(newest)
    assert got["recipe_in_space"], f"{newest.layout} is not in the default space"
    assert got["pick_at_least_recipe"], got

"""`bench/bench_sweeps.py`: the same-job sweeps it finds in the real published rows, and its pair-order count on
hand-made numbers (no model evaluation, no search: a fraction of a second)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_sweeps import find_sweeps, order_pairs, tabled_rows  # noqa: E402


def test_pair_order_on_a_hand_made_sweep() -> None:
    # pairs (faster first): (0,1) the model reverses; (1,2) differ by 1.1%, a tie; the other four it orders right
    pairs = order_pairs([100.0, 90.0, 89.0, 50.0], [10.0, 20.0, 5.0, 1.0])
    assert (pairs.right, pairs.counted, pairs.ties, pairs.same) == (4, 5, 1, 0)
    assert pairs.wrong == [(0, 1)]
    assert pairs.fraction == 0.8


def test_same_run_pairs_are_skipped_and_a_missing_prediction_is_wrong() -> None:
    pairs = order_pairs([100.0, 80.0, 60.0], [5.0, 5.0, None], keys=["a", "a", "b"])
    assert (pairs.right, pairs.counted, pairs.same, pairs.ties) == (0, 2, 1, 0)
    assert pairs.wrong == [(0, 2), (1, 2)]
    assert order_pairs([1.0], [1.0]).fraction is None


def test_known_sweeps_are_found_in_the_published_rows() -> None:
    sweeps = {(k[0], k[1], k[2], k[3]): rows for k, rows in find_sweeps(tabled_rows()).items()}
    # Megatron-MoE-ModelZoo's Qwen3-235B-A22B table on 256 H100: five rows, four distinct runs to the loader
    # (its "+1f1b overlap" row reads as the same layout as the row above it)
    zoo = sweeps[("moe-modelzoo", "Qwen3-235B-A22B", "h100", 256)]
    assert len(zoo) == 5 and len({(r.job, r.layout) for r in zoo}) == 4
    assert sorted(r.layout.ep for r in zoo) == [8, 8, 8, 32, 32]
    # published_sweeps.csv: the two Qwen3-30B-A3B 16-H100 EP-overlap A/Bs stay two sweeps (different stacks)
    hybrid = [rows for k, rows in sweeps.items() if "hybridep ep-overlap" in k[0]]
    alltoall = [rows for k, rows in sweeps.items() if "alltoall ep-overlap" in k[0]]
    assert [len(rows) for rows in hybrid] == [2] and [len(rows) for rows in alltoall] == [3]
    assert [r.layout.ep_overlap for r in hybrid[0]] == [False, True]
    assert [r.job.training.delay_wgrad_compute for r in alltoall[0]] == [False, False, True]
    # Bridge 26.06 printed DeepSeek-V3 on 256 GB300 twice, at GBS 4096 and 15360, one layout
    dsv3 = sweeps[("26.06", "deepseek-v3", "gb300", 256)]
    assert sorted(r.job.training.global_batch_size for r in dsv3) == [4096, 15360]
    for rows in sweeps.values():  # one model, GPU count and precision per sweep, and more than one run
        assert len({(r.job.model, r.job.world_size, r.job.training.precision) for r in rows}) == 1
        assert len({(r.job, r.layout) for r in rows}) > 1


def test_the_pair_band_is_what_the_published_sweeps_measure() -> None:
    # Calibration.pair_band: the 90th percentile of the model's error on the gap between two layouts of one job
    # (held-out GB300 / B300 sweeps left out); a predicted gain inside it is "no measurable gain"
    from autotune.cost.analytic import AnalyticBackend
    from autotune.cost.efficiency import DEFAULT_CALIBRATION
    from bench.bench_sweeps import evaluate_sweep, gap_error_p90

    backend = AnalyticBackend()
    sweeps = [evaluate_sweep(k, rows, backend, False) for k, rows in find_sweeps(tabled_rows()).items()]
    assert DEFAULT_CALIBRATION.pair_band == pytest.approx(gap_error_p90(sweeps), abs=5e-5)
    assert gap_error_p90([{"gpu": "h100", "gap_errors": [0.1] * 9 + [1.0]}, {"gpu": "gb300", "gap_errors": [9.0]}]) \
        == pytest.approx(0.19)

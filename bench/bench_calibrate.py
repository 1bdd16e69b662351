"""Does calibrating on one published run improve the predictions of the same job's other layouts?

    python bench/bench_calibrate.py [--verbose]

Groups the published rows (`bench/throughput_rows.py::load_rows`) by model, GPU type, software release and precision
(with its FP8 recipe); a group
with two or more different runs (layout, GPU count or training switches) is one test. Leave-one-in: for each run of
a group, fit the calibration factors (`autotune.tuning.calibrate.fit_factors`, as `python -m autotune calibrate`
does on a log) to that run's published step time alone (GBS x seq / (tokens/s per GPU x GPUs)), then predict the
group's other runs, held out, with and without the factors. Prints the mean |predicted / published - 1| of
tokens/s per GPU over every (calibrated on, predicted) pair, before and after, and per group with --verbose.
The fit here starts from the runs' step times directly, not from a log; `tests/test_calibrate.py` covers the log.
The `compute` factor scales the GEMMs of the calibrated run's precision only (`calibration_file.apply_factors`).

2026-12-02 (this command, under 1 s): the same job (model, GPU, release, precision), 5 groups, 13 calibrations,
24 held-out predictions: mean |error| 8.4% uncalibrated, 6.7% calibrated (3 of 5 groups better); the same model,
GPU and release at any precision, 36 groups, 84 calibrations, 124 predictions: 6.7% -> 6.6% (14 of 36 better;
when `compute` scaled every precision's GEMMs, 6.7% -> 10.9%: an FP8 or NVFP4 run said nothing of the others).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.cost.efficiency import DEFAULT_CALIBRATION  # noqa: E402
from autotune.cost.score import estimate_time  # noqa: E402
from autotune.tuning.calibrate import Run, fit_factors  # noqa: E402
from bench.throughput_rows import Row, load_rows  # noqa: E402


def step_s(row: Row) -> float:
    t = row.job.training
    return t.global_batch_size * t.seq_length / (row.published * row.job.world_size)


def groups(rows: list[Row], *, by_precision: bool = True) -> dict[tuple[str, ...], list[Row]]:
    """Same model, GPU type, release and (with `by_precision`) precision with its FP8 recipe; two or more distinct
    runs (one row per run)."""
    out: dict[tuple[str, ...], dict[tuple[object, ...], Row]] = defaultdict(dict)
    for r in rows:
        t = r.job.training
        precision = t.precision + (f"/{t.fp8_recipe}" if t.precision == "fp8" else "") if by_precision else "any"
        out[(r.model, r.gpu, r.release, precision)].setdefault((r.job.world_size, str(r.layout), t), r)
    return {k: list(v.values()) for k, v in out.items() if len(v) >= 2}


def error(row: Row, cal) -> float:
    return estimate_time(row.job, row.layout, cal).tokens_per_s_per_gpu / row.published - 1.0


def leave_one_in(found: dict[tuple[str, ...], list[Row]], verbose: bool) -> tuple[list[float], list[float], int, int,
                                                                                      int]:
    """(|error| before, after) of every held-out prediction, groups improved, calibrations, calibrations at a bound."""
    before: list[float] = []
    after: list[float] = []
    improved = bounded = fits = 0
    for (model, gpu, release, precision), members in sorted(found.items()):
        g_before, g_after = [], []
        for i, anchor in enumerate(members):
            fit = fit_factors([Run(job=anchor.job, layout=anchor.layout, step_time_s=step_s(anchor))])
            fits += 1
            bounded += bool(fit.at_bound)
            for j, other in enumerate(members):
                if j != i:
                    g_before.append(abs(error(other, DEFAULT_CALIBRATION)))
                    g_after.append(abs(error(other, fit.calibration)))
        before += g_before
        after += g_after
        mb, ma = sum(g_before) / len(g_before), sum(g_after) / len(g_after)
        improved += ma < mb
        if verbose:
            print(f"{model:>18} {gpu:>6} {release:>9} {precision:>14}: {len(members)} runs, mean |error| {mb:6.1%} -> "
                  f"{ma:6.1%}")
    return before, after, improved, fits, bounded


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--verbose", action="store_true", help="one line per group")
    args = p.parse_args()
    rows = load_rows()
    for by_precision, what in ((True, "same model, GPU, release and precision: the same job"),
                               (False, "same model, GPU and release, any precision")):
        found = groups(rows, by_precision=by_precision)
        before, after, improved, fits, bounded = leave_one_in(found, args.verbose)
        print(f"{what}: {len(found)} groups, {fits} calibrations on one run each, {len(before)} held-out predictions")
        print(f"  mean |error| of tokens/s per GPU on the held-out runs: uncalibrated {sum(before) / len(before):.1%}, "
              f"calibrated on one run of the group {sum(after) / len(after):.1%}")
        print(f"  groups improved: {improved} of {len(found)}; calibrations a bound held: {bounded} of {fits}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

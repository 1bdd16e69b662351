"""Calibration of the throughput model against published runs: predicted vs published tokens/s per GPU.

    python bench/bench_calibration.py            # the table, MAPE and max error with DEFAULT_CALIBRATION
    python bench/bench_calibration.py --fit      # coordinate-search the fitted constants on the trustworthy rows
    python bench/bench_calibration.py --holdout  # fit on half the trustworthy rows, report the other half

Rows (/work/shared/data/calibration-runs.csv) fall in three groups:
- trustworthy: trust A or B, a full layout (tp, pp, dp) and published tokens/s. These carry the target
  (MAPE <= 15%, no row > 35%) and are the only rows the fit sees. No row is dropped for being missed.
- info: trust C rows with a layout and tokens/s (Korthikanti's full-recompute rows, whose tokens/s are
  derived from step-time ratios). Printed, not in the target.
- derived: a layout and TFLOP/s in Megatron's causal convention (ours) but no tokens/s: the long-sequence
  Qwen3 rows (16K-128K, CP 1-8). tokens/s = TFLOP/s / (3 * forward FLOPs per token). Printed, not in the
  target, not fitted: they test the CP terms out of sample.
- unusable: no layout, or neither tokens/s nor causal TFLOP/s (the GPT-3 strong-scaling endpoints). Listed
  with the reason.

Defaults assumed where a source is silent: see bench/published_runs.py (shared with the memory check).
This benchmark's own reading of recompute: empty in a row whose TFLOP/s convention "includes recompute" (the
2021 GPT-3 example) -> full; the ModelZoo's module recompute "layernorm, moe" -> full (recomputing the MoE block
is most of a layer's forward and frees most of its activations; the Layout has no per-module recompute);
"full..." -> full, "selective..." -> selective (Megatron's attention-core recompute; the ModelZoo's "norm, act"
module recompute is mapped to selective as the nearest cheap recompute), empty -> none.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.cost.efficiency import DEFAULT_CALIBRATION, Calibration  # noqa: E402
from autotune.cost.throughput import estimate_time, forward_flops_per_token  # noqa: E402
from bench.published_runs import CSV_PATH, float_or, job_of, layout_of  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.layout import Layout  # noqa: E402
TARGET_MAPE, TARGET_MAX = 0.15, 0.35


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    index: int
    source: str
    name: str
    trust: str
    group: str  # trustworthy | info | derived | unusable
    reason: str
    job: Job | None
    layout: Layout | None
    published_tokens_per_s_per_gpu: float | None


def _recompute(text: str) -> str:
    text = text.strip().lower()
    if text.startswith("full"):
        return "full"
    if text.startswith("selective") and "moe" in text:  # module recompute of the MoE block: most of the layer
        return "full"
    if text.startswith("selective"):
        return "selective"
    return "none"


def _recompute_of(r: dict[str, str]) -> str:
    """The row's recompute; the 2021 GPT-3 example leaves it empty but counts the recompute pass in its TFLOP/s."""
    if not r["recompute"].strip() and "includes recompute" in r["flops_convention"]:
        return "full"
    return _recompute(r["recompute"])


def load_rows(path: Path = CSV_PATH) -> list[Row]:
    rows = []
    with path.open(newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            tokens = float_or(r["tokens_per_sec_per_gpu"])
            has_layout = bool(r["tp"].strip() and r["pp"].strip() and r["dp"].strip())
            job = layout = None
            if has_layout:
                job, layout = job_of(r), layout_of(r, _recompute_of(r))  # type: ignore[arg-type]
            tflops = float_or(r["model_tflops_per_gpu"])
            if has_layout and tokens is None and tflops is not None and "causal" in r["flops_convention"]:
                # same FLOPs convention as ours: tokens/s = TFLOP/s / (3 * forward FLOPs per token)
                tokens = tflops * 1e12 / (3 * forward_flops_per_token(job.model, job.training.seq_length))
                rows.append(Row(index=i, source=r["source_id"], name=r["model"], trust=r["trust"].strip(),
                                group="derived", reason="tokens/s derived from published causal TFLOP/s", job=job,
                                layout=layout, published_tokens_per_s_per_gpu=tokens))
                continue
            if not has_layout:
                group, reason = "unusable", "no published layout"
            elif tokens is None:
                group, reason = "unusable", "no published tokens/s"
            elif r["trust"].strip() in ("A", "B"):
                group, reason = "trustworthy", ""
            else:
                group, reason = "info", f"trust {r['trust'].strip()}"
            rows.append(Row(index=i, source=r["source_id"], name=r["model"], trust=r["trust"].strip(), group=group,
                            reason=reason, job=job, layout=layout, published_tokens_per_s_per_gpu=tokens))
    return rows


def relative_error(row: Row, cal: Calibration) -> float:
    predicted = estimate_time(row.job, row.layout, cal).tokens_per_s_per_gpu
    return predicted / row.published_tokens_per_s_per_gpu - 1.0


def mape(rows: list[Row], cal: Calibration) -> tuple[float, float]:
    errors = [abs(relative_error(r, cal)) for r in rows]
    return sum(errors) / len(errors), max(errors)


def _oom_check(row: Row) -> str:
    """'ok', 'OOM (x GiB > y GiB)' or 'n/a' when the memory model is not there yet."""
    try:
        from autotune.cost.memory import estimate_memory
    except ImportError:
        return "n/a"
    try:
        mem = estimate_memory(row.job, row.layout)
    except Exception as err:  # the memory model is another engineer's work in progress: report, don't stop
        return f"memory error: {type(err).__name__}"
    capacity = row.job.cluster.gpu.memory_bytes
    gib = mem.total_bytes / 1024**3
    if mem.total_bytes > capacity:
        return f"OOM {gib:.1f}>{capacity / 1024**3:.0f}"
    return f"{gib:.1f} GiB"


def print_table(rows: list[Row], cal: Calibration) -> None:
    print(f"{'#':>2} {'grp':4} {'source':17} {'model':40} {'layout':44} {'pub':>9} {'pred':>9} {'err':>7} "
          f"{'mfu':>5} {'dominant':10} memory")
    for r in rows:
        if r.group == "unusable":
            print(f"{r.index:>2} {'-':4} {r.source:17} {r.name[:40]:40} unusable: {r.reason}")
            continue
        est = estimate_time(r.job, r.layout, cal)
        non_compute = {k: v for k, v in est.breakdown.items() if k != "compute"}
        dom = max(non_compute, key=non_compute.__getitem__)
        err = est.tokens_per_s_per_gpu / r.published_tokens_per_s_per_gpu - 1
        lay = f"t{r.layout.tp}p{r.layout.pp}v{r.layout.vpp or 1}c{r.layout.cp}e{r.layout.ep}d{r.layout.dp}" \
              f"b{r.layout.mbs}{'S' if r.layout.sp else ''}{'D' if r.layout.dist_opt else ''}-{r.layout.recompute[:3]}"
        print(f"{r.index:>2} {r.group[:4]:4} {r.source:17} {r.name[:40]:40} {lay:44} "
              f"{r.published_tokens_per_s_per_gpu:9.1f} {est.tokens_per_s_per_gpu:9.1f} {err:+7.1%} "
              f"{est.mfu:5.2f} {dom:10} {_oom_check(r)}")


def _with(cal: Calibration, name: str, value: float) -> Calibration:
    if "." in name:
        family, attr = name.split(".")
        fam = tuple((n, replace(f, **{attr: value}) if n == family else f) for n, f in cal.per_gpu_family)
        return replace(cal, per_gpu_family=fam)
    return replace(cal, **{name: value})


def _get(cal: Calibration, name: str) -> float:
    if "." in name:
        family, attr = name.split(".")
        return getattr(dict(cal.per_gpu_family)[family], attr)
    return getattr(cal, name)


# name -> candidate grid (the fitted constants of autotune/cost/efficiency.py)
FIT_GRID: dict[str, list[float]] = {
    "a100.gemm_peak_fraction": [x / 100 for x in range(50, 96, 2)],
    "a100.attention_peak_fraction": [x / 100 for x in range(5, 81, 5)],
    "h100.gemm_peak_fraction": [x / 100 for x in range(40, 91, 2)],
    "h100.attention_peak_fraction": [x / 100 for x in range(20, 81, 5)],
    "gemm_dim_half": [0, 16, 32, 48, 64, 96, 128, 192, 256],
    "a100.tp_comm_exposed_fraction": [x / 10 for x in range(0, 11)],
    # floor 0.1: megatron-core's default is tp_comm_overlap=False, so a fully hidden TP is not a credible default
    "h100.tp_comm_exposed_fraction": [x / 10 for x in range(1, 11)],
    "ep_comm_exposed_fraction": [x / 10 for x in range(0, 11)],
    "pp_p2p_exposed_fraction": [x / 10 for x in range(0, 11)],
    "dp_overlap_fraction": [x / 10 for x in range(0, 11)],
    "moe_layer_overhead_s": [0, 1e-4, 2e-4, 4e-4, 6e-4, 8e-4, 1e-3, 1.5e-3, 2e-3],
    "step_overhead_s": [0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3],
}


def objective(rows: list[Row], cal: Calibration) -> float:
    """MAPE plus a penalty on rows beyond the 35% bound (the fit should not trade one row for the mean)."""
    errors = [abs(relative_error(r, cal)) for r in rows]
    return sum(errors) / len(errors) + sum(max(0.0, e - 0.3) for e in errors) / len(errors)


def fit(rows: list[Row], cal: Calibration, sweeps: int = 3) -> Calibration:
    best = objective(rows, cal)
    for _ in range(sweeps):
        for name, grid in FIT_GRID.items():
            for value in grid:
                trial = _with(cal, name, value)
                score = objective(rows, trial)
                if score < best - 1e-9:
                    best, cal = score, trial
    return cal


def print_calibration(cal: Calibration) -> None:
    for name in FIT_GRID:
        print(f"  {name} = {_get(cal, name)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fit", action="store_true", help="fit the constants on all trustworthy rows")
    p.add_argument("--holdout", action="store_true", help="fit on even rows, report odd rows")
    args = p.parse_args(argv)
    rows = load_rows()
    trusted = [r for r in rows if r.group == "trustworthy"]
    info = [r for r in rows if r.group == "info"]
    derived = [r for r in rows if r.group == "derived"]
    cal = DEFAULT_CALIBRATION
    if args.holdout:
        train, test = trusted[0::2], trusted[1::2]
        fitted = fit(train, cal)
        print_calibration(fitted)
        for label, subset in (("fit rows", train), ("held-out rows", test)):
            mean, worst = mape(subset, fitted)
            print(f"{label}: n={len(subset)} MAPE={mean:.1%} max={worst:.1%}")
        return 0
    if args.fit:
        cal = fit(trusted, cal)
        print("fitted constants (paste into DEFAULT_CALIBRATION):")
        print_calibration(cal)
    print_table(rows, cal)
    mean, worst = mape(trusted, cal)
    print(f"\ntrustworthy rows: n={len(trusted)} MAPE={mean:.1%} max |error|={worst:.1%} "
          f"(target MAPE <= {TARGET_MAPE:.0%}, max <= {TARGET_MAX:.0%})")
    if info:
        mean_i, worst_i = mape(info, cal)
        print(f"info rows (trust C): n={len(info)} MAPE={mean_i:.1%} max |error|={worst_i:.1%}")
    if derived:
        mean_d, worst_d = mape(derived, cal)
        print(f"derived rows (tokens/s from published causal TFLOP/s, long sequences with CP): n={len(derived)} "
              f"MAPE={mean_d:.1%} max |error|={worst_d:.1%}")
    ooms = [r.index for r in trusted + info + derived if _oom_check(r).startswith("OOM")]
    print(f"published layouts predicted OOM: {ooms if ooms else 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

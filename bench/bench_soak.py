"""Soak: one measured search of hundreds of CPU-proxy megatron trials; the driver's and the workers' resident memory,
threads and open files stay flat (issue 24: a search that runs for hours must not grow).

    python bench/bench_soak.py --trials 300                 # tiny-gpt on 1 x 4, megatron backend (CPU proxy)
    python bench/bench_soak.py --trials 30 --every 5        # a quick look

The search is the real one (`run_search` with the megatron backend on a local Ray: Ray Tune, the guided strategy,
successive halving on 1 and 4 timed steps, the kept-alive worker pool). Every `--every` finished trials, in the
driver (the search's own progress callback), it samples the driver (this process) and every Ray process of the run
by role: the megatron ranks (`ray::MegatronWorker`), the pool (`ray::MegatronPool`), the Tune trial
(`ray::ImplicitFunc`) and Ray's raylet and GCS: resident memory, OS threads, open files. It prints the samples,
then per role the figures at the end of the warm-up (`--warmup` trials: imports, allocator caches, Tune's first
trials) and at the end, and the least-squares growth per 100 trials over the samples after the warm-up. A worker
group that a failing layout took down is restarted, so a role's figure is the largest over its live processes.
`--out FILE` writes the samples as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROLES = ("driver", "ray::MegatronWorker", "ray::MegatronPool", "ray::ImplicitFunc", "raylet", "gcs_server")
MIB = 1024**2


def _role(proc: Any) -> str | None:
    try:
        cmd = proc.cmdline()
    except Exception:  # noqa: BLE001 - the process ended between listing and reading
        return None
    first = (cmd[0] if cmd else "").split()[0] if cmd else ""
    name = first.split(".")[0]  # "ray::MegatronWorker.run" -> "ray::MegatronWorker"
    if name in ROLES:
        return name
    base = os.path.basename(first)
    return base if base in ("raylet", "gcs_server") else None


def _figures(proc: Any) -> dict[str, float] | None:
    try:
        with proc.oneshot():
            return {"rss_mib": proc.memory_info().rss / MIB, "threads": proc.num_threads(),
                    "open_files": proc.num_fds()}
    except Exception:  # noqa: BLE001
        return None


def sample(trial: int, t0: float) -> dict[str, Any]:
    """One sample: per role the largest figures over its live processes, and how many processes it has."""
    import psutil

    me = psutil.Process()
    out: dict[str, Any] = {"trial": trial, "elapsed_s": round(time.perf_counter() - t0, 1),
                           "python_threads": threading.active_count(), "roles": {}}
    groups: dict[str, list[dict[str, float]]] = {"driver": [f for f in [_figures(me)] if f]}
    for child in me.children(recursive=True):
        role = _role(child)
        figures = _figures(child) if role else None
        if role and figures:
            groups.setdefault(role, []).append(figures)
    for role, rows in groups.items():
        out["roles"][role] = {"processes": len(rows), **{k: max(r[k] for r in rows) for k in rows[0]}}
    return out


class Sampler:
    """The search's progress sink: a sample every `every` finished trials."""

    def __init__(self, every: int, samples: list[dict[str, Any]], t0: float) -> None:
        self.every, self.samples, self.t0 = every, samples, t0

    def __call__(self, **kwargs: Any) -> Sampler:
        return self

    def update(self, record: Any, done: int, total: int) -> None:
        if done % self.every == 0 or done == total:
            s = sample(done, self.t0)
            self.samples.append(s)
            d = s["roles"].get("driver", {})
            w = s["roles"].get("ray::MegatronWorker", {})
            print(f"  trial {done:4d}/{total} {s['elapsed_s']:7.0f} s  driver {d.get('rss_mib', 0):6.0f} MiB "
                  f"{d.get('threads', 0):3.0f} thr {d.get('open_files', 0):3.0f} files  worker "
                  f"{w.get('rss_mib', 0):6.0f} MiB {w.get('threads', 0):3.0f} thr {w.get('open_files', 0):3.0f} files",
                  flush=True)

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares growth of y per unit of x (0 with fewer than 2 points)."""
    if len(xs) < 2 or len(set(xs)) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def summary(samples: list[dict[str, Any]], warmup: int) -> list[str]:
    after = [s for s in samples if s["trial"] >= warmup] or samples[-1:]
    lines = [f"{'process':22s} {'n':>3s} {'RSS MiB warm':>12s} {'end':>7s} {'/100 trials':>11s}   "
             f"{'threads warm':>12s} {'end':>4s} {'min-max':>8s}   {'files warm':>10s} {'end':>4s} {'min-max':>8s}"]
    for role in ROLES:
        rows = [(s["trial"], s["roles"][role]) for s in after if role in s["roles"]]
        if not rows:
            continue
        xs = [float(t) for t, _ in rows]
        rss = [r["rss_mib"] for _, r in rows]
        thr = [r["threads"] for _, r in rows]
        fds = [r["open_files"] for _, r in rows]
        lines.append(f"{role:22s} {rows[-1][1]['processes']:3d} {rss[0]:12.0f} {rss[-1]:7.0f} "
                     f"{100 * _slope(xs, rss):+11.1f}   {thr[0]:12.0f} {thr[-1]:4.0f} "
                     f"{min(thr):3.0f}-{max(thr):<4.0f}   {fds[0]:10.0f} {fds[-1]:4.0f} "
                     f"{min(fds):3.0f}-{max(fds):<4.0f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300, help="measured trials (default 300)")
    parser.add_argument("--every", type=int, default=10, help="sample every N finished trials (default 10)")
    parser.add_argument("--warmup", type=int, default=30, help="trials before the figures count (default 30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the samples to this JSON file")
    args = parser.parse_args()
    if args.trials < 1 or args.every < 1 or args.warmup < 0:
        print("bench_soak: --trials and --every must be at least 1, --warmup at least 0", file=sys.stderr)
        return 2

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="soak-", dir="/tmp"))
    from autotune.tuning.driver import run_search
    from autotune.tuning.measured import Predicted
    from search_spaces.catalog import get_model
    from search_spaces.gpus import build_cluster
    from search_spaces.job import Job
    from search_spaces.training import TrainingSpec
    from trainers.backend import MegatronBackend

    job = Job(model=get_model("tiny-gpt"), cluster=build_cluster(nodes=1, gpus_per_node=4),
              training=TrainingSpec(seq_length=1024, global_batch_size=16))
    backend = Predicted(MegatronBackend(precision="fp32", timed_steps=1, timeout_s=120))
    samples: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    samples.append(sample(0, t0))
    out = tempfile.mkdtemp(prefix="autotune-soak-")
    print(f"soak: tiny-gpt on 1 x 4, megatron backend (CPU proxy, fp32), {args.trials} trials, results in {out}",
          flush=True)
    result = run_search(job, trials=args.trials, backend=backend, seed=args.seed, output_dir=out,
                        exhaustive_threshold=0, progress=Sampler(args.every, samples, t0))
    wall = time.perf_counter() - t0
    statuses: dict[str, int] = {}
    for r in result.records:
        statuses[r.measurement.status] = statuses.get(r.measurement.status, 0) + 1
    print(f"\n{len(result.records)} trials in {wall / 60:.1f} min ({wall / max(1, len(result.records)):.1f} s each): "
          + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())))
    print(f"after the {args.warmup}-trial warm-up (largest process of each role; growth by least squares):")
    for line in summary(samples, args.warmup):
        print("  " + line)
    if args.out:
        Path(args.out).write_text(json.dumps(samples, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Speed of the analytic path: score every feasible layout of a job, print layouts/s.

    python bench/bench_score_space.py                 # deepseek-v3 on 256 nodes and mixtral on 4 nodes
    python bench/bench_score_space.py --limit 20000   # stop each job after that many layouts

For each job it times three things over the same layouts: enumeration alone
(`search_spaces.space.feasible_layouts`), the throughput model alone (`estimate_time`), and the whole
backend (`AnalyticBackend.evaluate`: rules + memory + time). Pure arithmetic, no torch import.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.cost.analytic import AnalyticBackend  # noqa: E402
from autotune.cost.throughput import estimate_time  # noqa: E402
from search_spaces.catalog import get_model  # noqa: E402
from search_spaces.gpus import build_cluster  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.training import TrainingSpec  # noqa: E402

JOBS = (
    ("deepseek-v3", 256, 4096, 8192),
    ("mixtral", 4, 4096, 256),
)


def _layouts(job: Job, limit: int | None) -> list:
    from search_spaces.space import feasible_layouts

    out = []
    for layout in feasible_layouts(job):
        out.append(layout)
        if limit is not None and len(out) >= limit:
            break
    return out


def bench_job(model: str, nodes: int, seq: int, gbs: int, limit: int | None) -> None:
    job = Job(model=get_model(model), cluster=build_cluster(nodes=nodes),
              training=TrainingSpec(seq_length=seq, global_batch_size=gbs))
    t0 = time.perf_counter()
    layouts = _layouts(job, limit)
    t1 = time.perf_counter()
    for layout in layouts:
        estimate_time(job, layout)
    t2 = time.perf_counter()
    backend = AnalyticBackend()
    status: dict[str, int] = {}
    best = None
    for layout in layouts:
        m = backend.evaluate(job, layout)
        status[m.status] = status.get(m.status, 0) + 1
        if m.ok and (best is None or m.tokens_per_s_per_gpu > best.tokens_per_s_per_gpu):
            best = m
    t3 = time.perf_counter()
    n = len(layouts)
    print(f"{model} on {nodes} nodes (seq {seq}, GBS {gbs}): {n} feasible layouts"
          f"{' (limited)' if limit is not None and n >= limit else ''}")
    print(f"  enumerate: {t1 - t0:.2f} s   estimate_time: {t2 - t1:.2f} s ({n / max(t2 - t1, 1e-9):,.0f} layouts/s, "
          f"{(t2 - t1) / max(n, 1) * 1e6:.1f} us each)   evaluate: {t3 - t2:.2f} s "
          f"({n / max(t3 - t2, 1e-9):,.0f} layouts/s, {(t3 - t2) / max(n, 1) * 1e6:.1f} us each)")
    print(f"  verdicts: {status}")
    if best is not None:
        print(f"  best: {best.layout}  {best.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {best.mfu:.1%}, "
              f"{best.memory_gib:.1f} GiB")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=None, help="at most this many layouts per job")
    args = p.parse_args(argv)
    for model, nodes, seq, gbs in JOBS:
        bench_job(model, nodes, seq, gbs, args.limit)
    heavy = [m for m in ("torch", "ray", "megatron", "optuna") if m in sys.modules]
    print(f"heavy modules imported: {heavy or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

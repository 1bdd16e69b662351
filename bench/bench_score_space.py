"""Speed of the analytic path: score every feasible layout of a job, one at a time and as one table side by side.

    python bench/bench_score_space.py                    # the four jobs below
    python bench/bench_score_space.py --scalar-sample 0  # the scalar path over the whole space (slow)

For each job it times, in CPU seconds of this process (the machine is shared; wall time is printed too):
- enumerate: `search_spaces.space.feasible_space(job)` (the validity helper's code) and the `LayoutTable` built
  from it (`LayoutTable.from_space`, no Layout object per row);
- vectorised: `autotune.cost.score.score_layouts` over the whole table (memory, time, verdict);
- scalar: `estimate_memory` + `estimate_time` + the verdict per Layout (each the one-row case of the same
  assembly), over a random sample of the space (`--scalar-sample`, default 3000; 0 = all), the figure per layout
  extrapolated;
and checks that both give the same figures on the sample (largest relative difference of tokens/s and memory).
Both paths start with cold caches (the cost models' per-job memos cleared). No torch, ray or optuna import.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import autotune.cost.memory as memory_model  # noqa: E402
import autotune.cost.score as score_model  # noqa: E402
import autotune.cost.throughput as throughput_model  # noqa: E402
from autotune.cost.layout_table import LayoutTable  # noqa: E402
from autotune.cost.memory import memory_status, offload_host_bytes  # noqa: E402
from autotune.cost.score import score_layouts  # noqa: E402
from search_spaces.catalog import get_model  # noqa: E402
from search_spaces.gpus import build_cluster  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.training import TrainingSpec  # noqa: E402

# (model, nodes, sequence, global batch): the README command, and the jobs of issue 11
JOBS = (
    ("mixtral", 4, 4096, 256),
    ("deepseek-v3", 128, 4096, 8192),
    ("llama3-8b", 4, 32768, 256),
    ("qwen3-235b-a22b", 32, 4096, 256),
)


def _cold() -> None:
    throughput_model._MEMOS.clear()
    memory_model._job_cache.cache_clear()


class _Clock:
    def __init__(self) -> None:
        self.cpu, self.wall = time.process_time(), time.perf_counter()

    def lap(self) -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        out = (cpu - self.cpu, wall - self.wall)
        self.cpu, self.wall = cpu, wall
        return out


def bench_job(model: str, nodes: int, seq: int, gbs: int, sample: int) -> None:
    from search_spaces.space import feasible_space

    job = Job(model=get_model(model), cluster=build_cluster(nodes=nodes),
              training=TrainingSpec(seq_length=seq, global_batch_size=gbs))
    clock = _Clock()
    space = feasible_space(job)
    enum_cpu, enum_wall = clock.lap()
    table = LayoutTable.from_space(space)
    table_cpu, _ = clock.lap()
    n = len(table)
    _cold()
    clock.lap()
    scores = score_layouts(job, table)
    vec_cpu, vec_wall = clock.lap()

    rows = list(range(n)) if sample <= 0 or sample >= n else random.Random(0).sample(range(n), sample)
    layouts = [table.layout(i) for i in rows]
    capacity = job.cluster.gpu.memory_bytes
    _cold()
    clock.lap()
    figures = []
    for layout in layouts:
        mem = score_model.estimate_memory(job, layout)
        est = score_model.estimate_time(job, layout)
        status, _ = memory_status(job, mem.total_bytes, capacity, offload_host_bytes(job, layout), mem.dominant)
        figures.append((est.tokens_per_s_per_gpu, mem.total_bytes, status == "ok"))
    scalar_cpu, scalar_wall = clock.lap()

    ref = np.array([f[:2] for f in figures])
    got = np.stack([scores.tokens_per_s_per_gpu[rows], scores.total_bytes[rows]], axis=1)
    worst = float(np.max(np.abs(got - ref) / np.abs(ref))) if len(rows) else 0.0
    verdicts = sum(f[2] != bool(scores.fits[i]) for f, i in zip(figures, rows, strict=True))  # one figure per row
    fits = scores.fits
    best = int(np.argmax(np.where(fits, scores.tokens_per_s_per_gpu, -np.inf))) if fits.any() else None

    print(f"{model} on {nodes} nodes (seq {seq}, GBS {gbs}): {n:,} feasible layouts, {int(fits.sum()):,} fit")
    print(f"  enumerate  {enum_cpu:6.2f} s cpu ({enum_wall:.2f} s wall)   LayoutTable {table_cpu:.2f} s cpu")
    print(f"  vectorised {vec_cpu:6.2f} s cpu ({vec_wall:.2f} s wall)   {n / max(vec_cpu, 1e-9):>10,.0f} layouts/s")
    print(f"  scalar     {scalar_cpu:6.2f} s cpu ({scalar_wall:.2f} s wall)   "
          f"{len(rows) / max(scalar_cpu, 1e-9):>10,.0f} layouts/s over {len(rows):,} layouts"
          f"{' (random sample)' if len(rows) < n else ''}"
          f"; whole space ~{n * scalar_cpu / max(len(rows), 1):.1f} s")
    print(f"  agreement on those {len(rows):,}: largest relative difference {worst:.1e}, "
          f"verdicts differing: {verdicts}")
    if best is not None:
        print(f"  best: {table.layout(best)}  {scores.tokens_per_s_per_gpu[best]:,.0f} tokens/s/GPU, "
              f"MFU {scores.mfu[best]:.1%}, {scores.total_bytes[best] / 1024**3:.1f} GiB")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scalar-sample", type=int, default=3000, help="layouts the scalar path scores (0: all)")
    args = p.parse_args(argv)
    for model, nodes, seq, gbs in JOBS:
        bench_job(model, nodes, seq, gbs, args.scalar_sample)
    heavy = [m for m in ("torch", "ray", "megatron", "optuna", "pandas") if m in sys.modules]
    print(f"heavy modules imported: {heavy or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does the measured search find the measured best with a fifth of the space? (megatron backend, CPU proxy)

    python bench/bench_search_measured.py                      # record the space (once, minutes), then replay
    python bench/bench_search_measured.py --replay-only        # replay an existing recording
    python bench/bench_search_measured.py --live               # also one real search through Ray Tune

1. Record: every layout of a space small enough to measure whole (tiny-gpt on 1 node of 4 GPUs, seq 256, GBS 16,
   no recompute, the distributed optimizer on: 88 layouts) is measured once with the megatron backend, which on a
   machine without GPUs runs megatron-core's CPU proxy on gloo (`trainers/`). The measurements are kept in
   `autotune_runs/bench-measured-<job>.json` (not committed) and reused.
2. Replay: each strategy (`guided`, the default; `tpe`; `front`, the analytic ranking; `random`) searches with a
   budget of a fifth of the space (floor(N / 5) layouts), seeds 0, 1, 2, answered from the recording (so every
   strategy meets the same measurements, and the "measured best" is one fixed layout). Found: the measured best is
   among the layouts it measured. The pick is by measurement (`autotune.tuning.ranking.decide`).
3. Live (`--live`): one search through the real path, `run_search(job, backend="megatron", trials=budget)`:
   Ray Tune runs the trials (successive halving on timed steps), the guided strategy proposes them.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from autotune.tuning.analytic_pass import analytic_pass  # noqa: E402
from autotune.tuning.ranking import complexity, decide  # noqa: E402
from autotune.tuning.strategy import StrategyContext, make_strategy, usable  # noqa: E402
from search_spaces.catalog import get_model  # noqa: E402
from search_spaces.gpus import build_cluster  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.layout import Layout, parse_layout  # noqa: E402
from search_spaces.measurement import Measurement  # noqa: E402
from search_spaces.space import SpaceOptions, feasible_space  # noqa: E402
from search_spaces.training import TrainingSpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = SpaceOptions(recompute=("none",), dist_opt=(True,))
STRATEGIES = ("guided", "tpe", "front", "random")


def the_job() -> Job:
    return Job(model=get_model("tiny-gpt"), cluster=build_cluster(nodes=1, gpus_per_node=4),
               training=TrainingSpec(seq_length=256, global_batch_size=16))


def _to_dict(m: Measurement) -> dict:
    return {"layout": str(m.layout), "status": m.status, "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu,
            "memory_bytes": m.memory_bytes, "step_time_s": m.step_time_s, "time": m.time, "reason": m.reason[:300]}


def _from_dict(d: dict) -> Measurement:
    return Measurement(layout=parse_layout(d["layout"]), status=d["status"], source="megatron-cpu-proxy",
                       tokens_per_s_per_gpu=d["tokens_per_s_per_gpu"], memory_bytes=d["memory_bytes"],
                       step_time_s=d["step_time_s"], time=d.get("time") or {}, reason=d.get("reason", ""))


def record(job: Job, path: Path) -> dict[Layout, Measurement]:
    from autotune.tuning.backends import get_backend

    layouts = list(feasible_space(job, OPTIONS).layouts())
    backend = get_backend("megatron")
    out: dict[str, dict] = json.loads(path.read_text()) if path.exists() else {}
    t0 = time.perf_counter()
    try:
        for i, layout in enumerate(layouts):
            if str(layout) in out:
                continue
            m = backend.evaluate(job, layout)
            out[str(layout)] = _to_dict(m)
            path.write_text(json.dumps(out, indent=1))
            print(f"  [{i + 1}/{len(layouts)} {time.perf_counter() - t0:.0f} s] {layout}: {m.status} "
                  f"{m.tokens_per_s_per_gpu or 0:,.0f} tokens/s/GPU", flush=True)
    finally:
        pool = sys.modules.get("trainers.worker_pool")
        if pool is not None:
            pool.shutdown_pool()
    return {parse_layout(k): _from_dict(v) for k, v in out.items()}


class Replay:
    """A backend answering from a recording (the measured figures of every layout of the space)."""

    name = "replay"

    def __init__(self, table: dict[Layout, Measurement]) -> None:
        self.table = table

    def evaluate(self, job: Job, layout: Layout) -> Measurement:
        return self.table[layout]


def replay(job: Job, table: dict[Layout, Measurement], strategy: str, seed: int, budget: int) -> list[Layout]:
    """The layouts `strategy` measures, in order, when the recording answers."""
    space = feasible_space(job, OPTIONS)
    capacity = float(job.cluster.gpu.memory_bytes)
    if strategy == "random":
        layouts = list(space.layouts())
        random.Random(seed).shuffle(layouts)
        return layouts[:budget]
    answer = analytic_pass(job, space, capacity_bytes=capacity)
    ctx = StrategyContext(job=job, space=space, analytic=answer, capacity_bytes=capacity, budget=budget, seed=seed)
    s = make_strategy(strategy, ctx)
    seen: list[Layout] = []
    while len(seen) < budget:
        layout = s.propose()
        if layout is None:
            break
        seen.append(layout)
        s.observe(layout, table[layout])
    return seen


def measured_pick(table: dict[Layout, Measurement], layouts: list[Layout], capacity: float) -> Layout | None:
    from autotune.cost.layout_table import LayoutTable

    ms = [table[lay] for lay in layouts]
    tokens = np.array([m.tokens_per_s_per_gpu if usable(m, capacity) else np.nan for m in ms], dtype=float)
    free = np.array([capacity - (m.memory_bytes or 0.0) for m in ms])
    spread = [m.time.get("step_stdev", 0.0) / m.time["step_median"] for m in ms if m.time.get("step_median")]
    d = decide(tokens, free, complexity(LayoutTable.from_layouts(layouts)), measured=True,
               tolerance=max(0.01, float(np.median(spread)) if spread else 0.01))
    return None if d.pick is None else layouts[d.pick]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replay-only", action="store_true", help="use the recording as it is (no new measurements)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--live", action="store_true", help="also run one real search (megatron backend, Ray Tune)")
    p.add_argument("--recording", type=Path, default=ROOT / "autotune_runs" / "bench-measured-tiny-gpt-1x4.json")
    args = p.parse_args(argv)
    job = the_job()
    args.recording.parent.mkdir(parents=True, exist_ok=True)
    space = feasible_space(job, OPTIONS)
    if args.replay_only:
        table = {parse_layout(k): _from_dict(v) for k, v in json.loads(args.recording.read_text()).items()}
    else:
        print(f"recording {space.size} layouts with the megatron backend (CPU proxy) into {args.recording}")
        table = record(job, args.recording)
    capacity = float(job.cluster.gpu.memory_bytes)
    ok = {lay: m for lay, m in table.items() if usable(m, capacity)}
    speed = {lay: m.tokens_per_s_per_gpu or 0.0 for lay, m in ok.items()}  # usable: every one is > 0
    best = max(speed, key=speed.__getitem__)
    ranked = sorted(speed.values(), reverse=True)
    n = space.size
    budget = n // 5
    runner = ranked[1] / ranked[0] if len(ranked) > 1 else 0.0
    print(f"{job.model.name} on 1 x 4 (seq 256, GBS 16): {n} layouts, {len(ok)} measured ok; measured best {best} "
          f"{table[best].tokens_per_s_per_gpu:,.0f} tokens/s/GPU (runner-up at {runner:.1%} of it); budget {budget}")
    a = analytic_pass(job, space, capacity_bytes=capacity)
    analytic_rank = next(i for i, r in enumerate(a.ranking.order) if a.layout(int(r)) == best) + 1
    print(f"  the analytic model ranks the measured best #{analytic_rank} of {len(a.ranking.order)}")
    print(f"{'strategy':>8} " + " ".join(f"{'seed ' + str(s):>22}" for s in range(args.seeds)) + "   found")
    for strategy in STRATEGIES:
        cells, found = [], 0
        for seed in range(args.seeds):
            seen = replay(job, table, strategy, seed, budget)
            at = next((i + 1 for i, lay in enumerate(seen) if lay == best), None)
            pick = measured_pick(table, seen, capacity)
            found += at is not None
            cells.append(f"{'best at ' + str(at) if at else 'missed'}{', pick ok' if pick == best else ''}")
        print(f"{strategy:>8} " + " ".join(f"{c:>22}" for c in cells) + f"   {found}/{args.seeds}")
    if args.live:
        live(job, budget, best)
    return 0


def live(job: Job, budget: int, best: Layout) -> None:
    from autotune.tuning.driver import run_search

    t0 = time.perf_counter()
    result = run_search(job, trials=budget, backend="megatron", seed=0, space_options=OPTIONS,
                        output_dir=ROOT / "autotune_runs" / f"bench-measured-live-{int(time.time())}")
    measured = [r.layout for r in result.records if r.measurement.source != "analytic"]
    print(f"live search (megatron backend, {budget} trials, {time.perf_counter() - t0:.0f} s): pick "
          f"{result.best.layout if result.best else None}; measured best among its trials: {best in measured}")


if __name__ == "__main__":
    sys.exit(main())

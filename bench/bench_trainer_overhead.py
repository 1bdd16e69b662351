"""Per-trial cost of profiling with megatron-core: kept-alive workers vs fresh Ray Train workers.

Each trial is `MegatronBackend.evaluate` on a tiny model and 4 CPU workers (gloo), called from inside a
Ray Tune function trainable as the search does. Reused: the worker group of `trainers.worker_pool`
survives across trials (the first trial pays its start-up). Fresh: every trial builds a Ray Train V2
`TorchTrainer` with new worker processes. Printed per trial: the driver's `Tuner.fit` time (one Tuner per
trial here, so it includes Tune's own start-up, which a search pays once), the wall time inside the trial
function, the job's own work on the slowest rank (build + steps + measuring), and wall minus work (overhead).

    python bench/bench_trainer_overhead.py                 # 6 reused + 2 fresh trials, about 3 minutes here
    python bench/bench_trainer_overhead.py --reused 4 --fresh 1

Target: reused-worker overhead under 5 s per trial for a tiny model on 4 workers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LAYOUTS = ["tp=2,pp=2", "tp=2,sp=true,dp=2", "pp=2,vpp=2,dp=2", "dp=4,dist_opt=true", "tp=4", "pp=4"]


def _trial(config: dict, job, backend) -> dict:
    from search_spaces.layout import parse_layout

    t0 = time.perf_counter()
    m = backend.evaluate(job, parse_layout(config["layout"], world_size=4))
    return {"status": m.status, "reason": m.reason[:200], "wall_s": time.perf_counter() - t0,
            "job_s": m.extra.get("job_s", float("nan")), "fresh": m.extra.get("fresh_workers"),
            "startup_s": m.extra.get("startup_s", 0.0), "step_s": m.step_time_s}


def _run(tune, layouts: list[str], job, backend, storage: str) -> list[dict]:
    trainable = tune.with_resources(tune.with_parameters(_trial, job=job, backend=backend), {"cpu": 1})
    out = []
    for layout in layouts:  # one Tuner per trial keeps the order and makes each trial a fresh Tune actor
        tuner = tune.Tuner(trainable, param_space={"layout": layout},
                           tune_config=tune.TuneConfig(num_samples=1),
                           run_config=tune.RunConfig(storage_path=storage, verbose=0))
        t0 = time.perf_counter()
        result = tuner.fit()[0]
        out.append({"layout": layout, **result.metrics, "tune_s": time.perf_counter() - t0})
    return out


def _print(title: str, rows: list[dict]) -> list[float]:
    print(f"\n{title}")
    print(f"  {'layout':22s} {'status':7s} {'Tuner s':>7s} {'wall s':>7s} {'job s':>6s} {'overhead s':>10s} "
          f"{'fresh':>6s}")
    overheads = []
    for r in rows:
        overhead = r["wall_s"] - r["job_s"]
        print(f"  {r['layout']:22s} {r['status']:7s} {r['tune_s']:7.1f} {r['wall_s']:7.1f} {r['job_s']:6.1f} "
              f"{overhead:10.1f} {str(r['fresh']):>6s}"
              + (f"  {r['reason']}" if r["status"] != "ok" else ""))
        if not r["fresh"]:
            overheads.append(overhead)
    return overheads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reused", type=int, default=6, help="trials on kept-alive workers (default 6)")
    parser.add_argument("--fresh", type=int, default=2, help="trials on fresh TorchTrainer workers (default 2)")
    args = parser.parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from ray import tune

    from search_spaces.catalog import get_model
    from search_spaces.gpus import build_cluster
    from search_spaces.job import Job
    from search_spaces.training import TrainingSpec
    from trainers.backend import MegatronBackend, ensure_ray
    from trainers.worker_pool import shutdown_pool

    tmp = tempfile.mkdtemp(prefix="autotune-bench-")
    t0 = time.perf_counter()
    ensure_ray(os.path.join(tmp, "ray"), num_cpus=2)
    print(f"ray.init: {time.perf_counter() - t0:.1f} s")
    job = Job(model=get_model("tiny-gpt"), cluster=build_cluster(nodes=1, gpus_per_node=4),
              training=TrainingSpec(seq_length=4096, global_batch_size=64))
    reused = MegatronBackend(precision="fp32", timed_steps=2)
    layouts = (LAYOUTS * (1 + args.reused // len(LAYOUTS)))[: args.reused]
    rows = _run(tune, layouts, job, reused, os.path.join(tmp, "tune"))
    shutdown_pool()
    overheads = _print("reused workers (Ray actor pool, one group of 4 kept alive)", rows)
    fresh_rows = []
    if args.fresh:
        fresh = MegatronBackend(precision="fp32", timed_steps=2, reuse_workers=False, cpus_per_worker=0.25)
        fresh_rows = _run(tune, LAYOUTS[: args.fresh], job, fresh, os.path.join(tmp, "tune-fresh"))
        _print("fresh workers (Ray Train V2 TorchTrainer per trial)", fresh_rows)
    print("\nsummary")
    if rows and rows[0]["fresh"]:
        print(f"  first reused trial (pays worker start-up): {rows[0]['wall_s']:.1f} s")
    if overheads:
        print(f"  reused: median overhead {statistics.median(overheads):.1f} s per trial "
              f"(max {max(overheads):.1f} s; target < 5 s), "
              f"median wall {statistics.median(r['wall_s'] for r in rows[1:]):.1f} s")
    if fresh_rows:
        walls = [r["wall_s"] for r in fresh_rows]
        print(f"  fresh:  median wall {statistics.median(walls):.1f} s per trial")
    return 0


if __name__ == "__main__":
    sys.exit(main())

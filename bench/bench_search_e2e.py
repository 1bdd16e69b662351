"""End-to-end time of the README command, Ray start-up included, with its split.

    python bench/bench_search_e2e.py              # 3 runs of: python -m autotune --model mixtral --nodes 4
    python bench/bench_search_e2e.py --runs 5 -- --model llama3-70b --nodes 8

Each run is a fresh process (a fresh local Ray), as a user would type it. The split comes from the
run's own `search.json`: interpreter and imports until the search starts, Ray start-up, the search
(Tune trials, Optuna), Ray shut-down, writing results (study.db, best.json), and printing. Target:
under 20 s in total on a 2-core machine. The machine's load average is printed with each run, since
other work on the same cores stretches every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(args: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="autotune-e2e-") as tmp:
        out_dir = Path(tmp) / "run"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "autotune", *args, "--output", str(out_dir), "--no-progress"],
                              cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode not in (0, 1):
            raise SystemExit(f"run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        meta = json.loads((out_dir / "search.json").read_text())
    t = meta["stats"]["timings"]
    ray_start, search = t.get("ray_start_s", 0.0), t.get("search_s", 0.0)
    shutdown, study = t.get("ray_shutdown_s", 0.0), meta["stats"].get("study_write_s", 0.0)
    run_search_total = t.get("run_search_s", 0.0)
    return {"wall_s": wall, "ray_start_s": ray_start, "search_s": search, "study_write_s": study,
            "ray_shutdown_s": shutdown, "startup_s": t.get("started_at_s", 0.0),
            "output_s": max(0.0, wall - t.get("started_at_s", 0.0) - run_search_total),
            "trials": meta.get("finished_trials", 0), "load": os.getloadavg()[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("cli", nargs="*", default=["--model", "mixtral", "--nodes", "4"],
                    help="arguments after --: the command (default --model mixtral --nodes 4)")
    args = ap.parse_args()
    cols = ("wall_s", "startup_s", "ray_start_s", "search_s", "study_write_s", "ray_shutdown_s", "output_s")
    print(f"python -m autotune {' '.join(args.cli)}   ({os.cpu_count()} cores)")
    print(f"{'run':>3} " + " ".join(f"{c:>14}" for c in cols) + f" {'trials':>6} {'load1':>6}")
    rows = []
    for i in range(args.runs):
        r = one_run(args.cli)
        rows.append(r)
        print(f"{i + 1:>3} " + " ".join(f"{r[c]:>14.2f}" for c in cols) + f" {r['trials']:>6} {r['load']:>6.1f}",
              flush=True)
    print("med " + " ".join(f"{statistics.median(r[c] for r in rows):>14.2f}" for c in cols))
    print("\nstartup: interpreter + imports + job until run_search starts; ray_start: ray.init (Tune and Optuna "
          "imported meanwhile); search: Tune trials and Optuna; study_write: study.db, on a thread during "
          "ray_shutdown; output: best.json, table, exit (the rest of the wall time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

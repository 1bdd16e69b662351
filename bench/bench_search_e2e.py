"""Wall time of the README command, and of Ray's own start alone, measured side by side.

    python bench/bench_search_e2e.py              # 3 rounds: python -m autotune --model mixtral --nodes 4
    python bench/bench_search_e2e.py --runs 5 -- --model deepseek-v3 --nodes 128 --global-batch-size 8192

Each round runs, in fresh processes as a user would type them:
- the command (default the README's `python -m autotune --model mixtral --nodes 4`), its wall time and its split
  from its own `search.json` (interpreter and imports until the search starts, the analytic pass, Ray if it
  started, writing the results);
- Ray's start alone: `ray.init()` with the search's own arguments (a local Ray on 127.0.0.1, no dashboard) and
  `ray.shutdown()`, in a fresh interpreter: what any Ray-based search pays before its first trial;
- the time to the first line the command prints (its status line), from the same run.
Target: the README command in at most 10 s on 2 cores; issue 46's: any catalog model up to 1,024 GPUs in at most
5 s. The machine's load average is printed with each round, since other work on the same cores stretches every
figure.

2026-12-07, 2 cores, median of 3 (wall, analytic): the README job 5.0 s (1.1 s); DeepSeek-V3 on 128 nodes 6.8 s
(2.4 s), in FP8 7.6 s (3.0 s); Qwen3-235B FP4 on 64 GB300 nodes 12.7 s (8.1 s). Before that stop's changes
(c83d531, one run): DeepSeek-V3 23.5 s (17.8 s), Qwen3-235B FP4 38.8 s (32.3 s). About 3 s of each wall is fixed
(imports, study.db, plots, report); the 5 s goal is met by none of the three large jobs.

Since study.db is written by a forked child while the report and plots are drawn (`study_db.start_study_write`),
2026-12-07, 2 cores, `farm-bench --vs` with FORCE_COLOR=1 (status line on), median wall, before -> after: the
README job 6.8 -> 5.0 s (6 pairs); DeepSeek-V3 128 nodes 7.8 -> 5.5 s, in FP8 7.9 -> 6.9 s; Qwen3-235B FP4 on 64
GB300 nodes 15.2 -> 12.0 s (3 pairs each; this machine ran about 1.3x slower than the figures above).
With a table of 20,000 rows or more also scored half in a forked child (`score.PARALLEL_ROWS`), same method,
against 7298b75 (neither change): the README job 6.9 -> 4.5 s; DeepSeek-V3 128 nodes 7.0 -> 5.5 s, in FP8 7.1 ->
4.7 s; Qwen3-235B FP4 on 64 GB300 nodes 14.2 -> 9.5 s. DeepSeek-V3 in BF16 now waits on study.db (~2 s of
Optuna's storage set-up and rows in the child) and Qwen3-235B FP4 on its 639,384 layouts: both still above 5 s.
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
RAY_ALONE = """
import os, time
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
t0 = time.perf_counter()
import ray
t1 = time.perf_counter()
ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
         _temp_dir=os.environ["BENCH_RAY_TMP"])
t2 = time.perf_counter()
ray.shutdown()
t3 = time.perf_counter()
print(f"{t1 - t0} {t2 - t1} {t3 - t2}")
"""


def _env(tmp: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_RAY_TMP": os.path.join(tmp, "ray")}


def run_command(args: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="autotune-e2e-") as tmp:
        out_dir = Path(tmp) / "run"
        t0 = time.perf_counter()
        # FORCE_COLOR: rich draws the status line on the pipe as on a terminal; its first character is timed
        proc = subprocess.Popen([sys.executable, "-m", "autotune", *args, "--output", str(out_dir)],
                                cwd=tmp, env={**_env(tmp), "FORCE_COLOR": "1"}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        first = proc.stderr.read(1)  # the status line comes first, on stderr
        t_first = time.perf_counter() - t0
        out, err = proc.communicate()
        wall = time.perf_counter() - t0
        if proc.returncode not in (0, 1):
            raise SystemExit(f"run failed ({proc.returncode}):\n{first}{err[-3000:]}")
        meta = json.loads((out_dir / "search.json").read_text())
    t = meta["stats"]["timings"]
    return {"wall_s": wall, "first_line_s": t_first if first else float("nan"),
            "startup_s": t.get("started_at_s", 0.0), "analytic_s": t.get("analytic_s", 0.0),
            "ray_start_s": t.get("ray_start_s", 0.0), "trials_s": t.get("search_s", 0.0),
            "output_s": max(0.0, wall - t.get("started_at_s", 0.0) - t.get("run_search_s", 0.0)),
            "load": os.getloadavg()[0]}


def run_ray_alone() -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="autotune-ray-") as tmp:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", RAY_ALONE], env=_env(tmp), capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode:
            raise SystemExit(f"ray alone failed:\n{proc.stderr[-2000:]}")
        imp, init, shutdown = map(float, proc.stdout.split()[-3:])
    return {"ray_wall_s": wall, "ray_import_s": imp, "ray_init_s": init, "ray_shutdown_s": shutdown}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("cli", nargs="*", default=["--model", "mixtral", "--nodes", "4"],
                    help="arguments after --: the command (default --model mixtral --nodes 4)")
    args = ap.parse_args()
    cmd_cols = ("wall_s", "first_line_s", "startup_s", "analytic_s", "ray_start_s", "trials_s", "output_s")
    ray_cols = ("ray_wall_s", "ray_import_s", "ray_init_s", "ray_shutdown_s")
    print(f"python -m autotune {' '.join(args.cli)}   vs   Ray's start alone   ({os.cpu_count()} cores)")
    print(f"{'run':>3} " + " ".join(f"{c:>13}" for c in cmd_cols + ray_cols) + f" {'load1':>6}")
    rows = []
    for i in range(args.runs):
        r = {**run_command(args.cli), **run_ray_alone()}
        rows.append(r)
        print(f"{i + 1:>3} " + " ".join(f"{r[c]:>13.2f}" for c in cmd_cols + ray_cols) + f" {r['load']:>6.1f}",
              flush=True)
    print("med " + " ".join(f"{statistics.median(r[c] for r in rows):>13.2f}" for c in cmd_cols + ray_cols))
    print("\nwall: the command, start to exit; first_line: to its status line; startup: interpreter + imports until "
          "run_search; analytic: scoring and ranking the whole space; ray_start / trials: Ray and its Tune trials "
          "(0 when the search starts no Ray); output: tables, files, report. ray_*: a fresh interpreter importing "
          "ray, ray.init() as the search calls it, ray.shutdown().")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How many trials the search needs to get within 1% of the exhaustive optimum, against random and grid.

For each case (dense and MoE, 1 to 128 nodes) the analytic backend evaluates the whole feasible space
once; the optimum is the highest tokens/s per GPU among layouts that fit (GPU memory minus the
default 5% headroom), and a layout is "good" when it is within 1% of it. Then:

- search: the search's own proposal loop (`autotune.tuning.tune_glue.LayoutSearch`, the OptunaSearch
  subclass Ray Tune drives, stepped here without Tune's runtime: same proposals, same order as
  `run_search` with one trial at a time), with and without the rules-of-thumb seeds, over several
  sampler seeds; the number is the trial at which the best feasible layout so far is good
  (median over seeds; ">B" when the budget B ran out).
- random: uniform sampling of the feasible space without replacement, same budget. Exact figures,
  no simulation: with N layouts of which K are good, the first good one comes at trial t with
  P(T <= t) = 1 - C(N-K, t)/C(N, t); the table gives the median t and the mean (N+1)/(K+1).
- grid: the feasible layouts in the order a grid-search tool walks a product of per-dimension
  lists (first dimension slowest, invalid combinations skipped, which favours grid).

    python bench/bench_search_efficiency.py                 # all cases, 3 seeds, budget 200
    python bench/bench_search_efficiency.py --cases mixtral-8x7b:4 --seeds 5 --budget 300
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search_spaces.catalog import get_model  # noqa: E402
from search_spaces.gpus import build_cluster  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.training import TrainingSpec  # noqa: E402
from search_spaces.space import SpaceOptions, feasible_space  # noqa: E402

CASES = ("llama3-8b:1", "llama3-70b:4", "llama3.1-405b:128", "mixtral-8x7b:4", "qwen3-30b-a3b:2", "deepseek-v3:128",
         "gpt3-175b:16")
TOLERANCE = 0.01


def make_job(case: str) -> Job:
    name, nodes = case.split(":")
    return Job(model=get_model(name), cluster=build_cluster(nodes=int(nodes)), training=TrainingSpec())


def exhaustive(job: Job, capacity_bytes: float):
    from autotune.cost.analytic import AnalyticBackend

    backend = AnalyticBackend()
    space = feasible_space(job, SpaceOptions())
    scores = {}
    for layout in space.layouts():
        m = backend.evaluate(job, layout)
        fits = m.status == "ok" and m.memory_bytes is not None and m.memory_bytes <= capacity_bytes
        scores[layout] = (m.tokens_per_s_per_gpu or 0.0) if fits else None
    return space, scores


def random_first_hit(n: int, k: int, budget: int) -> tuple[float, int | None, float]:
    """(mean trial of the first good one, median trial or None beyond budget, P(hit within budget))."""
    if k == 0:
        return math.inf, None, 0.0
    mean = (n + 1) / (k + 1)
    miss = 1.0  # P(T > t) = prod_{i<t} (n-k-i)/(n-i)
    median = None
    for t in range(1, min(budget, n) + 1):
        miss *= (n - k - (t - 1)) / (n - (t - 1))
        if median is None and 1 - miss >= 0.5:
            median = t
    return mean, median, 1 - miss


def grid_first_hit(space, good: set) -> int:
    for i, layout in enumerate(space.layouts(), 1):
        if layout in good:
            return i
    return -1


def search_first_hit(job: Job, space, scores: dict, *, seed: int, budget: int, use_seeds: bool,
                     capacity_bytes: float, headroom_bytes: float, threshold: float) -> tuple[int | None, int, int]:
    """(trial at which best-so-far is good or None, invalid proposals, trials run)."""
    from autotune.cost.analytic import AnalyticBackend
    from autotune.tuning.driver import SearchPlan
    from autotune.tuning.seeds import rule_of_thumb_seeds
    from autotune.tuning.tune_glue import LayoutSearch, evaluate_trial

    backend = AnalyticBackend(headroom_bytes=headroom_bytes)
    seeds = tuple(rule_of_thumb_seeds(job, space)) if use_seeds else ()
    plan = SearchPlan(job=job, space=space, backend=backend, backend_name="analytic", capacity_bytes=capacity_bytes,
                      headroom_bytes=headroom_bytes, seed=seed, trials=budget, exhaustive=False, naming="options",
                      seeds=seeds, fixed=(), done=(), folder=Path("."))
    searcher = LayoutSearch(plan=plan)
    best = 0.0
    for t in range(1, budget + 1):
        trial_id = f"t{t}"
        config = searcher.suggest(trial_id)
        result = evaluate_trial(config, job, backend)
        searcher.on_trial_complete(trial_id, result)
        from search_spaces.layout import parse_layout

        score = scores.get(parse_layout(config["layout"]))
        if score is not None:
            best = max(best, score)
        if best >= threshold:
            return t, searcher.counts["invalid_proposals"], t
    return None, searcher.counts["invalid_proposals"], budget


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="*", default=list(CASES), help="model:nodes (default: the 7 cases)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget", type=int, default=200)
    args = ap.parse_args()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = []
    for case in args.cases:
        t0 = time.perf_counter()
        job = make_job(case)
        headroom = 0.05 * job.cluster.gpu.memory_bytes
        capacity = job.cluster.gpu.memory_bytes - headroom
        space, scores = exhaustive(job, capacity)
        feasible = {l: s for l, s in scores.items() if s is not None}
        if not feasible:
            print(f"{case}: no feasible layout, skipped", file=sys.stderr)
            continue
        optimum = max(feasible.values())
        threshold = (1 - TOLERANCE) * optimum
        good = {l for l, s in feasible.items() if s >= threshold}
        r_mean, r_median, r_p = random_first_hit(len(scores), len(good), args.budget)
        grid = grid_first_hit(space, good)
        with_seeds, without, invalid = [], [], 0
        for seed in range(args.seeds):
            for use_seeds, out in ((True, with_seeds), (False, without)):
                hit, bad, _ = search_first_hit(job, space, scores, seed=seed, budget=args.budget, use_seeds=use_seeds,
                                               capacity_bytes=capacity, headroom_bytes=headroom, threshold=threshold)
                out.append(hit if hit is not None else math.inf)
                invalid += bad
        rows.append({"case": case, "moe": job.model.is_moe, "N": len(scores), "feasible": len(feasible), "K": len(good),
                     "optimum": optimum, "search": statistics.median(with_seeds), "search_noseed": statistics.median(without),
                     "search_all": with_seeds, "random_median": r_median, "random_mean": r_mean, "random_p": r_p,
                     "grid": grid, "invalid": invalid, "s": time.perf_counter() - t0})
        print(f"done {case} in {rows[-1]['s']:.0f} s", file=sys.stderr)
    _print(rows, args)
    return 0


def _n(x: float | int | None, budget: int) -> str:
    if x is None or x == math.inf:
        return f">{budget}"
    return f"{x:.0f}" if isinstance(x, (int, float)) else str(x)


def _print(rows: list[dict], args: argparse.Namespace) -> None:
    b = args.budget
    print(f"\nTrials to reach within {TOLERANCE:.0%} of the exhaustive optimum (analytic backend; budget {b}; "
          f"search = median over {args.seeds} sampler seeds)\n")
    head = (f"{'case':<20} {'kind':<5} {'valid N':>8} {'fit':>6} {'good K':>6} {'search':>7} {'no seeds':>9} "
            f"{'random med':>10} {'random mean':>11} {'P(rand<=B)':>10} {'grid':>6} {'rand/search':>11} {'invalid':>7}")
    print(head)
    print("-" * len(head))
    ratios = []
    for r in rows:
        search = r["search"]
        ratio = r["random_mean"] / search if search not in (math.inf, 0) else 0.0
        ratios.append(ratio)
        print(f"{r['case']:<20} {'MoE' if r['moe'] else 'dense':<5} {r['N']:>8} {r['feasible']:>6} {r['K']:>6} "
              f"{_n(search, b):>7} {_n(r['search_noseed'], b):>9} {_n(r['random_median'], b):>10} "
              f"{r['random_mean']:>11.1f} {r['random_p']:>10.2f} {r['grid']:>6} {ratio:>11.1f} {r['invalid']:>7}")
    if ratios:
        print(f"\nmedian over cases of random mean / search median: {statistics.median(ratios):.1f}x "
              f"(target: at least 3x); invalid proposals in total: {sum(r['invalid'] for r in rows)}")
    print("per-seed search trials: " + "; ".join(f"{r['case']} {r['search_all']}" for r in rows))


if __name__ == "__main__":
    sys.exit(main())

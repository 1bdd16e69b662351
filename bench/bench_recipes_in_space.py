"""NVIDIA's published MoE recipes on B200 / GB200 against the search: is each recipe's layout (with its switches)
inside the default space, and is the search's pick predicted at least as fast?

    .venv/bin/python bench/bench_recipes_in_space.py          # one line per distinct recipe, then the counts
    .venv/bin/python bench/bench_recipes_in_space.py --json
    .venv/bin/python bench/bench_recipes_in_space.py --held-out   # GB300 / B300's recipes (never fitted)
    .venv/bin/python bench/bench_recipes_in_space.py --arch dense  # the dense recipes (Megatron-FSDP ones included)

Rows: `bench/recipe_rows.py`'s scored MoE rows on B200 and GB200 (the GPUs the model is fitted on), one per
distinct (job, layout): the same recipe published by several releases is one job per release, since the release
is part of the job. For each: the search's default space (`space.DEFAULT_SPACE`) of the recipe's job (its own
training switches: dispatcher, forced balance, capacity factors, precision, release), whether the recipe's
layout is a row of it, and the analytic search's pick (`autotune.tuning.analytic_pass`) with its predicted
tokens/s against the recipe's. The pick is chosen within the search's tie tolerance of the fastest, so "as fast"
allows that tolerance. Exit status 1 when a recipe is outside the space or the pick is predicted slower than it
beyond the tolerance.

Then the pick's predicted gain over the recipe, over every recipe, over each job's newest recipe (a job: model,
GPU type and count, precision; the recipe a user copies today), and over the recipes a later release superseded,
against how much faster NVIDIA's own later release of the job measured (kernels of that release included).

2026-12-02 (these commands, ~5 min each on 2 cores), on B200 / GB200: 56 distinct recipes, the pick at least as
fast for all 56, 55 inside the default space; predicted gain median +19.2%, max +103.5% (Qwen3-30B-A3B on 8
B200 at micro-batch 4 against 25.11's recipe at 1: NVIDIA's 26.04.01 recipe, at micro-batch 4, measured +192%);
over each job's 14 newest recipes median +19.2%, max +47.1%; of the 42 superseded recipes, the claim is at most
what the later release measured for 23 (median measured later gain +23.8%). On the held-out GB300 / B300: 48
recipes, all inside the space and beaten; median +16.3%, max +99.8%; over each job's 11 newest recipes median
+6.0%, max +30.9%; claims at most the later release's measured gain for 23 of 37 (median +22.0%). Before each
all-to-all and its window contended both ways (`moe_time._exposed_s`), the B200 / GB200 median was +21.7%.
The 6 25.09 recipes with per-layer `local` CUDA graphs are in it since the space offers
them on releases whose Bridge runs them (before 0.6.0), and the 15 DeepSeek-V3 recipes with Bridge's
`Etttt|(tttt|)*14tmL` since the space offers Bridge's MTP split (`pipeline_layout.mtp_layout`). Outside: 25.11's
GB200 DeepSeek-V3 "(w/o MTP)" recipe, `Et*4|(t*4|)*14tL` on PP 4 x VPP 4: for a model without MTP layers the space
offers no split of 61 layers over 16 chunks.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.cost.analytic import AnalyticBackend  # noqa: E402
from autotune.cost.efficiency import DEFAULT_CALIBRATION  # noqa: E402
from autotune.tuning.analytic_pass import analytic_pass  # noqa: E402
from autotune.tuning.ranking import TIE_TOLERANCE  # noqa: E402
from autotune.tuning.verdicts import UNVERIFIED_GAIN  # noqa: E402
from bench.recipe_rows import HELD_OUT_GPUS, RecipeRow, load_recipe_rows  # noqa: E402
from search_spaces.releases import release_names  # noqa: E402
from search_spaces.space import (
    DEFAULT_SPACE,  # noqa: E402
    feasible_space,  # noqa: E402
)

FITTED_GPUS = ("b200", "gb200")
MEDIAN_TARGET = 0.15  # issue 25: the claimed gain over the recipe has a median of at most 1.15x


def evaluate(gpus: tuple[str, ...] = FITTED_GPUS, arch: str = "moe") -> list[dict[str, Any]]:
    """One comparison per distinct (job, layout) of the MoE recipes on `gpus`. A job here is (model, GPU type and
    count, precision) across releases: `newest` marks its newest release's recipe (the one a user copies today),
    and `later_published_gain` is how much faster NVIDIA's fastest later release of the same job measured than this
    recipe (None for the newest): a measured lower bound on what a better setup gains, kernels of the later release
    included."""
    order = {name: i for i, name in enumerate(release_names())}
    recipes = [r for r in load_recipe_rows() if not r.skip and r.arch == arch and r.gpu in gpus
               and r.job is not None and r.layout is not None and r.published]
    by_job: dict[tuple[object, ...], list[RecipeRow]] = {}
    for r in recipes:
        assert r.job is not None
        by_job.setdefault((r.job.model, r.gpu, r.num_gpus, r.job.training.precision), []).append(r)
    seen: set[tuple[object, ...]] = set()
    out: list[dict[str, Any]] = []
    for r in recipes:
        if (r.job, r.layout) in seen:
            continue
        seen.add((r.job, r.layout))
        assert r.job is not None and r.published
        same = by_job[(r.job.model, r.gpu, r.num_gpus, r.job.training.precision)]
        later = [o.published or 0.0 for o in same if order[o.release] > order[r.release]]
        out.append({**compare(r), "published_tokens_per_s_per_gpu": r.published, "newest": not later,
                    "later_published_gain": max(later) / r.published - 1 if later else None})
    return out


def gains(rows: list[dict[str, Any]]) -> str:
    """Median and max of the pick's predicted gain over the recipe, and how many are above the flag."""
    g = sorted((x["pick_tokens_per_s_per_gpu"] or 0.0) / x["recipe_tokens_per_s_per_gpu"] - 1 for x in rows)
    if not g:
        return "none"
    median = statistics.median(g)
    inside = math.exp(DEFAULT_CALIBRATION.pair_band) - 1  # no measurable gain within it (verdicts.gain_vs_pick)
    flag = max(UNVERIFIED_GAIN, inside)
    return (f"median {median:+.1%} (target <= {MEDIAN_TARGET:.0%}: {'met' if median <= MEDIAN_TARGET else 'MISSED'}), "
            f"max {g[-1]:+.1%}, {sum(0 < v <= inside for v in g)} of {len(g)} within the model's {inside:.0%} pair "
            f"error (reported as no measurable gain), {sum(v > flag for v in g)} above {flag:.0%} (flagged "
            f"unverified by the search)")


def compare(r: RecipeRow) -> dict[str, Any]:
    """One scored recipe row against the search's default space of its job."""
    assert r.job is not None and r.layout is not None, r.skip
    t0 = time.perf_counter()
    space = feasible_space(r.job, DEFAULT_SPACE)
    answer = analytic_pass(r.job, space)
    recipe = AnalyticBackend().evaluate(r.job, r.layout)
    row = answer.index_of(r.layout)
    pick = answer.ranking.pick
    pick_tps = None if pick is None else float(answer.scores.tokens_per_s_per_gpu[pick])
    best = float(answer.scores.tokens_per_s_per_gpu[answer.eligible].max()) if answer.eligible.any() else None
    return {
        "release": r.release, "gpu": r.gpu, "model": r.model, "precision": r.precision, "gpus": r.num_gpus,
        "recipe": str(r.layout), "recipe_tokens_per_s_per_gpu": recipe.tokens_per_s_per_gpu,
        "recipe_fits": recipe.status == "ok", "recipe_in_space": row is not None, "space_size": space.size,
        "pick": None if pick is None else str(answer.layout(pick)), "pick_tokens_per_s_per_gpu": pick_tps,
        "best_tokens_per_s_per_gpu": best,
        "pick_at_least_recipe": pick_tps is not None
        and pick_tps >= (recipe.tokens_per_s_per_gpu or 0.0) * (1 - TIE_TOLERANCE),
        "seconds": time.perf_counter() - t0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--held-out", action="store_true",
                        help=f"the {'/'.join(sorted(HELD_OUT_GPUS))} recipes (never fitted) instead of B200/GB200's")
    parser.add_argument("--arch", choices=("moe", "dense"), default="moe", help="which recipes (default: moe)")
    args = parser.parse_args()
    gpus = tuple(sorted(HELD_OUT_GPUS)) if args.held_out else FITTED_GPUS
    rows = evaluate(gpus, args.arch)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for x in rows:
            gain = (x["pick_tokens_per_s_per_gpu"] or 0.0) / x["recipe_tokens_per_s_per_gpu"] - 1
            later = "newest" if x["newest"] else f"a later release measured {x['later_published_gain']:+.1%}"
            print(f"{x['release']:9} {x['gpu']:6} {x['model'][:18]:18} {x['precision']:6} {x['gpus']:>4} GPUs  "
                  f"in space {'yes' if x['recipe_in_space'] else 'NO ':3}  recipe "
                  f"{x['recipe_tokens_per_s_per_gpu']:>7,.0f}  pick {x['pick_tokens_per_s_per_gpu'] or 0:>7,.0f} "
                  f"({gain:+.1%})  {x['seconds']:.1f} s  {later}\n    recipe {x['recipe']}\n    pick   {x['pick']}")
    outside = [x for x in rows if not x["recipe_in_space"]]
    slower = [x for x in rows if not x["pick_at_least_recipe"]]
    kind = "MoE" if args.arch == "moe" else "dense"
    print(f"{len(rows)} distinct {kind} recipes on {'/'.join(gpus)}: {len(rows) - len(outside)} inside the "
          f"default space, pick at least as fast (within {TIE_TOLERANCE:.1%}) for {len(rows) - len(slower)}",
          file=sys.stderr)
    print(f"  pick's predicted gain over every recipe: {gains(rows)}", file=sys.stderr)
    print(f"  over each job's newest recipe: {gains([x for x in rows if x['newest']])}", file=sys.stderr)
    superseded = [x for x in rows if not x["newest"]]
    if superseded:
        within = [x for x in superseded if (x["pick_tokens_per_s_per_gpu"] or 0.0) / x["recipe_tokens_per_s_per_gpu"]
                  <= 1 + x["later_published_gain"] + TIE_TOLERANCE]
        print(f"  over the {len(superseded)} recipes a later release superseded: {gains(superseded)}; the claim is "
              f"at most what NVIDIA's later release of the job measured (within {TIE_TOLERANCE:.0%}) for "
              f"{len(within)}, median measured later gain "
              f"{sorted(x['later_published_gain'] for x in superseded)[len(superseded) // 2]:+.1%}", file=sys.stderr)
    return 1 if outside or slower else 0


if __name__ == "__main__":
    sys.exit(main())

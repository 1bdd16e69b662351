"""NVIDIA's published MoE recipes on B200 / GB200 against the search: is each recipe's layout (with its switches)
inside the default space, and is the search's pick predicted at least as fast?

    .venv/bin/python bench/bench_recipes_in_space.py          # one line per distinct recipe, then the counts
    .venv/bin/python bench/bench_recipes_in_space.py --json

Rows: `bench/recipe_rows.py`'s scored MoE rows on B200 and GB200 (the GPUs the model is fitted on), one per
distinct (job, layout): the same recipe published by several releases is one job per release, since the release
is part of the job. For each: the search's default space (`driver.DEFAULT_SPACE`) of the recipe's job (its own
training switches: dispatcher, forced balance, capacity factors, precision, release), whether the recipe's
layout is a row of it, and the analytic search's pick (`autotune.tuning.analytic_pass`) with its predicted
tokens/s against the recipe's. The pick is chosen within the search's tie tolerance of the fastest, so "as fast"
allows that tolerance. Exit status 1 when a recipe is outside the space or the pick is predicted slower than it
beyond the tolerance.

2026-12-02 (this command, 4 min 40 s on 2 cores): 56 distinct recipes, the pick at least as fast for all 56, 55
inside the default space; the pick's predicted gain over the recipe median +21.7%, max +109% (Qwen3-30B-A3B on 8
B200 at micro-batch 4 against the recipe's 1: the `host` term), 39 above 15%.
The 6 25.09 recipes with per-layer `local` CUDA graphs are in it since the space offers
them on releases whose Bridge runs them (before 0.6.0), and the 15 DeepSeek-V3 recipes with Bridge's
`Etttt|(tttt|)*14tmL` since the space offers Bridge's MTP split (`pipeline_layout.mtp_layout`). Outside: 25.11's
GB200 DeepSeek-V3 "(w/o MTP)" recipe, `Et*4|(t*4|)*14tL` on PP 4 x VPP 4: for a model without MTP layers the space
offers no split of 61 layers over 16 chunks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.cost.analytic import AnalyticBackend  # noqa: E402
from autotune.tuning.analytic_pass import analytic_pass  # noqa: E402
from autotune.tuning.driver import DEFAULT_SPACE  # noqa: E402
from autotune.tuning.ranking import TIE_TOLERANCE  # noqa: E402
from bench.recipe_rows import RecipeRow, load_recipe_rows  # noqa: E402
from search_spaces.space import feasible_space  # noqa: E402

FITTED_GPUS = ("b200", "gb200")


def evaluate() -> list[dict[str, Any]]:
    seen: set[tuple[object, ...]] = set()
    out: list[dict[str, Any]] = []
    for r in load_recipe_rows():
        if r.skip or r.arch != "moe" or r.gpu not in FITTED_GPUS or r.job is None or r.layout is None:
            continue
        if (r.job, r.layout) not in seen:
            seen.add((r.job, r.layout))
            out.append(compare(r))
    return out


def compare(r: RecipeRow) -> dict[str, Any]:
    """One scored recipe row against the search's default space of its job."""
    assert r.job is not None and r.layout is not None, r.skip
    t0 = time.perf_counter()
    space = feasible_space(r.job, DEFAULT_SPACE)
    answer = analytic_pass(r.job, space)
    recipe = AnalyticBackend().evaluate(r.job, r.layout)
    row = answer.index_of(r.layout)
    pick = answer.decision.pick
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
    args = parser.parse_args()
    rows = evaluate()
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for x in rows:
            gain = (x["pick_tokens_per_s_per_gpu"] or 0.0) / x["recipe_tokens_per_s_per_gpu"] - 1
            print(f"{x['release']:9} {x['gpu']:6} {x['model'][:18]:18} {x['precision']:6} {x['gpus']:>4} GPUs  "
                  f"in space {'yes' if x['recipe_in_space'] else 'NO ':3}  recipe "
                  f"{x['recipe_tokens_per_s_per_gpu']:>7,.0f}  pick {x['pick_tokens_per_s_per_gpu'] or 0:>7,.0f} "
                  f"({gain:+.1%})  {x['seconds']:.1f} s\n    recipe {x['recipe']}\n    pick   {x['pick']}")
    outside = [x for x in rows if not x["recipe_in_space"]]
    slower = [x for x in rows if not x["pick_at_least_recipe"]]
    print(f"{len(rows)} distinct MoE recipes on {'/'.join(FITTED_GPUS)}: {len(rows) - len(outside)} inside the "
          f"default space, pick at least as fast (within {TIE_TOLERANCE:.1%}) for {len(rows) - len(slower)}",
          file=sys.stderr)
    return 1 if outside or slower else 0


if __name__ == "__main__":
    sys.exit(main())

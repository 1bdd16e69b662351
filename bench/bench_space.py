"""How long building the feasible space takes: sizes and seconds for a few jobs.

    python bench/bench_space.py            # prints one row per job
    python bench/bench_space.py --repeat 5 # best of 5

Targets (issue 2): mixtral-8x7b on 4 x 8 GPUs well under a second; deepseek-v3 on 256 x 8 in a few
seconds. "build" is `feasible_space` (the prefix index the search uses), "layouts" materialises every
Layout, "rejections" is the per-rule count over the naive product.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search_spaces.catalog import get_model  # noqa: E402
from search_spaces.gpus import build_cluster  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.layout import Layout  # noqa: E402
from search_spaces.space import SpaceOptions, feasible_space  # noqa: E402
from search_spaces.space_report import rejections  # noqa: E402
from search_spaces.training import TrainingSpec  # noqa: E402

CROSS_NODE = SpaceOptions(tp_within_node=False, expert_within_node=False)
JOBS = [
    ("mixtral-8x7b", 4, SpaceOptions(), "default"),
    ("mixtral-8x7b", 4, CROSS_NODE, "cross-node"),
    ("llama3-70b", 64, SpaceOptions(), "default"),
    ("deepseek-v3", 256, SpaceOptions(), "default"),
    ("deepseek-v3", 256, CROSS_NODE, "cross-node"),
    ("qwen3-235b-a22b", 128, CROSS_NODE, "cross-node"),
]


T = TypeVar("T")


def _best_s(fn: Callable[[], T], repeat: int) -> tuple[float, T]:
    best = float("inf")
    for _ in range(max(1, repeat)):
        feasible_space.cache_clear()
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def _all_layouts(job: Job, options: SpaceOptions) -> list[Layout]:
    return list(feasible_space(job, options).layouts())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'model':<16} {'GPUs':>6} {'options':<10} {'shapes':>8} {'layouts':>9} {'candidates':>13} "
          f"{'build_s':>8} {'layouts_s':>9} {'rejections_s':>12}")
    for name, nodes, options, label in JOBS:
        job = Job(model=get_model(name), cluster=build_cluster(nodes=nodes), training=TrainingSpec())
        build_s, space = _best_s(partial(feasible_space, job, options), args.repeat)
        layouts_s, layouts = _best_s(partial(_all_layouts, job, options), args.repeat)
        rejections_s, report = _best_s(partial(rejections, job, options), args.repeat)
        assert report.feasible == len(layouts) == space.size
        print(f"{name:<16} {job.world_size:>6} {label:<10} {len(space.shapes):>8,} {len(layouts):>9,} "
              f"{report.candidates:>13,} {build_s:>8.3f} {layouts_s:>9.3f} {rejections_s:>12.3f}")


if __name__ == "__main__":
    main()

"""Does megatron-core build every layout `space` offers? A sweep over a dozen models and clusters.

    python bench/bench_parity_sweep.py                          # 40 layouts per job, megatron-core 0.19.2
    python bench/bench_parity_sweep.py --megatron-core 0.16.1   # the same jobs, 0.16.1's rules and megatron-core
    python bench/bench_parity_sweep.py --per-job 200            # a larger sample
    python bench/bench_parity_sweep.py --random 200             # also `check` vs megatron-core on random layouts

For each job (targeting the release given, `TrainingSpec.megatron_core`) a sample of the default `space` (evenly
spread, half of it from the layouts with an uneven split or a layout string) is judged by that megatron-core
itself, in its own interpreter (`tests/megatron_runner.py`: this one for 0.19.2, `.venv-mcore-0.16.1/bin/python`
for 0.16.1) running `tests/megatron_build.megatron_decision`: every pipeline stage and every virtual chunk built
on the meta device on its first rank of a fake process group, the pipeline schedule up to its first forward step,
the SP / CP splits, the MoE guard, the micro-batch calculator. Target: 0 refused. `--random N` draws N layouts per
job from the naive product of per-dimension ranges and counts the layouts where `rules.check` (that release's
rules) and megatron-core disagree (stricter-than-core refusals excepted). All layouts go to one child process;
the rows print when it is done.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from search_spaces.catalog import get_model  # noqa: E402
from search_spaces.gpus import build_cluster  # noqa: E402
from search_spaces.hf_config import model_from_hf_config  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.layout import Layout  # noqa: E402
from search_spaces.megatron_version import RULE_SETS  # noqa: E402
from search_spaces.rules import check  # noqa: E402
from search_spaces.space import dimension_ranges, feasible_space, pipeline_fields  # noqa: E402
from search_spaces.training import TrainingSpec  # noqa: E402

import megatron_runner  # noqa: E402

HF = ROOT / "tests" / "data" / "hf"
# (catalog name or hf:<fixture>, nodes of 8 GPUs, global batch size)
JOBS = [
    ("qwen2-7b", 1, 256), ("qwen3-8b", 2, 256), ("llama3-70b", 8, 512), ("llama3.1-405b", 64, 1536),
    ("mixtral-8x7b", 4, 256), ("mixtral-8x22b", 16, 512), ("qwen3-30b-a3b", 4, 512), ("qwen3-235b-a22b", 32, 2048),
    ("deepseek-v3", 128, 8192), ("gpt3-175b", 16, 512),
    ("hf:gpt-oss-20b", 2, 256), ("hf:gemma-2-2b-it", 1, 256), ("hf:gemma-3-1b-it", 1, 256),
    ("hf:olmoe-1b-7b-0125", 2, 256), ("hf:phi3-mini-4k-instruct", 1, 256), ("hf:deepseek-v2-lite", 2, 256),
    ("hf:qwen1.5-moe-a2.7b", 2, 256),
]


def _job(name: str, nodes: int, gbs: int, version: str) -> Job:
    model = model_from_hf_config(HF / f"{name[3:]}.json") if name.startswith("hf:") else get_model(name)
    return Job(model=model, cluster=build_cluster(nodes=nodes, gpus_per_node=8),
               training=TrainingSpec(seq_length=4096, global_batch_size=gbs, megatron_core=version))


def _space_sample(job: Job, n: int, rng: random.Random) -> list[Layout]:
    layouts = list(feasible_space(job).layouts())
    uneven = [x for x in layouts if x.first_stage_layers or x.embedding_loss_split or x.pipeline_layout]
    picked = rng.sample(uneven, min(n // 2, len(uneven)))
    step = max(1, len(layouts) // max(1, n - len(picked)))  # evenly spread over the rest
    return layouts[::step][: n - len(picked)] + picked


def _random_sample(job: Job, n: int, rng: random.Random) -> list[Layout]:
    ranges = dimension_ranges(job, feasible_space(job).options)
    out = []
    for _ in range(n):
        # one value per dimension, each its own type
        values: dict[str, Any] = {name: rng.choice(options) for name, options in ranges.items()}
        model_size = values["tp"] * values["cp"] * values["pp"]
        values["dp"] = max(1, job.world_size // model_size)
        out.append(Layout(**values, **pipeline_fields(job.model.num_layers, values["pp"], values["vpp"],
                                                      job.model.mtp_num_layers)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron-core", choices=RULE_SETS, default="0.19.2",
                        help="the release whose rules and megatron-core judge (default 0.19.2)")
    parser.add_argument("--per-job", type=int, default=40, help="space layouts judged per job (default 40)")
    parser.add_argument("--random", type=int, default=0, help="random product layouts per job for check vs core")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds for the whole sweep's child")
    args = parser.parse_args()
    version = args.megatron_core

    t0 = time.perf_counter()
    rng = random.Random(args.seed)
    jobs, cases = [], []
    for name, nodes, gbs in JOBS:
        job = _job(name, nodes, gbs, version)
        sample, randoms = _space_sample(job, args.per_job, rng), _random_sample(job, args.random, rng)
        jobs.append((job, len(sample), len(randoms)))
        cases += [(job, x) for x in sample + randoms]
    print(f"megatron-core {version} (rules and {megatron_runner.python_for(version)}): {len(cases)} layouts "
          f"sampled in {time.perf_counter() - t0:.1f} s")
    decided = iter(megatron_runner.run("timed_megatron_decisions", cases, version=version, timeout=args.timeout))
    judged = iter(cases)
    totals = {"space": 0, "refused": 0, "random": 0, "disagree": 0}
    print(f"{'job':34s} {'space':>8s} {'judged':>6s} {'refused':>7s} {'random':>6s} {'disagree':>8s} {'s/layout':>8s}")
    for job, n_space, n_random in jobs:
        refused, disagree, seconds = [], [], 0.0
        for k in range(n_space + n_random):
            (_, layout), (ok, reason, took) = next(judged), next(decided)
            seconds += took
            if k < n_space and not ok:
                refused.append(f"    {layout}: {reason}")
            ours = check(job, layout)
            if k >= n_space and ok != all(v.stricter for v in ours):
                disagree.append(f"    {layout}: ours={[v.rule for v in ours]} megatron={'accepts' if ok else reason}")
        label = f"{job.model.name} on {job.world_size}"
        print(f"{label:34s} {feasible_space(job).size:8d} {n_space:6d} {len(refused):7d} {n_random:6d} "
              f"{len(disagree):8d} {seconds / max(1, n_space + n_random):8.2f}")
        for line in refused + disagree:
            print(line)
        totals["space"] += n_space
        totals["refused"] += len(refused)
        totals["random"] += n_random
        totals["disagree"] += len(disagree)
    print(f"total (megatron-core {version}): {totals['space']} space layouts judged, {totals['refused']} refused by "
          f"megatron-core; {totals['random']} random layouts, {totals['disagree']} where check and megatron-core "
          f"disagree; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

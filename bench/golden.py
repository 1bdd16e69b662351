"""The golden figures: every estimate and search pick of a fixed bench set, to hold a refactor to "nothing moved".

    .venv/bin/python bench/golden.py            # compare with tests/data/golden_figures.json (exit 1 on a change)
    .venv/bin/python bench/golden.py --write    # rewrite it (only when a change of figures is meant)

The bench set:
- every published throughput row (`bench.throughput_rows.load_rows`: the Bridge tables, the extra public rows,
  the A/B sweeps, the papers), each at its recipe's own layout and switches;
- a fixed sample of the feasible space of each job in `SAMPLED` (dense, MoE, MLA, hybrid, uneven splits, CP,
  recompute, FP8/FP4, CUDA graphs, the EP overlap, FSDP and offload, Muon), 24 rows a job;
- the analytic search's pick on each job in `SEARCHED` (the README job among them), with the default headroom.

Each layout's figures are what `estimate` reads: the step time and its twelve terms, tokens/s per GPU with its
band, TFLOP/s and MFU (`autotune.cost.score.estimate_time`), the six memory terms, the allocated and device
peaks, the peak stage, its phase and parameters, and the device-overhead terms (`autotune.cost.memory
.estimate_memory`). `tests/test_golden.py` recomputes them, through both the one-layout calls and the vectorised
scorer, and holds them to `REL` relative.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.cost.score import (  # noqa: E402
    Scores,
    estimate_memory,  # noqa: E402
    estimate_time,
)
from search_spaces.catalog import get_model  # noqa: E402
from search_spaces.gpus import build_cluster  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.layout import Layout  # noqa: E402
from search_spaces.space import SpaceOptions, feasible_space  # noqa: E402
from search_spaces.training import TrainingSpec  # noqa: E402

__all__ = ["PATH", "REL", "SAMPLED", "SEARCHED", "figures", "score_figures", "sampled_layouts", "compute", "diff"]

PATH = Path(__file__).resolve().parents[1] / "tests" / "data" / "golden_figures.json"
REL = 1e-9
PER_JOB = 24


def _job(model: str, nodes: int = 1, gpu: str = "h100", **training: Any) -> Job:
    return Job(model=get_model(model), cluster=build_cluster(nodes=nodes, gpu=gpu), training=TrainingSpec(**training))


# name -> (job, space options): every switch that changes how the figures are assembled
SAMPLED: dict[str, tuple[Job, SpaceOptions]] = {
    "dense-llama3-8b": (_job("llama3-8b", global_batch_size=64), SpaceOptions()),
    "dense-cp-llama3-8b-32k": (_job("llama3-8b", 4, seq_length=32768, global_batch_size=256), SpaceOptions()),
    "dense-uneven-405b": (_job("llama3.1-405b", 16, global_batch_size=512), SpaceOptions(max_pp=16)),
    "dense-layernorm-gpt3": (_job("gpt3-175b", 8, seq_length=2048, global_batch_size=512), SpaceOptions()),
    "moe-mixtral": (_job("mixtral-8x7b", 2, global_batch_size=128), SpaceOptions()),
    "moe-qwen3-30b-fp8": (_job("qwen3-30b-a3b", 1, precision="fp8", global_batch_size=64), SpaceOptions()),
    "mla-deepseek-v3": (_job("deepseek-v3", 32, global_batch_size=1024), SpaceOptions(max_tp=4, max_ep=32)),
    "fp8-mxfp8-b200": (_job("llama3-70b", 4, gpu="b200", precision="fp8", global_batch_size=128), SpaceOptions()),
    "recompute-block": (_job("llama3-8b", 1, recompute_num_layers=2, recompute_modules=("core_attn", "mlp"),
                             global_batch_size=64), SpaceOptions()),
    "a2a-overlap-flex": (_job("mixtral-8x7b", 2, moe_token_dispatcher="flex", global_batch_size=128),
                         SpaceOptions(ep_overlap=(True,))),
    "no-precision-aware-optimizer": (_job("qwen3-8b", 1, precision_aware_optimizer=False,
                                          cross_entropy_fusion="native", global_batch_size=32), SpaceOptions()),
    "te-cuda-graphs": (_job("qwen3-30b-a3b", 1, cuda_graph_modules=("attn", "moe_router"), global_batch_size=64),
                       SpaceOptions(cuda_graphs=("transformer_engine",))),
    "full-iteration-moe-gb200": (_job("qwen3-30b-a3b", 2, gpu="gb200", precision="fp8", global_batch_size=128),
                                 SpaceOptions(cuda_graphs=("full_iteration", "none"))),
    "no-grad-overlap-bf16-moments": (_job("qwen3-8b", 1, overlap_grad_reduce=False, optimizer_moments="bf16",
                                          grad_reduce_in_fp32=True, global_batch_size=32), SpaceOptions()),
    "bf16-edges-fp8-b200": (_job("llama3-70b", 4, gpu="b200", precision="fp8", bf16_layers_at_start=1,
                                 bf16_layers_at_end=3, global_batch_size=128), SpaceOptions()),
    "fsdp-offload-70b-gb200": (_job("llama3-70b", 16, gpu="gb200", precision="fp8", fp8_recipe="tensorwise",
                                    seq_length=8192, global_batch_size=256), SpaceOptions(max_pp=1)),
    "hybrid-nano-b200": (_job("nemotron-3-nano-30b-a3b", 4, gpu="b200", precision="fp8", global_batch_size=256),
                         SpaceOptions(max_pp=4)),
    "bf16-edges-nvfp4-hybrid-mtp": (_job("nemotron-3-super-120b-a12b", 16, gpu="gb200", precision="fp4",
                                         bf16_layers_at_end=14, global_batch_size=512), SpaceOptions(max_pp=4)),
    "muon-mixtral-fp8": (_job("mixtral-8x7b", 2, gpu="gb200", precision="fp8", optimizer="muon",
                              global_batch_size=128), SpaceOptions()),
}

# name -> job of an analytic search with the CLI's defaults (the README job first)
SEARCHED: dict[str, Job] = {
    "readme-mixtral-4-nodes": _job("mixtral-8x7b", 4, global_batch_size=256),
    "llama3-70b-8-nodes": _job("llama3-70b", 8, global_batch_size=256),
    "qwen3-30b-fp8-gb200": _job("qwen3-30b-a3b", 2, gpu="gb200", precision="fp8", global_batch_size=256),
    "llama3-8b-1-node": _job("llama3-8b", 1, global_batch_size=128),
}


def _num(x: float) -> float | None:
    return None if isinstance(x, float) and math.isnan(x) else float(x)


def figures(job: Job, layout: Layout) -> dict[str, Any]:
    """One layout's figures through the one-layout calls (`estimate_time`, `estimate_memory`)."""
    t = estimate_time(job, layout)
    m = estimate_memory(job, layout)
    return {
        "step_time_s": t.step_time_s, "time": dict(t.breakdown), "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu,
        "tokens_low": t.tokens_per_s_per_gpu_low, "tokens_high": t.tokens_per_s_per_gpu_high,
        "tflops_per_gpu": t.tflops_per_gpu, "mfu": t.mfu,
        "memory": m.as_dict(), "allocated_bytes": m.allocated_bytes, "total_bytes": m.total_bytes,
        "stage": m.stage, "phase": m.phase, "params_per_gpu": m.params_per_gpu,
        "overhead_terms": dict(m.overhead_terms),
    }


def score_figures(scores: Scores, i: int) -> dict[str, Any]:
    """Row i's figures through the vectorised scorer, named as `figures` names them."""
    me = scores.measurement(i)
    extra = me.extra
    overhead = cast(dict[str, float], extra["memory_overhead"])
    return {
        "step_time_s": me.step_time_s, "time": dict(me.time), "tokens_per_s_per_gpu": me.tokens_per_s_per_gpu,
        "tokens_low": extra["tokens_per_s_per_gpu_low"], "tokens_high": extra["tokens_per_s_per_gpu_high"],
        "tflops_per_gpu": me.tflops_per_gpu, "mfu": me.mfu,
        "memory": dict(me.memory), "allocated_bytes": me.allocated_bytes, "total_bytes": me.memory_bytes,
        "stage": extra["memory_stage"], "phase": extra["memory_phase"], "params_per_gpu": int(scores.params_per_gpu[i]),
        "overhead_terms": {k: v for k, v in overhead.items() if v or k != "graph_pool_held"},
    }


def sampled_layouts(job: Job, options: SpaceOptions, k: int = PER_JOB) -> list[Layout]:
    """k layouts spread evenly over the space's order (the space's order is fixed, so is the sample)."""
    layouts = list(feasible_space(job, options).layouts())
    if len(layouts) <= k:
        return layouts
    return [layouts[(j * (len(layouts) - 1)) // (k - 1)] for j in range(k)]


def _rows() -> Iterator[tuple[str, Job, Layout]]:
    from bench.throughput_rows import load_rows

    for n, row in enumerate(load_rows()):
        yield f"row {n} {row.source} {row.model} {row.gpu}", row.job, row.layout


def _picks() -> dict[str, Any]:
    from autotune.tuning.analytic_pass import analytic_pass
    from autotune.tuning.driver import default_headroom_bytes
    from search_spaces.space import DEFAULT_SPACE

    out = {}
    for name, job in SEARCHED.items():
        answer = analytic_pass(job, feasible_space(job, DEFAULT_SPACE), headroom_bytes=default_headroom_bytes(job))
        pick = answer.ranking.pick
        out[name] = None if pick is None else {
            "layout": str(answer.layout(pick)),
            "tokens_per_s_per_gpu": float(answer.scores.tokens_per_s_per_gpu[pick]),
            "total_bytes": float(answer.scores.total_bytes[pick]),
            "tied": len(answer.ranking.tied),
        }
    return out


def compute(picks: bool = True) -> dict[str, Any]:
    """The whole golden file's content: published rows, sampled layouts (by job), search picks."""
    rows = {name: {"layout": str(layout), **figures(job, layout)} for name, job, layout in _rows()}
    sampled = {}
    for name, (job, options) in SAMPLED.items():
        sampled[name] = [{"layout": str(layout), **figures(job, layout)} for layout in sampled_layouts(job, options)]
    return {"rows": rows, "sampled": sampled, "picks": _picks() if picks else {}}


def diff(expected: Any, got: Any, where: str = "", rel: float = REL) -> list[str]:
    """Where `got` differs from `expected` (numbers beyond `rel`, anything else at all)."""
    if isinstance(expected, dict) and isinstance(got, dict):
        out = [f"{where}: keys {sorted(set(expected) ^ set(got))} differ"] if set(expected) != set(got) else []
        for k in expected.keys() & got.keys():
            out += diff(expected[k], got[k], f"{where}.{k}", rel)
        return out
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return [f"{where}: {len(expected)} entries, now {len(got)}"]
        return [d for j, (a, b) in enumerate(zip(expected, got, strict=True)) for d in diff(a, b, f"{where}[{j}]", rel)]
    if isinstance(expected, float | int) and isinstance(got, float | int) and not isinstance(expected, bool):
        a, b = float(expected), float(got)
        if math.isclose(a, b, rel_tol=rel, abs_tol=1e-12):
            return []
        return [f"{where}: {a!r} -> {b!r}"]
    return [] if expected == got else [f"{where}: {expected!r} -> {got!r}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the golden file")
    args = parser.parse_args(argv)
    got = compute()
    if args.write:
        PATH.write_text(json.dumps(got, indent=0, sort_keys=True) + "\n")
        print(f"wrote {PATH}: {len(got['rows'])} rows, {sum(map(len, got['sampled'].values()))} sampled layouts, "
              f"{len(got['picks'])} picks")
        return 0
    changes = diff(json.loads(PATH.read_text()), got)
    for line in changes[:40]:
        print(line)
    print(f"{len(changes)} figures changed" if changes else "no figure changed")
    return 1 if changes else 0


if __name__ == "__main__":
    raise SystemExit(main())


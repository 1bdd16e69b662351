"""Predicted peak memory per GPU for every published layout in bench/data/calibration-runs.csv.

    python bench/bench_memory_published.py            # one line per row: predicted GiB, capacity, fit or OOM
    python bench/bench_memory_published.py --terms    # plus the breakdown (weights, grads, optimizer, ...)
    python bench/bench_memory_published.py --speed    # time estimate_memory over DeepSeek-V3's 256-node space

A published layout ran, so the memory model must never predict it out of memory; rows that publish a memory
figure (`mem_gb`) are also compared with it. Exit status 1 when any row is predicted to run out of memory.

What the sources leave unsaid is filled in as bench/published_runs.py says (shared with bench/throughput_rows.py).
This check's own reading of recompute: "full..." -> full; "selective (attention core...)" -> selective with
core_attn; the ModelZoo's module lists map to megatron-core's `recompute_modules` ("norm, act" -> layernorm +
moe_act, "layernorm, moe" -> layernorm + moe); "none listed" -> none; empty -> full for the 2021 GPT-3 example
(its TFLOP/s count the recompute), none otherwise. Attention: flash attention (TE) for 2024+ sources; the
2021-2022 runs predate it (s^2 scores kept unless recomputed) and used dropout 0.1 (GPT defaults).
Rows that a `Layout` cannot express are listed and skipped with the reason (no layout published; Megatron-FSDP).
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataclasses import replace  # noqa: E402

from autotune.cost.memory import MemoryAssumptions, MemoryEstimate  # noqa: E402
from autotune.cost.score import estimate_memory  # noqa: E402
from bench.published_runs import CSV_PATH, is_modern, job_of, layout_of  # noqa: E402
from search_spaces.gpus import build_cluster  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.layout import Layout, Recompute  # noqa: E402
from search_spaces.training import TrainingSpec  # noqa: E402
from search_spaces.units import GIB  # noqa: E402

MODULES = {"norm, act": ("layernorm", "moe_act"), "layernorm, moe": ("layernorm", "moe")}


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedRun:
    index: int
    name: str
    source: str
    job: Job | None
    layout: Layout | None
    assumptions: MemoryAssumptions
    published_mem_gb: float | None
    skip_reason: str = ""


def _recompute(r: dict[str, str]) -> tuple[Recompute, tuple[str, ...]]:
    text = r["recompute"].strip()
    if text.startswith("full") or (not text and "includes recompute" in r["flops_convention"]):
        return "full", ()
    if text.startswith("selective"):
        for key, modules in MODULES.items():
            if key in text:
                return "selective", modules
        return "selective", ("core_attn",)
    return "none", ()


def published_runs(path: Path = CSV_PATH) -> list[PublishedRun]:
    runs = []
    with path.open() as f:
        for i, r in enumerate(csv.DictReader(f)):
            modern = is_modern(r)
            recompute, modules = _recompute(r)
            assumptions = MemoryAssumptions(flash_attention=modern, dropout=None if modern else True)
            mem = float(r["mem_gb"]) if r["mem_gb"].strip() else None
            run = partial(PublishedRun, index=i, name=r["model"], source=r["source_id"], assumptions=assumptions,
                          published_mem_gb=mem)
            if not r["tp"].strip():
                runs.append(run(job=None, layout=None, skip_reason="no layout published"))
                continue
            if "FSDP on" in r["notes"]:
                runs.append(run(job=None, layout=None, skip_reason="Megatron-FSDP (params and grads "
                                "sharded) is not a Layout field"))
                continue
            job = job_of(r)
            # Megatron-LM runs of their time: fp32 main grads (its bf16 default) and the unfused loss
            training = replace(job.training, recompute_modules=modules or ("core_attn",), grad_reduce_in_fp32=True,
                               cross_entropy_fusion="none", fp8_param_gather=False)
            runs.append(run(job=replace(job, training=training), layout=layout_of(r, recompute)))
    return runs


def predict(run: PublishedRun) -> MemoryEstimate:
    assert run.job is not None and run.layout is not None
    return estimate_memory(run.job, run.layout, run.assumptions)


def speed() -> None:
    """Time `estimate_memory` over every feasible layout of DeepSeek-V3 on 256 nodes (2048 H100s)."""
    import time

    from search_spaces.catalog import get_model
    from search_spaces.space import feasible_layouts

    job = Job(model=get_model("deepseek-v3"), cluster=build_cluster(nodes=256, gpu="h100"),
              training=TrainingSpec(seq_length=4096, global_batch_size=8192))
    layouts = list(feasible_layouts(job))
    for label in ("cold caches", "warm caches"):
        start = time.perf_counter()
        fits = sum(estimate_memory(job, layout).fits(job.cluster.gpu.memory_bytes) for layout in layouts)
        elapsed = time.perf_counter() - start
        print(f"deepseek-v3, 256 nodes: {len(layouts)} layouts in {elapsed:.2f} s "
              f"({elapsed / len(layouts) * 1e6:.0f} us each, {label}); {fits} fit in memory")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--terms", action="store_true", help="print the breakdown of each row")
    parser.add_argument("--speed", action="store_true", help="time the model over a large search space")
    args = parser.parse_args()
    if args.speed:
        speed()
        return 0
    runs = published_runs()
    oom, scored = 0, 0
    print(f"{'row':>3} {'model':<38} {'gpu':<9} {'layout':<74} {'pred GiB':>8} {'cap GiB':>7} {'peak':>4}  verdict")
    for run in runs:
        if run.job is None:
            print(f"{run.index:>3} {run.name[:38]:<38} skipped: {run.skip_reason}")
            continue
        est = predict(run)
        cap = run.job.cluster.gpu.memory_bytes
        scored += 1
        fits = est.fits(cap)
        oom += not fits
        verdict = "fits" if fits else "PREDICTED OOM"
        if run.published_mem_gb is not None:
            verdict += f" (published {run.published_mem_gb:.1f} GB)"
        print(f"{run.index:>3} {run.name[:38]:<38} {run.job.cluster.gpu.name:<9} {str(run.layout)[:74]:<74} "
              f"{est.total_gib:8.1f} {cap / GIB:7.0f} {est.stage:>4}  {verdict}")
        if args.terms:
            parts = "  ".join(f"{k} {v / GIB:.1f}" for k, v in est.as_dict().items())
            print(f"      {parts}  (GiB; dominant: {est.dominant})")
    print(f"\n{scored} rows scored, {len(runs) - scored} skipped; predicted OOM: {oom}")
    return 1 if oom else 0


if __name__ == "__main__":
    sys.exit(main())

"""Predicted peak memory per GPU for every published layout in /work/shared/data/calibration-runs.csv.

    python bench/bench_memory_published.py            # one line per row: predicted GiB, capacity, fit or OOM
    python bench/bench_memory_published.py --terms    # plus the breakdown (weights, grads, optimizer, ...)
    python bench/bench_memory_published.py --speed    # time estimate_memory over DeepSeek-V3's 256-node space

A published layout ran, so the memory model must never predict it out of memory; rows that publish a memory
figure (`mem_gb`) are also compared with it. Exit status 1 when any row is predicted to run out of memory.

What the sources leave unsaid is filled in the way the source's own scripts of that time did (the same
choices as bench/bench_calibration.py, documented in docs/memory-model.md):
- micro-batch size 1 and no VPP unless the row gives them;
- sequence parallelism: as published; empty means on when TP > 1 for 2024+ sources, off before 2022;
- distributed optimizer: on for 2024+ sources (Megatron-LM's weak-scaling runs use --overlap-param-gather,
  which requires it; the ModelZoo scripts pass --use-distributed-optimizer), off for 2021-2022 (not yet there);
- recompute: "full..." -> full; "selective (attention core...)" -> selective with core_attn; the ModelZoo's
  module lists map to megatron-core's `recompute_modules` ("norm, act" -> layernorm + moe_act, "layernorm,
  moe" -> layernorm + moe); "none listed" -> none; empty -> full for the 2021 GPT-3 example (its TFLOP/s count
  the recompute), none otherwise;
- attention: flash attention (TE) for 2024+ sources; the 2021-2022 runs predate it (s^2 scores kept unless
  recomputed) and used dropout 0.1 (GPT defaults); SwiGLU rows (Qwen3) train without dropout;
- GPT-style rows (gelu) are LayerNorm, biased linears, learned positions, tied embeddings; SwiGLU rows are
  RMSNorm, no bias, RoPE, untied, GQA with qk-layernorm where the attention column says so.
Rows that a `Layout` cannot express are listed and skipped with the reason (no layout published; Megatron-FSDP).
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.memory import GIB, MemoryAssumptions, MemoryEstimate, estimate_memory  # noqa: E402
from search_spaces.gpus import build_cluster  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.layout import Layout, TrainingSpec  # noqa: E402
from search_spaces.model import ModelSpec, MoESpec  # noqa: E402

CSV_PATH = Path("/work/shared/data/calibration-runs.csv")
MODERN_SOURCES = ("mlm-readme-2024", "moe-modelzoo")
GPU_NAMES = {"H100": "h100", "A100-80GB": "a100-80gb"}
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


def _int(text: str, default: int | None = None) -> int | None:
    text = (text or "").strip()
    return int(float(text)) if text else default


def _model(r: dict[str, str]) -> ModelSpec:
    gated = r["mlp_activation"].strip() == "swiglu"
    moe = None
    if r["num_experts"].strip():
        moe = MoESpec(num_experts=int(r["num_experts"]), topk=int(r["moe_topk"]),
                      expert_ffn_hidden_size=int(r["moe_ffn_hidden_size"]),
                      shared_expert_ffn_hidden_size=_int(r["shared_expert_ffn"], 0))
    return ModelSpec(
        name=r["model"], num_layers=int(r["num_layers"]), hidden_size=int(r["hidden_size"]),
        ffn_hidden_size=int(r["ffn_hidden_size"]), num_attention_heads=int(r["num_attention_heads"]),
        num_query_groups=_int(r["num_query_groups"]), kv_channels=_int(r["kv_channels"]),
        vocab_size=int(r["vocab_size"]), gated_linear_unit=gated, tied_embeddings=not gated,
        add_bias_linear=not gated, qk_layernorm="qk_layernorm" in r["attention"],
        normalization="RMSNorm" if gated else "LayerNorm",
        max_position_embeddings=0 if gated else int(r["seq_len"]), moe=moe,
    )


def _recompute(r: dict[str, str]) -> tuple[str, tuple[str, ...]]:
    text = r["recompute"].strip()
    if text.startswith("full") or (not text and "includes recompute" in r["flops_convention"]):
        return "full", ()
    if text.startswith("selective"):
        for key, modules in MODULES.items():
            if key in text:
                return "selective", modules
        return "selective", ("core_attn",)
    return "none", ()


def _layout(r: dict[str, str], modern: bool) -> Layout:
    tp, pp, cp = _int(r["tp"], 1), _int(r["pp"], 1), _int(r["cp"], 1)
    sp_text = r["sequence_parallel"].strip().lower()
    sp = sp_text.startswith("yes") if sp_text else (modern and tp > 1)
    vpp = _int(r["vpp"])
    recompute, _ = _recompute(r)
    return Layout(
        tp=tp, pp=pp, vpp=vpp if vpp and vpp > 1 else None, cp=cp, ep=_int(r["ep"], 1), etp=_int(r["etp"]),
        dp=_int(r["dp"]) or _int(r["num_gpus"]) // (tp * pp * cp), mbs=_int(r["micro_batch_size"], 1), sp=sp,
        dist_opt=modern if not r["distributed_optimizer"].strip() else r["distributed_optimizer"].startswith("y"),
        recompute=recompute,  # type: ignore[arg-type]
    )


def published_runs(path: Path = CSV_PATH) -> list[PublishedRun]:
    runs = []
    with path.open() as f:
        for i, r in enumerate(csv.DictReader(f)):
            modern = r["source_id"] in MODERN_SOURCES
            _, modules = _recompute(r)
            assumptions = MemoryAssumptions(flash_attention=modern, dropout=None if modern else True,
                                            recompute_modules=modules or ("core_attn",))
            mem = float(r["mem_gb"]) if r["mem_gb"].strip() else None
            common = dict(index=i, name=r["model"], source=r["source_id"], assumptions=assumptions,
                          published_mem_gb=mem)
            if not r["tp"].strip():
                runs.append(PublishedRun(job=None, layout=None, skip_reason="no layout published", **common))
                continue
            if "FSDP on" in r["notes"]:
                runs.append(PublishedRun(job=None, layout=None, skip_reason="Megatron-FSDP (params and grads "
                                         "sharded) is not a Layout field", **common))
                continue
            precision = "fp8" if "FP8" in r["precision"].upper() else "bf16"
            job = Job(model=_model(r),
                      cluster=build_cluster(nodes=max(1, int(r["num_gpus"]) // 8), gpu=GPU_NAMES[r["gpu_type"]]),
                      training=TrainingSpec(seq_length=int(r["seq_len"]),
                                            global_batch_size=int(r["global_batch_size"]), precision=precision))
            runs.append(PublishedRun(job=job, layout=_layout(r, modern), **common))
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

"""NVIDIA's published Megatron-Bridge layouts ran, so none may be predicted out of memory on its GPU.

    python bench/bench_memory_must_fit.py          # one line per published run: device memory predicted, capacity
    python bench/bench_memory_must_fit.py --json

Rows: bench/data/published_layouts.csv, every pre-training row of Megatron-Bridge's performance summaries
(releases 25.09 to 26.08) for a catalog model on a catalog GPU (H100, B200, GB200). Each row's precision recipe is
the table's (FP8 on H100 = FP8 current scaling, MXFP8 on Blackwell), and its recompute, CUDA-graph, dispatcher
and expert-overlap settings are those of the Megatron-Bridge v0.3.1 performance preset with the same layout
(`scripts/performance/configs/*/*_workload_base_configs.py`), or Bridge's defaults where no preset matches. Rows
that need what a `Layout` cannot express yet (NVFP4, Megatron-FSDP, CPU offloading, DeepSeek-V3's pipeline
layout strings) are listed as skipped with the reason. Exit status 1 when any scored row is predicted out of memory.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.cost.score import estimate_memory  # noqa: E402
from search_spaces.catalog import get_model  # noqa: E402
from search_spaces.gpus import build_cluster  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.layout import parse_layout  # noqa: E402
from search_spaces.training import training_spec  # noqa: E402
from search_spaces.units import GIB  # noqa: E402

CSV_PATH = Path(__file__).resolve().parent / "data" / "published_layouts.csv"


def evaluate(path: Path = CSV_PATH) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    with path.open() as f:
        for row in csv.DictReader(f):
            base = {"release": row["release"], "model": row["model"], "gpu": row["gpu"], "layout": row["layout"]}
            if row["skip_reason"]:
                out.append({**base, "skipped": row["skip_reason"]})
                continue
            gpus = int(row["num_gpus"])
            gpn = 4 if row["gpu"] == "gb200" else 8
            training = training_spec(seq_length=int(row["seq_length"]), global_batch_size=int(row["global_batch_size"]),
                                     precision=row["precision"], fp8_recipe=row["fp8_recipe"] or None,
                                     **json.loads(row["training"]))
            job = Job(model=get_model(row["model"]), cluster=build_cluster(nodes=gpus // gpn, gpus_per_node=gpn,
                                                                          gpu=row["gpu"]), training=training)
            est = estimate_memory(job, parse_layout(row["layout"], world_size=gpus))
            capacity = job.cluster.gpu.memory_bytes
            out.append({**base, "device_gib": est.total_bytes / GIB, "allocated_gib": est.allocated_bytes / GIB,
                        "capacity_gib": capacity / GIB, "fits": est.fits(capacity), "stage": est.stage,
                        "dominant": est.dominant})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = evaluate()
    scored = [r for r in rows if "skipped" not in r]
    oom = [r for r in scored if not r["fits"]]
    if args.json:
        print(json.dumps({"rows": rows, "scored": len(scored), "predicted_oom": len(oom)}, indent=1))
        return 1 if oom else 0
    print(f"{'release':<9} {'model':<16} {'gpu':<6} {'layout':<92} {'device':>7} {'alloc':>6} {'cap':>5}  verdict")
    for r in rows:
        head = f"{r['release']:<9} {r['model']:<16} {r['gpu']:<6} {str(r['layout'])[:92]:<92}"
        if "skipped" in r:
            print(f"{head} skipped: {r['skipped']}")
            continue
        verdict = "fits" if r["fits"] else "PREDICTED OOM"
        print(f"{head} {r['device_gib']:7.1f} {r['allocated_gib']:6.1f} {r['capacity_gib']:5.0f}  {verdict}")
    print(f"\n{len(scored)} published layouts scored, {len(rows) - len(scored)} skipped; "
          f"predicted out of memory: {len(oom)}")
    return 1 if oom else 0


if __name__ == "__main__":
    sys.exit(main())

"""Write the layouts of NVIDIA's published Megatron-Bridge performance rows that a search shows as the baseline
(search_spaces/data/published_recipes.csv), from the benchmark's rows (`bench/recipe_rows.py`: each row's recipe
read from that release's Megatron-Bridge, with its switches).

    .venv/bin/python tests/data/make_published_recipes.py [--check]

One line per scored row (skipped rows, e.g. Megatron-FSDP ones, are left out): the release, the GPU, the
catalog model and the table's name for it, the precision (`Job.gemm_recipe`: the FP8 recipe, nvfp4, or bf16), the
GPU count, sequence length and global batch, the published tokens/s per GPU, the layout as `str(Layout)` and the
optimizer (adam, or muon: Kimi-K2's).
`--check` compares instead of writing (tests/test_answer.py runs it).
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.recipe_rows import MODELS, load_recipe_rows  # noqa: E402

OUT = ROOT / "search_spaces" / "data" / "published_recipes.csv"
COLUMNS = ("release", "gpu", "model", "table_model", "precision", "num_gpus", "seq_length", "global_batch_size",
           "published_tokens_per_s_per_gpu", "layout", "optimizer")


def rows() -> list[dict[str, object]]:
    out = []
    for r in load_recipe_rows():
        if r.skip or r.job is None or r.layout is None or "w/o MTP" in r.model:  # the layout of another model
            continue
        out.append({"release": r.release, "gpu": r.gpu, "model": MODELS[r.model.split(" (")[0]],
                    "table_model": r.model, "precision": r.job.gemm_recipe or "bf16", "num_gpus": r.num_gpus,
                    "seq_length": r.job.training.seq_length, "global_batch_size": r.job.training.global_batch_size,
                    "published_tokens_per_s_per_gpu": "" if r.published is None else f"{r.published:g}",
                    "layout": str(r.layout), "optimizer": r.job.training.optimizer})
    return out


def text() -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows())
    return buffer.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="compare with the committed file instead of writing")
    args = parser.parse_args()
    if args.check:
        if OUT.read_text(encoding="utf-8") != text():
            print(f"{OUT} differs from bench/recipe_rows.py's rows; rerun without --check", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""NVIDIA's published layout for a job: the baseline a search's pick is set against (issue 25).

`data/published_recipes.csv` (written by tests/data/make_published_recipes.py from the benchmark's rows,
`bench/recipe_rows.py`) holds the layout of every scored row of Megatron-Bridge's performance tables, releases 25.09 to
26.08: the table's TP, PP, CP, VP, EP and micro-batch with the switches its recipe sets. `published_recipe(job)` is
the row of the job's model, GPU, GPU count and precision (`Job.gemm_recipe`, or bf16) from the newest release not newer
than the job's, the same sequence length and global batch first, a table variant (token dropping) last. A row of
another job (`PublishedRecipe.differences`: another precision, optimizer, sequence or batch) is shown as the nearest
published row with what differs, never with its measured figure as the job's.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from search_spaces.gpus import get_gpu
from search_spaces.job import Job
from search_spaces.layout import Layout, parse_layout
from search_spaces.releases import release_names

__all__ = ["PublishedRecipe", "published_recipe", "published_recipes"]

_DATA = Path(__file__).parent / "data" / "published_recipes.csv"


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedRecipe:
    release: str
    gpu: str  # the catalog GPU name
    model: str
    table_model: str  # the table's name, variant included
    precision: str  # Job.gemm_recipe (the FP8 recipe, nvfp4), or bf16
    num_gpus: int
    seq_length: int
    global_batch_size: int
    published_tokens_per_s_per_gpu: float | None
    layout: str
    optimizer: str = "adam"  # TrainingSpec.optimizer of the published run (Kimi-K2's: muon)

    @property
    def label(self) -> str:
        variant = f" {self.table_model[self.table_model.index('('):]}" if "(" in self.table_model else ""
        muon = ", Muon" if self.optimizer == "muon" else ""
        return (f"NVIDIA's published layout{variant}: Megatron-Bridge {self.release} performance table, "
                f"{self.num_gpus} x {self.gpu}, {self.precision}{muon}, seq {self.seq_length}, "
                f"GBS {self.global_batch_size}")

    def differences(self, job: Job) -> tuple[str, ...]:
        """What makes this row's run another job than `job` (precision and its recipe, optimizer, sequence length,
        global batch; the GPU and GPU count match by how rows are chosen), as `GBS 128, not 256`: empty when the row
        is the same job, and only then is its measured figure the job's."""
        t = job.training
        mine = (("precision", self.precision, job.gemm_recipe or "bf16"), ("optimizer", self.optimizer, t.optimizer),
                ("seq", self.seq_length, t.seq_length), ("GBS", self.global_batch_size, t.global_batch_size))
        return tuple(f"{name} {theirs}, not {ours}" for name, theirs, ours in mine if theirs != ours)


@lru_cache(maxsize=1)
def published_recipes() -> tuple[PublishedRecipe, ...]:
    with _DATA.open(encoding="utf-8") as f:
        return tuple(PublishedRecipe(release=r["release"], gpu=get_gpu(r["gpu"]).name, model=r["model"],
                                     table_model=r["table_model"], precision=r["precision"],
                                     num_gpus=int(r["num_gpus"]), seq_length=int(r["seq_length"]),
                                     global_batch_size=int(r["global_batch_size"]),
                                     published_tokens_per_s_per_gpu=float(r["published_tokens_per_s_per_gpu"])
                                     if r["published_tokens_per_s_per_gpu"] else None, layout=r["layout"],
                                     optimizer=r["optimizer"])
                     for r in csv.DictReader(f))


def published_recipe(job: Job) -> tuple[PublishedRecipe, Layout] | None:
    """The published row a search shows as the baseline of `job` (module docstring) and its layout, or None: of
    the rows of the job's model, GPU and GPU count from releases not newer than the job's, whose layout megatron-core
    accepts for the job (a micro-batch the job's global batch takes, ...), the one of the same precision first, then
    of the same optimizer, the newest release, the job's sequence length and global batch, no table variant."""
    from search_spaces.rules import check

    order = release_names()
    newest = order.index(job.training.release)
    precision, t = job.gemm_recipe or "bf16", job.training
    rows = [r for r in published_recipes() if r.model == job.model.name and r.gpu == job.cluster.gpu.name
            and r.num_gpus == job.world_size and r.release in order and order.index(r.release) <= newest]

    def rank(r: PublishedRecipe) -> tuple:
        return (r.precision != precision, r.optimizer != t.optimizer, -order.index(r.release),
                (r.seq_length, r.global_batch_size) != (t.seq_length, t.global_batch_size), "(" in r.table_model)

    for row in sorted(rows, key=rank):
        layout = parse_layout(row.layout, world_size=job.world_size)
        if not check(job, layout):
            return row, layout
    return None

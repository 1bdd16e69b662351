"""Published throughput rows for the throughput benchmark and fit: one reading of every source.

Sources (each row cites its own table in the CSV):
- `bench/recipe_rows.py`: every row of Megatron-Bridge's performance tables, releases 25.09 to 26.08 (H100, B200,
  GB200, and the held-out GB300 and B300), at the switches of the recipe that produced it.
- `bench/data/published_sweeps.csv`: the two published EP-overlap A/Bs on 16 H100 (the only direct measurements
  of what the overlap hides), in the fit too; `bench/bench_sweeps.py` reads them as sweeps.
- `bench/data/published_throughput_extra.csv`: further public rows (NeMo performance summaries 24.03-25.07,
  Megatron-Core examples), each with the release it ran (the reference release's factors where it names none).
- `bench/data/calibration-runs.csv`: papers and READMEs (Narayanan et al. 2021 and Korthikanti et al. 2022
  on A100, the Megatron-LM README's H100 weak-scaling table, the Megatron-MoE-ModelZoo's Qwen3-235B H100 runs); only
  trust A/B rows with a full layout and tokens/s are used. Their training switches, where the source states them:
  the ModelZoo forces balanced routing and names its dispatcher (DeepEP -> flex); Megatron-LM reduces gradients in
  fp32 for bf16 and, in 2024, used its native fused loss; the 2021-2022 A100 runs had no TP communication overlap.
"""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.cost.efficiency import REFERENCE_RELEASE  # noqa: E402
from bench.published_runs import CSV_PATH as PAPER_CSV  # noqa: E402
from bench.published_runs import float_or, job_of, layout_of  # noqa: E402
from bench.recipe_rows import HELD_OUT_GPUS, load_recipe_rows  # noqa: E402
from search_spaces.catalog import get_model  # noqa: E402
from search_spaces.gpus import build_cluster  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.layout import Layout, parse_layout  # noqa: E402
from search_spaces.releases import release_names  # noqa: E402
from search_spaces.training import training_spec  # noqa: E402

__all__ = ["Row", "load_rows", "sweep_rows", "paper_job", "EXTRA_CSV", "SWEEPS_CSV", "HELD_OUT_GPUS"]

DATA = Path(__file__).resolve().parent / "data"
EXTRA_CSV = DATA / "published_throughput_extra.csv"
SWEEPS_CSV = DATA / "published_sweeps.csv"


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    source: str  # "bridge 26.02", "narayanan2021", ...
    model: str  # the model's name (catalog name for Bridge rows)
    gpu: str
    job: Job
    layout: Layout
    published: float  # tokens/s per GPU

    @property
    def held_out(self) -> bool:
        """Blackwell Ultra rows: reported, never fitted (how the model generalises to a GPU from its spec sheet)."""
        return self.gpu in HELD_OUT_GPUS

    @property
    def release(self) -> str:
        return self.job.training.release

    @property
    def config(self) -> tuple[object, ...]:
        """What makes two rows the same run up to the software release (they then share one weight in the fit)."""
        t = replace(self.job.training, release=REFERENCE_RELEASE)
        return (self.model, self.gpu, self.job.world_size, str(self.layout), t)

    @property
    def family(self) -> str:
        """What leave-one-model-out holds out together: a catalog model, or one paper's series of GPT sizes."""
        if self.source == "moe-modelzoo":
            return self.model.lower()  # Qwen3-235B-A22B: the catalog's qwen3-235b-a22b
        return self.model if self.source[:1].isdigit() or "example" in self.source else self.source

    @property
    def moe(self) -> bool:
        return self.job.model.is_moe


def _bridge_rows(path: Path) -> list[Row]:
    if not path.exists():
        return []
    rows = []
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            if r["skip_reason"] or not r["published_tokens_per_s_per_gpu"].strip():
                continue
            tokens = float(r["published_tokens_per_s_per_gpu"])
            gpus = int(r["num_gpus"])
            gpn = 4 if r["gpu"] == "gb200" else 8
            release = r["release"] if r["release"] in release_names() else REFERENCE_RELEASE
            training = training_spec(seq_length=int(r["seq_length"]), global_batch_size=int(r["global_batch_size"]),
                                     precision=r["precision"], fp8_recipe=r["fp8_recipe"] or None, release=release,
                                     **json.loads(r["training"]))
            job = Job(model=get_model(r["model"]), training=training,
                      cluster=build_cluster(nodes=max(gpus // gpn, 1), gpus_per_node=min(gpn, gpus), gpu=r["gpu"]))
            rows.append(Row(source=r["release"], model=r["model"], gpu=r["gpu"], job=job,
                            layout=parse_layout(r["layout"], world_size=gpus), published=tokens))
    return rows


def _paper_recompute(r: dict[str, str]) -> tuple[str, tuple[str, ...] | None]:
    """(Layout.recompute, recompute_modules) of a paper row: 'full...' full; the ModelZoo's module lists
    ('norm, act' -> layernorm + moe_act, 'layernorm'); 'selective (attention...)' core_attn; the 2021 GPT-3 example
    counts the recompute pass in its TFLOP/s, so full."""
    text = r["recompute"].strip().lower()
    if not text and "includes recompute" in r["flops_convention"]:
        return "full", None
    if text.startswith("full"):
        return "full", None
    if text.startswith("selective:"):
        names = {"norm": "layernorm", "layernorm": "layernorm", "act": "moe_act"}
        modules = tuple(dict.fromkeys(names[w.strip()] for w in text.split(":", 1)[1].split(",") if w.strip()))
        return "selective", modules
    if text.startswith("selective"):
        return "selective", ("core_attn",)
    return "none", None


def _paper_rows(path: Path = PAPER_CSV) -> list[Row]:
    rows = []
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            tokens = float_or(r["tokens_per_sec_per_gpu"])
            if tokens is None or r["trust"].strip() not in ("A", "B") or not (r["tp"].strip() and r["pp"].strip()):
                continue
            recompute, _ = _paper_recompute(r)
            rows.append(Row(source=r["source_id"], model=r["model"], gpu=r["gpu_type"].lower(), job=paper_job(r),
                            layout=layout_of(r, recompute), published=tokens))  # type: ignore[arg-type]
    return rows


def paper_job(r: dict[str, str]) -> Job:
    """The Job of one calibration-runs.csv row with the training switches its source's scripts used."""
    _, modules = _paper_recompute(r)
    job = job_of(r)
    source = r["source_id"]
    switches: dict[str, Any] = {}
    if source == "moe-modelzoo":
        switches = {"moe_router_force_load_balancing": True,
                    "moe_token_dispatcher": "flex" if "deepep" in r["moe_dispatcher"].lower() else "alltoall"}
    elif source.startswith("mlm-readme"):
        switches = {"grad_reduce_in_fp32": True, "cross_entropy_fusion": "native"}
    if job.cluster.gpu.arch == "ampere":
        switches = {"tp_comm_overlap": False, "grad_reduce_in_fp32": True, "cross_entropy_fusion": "native"}
    if modules:
        switches["recompute_modules"] = modules
    switches["release"] = REFERENCE_RELEASE  # papers name no NeMo release: the base constants describe them
    return replace(job, training=replace(job.training, **switches))


def _recipe_rows() -> list[Row]:
    return [Row(source=r.release, model=r.job.model.name, gpu=r.gpu, job=r.job, layout=r.layout, published=r.published)
            for r in load_recipe_rows() if not r.skip and r.job is not None and r.layout is not None
            and r.published is not None]


def sweep_rows() -> list[Row]:
    """The published A/B rows of `published_sweeps.csv` that no other file holds, in the file's order."""
    return _bridge_rows(SWEEPS_CSV)


def load_rows() -> list[Row]:
    """Every usable published row: the Bridge tables first, then the other public rows, the A/Bs, the papers."""
    return _recipe_rows() + _bridge_rows(EXTRA_CSV) + sweep_rows() + _paper_rows()

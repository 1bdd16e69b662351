"""The files a finished search leaves beside trials.csv, search.json and study.db (docs/output-files.md).

    best.json                  the winner: layout in megatron-core names, metrics, both launch forms, the job
    best_megatron_bridge.txt   Megatron-Bridge overrides
    best_megatron_lm.txt       Megatron-LM arguments
    report.html + plot PNGs    the self-contained report (`autotune.outputs.report`)

`result_json` is the `--json` object of the search verb (and of `best.json`'s fields).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autotune.outputs.launch import launch_forms
from autotune.tuning.results import GIB, SearchResult, job_summary

__all__ = ["write_outputs", "result_json", "launch_of", "BEST_JSON", "LAUNCH_FILES"]

BEST_JSON = "best.json"
LAUNCH_FILES = {"megatron_bridge": "best_megatron_bridge.txt", "megatron_lm": "best_megatron_lm.txt"}


def launch_of(result: SearchResult) -> dict[str, str]:
    """Both launch forms of the winner ({} when nothing fits)."""
    best = result.best
    return {} if best is None else launch_forms(result.job, best.layout)


def result_json(result: SearchResult, *, top: int = 10) -> dict[str, Any]:
    """The whole search as one JSON-ready object: job, settings, the winner with its launch forms, ranking, trials."""
    best = result.best_record
    return {
        "job": job_summary(result.job),
        "capacity_gib": result.capacity_bytes / GIB, "headroom_gib": result.headroom_bytes / GIB,
        "mode": result.mode, "backend": result.backend, "seed": result.seed, "space_size": result.space_size,
        "interrupted": result.interrupted, "output_dir": result.output_dir, "stats": result.stats,
        "best": None if best is None else {**best.summary(), "launch": launch_of(result)},
        "ranked": [r.summary() for r in result.ranked[:top]],
        "pareto": [r.summary() for r in result.pareto],
        "trials": [r.summary() for r in result.records],
    }


def write_outputs(result: SearchResult, folder: str | Path) -> None:
    """best.json, the two launch files and the report (trials.csv and study.db are written while the search runs)."""
    from autotune.outputs.report import write_report

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    best = result.best_record
    launch = launch_of(result)
    payload = None if best is None else {**best.summary(), "launch": launch, "job": job_summary(result.job)}
    (folder / BEST_JSON).write_text(json.dumps(payload, indent=2, default=str) + "\n")
    for key, name in LAUNCH_FILES.items():
        (folder / name).write_text((launch[key] + "\n") if launch else "# no layout fits; see trials.csv\n")
    write_report(result, folder)  # report.html and the four plot PNGs

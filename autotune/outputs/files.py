"""The files a finished search leaves beside trials.csv, search.json and study.db (docs/output-files.md).

    best.json                  the winner: layout in megatron-core names, metrics, both launch forms, the job
    best_megatron_bridge.txt   Megatron-Bridge overrides
    best_megatron_lm.txt       Megatron-LM arguments
    report.html + plot PNGs    the self-contained report (`autotune.outputs.report`)

`result_json` is the `--json` object of the search verb (and of `best.json`'s fields).

Every file is written atomically (`autotune.tuning.run_folder.atomic_write`: temp file, fsync, rename): a kill
or a full disk leaves the previous file or none, never half of one, and a failed write raises `OutputError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from autotune.outputs.launch import launch_forms
from autotune.tuning.answer import SearchResult
from autotune.tuning.results import job_summary
from autotune.tuning.run_folder import OutputError, atomic_write
from search_spaces.units import GIB

__all__ = ["write_outputs", "result_json", "launch_of", "BEST_JSON", "LAUNCH_FILES"]

BEST_JSON = "best.json"
LAUNCH_FILES = {"megatron_bridge": "best_megatron_bridge.txt", "megatron_lm": "best_megatron_lm.txt"}


def launch_of(result: SearchResult) -> dict[str, str]:
    """Both launch forms of the winner ({} when nothing fits)."""
    best = result.best
    return {} if best is None else launch_forms(result.job, best.layout)


def result_json(result: SearchResult, *, top: int = 10) -> dict[str, Any]:
    """The whole search as one JSON-ready object: job, settings, the winner with its launch forms, ranking, trials
    (all from `result.answer`: `ranked[0]` is the pick)."""
    answer, training = result.answer, result.job.training
    best = answer.pick
    return {
        "job": job_summary(result.job),
        "capacity_gib": result.capacity_bytes / GIB, "headroom_gib": result.headroom_bytes / GIB,
        "mode": result.mode, "backend": result.backend, "seed": result.seed, "space_size": result.space_size,
        "interrupted": result.interrupted, "output_dir": result.output_dir, "stats": result.stats,
        "best": None if best is None else {**best.summary(training), "launch": launch_of(result)},
        "decision": answer.decision.to_dict(),
        "ranked": [_ranked(answer, r, training) for r in answer.ranked[:top]],
        "pareto": [_ranked(answer, r, training) for r in answer.pareto],
        "yours": answer.decision.to_dict().get("yours", []),
        "trials": [r.summary(training) for r in result.records],
    }


def _ranked(answer: Any, r: Any, training: Any) -> dict[str, Any]:
    return {**r.summary(training), "pick": answer.is_pick(r.layout), "tied": answer.is_tied(r.layout),
            **({"proxy": r.measurement.extra["proxy"]} if "proxy" in r.measurement.extra else {})}


def write_outputs(result: SearchResult, folder: str | Path) -> None:
    """best.json, the two launch files and the report (trials.csv and study.db are written while the search runs).

    Raises `OutputError` (an OSError naming the file) when one cannot be written.
    """
    folder = Path(folder)
    best = result.best_record
    launch = launch_of(result)
    payload = None if best is None else {**best.summary(result.job.training), "launch": launch,
                                         "job": job_summary(result.job), "decision": result.answer.decision.to_dict()}
    atomic_write(folder / BEST_JSON, json.dumps(payload, indent=2, default=str) + "\n")
    for key, name in LAUNCH_FILES.items():
        atomic_write(folder / name, (launch[key] + "\n") if launch else "# no layout fits; see trials.csv\n")
    if result.records:  # with no trial at all (no valid layout) there is nothing to plot
        _write_report_atomically(result, folder)


def _write_report_atomically(result: SearchResult, folder: Path) -> None:
    """report.html and the plot PNGs, drawn into a temporary folder beside them and renamed in one by one."""
    from autotune.outputs.report import write_report
    from autotune.outputs.view import Result

    try:
        staging = Path(tempfile.mkdtemp(prefix=".report-", dir=folder))
    except OSError as e:
        raise OutputError(e.errno, f"cannot write the report in {folder}: {e.strerror or e}") from None
    try:
        try:
            write_report(Result(result), staging)  # report.html and the four plot PNGs
        except OSError as e:
            raise OutputError(e.errno, f"cannot write the report in {folder}: {e.strerror or e}") from None
        for path in sorted(staging.iterdir()):
            try:
                with open(path, "rb+") as f:
                    os.fsync(f.fileno())
                os.replace(path, folder / path.name)
            except OSError as e:
                raise OutputError(e.errno, f"cannot write {folder / path.name}: {e.strerror or e}") from None
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)

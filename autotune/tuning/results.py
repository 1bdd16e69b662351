"""A search's results: one record per trial, the Pareto front, the best layout, and the output folder.

The folder a run writes (docs/output-files.md):

    trials.csv                 one row per trial: layout, metrics, status, failure reason (appended and
                               fsynced as each trial finishes, so a killed driver loses nothing finished)
    best.json                  the winner: layout in megatron-core names, metrics, both launch forms
    best_megatron_bridge.txt   Megatron-Bridge overrides (`model.tensor_model_parallel_size=2 ...`)
    best_megatron_lm.txt       Megatron-LM arguments (`--tensor-model-parallel-size 2 ...`)
    search.json                settings, the job's fingerprint, counts, timings, and whether it completed
    study.db                   the Optuna study (SQLite storage; `optuna-dashboard sqlite:///study.db`)

`read_trials(folder)` reads trials.csv back into records (for --resume and for a finished search
asked again).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autotune.tuning.ranking import pareto_rows
from autotune.tuning.run_folder import OutputError, atomic_write
from search_spaces.job import Job
from search_spaces.layout import Layout, parse_layout
from search_spaces.measurement import Measurement
from search_spaces.megatron_names import megatron_settings
from search_spaces.units import GIB

if TYPE_CHECKING:
    from search_spaces.training import TrainingSpec

__all__ = ["TrialRecord", "TrialLog", "pareto_front", "counted", "read_trials", "read_meta", "write_meta",
           "job_fingerprint", "TRIALS_CSV", "META_JSON", "STUDY_DB", "CALIBRATION_YAML", "CSV_COLUMNS"]

TRIALS_CSV, META_JSON, STUDY_DB = "trials.csv", "search.json", "study.db"
CALIBRATION_YAML = "calibration.yaml"  # what a measured search on GPUs learned (`autotune.tuning.measured_calibration`)
LAYOUT_COLUMNS = tuple(f.name for f in fields(Layout))  # tp, pp, vpp, cp, ep, etp, dp, mbs, sp, dist_opt, ...
CSV_COLUMNS = ("number", "job", "origin", "layout", *LAYOUT_COLUMNS, "status", "feasible", "reason",
               "tokens_per_s_per_gpu", "mfu", "tflops_per_gpu", "memory_gib", "headroom_gib", "step_time_s",
               "dominant_time", "source", "wall_s", "time_breakdown_s", "memory_breakdown_gib",
               # megatron backend: the analytic model's figures for the real model, beside the measured ones
               "predicted_tokens_per_s_per_gpu", "predicted_memory_gib", "node",
               # a failure's kind (layout / infrastructure / placement; "infrastructure (retried)": a lost attempt,
               # run again in the next row), and the Ray node of each rank of a measuring backend (JSON list)
               "failure", "rank_nodes")
# what a row needs to be read back (record_from_row); the per-field layout columns are a convenience
REQUIRED_COLUMNS = ("number", "job", "origin", "layout", "status", "feasible", "reason", "tokens_per_s_per_gpu", "mfu",
                    "tflops_per_gpu", "memory_gib", "step_time_s", "dominant_time", "source", "wall_s",
                    "time_breakdown_s", "memory_breakdown_gib")
FIELD_SIZE_LIMIT = 16 * 1024**2  # csv's default is 128 KiB; a row of ours is a few KiB


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRecord:
    """One finished trial. `feasible`: status ok and peak memory within capacity minus headroom."""

    number: int
    origin: str  # "seed", "search", "user", "exhaustive"
    measurement: Measurement
    feasible: bool
    capacity_bytes: float  # GPU memory minus the headroom
    wall_s: float = 0.0
    job: str = ""  # the job's fingerprint (`job_fingerprint`): resume refuses rows of another job
    node: str = ""  # the Ray node that ran the trial (its node id), when known

    @property
    def layout(self) -> Layout:
        return self.measurement.layout

    @property
    def headroom_gib(self) -> float | None:
        m = self.measurement.memory_bytes
        return None if m is None else (self.capacity_bytes - m) / GIB

    def row(self) -> dict[str, object]:
        m, lay = self.measurement, self.measurement.layout
        row: dict[str, object] = {"number": self.number, "job": self.job, "origin": self.origin, "layout": str(lay)}
        row.update({k: _cell(v) for k, v in lay.short_dict().items()})
        row.update({
            "status": m.status, "feasible": _cell(self.feasible), "reason": _one_line(m.reason),
            "tokens_per_s_per_gpu": _num(m.tokens_per_s_per_gpu), "mfu": _num(m.mfu),
            "tflops_per_gpu": _num(m.tflops_per_gpu), "memory_gib": _num(m.memory_gib),
            "headroom_gib": _num(self.headroom_gib), "step_time_s": _num(m.step_time_s),
            "dominant_time": m.extra.get("dominant_time", ""), "source": m.source, "wall_s": round(self.wall_s, 4),
            "time_breakdown_s": json.dumps(m.time, sort_keys=True),
            "memory_breakdown_gib": json.dumps({k: v / GIB for k, v in m.memory.items()}, sort_keys=True),
        })
        predicted = _predicted(m)
        row["predicted_tokens_per_s_per_gpu"] = _num(predicted.get("tokens_per_s_per_gpu"))
        row["predicted_memory_gib"] = _num(None if predicted.get("memory_bytes") is None
                                           else predicted["memory_bytes"] / GIB)
        row["node"] = self.node
        failure = str(m.extra.get("failure") or "")
        row["failure"] = f"{failure} (retried)" if failure and m.extra.get("retried") else failure
        nodes = m.extra.get("worker_nodes")
        row["rank_nodes"] = json.dumps(nodes) if nodes else ""
        return row

    def summary(self, training: TrainingSpec | None = None) -> dict[str, object]:
        """Layout (megatron-core names, with what the job's `training` optimizer changes in them) and metrics, for
        JSON."""
        m = self.measurement
        return {"layout": megatron_settings(m.layout, training), "layout_text": str(m.layout), "origin": self.origin,
                "status": m.status, "feasible": self.feasible, "reason": m.reason,
                "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu, "mfu": m.mfu, "tflops_per_gpu": m.tflops_per_gpu,
                "memory_gib": m.memory_gib, "headroom_gib": self.headroom_gib, "step_time_s": m.step_time_s,
                "dominant_time": m.extra.get("dominant_time"), "source": m.source, "number": self.number,
                **({"predicted": _predicted(m)} if _predicted(m) else {})}


def _predicted(m: Measurement) -> dict[str, Any]:
    """The analytic prediction a profiling backend puts beside its measurement (empty for the analytic backend)."""
    p = m.extra.get("analytic_prediction")
    return p if isinstance(p, dict) else {}


def _cell(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _one_line(text: str) -> str:
    """Rows stay one physical line each (so a torn last line is exactly the text after the last newline)."""
    return " ".join(str(text).split("\n")).replace("\r", " ")


def _num(value: float | None) -> object:
    return "" if value is None else float(value)


def _opt_float(text: str) -> float | None:
    return None if text in ("", None) else float(text)


def record_from_row(row: dict[str, str], capacity_bytes: float) -> TrialRecord:
    """Inverse of `TrialRecord.row` (breakdowns back in bytes and seconds)."""
    layout = parse_layout(row["layout"])
    memory_gib = _opt_float(row["memory_gib"])
    extra: dict[str, object] = {"dominant_time": row["dominant_time"]} if row.get("dominant_time") else {}
    predicted_tps, predicted_gib = _opt_float(row.get("predicted_tokens_per_s_per_gpu", "")), \
        _opt_float(row.get("predicted_memory_gib", ""))
    if predicted_tps is not None or predicted_gib is not None:
        extra["analytic_prediction"] = {"tokens_per_s_per_gpu": predicted_tps,
                                        "memory_bytes": None if predicted_gib is None else predicted_gib * GIB}
    failure = row.get("failure") or ""
    if failure:
        extra["failure"] = failure.removesuffix(" (retried)")
        extra["retried"] = failure.endswith(" (retried)")
    if row.get("rank_nodes"):
        extra["worker_nodes"] = json.loads(row["rank_nodes"])
    memory = {k: v * GIB for k, v in json.loads(row["memory_breakdown_gib"] or "{}").items()}
    memory_bytes = None if memory_gib is None else memory_gib * GIB
    m = Measurement(
        layout=layout, status=row["status"], source=row["source"] or "analytic", reason=row["reason"],  # type: ignore[arg-type]
        memory_bytes=memory_bytes, memory=memory,
        allocated_bytes=None if memory_bytes is None or "overhead" not in memory else memory_bytes - memory["overhead"],
        step_time_s=_opt_float(row["step_time_s"]), time=json.loads(row["time_breakdown_s"] or "{}"),
        tokens_per_s_per_gpu=_opt_float(row["tokens_per_s_per_gpu"]), tflops_per_gpu=_opt_float(row["tflops_per_gpu"]),
        mfu=_opt_float(row["mfu"]), extra=extra)
    return TrialRecord(number=int(row["number"]), origin=row["origin"], measurement=m,
                       feasible=row["feasible"] == "true", capacity_bytes=capacity_bytes,
                       wall_s=float(row["wall_s"] or 0.0), job=row["job"], node=row.get("node") or "")


def _header_problem(header: list[str]) -> str:
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    unknown = [c for c in header if c not in CSV_COLUMNS]
    if missing or unknown or len(set(header)) != len(header):
        return (f"its header is not autotune's (missing {missing}, unknown {unknown[:5]}); it is damaged or from "
                f"another version")
    return ""


def _split_rows(path: Path) -> tuple[list[str], str]:
    """(complete lines, torn tail): every row is one line ending in a newline, so a kill mid-write leaves a tail."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    return [line.rstrip("\r") for line in lines[:-1]], lines[-1]


def _parse_line(line: str) -> list[str]:
    csv.field_size_limit(FIELD_SIZE_LIMIT)
    return next(csv.reader([line]), [])


class TrialLog:
    """trials.csv, appended one row per finished trial and fsynced (a SIGKILL loses nothing finished).

    Opening an existing file checks its header (ValueError naming the file when it is not autotune's) and cuts
    a torn last line (a kill mid-write) before anything is appended. A failed write raises `OutputError`.
    """

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / TRIALS_CSV
        self.columns: tuple[str, ...] = CSV_COLUMNS
        try:
            if self.path.exists() and self.path.stat().st_size > 0:
                self._repair()
            new = not self.path.exists() or self.path.stat().st_size == 0
            self._file = open(self.path, "a", newline="", encoding="utf-8")
        except OSError as e:
            raise OutputError(e.errno, f"cannot open {self.path} for writing: {e.strerror or e}") from None
        if new:
            self._write(",".join(self.columns) + "\r\n")

    def _repair(self) -> None:
        lines, tail = _split_rows(self.path)
        header = _parse_line(lines[0]) if lines else []
        if lines and _header_problem(header):
            raise ValueError(f"{self.path}: {_header_problem(header)}; move it away to start afresh.")
        if header:
            self.columns = tuple(header)
        if tail:  # a torn last line: cut it (its trial is not finished as far as the record goes)
            with open(self.path, "r+b") as f:
                size = f.seek(0, os.SEEK_END)
                f.truncate(size - len(tail.encode("utf-8")))
                f.flush()
                os.fsync(f.fileno())

    def _write(self, text: str) -> None:
        try:
            self._file.write(text)
            self._file.flush()
        except OSError as e:
            raise OutputError(e.errno, f"cannot write {self.path}: {e.strerror or e}") from None

    def append(self, record: TrialRecord, *, sync: bool = True) -> None:
        """Add one row; `sync=False` defers the fsync to `sync()` (one per Tune trial, which may hold a batch)."""
        buffer = io.StringIO()
        csv.DictWriter(buffer, fieldnames=self.columns, extrasaction="ignore").writerow(record.row())
        self._write(buffer.getvalue())
        if sync:
            self.sync()

    def sync(self) -> None:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as e:
            raise OutputError(e.errno, f"cannot write {self.path}: {e.strerror or e}") from None

    def close(self) -> None:
        if not self._file.closed:
            with contextlib.suppress(OSError):  # the error, if any, was raised by the write that hit it
                self._file.close()


def read_trials(folder: str | Path, capacity_bytes: float, *, job: str | None = None) -> list[TrialRecord]:
    """Records of a folder's trials.csv ([] when there is none); a torn last line is left out.

    ValueError naming the file (and line) for a damaged header or row, and, with `job` (a fingerprint), for a
    row of another job: resume never mixes two searches.
    """
    path = Path(folder) / TRIALS_CSV
    if not path.exists():
        return []
    try:
        lines, _torn = _split_rows(path)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}.") from None
    if not lines:
        return []
    try:
        header = _parse_line(lines[0])
    except csv.Error as e:
        raise ValueError(f"{path}: line 1 (the header) is damaged: {e}.") from None
    problem = _header_problem(header)
    if problem:
        raise ValueError(f"{path}: {problem}; move it away to start afresh.")
    records = []
    for number, line in enumerate(lines[1:], start=2):
        try:
            cells = _parse_line(line)
            if len(cells) != len(header):
                raise ValueError(f"{len(cells)} fields, the header has {len(header)}")
            row = dict(zip(header, cells, strict=False))
            if job is not None and row["job"] != job:
                raise _OtherJob(row["job"])
            records.append(record_from_row(row, capacity_bytes))
        except _OtherJob as e:
            raise ValueError(f"{path}: line {number} is a trial of another job (fingerprint {str(e) or 'none'}, "
                             f"this search is {job}); two searches were mixed in this folder, so it cannot be "
                             f"resumed.") from None
        except (KeyError, ValueError, TypeError, csv.Error, json.JSONDecodeError, AttributeError) as e:
            raise ValueError(f"{path}: line {number} is damaged ({str(e)[:200]}).") from None
    return records


class _OtherJob(Exception):
    pass


def job_fingerprint(job: Job) -> str:
    return hashlib.sha1(repr(job).encode()).hexdigest()[:16]


def write_meta(folder: str | Path, meta: dict[str, Any]) -> None:
    """search.json, replaced atomically (OutputError when it cannot be written)."""
    atomic_write(Path(folder) / META_JSON, json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")


META_TYPES: dict[str, tuple[type, ...]] = {"fingerprint": (str,), "job": (dict,), "trials": (int,), "seed": (int,),
                                           "mode": (str,), "naming": (str,), "headroom_bytes": (int, float)}


def read_meta(folder: str | Path) -> dict[str, Any] | None:
    """search.json (None when there is none); ValueError naming the file when it is damaged or incomplete."""
    path = Path(folder) / META_JSON
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} cannot be read as JSON ({e}); it is damaged.") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path} does not hold an autotune search (expected a JSON object).")
    for key, types in META_TYPES.items():
        value = meta.get(key)
        if value is None or isinstance(value, bool) or not isinstance(value, types):
            raise ValueError(f"{path} is damaged or not autotune's: `{key}` is missing or not a "
                             f"{'/'.join(t.__name__ for t in types)} (got {value!r:.60}).")
    if meta["mode"] not in ("analytic", "search", "exhaustive"):
        raise ValueError(f"{path} is damaged: `mode` must be analytic, search or exhaustive, but got "
                         f"{meta['mode']!r:.60}.")
    if meta["trials"] < 1 or meta["headroom_bytes"] < 0 or not math.isfinite(meta["headroom_bytes"]):
        raise ValueError(f"{path} is damaged: trials={meta['trials']!r}, headroom_bytes={meta['headroom_bytes']!r}.")
    return meta


def distinct_feasible(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    """Feasible records, one per layout (the first seen), fastest first (ties: less memory)."""
    seen: dict[Layout, TrialRecord] = {}
    for r in records:
        if r.feasible and r.layout not in seen:
            seen[r.layout] = r
    return sorted(seen.values(), key=lambda r: (-(r.measurement.tokens_per_s_per_gpu or 0.0),
                                                 r.measurement.memory_bytes or 0.0, str(r.layout)))


def pareto_front(records: Iterable[TrialRecord], resolution: float = 0.0) -> list[TrialRecord]:
    """Feasible layouts no other feasible one beats on both tokens/s per GPU and memory (`ranking.pareto_rows`, at
    the memory `resolution`); by memory, then layout."""
    distinct = distinct_feasible(records)
    tokens = np.array([r.measurement.tokens_per_s_per_gpu or 0.0 for r in distinct])
    memory = np.array([r.measurement.memory_bytes or 0.0 for r in distinct])
    front = [distinct[int(i)] for i in pareto_rows(tokens, memory, np.ones(len(distinct), dtype=bool), resolution)]
    return sorted(front, key=lambda r: (r.measurement.memory_bytes or 0.0, str(r.layout)))


def counted(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The records that count against the budget: every one but the lost attempts (an infrastructure failure that
    ran again: `extra["retried"]`, `infrastructure (retried)` in trials.csv)."""
    return [r for r in records if not r.measurement.extra.get("retried")]


def job_summary(job: Job) -> dict[str, Any]:
    """The job as plain data (search.json, best.json): model, cluster, and every training field."""
    c, t = job.cluster, job.training
    training = {name: (list(v) if isinstance(v, tuple) else v) for name, v in
                ((f.name, getattr(t, f.name)) for f in fields(t))}
    return {"model": job.model.name, "nodes": c.nodes, "gpus_per_node": c.gpus_per_node, "gpu": c.gpu.name,
            "gpu_memory_gib": c.gpu.memory_gib, "intra_node": c.intra_node.name, "inter_node": c.inter_node.name,
            "world_size": job.world_size, "seq_length": t.seq_length, "global_batch_size": t.global_batch_size,
            "precision": t.precision, "fp8_recipe": job.fp8_recipe, "training": training,
            "fingerprint": job_fingerprint(job)}

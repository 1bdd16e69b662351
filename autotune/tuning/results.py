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

import csv
import hashlib
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from search_spaces.job import Job
from search_spaces.layout import Layout, parse_layout

from search_spaces.measurement import Measurement

__all__ = ["TrialRecord", "TrialLog", "SearchResult", "pareto_front", "read_trials", "read_meta", "write_meta",
           "job_fingerprint", "TRIALS_CSV", "META_JSON", "STUDY_DB", "CSV_COLUMNS"]

GIB = 1024**3
TRIALS_CSV, META_JSON, STUDY_DB = "trials.csv", "search.json", "study.db"
LAYOUT_COLUMNS = tuple(f.name for f in fields(Layout))  # tp, pp, vpp, cp, ep, etp, dp, mbs, sp, dist_opt, ...
CSV_COLUMNS = ("number", "origin", "layout", *LAYOUT_COLUMNS, "status", "feasible", "reason", "tokens_per_s_per_gpu",
               "mfu", "tflops_per_gpu", "memory_gib", "headroom_gib", "step_time_s", "dominant_time", "source",
               "wall_s", "time_breakdown_s", "memory_breakdown_gib",
               # megatron backend: the analytic model's figures for the real model, beside the measured ones
               "predicted_tokens_per_s_per_gpu", "predicted_memory_gib")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRecord:
    """One finished trial. `feasible`: status ok and peak memory within capacity minus headroom."""

    number: int
    origin: str  # "seed", "search", "user", "exhaustive"
    measurement: Measurement
    feasible: bool
    capacity_bytes: float  # GPU memory minus the headroom
    wall_s: float = 0.0

    @property
    def layout(self) -> Layout:
        return self.measurement.layout

    @property
    def headroom_gib(self) -> float | None:
        m = self.measurement.memory_bytes
        return None if m is None else (self.capacity_bytes - m) / GIB

    def row(self) -> dict[str, object]:
        m, lay = self.measurement, self.measurement.layout
        row: dict[str, object] = {"number": self.number, "origin": self.origin, "layout": str(lay)}
        row.update({k: _cell(v) for k, v in lay.short_dict().items()})
        row.update({
            "status": m.status, "feasible": _cell(self.feasible), "reason": m.reason,
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
        return row

    def summary(self) -> dict[str, object]:
        """Layout (megatron-core names) and metrics, for JSON."""
        m = self.measurement
        return {"layout": m.layout.to_megatron(), "layout_text": str(m.layout), "origin": self.origin,
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
                       wall_s=float(row["wall_s"] or 0.0))


class TrialLog:
    """trials.csv, appended one row per finished trial and fsynced (a SIGKILL loses nothing finished)."""

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / TRIALS_CSV
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file = open(self.path, "a", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._file, fieldnames=CSV_COLUMNS)
        if new:
            self._writer.writeheader()
            self.sync()

    def append(self, record: TrialRecord, *, sync: bool = True) -> None:
        """Add one row; `sync=False` defers the fsync to `sync()` (one per Tune trial, which may hold a batch)."""
        self._writer.writerow(record.row())
        if sync:
            self.sync()

    def sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def read_trials(folder: str | Path, capacity_bytes: float) -> list[TrialRecord]:
    """Records of a folder's trials.csv ([] when there is none); a torn last line is skipped."""
    path = Path(folder) / TRIALS_CSV
    if not path.exists():
        return []
    records = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if None in row.values() or None in row:
                continue  # a line cut short (or run on) by a kill
            try:
                records.append(record_from_row(row, capacity_bytes))
            except (KeyError, ValueError, TypeError, json.JSONDecodeError):
                continue  # a line cut short by a kill
    return records


def job_fingerprint(job: Job) -> str:
    return hashlib.sha1(repr(job).encode()).hexdigest()[:16]


def write_meta(folder: str | Path, meta: dict[str, Any]) -> None:
    path = Path(folder) / META_JSON
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def read_meta(folder: str | Path) -> dict[str, Any] | None:
    path = Path(folder) / META_JSON
    return json.loads(path.read_text()) if path.exists() else None


def distinct_feasible(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    """Feasible records, one per layout (the first seen), fastest first (ties: less memory)."""
    seen: dict[Layout, TrialRecord] = {}
    for r in records:
        if r.feasible and r.layout not in seen:
            seen[r.layout] = r
    return sorted(seen.values(), key=lambda r: (-(r.measurement.tokens_per_s_per_gpu or 0.0),
                                                 r.measurement.memory_bytes or 0.0, str(r.layout)))


def pareto_front(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    """Feasible layouts no other feasible one beats on both tokens/s per GPU and memory; by memory."""
    # One sweep, fastest first (ties: less memory first): a record is on the front when it needs less memory
    # than every faster one; equal metrics are kept together (neither dominates). O(n log n), not O(n^2).
    front: list[TrialRecord] = []
    best_mem, best_t = math.inf, math.inf
    for r in distinct_feasible(records):
        t, m = r.measurement.tokens_per_s_per_gpu or 0.0, r.measurement.memory_bytes or 0.0
        if m < best_mem or (m == best_mem and t == best_t):
            front.append(r)
            best_mem, best_t = m, t
    return sorted(front, key=lambda r: (r.measurement.memory_bytes or 0.0, str(r.layout)))


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """What a search found. `best` is the fastest feasible measurement (None when nothing fits)."""

    job: Job
    records: tuple[TrialRecord, ...]
    capacity_bytes: float
    headroom_bytes: float
    mode: str  # "search" or "exhaustive"
    backend: str
    seed: int
    space_size: int
    stats: dict[str, Any] = field(default_factory=dict)  # proposals, invalid_proposals, duplicates, timings
    interrupted: bool = False
    output_dir: str | None = None

    @property
    def measurements(self) -> list[Measurement]:
        return [r.measurement for r in self.records]

    @property
    def ranked(self) -> list[TrialRecord]:
        return distinct_feasible(self.records)

    @property
    def best_record(self) -> TrialRecord | None:
        ranked = self.ranked
        return ranked[0] if ranked else None

    @property
    def best(self) -> Measurement | None:
        r = self.best_record
        return None if r is None else r.measurement

    @property
    def pareto(self) -> list[TrialRecord]:
        return pareto_front(self.records)

    def closest_misses(self, k: int = 5) -> list[TrialRecord]:
        """Infeasible trials with a memory figure, least memory first: what came nearest to fitting."""
        misses = {r.layout: r for r in self.records if not r.feasible and r.measurement.memory_bytes is not None}
        return sorted(misses.values(), key=lambda r: r.measurement.memory_bytes or 0.0)[:k]


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

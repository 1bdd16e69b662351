"""Score many layouts of one job at once; estimating one layout is the one-row case.

    scores = score_layouts(job, LayoutTable.from_space(feasible_space(job)), headroom_bytes=0.0)
    scores.tokens_per_s_per_gpu[i], scores.total_bytes[i], scores.fits[i], scores.measurement(i)
    estimate_time(job, layout), estimate_memory(job, layout)     # the same figures for one Layout

Row i gets the step time and every breakdown term, tokens/s per GPU with its band, TFLOP/s, MFU
(`autotune/cost/step_time.py`, the one step-time assembly); the allocated and device peaks, their six terms, the
peak stage and phase (`autotune/cost/peak_memory.py`, the one memory assembly); and `AnalyticBackend`'s verdict (ok,
or oom above capacity minus headroom). The rows are assumed valid (the feasible space builds only valid layouts);
rules are not checked here. No Python object is made per layout on the hot path: each term is computed once per
distinct value of the layout fields it reads (`autotune/cost/groups.py`). A table of `PARALLEL_ROWS` or more is
scored in two halves that share no layer shape, one in a forked child on the second core where forking is safe
(`search_spaces.forked`); the figures are the single pass's, bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.cost.efficiency import DEFAULT_CALIBRATION, Calibration
from autotune.cost.flops import model_flops_per_step
from autotune.cost.groups import Rows, group
from autotune.cost.layout_table import LayoutTable
from autotune.cost.memory import DEFAULT_ASSUMPTIONS, TERMS, MemoryAssumptions, MemoryEstimate, memory_status
from autotune.cost.peak_memory import OVERHEAD_TERMS, peak_memory
from autotune.cost.step_time import step_times
from autotune.cost.throughput import TIME_KEYS, TimeEstimate
from search_spaces.forked import start_forked
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.measurement import Measurement

__all__ = ["Scores", "score_layouts", "OVERHEAD_TERMS", "estimate_time", "estimate_memory", "estimate_memory_per_stage"]



@dataclass(frozen=True, eq=False, slots=True)
class Scores:
    """Per-row figures of `score_layouts` (arrays aligned with `table`); names as in TimeEstimate / MemoryEstimate."""

    job: Job
    table: LayoutTable
    capacity_bytes: float
    step_time_s: np.ndarray
    breakdown: Mapping[str, np.ndarray]  # TIME_KEYS -> seconds per step
    tokens_per_s_per_gpu: np.ndarray
    tokens_per_s_per_gpu_low: np.ndarray
    tokens_per_s_per_gpu_high: np.ndarray
    tflops_per_gpu: np.ndarray
    mfu: np.ndarray
    model_flops_per_step: float
    memory: Mapping[str, np.ndarray]  # TERMS -> bytes on the peak GPU
    overhead_terms: Mapping[str, np.ndarray]  # OVERHEAD_TERMS -> bytes
    allocated_bytes: np.ndarray
    total_bytes: np.ndarray  # device memory at the peak: what must fit
    host_bytes: np.ndarray  # host memory per GPU of the offloaded activations: must fit the host's (when known)
    memory_stage: np.ndarray
    optimizer_phase: np.ndarray  # True where the optimizer step is the memory peak
    params_per_gpu: np.ndarray
    dominant_time_index: np.ndarray  # into TIME_KEYS (0, "compute", when every other term is 0)
    dominant_memory_index: np.ndarray  # into TERMS

    def __len__(self) -> int:
        return len(self.table)

    @property
    def fits(self) -> np.ndarray:
        """AnalyticBackend's verdict (`memory.memory_status`): ok where the device peak is at most capacity (GPU
        memory minus headroom) and the offloaded activations fit the host memory per GPU (when known)."""
        host = self.job.cluster.gpu.host_memory_bytes
        device = self.total_bytes <= self.capacity_bytes
        return device if host is None else device & (self.host_bytes <= host)

    @property
    def overflow(self) -> np.ndarray:
        """How far each row is from fitting, as the larger of device peak / capacity and offloaded activations /
        host memory per GPU (when known): at most 1 where it fits."""
        host = self.job.cluster.gpu.host_memory_bytes
        device = self.total_bytes / max(self.capacity_bytes, 1.0)
        return device if host is None else np.maximum(device, self.host_bytes / host)

    def status(self, i: int) -> str:
        return "ok" if self.fits[i] else "oom"

    def dominant_time(self, i: int) -> str:
        return TIME_KEYS[int(self.dominant_time_index[i])]

    def dominant_memory(self, i: int) -> str:
        return TERMS[int(self.dominant_memory_index[i])]

    def measurement(self, i: int, layout: Layout | None = None) -> Measurement:
        """Row i as the Measurement `AnalyticBackend(headroom_bytes=...).evaluate(job, layout)` returns."""
        layout = self.table.layout(i) if layout is None else layout
        peak = float(self.total_bytes[i])
        status, reason = memory_status(self.job, peak, self.capacity_bytes, float(self.host_bytes[i]),
                                       self.dominant_memory(i))
        return Measurement(
            layout=layout, status=status, source="analytic", reason=reason,  # type: ignore[arg-type]
            memory_bytes=peak, allocated_bytes=float(self.allocated_bytes[i]),
            memory={t: float(self.memory[t][i]) for t in TERMS},
            step_time_s=float(self.step_time_s[i]), time={k: float(self.breakdown[k][i]) for k in TIME_KEYS},
            tokens_per_s_per_gpu=float(self.tokens_per_s_per_gpu[i]), tflops_per_gpu=float(self.tflops_per_gpu[i]),
            mfu=float(self.mfu[i]),
            extra={"dominant_time": self.dominant_time(i), "dominant_memory": self.dominant_memory(i),
                   "tokens_per_s_per_gpu_low": float(self.tokens_per_s_per_gpu_low[i]),
                   "tokens_per_s_per_gpu_high": float(self.tokens_per_s_per_gpu_high[i]),
                   "model_flops_per_step": self.model_flops_per_step, "memory_stage": int(self.memory_stage[i]),
                   "memory_phase": "optimizer step" if self.optimizer_phase[i] else "activations",
                   "memory_overhead": {t: float(self.overhead_terms[t][i]) for t in OVERHEAD_TERMS},
                   "offload_host_bytes": float(self.host_bytes[i])},
        )


def score_layouts(job: Job, table: LayoutTable, *, cal: Calibration = DEFAULT_CALIBRATION,
                  assumptions: MemoryAssumptions = DEFAULT_ASSUMPTIONS, headroom_bytes: float = 0.0,
                  time_for: str = "all") -> Scores:
    """Every row of `table` scored as the scalar models score it (see the module docstring).

    `time_for="fits"` computes the step time only for the rows whose device peak fits (memory first; the others'
    time figures are NaN): most of a large space does not fit, and the per-layer terms are the costly part."""
    if time_for not in ("all", "fits"):
        raise ValueError(f"time_for must be 'all' or 'fits', but got {time_for!r}.")
    capacity = job.cluster.gpu.memory_bytes - float(headroom_bytes)
    if len(table) == 0:
        return _empty(job, table, capacity)
    halves = _halves(table) if len(table) >= PARALLEL_ROWS else None
    if halves is not None and len(halves[0]) and len(halves[1]):
        def theirs() -> dict[str, Any]:
            return _scored(job, table.take(halves[1]), cal, assumptions, capacity, time_for)

        child = start_forked(theirs)
        if child is not None:
            try:
                mine = _scored(job, table.take(halves[0]), cal, assumptions, capacity, time_for)
            except BaseException:  # this half failed (or Ctrl-C): the child's half is of no use
                child.cancel()
                raise
            return _merged(job, table, capacity, halves, (mine, child.result()))
    return Scores(job=job, table=table, capacity_bytes=capacity,
                  **_scored(job, table, cal, assumptions, capacity, time_for))


# a table this large is scored in two halves, one in a forked child (`search_spaces.forked`), on the machine's
# second core: below it the fork and the transfer of the child's arrays cost more than the half saves (a table
# whose rows all share one shape is scored whole)
PARALLEL_ROWS = 20_000


def _halves(table: LayoutTable) -> tuple[np.ndarray, np.ndarray]:
    """The rows of `table` in two sets that share no TP, CP, EP, expert-TP and micro-batch size, alternating over
    those shapes: the per-layer times (`throughput._blocks`) and most memory terms are memoised per shape, so
    each half computes its own."""
    shape = group(table.tp, table.cp, table.ep, table.expert_tp, table.mbs)
    odd = (shape.inverse % 2).astype(bool)
    return np.flatnonzero(~odd), np.flatnonzero(odd)


def _scored(job: Job, table: LayoutTable, cal: Calibration, assumptions: MemoryAssumptions, capacity: float,
            time_for: str) -> dict[str, Any]:
    """The fields of `Scores` beyond job, table and capacity, for every row of `table`."""
    t = Rows(table)
    memory = peak_memory(job, t, assumptions)
    if time_for == "all" or len(table) == 0:
        time = step_times(job, t, cal)
    else:
        rows = np.flatnonzero(memory["total_bytes"] <= capacity)
        time = _spread(step_times(job, Rows(table.take(rows)), cal) if len(rows) else None, rows, len(table))
    return {**time, **memory}


def _merged(job: Job, table: LayoutTable, capacity: float, halves: tuple[np.ndarray, np.ndarray],
            parts: tuple[dict[str, Any], dict[str, Any]]) -> Scores:
    """The Scores of `table` from the fields of its two halves (`_halves`), each row where it came from."""
    def placed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        out = np.empty(len(table), dtype=a.dtype)
        out[halves[0]], out[halves[1]] = a, b
        out.flags.writeable = a.flags.writeable  # the time arrays are read-only, as `step_times` leaves them
        return out

    fields: dict[str, Any] = {}
    for name, a in parts[0].items():
        b = parts[1][name]
        if isinstance(a, np.ndarray):
            fields[name] = placed(a, b)
        elif isinstance(a, Mapping):
            fields[name] = {k: placed(a[k], b[k]) for k in a}
        else:  # a figure of the job, not of a row (the model FLOPs per step); NaN in a half whose rows all failed
            fields[name] = a if np.isfinite(a) else b
    return Scores(job=job, table=table, capacity_bytes=capacity, **fields)


def _empty(job: Job, table: LayoutTable, capacity: float) -> Scores:
    """The scores of a table without rows (a job no layout divides)."""
    def none(dtype: type = np.float64) -> np.ndarray:
        return np.zeros(0, dtype=dtype)

    return Scores(job=job, table=table, capacity_bytes=capacity, step_time_s=none(),
                  breakdown={k: none() for k in TIME_KEYS}, tokens_per_s_per_gpu=none(),
                  tokens_per_s_per_gpu_low=none(), tokens_per_s_per_gpu_high=none(), tflops_per_gpu=none(), mfu=none(),
                  model_flops_per_step=model_flops_per_step(job.model, job.training), memory={k: none() for k in TERMS},
                  overhead_terms={k: none() for k in OVERHEAD_TERMS}, allocated_bytes=none(), total_bytes=none(),
                  host_bytes=none(),
                  memory_stage=none(np.int64), optimizer_phase=none(bool), params_per_gpu=none(np.int64),
                  dominant_time_index=none(np.int64), dominant_memory_index=none(np.int64))


def _spread(part: dict[str, Any] | None, rows: np.ndarray, n: int) -> dict[str, Any]:
    """Time figures of `rows` placed into full-length arrays (NaN elsewhere; dominant term 0)."""
    def full(values: np.ndarray | None, fill: float = np.nan, dtype: type = np.float64) -> np.ndarray:
        out: np.ndarray = np.full(n, fill, dtype=dtype)
        if values is not None:
            out[rows] = values
        return out

    get = (lambda k: part[k]) if part is not None else (lambda k: None)
    breakdown = {k: full(None if part is None else part["breakdown"][k]) for k in TIME_KEYS}
    flops = part["model_flops_per_step"] if part is not None else float("nan")
    return {**{k: full(get(k)) for k in ("step_time_s", "tokens_per_s_per_gpu", "tokens_per_s_per_gpu_low",
                                          "tokens_per_s_per_gpu_high", "tflops_per_gpu", "mfu")},
            "breakdown": breakdown, "model_flops_per_step": flops,
            "dominant_time_index": full(get("dominant_time_index"), 0, np.int64)}


def estimate_time(job: Job, layout: Layout, cal: Calibration = DEFAULT_CALIBRATION) -> TimeEstimate:
    """Step time, tokens/s per GPU (with its band), model TFLOP/s per GPU and MFU of `layout` on `job`, for the
    software release the job names (`TrainingSpec.release`: `cal`'s factors of it): the one-row case of
    `score_layouts`' step-time assembly."""
    time = step_times(job, Rows(LayoutTable.from_layouts([layout])), cal)
    return TimeEstimate(
        step_time_s=float(time["step_time_s"][0]),
        breakdown={k: float(v[0]) for k, v in time["breakdown"].items()},
        tokens_per_s_per_gpu=float(time["tokens_per_s_per_gpu"][0]),
        tokens_per_s_per_gpu_low=float(time["tokens_per_s_per_gpu_low"][0]),
        tokens_per_s_per_gpu_high=float(time["tokens_per_s_per_gpu_high"][0]),
        tflops_per_gpu=float(time["tflops_per_gpu"][0]),
        mfu=float(time["mfu"][0]),
        model_flops_per_step=float(time["model_flops_per_step"]),
    )


def _memory_estimate(stage: Mapping[str, Any], columns: Any, device: Mapping[str, float]) -> MemoryEstimate:
    """One stage's figures (row 0 of `peak_memory`'s arrays) as a MemoryEstimate."""
    optimizer_phase = bool(stage["phase"][0])
    if optimizer_phase:  # the optimizer step's fp32 gradient copies are the peak, not the activations
        terms: tuple[tuple[str, float], ...] = (("optimizer_step_fp32_grads", float(stage["activations"][0])),)
    else:
        terms = columns.named(stage["named"])
    held = float(stage["held"][0])
    overhead = {**device, **({"graph_pool_held": held} if held else {})}
    return MemoryEstimate(
        weights_bytes=float(stage["weights"][0]), gradients_bytes=float(stage["gradients"][0]),
        optimizer_bytes=float(stage["optimizer"][0]), activations_bytes=float(stage["activations"][0]),
        workspace_bytes=float(stage["workspace"][0]), overhead_bytes=sum(overhead.values()),
        stage=int(stage["stage"]), params_per_gpu=int(stage["params"][0]),
        phase="optimizer step" if optimizer_phase else "activations", overhead_terms=tuple(overhead.items()),
        activation_terms=terms,
    )


def _one_layout_memory(job: Job, layout: Layout, assumptions: MemoryAssumptions,
                       ) -> tuple[tuple[dict[str, Any], ...], Any, dict[str, float], int]:
    out = peak_memory(job, Rows(LayoutTable.from_layouts([layout])), assumptions, by_name=True, every_stage=True)
    device = {k: float(v[0]) for k, v in out["overhead_terms"].items() if k != "graph_pool_held"}
    return tuple(out["stages"]), out["columns"], device, int(out["memory_stage"][0])


def estimate_memory_per_stage(job: Job, layout: Layout,
                              assumptions: MemoryAssumptions = DEFAULT_ASSUMPTIONS) -> tuple[MemoryEstimate, ...]:
    """The estimate for one GPU of every pipeline stage, in stage order (`estimate_memory` is their maximum): the
    one-row case of `score_layouts`' memory assembly, with the activations by tensor name."""
    stages, columns, device, _ = _one_layout_memory(job, layout, assumptions)
    return tuple(_memory_estimate(s, columns, device) for s in stages)


def estimate_memory(job: Job, layout: Layout, assumptions: MemoryAssumptions = DEFAULT_ASSUMPTIONS) -> MemoryEstimate:
    """Peak memory per GPU for `layout` of `job`: the most loaded stage of `estimate_memory_per_stage`, the one
    `score_layouts` finds. A pure function of its arguments (no torch); an infeasible layout still gets numbers (the
    validity rules say why it is infeasible). Micro-batches per step: GBS / (MBS * DP), at least 1."""
    stages, columns, device, peak = _one_layout_memory(job, layout, assumptions)
    return _memory_estimate(stages[peak], columns, device)

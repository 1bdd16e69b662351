"""The answer of a search, computed once: what every output (terminal, files, report, plots, notebook) reads.

    answer = result.answer            # SearchResult.answer, built on first use
    answer.pick                       # the picked TrialRecord (None when nothing fits)
    answer.ranked, answer.pareto      # the pick first, then fastest first; the Pareto front, the pick first
    answer.decision                   # typed: pick, ties, confidence, reason, memory and pipeline warnings
    answer.yours                      # a Verdict per --layout: fits or not (and by what), rank, change vs the pick

Nothing downstream re-ranks: a table prints `answer.ranked` in order, the report and the plots mark
`answer.decision.pick`, best.json's `decision` is `answer.decision.to_dict()`.

**What a figure is** (`basis`): the model's prediction (`model`), a GPU measurement (`GPU measurements`), or the
model checked by the CPU proxy. CPU-proxy jobs (a scaled-down model with the same parallel structure, on gloo) show
that a layout builds and trains; their times are not GPU times. So with CPU-proxy records the ranking, the Pareto
front, the pick and the launch lines are the model's figures for the real job (`ranked` holds the model's records
of the measured layouts), and each carries what the proxy found (`proxy_status`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autotune.tuning.decision import GPU, MODEL, PROXY, Decision, Verdict
from autotune.tuning.results import TrialRecord, distinct_feasible, pareto_front
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.measurement import Measurement
from search_spaces.units import GIB

__all__ = ["SearchResult", "Answer", "answer_of", "largest_time_term"]


@dataclass(frozen=True, kw_only=True)
class Answer:
    """A search's answer (module docstring). `records` are every trial as recorded; `ranked` the distinct layouts
    that fit, in the search's order (the pick first); `pareto` the layouts no other beats on both tokens/s and
    memory, the pick first and the rest fastest first; `space` the whole space's counts (analytic pass)."""

    job: Any
    records: tuple[TrialRecord, ...]
    ranked: tuple[TrialRecord, ...]
    pareto: tuple[TrialRecord, ...]
    decision: Decision
    capacity_bytes: float = 0.0
    calibration: Any = None  # the Calibration the model's figures use (None: DEFAULT_CALIBRATION)

    @property
    def pick(self) -> TrialRecord | None:
        return self.ranked[0] if self.ranked and self.decision.pick is not None else None

    @property
    def basis(self) -> str:
        return self.decision.basis

    @property
    def cpu_proxy(self) -> bool:
        return self.decision.basis == PROXY

    def is_pick(self, layout: Layout | str) -> bool:
        return self.decision.pick is not None and str(layout) == self.decision.pick

    def is_tied(self, layout: Layout | str) -> bool:
        return str(layout) in self.decision.tied_layouts

    @property
    def yours(self) -> tuple[Verdict, ...]:
        """The verdict on each of the user's layouts (`--layout`, the published recipe)."""
        return self.decision.yours

    @property
    def space(self) -> dict[str, Any]:
        """The whole space's counts: valid, fit, out of memory by largest term."""
        return self.decision.space

    def inside_error(self, r: TrialRecord) -> bool:
        """Is a predicted peak's free memory (with the headroom kept) inside the memory model's error
        (`ranking.inside_memory_error`)? A measured peak carries no model error."""
        return _inside_error(self.job, self.capacity_bytes, self.decision, r)

    def model_records(self, k: int = 5) -> list[TrialRecord]:
        """The first k of `ranked` with the cost model's figures and terms (what the breakdown plots stack): a
        record of the model as it is, a measured one scored by the model for the real job."""
        out = []
        for r in self.ranked[:k]:
            if r.measurement.source == "analytic":
                out.append(r)
                continue
            made = _model_record_of(self.job, self.capacity_bytes, r, self.calibration)
            out.append(made if made is not None else r)
        return out


def largest_time_term(time: dict[str, float], step_time_s: float | None) -> tuple[str, float] | None:
    """The largest step-time term beyond compute (of the cost model's terms, `autotune.cost.throughput.TIME_KEYS`)
    and its share of the step; None without such a breakdown (a measurement's step statistics are not terms)."""
    from autotune.cost.throughput import TIME_KEYS

    others = {k: float(time[k]) for k in TIME_KEYS if k != "compute" and time.get(k)}
    if not others or not step_time_s:
        return None
    name = max(others, key=others.__getitem__)
    return name, others[name] / step_time_s


def _tokens_of(r: TrialRecord) -> float:
    return float(r.measurement.tokens_per_s_per_gpu or 0.0)


def answer_of(result: SearchResult) -> Answer:
    """The answer of `result` (module docstring); `SearchResult.answer` calls this once."""

    decision = result.decision or _fallback_decision(result)
    if decision.basis == PROXY:
        pool = _model_records(result)
    else:
        pool = distinct_feasible(result.records)
    pick = _find(pool, decision.pick)
    if pick is None and decision.pick is not None:  # the pick's layout was not kept as a record: score it now
        made = _model_record(result, decision.pick, number=-1, proxy=None)
        pick = made if made is not None and made.feasible else None
        if pick is not None:
            pool = [pick, *pool]
    def key(r: TrialRecord) -> tuple:  # with the error kept free, the layouts inside it rank after the others
        risky = decision.error_free and _inside_error(result.job, result.capacity_bytes, decision, r)
        return risky, -_tokens_of(r), r.measurement.memory_bytes or 0.0, str(r.layout)

    ranked = sorted(pool, key=key)
    if pick is not None:
        ranked = [pick, *[r for r in ranked if r is not pick]]
    # predicted peaks are compared at the memory model's resolution (a saving it cannot resolve is no trade-off);
    # measured ones exactly. The pick is on the front even when a faster layout inside the error is within it.
    resolution = (decision.memory_resolution or 0.0) if decision.basis != GPU else 0.0
    front = pareto_front(pool, resolution)
    if pick is not None and pick not in front:
        front = [pick, *front]
    front = sorted(front, key=lambda r: (r is not pick, -_tokens_of(r), str(r.layout)))
    return Answer(job=result.job, calibration=result.calibration, records=tuple(result.records), ranked=tuple(ranked),
                  pareto=tuple(front), decision=decision, capacity_bytes=result.capacity_bytes)


def _inside_error(job: Job, capacity_bytes: float, decision: Decision, r: TrialRecord) -> bool:
    from autotune.tuning.ranking import MEMORY_RESOLUTION, inside_memory_error

    m = r.measurement
    if m.source != "analytic" or m.memory_bytes is None:
        return False
    kept = job.cluster.gpu.memory_bytes - capacity_bytes
    resolution = decision.memory_resolution or MEMORY_RESOLUTION
    return bool(inside_memory_error(capacity_bytes - m.memory_bytes, m.memory_bytes, resolution, kept))


def _find(pool: Sequence[TrialRecord], layout: str | None) -> TrialRecord | None:
    if layout is None:
        return None
    return next((r for r in pool if str(r.layout) == layout), None)


def _fallback_decision(result: SearchResult) -> Decision:
    """A result made without a decision (tests, old folders): the fastest record that fits."""

    fits = distinct_feasible(result.records)
    pick = str(fits[0].layout) if fits else None
    return Decision(stage="analytic", basis=MODEL, pick=pick, fastest=pick, tied=int(pick is not None),
                    tied_layouts=(pick,) if pick else (), confidence="", reason="")


def _model_records(result: SearchResult) -> list[TrialRecord]:
    """The model's record of every layout the CPU proxy ran (one per layout, the last measurement), with what the
    proxy found in `extra["proxy"]`; only those that fit by the model."""
    last: dict[Layout, TrialRecord] = {}
    for r in result.records:
        if r.measurement.source == "megatron-cpu-proxy":
            last[r.layout] = r
    out = []
    for layout, r in last.items():
        m = r.measurement
        proxy = {"status": m.status, "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu, "step_time_s": m.step_time_s,
                 "memory_gib": float(m.extra.get("measured_memory_bytes") or 0) / GIB or None,  # type: ignore[arg-type]
                 "reason": m.reason[:300]}
        made = _model_record(result, str(layout), number=r.number, proxy=proxy, origin=r.origin)
        if made is not None and made.feasible:
            out.append(made)
    return out


def _model_record(result: SearchResult, layout_text: str, *, number: int, proxy: dict[str, Any] | None,
                  origin: str = "analytic") -> TrialRecord | None:
    """The analytic backend's record of one layout for the real job (figures for the GPU cluster)."""
    from search_spaces.layout import parse_layout

    try:
        layout = parse_layout(layout_text)
    except ValueError:
        return None
    return _scored(result.job, result.capacity_bytes, layout, number=number, origin=origin, proxy=proxy,
                   cal=result.calibration)


def _model_record_of(job: Any, capacity_bytes: float, r: TrialRecord, cal: Any = None) -> TrialRecord | None:
    proxy = r.measurement.extra.get("proxy")
    return _scored(job, capacity_bytes, r.layout, number=r.number, origin=r.origin,
                   proxy=proxy if isinstance(proxy, dict) else None, cal=cal)


def _scored(job: Any, capacity_bytes: float, layout: Layout, *, number: int, origin: str,
            proxy: dict[str, Any] | None, cal: Any = None) -> TrialRecord:
    from autotune.cost.analytic import AnalyticBackend
    from autotune.cost.efficiency import DEFAULT_CALIBRATION

    m = AnalyticBackend(headroom_bytes=job.cluster.gpu.memory_bytes - capacity_bytes,
                        calibration=cal or DEFAULT_CALIBRATION).evaluate(job, layout)
    if proxy is not None:
        m = replace(m, extra={**m.extra, "proxy": proxy})
    feasible = m.ok and m.memory_bytes is not None and m.memory_bytes <= capacity_bytes
    return TrialRecord(number=number, origin=origin, measurement=m, feasible=feasible, capacity_bytes=capacity_bytes)


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """What a search found. `decision` is the search's one typed decision (`autotune.tuning.decision.Decision`,
    made by `autotune.tuning.analytic_search`; None: the fastest record that fits); `answer` is the one answer
    every output reads (`Answer`: the pick, the ranking, the Pareto front, the verdicts on the user's layouts),
    computed once from the records and the decision. `best` is the pick (None when nothing fits)."""

    job: Job
    records: tuple[TrialRecord, ...]
    capacity_bytes: float
    headroom_bytes: float
    mode: str  # "analytic", "search" or "exhaustive"
    backend: str
    seed: int
    space_size: int
    stats: dict[str, Any] = field(default_factory=dict)  # proposals, invalid_proposals, duplicates, timings
    interrupted: bool = False
    output_dir: str | None = None
    decision: Decision | None = None
    calibration: Any = None  # the Calibration the cost model used (None: DEFAULT_CALIBRATION)

    @functools.cached_property
    def answer(self) -> Answer:
        """The typed answer, built on first use and kept."""
        return answer_of(self)

    @property
    def measurements(self) -> list[Measurement]:
        return [r.measurement for r in self.records]

    @property
    def ranked(self) -> list[TrialRecord]:
        """Distinct feasible records, the pick first, then fastest first (`answer.ranked`)."""
        return list(self.answer.ranked)

    @property
    def tied(self) -> set[str]:
        """Layout texts tied with the pick (the pick included), as the decision says."""
        return set(self.answer.decision.tied_layouts)

    @property
    def best_record(self) -> TrialRecord | None:
        return self.answer.pick

    @property
    def best(self) -> Measurement | None:
        r = self.best_record
        return None if r is None else r.measurement

    @property
    def pareto(self) -> list[TrialRecord]:
        """The Pareto front (`answer.pareto`): the pick first, then fastest first."""
        return list(self.answer.pareto)

    def closest_misses(self, k: int = 5) -> list[TrialRecord]:
        """Infeasible trials with a memory figure, least memory first: what came nearest to fitting."""
        misses = {r.layout: r for r in self.records if not r.feasible and r.measurement.memory_bytes is not None}
        return sorted(misses.values(), key=lambda r: r.measurement.memory_bytes or 0.0)[:k]

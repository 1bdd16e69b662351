"""The answer of a search, computed once: what every output (terminal, files, report, plots, notebook) reads.

    answer = result.answer            # SearchResult.answer, built on first use
    answer.pick                       # the picked TrialRecord (None when nothing fits)
    answer.ranked, answer.pareto      # the pick first, then fastest first; the Pareto front, the pick first
    answer.decision                   # typed: pick, ties, confidence, reason, memory and pipeline warnings
    answer.yours                      # a Verdict per --layout: fits or not (and by what), rank, change vs the pick

Nothing downstream re-ranks: a table prints `answer.ranked` in order, the report and the plots mark
`answer.decision.pick`, best.json is `answer.as_dict()`.

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

from autotune.tuning.results import TrialRecord, distinct_feasible, pareto_front
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.measurement import Measurement
from search_spaces.units import GIB

__all__ = ["SearchResult", "Answer", "Decision", "MemoryWarning", "Verdict", "answer_of", "largest_time_term",
           "MODEL", "GPU", "PROXY"]

MODEL, GPU = "model", "GPU measurements"
PROXY = "model; CPU proxy checked that layouts build and train"  # CPU-proxy jobs never overrule the model


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryWarning:
    """The pick's free memory is inside the memory model's error: the margin to keep and what it costs."""

    free_gib: float
    error_gib: float
    headroom_gib: float  # the --headroom-gib that keeps the error free
    layout: str | None  # what the same rule picks with that headroom (None: nothing fits then)
    tokens_per_s_per_gpu: float | None
    change: float | None  # its tokens/s relative to the pick's
    text: str

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryWarning:
        return cls(free_gib=float(d["free_gib"]), error_gib=float(d["error_gib"]),
                   headroom_gib=float(d["headroom_gib"]), layout=d.get("layout"),
                   tokens_per_s_per_gpu=d.get("tokens_per_s_per_gpu"), change=d.get("change"), text=str(d["text"]))


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """One of the user's layouts against the search (`autotune.tuning.verdicts.verdict`)."""

    layout: str
    status: str  # ok, oom, invalid (the model's word)
    fits: bool
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    memory_gib: float | None = None
    free_gib: float | None = None
    over_gib: float | None = None
    violations: tuple[str, ...] = ()
    rank: int | None = None  # among every layout that fits (1 = the fastest)
    of: int | None = None
    change_vs_pick: float | None = None
    is_pick: bool = False
    tied: bool = False
    largest_time_term: str | None = None
    largest_time_share: float | None = None
    largest_memory_term: str | None = None
    better: str | None = None  # the fastest layout that fits in no more memory, when faster than this one
    better_change: float | None = None
    nearest: str | None = None  # the nearest variant that fits, when this one does not
    nearest_changes: tuple[str, ...] = ()
    nearest_tokens_per_s_per_gpu: float | None = None
    nearest_free_gib: float | None = None
    measured: dict[str, Any] | None = None  # what a measuring backend found for it
    pick_gain: float | None = None  # the pick's predicted tokens/s over this layout's, minus 1
    gain_terms: tuple[tuple[str, float, float], ...] = ()  # (term, this layout's s, the pick's s) per step
    unverified: str | None = None  # a gain above verdicts.UNVERIFIED_GAIN: the term it rests most on
    unverified_share: float | None = None  # that term's share of the step time the pick saves
    recipe: str | None = None  # where NVIDIA published this layout, when it is the job's baseline
    published_tokens_per_s_per_gpu: float | None = None  # what NVIDIA measured with it (its own cluster)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        known = set(cls.__dataclass_fields__)
        values: dict[str, Any] = {k: (tuple(v) if k in ("violations", "nearest_changes") else v)
                                  for k, v in d.items() if k in known}
        if "gain_terms" in values:
            values["gain_terms"] = tuple((str(t), float(a), float(b)) for t, a, b in values["gain_terms"])
        return cls(**values)


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """Which layout the search picks, how sure it is and why (the dict form is best.json's `decision`)."""

    stage: str  # "analytic" or "measured"
    basis: str  # MODEL, GPU or PROXY
    pick: str | None
    fastest: str | None
    tied: tuple[str, ...]
    confidence: str
    reason: str
    memory_warning: MemoryWarning | None = None
    pipeline_warning: str | None = None
    analytic_pick: str | None = None  # the model's own pick, when measurements chose another
    proxy: dict[str, Any] | None = None  # CPU proxy: measured, ran, failed, timed_out

    @property
    def sentence(self) -> str:
        """The confidence sentence the terminal, the report's Winner box and the notebook show."""
        if not self.confidence or self.confidence == "none":
            return ""
        return f"Pick: {self.confidence} ({self.basis}): {self.reason}."

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Decision:
        warning = d.get("memory_warning")
        pipeline = d.get("pipeline_warning")
        return cls(stage=str(d.get("stage", "analytic")), basis=str(d.get("basis", MODEL)), pick=d.get("pick"),
                   fastest=d.get("fastest"), tied=tuple(d.get("tied_layouts") or ()),
                   confidence=str(d.get("confidence", "")), reason=str(d.get("reason", "")),
                   memory_warning=MemoryWarning.from_dict(warning) if isinstance(warning, dict) else None,
                   pipeline_warning=pipeline.get("text") if isinstance(pipeline, dict) else None,
                   analytic_pick=d.get("analytic_pick") if d.get("stage") == "measured" else d.get("model_pick"),
                   proxy=d.get("proxy"))


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
    yours: tuple[Verdict, ...] = ()
    space: dict[str, Any] = field(default_factory=dict)
    capacity_bytes: float = 0.0
    raw_decision: dict[str, Any] = field(default_factory=dict)
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
        return str(layout) in self.decision.tied

    def as_dict(self) -> dict[str, Any]:
        """best.json's `decision` (the search's own, without its timings)."""
        return {k: v for k, v in self.raw_decision.items() if k != "seconds"}

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

    d = result.decision or {}
    decision = Decision.from_dict(d) if d else _fallback_decision(result)
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
    ranked = sorted(pool, key=lambda r: (-_tokens_of(r), r.measurement.memory_bytes or 0.0, str(r.layout)))
    if pick is not None:
        ranked = [pick, *[r for r in ranked if r is not pick]]
    front = pareto_front(pool)
    front = sorted(front, key=lambda r: (r is not pick, -_tokens_of(r), str(r.layout)))
    yours = tuple(Verdict.from_dict(v) for v in d.get("yours") or ())
    return Answer(job=result.job, calibration=result.calibration, records=tuple(result.records), ranked=tuple(ranked),
                  pareto=tuple(front), decision=decision, yours=yours, space=dict(d.get("space") or {}),
                  capacity_bytes=result.capacity_bytes, raw_decision=dict(d))


def _find(pool: Sequence[TrialRecord], layout: str | None) -> TrialRecord | None:
    if layout is None:
        return None
    return next((r for r in pool if str(r.layout) == layout), None)


def _fallback_decision(result: SearchResult) -> Decision:
    """A result made without a decision (tests, old folders): the fastest record that fits."""

    fits = distinct_feasible(result.records)
    pick = str(fits[0].layout) if fits else None
    return Decision(stage="analytic", basis=MODEL, pick=pick, fastest=pick, tied=(pick,) if pick else (),
                    confidence="", reason="")


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
    """What a search found. `decision` is the search's decision as plain data (best.json's `decision`:
    `autotune.tuning.analytic_search`); `answer` is the one typed answer every output reads (`Answer`: the pick,
    the ranking, the Pareto front, the verdicts on the user's layouts), computed once from the records and the
    decision. `best` is the pick (None when nothing fits)."""

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
    decision: dict[str, Any] = field(default_factory=dict)
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
        return set(self.answer.decision.tied)

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

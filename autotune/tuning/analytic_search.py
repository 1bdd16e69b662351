"""The decisions of a search, as the result (`SearchResult.decision`, best.json) carries them.

- `analytic_decision(answer)`: the whole-space pick of `autotune.tuning.analytic_pass` (the exact optimum of the
  model, up to ties), the tied layouts, how sure the pick is and why (`autotune.tuning.ranking`), and the
  pipeline-batch warning with a suggested global batch (`autotune.tuning.batch_advice`).
- `analytic_measurements(answer, ...)`: what an analytic search records in trials.csv: the ranked top, the Pareto
  front, the closest misses when nothing fits, and the user's `--layout`s (each checked against the rules: an
  invalid one is recorded with its violations, the search goes on).
- `measured_decision(records, answer)`: with GPU measurements, the pick by measurement (the same tie rules, the
  measurements' own spread as the tolerance), the analytic pick beside it. CPU-proxy measurements (a scaled-down
  model on gloo) only check that a layout builds and trains: the pick stays the model's (the first layout of the
  model's ranking the proxy did not see fail), and so do the launch lines.
Each decision also carries the memory-margin warning (`ranking.memory_margin`), the whole space's counts (valid, fit,
out of memory by largest term) and the verdict on each of the user's layouts (`autotune.tuning.verdicts`).
No Ray, no Optuna.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

from autotune.tuning.analytic_pass import AnalyticAnswer
from autotune.tuning.batch_advice import pipeline_warning
from autotune.tuning.decision import GPU, MODEL, PROXY, Decision, Verdict
from autotune.tuning.ranking import (
    Ranking,
    complexity,
    decide_layouts,
    measured_tolerance,
    memory_margin,
    riskier_layout,
)
from search_spaces.layout import Layout
from search_spaces.measurement import Measurement

__all__ = ["analytic_decision", "analytic_measurements", "measured_decision", "MAX_TIED_LISTED"]

MAX_TIED_LISTED = 50  # tied layouts named in the decision (the count is always given)


def _named(r: Ranking, name: Any) -> dict[str, Any]:
    """A ranking's fields as `Decision` fields, its rows named by `name` (row -> layout text)."""
    return {"pick": None if r.pick is None else name(r.pick),
            "fastest": None if r.fastest is None else name(r.fastest),
            "tied": int(len(r.tied)), "tied_layouts": tuple(name(int(i)) for i in r.tied[:MAX_TIED_LISTED]),
            "confidence": r.confidence, "reason": r.reason, "tolerance": r.tolerance, "within_band": r.in_band,
            "band": r.band, "memory_resolution": r.resolution, "error_free": r.error_free, **r.details}


def analytic_decision(answer: AnalyticAnswer, user: Sequence[Layout] = ()) -> Decision:
    """The model's decision over the whole space, with the verdicts on the `user` layouts."""
    from autotune.tuning.verdicts import verdict

    r, s = answer.ranking, answer.scores
    kept = answer.job.cluster.gpu.memory_bytes - float(s.capacity_bytes)
    margin = memory_margin(s.tokens_per_s_per_gpu, s.total_bytes, float(s.capacity_bytes), complexity(answer.table),
                           eligible=answer.eligible, pick=r.pick, tolerance=r.tolerance, resolution=r.resolution,
                           labels=_Labels(answer), kept_bytes=kept)
    riskier = riskier_layout(s.tokens_per_s_per_gpu, s.total_bytes, float(s.capacity_bytes), pick=r.pick,
                             riskier=r.riskier, resolution=r.resolution, labels=_Labels(answer), kept_bytes=kept)
    return Decision(stage="analytic", basis=MODEL, space_size=answer.size, space=space_counts(answer),
                    **_named(r, lambda i: str(answer.layout(int(i)))), riskier=riskier,
                    pipeline_warning=pipeline_warning(answer), memory_warning=margin,
                    yours=tuple(verdict(answer, layout) for layout in dict.fromkeys(user)))


class _Labels:
    """Layout texts of an answer's rows, made when asked."""

    def __init__(self, answer: AnalyticAnswer) -> None:
        self.answer = answer

    def __getitem__(self, i: int) -> str:
        return str(self.answer.layout(int(i)))


def space_counts(answer: AnalyticAnswer) -> dict[str, Any]:
    """The whole space's outcome: valid layouts, how many fit, and the others by their largest memory term."""
    import numpy as np

    from autotune.cost.memory import TERMS

    s = answer.scores
    fits = s.fits
    out_of_memory = ~fits & np.isfinite(s.total_bytes)
    device = out_of_memory & (s.total_bytes > s.capacity_bytes)  # the rest overflow the host with offload
    terms = np.bincount(s.dominant_memory_index[device].astype(np.int64), minlength=len(TERMS))
    by_term = {TERMS[i]: int(n) for i, n in enumerate(terms) if n}
    if (out_of_memory & ~device).any():
        by_term["host memory (offloaded activations)"] = int((out_of_memory & ~device).sum())
    return {"valid": answer.size, "fit": int(fits.sum()), "out_of_memory": int(out_of_memory.sum()),
            "out_of_memory_by_term": by_term,
            "equivalent_merged": int((fits & ~answer.eligible).sum()),
            "options": {f.name: getattr(answer.space.options, f.name) for f in fields(answer.space.options)}}


def analytic_measurements(answer: AnalyticAnswer, *, top: int, user: Sequence[Layout],
                          headroom_bytes: float) -> list[tuple[Measurement, str]]:
    """(measurement, origin) of the rows worth a record, then of the user's layouts (origin "user")."""
    from autotune.cost.analytic import AnalyticBackend

    out = [(answer.measurement(int(i)), "analytic") for i in answer.rows_to_keep(top)]
    backend = AnalyticBackend(headroom_bytes=headroom_bytes, calibration=answer.cal)
    out += [(backend.evaluate(answer.job, layout), "user") for layout in dict.fromkeys(user)]
    return out


def measured_decision(measurements: Sequence[Measurement], capacity_bytes: float,
                      answer: AnalyticAnswer | None = None, user: Sequence[Layout] = ()) -> Decision | None:
    """The pick among the layouts measured on GPUs that fit (one figure per layout: the last one, at the most
    steps); with CPU-proxy measurements only, the model's pick, checked by the proxy (module docstring). None
    when nothing measured fits and there is no model's answer to fall back on."""
    last: dict[Layout, Measurement] = {}
    for m in measurements:
        if m.source != "analytic":
            last[m.layout] = m
    analytic = analytic_decision(answer, user) if answer is not None else None
    if last and all(m.source == "megatron-cpu-proxy" for m in last.values()):
        return None if analytic is None else proxy_checked(analytic, last, answer)
    fits = [m for m in last.values() if m.ok and (m.tokens_per_s_per_gpu or 0) > 0
            and m.memory_bytes is not None and m.memory_bytes <= capacity_bytes]
    if not fits:  # nothing measured on GPUs fits: the model's pick, but never one the measurements saw fail
        if analytic is None:
            return None
        failed = {lay: m for lay, m in last.items() if m.status == "failed"}
        return avoid_failed(replace(analytic, stage="analytic", measured=0), failed, answer, "when measured")
    tolerance = measured_tolerance([m.step_time_s or 0.0 for m in fits],
                                   [float(m.time.get("step_stdev", 0.0) or 0.0) for m in fits])
    tokens = [float(m.tokens_per_s_per_gpu or 0.0) for m in fits]
    memory = [float(m.memory_bytes or 0.0) for m in fits]
    kept = 0.0 if answer is None else answer.job.cluster.gpu.memory_bytes - capacity_bytes  # the headroom
    r = decide_layouts([m.layout for m in fits], tokens, [capacity_bytes - x for x in memory], tolerance=tolerance,
                       measured=True, memory_bytes=memory, kept_bytes=kept)
    import numpy as np

    from autotune.cost.layout_table import LayoutTable

    margin = memory_margin(np.asarray(tokens), np.asarray(memory), capacity_bytes,
                           complexity(LayoutTable.from_layouts([m.layout for m in fits])),
                           eligible=np.ones(len(fits), dtype=bool), pick=r.pick, tolerance=tolerance,
                           resolution=r.resolution, labels=[str(m.layout) for m in fits],
                           kept_bytes=kept)
    out = Decision(stage="measured", basis=GPU, measured=len(last), **_named(r, lambda i: str(fits[int(i)].layout)),
                   memory_warning=margin)
    if analytic is None:
        return out
    return replace(out, analytic_pick=analytic.pick, pipeline_warning=analytic.pipeline_warning,
                   space=analytic.space, space_size=analytic.space_size,
                   yours=tuple(_with_measured(v, last) for v in analytic.yours))


def _with_measured(v: Verdict, last: dict[Layout, Measurement]) -> Verdict:
    """A verdict by the model with the layout's measured figures beside it, when it was measured."""
    from search_spaces.layout import parse_layout

    m = last.get(parse_layout(v.layout))
    if m is None:
        return v
    return replace(v, measured={"status": m.status, "source": m.source, "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu,
                                "memory_gib": m.memory_gib, "reason": m.reason[:300]})


def proxy_checked(analytic: Decision, last: dict[Layout, Measurement], answer: AnalyticAnswer | None) -> Decision:
    """The model's decision with what the CPU proxy found: which layouts built and trained, which failed. The pick
    stays the model's unless the proxy saw it fail to build or train (an exception, not a timeout of a loaded
    machine); then it is the first layout of the model's ranking the proxy did not see fail."""
    failed = {lay: m for lay, m in last.items() if m.status == "failed"}
    ran = sum(m.ok for m in last.values())
    out = replace(analytic, basis=PROXY, measured=len(last),
                  proxy={"measured": len(last), "ran": ran, "failed": len(failed),
                         "timed_out": sum(m.status == "timeout" for m in last.values()),
                         "failed_layouts": {str(k): v.reason[:300] for k, v in list(failed.items())[:10]}})
    out = avoid_failed(out, failed, answer, "on the CPU proxy")
    return replace(out, yours=tuple(_with_measured(v, last) for v in out.yours))


def avoid_failed(out: Decision, failed: dict[Layout, Measurement], answer: AnalyticAnswer | None,
                 where: str) -> Decision:
    """`out` with its pick moved to the first layout of the model's ranking that did not fail, when the pick failed
    to build or train (`where` it failed, for the reason). The ranking's order already puts the layouts that leave
    the memory model's error free first when the pick was chosen among them (`Ranking.error_free`)."""
    pick = out.pick
    if answer is None or pick is None or not any(str(lay) == pick for lay in failed):
        return out
    for row in answer.ranking.order:
        layout = answer.layout(int(row))
        if layout not in failed:
            return replace(out, model_pick=pick, pick=str(layout), memory_warning=None, riskier=None,
                           reason=(f"the model's pick {pick} failed {where} ({failed_reason(failed, pick)}); picked "
                                   f"the next of the model's ranking that was not seen to fail"))
    return out


def failed_reason(failed: dict[Layout, Measurement], layout_text: str) -> str:
    for lay, m in failed.items():
        if str(lay) == layout_text:
            return " ".join(m.reason.split())[:200]
    return ""

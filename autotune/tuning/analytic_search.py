"""The decisions of a search, as the result (`SearchResult.decision`, best.json) carries them.

- `analytic_decision(answer)`: the whole-space pick of `autotune.tuning.analytic_pass` (the exact optimum of the
  model, up to ties), the tied layouts, how sure the pick is and why (`autotune.tuning.ranking`), and the
  pipeline-batch warning with a suggested global batch (`autotune.tuning.batch_advice`).
- `analytic_measurements(answer, ...)`: what an analytic search records in trials.csv: the ranked top, the Pareto
  front, the closest misses when nothing fits, and the user's `--layout`s (each checked against the rules: an
  invalid one is recorded with its violations, the search goes on).
- `measured_decision(records, answer)`: with measurements, the pick by measurement (the same tie rules, the
  measurements' own spread as the tolerance), the analytic pick beside it.
No Ray, no Optuna.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune.tuning.analytic_pass import AnalyticAnswer
from autotune.tuning.batch_advice import pipeline_warning
from autotune.tuning.ranking import decide_layouts, measured_tolerance
from search_spaces.layout import Layout
from search_spaces.measurement import Measurement

__all__ = ["analytic_decision", "analytic_measurements", "measured_decision", "MAX_TIED_LISTED"]

MAX_TIED_LISTED = 50  # tied layouts named in the decision (the count is always given)


def analytic_decision(answer: AnalyticAnswer) -> dict[str, Any]:
    d = answer.decision
    out: dict[str, Any] = {"stage": "analytic", "space_size": answer.size, **d.as_dict(),
                           "pick": None if d.pick is None else str(answer.layout(d.pick)),
                           "tied_layouts": [str(answer.layout(int(i))) for i in d.tied[:MAX_TIED_LISTED]],
                           "seconds": dict(answer.seconds)}
    if d.fastest is not None:
        out["fastest"] = str(answer.layout(d.fastest))
    warning = pipeline_warning(answer)
    if warning is not None:
        out["pipeline_warning"] = warning
    return out


def analytic_measurements(answer: AnalyticAnswer, *, top: int, user: Sequence[Layout],
                          headroom_bytes: float) -> list[tuple[Measurement, str]]:
    """(measurement, origin) of the rows worth a record, then of the user's layouts (origin "user")."""
    from autotune.cost.analytic import AnalyticBackend

    out = [(answer.measurement(int(i)), "analytic") for i in answer.rows_to_keep(top)]
    backend = AnalyticBackend(headroom_bytes=headroom_bytes)
    out += [(backend.evaluate(answer.job, layout), "user") for layout in dict.fromkeys(user)]
    return out


def measured_decision(measurements: Sequence[Measurement], capacity_bytes: float,
                      answer: AnalyticAnswer | None = None) -> dict[str, Any]:
    """The pick among the measured layouts that fit (one figure per layout: the last one, at the most steps)."""
    last: dict[Layout, Measurement] = {}
    for m in measurements:
        if m.source != "analytic":
            last[m.layout] = m
    fits = [m for m in last.values() if m.ok and (m.tokens_per_s_per_gpu or 0) > 0
            and m.memory_bytes is not None and m.memory_bytes <= capacity_bytes]
    analytic = analytic_decision(answer) if answer is not None else {}
    if not fits:
        return {**analytic, "stage": "analytic", "measured": 0} if analytic else {}
    tolerance = measured_tolerance([m.step_time_s or 0.0 for m in fits],
                                   [float(m.time.get("step_stdev", 0.0) or 0.0) for m in fits])
    d = decide_layouts([m.layout for m in fits], [float(m.tokens_per_s_per_gpu or 0.0) for m in fits],
                       [capacity_bytes - float(m.memory_bytes or 0.0) for m in fits], tolerance=tolerance,
                       measured=True)
    out: dict[str, Any] = {"stage": "measured", "measured": len(last), **d.as_dict(),
                           "pick": None if d.pick is None else str(fits[d.pick].layout),
                           "tied_layouts": [str(fits[int(i)].layout) for i in d.tied[:MAX_TIED_LISTED]]}
    if analytic:
        out["analytic_pick"] = analytic.get("pick")
        if "pipeline_warning" in analytic:
            out["pipeline_warning"] = analytic["pipeline_warning"]
    return out

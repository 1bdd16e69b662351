"""One trial's measurements: a backend run on a layout, timed, retried once when the cluster lost it, and the dict
form Ray Tune passes them in between its workers and the driver (`tune_glue`, `tune_policy`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from typing import Any

from search_spaces.job import Job
from search_spaces.layout import Layout, parse_layout
from search_spaces.measurement import Backend, Measurement

__all__ = ["measurement_to_dict", "measurement_from_dict", "failed_measurement", "timed_measurements",
           "lost_attempt", "node_id", "INFRASTRUCTURE"]

INFRASTRUCTURE = "infrastructure"  # `Measurement.extra["failure"]` of an attempt the cluster lost


def measurement_to_dict(m: Measurement) -> dict[str, Any]:
    d = asdict(m)
    d["layout"] = str(m.layout)
    d["violations"] = list(m.violations)
    d["extra"] = {k: v for k, v in m.extra.items() if _json_safe(v)}  # e.g. the megatron backend's analytic_prediction
    return d


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def measurement_from_dict(d: dict[str, Any]) -> Measurement:
    return Measurement(**{**d, "layout": parse_layout(d["layout"]), "violations": tuple(d.get("violations", ()))})


def failed_measurement(layout: Layout, reason: str) -> Measurement:
    """A trial that produced no measurement, as data."""
    return Measurement(layout=layout, status="failed", source="analytic", reason=reason)


def timed_measurement(job: Job, backend: Backend, layout: Layout) -> tuple[Measurement, float]:
    """(the backend's measurement of `layout`, or why there is none; seconds it took)."""
    t0 = time.perf_counter()
    try:
        m = backend.evaluate(job, layout)
    except Exception as e:  # a failing trial is data: record why, keep searching
        m = failed_measurement(layout, f"backend raised {type(e).__name__}: {e}")
    if not isinstance(m, Measurement):
        m = failed_measurement(layout, f"backend returned no metrics (got {type(m).__name__})")
    return m, time.perf_counter() - t0


def lost_attempt(m: Measurement) -> Measurement:
    """`m` marked as an attempt the cluster lost and that runs again (`retried`)."""
    return replace(m, extra={**m.extra, "failure": INFRASTRUCTURE, "retried": True})


def timed_measurements(job: Job, backend: Backend, layout: Layout) -> list[tuple[Measurement, float]]:
    """[(measurement, seconds)]: one, or after an infrastructure failure the lost attempt and the retry's."""
    m, wall_s = timed_measurement(job, backend, layout)
    if m.extra.get("failure") != INFRASTRUCTURE:
        return [(m, wall_s)]
    again, again_s = timed_measurement(job, backend, layout)
    return [(lost_attempt(m), wall_s), (again, again_s)]


def node_id() -> str:
    """The Ray node this trial runs on ('' outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:  # noqa: BLE001 - only a label
        return ""

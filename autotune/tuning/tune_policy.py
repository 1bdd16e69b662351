"""Ray Tune glue of the measured stage: any strategy as a Tune searcher, trials on rungs of timed steps.

Imported only once Ray runs; it imports Ray Tune at module level.

- `PolicySearcher`: a Tune `Searcher` around a plain strategy object (`autotune.tuning.strategy`): `suggest` asks
  the strategy for the next layout (the user's `--layout`s first, outside the budget), `on_trial_complete` tells it
  the measurement. The strategy never sees Ray or Optuna.
- `measure_trial`: the function trainable. It measures its layout at each rung of `rungs` (timed steps of a
  measuring backend: few steps for every candidate, more for the ones that stay) and reports after each, so Ray
  Tune's successive halving (`ASHAScheduler`, Li et al. 2020, "A System for Massively Parallel Hyperparameter
  Tuning") stops the slower half at each rung. A backend without steps (the analytic one) has one rung.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ray import tune
from ray.tune.search import Searcher

from autotune.tuning.trial_io import (
    failed_measurement,
    measurement_from_dict,
    measurement_to_dict,
    node_id,
    timed_measurements,
)
from search_spaces.job import Job
from search_spaces.layout import Layout, parse_layout
from search_spaces.measurement import Backend, Measurement
from search_spaces.units import GIB

__all__ = ["PolicySearcher", "measure_trial", "rungs_for", "scheduler_for", "with_timed_steps", "RUNGS",
           "REDUCTION_FACTOR"]

RUNGS = (1, 4)  # timed steps per rung (after the backend's warm-up steps)
REDUCTION_FACTOR = 2  # successive halving keeps the better half at each rung


def with_timed_steps(backend: Backend, steps: int) -> Backend | None:
    """`backend` measuring `steps` timed steps, or None when it has no such knob (`timed_steps` on the megatron
    backend, also through the `Predicted` wrapper's `inner`)."""
    if dataclasses.is_dataclass(backend):
        names = {f.name for f in dataclasses.fields(backend)}
        if "timed_steps" in names:
            return dataclasses.replace(backend, timed_steps=steps)
        if "inner" in names:
            inner = with_timed_steps(backend.inner, steps)
            return None if inner is None else dataclasses.replace(backend, inner=inner)
    return None


def rungs_for(backend: Backend) -> tuple[int | None, ...]:
    """The fidelity rungs a backend can run: RUNGS for one with timed steps, one plain rung otherwise."""
    return RUNGS if with_timed_steps(backend, RUNGS[0]) is not None else (None,)


def scheduler_for(rungs: tuple[int | None, ...]) -> Any:
    """Successive halving over the rungs (None with a single rung)."""
    if len(rungs) < 2:
        return None
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr="training_iteration", metric="tokens_per_s_per_gpu", mode="max",
                         max_t=len(rungs), grace_period=1, reduction_factor=REDUCTION_FACTOR)


def measure_trial(config: dict[str, Any], job: Job, backend: Backend, rungs: tuple[int | None, ...]) -> None:
    """Tune function trainable: measure `config["layout"]` at each rung, reporting after each."""

    layout = parse_layout(config["layout"])
    lost: list[dict[str, Any]] = []  # attempts the cluster lost, at any rung: each report carries them all
    for k, steps in enumerate(rungs):
        b = backend if steps is None else (with_timed_steps(backend, steps) or backend)
        *lost_now, (m, wall_s) = timed_measurements(job, b, layout)
        lost += [{"m": measurement_to_dict(x), "wall_s": x_s} for x, x_s in lost_now]
        if steps is not None:
            m.extra["timed_steps"] = steps
        items = [*lost, {"m": measurement_to_dict(m), "wall_s": wall_s}]
        report: dict[str, Any] = {"measurements": json.dumps(items),
                                  "status": m.status, "rung": k + 1, "node": node_id(),
                                  "tokens_per_s_per_gpu": float(m.tokens_per_s_per_gpu or 0.0) if m.ok else 0.0}
        if m.memory_bytes is not None:
            report["memory_gib"] = m.memory_bytes / GIB
        tune.report(report)
        if not m.ok:
            return


class PolicySearcher(Searcher):
    """A Tune searcher that asks a strategy object (module docstring)."""

    def __init__(self, strategy: Any, *, fixed: list[Layout] | None = None) -> None:
        super().__init__(metric="tokens_per_s_per_gpu", mode="max")
        self.strategy = strategy
        self.fixed = list(fixed or [])
        self.live: dict[str, tuple[Layout, str]] = {}
        self.counts: dict[str, Any] = {"proposals": 0, "strategy": getattr(strategy, "name", type(strategy).__name__)}
        self.finished = False  # the strategy has nothing left to propose (not an interruption)

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if self.fixed:
            layout, origin = self.fixed.pop(0), "user"
        else:
            layout = self.strategy.propose()
            if layout is None:
                self.finished = True
                return Searcher.FINISHED  # type: ignore[return-value]  # Ray's sentinel string
            origin = "search"
            self.counts["proposals"] += 1
        self.live[trial_id] = (layout, origin)
        return {"layout": str(layout), "origin": origin}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        layout, origin = self.live.pop(trial_id, (None, ""))
        if layout is None or origin == "user":
            return
        m = _first(result) if result else None
        if m is None:
            m = failed_measurement(layout, "the trial ended without metrics" + (" (it raised)" if error else ""))
        self.strategy.observe(layout, m)

    # results persist in trials.csv; Tune's own searcher checkpoints are not used
    def save(self, checkpoint_path: str) -> None:
        return None

    def restore(self, checkpoint_path: str) -> None:
        return None


def _first(result: dict[str, Any]) -> Measurement | None:
    """The trial's measurement (the last item: lost attempts come before it)."""

    try:
        return measurement_from_dict(json.loads(result["measurements"])[-1]["m"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None

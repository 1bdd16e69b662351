"""Search strategies for the measured stage: plain policy objects the Tune glue calls.

A strategy proposes the next layout to measure and is told each measurement; it knows nothing of Ray or Optuna's
internals (the Tune glue, `autotune.tuning.tune_glue`, wraps any strategy in one Tune `Searcher`):

    strategy = make_strategy("guided", context)
    layout = strategy.propose()            # None: nothing left worth measuring (or the budget is spent)
    strategy.observe(layout, measurement)  # after the trial; failed trials too

`StrategyContext` is what every strategy starts from: the job, its feasible space, the analytic answer over the
whole space (`autotune.tuning.analytic_pass`: every layout's predicted figures and the ranking), the capacity, the
budget of layouts to measure, the seed, and what was measured before (resume).

A new strategy is one new file with a class taking a `StrategyContext` and offering `propose` and `observe`,
named in `STRATEGIES` (or passed as `module:Class`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from autotune.tuning.analytic_pass import AnalyticAnswer
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.measurement import Measurement
from search_spaces.space import FeasibleSpace

__all__ = ["Strategy", "StrategyContext", "STRATEGIES", "DEFAULT_STRATEGY", "make_strategy", "usable"]

STRATEGIES: dict[str, str] = {
    "guided": "autotune.tuning.guided:GuidedStrategy",  # the analytic front, corrected by the measured residuals
    "tpe": "autotune.tuning.tpe_strategy:TPEStrategy",  # Optuna's TPE over the define-by-run space
    "front": "autotune.tuning.front_strategy:FrontStrategy",  # the analytic ranking, best first
}
DEFAULT_STRATEGY = "guided"


@dataclass(frozen=True, kw_only=True, eq=False)
class StrategyContext:
    job: Job
    space: FeasibleSpace
    analytic: AnalyticAnswer
    capacity_bytes: float
    budget: int  # layouts to measure (trials), the ones measured before included
    seed: int = 0
    measured: Mapping[Layout, Measurement] = field(default_factory=dict)  # before this run (resume)


class Strategy(Protocol):
    name: str

    def propose(self) -> Layout | None: ...

    def observe(self, layout: Layout, measurement: Measurement) -> None: ...


def usable(m: Measurement, capacity_bytes: float) -> bool:
    """A measurement a strategy can learn throughput from: ok, with a positive tokens/s, within capacity."""
    return (m.status == "ok" and (m.tokens_per_s_per_gpu or 0.0) > 0
            and (m.memory_bytes is None or m.memory_bytes <= capacity_bytes))


def make_strategy(name: str, context: StrategyContext) -> Strategy:
    """The strategy `name` (a key of STRATEGIES, or `module:Class`) built on `context`."""
    target = STRATEGIES.get(name, name)
    module_name, sep, class_name = target.partition(":")
    if not sep:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)} or module:Class, but got {name!r}.")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"strategy {name!r}: cannot load {target} ({e}).") from None
    return cls(context)

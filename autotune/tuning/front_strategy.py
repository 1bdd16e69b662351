"""The analytic ranking as a strategy: measure the layouts in the order the model ranks them, best first.

The baseline the guided strategy is compared with (bench/bench_search_measured.py), and what an analytic search run
through Ray Tune (`--dashboard`, `--address`) replays so its trials show in the dashboard.
"""

from __future__ import annotations

from autotune.tuning.strategy import StrategyContext
from search_spaces.layout import Layout
from search_spaces.measurement import Measurement

__all__ = ["FrontStrategy"]


class FrontStrategy:
    name = "front"

    def __init__(self, context: StrategyContext) -> None:
        self.context = context
        self.done = set(context.measured)
        self.order = iter(context.analytic.ranking.order)
        self.spent = len(self.done)

    def propose(self) -> Layout | None:
        if self.spent >= self.context.budget:
            return None
        for row in self.order:
            layout = self.context.analytic.layout(int(row))
            if layout not in self.done:
                self.done.add(layout)
                self.spent += 1
                return layout
        return None

    def observe(self, layout: Layout, measurement: Measurement) -> None:
        self.done.add(layout)

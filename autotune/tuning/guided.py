"""The default measured-stage strategy: start from the analytic front, correct the model by the measurements.

1. The first layout measured is the analytic pick (the model's best, `autotune.tuning.analytic_pass`).
2. Every measurement refits the residual of the analytic model over the whole candidate set (every layout the
   analytic pass found to fit, equivalents merged): `autotune.tuning.residual.ResidualModel`, a Bayesian linear
   model whose prior spread is the calibration band (`Calibration.band`).
3. Each next layout is the best of one draw from that posterior (Thompson sampling, Thompson 1933; Russo et al.
   2018, "A Tutorial on Thompson Sampling"): the corrected model's favourites, more often where it is unsure.
   The seed drives the draws.
Failed or out-of-memory measurements teach no throughput; they are not proposed again.
"""

from __future__ import annotations

import math

import numpy as np

from autotune.cost.efficiency import DEFAULT_CALIBRATION
from autotune.tuning.residual import ResidualModel, layout_features
from autotune.tuning.strategy import StrategyContext, usable
from search_spaces.layout import Layout
from search_spaces.measurement import Measurement

__all__ = ["GuidedStrategy", "BAND_TO_SD"]

BAND_TO_SD = 2 * 1.2816  # a 10th-90th percentile band spans 2.563 standard deviations of a normal


class GuidedStrategy:
    name = "guided"

    def __init__(self, context: StrategyContext) -> None:
        self.context = context
        a = context.analytic
        self.pool = np.flatnonzero(a.eligible)
        self.taken = np.zeros(len(self.pool), dtype=bool)  # measured or pending
        self.obs_pos: list[int] = []
        self.obs_y: list[float] = []
        self.rng = np.random.default_rng(context.seed)
        self.model: ResidualModel | None = None
        if len(self.pool):
            s = a.scores
            breakdown = {k: v[self.pool] for k, v in s.breakdown.items()}
            features = layout_features(a.table.take(self.pool), breakdown, s.step_time_s[self.pool])
            job = context.job
            low, high = DEFAULT_CALIBRATION.band_for(job.cluster.gpu, job.training.precision, job.model.is_moe)
            self.model = ResidualModel(features, np.log(s.tokens_per_s_per_gpu[self.pool]), (high - low) / BAND_TO_SD)
        self.spent = 0
        for layout, m in context.measured.items():
            self.observe(layout, m)
            self.spent += 1

    def _position(self, layout: Layout) -> int | None:
        row = self.context.analytic.index_of(layout)
        return None if row is None else self._position_of_row(row)

    def propose(self) -> Layout | None:
        if self.model is None or self.spent >= self.context.budget or self.taken.all():
            return None
        if not self.obs_y:
            order = self.context.analytic.ranking.order
            positions = (self._position_of_row(int(r)) for r in order)
            pos = next((p for p in positions if p is not None and not self.taken[p]),
                       None)
        else:
            draw = self.model.sample(self.rng)
            draw[self.taken] = -math.inf
            pos = int(np.argmax(draw))
        if pos is None:
            return None
        self.taken[pos] = True
        self.spent += 1
        return self.context.analytic.layout(int(self.pool[pos]))

    def _position_of_row(self, row: int) -> int | None:
        pos = int(np.searchsorted(self.pool, row))
        return pos if pos < len(self.pool) and self.pool[pos] == row else None

    def observe(self, layout: Layout, measurement: Measurement) -> None:
        pos = self._position(layout)
        if pos is None or self.model is None:
            return
        self.taken[pos] = True
        if usable(measurement, self.context.capacity_bytes):
            self.obs_pos.append(pos)
            self.obs_y.append(math.log(float(measurement.tokens_per_s_per_gpu or 0.0)))
            self.model.observe(np.array(self.obs_pos), np.array(self.obs_y))


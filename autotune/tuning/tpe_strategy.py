"""Optuna's TPE sampler as a measured-stage strategy, through Optuna's public ask-and-tell interface.

The define-by-run space of `autotune.tuning.space_sampler` (valid layouts only); the analytic front (the model's
best layouts that fit) is enqueued first, so TPE starts where the model points; each measurement is told as
log tokens/s (a failure, an OOM or a layout over capacity as a failed trial). A proposal of a layout measured
already is told its value again and another one asked, up to `MAX_REPEATS` times, then the next unmeasured
layout of the analytic ranking is taken.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from autotune.tuning.space_sampler import define_by_run, layout_of, params_of
from autotune.tuning.strategy import StrategyContext, usable
from search_spaces.layout import Layout
from search_spaces.measurement import Measurement

__all__ = ["TPEStrategy", "FRONT", "MAX_REPEATS"]

FRONT = 4  # analytic best layouts enqueued before TPE samples
MAX_REPEATS = 20
N_STARTUP_TRIALS = 5


class TPEStrategy:
    name = "tpe"

    def __init__(self, context: StrategyContext) -> None:
        import optuna

        self.context = context
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(seed=context.seed, multivariate=True, group=True,
                                                 n_startup_trials=N_STARTUP_TRIALS)
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self.define = define_by_run(context.space)
        self.values: dict[Layout, float | None] = {}
        self.pending: dict[Layout, object] = {}
        self.spent = 0
        for layout, m in context.measured.items():
            self._record(layout, m)
            self.spent += 1
        order = context.analytic.ranking.order
        for row in order[:FRONT]:
            layout = context.analytic.layout(int(row))
            if layout not in self.values:
                self.study.enqueue_trial(params_of(context.space, layout))
        self._fallback = iter(order)

    def _value(self, m: Measurement) -> float | None:
        return math.log(float(m.tokens_per_s_per_gpu or 0.0)) if usable(m, self.context.capacity_bytes) else None

    def _record(self, layout: Layout, m: Measurement) -> None:
        self.values[layout] = self._value(m)
        try:
            params = params_of(self.context.space, layout)
        except ValueError:
            return
        self.study.enqueue_trial(params)
        trial = self.study.ask()
        self.define(trial)
        self._tell(trial, self.values[layout])

    def _tell(self, trial: Any, value: float | None) -> None:
        import optuna

        if value is None:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(trial, value)

    def propose(self) -> Layout | None:
        if self.spent >= self.context.budget:
            return None
        for _ in range(MAX_REPEATS):
            trial = self.study.ask()
            self.define(trial)
            layout = layout_of(self.context.space, trial.params)
            if layout in self.values or layout in self.pending:
                self._tell(trial, self.values.get(layout))
                continue
            return self._take(layout, trial)
        for row in self._fallback:
            layout = self.context.analytic.layout(int(row))
            if layout not in self.values and layout not in self.pending:
                self.study.enqueue_trial(params_of(self.context.space, layout))
                trial = self.study.ask()
                self.define(trial)
                return self._take(layout, trial)
        return None

    def _take(self, layout: Layout, trial: object) -> Layout:
        self.pending[layout] = trial
        self.spent += 1
        return layout

    def observe(self, layout: Layout, measurement: Measurement) -> None:
        trial = self.pending.pop(layout, None)
        self.values[layout] = self._value(measurement)
        if trial is not None:
            self._tell(trial, self.values[layout])

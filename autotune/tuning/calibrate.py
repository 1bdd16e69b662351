"""Fit a cluster's calibration factors (`autotune.cost.calibration_file.FACTORS`) to measured step times.

    fit = fit_factors([Run(job=job, layout=layout, step_time_s=8.12)])
    fit.factors                 # {"compute": 0.93, "network": 0.98, "host": 1.01}
    fit.after[0] / 8.12 - 1     # the calibrated prediction's error on that run

Besides whole steps (`Run`), any timed piece the cost model predicts can join the fit as a `Timing` (a measured
collective: `autotune/tuning/profile_node.py`); it counts in the objective like a run.

A maximum a posteriori fit in the log-factors theta = log(factor): with r_i(theta) = log(predicted_i / measured_i),

    minimise   sum_i r_i^2 / NOISE_SD^2  +  sum_k theta_k^2 / PRIOR_SD^2     subject to  low_k <= theta_k <= high_k

(a measured step time is known to about NOISE_SD in log; each factor a priori moves about PRIOR_SD). With fewer runs
than factors the logs alone do not determine the factors; the prior picks the smallest move that explains them,
spread over the factors by how much each moves the runs' step times. Minimised by Gauss-Newton on the factors not held
by a bound (an active set: a factor at its bound whose gradient still pushes outward stays there), with a numeric
Jacobian and a halving line search; a few dozen model evaluations, numpy only. The bounds are
`calibration_file.factor_bounds`: a fit that would cross one stops there, and `Fit.at_bound` names it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from autotune.cost.calibration_file import FACTORS, apply_factors, factor_bounds
from autotune.cost.efficiency import DEFAULT_CALIBRATION, Calibration
from autotune.cost.score import estimate_time
from search_spaces.job import Job
from search_spaces.layout import Layout

__all__ = ["Run", "Timing", "Fit", "fit_factors", "NOISE_SD", "PRIOR_SD"]

NOISE_SD = 0.02  # log step time: run-to-run jitter of a steady median (~2%)
PRIOR_SD = 0.2  # log-factor: a cluster's kernels, links or host within about +-20% of the published fit's
_STEP = 1e-3  # the numeric Jacobian's step in log-factor


@dataclass(frozen=True, kw_only=True, slots=True)
class Run:
    """One measured run: the job and layout it ran, and its steady step time."""

    job: Job
    layout: Layout
    step_time_s: float
    label: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Timing:
    """One measured piece other than a whole step (a collective) and the cost model's time of it under a
    calibration."""

    label: str
    seconds: float
    predict: Callable[[Calibration], float]


@dataclass(frozen=True, kw_only=True, slots=True)
class Fit:
    """The fitted factors of one GPU generation and the predictions before and after, in `runs`' order."""

    arch: str
    precisions: tuple[str, ...]  # the runs' GEMM precisions: the ones `compute` scales
    graphs: tuple[str, ...] = ()  # the runs' CUDA-graph settings: their saving is credited once calibrated on
    factors: tuple[tuple[str, float], ...]
    at_bound: tuple[str, ...]  # factors a bound held
    bounds: tuple[tuple[str, float, float], ...]  # (factor, low, high)
    before: tuple[float, ...]  # predicted step seconds, uncalibrated
    after: tuple[float, ...]  # predicted step seconds, calibrated
    calibration: Calibration  # the base with the factors applied
    timings_before: tuple[float, ...] = ()  # predicted seconds of each `Timing`, uncalibrated
    timings_after: tuple[float, ...] = ()  # and calibrated

    def errors(self, measured: Sequence[float], after: bool = True) -> list[float]:
        """predicted / measured - 1 of each run."""
        return [p / m - 1.0 for p, m in zip(self.after if after else self.before, measured, strict=True)]


def _arch(runs: Sequence[Run]) -> str:
    archs = sorted({r.job.cluster.gpu.arch for r in runs})
    if len(archs) != 1:
        raise ValueError(f"the logs ran on GPUs of {len(archs)} generations ({', '.join(archs)}); a calibration "
                         f"describes one: calibrate each generation's logs on their own.")
    return archs[0]


def fit_factors(runs: Sequence[Run], base: Calibration = DEFAULT_CALIBRATION, *, prior_sd: float = PRIOR_SD,
                noise_sd: float = NOISE_SD, timings: Sequence[Timing] = (), arch: str | None = None) -> Fit:
    """Fit the factors to `runs` and `timings` (module docstring); `arch`: the GPU generation when there are
    timings only. ValueError when there is nothing to fit or a measured time is not a positive finite number."""
    if not runs and not (timings and arch):
        raise ValueError("calibrate needs at least one run (a --log).")
    for seconds in [r.step_time_s for r in runs] + [t.seconds for t in timings]:
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"a measured step time must be a positive finite number, but got {seconds!r}.")
    arch = _arch(runs) if runs else str(arch)
    precisions = tuple(sorted({r.job.training.precision for r in runs}))
    graphs = tuple(sorted({r.layout.cuda_graphs for r in runs}))
    base = base.seen_graphs(arch, graphs)  # the runs measured their graphs: time them as they ran
    bounds = factor_bounds(base, arch, precisions)
    low = np.log([bounds[n][0] for n in FACTORS])
    high = np.log([bounds[n][1] for n in FACTORS])
    measured = np.log([r.step_time_s for r in runs] + [t.seconds for t in timings])

    def predict(theta: np.ndarray) -> np.ndarray:
        cal = apply_factors(base, arch, dict(zip(FACTORS, np.exp(theta).tolist(), strict=True)), precisions)
        return np.log([estimate_time(r.job, r.layout, cal).step_time_s for r in runs]
                      + [t.predict(cal) for t in timings])

    def objective(theta: np.ndarray, pred: np.ndarray) -> float:
        return float(np.sum((pred - measured) ** 2) / noise_sd**2 + np.sum(theta**2) / prior_sd**2)

    theta = np.clip(np.zeros(len(FACTORS)), low, high)
    pred0 = pred = predict(theta)
    cost = objective(theta, pred)
    for _ in range(50):
        jac = np.stack([(predict(theta + _STEP * e) - pred) / _STEP for e in np.eye(len(FACTORS))], axis=1)
        grad = jac.T @ (pred - measured) / noise_sd**2 + theta / prior_sd**2
        hess = jac.T @ jac / noise_sd**2 + np.eye(len(FACTORS)) / prior_sd**2
        held = ((theta <= low + 1e-12) & (grad > 0)) | ((theta >= high - 1e-12) & (grad < 0))
        free = ~held
        if not free.any():
            break
        step = np.zeros_like(theta)
        step[free] = -np.linalg.solve(hess[np.ix_(free, free)], grad[free])
        t = 1.0
        while t > 1e-4:
            trial = np.clip(theta + t * step, low, high)
            trial_pred = predict(trial)
            trial_cost = objective(trial, trial_pred)
            if trial_cost <= cost:
                break
            t /= 2
        else:
            break
        moved = float(np.max(np.abs(trial - theta)))
        theta, pred, cost = trial, trial_pred, trial_cost
        if moved < 1e-6:
            break
    factors = tuple((n, float(v)) for n, v in zip(FACTORS, np.exp(theta), strict=True))
    at_bound = tuple(n for n, v, lo, hi in zip(FACTORS, theta, low, high, strict=True)
                     if v <= lo + 1e-9 or v >= hi - 1e-9)
    k = len(runs)
    return Fit(arch=arch, precisions=precisions, graphs=graphs, factors=factors, at_bound=at_bound,
               bounds=tuple((n, *bounds[n]) for n in FACTORS),
               before=tuple(np.exp(pred0[:k]).tolist()), after=tuple(np.exp(pred[:k]).tolist()),
               calibration=apply_factors(base, arch, dict(factors), precisions),
               timings_before=tuple(np.exp(pred0[k:]).tolist()), timings_after=tuple(np.exp(pred[k:]).tolist()))

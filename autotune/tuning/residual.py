"""The analytic model corrected by measurements: a Bayesian linear model of its residual over the whole space.

For each candidate layout i the analytic model predicts tokens/s p_i; a measurement gives t_i. The residual

    r_i = log t_i - log p_i  ~  phi_i . w + noise,     w ~ N(0, diag(prior_var)),  noise ~ N(0, noise_var)

is fitted by Bayesian linear regression (Bishop 2006, *Pattern Recognition and Machine Learning*, Sec. 3.3:
posterior S = (A + B Phi^T Phi)^-1, m = S B Phi^T r), and the corrected prediction of every layout is
log p_i + phi_i . m with variance phi_i S phi_i^T. The prior's scale and the noise are chosen by the evidence
(Bishop Sec. 3.5) over a small grid, so the correction moves as far as the data say: a little on a GPU cluster the
model was calibrated for, a lot on the CPU proxy, whose timings follow other laws.

Features phi (`layout_features`), standardised over the candidates: an intercept (the overall scale: the proxy's
tokens/s are of a scaled-down model), log2 TP, PP, VPP, CP, EP, ETP, micro-batch size, SP, the distributed
optimizer, selective and full recompute, and the predicted step's share of each time term (compute, TP / CP / EP
communication, host, pipeline bubble and p2p, DP communication, optimizer): the model's own account of where
the time goes, whose weights say which terms the measurements find larger or smaller.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from autotune.cost.layout_table import LayoutTable
from search_spaces.layout import RECOMPUTE_CHOICES

__all__ = ["layout_features", "ResidualModel", "FEATURES"]

SHARE_TERMS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "host", "pp_p2p", "pp_bubble", "dp_comm",
               "optimizer")
FEATURES = ("intercept", "log2_tp", "log2_pp", "log2_vpp", "log2_cp", "log2_ep", "log2_etp", "log2_mbs", "sp",
            "dist_opt", "recompute_selective", "recompute_full", *(f"share_{k}" for k in SHARE_TERMS))
INTERCEPT_SD = 10.0  # the overall scale is unknown (a CPU proxy runs a scaled-down model): an almost flat prior
PRIOR_SCALES = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # x the calibration band's sd, per unit feature
NOISE_SDS = (0.01, 0.03, 0.1, 0.3)  # log tokens/s


def layout_features(table: LayoutTable, breakdown: Mapping[str, np.ndarray], step_time_s: np.ndarray) -> np.ndarray:
    """(rows, len(FEATURES)) raw features of a table's rows (see the module docstring)."""
    cols = [np.ones(len(table))]
    for column in (table.tp, table.pp, table.vpp_size, table.cp, table.ep, table.expert_tp, table.mbs):
        cols.append(np.log2(column.astype(np.float64)))
    cols += [table.sp.astype(np.float64), table.dist_opt.astype(np.float64),
             (table.recompute == RECOMPUTE_CHOICES.index("selective")).astype(np.float64),
             (table.recompute == RECOMPUTE_CHOICES.index("full")).astype(np.float64)]
    cols += [breakdown[k] / step_time_s for k in SHARE_TERMS]
    return np.stack(cols, axis=1)


def _standardise(x: np.ndarray) -> np.ndarray:
    """Zero mean, unit spread per column over the candidates (the intercept and constant columns kept as is)."""
    out = x.copy()
    mean, sd = x[:, 1:].mean(axis=0), x[:, 1:].std(axis=0)
    live = sd > 1e-12
    out[:, 1:] = np.where(live, (x[:, 1:] - mean) / np.where(live, sd, 1.0), 0.0)
    return out


class ResidualModel:
    """Bayesian linear regression of the measured residual over a fixed set of candidates (rows of `features`)."""

    def __init__(self, features: np.ndarray, prior_log_tokens: np.ndarray, band_sd: float) -> None:
        self.phi = _standardise(np.asarray(features, dtype=np.float64))
        self.prior = np.asarray(prior_log_tokens, dtype=np.float64)
        self.band_sd = band_sd
        d = self.phi.shape[1]
        self._base = np.full(d, band_sd / math.sqrt(max(d - 1, 1)))
        self._base[0] = INTERCEPT_SD
        self.rows = np.zeros(0, dtype=np.int64)
        self.y = np.zeros(0)
        self.choice = (1.0, NOISE_SDS[1])
        self._fit(np.diag(self._base ** 2), NOISE_SDS[1] ** 2, self.rows, self.y)

    # --- fitting ------------------------------------------------------------------------------------------------
    def observe(self, rows: np.ndarray, log_tokens: np.ndarray) -> None:
        """Fit to measured log tokens/s of candidate `rows` (all observations so far)."""
        self.rows, self.y = np.asarray(rows, dtype=np.int64), np.asarray(log_tokens, dtype=np.float64)
        r = self.y - self.prior[self.rows]
        best = None
        for scale in PRIOR_SCALES:
            prior_var = self._base ** 2 * np.r_[1.0, np.full(len(self._base) - 1, scale ** 2)]
            for noise in NOISE_SDS:
                evidence = self._log_evidence(prior_var, noise ** 2, self.rows, r)
                if best is None or evidence > best[0]:
                    best = (evidence, prior_var, noise, scale)
        assert best is not None
        _, prior_var, noise, scale = best
        self.choice = (scale, noise)
        self._fit(np.diag(prior_var), noise ** 2, self.rows, self.y)

    def _log_evidence(self, prior_var: np.ndarray, noise_var: float, rows: np.ndarray, r: np.ndarray) -> float:
        """log N(r | 0, Phi A^-1 Phi^T + noise I) (Bishop eq. 3.86 in covariance form)."""
        if len(rows) == 0:
            return 0.0
        phi = self.phi[rows]
        cov = (phi * prior_var) @ phi.T + noise_var * np.eye(len(rows))
        sign, logdet = np.linalg.slogdet(cov)
        return float(-0.5 * (r @ np.linalg.solve(cov, r) + logdet + len(rows) * math.log(2 * math.pi)))

    def _fit(self, prior_cov: np.ndarray, noise_var: float, rows: np.ndarray, y: np.ndarray) -> None:
        phi = self.phi[rows]
        precision = np.linalg.inv(prior_cov) + phi.T @ phi / noise_var
        self.cov = np.linalg.inv(precision)
        self.cov = (self.cov + self.cov.T) / 2
        self.w = self.cov @ (phi.T @ (y - self.prior[rows])) / noise_var if len(rows) else np.zeros(len(prior_cov))
        self.noise_var = noise_var

    # --- predicting -----------------------------------------------------------------------------------------------
    def mean(self) -> np.ndarray:
        """Corrected log tokens/s of every candidate."""
        return self.prior + self.phi @ self.w

    def sd(self) -> np.ndarray:
        """Posterior sd of each candidate's corrected log tokens/s (the model's, without measurement noise)."""
        return np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", self.phi, self.cov, self.phi), 0.0))

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """One draw of every candidate's log tokens/s from the posterior (Thompson sampling)."""
        w = rng.multivariate_normal(self.w, self.cov, method="cholesky")
        return self.prior + self.phi @ w

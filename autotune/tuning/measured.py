"""A measuring backend (megatron-core on GPUs, or its CPU proxy) judged by the real model.

`Predicted(inner)` is what the registry hands out for `megatron`. Each evaluation
1. refuses a layout that breaks a validity rule before any worker starts (status "invalid", the rules'
   messages, `search_spaces.rules.check`);
2. runs the measuring backend (what megatron-core builds and how it trains, on the proxy or the GPUs);
3. judges memory by the *real* model on the *real* GPU: `memory_bytes` (what "fits" reads) is the analytic
   prediction for the real job, each term (weights, gradients, optimizer, activations) scaled by what the
   run measured over what the analytic model predicts for the run's own shape and layout (clamped to
   [1/2, 2]: a proxy corrects the model, it never replaces it). The proxy's own figures stay in `extra`
   (`measured_memory_bytes`, `measured_memory`, `memory_correction`), beside
   - `analytic_prediction`: the analytic backend's figures for the real model on the real cluster;
   - `analytic_proxy_memory`: the analytic memory model on the proxy's own shape and layout.
The measuring backend itself (`trainers/`) knows nothing of the cost models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from autotune.cost.analytic import AnalyticBackend
from autotune.cost.efficiency import DEFAULT_CALIBRATION, Calibration
from autotune.cost.memory import DEFAULT_ASSUMPTIONS, MemoryAssumptions
from autotune.cost.score import estimate_memory, estimate_memory_per_stage
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.measurement import Backend, Measurement
from search_spaces.rules import check

__all__ = ["Predicted", "analytic_prediction", "analytic_proxy_memory", "proxy_memory_assumptions", "corrected_memory",
           "MEASURED_TERMS", "CORRECTION_RANGE"]

MEASURED_TERMS = ("weights", "gradients", "optimizer", "activations")  # what the memory probe splits out
CORRECTION_RANGE = (0.5, 2.0)  # measured / predicted on the proxy, per term


def analytic_prediction(job: Job, layout: Layout, cal: Calibration = DEFAULT_CALIBRATION) -> dict[str, Any]:
    """The analytic backend's figures for the real model and layout, to show beside the measured ones."""
    try:
        a = AnalyticBackend(calibration=cal).evaluate(job, layout)
    except Exception as e:  # noqa: BLE001 - the comparison is optional
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    return {"status": a.status, "memory_bytes": a.memory_bytes, "memory": dict(a.memory),
            "step_time_s": a.step_time_s, "tokens_per_s_per_gpu": a.tokens_per_s_per_gpu, "mfu": a.mfu}


def proxy_memory_assumptions(layout: Layout | None = None) -> MemoryAssumptions:
    """The analytic model's assumptions as the CPU proxy runs: local (unfused) attention and SwiGLU, no
    dropout, norms that save what TE's save (`trainers.proxy_norm`). With CP the proxy's core attention is
    torch SDPA (`trainers.cp_attention`), which keeps no s x s scores: flash-attention-like."""
    return replace(DEFAULT_ASSUMPTIONS, transformer_engine=False, flash_attention=layout is not None and layout.cp > 1,
                   dropout=False, attention_score_bytes=6.0, mla_down_proj_split=True, fused_swiglu=False,
                   torch_rmsnorm=False)


def analytic_proxy_memory(plan: Any, *, per_stage: bool = False) -> Any:
    """The analytic memory model on a proxy plan's own shape and layout (term-by-term comparison).

    `plan` is what the measuring backend ran (`model`, `layout`, `training`, `world_size`). Returns
    {term: bytes} for the heaviest stage, or a list of them by stage with `per_stage`."""
    cluster = build_cluster(nodes=1, gpus_per_node=plan.world_size)
    proxy_job = Job(model=plan.model, cluster=cluster, training=plan.training)
    assumptions = proxy_memory_assumptions(plan.layout)
    estimates = (estimate_memory_per_stage(proxy_job, plan.layout, assumptions) if per_stage
                 else (estimate_memory(proxy_job, plan.layout, assumptions),))
    terms = [{"stage": e.stage, "weights": e.weights_bytes, "gradients": e.gradients_bytes,
              "optimizer": e.optimizer_bytes, "activations": e.activations_bytes} for e in estimates]
    return terms if per_stage else terms[0]


def corrected_memory(real: dict[str, float], measured: dict[str, float],
                     proxy_predicted: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """(the real job's memory terms, each scaled by measured / predicted on the proxy; the factors used).

    A term the run did not measure, or predicted as 0 on the proxy, keeps its prediction (factor 1).
    """
    low, high = CORRECTION_RANGE
    factors: dict[str, float] = {}
    for term in MEASURED_TERMS:
        got, want = measured.get(term), proxy_predicted.get(term)
        if got is not None and want and want > 0 and math.isfinite(got) and got >= 0:
            factors[term] = min(high, max(low, got / want))
    return {k: v * factors.get(k, 1.0) for k, v in real.items()}, factors


@dataclass(frozen=True)
class Predicted:
    """`inner` (a measuring backend), refused on a broken rule and judged by the real model (module docstring)."""

    inner: Backend
    calibration: Calibration = DEFAULT_CALIBRATION  # the analytic prediction's

    @property
    def name(self) -> str:
        return self.inner.name

    def evaluate(self, job: Job, layout: Layout) -> Measurement:
        violations = check(job, layout)
        if violations:  # before any worker starts
            return Measurement(layout=layout, status="invalid", source="analytic",
                               reason="; ".join(str(v) for v in violations),
                               violations=tuple(v.message for v in violations),
                               extra={"analytic_prediction": analytic_prediction(job, layout, self.calibration),
                                      "failure": "layout"})
        m = self.inner.evaluate(job, layout)
        if not isinstance(m, Measurement):
            return m  # the search records a backend that returned nothing as a failed trial
        plan = m.extra.pop("proxy_plan", None)
        prediction = analytic_prediction(job, layout, self.calibration)
        m.extra["analytic_prediction"] = prediction
        proxy_terms = None
        if plan is not None and m.status == "ok":
            try:
                proxy_terms = analytic_proxy_memory(plan)
                m.extra["analytic_proxy_memory"] = proxy_terms
            except Exception:  # noqa: BLE001 - the comparison is optional
                proxy_terms = None
        return _judged_by_real_model(m, prediction, proxy_terms)

    def __getattr__(self, attribute: str) -> Any:  # the inner backend's options (max_workers, ...) pass through
        if attribute == "inner":
            raise AttributeError(attribute)
        return getattr(self.inner, attribute)


def _judged_by_real_model(m: Measurement, prediction: dict[str, Any], proxy_terms: dict[str, float] | None
                          ) -> Measurement:
    """`m` with `memory_bytes` / `memory` of the real job (corrected by the run); the run's own in `extra`."""
    real = prediction.get("memory")
    if m.status != "ok" or not isinstance(real, dict) or not real:
        return m
    terms, factors = corrected_memory(real, m.memory, proxy_terms or {})
    extra = {**m.extra, "measured_memory_bytes": m.memory_bytes, "measured_memory": dict(m.memory),
             "memory_correction": factors,
             "memory_basis": "analytic prediction for the real model on the real GPU, each term scaled by "
                             "measured / predicted on what ran"}
    return replace(m, memory_bytes=sum(terms.values()), memory=terms, extra=extra)

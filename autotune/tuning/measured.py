"""A measuring backend (megatron-core on GPUs, or its CPU proxy) with the analytic model beside it.

`Predicted(inner)` is what the registry hands out for `megatron`: each evaluation runs the measuring
backend and adds, in `Measurement.extra`,
- `analytic_prediction`: the analytic backend's figures for the *real* model on the *real* cluster;
- `analytic_proxy_memory`: the analytic memory model on the proxy's own shape and layout (what actually ran),
  term by term, for comparison with the measured memory.
The measuring backend itself (`trainers/`) knows nothing of the cost models.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from autotune.cost.analytic import AnalyticBackend
from autotune.cost.memory import DEFAULT_ASSUMPTIONS, MemoryAssumptions, estimate_memory, estimate_memory_per_stage
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.measurement import Backend, Measurement

__all__ = ["Predicted", "analytic_prediction", "analytic_proxy_memory", "proxy_memory_assumptions"]


def analytic_prediction(job: Job, layout: Layout) -> dict[str, Any]:
    """The analytic backend's figures for the real model and layout, to show beside the measured ones."""
    try:
        a = AnalyticBackend().evaluate(job, layout)
    except Exception as e:  # noqa: BLE001 - the comparison is optional
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    return {"status": a.status, "memory_bytes": a.memory_bytes, "memory": dict(a.memory),
            "step_time_s": a.step_time_s, "tokens_per_s_per_gpu": a.tokens_per_s_per_gpu, "mfu": a.mfu}


def proxy_memory_assumptions(layout: Layout | None = None) -> MemoryAssumptions:
    """The analytic model's assumptions as the CPU proxy runs: local (unfused) attention and SwiGLU, no
    dropout, norms that save what TE's save (`trainers.proxy_norm`). With CP the proxy's core attention is
    torch SDPA (`trainers.cp_attention`), which keeps no s x s scores: flash-attention-like."""
    wanted = {"transformer_engine": False, "flash_attention": layout is not None and layout.cp > 1, "dropout": False,
              "attention_score_bytes": 6.0, "mla_down_proj_split": True,
              "fused_swiglu": False, "torch_rmsnorm": False}
    names = {f.name for f in fields(DEFAULT_ASSUMPTIONS)}
    return replace(DEFAULT_ASSUMPTIONS, **{k: v for k, v in wanted.items() if k in names})


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


@dataclass(frozen=True)
class Predicted:
    """`inner` (a measuring backend) with the analytic model's figures added to every measurement."""

    inner: Backend

    @property
    def name(self) -> str:
        return self.inner.name

    def evaluate(self, job: Job, layout: Layout) -> Measurement:
        m = self.inner.evaluate(job, layout)
        if not isinstance(m, Measurement):
            return m  # the search records a backend that returned nothing as a failed trial
        plan = m.extra.pop("proxy_plan", None)
        m.extra["analytic_prediction"] = analytic_prediction(job, layout)
        if plan is not None and m.status == "ok":
            try:
                m.extra["analytic_proxy_memory"] = analytic_proxy_memory(plan)
            except Exception:  # noqa: BLE001 - the comparison is optional
                pass
        return m

    def __getattr__(self, attribute: str) -> Any:  # the inner backend's options (max_workers, ...) pass through
        if attribute == "inner":
            raise AttributeError(attribute)
        return getattr(self.inner, attribute)

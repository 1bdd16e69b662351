"""One layout as a short real megatron-core job, for the `smoke` verb (the guide's acceptance test).

`run_smoke(...)` runs on as many Ray workers as the layout's world size (gloo and a CPU-patched megatron-core
here, NCCL where GPUs are), prints the group sizes megatron-core formed (`TP=2 PP=2 DP=1 ...`) and the loss of
every step, and returns 0 only when every loss is finite and the groups match the layout (1 otherwise).
The model keeps its shape unless it is too big for CPU workers (then the proxy model of `trainers.proxy`).
"""

from __future__ import annotations

import math
from typing import Any

from search_spaces.layout import Layout
from search_spaces.model import ModelSpec
from search_spaces.training import TrainingSpec

__all__ = ["run_smoke", "format_groups", "CPU_FULL_MODEL_MAX_PARAMS"]

CPU_FULL_MODEL_MAX_PARAMS = 50_000_000  # bigger models run as their proxy on CPU workers


def format_groups(groups: dict[str, int]) -> str:
    order = ("tp", "pp", "dp", "cp", "vpp", "ep", "etp", "expert_dp")
    return " ".join(f"{k.upper()}={groups[k]}" for k in order if k in groups)


def run_smoke(model: ModelSpec, layout: Layout, training: TrainingSpec, *, workers: int, iterations: int,
              timeout_s: float, dtype: str = "auto") -> int:
    """Run `layout` of `model` for `iterations` steps; print the groups and losses; 0 when both are right."""
    import ray

    from trainers.backend import MegatronBackend, ensure_ray, expected_groups
    from trainers.megatron_job import JobConfig
    from trainers.proxy import plan_proxy
    from trainers.worker_pool import run_pooled, shutdown_pool

    started_ray = not ray.is_initialized()
    ensure_ray()

    use_gpu = int(ray.cluster_resources().get("GPU", 0)) >= workers
    scale = not use_gpu and model.total_params > CPU_FULL_MODEL_MAX_PARAMS
    plan = plan_proxy(model, layout, training, max_workers=workers, scale_model=scale,
                      microbatches=layout.num_microbatches(training.global_batch_size))
    dtype = dtype if dtype != "auto" else ("bf16" if use_gpu else "fp32")
    backend = MegatronBackend(warmup_steps=0, timed_steps=iterations, precision=dtype)  # type: ignore[arg-type]
    cfg = JobConfig(**{**_fields(backend.job_config(plan)), "warmup_steps": 0, "measure_memory": False})
    device = "GPU (NCCL)" if use_gpu else "CPU (gloo)"
    print(f"smoke: {model.name}{' (proxy)' if scale else ''} layout {plan.layout} on {plan.world_size} workers, "
          f"{device} {dtype}, GBS {plan.training.global_batch_size} MBS {plan.layout.mbs} "
          f"seq {plan.training.seq_length}, "
          f"{cfg.num_microbatches} micro-batches, {iterations} iterations"
          + (f"; {plan.dp_reduction}" if plan.dp_reduction else ""), flush=True)
    try:
        outcome = run_pooled(cfg, world_size=plan.world_size, use_gpu=use_gpu, timeout_s=timeout_s)
    finally:
        if started_ray:  # a caller's Ray (tests, a search) keeps its workers for the next job
            shutdown_pool()
    if outcome.status != "ok":
        print(f"smoke: {outcome.status}: {outcome.reason}")
        return 1
    return _report(outcome.ranks, expected_groups(plan.layout))


def _fields(cfg: Any) -> dict:
    return {name: getattr(cfg, name) for name in cfg.__dataclass_fields__}


def _report(ranks: list[dict], want: dict[str, int]) -> int:
    groups = ranks[0]["groups"]
    print(format_groups(groups))
    last = min((r for r in ranks if any(x is not None for x in r["losses"])), key=lambda r: r["rank"], default=None)
    losses = [] if last is None else last["losses"]
    steps = [max(t) for t in zip(*(r["step_times_s"] for r in ranks), strict=True)]  # same steps on every rank
    # losses is empty when no rank reported one: nothing printed here, the check below fails the smoke
    for i, (loss, step_s) in enumerate(zip(losses, steps, strict=False), start=1):
        print(f"step {i}: loss {loss:.4f}  time {step_s:.2f} s")
    mismatched = [r["rank"] for r in ranks if r["groups"] != want]
    if mismatched:
        print(f"smoke: FAILED: ranks {mismatched} formed groups {groups}, the layout needs {want}")
        return 1
    if not losses or not all(math.isfinite(x) for x in losses):
        print(f"smoke: FAILED: losses not finite: {losses}")
        return 1
    print(f"smoke: ok (loss at step {len(losses)} is {losses[-1]:.4f}; groups match the layout)")
    return 0

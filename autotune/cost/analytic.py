"""The analytic backend: validity rules, then the memory model, then the throughput model. Pure arithmetic.

`AnalyticBackend().evaluate(job, layout)` returns a `Measurement`:
- status "invalid" with the violations when a validity rule fails (`search_spaces.rules.check`);
- status "oom" when the memory model's device peak (allocated bytes plus the allowance outside PyTorch's
  allocator: CUDA context, NCCL, userbuffers, the allocator's reserve) exceeds the GPU's memory minus
  `headroom_bytes`, or the offloaded activations the host memory per GPU (`memory.memory_status`);
- status "ok" otherwise.
Memory and time figures are filled for "oom" layouts too, so a search can show the closest misses.
No torch, ray or megatron import anywhere on this path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from autotune.cost.efficiency import DEFAULT_CALIBRATION, Calibration
from autotune.cost.score import estimate_time
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.measurement import Measurement, Status

__all__ = ["AnalyticBackend", "check_rules"]



def check_rules(job: Job, layout: Layout) -> tuple[str, ...]:
    """Violations as one line each (`rule: message`); () when every rule passes."""
    from search_spaces.rules import check

    return tuple(str(v) for v in check(job, layout))


def _memory(job: Job, layout: Layout):
    from autotune.cost.score import estimate_memory

    return estimate_memory(job, layout)


@dataclass(frozen=True, kw_only=True, slots=True)
class AnalyticBackend:
    """Backend over autotune's own cost models. `headroom_bytes` is kept free on each GPU (default 0)."""

    headroom_bytes: float = 0.0
    calibration: Calibration = DEFAULT_CALIBRATION
    name: str = "analytic"

    def evaluate(self, job: Job, layout: Layout) -> Measurement:
        violations = check_rules(job, layout)
        if violations:
            return Measurement(layout=layout, status="invalid", source="analytic", reason="; ".join(violations),
                               violations=violations)
        memory = _memory(job, layout)
        time = estimate_time(job, layout, self.calibration)
        from autotune.cost.memory import memory_status, offload_host_bytes

        capacity = job.cluster.gpu.memory_bytes - self.headroom_bytes
        peak = memory.total_bytes
        host = offload_host_bytes(job, layout)
        status, reason = memory_status(job, peak, capacity, host, memory.dominant)
        return Measurement(
            layout=layout, status=cast(Status, status), source="analytic", reason=reason,
            memory_bytes=peak, allocated_bytes=memory.allocated_bytes, memory=memory.as_dict(),
            step_time_s=time.step_time_s, time=time.as_dict(),
            tokens_per_s_per_gpu=time.tokens_per_s_per_gpu, tflops_per_gpu=time.tflops_per_gpu, mfu=time.mfu,
            extra={"dominant_time": time.dominant, "dominant_memory": memory.dominant,
                   "tokens_per_s_per_gpu_low": time.tokens_per_s_per_gpu_low,
                   "tokens_per_s_per_gpu_high": time.tokens_per_s_per_gpu_high,
                   "model_flops_per_step": time.model_flops_per_step, "memory_stage": memory.stage,
                   "memory_phase": memory.phase, "memory_overhead": dict(memory.overhead_terms),
                   "offload_host_bytes": host},
        )

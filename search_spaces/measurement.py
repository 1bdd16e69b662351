"""What a backend says about one layout: the common currency of the search.

Every backend (analytic cost models, megatron-core profiling on GPU or CPU proxy) returns a
`Measurement`. Breakdowns are plain name -> value mappings so each term can be compared on its
own (memory terms in bytes, time terms in seconds); the totals are explicit fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.units import GIB

__all__ = ["Backend", "Measurement", "Status", "Source"]

Status = Literal["ok", "oom", "invalid", "failed", "timeout"]
Source = Literal["analytic", "megatron-gpu", "megatron-cpu-proxy"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Measurement:
    layout: Layout
    status: Status
    source: Source
    reason: str = ""  # why a layout is not "ok": violations, OOM message, crash summary
    violations: tuple[str, ...] = ()
    memory_bytes: float | None = None  # device memory at the peak of the most loaded GPU: what must fit
    allocated_bytes: float | None = None  # of which PyTorch's allocator hands out (`max_memory_allocated`)
    memory: dict[str, float] = field(default_factory=dict)  # breakdown in bytes
    step_time_s: float | None = None
    time: dict[str, float] = field(default_factory=dict)  # breakdown in seconds
    tokens_per_s_per_gpu: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    extra: dict[str, object] = field(default_factory=dict)  # backend-specific facts (proxy shapes, group sizes)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def memory_gib(self) -> float | None:
        return None if self.memory_bytes is None else self.memory_bytes / GIB

    @property
    def allocated_gib(self) -> float | None:
        """Peak allocated GiB (the figure Megatron logs as "max allocated"); the device figure when a backend
        reports only one."""
        value = self.allocated_bytes if self.allocated_bytes is not None else self.memory_bytes
        return None if value is None else value / GIB


class Backend(Protocol):
    """Evaluates layouts of a job. The search does not know which backend it drives."""

    @property
    def name(self) -> str: ...  # read-only: a class constant or a frozen field both satisfy it

    def evaluate(self, job: Job, layout: Layout) -> Measurement: ...

"""What-if: the same training job on several clusters, one answer per cluster.

    rows = what_if([job_4n, job_8n, job_16n], tokens=1e12)
    rows[0].pick, rows[0].tokens_per_s_per_gpu, rows[0].days, rows[0].gpu_hours

Each cluster gets the search's own answer (`analytic_pass` over its whole default space, the same pick rule as
`python -m autotune`), and from it tokens/s per GPU and per cluster and, for a token budget, the training time and
the GPU-hours: time = tokens / (tokens/s per GPU x GPUs), GPU-hours = GPUs x time. When no cluster asked for fits,
`smallest_fitting` finds the smallest node count that does: it doubles the largest one asked for until a layout fits
(at most `MAX_DOUBLINGS` times), then bisects the last gap (assuming more nodes never need more memory per GPU,
which holds for the weights, gradients and optimizer state the extra GPUs shard; the result is checked by its own
pass). No Ray, no Optuna, no files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from autotune.cost.efficiency import DEFAULT_CALIBRATION
from search_spaces.job import Job
from search_spaces.space import SpaceOptions
from search_spaces.units import GIB

__all__ = ["WhatIfRow", "what_if", "smallest_fitting", "parse_tokens", "MAX_DOUBLINGS"]

MAX_DOUBLINGS = 8  # the largest cluster asked for x 256 at most
_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}


def parse_tokens(text: str) -> float:
    """`1T`, `300B`, `2.5e12`, `500M` as a number of tokens (ValueError naming the form when it is not one)."""
    body = text.strip().upper().replace("_", "").replace(",", "")
    suffix = body[-1:] if body[-1:] in _SUFFIX and body[-1:] else ""
    number = body[: len(body) - len(suffix)] if suffix else body
    try:
        value = float(number) * _SUFFIX[suffix]
    except ValueError:
        raise ValueError(f"--tokens takes a token count such as 1T, 300B or 2.5e12, but got {text!r}.") from None
    if not (value > 0 and value < float("inf")):
        raise ValueError(f"--tokens must be a positive token count, but got {text!r}.")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class WhatIfRow:
    """One cluster's answer. `pick` is None when no layout fits it (then `closest_gib` says how near one came)."""

    job: Job
    space_size: int
    fits: int
    pick: str | None
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    memory_gib: float | None = None
    free_gib: float | None = None
    confidence: str = ""
    closest_gib: float | None = None  # nothing fits: the least memory a layout needs
    tokens: float | None = None  # the budget
    found: bool = False  # a size the what-if added (the smallest that fits), not one asked for

    @property
    def gpus(self) -> int:
        return self.job.world_size

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.tokens_per_s_per_gpu is None else self.tokens_per_s_per_gpu * self.gpus

    @property
    def seconds(self) -> float | None:
        tps = self.tokens_per_s
        return None if self.tokens is None or not tps else self.tokens / tps

    @property
    def days(self) -> float | None:
        s = self.seconds
        return None if s is None else s / 86400

    @property
    def gpu_hours(self) -> float | None:
        s = self.seconds
        return None if s is None else s / 3600 * self.gpus

    def as_dict(self) -> dict[str, Any]:
        c = self.job.cluster
        return {"nodes": c.nodes, "gpus_per_node": c.gpus_per_node, "gpu": c.gpu.name, "gpus": self.gpus,
                "space_size": self.space_size, "fits": self.fits, "pick": self.pick,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "tokens_per_s": self.tokens_per_s,
                "mfu": self.mfu, "memory_gib": self.memory_gib, "free_gib": self.free_gib,
                "confidence": self.confidence, "closest_gib": self.closest_gib, "tokens": self.tokens,
                "seconds": self.seconds, "days": self.days, "gpu_hours": self.gpu_hours, "found": self.found}


def _answer_row(job: Job, *, headroom_bytes: float, options: SpaceOptions, tokens: float | None,
                found: bool = False, calibration: Any = None) -> WhatIfRow:
    from autotune.tuning.analytic_pass import analytic_pass
    from search_spaces.space import feasible_space

    space = feasible_space(job, options)
    cal = DEFAULT_CALIBRATION if calibration is None else calibration.calibration(job.cluster.gpu)
    answer = analytic_pass(job, space, capacity_bytes=job.cluster.gpu.memory_bytes - headroom_bytes, cal=cal)
    s, d = answer.scores, answer.ranking
    fits = int(s.fits.sum())
    if d.pick is None:
        closest = float(s.total_bytes.min() / GIB) if len(s.total_bytes) else None
        return WhatIfRow(job=job, space_size=answer.size, fits=fits, pick=None, closest_gib=closest, tokens=tokens,
                         found=found)
    i = d.pick
    return WhatIfRow(job=job, space_size=answer.size, fits=fits, pick=str(answer.layout(i)),
                     tokens_per_s_per_gpu=float(s.tokens_per_s_per_gpu[i]), mfu=float(s.mfu[i]),
                     memory_gib=float(s.total_bytes[i] / GIB),
                     free_gib=float((s.capacity_bytes - s.total_bytes[i]) / GIB), confidence=d.confidence,
                     tokens=tokens, found=found)


def _with_nodes(job: Job, nodes: int) -> Job:
    return replace(job, cluster=replace(job.cluster, nodes=nodes))


def what_if(jobs: Sequence[Job], *, headroom_bytes: float = 0.0, tokens: float | None = None,
            options: SpaceOptions | None = None, find_smallest: bool = True,
            calibration: Any = None) -> list[WhatIfRow]:
    """One row per job (module docstring), in the order given; with `find_smallest` and nothing fitting any of
    them, a last row for the smallest node count that fits (per GPU type), marked `found`. `calibration`: a
    `CalibrationFile` applied to every job (ValueError for a job on another GPU generation than its own)."""
    from search_spaces.space import DEFAULT_SPACE

    opts = options or DEFAULT_SPACE
    rows = [_answer_row(job, headroom_bytes=headroom_bytes, options=opts, tokens=tokens, calibration=calibration)
            for job in jobs]
    if find_smallest and rows and all(r.pick is None for r in rows):
        by_gpu: dict[str, Job] = {}
        for job in jobs:  # the largest cluster asked for, per GPU type
            name = job.cluster.gpu.name
            if name not in by_gpu or job.cluster.nodes > by_gpu[name].cluster.nodes:
                by_gpu[name] = job
        for job in by_gpu.values():
            found = smallest_fitting(job, headroom_bytes=headroom_bytes, options=opts, tokens=tokens,
                                     calibration=calibration)
            if found is not None:
                rows.append(found)
    return rows


def smallest_fitting(job: Job, *, headroom_bytes: float = 0.0, options: SpaceOptions | None = None,
                     tokens: float | None = None, calibration: Any = None) -> WhatIfRow | None:
    """The smallest node count above `job`'s at which a layout fits (module docstring), or None within
    `MAX_DOUBLINGS` doublings."""
    from search_spaces.space import DEFAULT_SPACE

    opts = options or DEFAULT_SPACE
    miss, hit = job.cluster.nodes, None
    for _ in range(MAX_DOUBLINGS):
        try:
            bigger = _with_nodes(job, miss * 2)
        except ValueError:  # beyond the largest cluster a ClusterSpec takes
            break
        row = _answer_row(bigger, headroom_bytes=headroom_bytes, options=opts, tokens=tokens, found=True,
                          calibration=calibration)
        if row.pick is not None:
            hit = row
            break
        miss *= 2
    if hit is None:
        return None
    low, high = miss, hit.job.cluster.nodes  # low does not fit, high does
    while high - low > 1:
        mid = (low + high) // 2
        row = _answer_row(_with_nodes(job, mid), headroom_bytes=headroom_bytes, options=opts, tokens=tokens,
                          found=True, calibration=calibration)
        if row.pick is not None:
            high, hit = mid, row
        else:
            low = mid
    return hit

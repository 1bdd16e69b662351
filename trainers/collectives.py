"""Time the collectives a cluster at hand can run: all-reduce, all-gather, all-to-all and send/recv over every rank.

`CollectivesConfig(...).run()` runs on each rank of a process group the worker pool formed (NCCL on GPUs, gloo on
CPU; `trainers.worker_pool.run_on_rank` calls it) and returns this rank's timings: for each collective and message
size, the median over `iterations` of the slowest rank's time (each timed call is bracketed by barriers, so the ranks
start together and the slowest sets the time, as in nccl-tests' `all_reduce_perf`), less the median of two bare
barriers (what the bracket itself costs).

What each one moves, in bytes (the figures `autotune.tuning.profile_node` compares with the cost model):

- `all_reduce`: a tensor of `nbytes` on every rank, summed;
- `all_gather`: every rank contributes `nbytes / world`, every rank ends with `nbytes`;
- `all_to_all`: every rank sends `nbytes / world` to each rank (`nbytes` in all, its own share included);
- `send_recv`: rank 0 sends `nbytes` to the last rank (on another node when the group spans nodes), which receives.

Torch only (no megatron-core); the tensors are bf16 on a GPU, fp32 on CPU (gloo has no bf16 reduction).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["CollectivesConfig", "COLLECTIVES"]

COLLECTIVES = ("all_reduce", "all_gather", "all_to_all", "send_recv")


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectivesConfig:
    """What each rank times: `sizes` in bytes (per collective, see the module docstring), `iterations` timed calls
    after `warmup` untimed ones."""

    sizes: tuple[int, ...]
    iterations: int = 5
    warmup: int = 2
    collectives: tuple[str, ...] = COLLECTIVES

    def run(self) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        rank, world = dist.get_rank(), dist.get_world_size()
        on_gpu = torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        dtype = torch.bfloat16 if on_gpu else torch.float32
        element = torch.tensor([], dtype=dtype).element_size()
        timings: list[dict[str, Any]] = []
        barrier_s = statistics.median(_timed(lambda: None, on_gpu) for _ in range(self.warmup + self.iterations))
        for name in self.collectives:
            for nbytes in self.sizes:
                numel = max(world, nbytes // element // world * world)  # a multiple of the world size
                op = _collective(name, numel, world, rank, device, dtype)
                seconds = [_timed(op, on_gpu) for _ in range(self.warmup + self.iterations)][self.warmup:]
                timings.append({"collective": name, "bytes": numel * element, "world": world,
                                "seconds": max(statistics.median(seconds) - barrier_s, 1e-9)})
        return {"rank": rank, "world": world, "device": "gpu" if on_gpu else "cpu", "timings": timings}


def _collective(name: str, numel: int, world: int, rank: int, device: Any, dtype: Any) -> Any:
    """A no-argument callable that runs one `name` of `numel` elements (module docstring)."""
    import torch
    import torch.distributed as dist

    if name == "all_reduce":
        full = torch.ones(numel, device=device, dtype=dtype)
        return lambda: dist.all_reduce(full)
    if name == "all_gather":
        shard = torch.ones(numel // world, device=device, dtype=dtype)
        out = torch.empty(numel, device=device, dtype=dtype)
        return lambda: dist.all_gather_into_tensor(out, shard)
    if name == "all_to_all":
        send = torch.ones(numel, device=device, dtype=dtype)
        recv = torch.empty(numel, device=device, dtype=dtype)
        return lambda: dist.all_to_all_single(recv, send)
    if name == "send_recv":
        buf = torch.ones(numel, device=device, dtype=dtype)
        last = world - 1

        def pair() -> None:
            if world == 1:
                return
            if rank == 0:
                dist.send(buf, dst=last)
            elif rank == last:
                dist.recv(buf, src=0)
        return pair
    raise ValueError(f"unknown collective {name!r}; one of {', '.join(COLLECTIVES)}")


def _timed(op: Any, on_gpu: bool) -> float:
    """Seconds of one `op` on this rank, between barriers (the slowest rank's time, as every rank waits for it)."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    if on_gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    op()
    if on_gpu:
        torch.cuda.synchronize()
    dist.barrier()
    return time.perf_counter() - start

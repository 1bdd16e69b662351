"""Fresh workers for one megatron-core job: Ray Train V2's `TorchTrainer` started from the caller (a Tune function
trainable in a search), one new worker group per trial (`run_fresh`); used when worker reuse is turned off and as
the baseline of `bench/bench_trainer_overhead.py`. The reusable pool is `trainers.worker_pool`.
"""

from __future__ import annotations

import time
from typing import Any

from trainers.rendezvous import join_process_group, open_store
from trainers.worker_pool import PoolOutcome, cpu_threads, run_on_rank, summarise

__all__ = ["run_fresh"]


def _train_loop_per_worker(config: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Ray Train V2 worker function: run the job, gather every rank's result on rank 0."""
    import ray.train
    import torch

    if not torch.cuda.is_available():
        torch.set_num_threads(cpu_threads(torch.distributed.get_world_size()))
    result = run_on_rank(config["job"])
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, result)
    ray.train.report({"status": result["status"]})  # V2: every worker reports (a barrier)
    return gathered if torch.distributed.get_rank() == 0 else None


def _closed_torch_config(*, backend: str, timeout_s: int) -> Any:
    """Ray Train's TorchConfig, with the process group set up on `open_store` / `join_process_group` (the store
    on the node IP only) instead of `env://`, whose TCPStore listens on every interface."""
    from ray.train.torch import TorchConfig
    from ray.train.torch.config import _TorchBackend

    class _ClosedBackend(_TorchBackend):
        def on_start(self, worker_group: Any, backend_config: Any) -> None:
            import ray
            from ray.train.torch import config as torch_config

            env_vars = getattr(torch_config, "_set_torch_distributed_env_vars", None)
            if env_vars is not None:  # LOCAL_RANK and friends, as Ray Train's own backend sets them
                worker_group.execute(env_vars)
            addr, port = worker_group.execute_single(0, _open_worker_store, backend_config.timeout_s)
            ray.get([worker_group.execute_single_async(i, _join_worker_group, addr, port, i, len(worker_group),
                                                       backend_config.backend, backend_config.timeout_s)
                     for i in range(len(worker_group))])

    class _ClosedTorchConfig(TorchConfig):
        @property
        def backend_cls(self):
            return _ClosedBackend

    return _ClosedTorchConfig(backend=backend, timeout_s=timeout_s)


_WORKER_STORE: dict[str, Any] = {}  # rank 0 of a Ray Train group keeps its TCPStore here (the worker's process)


def _open_worker_store(timeout_s: float) -> tuple[str, int]:
    store, addr, port = open_store(timeout_s)
    _WORKER_STORE["store"] = store
    return addr, port


def _join_worker_group(addr: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float) -> None:
    _WORKER_STORE["store"] = join_process_group(_WORKER_STORE.get("store") if rank == 0 else None, addr, port, rank,
                                                world_size, backend, timeout_s)


def run_fresh(cfg: Any, *, world_size: int, use_gpu: bool, timeout_s: float = 600.0,
              cpus_per_worker: float = 0.5, storage_path: str | None = None) -> PoolOutcome:
    """Run `cfg` on new Ray Train workers (TorchTrainer, gloo on CPU, NCCL on GPU)."""
    import tempfile

    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    t0 = time.perf_counter()
    trainer = TorchTrainer(
        _train_loop_per_worker,
        train_loop_config={"job": cfg},
        torch_config=_closed_torch_config(backend="nccl" if use_gpu else "gloo", timeout_s=int(timeout_s)),
        scaling_config=ScalingConfig(num_workers=world_size, use_gpu=use_gpu,
                                     resources_per_worker=None if use_gpu else {"CPU": cpus_per_worker}),
        run_config=RunConfig(storage_path=storage_path or tempfile.mkdtemp(prefix="autotune-train-"),
                             name=f"megatron-{world_size}w"),
    )
    try:
        result = trainer.fit()
    except Exception as e:  # noqa: BLE001 - a crash is a trial outcome
        return PoolOutcome(status="failed", reason=f"{type(e).__name__}: {e}"[:2000], ranks=[], fresh_workers=True,
                           startup_s=0.0, wall_s=time.perf_counter() - t0)
    ranks = list(result.return_value or [])
    status, reason = summarise(ranks or [None], timeout_s)
    return PoolOutcome(status=status, reason=reason, ranks=[r for r in ranks if r], fresh_workers=True,
                       startup_s=0.0, wall_s=time.perf_counter() - t0)

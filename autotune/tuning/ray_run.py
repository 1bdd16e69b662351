"""The Ray a search runs on: connected to a cluster or started locally closed to the network, in the search's own
namespace, quiet unless asked, and shut down after (`ray_session`); and SIGTERM ending a search the way Ctrl-C does
(`terminate_like_ctrl_c`, `TERMINATED`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["ray_session", "search_namespace", "terminate_like_ctrl_c", "TERMINATED"]

TERMINATED = threading.Event()


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM does what Ctrl-C does: Tune stops gracefully (its SIGINT handler) or KeyboardInterrupt is raised."""
    TERMINATED.set()
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def terminate_like_ctrl_c() -> None:
    """Install the SIGTERM handler above (main thread only; `ray.init` replaces the handler, so it is set again)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def search_namespace(folder: str | Path) -> str:
    """The Ray namespace of the search writing `folder` (one per result folder, which one search holds at a time):
    its named actors (the megatron backend's worker pool) are its own, whatever else runs on the cluster."""
    import hashlib

    return "autotune-" + hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:16]


@contextlib.contextmanager
def ray_session(*, address: str | None, verbose: bool, stats: dict[str, Any],
                 folder: str | Path | None = None) -> Iterator[None]:
    """Connect to `address`, or start a local Ray closed to the network (`search_spaces.ray_session`), in the
    search's own namespace (`search_namespace(folder)`), and shut it down after. A Ray this process already runs is
    used as is and left running (tests share one session). Unless `verbose`, Tune's per-trial tracebacks are off
    (the trial's failure is recorded and said in one line) and Ray's cluster messages go to the folder
    (`autotune.tuning.cluster_messages`)."""
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # no CSV/JSON/TensorBoard files per trial
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "3600")  # results persist in trials.csv and study.db
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"  # a failed trial has no metrics: it is recorded, not fatal
    if not verbose:
        os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")  # Tune's traceback of a failed trial (recorded)
    with contextlib.ExitStack() as quiet:
        if not verbose and folder is not None:
            from autotune.tuning.cluster_messages import divert_cluster_messages

            quiet.enter_context(divert_cluster_messages(folder))
        namespace = None if folder is None else search_namespace(folder)
        with _ray_connected(address=address, verbose=verbose, stats=stats, namespace=namespace):
            yield


@contextlib.contextmanager
def _ray_connected(*, address: str | None, verbose: bool, stats: dict[str, Any],
                   namespace: str | None) -> Iterator[None]:
    t0 = time.perf_counter()
    import ray

    from search_spaces import ray_session

    level = logging.INFO if verbose else logging.ERROR
    for name in ("ray", "ray.tune", "ray.train", "ray.data", "optuna"):
        logging.getLogger(name).setLevel(level)
    started = False
    # Import Tune and Optuna (1-2 s) on a thread while ray.init waits for Ray's processes to come up.
    preload = threading.Thread(target=_preload_tune, name="autotune-preload", daemon=True)
    preload.start()
    try:
        if not ray.is_initialized():
            if address:
                ray_session.connect(address, log_to_driver=verbose, logging_level=level, namespace=namespace)
            else:
                ray_session.start_local(num_cpus=os.cpu_count() or 2, log_to_driver=verbose, logging_level=level,
                                        namespace=namespace)
            started = True
        terminate_like_ctrl_c()  # again: ray.init installs its own SIGTERM handler
    finally:
        preload.join()
    stats.setdefault("timings", {})["ray_start_s"] = time.perf_counter() - t0
    try:
        with warnings.catch_warnings():
            if not verbose:
                warnings.simplefilter("ignore")
            yield
    finally:
        pool = sys.modules.get("trainers.worker_pool")  # megatron backend: its kept-alive workers end with the search
        if pool is not None:
            with contextlib.suppress(Exception):
                pool.shutdown_pool()
        # Ray object references left in reference cycles (Tune's trials, actor handles) are collected now, while
        # Ray is up: collected after `ray.shutdown()` (by Ray's GC thread or any thread's allocation) they call
        # into the core worker, which then ends the process ("The core worker has already been shutdown").
        gc.collect()
        if started:
            t1 = time.perf_counter()
            ray.shutdown()
            stats["timings"]["ray_shutdown_s"] = time.perf_counter() - t1


def _preload_tune() -> None:
    with contextlib.suppress(Exception):
        import autotune.tuning.tune_glue  # noqa: F401

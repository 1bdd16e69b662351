"""The search driver: Ray Tune runs the trials, Optuna (through Ray's OptunaSearch) proposes them.

    run_search(job, trials=64, backend="analytic", seed=0) -> SearchResult

- The space is `search_spaces.space.feasible_space(job, options)`; Optuna walks it with the
  define-by-run function of `autotune.tuning.space_sampler`, so every proposal is a valid layout (each
  proposal is checked again against `rules.check` and counted; the count must stay 0).
- Two objectives: tokens/s per GPU (max) and peak memory per GPU (min), with Optuna's constraint
  support (`TPESampler(constraints_func=...)`): memory above the GPU's capacity minus the headroom
  is infeasible. The rules-of-thumb seeds (`autotune.tuning.seeds`) and in-space user layouts are
  enqueued first (points_to_evaluate); user layouts outside the space run as fixed trials.
- A layout already measured is never run twice: its values are told to Optuna again and Optuna
  asked for another; when the sampler only repeats itself an unmeasured layout is enqueued.
- When the feasible space is no larger than the budget (or `exhaustive_threshold`), it is
  evaluated whole, in batches of layouts per Tune trial.
- Results last: trials.csv is appended per trial, the study lives in SQLite (study.db); `resume`
  continues a folder without rerunning finished trials, and a completed search returns at once.

Ray and Optuna are imported inside functions, so importing this module is cheap. The Tune glue
(searcher subclass, callback, trainable) is in `autotune/tuning/tune_glue.py`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.space import FeasibleSpace, SpaceOptions, feasible_space

from search_spaces.measurement import Backend
from autotune.tuning.results import (META_JSON, STUDY_DB, SearchResult, TrialLog, TrialRecord, job_fingerprint, job_summary,
                              read_meta, read_trials, write_meta)
from autotune.tuning.seeds import Seed, parse_user_layouts, rule_of_thumb_seeds
from autotune.tuning.space_sampler import Naming

__all__ = ["run_search", "SearchPlan", "default_output_dir", "default_headroom_bytes", "DEFAULT_TRIALS",
           "DEFAULT_HEADROOM_FRACTION", "METRICS", "MODES", "ProgressFactory", "ProgressSink"]

GIB = 1024**3
DEFAULT_TRIALS = 64
# of the GPU's memory, kept free beyond the memory model's own allowance (CUDA context, NCCL, userbuffers, the
# allocator's reserve: autotune/cost/allowance.py), the same for `estimate` and the search
DEFAULT_HEADROOM_FRACTION = 0.0
METRICS = ("tokens_per_s_per_gpu", "memory_gib")
MODES = ("max", "min")
EXHAUSTIVE_BATCHES = 8  # Tune trials an exhaustive evaluation is split into


def default_headroom_bytes(job: Job) -> float:
    return DEFAULT_HEADROOM_FRACTION * job.cluster.gpu.memory_bytes


def default_output_dir(job: Job, root: str | Path = "autotune_runs") -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{job.model.name}-{job.cluster.nodes}n-{stamp}"


class ProgressSink(Protocol):
    """What the Tune glue reports finished trials to (a context manager around the run)."""

    def update(self, record: TrialRecord, done: int, total: int) -> None: ...

    def __enter__(self) -> ProgressSink: ...

    def __exit__(self, *exc: object) -> None: ...


class ProgressFactory(Protocol):
    """Builds the sink once the totals are known; returns None for no progress."""

    def __call__(self, *, total: int, done: int, capacity_bytes: float,
                 records: Sequence[TrialRecord]) -> ProgressSink | None: ...


@dataclass(frozen=True, kw_only=True)
class SearchPlan:
    """Everything the Tune side needs, fixed before Ray starts."""

    job: Job
    space: FeasibleSpace
    backend: Backend
    backend_name: str
    capacity_bytes: float
    headroom_bytes: float
    seed: int
    trials: int
    exhaustive: bool
    naming: Naming
    seeds: tuple[Seed, ...]  # in-space seeds, rules of thumb then the user's
    fixed: tuple[Seed, ...]  # user layouts outside the space
    done: tuple[TrialRecord, ...]  # finished before (resume)
    folder: Path
    max_concurrent: int = 1
    progress: ProgressFactory | None = None
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def capacity_gib(self) -> float:
        return self.capacity_bytes / GIB


def _resolve_backend(backend: str | Backend | None, headroom_bytes: float) -> tuple[Backend, str]:
    from autotune.tuning.backends import get_backend, resolve_backend_name, with_prediction

    if backend is not None and not isinstance(backend, str):
        return with_prediction(backend), getattr(backend, "name", type(backend).__name__)
    name = resolve_backend_name(backend)
    if name == "analytic":
        from autotune.cost.analytic import AnalyticBackend

        return AnalyticBackend(headroom_bytes=headroom_bytes), name
    return get_backend(name), name


def _split_user(space: FeasibleSpace, user: Sequence[Seed]) -> tuple[list[Seed], list[Seed]]:
    from autotune.tuning.space_sampler import params_of

    inside, outside = [], []
    for seed in user:
        try:
            params_of(space, seed.layout)
            inside.append(seed)
        except ValueError:
            outside.append(seed)
    return inside, outside


def _check_resume(folder: Path, job: Job, meta: dict[str, Any] | None) -> None:
    if meta is None:
        raise ValueError(f"--resume {folder}: no {META_JSON} there; give the folder of an earlier search.")
    if meta.get("fingerprint") != job_fingerprint(job):
        raise ValueError(f"--resume {folder}: that search was for {meta.get('job', {})}; give the same model, "
                         f"cluster and training options to resume it.")


def run_search(
    job: Job,
    *,
    trials: int = DEFAULT_TRIALS,
    backend: str | Backend | None = "auto",
    seed: int = 0,
    headroom_bytes: float | None = None,
    output_dir: str | Path | None = None,
    resume: str | Path | None = None,
    compare: Sequence[str] = (),
    space_options: SpaceOptions | None = None,
    exhaustive_threshold: int | None = None,
    address: str | None = None,
    verbose: bool = False,
    progress: ProgressFactory | bool | None = None,
    naming: Naming = "options",
    use_seeds: bool = True,
    max_concurrent: int = 1,
) -> SearchResult:
    """Search the layouts of `job`; see the module docstring. Returns what finished (also on Ctrl-C).

    `trials`: the budget of trials (seeds included). `headroom_bytes`: kept free on each GPU beyond the memory
    model's own allowance (default 0). `compare`: layout texts (`"tp=2,pp=4,ep=8"`) evaluated too. `exhaustive_threshold`:
    evaluate the whole feasible space when it has at most this many layouts (default: the budget).
    `address`: an existing Ray cluster (`"auto"` or `ray://...`); without it a local Ray is started and
    shut down. `progress`: a `ProgressFactory` (called once with the trial totals; the UI passes a rich bar,
    `autotune.outputs.progress.progress_factory`), or None for no progress. Raises ValueError for bad input.
    """
    t_start = time.perf_counter()
    if trials < 1:
        raise ValueError(f"`trials >= 1` must hold, but got (trials={trials}).")
    options = space_options or SpaceOptions()
    headroom = default_headroom_bytes(job) if headroom_bytes is None else float(headroom_bytes)
    if not 0 <= headroom < job.cluster.gpu.memory_bytes:
        raise ValueError(f"the memory headroom must be at least 0 and below the GPU's "
                         f"{job.cluster.gpu.memory_gib:.0f} GiB, but got {headroom / GIB:.1f} GiB.")
    folder = Path(resume) if resume is not None else Path(output_dir) if output_dir else default_output_dir(job)
    meta = read_meta(folder) if resume is not None else None
    if resume is not None:
        _check_resume(folder, job, meta)
        trials = int(meta.get("trials", trials)) if meta else trials
        seed, naming = int(meta.get("seed", seed)), meta.get("naming", naming)
        headroom = float(meta.get("headroom_bytes", headroom))
    folder.mkdir(parents=True, exist_ok=True)
    capacity = job.cluster.gpu.memory_bytes - headroom
    space = feasible_space(job, options)
    backend_obj, backend_name = _resolve_backend(backend, headroom)
    user = parse_user_layouts(job, compare)
    inside, outside = _split_user(space, user)
    seeds = (rule_of_thumb_seeds(job, space) if use_seeds else []) + inside
    done = read_trials(folder, capacity) if resume is not None else []
    threshold = trials if exhaustive_threshold is None else exhaustive_threshold
    exhaustive = meta["mode"] == "exhaustive" if meta else space.size <= threshold
    plan = SearchPlan(job=job, space=space, backend=backend_obj, backend_name=backend_name, capacity_bytes=capacity,
                      headroom_bytes=headroom, seed=seed, trials=trials, exhaustive=exhaustive,
                      naming=naming, seeds=tuple(seeds), fixed=tuple(outside), done=tuple(done), folder=folder,
                      max_concurrent=max_concurrent, progress=progress if callable(progress) else None)
    meta = {"fingerprint": job_fingerprint(job), "job": job_summary(job), "trials": trials, "seed": seed,
            "naming": naming, "headroom_bytes": headroom, "backend": backend_name, "space_size": space.size,
            "mode": "exhaustive" if plan.exhaustive else "search", "completed": bool(meta and meta.get("completed")),
            "compare": list(compare), "study": f"sqlite:///{(folder / STUDY_DB).resolve()}"}
    write_meta(folder, meta)
    stats: dict[str, Any] = {"timings": {"setup_s": time.perf_counter() - t_start,
                                         "started_at_s": _since_process_start() - (time.perf_counter() - t_start)}}
    records, interrupted = list(done), False
    if _remaining(plan) > 0 and space.size + len(outside) > 0:
        log = TrialLog(folder)
        try:
            with _ray_session(address=address, verbose=verbose, stats=stats):
                t0 = time.perf_counter()
                from autotune.tuning.tune_glue import run_tune

                new, interrupted, tune_stats = run_tune(plan, log, verbose=verbose)
                records += new
                stats.update(tune_stats)
                stats["timings"]["search_s"] = time.perf_counter() - t0
        except KeyboardInterrupt:
            interrupted = True
            records = read_trials(folder, capacity)
        finally:
            log.close()
            writer = stats.pop("_study_writer", None)
            if writer is not None:
                writer.join()
                stats.update({k: v for k, v in writer.stats.items() if k.startswith("study_write")})
    result = SearchResult(job=job, records=tuple(records), capacity_bytes=capacity, headroom_bytes=headroom,
                          mode=meta["mode"], backend=backend_name, seed=seed, space_size=space.size, stats=stats,
                          interrupted=interrupted, output_dir=str(folder))
    stats["timings"]["run_search_s"] = time.perf_counter() - t_start
    meta["completed"] = not interrupted and _remaining(plan, len(records) - len(done)) <= 0
    meta["finished_trials"] = len(records)
    meta["stats"] = stats
    write_meta(folder, meta)
    return result


def _since_process_start() -> float:
    """Seconds since this process started (interpreter and imports before the search), or 0 if unknown."""
    try:
        import psutil  # a Ray dependency

        return time.time() - psutil.Process().create_time()
    except Exception:
        return 0.0


def _remaining(plan: SearchPlan, new: int = 0) -> int:
    """Trials (search) or layouts (exhaustive) still to run, counting `new` ones run this time."""
    finished = len(plan.done) + new
    if plan.exhaustive:
        return plan.space.size + len(plan.fixed) - finished
    return plan.trials + len(plan.fixed) - finished


@contextlib.contextmanager
def _ray_session(*, address: str | None, verbose: bool, stats: dict[str, Any]) -> Iterator[None]:
    """Connect to `address`, or start a quiet local Ray (dashboard on 127.0.0.1 only) and shut it down after.

    A Ray this process already runs is used as is and left running (tests share one session).
    """
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no ~/.ray/auth_token for a local, loopback-only Ray
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # no CSV/JSON/TensorBoard files per trial
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "3600")  # results persist in trials.csv and study.db
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"  # a failed trial has no metrics: it is recorded, not fatal
    t0 = time.perf_counter()
    import ray

    level = logging.INFO if verbose else logging.ERROR
    for name in ("ray", "ray.tune", "ray.train", "ray.data", "optuna"):
        logging.getLogger(name).setLevel(level)
    started = False
    # Import Tune and Optuna (1-2 s) on a thread while ray.init waits for Ray's processes to come up.
    preload = threading.Thread(target=_preload_tune, name="autotune-preload", daemon=True)
    preload.start()
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"log_to_driver": verbose, "logging_level": level, "configure_logging": True}
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, dashboard_host="127.0.0.1", **kwargs)
        started = True
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
            pool.shutdown_pool()
        if started:
            t1 = time.perf_counter()
            ray.shutdown()
            stats["timings"]["ray_shutdown_s"] = time.perf_counter() - t1


def _preload_tune() -> None:
    with contextlib.suppress(Exception):
        import autotune.tuning.tune_glue  # noqa: F401


def exhaustive_batches(layouts: Sequence[Layout], batches: int = EXHAUSTIVE_BATCHES) -> list[list[str]]:
    """Layout texts split into at most `batches` nearly equal lists (one Tune trial each)."""
    if not layouts:
        return []
    size = math.ceil(len(layouts) / batches)
    return [[str(l) for l in layouts[i:i + size]] for i in range(0, len(layouts), size)]


def unmeasured_layout(space: FeasibleSpace, measured: set[Layout], rng: random.Random) -> Layout | None:
    """A random layout of `space` not in `measured` (None when every layout is measured)."""
    left = [l for l in space.layouts() if l not in measured]
    return rng.choice(left) if left else None


def cleanup_dir(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def tune_storage_dir() -> str:
    return tempfile.mkdtemp(prefix="autotune-tune-")

"""The Python API: the same engine as the CLI, for notebooks and scripts.

    >>> import autotune
    >>> result = autotune.search(model="mixtral", nodes=4, trials=64, seed=0)     # doctest: +SKIP
    >>> result.best                                  # the fastest feasible Layout     # doctest: +SKIP
    >>> result.trials.head()                         # every trial, a pandas DataFrame # doctest: +SKIP
    >>> result.pareto                                # the throughput/memory front     # doctest: +SKIP
    >>> print(result.launch["megatron_lm"])          # launch forms of the winner      # doctest: +SKIP
    >>> result.plot_pareto()                         # matplotlib Figure               # doctest: +SKIP
    >>> autotune.estimate("llama3-70b", "tp=8,pp=4", nodes=4)                           # doctest: +SKIP

`search` and the CLI build the `Job` the same way (catalog model, `build_cluster`, `TrainingSpec`) and
call the same `run_search`, so the same inputs and seed give the same ranking.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from autotune.cost.calibration_file import CalibrationFile, read_calibration
from autotune.outputs.view import Result
from autotune.ui.request import JOB_OPTIONS, JobOptions, JobRequest
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.model import ModelSpec
from search_spaces.units import GIB

if TYPE_CHECKING:

    from autotune.ui.dashboard import Dashboard
    from search_spaces.measurement import Measurement

__all__ = ["make_job", "search", "estimate", "profile", "ray_session", "RaySession", "Result", "DEFAULT_TRIALS",
           "DEFAULT_SEED"]

DEFAULT_TRIALS = 64
DEFAULT_SEED = 0


def make_job(model: str | Path | ModelSpec, **job: Unpack[JobOptions]) -> Job:
    """The `Job` the CLI would build from the same flags (`autotune.ui.request.JobRequest`, the one path).

    `model`: a catalog name (`"mixtral"`), a HF `config.json` path, or a `ModelSpec`.
    `cluster`: a `ClusterSpec` (see `autotune.ui.clusters.build`), a cluster YAML path, or None to build one
    from `nodes`, `gpus_per_node`, `gpu`, `intra_node`, `inter_node` (CLI defaults: 1 x 8 H100, IB NDR).
    `seq_length`, `global_batch_size`, `precision`: the CLI's defaults (4096, 256, bf16) when left out.
    `training`: further `TrainingSpec` fields by name (`{"fp8_recipe": "mxfp8", "grad_reduce_in_fp32": True}`);
    the defaults are Megatron-Bridge's performance configs (`search_spaces/training.py`).

        >>> make_job("mixtral", nodes=4).world_size
        32
    """
    return JobRequest.of(model, job).job()


def _job_or_build(model: str | Path | ModelSpec | Job, job_kwargs: Mapping[str, Any]) -> Job:
    if isinstance(model, Job):
        given = {k: v for k, v in job_kwargs.items() if v is not None}
        if given:
            raise ValueError(f"give either a Job or the job's parts {sorted(given)}, not both.")
        return model
    return JobRequest.of(model, job_kwargs).job()


def search(
    model: str | Path | ModelSpec | Job,
    *,
    trials: int = DEFAULT_TRIALS,
    backend: str | Any = "auto",
    seed: int = DEFAULT_SEED,
    headroom_gib: float | None = None,
    output_dir: str | Path | None = None,
    dashboard: bool | Dashboard = False,
    calibration: str | Path | CalibrationFile | None = None,
    **options: Any,
) -> Result:
    """Search the layouts of `model` on a cluster and return a `Result`.

    The job is `model` itself when it is a `Job`, else `make_job(model, ...)` with the cluster and
    training keywords. `trials`, `seed`, `backend` (`"auto"`: megatron where GPUs are visible, else
    analytic) and `headroom_gib` (default: none kept, but the pick leaves the memory model's error free) mean what
    the CLI's flags mean; with the same inputs the ranking is the same. The search writes its files (trials.csv,
    best.json, launch files, plots, `report.html`) into `output_dir` (empty or new), by default a new temporary folder
    (`tempfile.mkdtemp`, kept after the call; `result.output_dir` says where), never into the notebook's or
    script's own folder. `force=True` moves a non-empty `output_dir` aside; `resume=DIR` continues one.
    Extra `options` go to `autotune.tuning.driver.run_search` unchanged (`compare=`, `resume=`, `address=` ...).

    `calibration`: a calibration file (`python -m autotune calibrate`'s YAML, or a `CalibrationFile`) whose factors
    the cost model applies, as the CLI's `--calibration`; `result.stats["calibration"]` names it.

    `dashboard=True` starts a local Ray with its dashboard on 127.0.0.1 first (see `autotune.ui.dashboard`);
    the URL is in `result.dashboard_url`. It changes where the progress shows, not the search: the analytic search
    stays the whole-space answer (its records are shown in the dashboard after); `measured_stage=True` runs trials
    on Ray Tune. A `Dashboard` from `autotune.ui.dashboard.start_local` is reused.

        >>> r = search("mixtral", nodes=4, trials=32, seed=1)     # doctest: +SKIP
        >>> r.best, r.best_measurement.tokens_per_s_per_gpu        # doctest: +SKIP
    """
    driver = _driver()
    job_options = {k: options.pop(k) for k in JOB_OPTIONS if k in options}
    job = _job_or_build(model, job_options)
    headroom_bytes = None if headroom_gib is None else headroom_gib * GIB  # None: the search's default margin
    dash = _dashboard(dashboard)
    from autotune.ui.dashboard import track_search

    # Named trials in the dashboard when Ray is connected (or `address=` names a cluster to connect to).
    backend_used = track_search(job, backend, headroom_bytes, trials, address=options.get("address"),
                                measured_stage=bool(options.get("measured_stage")))
    from autotune.outputs.files import write_outputs
    from autotune.outputs.progress import progress_factory

    options["progress"] = progress_factory(options.get("progress"))
    if output_dir is None and options.get("resume") is None:
        import tempfile

        output_dir = tempfile.mkdtemp(prefix=f"autotune-{job.model.name}-{job.cluster.nodes}n-")
    # best.json, launch files, report.html and the plots: written while the folder is locked, before
    # search.json says `completed`
    options.setdefault("finish", lambda r: write_outputs(r, r.output_dir))
    raw = driver.run_search(job, trials=trials, backend=backend_used, seed=seed, headroom_bytes=headroom_bytes,
                            output_dir=output_dir, calibration=_calibration(calibration), **options)
    from autotune.ui.dashboard import report_result

    report_result(raw)  # an analytic search with the dashboard: its records shown there too
    return Result(raw, dashboard_url=None if dash is None else dash.url)


def _calibration(calibration: str | Path | CalibrationFile | None) -> CalibrationFile | None:
    """A `CalibrationFile` from a path (read and validated), a `CalibrationFile` as it is, None for none."""
    if calibration is None or isinstance(calibration, CalibrationFile):
        return calibration
    return read_calibration(calibration)


def _driver():
    """The search driver module `autotune.tuning.driver` (imported on first use: it brings Ray and Optuna)."""
    import importlib

    return importlib.import_module("autotune.tuning.driver")


def _dashboard(dashboard: bool | Dashboard) -> Dashboard | None:
    if dashboard is False or dashboard is None:
        return None
    from autotune.ui import dashboard as dash_module

    if isinstance(dashboard, dash_module.Dashboard):
        return dashboard
    return dash_module.start_local()


def estimate(
    model: str | Path | ModelSpec | Job,
    layout: str | Layout,
    *,
    headroom_gib: float | None = None,
    calibration: str | Path | CalibrationFile | None = None,
    **job_options: Unpack[JobOptions],
) -> Measurement:
    """The analytic estimate of one layout: memory and time breakdowns, tokens/s per GPU, MFU, status.

    `layout` is a `Layout` or its text form (`"tp=2,pp=4,ep=8,sp=true"`, dp derived from the world size).
    A layout that breaks a rule or does not fit comes back with `status` "invalid" or "oom" and the
    reasons, never as an exception. `headroom_gib` is kept free on each GPU when judging out-of-memory
    (the CLI's `estimate --headroom-gib`; default the search's, 0). `calibration`: a calibration file or
    `CalibrationFile` (the CLI's `--calibration`); the measurement's `extra["calibration"]` names it.

        >>> m = estimate("mixtral", "tp=2,pp=2,ep=8,sp=true", nodes=4)   # doctest: +SKIP
        >>> m.status, round(m.memory_gib, 1), m.time["pp_bubble"]        # doctest: +SKIP
    """
    from search_spaces.layout import parse_layout

    job = _job_or_build(model, job_options)
    parsed = layout if isinstance(layout, Layout) else parse_layout(layout, world_size=job.world_size)
    from autotune.cost.analytic import AnalyticBackend

    headroom = _driver().default_headroom_bytes(job) if headroom_gib is None else headroom_gib * GIB
    cal_file = _calibration(calibration)
    if cal_file is None:
        return AnalyticBackend(headroom_bytes=headroom).evaluate(job, parsed)
    cal = cal_file.calibration(job.cluster.gpu)
    m = AnalyticBackend(headroom_bytes=headroom, calibration=cal).evaluate(job, parsed)
    m.extra["calibration"] = cal_file.summary()
    return m


def profile(
    model: str | Path | ModelSpec | Job,
    *,
    layouts: Sequence[str | Layout] = (),
    top: int = 3,
    max_workers: int | None = None,
    output: str | Path | None = None,
    **job_options: Unpack[JobOptions],
) -> Any:
    """Profile one node, plan for many: the CLI's `calibrate --profile` (`autotune.tuning.measured_calibration`).

    Each of `layouts` (default: the analytic ranking's best `top` for the job) runs as its one-node stage probe on
    the megatron backend (GPUs where Ray sees them, else the CPU proxy, `max_workers` ranks at most), the collectives
    of the hardware at hand are timed, and the calibration factors are fitted. Returns the `Profile`
    (`.fit.factors`, `.summary()`, `.calibration(job)`); with `output` the calibration file is written there too (a
    CPU-proxy file says `source: megatron-cpu-proxy`, and no verb applies it).

        >>> p = profile("deepseek-v3", nodes=128, top=2, output="my-cluster.yaml")   # doctest: +SKIP
        >>> p.summary()["factors"]                                                   # doctest: +SKIP
    """
    from autotune.cost.calibration_file import write_calibration
    from autotune.tuning.backends import get_backend
    from autotune.tuning.measured_calibration import run_profile, top_candidates
    from search_spaces.layout import parse_layout
    from search_spaces.rules import check

    job = _job_or_build(model, job_options)
    candidates = [x if isinstance(x, Layout) else parse_layout(x, world_size=job.world_size) for x in layouts]
    for layout in candidates:
        broken = check(job, layout)
        if broken:
            raise ValueError(f"layout {layout} breaks {broken[0].rule}: {broken[0].message}")
    if max_workers is not None and max_workers < 1:
        raise ValueError(f"max_workers must be at least 1, but got {max_workers}.")
    backend: Any = get_backend("megatron")
    backend = backend.inner if max_workers is None else backend.inner.with_options(max_workers=max_workers)
    result = run_profile(job, candidates or top_candidates(job, top), backend)
    cal = result.calibration(job, path=str(output or ""))
    if output is not None and cal is not None:
        write_calibration(output, cal)
    return result


class RaySession:
    """One quiet local Ray kept up for several searches (each search otherwise starts and stops its own).

    Started by `search_spaces.ray_session.start_local`: every port on 127.0.0.1, Ray's token auth on.

        >>> ray = ray_session()          # doctest: +SKIP
        >>> a = search("mixtral", nodes=4, trials=32); b = search("mixtral", nodes=8, trials=32)   # doctest: +SKIP
        >>> ray.close()                  # doctest: +SKIP

    Also a context manager (`with ray_session(): ...`). Joins a Ray this process already runs.
    """

    def __init__(self) -> None:
        import contextlib

        self._stack = contextlib.ExitStack()
        from autotune.tuning.ray_run import ray_session

        self._stack.enter_context(ray_session(address=None, verbose=False, stats={}))

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> RaySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ray_session() -> RaySession:
    """Start (or join) a local Ray that stays up until `.close()`; see `RaySession`."""
    return RaySession()

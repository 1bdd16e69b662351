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

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.cli import DEFAULT_GLOBAL_BATCH_SIZE, DEFAULT_SEQ_LENGTH  # the CLI's defaults, not copies
from search_spaces.cluster import ClusterSpec
from search_spaces.job import Job
from search_spaces.layout import Layout, TrainingSpec
from search_spaces.model import ModelSpec

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from autotune.dashboard import Dashboard
    from autotune.measurement import Measurement

__all__ = ["make_job", "search", "estimate", "ray_session", "RaySession", "Result", "DEFAULT_TRIALS", "DEFAULT_SEED"]

GIB = 1024**3
DEFAULT_TRIALS = 64
DEFAULT_SEED = 0


def make_job(
    model: str | Path | ModelSpec,
    *,
    cluster: ClusterSpec | str | Path | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    gpu: str | Any | None = None,
    intra_node: str | Any | None = None,
    inter_node: str | Any | None = None,
    seq_length: int = DEFAULT_SEQ_LENGTH,
    global_batch_size: int = DEFAULT_GLOBAL_BATCH_SIZE,
    precision: str = "bf16",
) -> Job:
    """The `Job` the CLI would build from the same flags.

    `model`: a catalog name (`"mixtral"`), a HF `config.json` path, or a `ModelSpec`.
    `cluster`: a `ClusterSpec` (see `autotune.clusters.build`), a cluster YAML path, or None to build one
    from `nodes`, `gpus_per_node`, `gpu`, `intra_node`, `inter_node` (CLI defaults: 1 x 8 H100, IB NDR).

        >>> make_job("mixtral", nodes=4).world_size
        32
    """
    from autotune import clusters, models

    spec = models.resolve(model)
    cluster_spec = clusters.resolve(cluster, nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu,
                                    intra_node=intra_node, inter_node=inter_node)
    training = TrainingSpec(seq_length=seq_length, global_batch_size=global_batch_size, precision=precision)  # type: ignore[arg-type]
    cluster_spec.gpu.peak_flops(training.precision)  # FP8 on a GPU without FP8 units: a clear error now
    return Job(model=spec, cluster=cluster_spec, training=training)


def _job_or_build(model: str | Path | ModelSpec | Job, job_kwargs: Mapping[str, Any]) -> Job:
    if isinstance(model, Job):
        given = {k: v for k, v in job_kwargs.items() if v is not None}
        if given:
            raise ValueError(f"give either a Job or the job's parts {sorted(given)}, not both.")
        return model
    return make_job(model, **{k: v for k, v in job_kwargs.items() if v is not None})


def search(
    model: str | Path | ModelSpec | Job,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    gpu: str | Any | None = None,
    intra_node: str | Any | None = None,
    inter_node: str | Any | None = None,
    cluster: ClusterSpec | str | Path | None = None,
    seq_length: int | None = None,
    global_batch_size: int | None = None,
    precision: str | None = None,
    trials: int = DEFAULT_TRIALS,
    backend: str | Any = "auto",
    seed: int = DEFAULT_SEED,
    headroom_gib: float | None = None,
    output_dir: str | Path | None = None,
    dashboard: bool | Dashboard = False,
    **options: Any,
) -> Result:
    """Search the layouts of `model` on a cluster and return a `Result`.

    The job is `model` itself when it is a `Job`, else `make_job(model, ...)` with the cluster and
    training keywords. `trials`, `seed`, `backend` (`"auto"`: megatron where GPUs are visible, else
    analytic) and `headroom_gib` (default 5% of the GPU's memory) mean what the CLI's flags mean; with the
    same inputs the ranking is the same. The search writes the CLI's output folder (`output_dir`, default
    `autotune_runs/<model>-<nodes>n-<time>`): trials.csv, best.json, launch files, plots, `report.html`.
    Extra `options` go to `autotune.driver.run_search` unchanged (`compare=`, `resume=`, `address=` ...).

    `dashboard=True` starts a local Ray with its dashboard on 127.0.0.1 first (see `autotune.dashboard`);
    the URL is in `result.dashboard_url`. A `Dashboard` from `autotune.dashboard.start_local` is reused.

        >>> r = search("mixtral", nodes=4, trials=32, seed=1)     # doctest: +SKIP
        >>> r.best, r.best_measurement.tokens_per_s_per_gpu        # doctest: +SKIP
    """
    driver = _driver()
    job = _job_or_build(model, dict(nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu, intra_node=intra_node,
                                    inter_node=inter_node, cluster=cluster, seq_length=seq_length,
                                    global_batch_size=global_batch_size, precision=precision))
    headroom_bytes = driver.default_headroom_bytes(job) if headroom_gib is None else headroom_gib * GIB
    dash = _dashboard(dashboard)
    from autotune.dashboard import track_search

    # Named trials in the dashboard when Ray is connected (or `address=` names a cluster to connect to).
    backend_used = track_search(job, backend, headroom_bytes, trials, address=options.get("address"))
    raw = driver.run_search(job, trials=trials, backend=backend_used, seed=seed, headroom_bytes=headroom_bytes,
                            output_dir=output_dir, **options)
    result = Result(raw, dashboard_url=None if dash is None else dash.url)
    folder = result.output_dir
    if folder is not None and not (Path(folder) / "report.html").exists():
        result.write_report(folder)  # unless the driver already wrote it
    return result


def _driver():
    """The search driver module `autotune.driver` (imported on first use: it brings Ray and Optuna)."""
    import importlib

    return importlib.import_module("autotune.driver")


def _dashboard(dashboard: bool | Dashboard) -> Dashboard | None:
    if dashboard is False or dashboard is None:
        return None
    from autotune import dashboard as dash_module

    if isinstance(dashboard, dash_module.Dashboard):
        return dashboard
    return dash_module.start_local()


def estimate(
    model: str | Path | ModelSpec | Job,
    layout: str | Layout,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    gpu: str | Any | None = None,
    intra_node: str | Any | None = None,
    inter_node: str | Any | None = None,
    cluster: ClusterSpec | str | Path | None = None,
    seq_length: int | None = None,
    global_batch_size: int | None = None,
    precision: str | None = None,
    headroom_gib: float = 0.0,
) -> Measurement:
    """The analytic estimate of one layout: memory and time breakdowns, tokens/s per GPU, MFU, status.

    `layout` is a `Layout` or its text form (`"tp=2,pp=4,ep=8,sp=true"`, dp derived from the world size).
    A layout that breaks a rule or does not fit comes back with `status` "invalid" or "oom" and the
    reasons, never as an exception. `headroom_gib` is kept free on each GPU when judging out-of-memory
    (the CLI's `estimate --headroom-gib`).

        >>> m = estimate("mixtral", "tp=2,pp=2,ep=8,sp=true", nodes=4)   # doctest: +SKIP
        >>> m.status, round(m.memory_gib, 1), m.time["pp_bubble"]        # doctest: +SKIP
    """
    from search_spaces.layout import parse_layout

    job = _job_or_build(model, dict(nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu, intra_node=intra_node,
                                    inter_node=inter_node, cluster=cluster, seq_length=seq_length,
                                    global_batch_size=global_batch_size, precision=precision))
    parsed = layout if isinstance(layout, Layout) else parse_layout(layout, world_size=job.world_size)
    from autotune.analytic import AnalyticBackend

    return AnalyticBackend(headroom_bytes=headroom_gib * GIB).evaluate(job, parsed)


class RaySession:
    """One quiet local Ray kept up for several searches (each search otherwise starts and stops its own).

        >>> ray = ray_session()          # doctest: +SKIP
        >>> a = search("mixtral", nodes=4, trials=32); b = search("mixtral", nodes=8, trials=32)   # doctest: +SKIP
        >>> ray.close()                  # doctest: +SKIP

    Also a context manager (`with ray_session(): ...`). Joins a Ray this process already runs.
    """

    def __init__(self) -> None:
        import contextlib

        self._stack = contextlib.ExitStack()
        self._stack.enter_context(_driver()._ray_session(address=None, verbose=False, stats={}))

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> RaySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ray_session() -> RaySession:
    """Start (or join) a local Ray that stays up until `.close()`; see `RaySession`."""
    return RaySession()


class Result:
    """A search's outcome for people: the best layout, the Pareto front, every trial, launch forms, plots.

    Wraps the search driver's result (`raw`); everything here is derived from it.
    """

    def __init__(self, raw: Any, *, dashboard_url: str | None = None) -> None:
        self.raw = raw
        self.dashboard_url = dashboard_url
        self._trials: pd.DataFrame | None = None

    # --- facts -----------------------------------------------------------------------------
    @property
    def job(self) -> Job:
        return self.raw.job

    @property
    def measurements(self) -> list[Measurement]:
        """Every trial's measurement, in trial order."""
        return list(self.raw.measurements)

    @property
    def best_measurement(self) -> Measurement | None:
        """The fastest feasible trial (highest tokens/s per GPU, then least memory), or None when nothing fits."""
        return self.raw.best

    @property
    def best(self) -> Layout | None:
        """The fastest feasible layout, or None when nothing fits."""
        best = self.best_measurement
        return None if best is None else best.layout

    @property
    def capacity_gib(self) -> float:
        """The GPU's memory (the line on the plots); feasibility also keeps the search's headroom free."""
        return self.job.cluster.gpu.memory_gib

    @property
    def output_dir(self) -> str | None:
        return getattr(self.raw, "output_dir", None)

    @property
    def title(self) -> str:
        c = self.job.cluster
        return f"autotune: {self.job.model.name} on {c.nodes} x {c.gpus_per_node} {c.gpu.name}"

    # --- tables ----------------------------------------------------------------------------
    @property
    def trials(self) -> pd.DataFrame:
        """One row per trial: number, layout fields, status, feasible, tokens/s per GPU, memory, and the
        `time.*` (s) and `memory.*` (bytes) breakdowns."""
        if self._trials is None:
            from autotune.plots import trials_frame

            self._trials = trials_frame(self.raw.records)
        return self._trials

    @property
    def pareto(self) -> pd.DataFrame:
        """Feasible layouts no other beats on both tokens/s per GPU (higher) and memory per GPU (lower), by memory."""
        from autotune.plots import trials_frame

        return trials_frame(self.raw.pareto)

    def top(self, k: int = 10) -> pd.DataFrame:
        """The k fastest distinct feasible layouts, in the search's (and the CLI's) ranking order."""
        from autotune.plots import trials_frame

        return trials_frame(self.raw.ranked[:k])

    @property
    def ranking(self) -> list[Layout]:
        """Every distinct feasible layout, best first: the order the CLI prints."""
        return [r.layout for r in self.raw.ranked]

    # --- launch forms ----------------------------------------------------------------------
    @property
    def launch(self) -> dict[str, str]:
        """The winner as launch text: `megatron_bridge` (Megatron-Bridge overrides), `megatron_lm` (Megatron-LM arguments)."""
        return self.launch_forms()

    def launch_forms(self) -> dict[str, str]:
        return dict(self.raw.launch())

    def job_summary(self) -> dict[str, object]:
        j, c = self.job, self.job.cluster
        return {
            "model": j.model.name,
            "parameters (B)": round(j.model.total_params / 1e9, 2),
            "cluster": f"{c.nodes} nodes x {c.gpus_per_node} {c.gpu.name} ({c.gpu.memory_gib:.0f} GiB)",
            "links": f"{c.intra_node.name} inside a node, {c.inter_node.name} between nodes",
            "sequence length": j.training.seq_length,
            "global batch size": j.training.global_batch_size,
            "precision": j.training.precision,
        }

    # --- plots and report ------------------------------------------------------------------
    def plot_pareto(self) -> Figure:
        from autotune import plots

        return plots.pareto(self.trials, capacity_gib=self.capacity_gib)

    def plot_time_breakdown(self, k: int = 5) -> Figure:
        from autotune import plots

        return plots.time_breakdown(self.trials, k=k)

    def plot_memory_breakdown(self, k: int = 5) -> Figure:
        from autotune import plots

        return plots.memory_breakdown(self.trials, k=k, capacity_gib=self.capacity_gib)

    def plot_progress(self) -> Figure:
        from autotune import plots

        return plots.progress(self.trials)

    def write_report(self, folder: str | Path) -> str:
        """Write `report.html` and the plot PNGs into `folder`; returns the report's path."""
        from autotune.report import write_report

        return write_report(self, folder)

    def _repr_html_(self) -> str:
        """Jupyter's view: the job, the winner with its launch forms, the top layouts (the report's sections)."""
        from autotune.report import summary_html

        return summary_html(self)

    def __repr__(self) -> str:
        feasible = int(self.trials["feasible"].sum()) if len(self.trials) else 0
        return f"<autotune.Result {self.job.model.name}: {len(self.trials)} trials, {feasible} feasible, best {self.best}>"

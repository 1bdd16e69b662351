"""The search driver: the whole space scored by the model, then (with a measuring backend) Ray Tune measures.

    run_search(job, trials=64, backend="analytic", seed=0) -> SearchResult

1. The analytic stage (always; no Ray): every layout of `search_spaces.space.feasible_space(job, options)` is
   scored by the vectorised cost models (`autotune.tuning.analytic_pass`), so the pick is the exact optimum of the
   model, up to ties (`autotune.tuning.ranking`: within 2% the most free memory, then the simplest layout; the
   confidence says whether other layouts lie within the model's band). With the analytic backend that is the
   answer: trials.csv holds the ranked top `trials`, the Pareto front and the user's `--layout`s (an invalid one is
   recorded with its violations), and Ray is never started.
2. The measured stage (a measuring backend, e.g. `--backend megatron`, or `--address`/`--dashboard`): Ray Tune runs
   the trials, a strategy (`autotune.tuning.strategy`: a plain policy object, `guided` by default) proposes them
   from the analytic front corrected by the measurements, and Ray Tune's successive halving on timed steps
   (`autotune.tuning.tune_policy`) stops the slower candidates early. User layouts run as fixed trials. The pick
   is by measurement (`autotune.tuning.analytic_search.measured_decision`). When the feasible space is no larger
   than the budget (or `exhaustive_threshold`) it is measured whole, in batches of layouts per Tune trial.
- Results last: trials.csv is appended per trial (each row carries the job's fingerprint), the study is
  written to SQLite (study.db) from the same records; `resume` continues a folder without rerunning
  finished trials (and refuses rows of another job), and a completed search returns at once.
- The folder is locked for the run and never mixed: see `autotune/tuning/run_folder.py`.

Ray and Optuna are imported inside functions, so importing this module is cheap. The Tune glue
(searcher, callback, trainable) is in `autotune/tuning/tune_glue.py` and `autotune/tuning/tune_policy.py`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from autotune.cost.efficiency import DEFAULT_CALIBRATION
from autotune.tuning.answer import SearchResult
from autotune.tuning.decision import Decision
from autotune.tuning.ray_run import TERMINATED, ray_session
from autotune.tuning.results import (
    CALIBRATION_YAML,
    META_JSON,
    STUDY_DB,
    TrialLog,
    TrialRecord,
    counted,
    job_fingerprint,
    job_summary,
    read_meta,
    read_trials,
    write_meta,
)
from autotune.tuning.run_folder import claim
from autotune.tuning.run_folder import default_output_dir as _default_output_dir
from autotune.tuning.seeds import Seed, parse_user_layouts, rule_of_thumb_seeds
from autotune.tuning.space_sampler import Naming
from autotune.tuning.strategy import DEFAULT_STRATEGY, STRATEGIES
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.measurement import Backend
from search_spaces.published_recipes import PublishedRecipe, published_recipe
from search_spaces.space import DEFAULT_SPACE, FeasibleSpace, SpaceOptions, feasible_space
from search_spaces.units import GIB

__all__ = ["run_search", "SearchPlan", "default_output_dir", "default_headroom_bytes",
           "DEFAULT_TRIALS",
           "DEFAULT_HEADROOM_FRACTION", "METRICS", "MODES", "ProgressFactory", "ProgressSink"]

DEFAULT_TRIALS = 64
MAX_SEED = 2**32  # seeds are 0 .. 2**32 - 1 (numpy's RandomState, under Optuna's samplers)
# of the GPU's memory, kept free beyond the memory model's own allowance (CUDA context, NCCL, userbuffers, the
# allocator's reserve: autotune/cost/allowance.py), the same for `estimate` and the search
DEFAULT_HEADROOM_FRACTION = 0.0
METRICS = ("tokens_per_s_per_gpu", "memory_gib")
MODES = ("max", "min")


def default_headroom_bytes(job: Job) -> float:
    return DEFAULT_HEADROOM_FRACTION * job.cluster.gpu.memory_bytes


def default_output_dir(job: Job, root: str | Path = "autotune_runs") -> Path:
    """A fresh folder name: `<model>-<nodes>n-<time to the microsecond>-<random>` (`run_folder`)."""
    return _default_output_dir(job.model.name, job.cluster.nodes, root)


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
    analytic: Any = None  # the AnalyticAnswer of the whole space (the strategies start from it)
    strategy: str = "guided"  # autotune.tuning.strategy.STRATEGIES key or module:Class
    fingerprint: str = ""  # job_fingerprint(job), written in every trials.csv row
    max_concurrent: int | None = 1  # None: the connected cluster's CPUs
    progress: ProgressFactory | None = None
    notice: Callable[[str], None] | None = None  # one line per infrastructure failure (default: stderr)
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


def _with_backend_option(backend: Backend, name: str, value: Any) -> Backend:
    """`backend` with its dataclass field `name` set to `value` (also through a wrapper's `inner`, as the megatron
    backend is wrapped); unchanged when it has no such field."""
    import dataclasses

    if dataclasses.is_dataclass(backend) and not isinstance(backend, type):
        names = {f.name for f in dataclasses.fields(backend)}
        if name in names:
            return dataclasses.replace(backend, **{name: value})
        if "inner" in names:
            inner = _with_backend_option(backend.inner, name, value)
            return dataclasses.replace(backend, inner=inner)
    return backend


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


def _configured_backend(job: Job, backend: str | Backend | None, headroom: float, calibration: Any,
                        options: SpaceOptions) -> tuple[Backend, str, Any]:
    """(the backend, its name, the Calibration its figures use): a `--calibration` file's factors, and the space's
    rule that experts stay inside a node, passed on to it."""
    backend_obj, backend_name = _resolve_backend(backend, headroom)
    cal = DEFAULT_CALIBRATION if calibration is None else calibration.calibration(job.cluster.gpu)
    if calibration is not None:  # the analytic backend's figures, or the measuring backend's predictions
        backend_obj = _with_backend_option(backend_obj, "calibration", cal)
    if options.expert_within_node:  # the measured trials keep each EP group on one node too (trainers/placement.py)
        backend_obj = _with_backend_option(backend_obj, "experts_within_node", True)
    return backend_obj, backend_name, cal


def _user_layouts(job: Job, compare: Sequence[str], baseline: bool,
                  ) -> tuple[list[Seed], tuple[PublishedRecipe, Layout] | None]:
    """(the user's layouts, NVIDIA's published recipe for the job when `baseline`): the recipe's layout is measured
    first, with a verdict of its own."""
    user = parse_user_layouts(job, compare)
    recipe = published_recipe(job) if baseline else None
    if recipe is not None and recipe[1] not in [s.layout for s in user]:
        user = [Seed(layout=recipe[1], origin="user"), *user]
    return user, recipe


def _start_study(plan: SearchPlan, records: list[TrialRecord], stats: dict[str, Any],
                 verbose: bool) -> Callable[[], None]:
    """Begin writing study.db (every mode: optuna-dashboard opens it) unless it holds these records already; the
    wait returned raises a failure and records `study_write_s`, from the start until the file is in place
    (`study_db.start_study_write`: on the analytic path a child process writes it while the report is drawn)."""
    folder, t_write = plan.folder, time.perf_counter()
    if len(records) <= len(plan.done) and (folder / STUDY_DB).exists():
        return lambda: None
    from autotune.tuning.study_db import start_study_write

    wait = start_study_write(records, plan.space, folder / STUDY_DB, naming=plan.naming,
                             capacity_bytes=plan.capacity_bytes, verbose=verbose)

    def waited() -> None:
        wait()
        stats["timings"]["study_write_s"] = time.perf_counter() - t_write

    return waited


def _concluded(plan: SearchPlan, mode: str, records: list[TrialRecord], interrupted: bool, *, user: list[Layout],
               recipe: tuple[PublishedRecipe, Layout] | None, cal: Any, stats: dict[str, Any]) -> SearchResult:
    """The search's result from its records: the decision with the verdicts on the user's layouts and the recipe,
    what the GPUs measured kept for the next search."""
    job, folder = plan.job, plan.folder
    decision = _decision(mode, records, plan.capacity_bytes, plan.analytic, user)
    if mode != "analytic" and plan.backend_name != "analytic":  # what the GPUs measured, for the next search
        stats["measured_calibration"] = write_measured_calibration(job, records, folder)
    if recipe is not None and decision is not None:
        decision = _mark_recipe(decision, job, *recipe)
    return SearchResult(job=job, records=tuple(records), capacity_bytes=plan.capacity_bytes,
                        headroom_bytes=plan.headroom_bytes, mode=mode, backend=plan.backend_name, seed=plan.seed,
                        space_size=plan.space.size, stats=stats, interrupted=interrupted, output_dir=str(folder),
                        decision=decision, calibration=cal)


def _check_resume(folder: Path, job: Job, meta: dict[str, Any] | None,
                  calibration_summary: Any = None) -> dict[str, Any]:
    if meta is None:
        raise ValueError(f"--resume {folder}: no {META_JSON} there; give the folder of an earlier search.")
    if meta.get("fingerprint") != job_fingerprint(job):
        raise ValueError(f"--resume {folder}: that search was for {_job_line(meta.get('job'))}; give the same "
                         f"model, cluster and training options to resume it.")
    if meta.get("calibration") != calibration_summary:
        raise ValueError(f"--resume {folder}: that search used calibration {_calibration_text(meta)}, this one "
                         f"{_calibration_text({'calibration': calibration_summary})}; give the same --calibration "
                         f"to resume it.")
    return meta


def _job_line(job: Any) -> str:
    """A search.json job in a few words (`mixtral-8x7b on 4 x 8 h100-sxm, seq 4096, GBS 256, bf16`)."""
    if not isinstance(job, dict):
        return "another job"
    return (f"{job.get('model')} on {job.get('nodes')} x {job.get('gpus_per_node')} {job.get('gpu')}, seq "
            f"{job.get('seq_length')}, GBS {job.get('global_batch_size')}, {job.get('precision')} (or other training "
            f"options)")[:300]


def _check_counts(trials: Any, exhaustive_threshold: Any, max_concurrent: Any) -> None:
    for name, value, low in (("trials", trials, 1), ("exhaustive_threshold", exhaustive_threshold, 0),
                             ("max_concurrent", max_concurrent, 1)):
        if value is None and name != "trials":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"`{name} >= {low}` must hold (a whole number), but got ({name}={value!r}).")


def check_seed(seed: Any) -> int:
    """A seed the samplers take: a whole number 0 <= seed < 2**32 (numpy's and Optuna's range)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_SEED:
        raise ValueError(f"`0 <= seed < 2**32` must hold (a whole number), but got (seed={seed!r}); give a seed "
                         f"from 0 to {MAX_SEED - 1}.")
    return seed


def run_search(
    job: Job,
    *,
    trials: int = DEFAULT_TRIALS,
    backend: str | Backend | None = "auto",
    seed: int = 0,
    headroom_bytes: float | None = None,
    output_dir: str | Path | None = None,
    resume: str | Path | None = None,
    force: bool = False,
    compare: Sequence[str] = (),
    space_options: SpaceOptions | None = None,
    exhaustive_threshold: int | None = None,
    address: str | None = None,
    verbose: bool = False,
    progress: ProgressFactory | bool | None = None,
    naming: Naming = "options",
    use_seeds: bool = True,
    max_concurrent: int | None = None,
    finish: Callable[[SearchResult], None] | None = None,
    strategy: str | None = None,
    measured_stage: bool | None = None,
    status: Callable[[str], None] | None = None,
    notice: Callable[[str], None] | None = None,
    baseline: bool = True,
    calibration: Any = None,
) -> SearchResult:
    """Search the layouts of `job`; see the module docstring. Returns what finished (also on Ctrl-C / SIGTERM).
    (One function on purpose: it holds the result folder's lock from the first write to the last, and its steps,
    each a helper, run in that order.)

    `trials`: the budget of trials (seeds included). `headroom_bytes`: kept free on each GPU beyond the memory
    model's own allowance; without it (None) none is kept but the pick leaves the memory model's error free when
    some layout does (a faster layout inside the error is named beside it, `Decision.riskier`). `compare`:
    layout texts (`"tp=2,pp=4,ep=8"`) evaluated too. `baseline`:
    NVIDIA's published layout for the job, when there is one (`search_spaces.published_recipes`), is evaluated
    (and measured) first, with a verdict of its own.
    `exhaustive_threshold`:
    evaluate the whole feasible space when it has at most this many layouts (default: the budget).
    `address`: an existing Ray cluster (`"auto"`, `HOST:PORT` or `ray://...`); without it a local Ray (every
    port on 127.0.0.1) is started and shut down. `max_concurrent`: trials at once (default 1 on a local Ray,
    the cluster's CPUs with `address`). `progress`: a `ProgressFactory` (called once with the trial totals; the
    UI passes a rich bar, `autotune.outputs.progress.progress_factory`), or None for no progress.

    The result folder (`output_dir`, a fresh `autotune_runs/...` by default, or `resume`) must be empty or
    missing unless resumed; `force=True` moves a non-empty one aside first. It is locked for the whole run.
    `strategy`: the measured stage's strategy (`autotune.tuning.strategy.STRATEGIES`; default guided, or front
    when analytic trials run on Ray for the dashboard).
    `measured_stage`: run the measured stage on Ray Tune (True) even with the analytic backend, whose trials then
    carry the model's figures (the dashboard, tests of the Tune machinery); None: only for a measuring backend or
    with `address`.
    `status(text)` is told each phase ("scoring 33,768 layouts with the cost models", "starting Ray") for a
    status line; `notice(text)` gets one line per trial the cluster lost (an infrastructure failure: a worker,
    raylet or node died; default: stderr). `seed`: 0 <= seed < 2**32.
    `calibration`: a `CalibrationFile` (`autotune.cost.calibration_file`, `--calibration FILE`) whose factors the cost
    model applies (to the space's scores, the user's layouts and the measured trials' predictions); None: the
    published fit, `DEFAULT_CALIBRATION`. search.json and the result's `stats["calibration"]` name it, and a resume
    must give the same one.
    `finish(result)` runs while the folder is still locked, before search.json says `completed` (the UI writes
    best.json, the launch files and the report there). Raises ValueError for bad input and `OutputError` (an
    OSError) when a result file cannot be written; either way nothing already in the folder is lost.
    """
    t_start = time.perf_counter()
    _check_counts(trials, exhaustive_threshold, max_concurrent)
    check_seed(seed)
    if strategy is not None and strategy not in STRATEGIES and ":" not in str(strategy):
        raise ValueError(f"--strategy must be one of {', '.join(STRATEGIES)} or module:Class, but got {strategy!r}.")
    options = space_options or DEFAULT_SPACE
    headroom = default_headroom_bytes(job) if headroom_bytes is None else float(headroom_bytes)
    keep_error_free = headroom_bytes is None  # the user's --headroom-gib is the margin they chose
    _check_headroom(job, headroom)
    folder = Path(resume) if resume is not None else Path(output_dir) if output_dir else default_output_dir(job)
    # Every input is checked before the folder is touched: a refused search changes nothing.
    say = status or (lambda text: None)
    say("building the feasible space")
    space = feasible_space(job, options)
    backend_obj, backend_name, cal = _configured_backend(job, backend, headroom, calibration, options)
    calibration_summary = None if calibration is None else calibration.summary()
    user, recipe = _user_layouts(job, compare, baseline)
    inside, outside = _split_user(space, user)
    seeds = (rule_of_thumb_seeds(job, space) if use_seeds else []) + inside
    fingerprint = job_fingerprint(job)
    analytic_only = _analytic_only(backend_obj, address) and not measured_stage
    with claim(folder, resume=resume is not None, force=force):
        meta = _check_resume(folder, job, read_meta(folder), calibration_summary) if resume is not None else None
        if meta is not None:  # the resumed search's own settings
            trials, seed, naming = int(meta["trials"]), int(meta.get("seed", seed)), meta.get("naming", naming)
            headroom = float(meta["headroom_bytes"])
            keep_error_free = bool(meta.get("keep_error_free", False))
            _check_headroom(job, headroom)
        capacity = job.cluster.gpu.memory_bytes - headroom
        done = read_trials(folder, capacity, job=fingerprint) if meta is not None else []
        threshold = trials if exhaustive_threshold is None else exhaustive_threshold
        t_analytic = time.perf_counter()
        say(f"scoring {space.size:,} layouts with the cost models")
        from autotune.tuning.analytic_pass import analytic_pass

        answer = analytic_pass(job, space, capacity_bytes=capacity, cal=cal, keep_error_free=keep_error_free)
        t_analytic = time.perf_counter() - t_analytic
        if meta:
            mode = meta["mode"]
        else:
            # nothing fits by the model: the measured stage has no candidate (the closest misses are the answer)
            nothing = answer.ranking.pick is None
            mode = "analytic" if analytic_only or nothing else "exhaustive" if space.size <= threshold else "search"
        plan = SearchPlan(job=job, space=space, backend=backend_obj, backend_name=backend_name,
                          capacity_bytes=capacity, headroom_bytes=headroom, seed=seed, trials=trials,
                          exhaustive=mode == "exhaustive", naming=naming, seeds=tuple(seeds), fixed=tuple(outside),
                          done=tuple(done), folder=folder, fingerprint=fingerprint,
                          max_concurrent=max_concurrent if max_concurrent is not None else (None if address else 1),
                          progress=progress if callable(progress) else None, analytic=answer, notice=notice,
                          strategy=strategy or ("front" if backend_name == "analytic" else DEFAULT_STRATEGY))
        meta = {"fingerprint": fingerprint, "job": job_summary(job), "trials": trials, "seed": seed,
                "naming": naming, "headroom_bytes": headroom, "keep_error_free": keep_error_free,
                "backend": backend_name, "space_size": space.size,
                "mode": mode, "completed": False, "strategy": plan.strategy if mode == "search" else None,
                "compare": list(compare), "study": f"sqlite:///{(folder / STUDY_DB).resolve()}",
                "recipe": None if recipe is None else {"layout": str(recipe[1]), "label": recipe[0].label},
                "calibration": calibration_summary}
        write_meta(folder, meta)
        stats: dict[str, Any] = {"timings": {"setup_s": time.perf_counter() - t_start - t_analytic,
                                             "analytic_s": t_analytic,
                                             "started_at_s": _since_process_start() - (time.perf_counter() - t_start)},
                                 "analytic": {"space_size": answer.size, "fits": int(answer.scores.fits.sum()),
                                              **{k: round(v, 4) for k, v in answer.seconds.items()}},
                                 "calibration": calibration_summary}
        meta["stats"] = stats
        try:
            if mode == "analytic":
                records, interrupted = _record_analytic(plan, [s.layout for s in user], top=trials), False
            else:
                say("starting Ray for the measured stage")
                records, interrupted = _run_trials(plan, address=address, verbose=verbose, stats=stats)
            meta["finished_trials"] = len(records)
            wait_for_study = _start_study(plan, records, stats, verbose)
            try:
                result = _concluded(plan, mode, records, interrupted, user=[s.layout for s in user],
                                    recipe=recipe, cal=cal, stats=stats)
                if finish is not None:
                    say("writing best.json, the launch files and report.html")
                    finish(result)  # best.json, launch files, report: still under the lock, before `completed`
            except BaseException:
                with contextlib.suppress(Exception):  # the first error is the one to report
                    wait_for_study()
                raise
            wait_for_study()
        except BaseException:
            with contextlib.suppress(Exception):  # say how far it got; the first error is the one to report
                meta["finished_trials"] = len(read_trials(folder, capacity, job=fingerprint))
                write_meta(folder, meta)
            raise
        stats["timings"]["run_search_s"] = time.perf_counter() - t_start
        meta["completed"] = not interrupted and (mode == "analytic" or bool(stats.get("strategy_finished"))
                                                 or _remaining(plan, records) <= 0)
        write_meta(folder, meta)
    return result


def write_measured_calibration(job: Job, records: Sequence[TrialRecord], folder: Path) -> dict[str, Any]:
    """Fit the calibration factors on a measured search's GPU trials and write `calibration.yaml` in its folder
    (`autotune.tuning.measured_calibration`). Returns {"file", "describe", "reason"}: the file written, or None and
    why not (a CPU proxy search, no GPU trial). A fit that fails is a reason, never an error: the search's own
    results are already written."""
    from autotune.cost.calibration_file import write_calibration
    from autotune.tuning.calibrate import fit_factors
    from autotune.tuning.measured_calibration import MEASURED_GPU, calibration_file, search_runs

    runs, reason = search_runs(job, records)
    if not runs:
        return {"file": None, "describe": "", "reason": reason}
    try:
        fit = fit_factors(runs)
    except ValueError as e:
        return {"file": None, "describe": "", "reason": f"no calibration written: {e}"}
    provenance = {"from": "measured search", "folder": str(folder),
                  "trials": [{"label": r.label, "layout": str(r.layout), "step_time_s": round(r.step_time_s, 6),
                              "predicted_before_s": round(b, 6), "predicted_after_s": round(a, 6)}
                             for r, b, a in zip(runs, fit.before, fit.after, strict=True)]}
    path = folder / CALIBRATION_YAML
    cal = calibration_file(fit, source=MEASURED_GPU, provenance=provenance, path=str(path))
    try:
        write_calibration(path, cal)
    except OSError as e:
        return {"file": None, "describe": "", "reason": f"cannot write {path}: {e.strerror or e}"}
    return {"file": str(path), "describe": cal.describe(), "reason": ""}


def _calibration_text(meta: dict[str, Any]) -> str:
    c = meta.get("calibration")
    if not isinstance(c, dict):
        return "none (the published fit)"
    return f"{c.get('file')} ({c.get('factors')})"[:300]


def _mark_recipe(decision: Decision, job: Job, row: PublishedRecipe, layout: Layout) -> Decision:
    """The decision with the baseline's verdict labelled with where NVIDIA published it: with the figure it
    published when the row is the job's own, else as the nearest published row with what differs and no figure."""
    text, differs = str(layout), row.differences(job)
    if differs:
        label = (f"the nearest published row ({row.label}) is another job ({'; '.join(differs)}): its layout on "
                 f"your job")
        published = None
    else:
        label, published = row.label, row.published_tokens_per_s_per_gpu
    return replace(decision, yours=tuple(
        replace(v, recipe=label, published_tokens_per_s_per_gpu=published, recipe_differs=differs)
        if v.layout == text else v for v in decision.yours))


def _analytic_only(backend: Backend, address: str | None) -> bool:
    """The analytic backend itself (not wrapped for the dashboard) and no cluster: the model's answer needs no Ray."""
    from autotune.cost.analytic import AnalyticBackend

    return type(backend) is AnalyticBackend and not address


def _decision(mode: str, records: Sequence[TrialRecord], capacity: float, answer: Any,
              user: Sequence[Layout] = ()) -> Decision | None:
    from autotune.tuning.analytic_search import analytic_decision, avoid_failed, measured_decision

    if mode == "analytic" or all(r.measurement.source == "analytic" for r in records):
        failed = {r.measurement.layout: r.measurement for r in records if r.measurement.status == "failed"}
        return avoid_failed(analytic_decision(answer, user), failed, answer, "when measured")
    return measured_decision([r.measurement for r in records], capacity, answer, user)


def _record_analytic(plan: SearchPlan, user: Sequence[Layout], *, top: int) -> list[TrialRecord]:
    """The analytic stage's records (`analytic_search.analytic_measurements`), appended to trials.csv; on resume
    the layouts already there are kept as they are."""
    from autotune.tuning.analytic_search import analytic_measurements

    records = list(plan.done)
    have = {(r.layout, r.origin) for r in records}
    number = max((r.number for r in records), default=-1) + 1
    log = TrialLog(plan.folder)
    try:
        for m, origin in analytic_measurements(plan.analytic, top=top, user=user, headroom_bytes=plan.headroom_bytes):
            if (m.layout, origin) in have:
                continue
            feasible = m.status == "ok" and m.memory_bytes is not None and m.memory_bytes <= plan.capacity_bytes
            record = TrialRecord(number=number, origin=origin, measurement=m, feasible=feasible,
                                 capacity_bytes=plan.capacity_bytes, job=plan.fingerprint)
            log.append(record, sync=False)
            records.append(record)
            number += 1
        log.sync()
    finally:
        log.close()
    return records


def _check_headroom(job: Job, headroom: float) -> None:
    if not (math.isfinite(headroom) and 0 <= headroom < job.cluster.gpu.memory_bytes):
        raise ValueError(f"the memory headroom must be at least 0 and below the GPU's "
                         f"{job.cluster.gpu.memory_gib:.0f} GiB, but got {headroom / GIB:.1f} GiB.")


def _run_trials(plan: SearchPlan, *, address: str | None, verbose: bool,
                stats: dict[str, Any]) -> tuple[list[TrialRecord], bool]:
    """Run what is left of the plan on Ray; (every record, interrupted). trials.csv is closed and Ray's objects
    are released before Ray shuts down (nothing touches Ray after `ray.shutdown()`)."""
    records, interrupted = list(plan.done), False
    if _remaining(plan) <= 0 or plan.space.size + len(plan.fixed) == 0:
        return records, False
    log = TrialLog(plan.folder)  # checks the header and cuts a torn last line before the first append
    try:
        with ray_session(address=address, verbose=verbose, stats=stats, folder=plan.folder):
            try:
                t0 = time.perf_counter()
                from autotune.tuning.tune_glue import run_tune

                new, interrupted, tune_stats = run_tune(plan, log, verbose=verbose)
                records += new
                stats.update(tune_stats)
                stats["timings"]["search_s"] = time.perf_counter() - t0
            finally:
                log.close()
    except KeyboardInterrupt:  # Ctrl-C (or SIGTERM) outside Tune's own handler: keep what is on disk
        interrupted = True
        records = read_trials(plan.folder, plan.capacity_bytes, job=plan.fingerprint)
    finally:
        log.close()
    if TERMINATED.is_set():
        stats["interrupted_by"] = "SIGTERM"
    return records, interrupted


def _since_process_start() -> float:
    """Seconds since this process started (interpreter and imports before the search), or 0 if unknown."""
    try:
        import psutil  # a Ray dependency

        return time.time() - psutil.Process().create_time()
    except Exception:
        return 0.0


def _remaining(plan: SearchPlan, records: Sequence[TrialRecord] | None = None) -> int:
    """Trials (search) or layouts (exhaustive) still to run after `records` (default: those done before)."""
    finished = len(counted(plan.done if records is None else records))
    if plan.exhaustive:
        return plan.space.size + len(plan.fixed) - finished
    return plan.trials + len(plan.fixed) - finished

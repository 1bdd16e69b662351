"""Ray Tune glue of the search driver: the trainables, the recording callback, the run.

Imported only once Ray runs (`autotune.tuning.driver.run_tune` imports it inside a function); it imports
Ray Tune and Optuna at module level.

- `evaluate_trial(config, job, backend)`: the Tune function trainable. It measures one layout (a
  search trial) or a batch of layouts (an exhaustive chunk) with the backend; a backend that raises
  or returns no Measurement gives a "failed" measurement with the reason, never a crashed search.
- Faults of the cluster, not of the layout: a measurement whose `extra["failure"]` is "infrastructure" (the
  megatron backend's word for a worker, raylet or node that died, or no placement in time) is kept as a lost
  attempt (its own row, marked `infrastructure (retried)`) and measured once more; the backend starts fresh
  workers in a fresh placement group, so Ray places them on what is left of the cluster. A Tune trial whose own
  process dies (its node left) is retried once by Tune (`FailureConfig(max_failures=1)`), its lost attempt
  recorded the same way. Either way the terminal gets one line (`notice`), never a traceback (Tune's per-trial
  traceback is off: `TUNE_PRINT_ALL_TRIAL_ERRORS=0`).
- The searcher is `autotune.tuning.tune_policy.PolicySearcher` around the plan's strategy (a plain policy object,
  `autotune.tuning.strategy`), with Ray Tune's successive halving over timed steps (`tune_policy.scheduler_for`).
- `Recorder(Callback)`: turns finished Tune trials into `TrialRecord`s, appends trials.csv, drives
  the progress bar; a failed write stops the run (`_StopOnWriteError`) and `run_tune` raises it. The
  study (study.db) is written by the driver from the records afterwards (`autotune.tuning.study_db`).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ray import tune
from ray.tune import Callback

from autotune.tuning.results import TrialLog, TrialRecord, counted
from autotune.tuning.run_folder import OutputError
from autotune.tuning.trial_io import (
    INFRASTRUCTURE,
    failed_measurement,
    measurement_from_dict,
    measurement_to_dict,
    node_id,
    timed_measurements,
)
from autotune.tuning.tune_policy import PolicySearcher, measure_trial, rungs_for, scheduler_for
from search_spaces.job import Job
from search_spaces.layout import Layout, parse_layout
from search_spaces.measurement import Backend, Measurement
from search_spaces.units import GIB

__all__ = ["evaluate_trial", "Recorder", "run_tune", "is_feasible", "exhaustive_batches", "MAX_TRIAL_FAILURES"]

MAX_TRIAL_FAILURES = 1  # Tune retries a trial whose process died once (Ray Tune's FailureConfig)
EXHAUSTIVE_BATCHES = 8  # Tune trials an exhaustive evaluation is split into


def evaluate_trial(config: dict[str, Any], job: Job, backend: Backend) -> dict[str, Any]:
    """Tune function trainable: measure `config["layout"]` or each of `config["batch"]`."""
    texts = config["batch"] if "batch" in config else [config["layout"]]
    out: list[dict[str, Any]] = []
    for text in texts:
        for m, wall_s in timed_measurements(job, backend, parse_layout(text)):
            out.append({"m": measurement_to_dict(m), "wall_s": wall_s})
    first = next(o["m"] for o in out if not o["m"]["extra"].get("retried"))
    result: dict[str, Any] = {"measurements": json.dumps(out), "status": first["status"], "node": node_id()}
    if first["tokens_per_s_per_gpu"] is not None:
        result["tokens_per_s_per_gpu"] = first["tokens_per_s_per_gpu"]
    if first["memory_bytes"] is not None:
        result["memory_gib"] = first["memory_bytes"] / GIB
    return result


# --- feasibility ---------------------------------------------------------------------------------------
def is_feasible(m: Measurement, capacity_bytes: float) -> bool:
    return m.status == "ok" and m.memory_bytes is not None and m.memory_bytes <= capacity_bytes


# --- recording -------------------------------------------------------------------------------------------
class Recorder(Callback):
    """Finished Tune trials -> TrialRecords in trials.csv, in finishing order; progress updates.

    A row that cannot be written (full disk) is not counted: the error is kept, `stopper` stops the whole
    run at Tune's next step, and `run_tune` raises it; every row written before stays. A lost attempt (an
    infrastructure failure that runs again) is a row of its own, not counted against the budget (`counted`),
    and `notice` gets one line for it.
    """

    def __init__(self, plan: Any, log: TrialLog, total: int, progress: Any,
                 notice: Callable[[str], None] | None = None) -> None:
        self.plan, self.log, self.total, self.progress = plan, log, total, progress
        self.notice = notice or _print_notice
        self.records: list[TrialRecord] = []
        self.counted = 0  # records that count against the budget (lost attempts do not)
        self.error: OutputError | None = None
        self._next = max((r.number for r in plan.done), default=-1) + 1
        self._done_before = sum(not _lost(r.measurement) for r in plan.done)

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks into the experiment state; the copy is never run, so leave out
        # the open trials.csv, the progress bar and the notice.
        return {"plan": None, "log": None, "total": self.total, "progress": None, "notice": None, "records": [],
                "counted": 0, "error": None, "_next": self._next, "_done_before": self._done_before}

    def _add(self, m: Measurement, origin: str, wall_s: float, node: str = "") -> None:
        if self.error is not None:
            return
        record = TrialRecord(number=self._next, origin=origin, measurement=m, wall_s=wall_s,
                             feasible=is_feasible(m, self.plan.capacity_bytes), capacity_bytes=self.plan.capacity_bytes,
                             job=self.plan.fingerprint, node=node)
        try:
            self.log.append(record, sync=False)  # fsynced once per finished Tune trial (a batch in exhaustive mode)
        except OutputError as e:
            self.error = e
            return
        self._next += 1
        self.records.append(record)
        if m.extra.get("failure") == INFRASTRUCTURE:
            self.notice(_infrastructure_line(record))
        if _lost(m):
            return
        self.counted += 1
        if self.progress is not None:
            self.progress(record, self._done_before + self.counted, self.total)

    def _sync(self) -> None:
        if self.error is None:
            try:
                self.log.sync()
            except OutputError as e:
                self.error = e

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        try:
            self._record_result(trial)
        finally:
            self._sync()

    def _record_result(self, trial: Any) -> None:
        result = trial.last_result or {}
        config = _config(trial)
        origin = config.get("origin", "search")
        node = str(result.get("node") or "")
        try:
            items = json.loads(result["measurements"])
        except (KeyError, TypeError, ValueError):
            for text in _texts(config):
                self._add(failed_measurement(parse_layout(text), "the trial returned no metrics"), origin, 0.0, node)
            return
        for item in items:
            self._add(measurement_from_dict(item["m"]), origin, float(item.get("wall_s", 0.0)), node)

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Tune runs the trial again (its process died): its lost attempt is a row, marked retried."""
        self._record_error(trial, retried=True)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._record_error(trial, retried=False)

    def _record_error(self, trial: Any, *, retried: bool) -> None:
        error = _trial_exception(trial)
        lost = error is not None and _is_lost_process(error)
        if error is not None and lost:
            reason = f"the trial's process died: {_error_line(error)}"
        else:
            reason = f"the trial raised: {_error_line(error) if error is not None else 'unknown error'}"
        extra: dict[str, object] = {"failure": INFRASTRUCTURE, "retried": retried} if lost else {}
        config = _config(trial)
        for text in _texts(config):
            m = replace(failed_measurement(parse_layout(text), reason[:500]), extra=dict(extra))
            self._add(m, config.get("origin", "search"), 0.0)
        self._sync()


def _lost(m: Measurement) -> bool:
    """An attempt the cluster lost and that ran again: a row of its own, not a trial of the budget
    (`results.counted`)."""
    return bool(m.extra.get("retried"))


def _print_notice(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _infrastructure_line(record: TrialRecord) -> str:
    then = "; retrying it once on fresh workers" if _lost(record.measurement) else "; recorded as failed"
    return (f"autotune: trial {record.number} ({record.layout}): infrastructure failure, not the layout's: "
            f"{_shorten(record.measurement.reason, 240)}{then}")


def _shorten(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _trial_exception(trial: Any) -> BaseException | None:
    """The exception a Tune trial failed with (Tune keeps it pickled beside the trial), or None."""
    import os

    import ray.cloudpickle as pickle

    path = getattr(trial, "pickled_error_file", None)
    try:
        if path and os.path.exists(path):
            with open(path, "rb") as f:
                return pickle.load(f)
        return trial.get_pickled_error() or trial.get_error()
    except Exception:  # noqa: BLE001 - only for the reason's wording
        return None


def _is_lost_process(error: BaseException) -> bool:
    """Ray's word that the trial's process (or its node) is gone: the cluster's failure, not the layout's."""
    from ray import exceptions as rex

    lost = (rex.RayActorError, rex.NodeDiedError, rex.WorkerCrashedError, rex.LocalRayletDiedError)
    return isinstance(error, lost) or isinstance(getattr(error, "cause", None), lost)


def _error_line(error: BaseException) -> str:
    """One line of a (Ray) exception: the sentence that says why, else its first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    why = [line for line in lines if "because" in line or "died" in line]
    text = (why or lines or [""])[-1 if why else 0]
    return _shorten(f"{type(error).__name__}: {text}", 300)


class _StopOnWriteError(tune.stopper.Stopper):
    """Ends the whole run once trials.csv cannot be written (the recorder keeps the error)."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.recorder.error is not None


def _config(trial: Any) -> dict[str, Any]:
    return trial.config.get("cfg", trial.config)


def _texts(config: dict[str, Any]) -> list[str]:
    return list(config["batch"]) if "batch" in config else [config["layout"]] if "layout" in config else []


# --- running ------------------------------------------------------------------------------------------------
def run_tune(plan: Any, log: TrialLog, *, verbose: bool = False) -> tuple[list[TrialRecord], bool, dict[str, Any]]:
    """Run the plan's trials on Tune; returns (new records, interrupted, stats)."""

    trainable = tune.with_parameters(evaluate_trial, job=plan.job, backend=plan.backend)
    spread = plan.max_concurrent is None and _alive_nodes() > 1  # a cluster: trials go to every node
    trial_resources: Any = tune.PlacementGroupFactory([{"CPU": 1}], strategy="SPREAD") if spread else {"cpu": 1}
    trainable = tune.with_resources(trainable, trial_resources)
    done = counted(plan.done)  # lost attempts ran again (or run now): not trials of the budget
    measured = {r.layout for r in done}
    storage_dir = tune_storage_dir()
    stats: dict[str, Any] = {}
    if plan.exhaustive:
        layouts = [lay for lay in plan.space.layouts() if lay not in measured]
        batches = exhaustive_batches(layouts)
        configs = [{"batch": b, "origin": "exhaustive"} for b in batches]
        configs += [{"batch": [str(s.layout)], "origin": "user"} for s in plan.fixed if s.layout not in measured]
        total = len(done) + sum(len(c["batch"]) for c in configs)
        search_alg, scheduler, num_samples, param_space = None, None, 1, {"cfg": tune.grid_search(configs)}
        trainable = tune.with_parameters(_unwrap_cfg, job=plan.job, backend=plan.backend)
        trainable = tune.with_resources(trainable, trial_resources)
    else:
        from autotune.tuning.strategy import StrategyContext, make_strategy

        context = StrategyContext(job=plan.job, space=plan.space, analytic=plan.analytic,
                                  capacity_bytes=plan.capacity_bytes, budget=plan.trials, seed=plan.seed,
                                  measured={r.layout: r.measurement for r in done if r.origin != "user"})
        fixed = [s.layout for s in (*plan.seeds, *plan.fixed) if s.origin == "user" and s.layout not in measured]
        search_alg = PolicySearcher(make_strategy(plan.strategy, context), fixed=list(dict.fromkeys(fixed)))
        rungs = rungs_for(plan.backend)
        scheduler = scheduler_for(rungs)
        trainable = tune.with_resources(tune.with_parameters(measure_trial, job=plan.job, backend=plan.backend,
                                                             rungs=rungs), trial_resources)
        left = plan.trials + len(search_alg.fixed) - len([r for r in done if r.origin != "user"])
        num_samples, param_space, total = max(0, left), {}, len(done) + max(0, left)
        stats["rungs"] = [r for r in rungs if r is not None]
    progress = None if plan.progress is None else plan.progress(
        total=total, done=len(done), capacity_bytes=plan.capacity_bytes, records=list(done))
    recorder = Recorder(plan, log, total, progress.update if progress else None, getattr(plan, "notice", None))
    concurrent = plan.max_concurrent or _cluster_cpus()
    tuner = tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(search_alg=search_alg, scheduler=scheduler, num_samples=num_samples,
                                    reuse_actors=not spread,
                                    max_concurrent_trials=concurrent,
                                    trial_name_creator=_trial_name, trial_dirname_creator=_trial_name),
        run_config=tune.RunConfig(name="autotune", storage_path=storage_dir, verbose=2 if verbose else 0,
                                  callbacks=[recorder], log_to_file=False, stop=_StopOnWriteError(recorder),
                                  failure_config=tune.FailureConfig(max_failures=MAX_TRIAL_FAILURES)),
    )
    try:
        with _backend_session(plan.backend), progress or _nothing():
            tuner.fit()
    finally:
        cleanup_dir(storage_dir)
    finished = False  # the strategy had nothing left to propose
    if search_alg is not None:
        stats.update(search_alg.counts)
        finished = stats["strategy_finished"] = bool(search_alg.finished)
    stats["max_concurrent"] = concurrent
    del tuner, search_alg, trainable  # Ray objects go while Ray is up (the driver collects the cycles too)
    if recorder.error is not None:
        raise recorder.error
    expected = total - len(done)
    interrupted = recorder.counted < expected and not finished
    return recorder.records, interrupted, stats


def _backend_session(backend: Backend) -> Any:
    """The backend's own resources for the run (`session()`: the megatron backend's worker pool, owned by this
    driver in this search's Ray namespace), or nothing."""
    session = getattr(backend, "session", None)
    return session() if callable(session) else _nothing()


def _alive_nodes() -> int:
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive"))


def _cluster_cpus() -> int:
    """Trials at once on a cluster: one per CPU it has (so every node gets trials), at least 1."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _unwrap_cfg(config: dict[str, Any], job: Job, backend: Backend) -> dict[str, Any]:
    return evaluate_trial(config["cfg"], job, backend)


def _trial_name(trial: Any) -> str:
    return f"trial_{trial.trial_id}"


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def exhaustive_batches(layouts: Sequence[Layout], batches: int = EXHAUSTIVE_BATCHES) -> list[list[str]]:
    """Layout texts split into at most `batches` nearly equal lists (one Tune trial each)."""
    if not layouts:
        return []
    size = math.ceil(len(layouts) / batches)
    return [[str(lay) for lay in layouts[i:i + size]] for i in range(0, len(layouts), size)]


def cleanup_dir(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def tune_storage_dir() -> str:
    return tempfile.mkdtemp(prefix="autotune-tune-")

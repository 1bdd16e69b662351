"""Ray Tune glue of the search driver: the trainables, the recording callback, the run.

Imported only once Ray runs (`autotune.tuning.driver.run_tune` imports it inside a function); it imports
Ray Tune and Optuna at module level.

- `evaluate_trial(config, job, backend)`: the Tune function trainable. It measures one layout (a
  search trial) or a batch of layouts (an exhaustive chunk) with the backend; a backend that raises
  or returns no Measurement gives a "failed" measurement with the reason, never a crashed search.
- The searcher is `autotune.tuning.tune_policy.PolicySearcher` around the plan's strategy (a plain policy object,
  `autotune.tuning.strategy`), with Ray Tune's successive halving over timed steps (`tune_policy.scheduler_for`).
- `Recorder(Callback)`: turns finished Tune trials into `TrialRecord`s, appends trials.csv, drives
  the progress bar; a failed write stops the run (`_StopOnWriteError`) and `run_tune` raises it. The
  study (study.db) is written by the driver from the records afterwards (`autotune.tuning.study_db`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

from ray import tune
from ray.tune import Callback

from autotune.tuning.results import TrialLog, TrialRecord
from autotune.tuning.run_folder import OutputError
from search_spaces.job import Job
from search_spaces.layout import Layout, parse_layout
from search_spaces.measurement import Backend, Measurement

__all__ = ["evaluate_trial", "Recorder", "run_tune", "measurement_to_dict", "measurement_from_dict", "is_feasible"]

GIB = 1024**3


# --- measurements across the process boundary -------------------------------------------------------
def measurement_to_dict(m: Measurement) -> dict[str, Any]:
    d = asdict(m)
    d["layout"] = str(m.layout)
    d["violations"] = list(m.violations)
    d["extra"] = {k: v for k, v in m.extra.items() if _json_safe(v)}  # e.g. the megatron backend's analytic_prediction
    return d


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def measurement_from_dict(d: dict[str, Any]) -> Measurement:
    return Measurement(**{**d, "layout": parse_layout(d["layout"]), "violations": tuple(d.get("violations", ()))})


def failed_measurement(layout: Layout, reason: str) -> Measurement:
    """A trial that produced no measurement, as data."""
    return Measurement(layout=layout, status="failed", source="analytic", reason=reason)


def timed_measurement(job: Job, backend: Backend, layout: Layout) -> tuple[Measurement, float]:
    """(the backend's measurement of `layout`, or why there is none; seconds it took)."""
    t0 = time.perf_counter()
    try:
        m = backend.evaluate(job, layout)
    except Exception as e:  # a failing trial is data: record why, keep searching
        m = failed_measurement(layout, f"backend raised {type(e).__name__}: {e}")
    if not isinstance(m, Measurement):
        m = failed_measurement(layout, f"backend returned no metrics (got {type(m).__name__})")
    return m, time.perf_counter() - t0


def _node_id() -> str:
    """The Ray node this trial runs on ('' outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:  # noqa: BLE001 - only a label
        return ""


def evaluate_trial(config: dict[str, Any], job: Job, backend: Backend) -> dict[str, Any]:
    """Tune function trainable: measure `config["layout"]` or each of `config["batch"]`."""
    texts = config["batch"] if "batch" in config else [config["layout"]]
    out: list[dict[str, Any]] = []
    for text in texts:
        m, wall_s = timed_measurement(job, backend, parse_layout(text))
        out.append({"m": measurement_to_dict(m), "wall_s": wall_s})
    first = out[0]["m"]
    result: dict[str, Any] = {"measurements": json.dumps(out), "status": first["status"], "node": _node_id()}
    if first["tokens_per_s_per_gpu"] is not None:
        result["tokens_per_s_per_gpu"] = first["tokens_per_s_per_gpu"]
    if first["memory_bytes"] is not None:
        result["memory_gib"] = first["memory_bytes"] / GIB
    return result


# --- feasibility ---------------------------------------------------------------------------------------
def is_feasible(m: Measurement, capacity_bytes: float) -> bool:
    return m.status == "ok" and m.memory_bytes is not None and m.memory_bytes <= capacity_bytes


def _first_measurement(result: dict[str, Any]) -> Measurement | None:
    try:
        return measurement_from_dict(json.loads(result["measurements"])[0]["m"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


# --- recording -------------------------------------------------------------------------------------------
class Recorder(Callback):
    """Finished Tune trials -> TrialRecords in trials.csv, in finishing order; progress updates.

    A row that cannot be written (full disk) is not counted: the error is kept, `stopper` stops the whole
    run at Tune's next step, and `run_tune` raises it; every row written before stays.
    """

    def __init__(self, plan: Any, log: TrialLog, total: int, progress: Any) -> None:
        self.plan, self.log, self.total, self.progress = plan, log, total, progress
        self.records: list[TrialRecord] = []
        self.error: OutputError | None = None
        self._next = max((r.number for r in plan.done), default=-1) + 1

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks into the experiment state; the copy is never run, so leave out
        # the open trials.csv and the progress bar.
        return {"plan": None, "log": None, "total": self.total, "progress": None, "records": [], "error": None,
                "_next": self._next}

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
        if self.progress is not None:
            self.progress(record, len(self.plan.done) + len(self.records), self.total)

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

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        error = trial.get_error()
        reason = f"the trial raised: {str(error).strip().splitlines()[-1] if error else 'unknown error'}"
        config = _config(trial)
        for text in _texts(config):
            self._add(failed_measurement(parse_layout(text), reason[:500]), config.get("origin", "search"), 0.0)
        self._sync()


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
    from autotune.tuning.driver import cleanup_dir, exhaustive_batches, tune_storage_dir

    trainable = tune.with_parameters(evaluate_trial, job=plan.job, backend=plan.backend)
    spread = plan.max_concurrent is None and _alive_nodes() > 1  # a cluster: trials go to every node
    trial_resources: Any = tune.PlacementGroupFactory([{"CPU": 1}], strategy="SPREAD") if spread else {"cpu": 1}
    trainable = tune.with_resources(trainable, trial_resources)
    measured = {r.layout for r in plan.done}
    storage_dir = tune_storage_dir()
    stats: dict[str, Any] = {}
    if plan.exhaustive:
        layouts = [lay for lay in plan.space.layouts() if lay not in measured]
        batches = exhaustive_batches(layouts)
        configs = [{"batch": b, "origin": "exhaustive"} for b in batches]
        configs += [{"batch": [str(s.layout)], "origin": "user"} for s in plan.fixed if s.layout not in measured]
        total = len(plan.done) + sum(len(c["batch"]) for c in configs)
        search_alg, scheduler, num_samples, param_space = None, None, 1, {"cfg": tune.grid_search(configs)}
        trainable = tune.with_parameters(_unwrap_cfg, job=plan.job, backend=plan.backend)
        trainable = tune.with_resources(trainable, trial_resources)
    else:
        from autotune.tuning.strategy import StrategyContext, make_strategy
        from autotune.tuning.tune_policy import PolicySearcher, measure_trial, rungs_for, scheduler_for

        context = StrategyContext(job=plan.job, space=plan.space, analytic=plan.analytic,
                                  capacity_bytes=plan.capacity_bytes, budget=plan.trials, seed=plan.seed,
                                  measured={r.layout: r.measurement for r in plan.done if r.origin != "user"})
        fixed = [s.layout for s in (*plan.seeds, *plan.fixed) if s.origin == "user" and s.layout not in measured]
        search_alg = PolicySearcher(make_strategy(plan.strategy, context), fixed=list(dict.fromkeys(fixed)))
        rungs = rungs_for(plan.backend)
        scheduler = scheduler_for(rungs)
        trainable = tune.with_resources(tune.with_parameters(measure_trial, job=plan.job, backend=plan.backend,
                                                             rungs=rungs), trial_resources)
        left = plan.trials + len(search_alg.fixed) - len([r for r in plan.done if r.origin != "user"])
        num_samples, param_space, total = max(0, left), {}, len(plan.done) + max(0, left)
        stats["rungs"] = [r for r in rungs if r is not None]
    progress = None if plan.progress is None else plan.progress(
        total=total, done=len(plan.done), capacity_bytes=plan.capacity_bytes, records=list(plan.done))
    recorder = Recorder(plan, log, total, progress.update if progress else None)
    concurrent = plan.max_concurrent or _cluster_cpus()
    tuner = tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(search_alg=search_alg, scheduler=scheduler, num_samples=num_samples,
                                    reuse_actors=not spread,
                                    max_concurrent_trials=concurrent,
                                    trial_name_creator=_trial_name, trial_dirname_creator=_trial_name),
        run_config=tune.RunConfig(name="autotune", storage_path=storage_dir, verbose=2 if verbose else 0,
                                  callbacks=[recorder], log_to_file=False, stop=_StopOnWriteError(recorder)),
    )
    try:
        with progress or _nothing():
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
    expected = total - len(plan.done)
    interrupted = len(recorder.records) < expected and not finished
    return recorder.records, interrupted, stats


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

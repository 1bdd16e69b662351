"""Ray Tune glue of the search driver: the trainable, the Optuna searcher, the recording callback.

Imported only once Ray runs (`autotune.tuning.driver.run_tune` imports it inside a function); it imports
Ray Tune and Optuna at module level.

- `evaluate_trial(config, job, backend)`: the Tune function trainable. It measures one layout (a
  search trial) or a batch of layouts (an exhaustive chunk) with the backend; a backend that raises
  or returns no Measurement gives a "failed" measurement with the reason, never a crashed search.
- `LayoutSearch(OptunaSearch)`: OptunaSearch plus what the search needs: constraint values on each
  Optuna trial, failed trials told as FAIL, no layout measured twice, fixed user trials, and a count
  of invalid proposals.
- `Recorder(Callback)`: turns finished Tune trials into `TrialRecord`s, appends trials.csv, drives
  the progress bar; a failed write stops the run (`_StopOnWriteError`) and `run_tune` raises it. The
  study (study.db) is written by the driver from the records afterwards (`autotune.tuning.study_db`).
"""

from __future__ import annotations

import json
import random
import sys
import time
import warnings
from dataclasses import asdict
from typing import Any

import optuna
from optuna.trial import TrialState
from ray import tune
from ray.tune import Callback
from ray.tune.search.optuna import OptunaSearch

from search_spaces.job import Job
from search_spaces.layout import Layout, parse_layout
from search_spaces.rules import check

from search_spaces.measurement import Backend, Measurement
from autotune.tuning.results import TrialLog, TrialRecord
from autotune.tuning.run_folder import OutputError
from autotune.tuning.study_db import CONSTRAINT, METRICS as _METRICS, MODES as _MODES, STUDY_NAME, objective
from autotune.tuning.seeds import neighbours
from autotune.tuning.space_sampler import define_by_run, distributions_of, layout_of, params_of

__all__ = ["evaluate_trial", "LayoutSearch", "Recorder", "run_tune", "measurement_to_dict", "measurement_from_dict"]

GIB = 1024**3
N_STARTUP_TRIALS = 10
REPEATS_BEFORE_MOVE = 3  # proposals of measured layouts in a row before a neighbour is enqueued
MAX_REPEATS = 12  # ... and before a random unmeasured layout is
LOCAL_MOVE_PERIOD = 2  # every 2nd proposal after start-up refines the incumbents
LOCAL_SEARCH_STARTS = 3  # the fastest layouts whose neighbourhoods are refined, best first


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


def _failed(layout: Layout, reason: str) -> Measurement:
    return Measurement(layout=layout, status="failed", source="analytic", reason=reason)


def _measure(job: Job, backend: Backend, layout: Layout) -> tuple[Measurement, float]:
    t0 = time.perf_counter()
    try:
        m = backend.evaluate(job, layout)
    except Exception as e:  # a failing trial is data: record why, keep searching
        m = _failed(layout, f"backend raised {type(e).__name__}: {e}")
    if not isinstance(m, Measurement):
        m = _failed(layout, f"backend returned no metrics (got {type(m).__name__})")
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
    out = []
    for text in texts:
        m, wall_s = _measure(job, backend, parse_layout(text))
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


# --- the searcher --------------------------------------------------------------------------------------
class LayoutSearch(OptunaSearch):
    """OptunaSearch over a feasible space, with constraints, de-duplication and fixed trials."""

    def __init__(self, *, plan: Any) -> None:
        self.plan = plan
        self.known: dict[Layout, Measurement] = {r.layout: r.measurement for r in plan.done}
        self.fixed = [s.layout for s in plan.fixed if s.layout not in self.known]
        self.seed_layouts = {s.layout for s in plan.seeds}
        self.trial_info: dict[str, tuple[Layout, str]] = {}  # tune trial id -> (layout, origin)
        self.counts = {"proposals": 0, "invalid_proposals": 0, "repeats": 0, "enqueued_unmeasured": 0,
                       "local_moves": 0}
        self._rng = random.Random(plan.seed)
        self._turn = 0
        self._neighbours: dict[Layout, list[Layout]] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # multivariate TPE over co-occurring parameter groups: conditional spaces, and ~7x cheaper
            # per proposal than independent multi-objective TPE (which re-splits the trials per parameter)
            sampler = optuna.samplers.TPESampler(seed=plan.seed, n_startup_trials=N_STARTUP_TRIALS,
                                                 multivariate=True, group=True)
        points = [params_of(plan.space, s.layout, plan.naming) for s in plan.seeds if s.layout not in self.known]
        # In-memory study while searching (SQLite costs ~0.1-0.5 s per trial here); trials.csv is the
        # durable record and the study is written to study.db at the end (`write_study`).
        super().__init__(space=define_by_run(plan.space, plan.naming), metric=list(_METRICS), mode=list(_MODES),
                         points_to_evaluate=points or None, sampler=sampler, study_name=STUDY_NAME)
        self._tell_finished()

    def _tell_finished(self) -> None:
        """Give the study the trials of an earlier run (resume), from trials.csv."""
        trials = []
        for layout, m in self.known.items():
            values, excess = objective(m, self.plan.capacity_bytes)
            try:
                params = params_of(self.plan.space, layout, self.plan.naming)
            except ValueError:
                continue  # a user layout outside the space
            trials.append(optuna.trial.create_trial(
                params=params, distributions=distributions_of(self.plan.space, layout, self.plan.naming),
                values=values, state=TrialState.COMPLETE if values is not None else TrialState.FAIL,
                user_attrs={"layout": str(layout), "status": m.status},
                constraints={CONSTRAINT: excess} if values is not None else None))
        self._ot_study.add_trials(trials)

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if self.fixed:
            layout = self.fixed.pop(0)
            self.trial_info[trial_id] = (layout, "user")
            return {"layout": str(layout), "origin": "user"}
        repeats = 0
        self._maybe_enqueue_neighbour()
        while True:
            config = super().suggest(trial_id)
            if config is None:
                return None
            self.counts["proposals"] += 1
            ot_trial = self._ot_trials[trial_id]
            layout = self._decode(config)
            if layout is None:
                self._ot_study.tell(ot_trial, None, state=TrialState.FAIL)
            elif layout in self.known:
                self.counts["repeats"] += 1
                repeats += 1
                ot_trial.set_user_attr("repeat", True)  # answered from the record; left out of study.db
                self._tell(ot_trial, self.known[layout], layout)
            else:
                origin = "seed" if layout in self.seed_layouts else "search"
                self.trial_info[trial_id] = (layout, origin)
                ot_trial.set_user_attr("layout", str(layout))
                ot_trial.set_user_attr("origin", origin)
                return {"layout": str(layout), "origin": origin}
            del self._ot_trials[trial_id]
            if repeats % REPEATS_BEFORE_MOVE == 0:  # the sampler is stuck on measured layouts: move it on
                if repeats >= MAX_REPEATS or not self._enqueue_neighbour():
                    repeats = 0
                    self._enqueue_unmeasured()

    def _maybe_enqueue_neighbour(self) -> None:
        """Every other proposal after the start-up trials: an unmeasured neighbour of the best layouts.

        The incumbent (fastest feasible so far) is refined one move at a time (`seeds.neighbours`);
        when its neighbourhood is measured, the next fastest takes over. TPE proposes the others.
        The neighbour is enqueued in the study, so Optuna still proposes it through the same
        define-by-run space and learns from it.
        """
        self._turn += 1
        if len(self.known) >= len(self.plan.seeds) + N_STARTUP_TRIALS and self._turn % LOCAL_MOVE_PERIOD == 0:
            self._enqueue_neighbour()

    def _enqueue_neighbour(self) -> bool:
        measured = set(self.known) | {l for l, _ in self.trial_info.values()}
        ranked = sorted(((m.tokens_per_s_per_gpu or 0.0, str(l), l) for l, m in self.known.items()
                         if is_feasible(m, self.plan.capacity_bytes)), reverse=True)
        for _, _, layout in ranked[:LOCAL_SEARCH_STARTS]:
            if layout not in self._neighbours:
                options = neighbours(self.plan.space, layout)
                self._rng.shuffle(options)
                self._neighbours[layout] = options
            left = [n for n in self._neighbours[layout] if n not in measured]
            self._neighbours[layout] = left
            if left:
                self.counts["local_moves"] += 1
                self._ot_study.enqueue_trial(params_of(self.plan.space, left[0], self.plan.naming))
                return True
        return False

    def _decode(self, config: dict[str, Any]) -> Layout | None:
        try:
            layout = layout_of(self.plan.space, config)
        except ValueError:
            self.counts["invalid_proposals"] += 1
            return None
        if check(self.plan.job, layout):
            self.counts["invalid_proposals"] += 1
            return None
        return layout

    def _enqueue_unmeasured(self) -> None:
        from autotune.tuning.driver import unmeasured_layout

        layout = unmeasured_layout(self.plan.space, set(self.known) | {l for l, _ in self.trial_info.values()},
                                   self._rng)
        if layout is not None:
            self.counts["enqueued_unmeasured"] += 1
            self._ot_study.enqueue_trial(params_of(self.plan.space, layout, self.plan.naming))

    def _tell(self, ot_trial: Any, m: Measurement, layout: Layout) -> None:
        values, excess = objective(m, self.plan.capacity_bytes)
        ot_trial.set_user_attr("layout", str(layout))
        ot_trial.set_user_attr("status", m.status)
        if values is not None:
            ot_trial.set_constraint(CONSTRAINT, excess)
        if m.reason:
            ot_trial.set_user_attr("reason", m.reason[:500])
        try:
            if values is None:
                self._ot_study.tell(ot_trial, None, state=TrialState.FAIL)
            else:
                self._ot_study.tell(ot_trial, values)
        except Exception as e:  # e.g. a NaN from a backend: keep the search going
            print(f"autotune: could not tell Optuna about {layout}: {e}", file=sys.stderr)

    # The study lives in SQLite and the trials in trials.csv; Tune's own searcher checkpoints are not used.
    def save(self, checkpoint_path: str) -> None:
        return None

    def save_to_dir(self, checkpoint_dir: str, session_str: str = "default") -> None:
        return None

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        return None  # multi-objective: Optuna takes no intermediate values

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        layout, origin = self.trial_info.get(trial_id, (None, ""))
        if layout is None:
            return
        m = _first_measurement(result) if result else None
        if m is None:
            m = _failed(layout, "the trial ended without metrics" + (" (it raised)" if error else ""))
        self.known[layout] = m
        if origin == "user" or trial_id not in self._ot_trials:
            return
        self._tell(self._ot_trials[trial_id], m, layout)
        self._completed_trials.add(trial_id)


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
                self._add(_failed(parse_layout(text), "the trial returned no metrics"), origin, 0.0, node)
            return
        for item in items:
            self._add(measurement_from_dict(item["m"]), origin, float(item.get("wall_s", 0.0)), node)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        error = trial.get_error()
        reason = f"the trial raised: {str(error).strip().splitlines()[-1] if error else 'unknown error'}"
        config = _config(trial)
        for text in _texts(config):
            self._add(_failed(parse_layout(text), reason[:500]), config.get("origin", "search"), 0.0)
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

    optuna.logging.set_verbosity(optuna.logging.INFO if verbose else optuna.logging.WARNING)
    trainable = tune.with_parameters(evaluate_trial, job=plan.job, backend=plan.backend)
    spread = plan.max_concurrent is None and _alive_nodes() > 1  # a cluster: trials go to every node
    trial_resources = tune.PlacementGroupFactory([{"CPU": 1}], strategy="SPREAD") if spread else {"cpu": 1}
    trainable = tune.with_resources(trainable, trial_resources)
    measured = {r.layout for r in plan.done}
    storage_dir = tune_storage_dir()
    stats: dict[str, Any] = {}
    if plan.exhaustive:
        layouts = [l for l in plan.space.layouts() if l not in measured]
        batches = exhaustive_batches(layouts)
        configs = [{"batch": b, "origin": "exhaustive"} for b in batches]
        configs += [{"batch": [str(s.layout)], "origin": "user"} for s in plan.fixed if s.layout not in measured]
        total = len(plan.done) + sum(len(c["batch"]) for c in configs)
        search_alg, num_samples, param_space = None, 1, {"cfg": tune.grid_search(configs)}
        trainable = tune.with_parameters(_unwrap_cfg, job=plan.job, backend=plan.backend)
        trainable = tune.with_resources(trainable, trial_resources)
    else:
        search_alg = LayoutSearch(plan=plan)
        left = plan.trials + len(plan.fixed) - len(plan.done)
        num_samples, param_space, total = max(0, left), {}, plan.trials + len(plan.fixed)
    progress = None if plan.progress is None else plan.progress(
        total=total, done=len(plan.done), capacity_bytes=plan.capacity_bytes, records=list(plan.done))
    recorder = Recorder(plan, log, total, progress.update if progress else None)
    concurrent = plan.max_concurrent or _cluster_cpus()
    tuner = tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(search_alg=search_alg, num_samples=num_samples, reuse_actors=not spread,
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
    if search_alg is not None:
        stats.update(search_alg.counts)
    stats["max_concurrent"] = concurrent
    del tuner, search_alg, trainable  # Ray objects go while Ray is up (the driver collects the cycles too)
    if recorder.error is not None:
        raise recorder.error
    expected = total - len(plan.done)
    interrupted = len(recorder.records) < expected
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

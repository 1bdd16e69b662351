"""study.db, the Optuna study of a search (`optuna-dashboard sqlite:///study.db`), written from the trial records.

The study is made from the same records as trials.csv (one Optuna trial per record whose layout is in the
space; user layouts outside it have no parameters), so it always agrees with trials.csv and `--resume`
rebuilds a missing or damaged study.db without Ray. It is written whole to a temporary file, fsynced and
renamed over study.db; a failure raises `OutputError` and the search does not count as completed.
`start_study_write` writes it in a forked child process where that is safe (`search_spaces.forked.can_fork`: an
analytic search on Linux), so the parent draws the report and plots on the other core meanwhile; its wait raises
the child's error (and writes the file itself when the child died without finishing: `Forked.result`).

Imports Optuna (not Ray); `objective` is also what the Tune glue tells the live sampler.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.tuning.results import TrialRecord
from autotune.tuning.run_folder import OutputError
from autotune.tuning.space_sampler import Naming, distributions_of, params_of
from search_spaces.forked import start_forked
from search_spaces.measurement import Measurement
from search_spaces.space import FeasibleSpace
from search_spaces.units import GIB

__all__ = ["STUDY_NAME", "CONSTRAINT", "METRICS", "MODES", "objective", "write_study", "start_study_write"]

STUDY_NAME = "autotune"
CONSTRAINT = "memory_over_capacity_gib"  # <= 0: fits (Optuna's constraint convention)
METRICS = ("tokens_per_s_per_gpu", "memory_gib")
MODES = ("max", "min")


def objective(m: Measurement, capacity_bytes: float) -> tuple[list[float] | None, float]:
    """(values for Optuna or None when there are none, constraint value <= 0 when feasible)."""
    if m.memory_bytes is None or m.status in ("failed", "timeout", "invalid"):
        return None, 1.0
    excess_gib = (m.memory_bytes - capacity_bytes) / GIB
    if m.status == "oom":
        excess_gib = max(excess_gib, 0.5)  # a measured OOM is infeasible whatever the model said
    return [float(m.tokens_per_s_per_gpu or 0.0), m.memory_bytes / GIB], excess_gib


def _trials(records: Sequence[TrialRecord], space: FeasibleSpace, naming: Naming, capacity_bytes: float) -> list:
    import optuna
    from optuna.trial import TrialState

    out = []
    for r in records:
        try:
            params = params_of(space, r.layout, naming)
        except ValueError:
            continue  # a user layout outside the space
        values, excess = objective(r.measurement, capacity_bytes)
        attrs = {"layout": str(r.layout), "status": r.measurement.status, "origin": r.origin, "number": r.number}
        if r.measurement.reason:
            attrs["reason"] = r.measurement.reason[:500]
        out.append(optuna.trial.create_trial(
            params=params, distributions=distributions_of(space, r.layout, naming), values=values,
            state=TrialState.COMPLETE if values is not None else TrialState.FAIL, user_attrs=attrs,
            constraints={CONSTRAINT: excess} if values is not None else None))
    return out


def _fast_sqlite(storage: Any) -> None:
    """No fsync per statement: the file is written once, fsynced, then renamed (see `write_study`)."""
    from sqlalchemy import event

    def pragmas(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA synchronous=OFF")
        cursor.execute("PRAGMA journal_mode=MEMORY")
        cursor.close()

    event.listen(storage.engine, "connect", pragmas)
    storage.engine.dispose()


def _add_trials_one_transaction(storage: Any, study: Any, trials: list) -> None:
    """`study.add_trials` in one SQLite transaction (one commit per trial costs ~0.1 s each here).

    The trials are built as Optuna's own ORM rows (`_bulk_rows`: a trial with its parameters, values and
    attributes, added at once) and committed together; where those private models differ from what this code knows
    it falls back to RDBStorage's own per-trial writer (`_get_prepared_new_trial`, ~30 ms a trial of 12
    parameters), and to the public `add_trials` where that is absent. `tests/test_answer.py` checks the bulk rows
    read back as the same trials as Optuna's own writer gives.
    """
    try:
        from optuna.storages._rdb.storage import _create_scoped_session

        rows = _bulk_rows(study._study_id, trials)
        with _create_scoped_session(storage.scoped_session, True) as session:
            session.add_all(rows)
        return
    except (ImportError, AttributeError, TypeError, KeyError):
        pass
    try:
        from optuna.storages._rdb.storage import _create_scoped_session

        with _create_scoped_session(storage.scoped_session, True) as session:
            for trial in trials:
                storage._get_prepared_new_trial(study._study_id, trial, session)
    except (ImportError, AttributeError, TypeError):
        study.add_trials(trials)


def _bulk_rows(study_id: int, trials: list) -> list:
    """Optuna's ORM rows of finished FrozenTrials of a new study: numbers 0, 1, ... in order."""
    import json

    from optuna.distributions import distribution_to_json
    from optuna.storages._rdb import models

    rows = []
    for number, t in enumerate(trials):
        row = models.TrialModel(number=number, study_id=study_id, state=t.state, datetime_start=t.datetime_start,
                                datetime_complete=t.datetime_complete)
        row.params = [models.TrialParamModel(param_name=name, param_value=t.distributions[name].to_internal_repr(v),
                                             distribution_json=distribution_to_json(t.distributions[name]))
                      for name, v in t.params.items()]
        values = []
        for objective, value in enumerate(t.values or ()):
            stored, kind = models.TrialValueModel.value_to_stored_repr(value)
            values.append(models.TrialValueModel(objective=objective, value=stored, value_type=kind))
        row.values = values
        row.user_attributes = [models.TrialUserAttributeModel(key=k, value_json=json.dumps(v))
                               for k, v in t.user_attrs.items()]
        row.system_attributes = [models.TrialSystemAttributeModel(key=k, value_json=json.dumps(v))
                                 for k, v in t.system_attrs.items()]
        rows.append(row)
    return rows


def write_study(records: Sequence[TrialRecord], space: FeasibleSpace, path: Path, *, naming: Naming,
                capacity_bytes: float, verbose: bool = False) -> None:
    """Write the study of `records` to `path` (temp file + fsync + rename); OutputError when it cannot.
    Optuna's own log lines ("A new study created ...") only with `verbose`."""
    import optuna

    if not verbose:
        optuna.logging.set_verbosity(optuna.logging.WARNING)

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)
        # a new file, its tables made by this Optuna: nothing to check against (saves reading the migrations)
        storage = optuna.storages.RDBStorage(f"sqlite:///{tmp.resolve()}", skip_compatibility_check=True)
        try:
            _fast_sqlite(storage)
            out = optuna.create_study(storage=storage, study_name=STUDY_NAME, directions=["maximize", "minimize"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                out.set_metric_names(list(METRICS))
            _add_trials_one_transaction(storage, out, _trials(records, space, naming, capacity_bytes))
        finally:
            storage.remove_session()
            storage.engine.dispose()
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:  # sqlite's "database or disk is full" arrives as a SQLAlchemy error, not an OSError
        tmp.unlink(missing_ok=True)
        raise OutputError(getattr(e, "errno", None) or 28, f"cannot write {path}: {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def start_study_write(records: Sequence[TrialRecord], space: FeasibleSpace, path: Path, *, naming: Naming,
                      capacity_bytes: float, verbose: bool = False) -> Callable[[], None]:
    """Begin `write_study`; returns the wait, which blocks until study.db is in place and raises its OutputError.

    Where the process can fork safely (`search_spaces.forked.can_fork`: the analytic path on Linux) and not
    `verbose` (whose log lines the child would not print), a forked child writes it while this process goes on;
    elsewhere it is written now and the wait returns at once."""
    def write() -> None:
        write_study(records, space, path, naming=naming, capacity_bytes=capacity_bytes, verbose=verbose)

    child = None if verbose else start_forked(write)
    if child is None:
        write()
        return lambda: None
    return child.result

"""`run_search` end to end on Ray Tune (one local Ray for the module): correctness against exhaustive
evaluation, the output folder, faults, user layouts, resume."""

import csv
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.cost.analytic import AnalyticBackend
from autotune.outputs.files import write_outputs
from autotune.tuning.driver import run_search
from autotune.tuning.results import read_meta, write_meta
from autotune.tuning.tune_glue import is_feasible
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.measurement import Measurement
from search_spaces.space import SpaceOptions, feasible_space
from search_spaces.training import TrainingSpec
from search_spaces.units import GIB

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_session")]

SMALL = Job(model=get_model("tiny-gpt"), cluster=build_cluster(nodes=1, gpus_per_node=2),
            training=TrainingSpec(seq_length=1024, global_batch_size=16))  # 736 layouts (tiny: every one fits)
# SMALL's space without Megatron-FSDP, offload and the one-slot PP 2 x VPP 5 split: 448 layouts, the set the
# whole-space and failure tests reason about
SMALL_3D = SpaceOptions(fsdp=(False,), offload_step=0, max_vpp=4)
# llama3-8b on 8 A100-40GB, 4K tokens: 320 layouts, of which memory rules out more than half.
CONSTRAINED = Job(model=get_model("llama3-8b"), cluster=build_cluster(nodes=1, gpu="a100-40gb"),
                  training=TrainingSpec(seq_length=4096, global_batch_size=16))
CONSTRAINED_OPTIONS = SpaceOptions(micro_batch_sizes=(1, 2), recompute=("none", "full"), dist_opt=(True,))


class FlakyBackend:
    """Analytic figures, except: TP=2 layouts raise, layouts with full-iteration graphs return nothing (both are
    among the analytic model's favourites on SMALL, so a short search proposes both)."""

    name = "flaky"

    def evaluate(self, job, layout):
        if layout.tp == 2:
            raise RuntimeError("simulated crash")
        if layout.cuda_graphs == "full_iteration":
            return None
        return AnalyticBackend().evaluate(job, layout)


def _tokens(m: Measurement | None) -> float:
    """The tokens/s/GPU of a measurement that has one (a feasible trial's, the pick's)."""
    assert m is not None and m.tokens_per_s_per_gpu is not None, m
    return m.tokens_per_s_per_gpu


def _meta(folder: Path) -> dict[str, Any]:
    """The folder's search.json, which every search below has written."""
    meta = read_meta(folder)
    assert meta is not None, folder
    return meta


def _exhaustive_best(job, options, headroom_bytes):
    backend, capacity = AnalyticBackend(), job.cluster.gpu.memory_bytes - headroom_bytes
    best = 0.0
    for layout in feasible_space(job, options).layouts():
        m = backend.evaluate(job, layout)
        if is_feasible(m, capacity):
            best = max(best, _tokens(m))
    return best


def test_search_best_equals_exhaustive_best(tmp_path):
    # the measured stage on Ray Tune (the guided strategy) finds the optimum of 320 layouts in 60 trials
    headroom = 4 * GIB
    result = run_search(CONSTRAINED, trials=60, backend="analytic", measured_stage=True, seed=0,
                        headroom_bytes=headroom, output_dir=tmp_path, space_options=CONSTRAINED_OPTIONS,
                        exhaustive_threshold=0, progress=False, use_seeds=False)
    assert result.mode == "search"
    best = _exhaustive_best(CONSTRAINED, CONSTRAINED_OPTIONS, headroom)
    assert max(_tokens(r.measurement) for r in result.records if r.feasible) == best
    # the pick is the fastest up to ties (within 2%: the most free memory), as the whole-space decision says
    assert result.best is not None
    assert _tokens(result.best) >= best * 0.98
    assert str(result.best.layout) == result.answer.decision.pick
    assert result.stats["strategy"] == "front"  # analytic trials on Ray replay the analytic ranking
    assert len({r.layout for r in result.records}) == len(result.records) == 60


def test_output_folder_holds_trials_winner_launch_forms_and_study(tmp_path):
    result = run_search(SMALL, trials=20, backend="analytic", measured_stage=True, seed=0, output_dir=tmp_path,
                        exhaustive_threshold=0, progress=False)
    write_outputs(result, tmp_path)  # what the CLI and the API do after the search
    names = {p.name for p in tmp_path.iterdir()}
    assert {"trials.csv", "best.json", "best_megatron_bridge.txt", "best_megatron_lm.txt", "study.db",
            "search.json"} <= names
    with open(tmp_path / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 20 and {"layout", "status", "reason", "tokens_per_s_per_gpu", "memory_gib"} <= set(rows[0])
    study = optuna.load_study(study_name="autotune", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 20
    assert _meta(tmp_path)["completed"] is True
    assert result.best is not None


def test_space_within_budget_is_evaluated_whole(tmp_path):
    result = run_search(SMALL, trials=500, backend="analytic", measured_stage=True, seed=0, output_dir=tmp_path,
                        space_options=SMALL_3D, progress=False)
    assert result.mode == "exhaustive"
    assert len(result.records) == feasible_space(SMALL, SMALL_3D).size  # 448 layouts (tiny: every one fits)
    best = _exhaustive_best(SMALL, SMALL_3D, result.headroom_bytes)
    assert max(_tokens(r.measurement) for r in result.records if r.feasible) == best
    # the pick is the fastest up to ties (within 2%), as the whole-space decision says
    assert result.best is not None and _tokens(result.best) >= best * 0.98
    assert str(result.best.layout) == result.answer.decision.pick


def test_failing_trials_are_recorded_with_reasons_and_the_search_goes_on(tmp_path):
    import ray.cloudpickle

    # FlakyBackend travels by value to the Ray workers (they cannot import this test module)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # on B200, whose fitted runs used full-iteration graphs, their saving is credited (on H100 it is not:
    # `Calibration.credited_graphs`), so they are among the model's favourites
    job = replace(SMALL, cluster=build_cluster(nodes=1, gpus_per_node=2, gpu="b200"))
    result = run_search(job, trials=30, backend=FlakyBackend(), seed=0, output_dir=tmp_path,
                        space_options=SMALL_3D, exhaustive_threshold=0, progress=False)
    reasons = [r.measurement.reason for r in result.records if r.measurement.status == "failed"]
    assert len(result.records) == 30
    assert any("simulated crash" in r for r in reasons)
    assert any("returned no metrics" in r for r in reasons)
    # the pick is never a layout seen to fail (the model's favourites on SMALL are full-iteration layouts, so the
    # pick may be one the 30 trials did not reach, which the decision says)
    failed = {r.layout for r in result.records if r.measurement.status == "failed"}
    assert result.best is not None and result.best.layout not in failed and result.best.layout.tp != 2
    assert "failed when measured" in result.answer.decision.reason


def test_user_layout_outside_the_space_is_evaluated_and_labelled(tmp_path):
    options = SpaceOptions(micro_batch_sizes=(1,))
    result = run_search(SMALL, trials=10, backend="analytic", measured_stage=True, seed=0, output_dir=tmp_path,
                        space_options=options, compare=["tp=2,mbs=4,sp=true"], exhaustive_threshold=0, progress=False)
    users = [r for r in result.records if r.origin == "user"]
    assert [str(r.layout) for r in users] == ["tp=2,pp=1,cp=1,ep=1,dp=1,mbs=4,sp=true,dist_opt=false,recompute=none"]


def test_resume_runs_only_the_missing_trials(tmp_path):
    first = run_search(SMALL, trials=12, backend="analytic", measured_stage=True, seed=3, output_dir=tmp_path,
                       exhaustive_threshold=0, progress=False)
    lines = (tmp_path / "trials.csv").read_text().splitlines()
    (tmp_path / "trials.csv").write_text("\n".join(lines[:6]) + "\n")  # header + 5 trials survived a kill
    write_meta(tmp_path, {**_meta(tmp_path), "completed": False})
    again = run_search(SMALL, trials=12, backend="analytic", measured_stage=True, seed=3, resume=tmp_path,
                       exhaustive_threshold=0, progress=False)
    assert len(again.records) == 12
    assert [r.layout for r in again.records[:5]] == [r.layout for r in first.records[:5]]
    assert len({r.layout for r in again.records}) == 12


def test_a_completed_search_asked_again_returns_at_once(tmp_path):
    first = run_search(SMALL, trials=8, backend="analytic", measured_stage=True, seed=0, output_dir=tmp_path,
                       exhaustive_threshold=0, progress=False)
    again = run_search(SMALL, trials=8, backend="analytic", measured_stage=True, seed=0, resume=tmp_path,
                       progress=False)
    assert "ray_start_s" not in again.stats.get("timings", {})  # no trial ran
    assert again.best is not None and first.best is not None
    assert again.best.layout == first.best.layout


def test_resume_of_another_job_is_refused(tmp_path):
    run_search(SMALL, trials=4, backend="analytic", measured_stage=True, seed=0, output_dir=tmp_path,
               exhaustive_threshold=0, progress=False)
    with pytest.raises(ValueError, match="give the same model"):
        run_search(CONSTRAINED, trials=4, backend="analytic", measured_stage=True, resume=tmp_path, progress=False)


def test_measurement_type_is_what_the_api_reads(tmp_path):
    result = run_search(SMALL, trials=5, backend="analytic", measured_stage=True, seed=0, output_dir=tmp_path,
                        exhaustive_threshold=0, progress=False)
    assert all(isinstance(m, Measurement) for m in result.measurements)
    assert result.job is SMALL


# --- result folders you can trust (issue 14) ---------------------------------------------------------------
def test_a_non_empty_output_is_refused_and_left_as_it_was(tmp_path):
    run_search(SMALL, trials=4, backend="analytic", measured_stage=True, seed=0, output_dir=tmp_path,
               exhaustive_threshold=0, progress=False)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ValueError, match="is not empty"):
        run_search(CONSTRAINED, trials=4, backend="analytic", measured_stage=True, output_dir=tmp_path,
                   progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_resume_rebuilds_a_missing_study_without_ray(tmp_path):
    run_search(SMALL, trials=8, backend="analytic", measured_stage=True, seed=0, output_dir=tmp_path,
               exhaustive_threshold=0, progress=False)
    (tmp_path / "study.db").unlink()
    again = run_search(SMALL, trials=8, backend="analytic", measured_stage=True, seed=0, resume=tmp_path,
                       progress=False)
    assert "ray_start_s" not in again.stats["timings"]  # nothing ran
    study = optuna.load_study(study_name="autotune", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert len(study.get_trials()) == 8


def test_a_failed_trials_csv_write_stops_the_run_and_resume_finishes_it(tmp_path, monkeypatch):
    from autotune.tuning import results
    from autotune.tuning.run_folder import OutputError

    real_append = results.TrialLog.append
    written: list[results.TrialRecord] = []

    def append(self, record, *, sync=True):
        if len(written) == 5:
            raise OutputError(28, f"cannot write {self.path}: No space left on device")
        written.append(record)
        real_append(self, record, sync=sync)

    monkeypatch.setattr(results.TrialLog, "append", append)
    with pytest.raises(OutputError, match="No space left on device"):
        run_search(SMALL, trials=12, backend="analytic", measured_stage=True, seed=1, output_dir=tmp_path,
                   exhaustive_threshold=0, progress=False)
    meta = _meta(tmp_path)
    assert meta["completed"] is False and meta["finished_trials"] == 5
    monkeypatch.undo()
    again = run_search(SMALL, trials=12, backend="analytic", measured_stage=True, seed=1, resume=tmp_path,
                       progress=False)
    assert len(again.records) == 12 and len({r.layout for r in again.records}) == 12
    assert [r.number for r in again.records] == list(range(12)) and _meta(tmp_path)["completed"] is True


def test_a_failed_output_write_is_an_error_never_completed(tmp_path):
    from autotune.tuning.run_folder import OutputError

    def finish(result):
        raise OutputError(28, "cannot write best.json: No space left on device")

    with pytest.raises(OutputError):
        run_search(SMALL, trials=4, backend="analytic", measured_stage=True, seed=0, output_dir=tmp_path,
                   exhaustive_threshold=0, progress=False, finish=finish)
    meta = _meta(tmp_path)
    assert meta["completed"] is False and meta["finished_trials"] == 4


def test_rows_of_another_job_in_trials_csv_refuse_the_resume(tmp_path):
    run_search(SMALL, trials=4, backend="analytic", measured_stage=True, seed=0, output_dir=tmp_path,
               exhaustive_threshold=0, progress=False)
    lines = (tmp_path / "trials.csv").read_text().splitlines()
    fp = lines[1].split(",")[1]
    lines[2] = lines[2].replace(fp, "ffffffffffffffff", 1)  # a row another search wrote here
    (tmp_path / "trials.csv").write_text("\n".join(lines) + "\n")
    write_meta(tmp_path, {**_meta(tmp_path), "completed": False})
    with pytest.raises(ValueError, match="line 3 is a trial of another job"):
        run_search(SMALL, trials=8, backend="analytic", measured_stage=True, seed=0, resume=tmp_path, progress=False)

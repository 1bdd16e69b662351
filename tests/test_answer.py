"""The answer a person acts on (issue 21): a pick no layout dominates, the pick first in every view, the verdicts on
the user's layouts, the memory-margin warning, CPU-proxy figures that never overrule the model, and the study."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from autotune.cost.analytic import AnalyticBackend
from autotune.cost.efficiency import DEFAULT_CALIBRATION
from autotune.outputs.files import launch_of, result_json
from autotune.outputs.view import Result
from autotune.tuning.analytic_pass import analytic_pass
from autotune.tuning.analytic_search import analytic_decision, measured_decision
from autotune.tuning.answer import SearchResult
from autotune.tuning.decision import PROXY
from autotune.tuning.driver import run_search
from autotune.tuning.ranking import MEMORY_RESOLUTION, TIE_TOLERANCE, inside_memory_error
from autotune.tuning.results import TrialRecord, pareto_front
from autotune.tuning.verdicts import NEAREST_FIELDS, UNVERIFIED_GAIN, gain_vs_pick, nearest_fitting, nearest_variant
from autotune.ui.api import make_job
from search_spaces.layout import parse_layout
from search_spaces.measurement import Measurement
from search_spaces.space import DEFAULT_SPACE, feasible_space
from search_spaces.units import GIB

# the README command and held-out jobs (dense and MoE, short and long sequences, small and large clusters)
JOBS = [
    pytest.param("mixtral", 4, {}, id="readme-mixtral-4n"),
    pytest.param("mixtral", 16, {}, id="mixtral-16n", marks=pytest.mark.slow),  # 1.3 s to score, 3 s loaded
    pytest.param("llama3-8b", 1, {"global_batch_size": 64}, id="llama3-8b-1n-gbs64"),
    pytest.param("llama3-70b", 8, {"seq_length": 8192, "global_batch_size": 128}, id="llama3-70b-8n-8k"),
    pytest.param("qwen3-30b-a3b", 2, {}, id="qwen3-30b-a3b-2n"),
]


@pytest.mark.parametrize(("model", "nodes", "kwargs"), JOBS)
def test_no_layout_dominates_the_pick(model, nodes, kwargs) -> None:
    # over the whole space scored: the pick leaves the memory model's error free (some layout does here), and no
    # layout that fits and leaves it free is faster at a peak within the memory model's resolution of the pick's
    # (so none is faster at equal or less memory either)
    job = make_job(model, nodes=nodes, **kwargs)
    answer = analytic_pass(job, feasible_space(job, DEFAULT_SPACE))
    s, pick = answer.scores, answer.ranking.pick
    assert pick is not None
    tokens, memory = s.tokens_per_s_per_gpu, s.total_bytes
    safe = answer.eligible & ~inside_memory_error(answer.free_bytes, memory)
    assert safe[pick] and answer.ranking.error_free == bool((answer.eligible & ~safe).any())
    beats = safe & (tokens > tokens[pick]) & (memory <= memory[pick] * (1 + MEMORY_RESOLUTION))
    assert not beats.any(), [str(answer.layout(int(i))) for i in np.flatnonzero(beats)[:3]]
    assert tokens[pick] >= (1 - answer.ranking.tolerance) * np.nanmax(np.where(safe, tokens, np.nan))
    # issue 21: the README pick was `tp4 ... rc=sel` at -1.4% tokens/s over the same layout without recompute, to
    # save 0.008 GiB; a pick with recompute is never one its twin without recompute beats in about the same memory
    picked = str(answer.layout(pick))
    if "recompute=none" not in picked:
        twin = answer.index_of(parse_layout(re.sub(r"recompute=\w+", "recompute=none", picked)))
        assert twin is None or not answer.eligible[twin] or not (
            tokens[twin] > tokens[pick] and memory[twin] <= memory[pick] * (1 + MEMORY_RESOLUTION))


_README: list[SearchResult] = []


def readme_search(tmp_path_factory) -> SearchResult:
    """The README search with two of the user's layouts (one that fits, one that does not), files written; run once
    per session (test_report's report tests read it too)."""
    if not _README:
        from autotune.outputs.files import write_outputs

        folder = tmp_path_factory.mktemp("readme") / "run"
        result = run_search(make_job("mixtral", nodes=4), output_dir=folder, progress=False,
                            compare=["tp=2,pp=4,ep=8,etp=1,sp=true,dist_opt=true", "tp=1,pp=1,ep=8,mbs=8"])
        write_outputs(result, folder)
        _README.append(result)
    return _README[0]


@pytest.fixture
def readme(tmp_path_factory):
    return readme_search(tmp_path_factory)


def test_the_pick_is_the_first_row_of_every_view(readme) -> None:
    from autotune.outputs.plots import trials_frame
    from autotune.outputs.report import report_input
    from autotune.outputs.view import Result

    decision = readme.answer.decision
    pick = decision.pick
    # one typed decision: the search's own, the notebook's, best.json's and the --json output's
    assert readme.decision is decision and Result(readme).decision is decision and str(readme.best.layout) == pick
    payload = result_json(readme)
    best = json.loads((Path(str(readme.output_dir)) / "best.json").read_text())
    assert best["decision"] == json.loads(json.dumps(payload["decision"], default=str)) == json.loads(
        json.dumps(decision.to_dict(), default=str))
    assert [v["layout"] for v in best["decision"]["yours"]] == [v.layout for v in decision.yours] != []
    assert payload["ranked"][0]["layout_text"] == pick and payload["ranked"][0]["pick"] is True
    assert payload["pareto"][0]["layout_text"] == pick  # the pick is on the front, listed first
    folder = Path(str(readme.output_dir))
    assert json.loads((folder / "best.json").read_text())["layout_text"] == pick
    assert trials_frame(readme.ranked)["layout"].iloc[0] == pick
    html = (folder / "report.html").read_text()
    body = html[html.index('id="top"'):]
    body = body[body.index("<tbody>"):]
    first_row = body[:body.index("</tr>")]
    assert 'class="pick"' in first_row and ">1 *<" in first_row
    data = report_input(Result(readme))
    assert data.pick == pick and data.order is not None and data.order[0] == pick
    with open(folder / "trials.csv", newline="") as f:
        assert next(csv.DictReader(f))["layout"] == pick  # trials.csv: the pick first


def test_the_terminal_shows_the_pick_first_and_your_layouts(readme) -> None:
    from autotune.outputs.tables import make_console
    from autotune.ui.commands.search import render

    console = make_console(width=200)
    with console.capture() as captured:
        render(readme, top=5, console=console)
    out = captured.get()
    assert re.search(r"^ *1\* ", out, re.M)  # the first row of the ranked table is the pick, marked
    assert "Pick: " in out and "Your layouts" in out
    yours = " ".join(out[out.index("Your layouts"):out.index("Pareto front")].split())
    assert "tp=2,pp=4,cp=1,ep=8,etp=1" in yours and "vs the pick" in yours and "rank " in yours
    assert "tp=1,pp=1,cp=1,ep=8" in yours and "does not fit" in yours and "nearest that fits (" in yours


def test_every_user_layout_has_a_verdict(readme) -> None:
    fits, over = readme.answer.yours
    assert fits.fits and fits.rank is not None and fits.of == readme.stats["analytic"]["fits"] - \
        readme.answer.decision.space["equivalent_merged"]
    pick_tps = readme.best.tokens_per_s_per_gpu
    assert fits.change_vs_pick == pytest.approx(fits.tokens_per_s_per_gpu / pick_tps - 1)
    assert fits.largest_time_term and fits.largest_memory_term
    assert not over.fits and over.status == "oom" and over.over_gib > 0 and over.largest_memory_term == "activations"
    # its nearest variant fits, by the backend's own figures
    m = AnalyticBackend().evaluate(readme.job, parse_layout(over.nearest))
    assert m.ok and m.memory_bytes <= readme.capacity_bytes
    assert m.tokens_per_s_per_gpu == pytest.approx(over.nearest_tokens_per_s_per_gpu, rel=1e-9)


def test_the_pick_gain_over_a_user_layout_is_split_into_terms_and_flagged_when_large(readme) -> None:
    # issue 25: the pick's predicted gain over the user's layout, the terms it comes from (per step, theirs vs the
    # pick's), and above UNVERIFIED_GAIN the flag naming the term the claim rests on
    fits = readme.answer.yours[0]
    pick = AnalyticBackend().evaluate(readme.job, parse_layout(readme.answer.decision.pick))
    yours = AnalyticBackend().evaluate(readme.job, parse_layout(fits.layout))
    assert pick.tokens_per_s_per_gpu and yours.tokens_per_s_per_gpu
    assert fits.pick_gain == pytest.approx(pick.tokens_per_s_per_gpu / yours.tokens_per_s_per_gpu - 1)
    assert fits.gain_terms, "a slower layout differs from the pick in some term"
    for term, mine, theirs in fits.gain_terms:
        assert mine == pytest.approx(yours.time[term]) and theirs == pytest.approx(pick.time.get(term, 0.0))
    gaps = [abs(a - b) for _, a, b in fits.gain_terms]
    assert gaps == sorted(gaps, reverse=True)
    pair_error = math.exp(DEFAULT_CALIBRATION.pair_band) - 1
    assert (fits.unverified is not None) is (fits.pick_gain > max(UNVERIFIED_GAIN, pair_error))
    assert (fits.no_measurable_gain is not None) is (0 < fits.pick_gain <= pair_error)
    if fits.unverified is not None:
        assert fits.unverified == fits.gain_terms[0][0] and 0 < fits.unverified_share <= 1
    # a gain above the bar is flagged with the term; one below is not (verdicts.gain_vs_pick on made-up breakdowns)
    slow = SimpleNamespace(tokens_per_s_per_gpu=100.0, time={"compute": 1.0, "ep_comm": 0.5, "host": 0.1})
    fast = SimpleNamespace(tokens_per_s_per_gpu=130.0, time={"compute": 1.0, "ep_comm": 0.1, "host": 0.05})
    flagged = gain_vs_pick(fast, slow)
    assert flagged["unverified"] == "ep_comm" and flagged["unverified_share"] == pytest.approx(0.4 / 0.45)
    inside = gain_vs_pick(SimpleNamespace(tokens_per_s_per_gpu=110.0, time=fast.time), slow)
    assert "unverified" not in inside and inside["no_measurable_gain"] == pytest.approx(pair_error)  # +10% < +20%
    assert "no_measurable_gain" not in flagged
    from autotune.outputs.tables import verdict_text

    text = " ".join(verdict_text(dataclasses.replace(fits, pick_gain=0.3, unverified="ep_comm",
                                                     unverified_share=0.89)).split())
    assert "UNVERIFIED: the pick's predicted +30% rests mostly on EP all-to-all, 89% of what it saves" in text
    text = " ".join(verdict_text(dataclasses.replace(fits, pick_gain=0.1, no_measurable_gain=0.2)).split())
    assert "no measurable gain: the pick's predicted +10.0% lies inside the model's error on two layouts" in text


def test_nearest_fitting_changes_the_fewest_fields() -> None:
    job = make_job("llama3-8b", nodes=1, seq_length=16384, global_batch_size=32)
    answer = analytic_pass(job, feasible_space(job, DEFAULT_SPACE))
    layout = parse_layout("tp=1,pp=1,mbs=4", world_size=job.world_size)  # far too much activation memory
    found = nearest_fitting(answer, layout)
    assert found is not None
    row, changes = found
    fits = np.flatnonzero(answer.eligible)
    t = answer.table
    distance = sum((getattr(t, col)[fits] != value(layout)).astype(int) for _, col, value in NEAREST_FIELDS)
    assert len(changes) == distance.min() and answer.eligible[row]
    best_near = fits[distance == distance.min()]
    assert answer.scores.tokens_per_s_per_gpu[row] == answer.scores.tokens_per_s_per_gpu[best_near].max()
    # check / estimate score the space nearest first and stop early: the same layout as over the whole space
    near = nearest_variant(job, layout, 0.0)
    assert near is not None and near["layout"] == str(answer.layout(row)) and near["changes"] == changes


def test_the_front_shows_no_trade_off_the_memory_model_cannot_resolve(readme) -> None:
    # issue 46: near-duplicate Pareto rows (8 MB of recompute saving shown as a trade-off): on the front a faster
    # layout needs more memory than a slower one by more than the memory model's resolution
    front = [r.measurement for r in readme.answer.pareto if not readme.answer.is_pick(r.layout)]
    assert len(front) >= 3
    for a in front:
        for b in front:
            if (a.tokens_per_s_per_gpu or 0) > (b.tokens_per_s_per_gpu or 0):
                assert (a.memory_bytes or 0) > (b.memory_bytes or 0) * (1 + MEMORY_RESOLUTION), (a.layout, b.layout)
    exact = pareto_front(readme.records)
    assert {str(r.layout) for r in readme.answer.pareto} - {readme.answer.decision.pick} <= {
        str(r.layout) for r in exact}  # a subset of the exact front


def test_the_readme_pick_fits_with_the_memory_models_confidence(readme, tmp_path) -> None:
    # issue 46: the README pick left 2.0 GiB free against a 2.9 GiB error while a layout with room was 4% slower;
    # now the pick leaves the error free and the faster layout inside it is named beside it, marked '!' in the table
    d = readme.answer.decision
    pick = readme.best
    assert pick is not None and pick.memory_bytes is not None and d.error_free and d.memory_warning is None
    assert not inside_memory_error(readme.capacity_bytes - pick.memory_bytes, pick.memory_bytes)
    fitting = [r.measurement for r in readme.records if r.feasible]
    fastest = max(fitting, key=lambda m: m.tokens_per_s_per_gpu or 0.0)
    assert d.riskier is not None and d.riskier.layout == str(fastest.layout) and d.riskier.text in d.warnings
    assert d.riskier.free_gib < d.riskier.error_gib and d.riskier.change > 0
    assert readme.answer.inside_error(next(r for r in readme.records if r.layout == fastest.layout))
    # the ranking reads the same: the layouts that leave the error free first
    inside = [readme.answer.inside_error(r) for r in readme.answer.ranked]
    assert inside == sorted(inside) and not inside[0]
    # a search given --headroom-gib trusts that headroom: 0 GiB takes the faster layout, flagged
    bold = run_search(make_job("mixtral", nodes=4), output_dir=tmp_path / "bold", progress=False, headroom_bytes=0.0)
    b = bold.answer.decision
    assert not b.error_free and b.riskier is None and b.memory_warning is not None
    assert bold.best is not None and bold.best.tokens_per_s_per_gpu is not None
    assert bold.best.tokens_per_s_per_gpu >= (1 - TIE_TOLERANCE) * d.riskier.tokens_per_s_per_gpu


def test_a_pick_inside_the_memory_error_is_flagged_with_the_headroom_to_use(tmp_path) -> None:
    # qwen3-30b-a3b on one node at 16K tokens: every layout near the fastest leaves less free than the memory model's
    # error (3.9% of the peak), so the pick is flagged (free + the headroom kept below the error). The warning names
    # the --headroom-gib to use and what the search picks with it: running that search gives that pick, unflagged.
    for nodes, seq, gbs in ((1, 16384, 16), (2, 4096, 64)):
        job = make_job("qwen3-30b-a3b", nodes=nodes, seq_length=seq, global_batch_size=gbs)
        space = feasible_space(job, DEFAULT_SPACE)
        for kept in (0.0, 0.25):
            answer = analytic_pass(job, space, headroom_bytes=kept * GIB, keep_error_free=False)  # as --headroom-gib
            d = analytic_decision(answer)
            pick_peak = answer.scores.total_bytes[answer.ranking.pick] / GIB
            w = d.memory_warning
            assert d.pick_free_gib is not None
            assert (w is not None) == (d.pick_free_gib + kept < MEMORY_RESOLUTION * pick_peak)  # the headroom counts
            if w is None:
                break
            assert w.free_gib + kept < w.error_gib <= w.headroom_gib and w.headroom_gib > kept
            assert f"--headroom-gib {w.headroom_gib:.1f}" in w.text
            assert ("beyond the 0.2 GiB headroom kept" in w.text) == (kept > 0)
        if w is not None:
            break
    assert w is not None, "neither job's pick lies inside the memory model's error any more: find another"
    again = run_search(job, output_dir=tmp_path / "again", progress=False, headroom_bytes=w.headroom_gib * GIB)
    assert again.answer.decision.pick == w.layout and again.answer.decision.memory_warning is None


def test_the_study_of_an_analytic_search_opens_with_both_objectives(readme) -> None:
    import optuna

    study = optuna.load_study(study_name="autotune", storage=f"sqlite:///{readme.output_dir}/study.db")
    assert study.metric_names == ["tokens_per_s_per_gpu", "memory_gib"] and len(study.directions) == 2
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    kept = {t.user_attrs["layout"] for t in done}
    # every layout the search kept, and the user's layouts that lie in the space (a trial needs its parameters)
    assert {str(r.layout) for r in readme.records if r.origin == "analytic"} <= kept
    assert kept <= {str(r.layout) for r in readme.records} and len(done) == len(kept)
    first = next(t for t in done if t.user_attrs["layout"] == readme.answer.decision.pick)
    assert first.values[0] == pytest.approx(readme.best.tokens_per_s_per_gpu)


def test_the_study_writer_child_reports_its_failure_and_threads_keep_it_in_process(readme, tmp_path,
                                                                                    monkeypatch) -> None:
    # an analytic search writes study.db in a forked child while the report is drawn (`start_study_write`): its
    # failure comes back as the OutputError the in-process writer raises, and with a thread running that is no
    # daemon (a user's, Ray's) nothing forks: the file is in place before the wait
    import threading

    import optuna

    from autotune.tuning.run_folder import OutputError
    from autotune.tuning.study_db import start_study_write
    from search_spaces.forked import can_fork
    from search_spaces.space import feasible_space as space_of

    space = space_of(readme.job, DEFAULT_SPACE)
    naming = json.loads((Path(str(readme.output_dir)) / "search.json").read_text())["naming"]
    records = readme.records[:3]
    forks: list[int] = []
    fork = os.fork

    def counted_fork() -> int:
        forks.append(1)
        return fork()

    monkeypatch.setattr(os, "fork", counted_fork)
    alone = can_fork()  # an earlier test's thread (Ray's) keeps the writer in process
    with pytest.raises(OutputError, match=r"cannot write .*missing/study\.db: ") as failed:  # at once, or on wait
        start_study_write(records, space, tmp_path / "missing" / "study.db", naming=naming,
                          capacity_bytes=readme.capacity_bytes)()
    assert failed.value.errno and not list(tmp_path.iterdir()) and forks == ([1] if alone else [])
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=False)
    other.start()
    try:
        wait = start_study_write(records, space, tmp_path / "study.db", naming=naming,
                                 capacity_bytes=readme.capacity_bytes)
        assert (tmp_path / "study.db").exists()
    finally:
        stop.set()
        other.join()
    wait()
    assert forks == ([1] if alone else [])
    study = optuna.load_study(study_name="autotune", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert sorted(t.user_attrs["layout"] for t in study.get_trials()) == sorted(str(r.layout) for r in records)


def test_the_studys_bulk_rows_read_back_as_optunas_own_writer_gives(readme, tmp_path, monkeypatch) -> None:
    # study.db is written as Optuna's ORM rows in one transaction (`_bulk_rows`); they read back as the same trials
    # as `study.add_trials` writes, and the per-trial fallback is not what ran
    import optuna
    from optuna.storages import RDBStorage

    from autotune.tuning import study_db
    from search_spaces.space import feasible_space as space_of

    space = space_of(readme.job, DEFAULT_SPACE)
    naming = json.loads((Path(str(readme.output_dir)) / "search.json").read_text())["naming"]
    trials = study_db._trials(readme.records[:4], space, naming, readme.capacity_bytes)
    assert len(trials) == 4

    def study_at(name):
        storage = RDBStorage(f"sqlite:///{tmp_path / name}")
        return storage, optuna.create_study(storage=storage, study_name="s", directions=["maximize", "minimize"])

    storage, bulk = study_at("bulk.db")

    def per_trial(*_args, **_kwargs):
        raise AssertionError("the per-trial fallback ran")

    monkeypatch.setattr(RDBStorage, "_get_prepared_new_trial", per_trial)
    study_db._add_trials_one_transaction(storage, bulk, trials)
    monkeypatch.undo()
    _, own = study_at("own.db")
    own.add_trials(trials)

    def seen(study):
        return [(t.number, t.state, t.params, t.distributions, t.values, t.user_attrs, t.system_attrs)
                for t in study.get_trials()]

    assert seen(bulk) == seen(own)


def _proxy(layout, status="ok", reason=""):
    """A CPU-proxy measurement: tiny tokens/s of a scaled-down model, memory judged by the real model."""
    a = AnalyticBackend().evaluate(JOB_SMALL, layout)
    return Measurement(layout=layout, status=status, source="megatron-cpu-proxy", reason=reason,
                       memory_bytes=a.memory_bytes if status == "ok" else None, memory=dict(a.memory),
                       step_time_s=0.5, time={"step_median": 0.5, "step_min": 0.4, "step_max": 0.7, "step_stdev": 0.1},
                       tokens_per_s_per_gpu=(1000.0 + 37 * layout.tp * layout.pp) if status == "ok" else None,
                       extra={"analytic_prediction": {"tokens_per_s_per_gpu": a.tokens_per_s_per_gpu,
                                                      "memory_bytes": a.memory_bytes}})


JOB_SMALL = make_job("llama3-8b", nodes=1, global_batch_size=64)


def _proxy_result(failing_pick: bool = False):
    job = JOB_SMALL
    answer = analytic_pass(job, feasible_space(job, DEFAULT_SPACE))
    order = [answer.layout(int(i)) for i in answer.ranking.order[:4]]
    # the proxy "measures" the model's pick slowest of the four: it must not overrule the model
    ms = [_proxy(lay, status="failed" if failing_pick and k == 0 else "ok", reason="RuntimeError: boom")
          for k, lay in enumerate(order)]
    capacity = job.cluster.gpu.memory_bytes
    records = tuple(TrialRecord(number=k, origin="search", measurement=m, capacity_bytes=capacity,
                                feasible=m.ok and m.memory_bytes is not None and m.memory_bytes <= capacity)
                    for k, m in enumerate(ms))
    decision = measured_decision(list(ms), capacity, answer)
    return answer, SearchResult(job=job, records=records, capacity_bytes=capacity, headroom_bytes=0.0, mode="search",
                                backend="megatron", seed=0, space_size=answer.size, decision=decision)


def test_cpu_proxy_figures_never_overrule_the_model() -> None:
    from autotune.outputs.launch import launch_forms

    answer, result = _proxy_result()
    model_pick = answer.layout(answer.ranking.pick)
    assert result.answer.decision.basis == PROXY and result.answer.decision.stage == "analytic"
    assert result.best.layout == model_pick and result.best.source == "analytic"  # the model's figures
    assert launch_of(result) == launch_forms(result.job, model_pick)  # the launch lines are the model pick's
    ranked = result.answer.ranked
    assert all(r.measurement.source == "analytic" and r.measurement.extra["proxy"]["status"] == "ok" for r in ranked)
    assert "step_median" not in ranked[0].measurement.time  # the proxy's statistics are not time terms


def test_a_pick_the_proxy_saw_fail_moves_to_the_next_of_the_models_ranking() -> None:
    answer, result = _proxy_result(failing_pick=True)
    second = answer.layout(int(answer.ranking.order[1]))
    assert result.answer.decision.pick == str(second) and "failed on the CPU proxy" in result.answer.decision.reason
    assert result.best.layout == second


def test_cpu_proxy_runs_are_labelled_in_the_terminal_and_the_report(tmp_path) -> None:
    from autotune.outputs.report import render_report, report_input
    from autotune.outputs.tables import make_console
    from autotune.ui.commands.search import render

    _, result = _proxy_result()
    object.__setattr__(result, "output_dir", str(tmp_path))
    console = make_console(width=200)
    with console.capture() as captured:
        render(result, console=console)
    out = captured.get()
    assert "CPU proxy" in out and "not how fast they run on GPUs" in out and "Best layouts by the model" in out
    data = report_input(Result(result))
    html = render_report(data)
    assert "CPU proxy" in html and data.basis.startswith("the analytic model's")
    assert "CPU proxy" in str(data.job["backend"]) and "0.0 B" not in str(data.job["parameters"])


def test_nvidias_published_layout_is_the_baseline_with_its_own_verdict(tmp_path) -> None:
    # issue 25: a job with a published Megatron-Bridge row (qwen3-30b-a3b on 16 H100) shows that layout first, labelled,
    # with the figure NVIDIA published and the pick's gain over it; --no-baseline (baseline=False) leaves it out
    from autotune.outputs.tables import verdict_text
    from search_spaces.published_recipes import published_recipe

    job = make_job("qwen3-30b-a3b", nodes=2, gpu="h100", precision="fp8", training={"fp8_recipe": "tensorwise"},
                   global_batch_size=1024)
    found = published_recipe(job)
    assert found is not None
    row, layout = found
    assert (row.model, row.num_gpus, row.gpu) == ("qwen3-30b-a3b", 16, "h100-sxm") and row.release <= "26.08"
    assert row.differences(job) == ()  # the published run is this job
    result = run_search(job, output_dir=tmp_path / "a", progress=False, compare=["tp=2,pp=1,ep=8,sp=true"])
    first, mine = result.answer.yours
    assert first.layout == str(layout) and first.recipe == row.label and "Megatron-Bridge" in first.recipe
    assert first.published_tokens_per_s_per_gpu == row.published_tokens_per_s_per_gpu and not first.recipe_differs
    assert mine.recipe is None and first.pick_gain is not None and first.gain_terms
    # issue 46: at BF16 and GBS 256 the row is another job: named as the nearest, with what differs, and its
    # measured figure is never attached to this job
    other = make_job("qwen3-30b-a3b", nodes=2, gpu="h100")
    nearest = published_recipe(other)
    assert nearest is not None and nearest[0] == row
    assert row.differences(other) == ("precision tensorwise, not bf16", "GBS 1024, not 256")
    near = run_search(other, output_dir=tmp_path / "c", progress=False).answer.yours[0]
    assert near.layout == str(layout) and near.published_tokens_per_s_per_gpu is None
    assert near.recipe_differs == row.differences(other) and "the nearest published row" in str(near.recipe)
    assert "NVIDIA measured" not in verdict_text(near) and "GBS 1024, not 256" in verdict_text(near)
    assert json.loads((tmp_path / "a" / "search.json").read_text())["recipe"]["layout"] == str(layout)
    bare = run_search(job, output_dir=tmp_path / "b", progress=False, baseline=False)
    assert bare.answer.yours == ()
    assert published_recipe(make_job("mixtral", nodes=4)) is None  # no published row: no baseline


def test_the_published_layouts_file_matches_the_benchmark_rows() -> None:
    import subprocess
    import sys

    script = Path(__file__).parent / "data" / "make_published_recipes.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr

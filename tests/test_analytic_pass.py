"""The analytic pass: the whole space scored and ranked, and the pipeline warning."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autotune.cost.analytic import AnalyticBackend
from autotune.cost.layout_table import LayoutTable
from autotune.tuning.analytic_pass import analytic_pass, closest_rows
from autotune.tuning.batch_advice import pipeline_warning, suggested_global_batch
from autotune.tuning.ranking import complexity, decide, equivalent_to_simpler, pareto_rows
from autotune.tuning.results import TrialRecord, pareto_front
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.space import SpaceOptions, feasible_space
from search_spaces.training import TrainingSpec
from search_spaces.units import GIB


def _job(model: str, nodes: int, **training) -> Job:
    return Job(model=get_model(model), cluster=build_cluster(nodes=nodes), training=TrainingSpec(**training))


def test_the_pick_is_the_rule_applied_to_the_scalar_scores() -> None:
    # every layout of llama3-8b on one node scored one by one by AnalyticBackend, ranked by the same rule
    job = _job("llama3-8b", 1, global_batch_size=64)
    space = feasible_space(job)
    answer = analytic_pass(job, space)
    layouts = list(space.layouts())
    ms = [AnalyticBackend().evaluate(job, layout) for layout in layouts]
    table = LayoutTable.from_layouts(layouts)
    tokens = np.array([m.tokens_per_s_per_gpu for m in ms])
    memory = [m.memory_bytes for m in ms]
    assert None not in memory  # the analytic backend estimates every layout's memory
    free = job.cluster.gpu.memory_bytes - np.array(memory, dtype=float)
    eligible = np.array([m.status == "ok" for m in ms]) & ~equivalent_to_simpler(table)
    ref = decide(tokens, free, complexity(table), eligible=eligible, memory_bytes=np.array(memory, dtype=float),
                 keep_error_free=True)
    assert ref.pick is not None and answer.ranking.pick is not None
    assert layouts[ref.pick] == answer.layout(answer.ranking.pick)
    assert [layouts[i] for i in ref.tied] == [answer.layout(i) for i in answer.ranking.tied]
    best = max(t for t, e in zip(tokens, eligible, strict=True) if e)
    assert answer.scores.tokens_per_s_per_gpu[answer.ranking.pick] >= 0.98 * best


def test_pareto_rows_match_the_records_front() -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 20, 200).astype(float)
    memory = rng.integers(1, 20, 200).astype(float)
    eligible = rng.random(200) < 0.8
    rows = pareto_rows(tokens, memory, eligible)
    job = _job("llama3-8b", 1)
    table = LayoutTable.from_space(feasible_space(job))
    from search_spaces.measurement import Measurement

    records = [TrialRecord(number=i, origin="analytic", feasible=bool(eligible[i]), capacity_bytes=100.0,
                           measurement=Measurement(layout=table.layout(i), status="ok", source="analytic",
                                                   tokens_per_s_per_gpu=tokens[i], memory_bytes=memory[i]))
               for i in range(200)]
    front = pareto_front(records)
    assert sorted(r.number for r in front) == sorted(rows.tolist())
    # the definition, by brute force: an eligible row that no eligible row beats on one figure and ties on the other
    dominated = {i for i in range(200) for j in range(200) if eligible[i] and eligible[j] and (
        (tokens[j] >= tokens[i] and memory[j] <= memory[i]) and (tokens[j] > tokens[i] or memory[j] < memory[i]))}
    assert sorted(rows.tolist()) == [i for i in range(200) if eligible[i] and i not in dominated]


def test_closest_rows() -> None:
    assert closest_rows(np.array([5.0, 1.0, 3.0, 2.0]), 2).tolist() == [1, 3]
    assert closest_rows(np.array([5.0]), 3).tolist() == [0]


def test_nothing_fits() -> None:
    # llama3-70b on one node at seq 32768 with 75 GiB of headroom: no layout fits
    job = _job("llama3-70b", 1, seq_length=32768, global_batch_size=8)
    answer = analytic_pass(job, feasible_space(job), headroom_bytes=75 * GIB)
    assert answer.ranking.pick is None and answer.ranking.confidence == "none"
    keep = answer.rows_to_keep(10)
    assert 0 < len(keep) <= 5
    m = answer.measurement(keep[0])
    assert m.status == "oom" and m.step_time_s is not None  # time computed for a row scored for memory only


def test_index_of_round_trip() -> None:
    job = _job("mixtral-8x7b", 2, global_batch_size=128)
    answer = analytic_pass(job, feasible_space(job))
    for row in (0, answer.size // 2, answer.size - 1):
        assert answer.index_of(answer.layout(row)) == row
    from search_spaces.layout import Layout

    assert answer.index_of(Layout(tp=3)) is None


@pytest.mark.parametrize("pp, vpp, mbs, dp, gbs", [
    # PP 16: fill 15 stage passes; 10% needs m >= 15 * 0.9 / 0.1 = 135 -> 256 (power of two); x mbs 1 x dp 32
    (16, 1, 1, 32, 8192),
    # PP 4 x VPP 2: fill 1.5; m >= 13.5 -> 16 (a multiple of PP 4 too); x 2 x 8
    (4, 2, 2, 8, 256),
    # PP 2: fill 1; m >= 9 -> 16; x 1 x 4
    (2, 1, 1, 4, 64),
])
def test_suggested_global_batch(pp, vpp, mbs, dp, gbs) -> None:
    assert suggested_global_batch(pp, vpp, mbs, dp) == gbs


def test_a_starved_pipeline_is_reported() -> None:
    # llama3.1-405b on 16 B200 nodes with GBS 16: at most 16 micro-batches; a deep pipeline would win with more
    # (on H100 it no longer does: its deep pipelines ran full-iteration graphs, whose saving no fitted Hopper run
    # shows, `Calibration.credited_graphs`)
    job = replace(_job("llama3.1-405b", 16, global_batch_size=16), cluster=build_cluster(nodes=16, gpu="b200"))
    answer = analytic_pass(job, feasible_space(job, SpaceOptions(max_pp=16)))
    w = pipeline_warning(answer)
    assert w is not None and w.bubble_share > 0.1 and w.microbatches <= 16
    assert w.suggested_global_batch_size > 16 and "--global-batch-size" in w.text
    pick_now = answer.scores.tokens_per_s_per_gpu[answer.ranking.pick]
    assert w.pick or w.tokens_per_s_per_gpu_at_suggested > pick_now


def test_a_fed_pipeline_is_not_reported() -> None:
    job = _job("llama3-8b", 1, global_batch_size=512)  # 64+ micro-batches for any pipeline of 8 GPUs
    assert pipeline_warning(analytic_pass(job, feasible_space(job))) is None

"""AnalyticBackend: verdicts (invalid, oom, ok), numbers filled for oom, headroom, and its speed class."""

from __future__ import annotations

import pytest

from autotune.cost.analytic import AnalyticBackend
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.training import TrainingSpec
from search_spaces.units import GIB


def _job(model: str, nodes: int = 1, seq: int = 4096, gbs: int = 64) -> Job:
    return Job(model=get_model(model), cluster=build_cluster(nodes=nodes),
               training=TrainingSpec(seq_length=seq, global_batch_size=gbs))


def test_backend_name() -> None:
    assert AnalyticBackend().name == "analytic"


def test_invalid_layout_reports_violations_and_no_numbers() -> None:
    # 64 heads are not divisible by TP=3, and 8 GPUs not by 3
    m = AnalyticBackend().evaluate(_job("llama3-70b"), Layout(tp=3, dp=2))
    assert m.status == "invalid"
    assert any("tensor_model_parallel_size (3)" in v for v in m.violations)
    assert m.step_time_s is None and m.memory_bytes is None


def test_oom_layout_still_has_time_and_memory() -> None:
    # Llama-3-70B on one node with TP=1: about 70e9 * 18 B of weights and states per GPU, far above 80 GiB
    m = AnalyticBackend().evaluate(_job("llama3-70b"), Layout(tp=1, dp=8))
    assert m.status == "oom"
    assert m.memory_gib is not None and m.memory_gib > 80
    assert m.tokens_per_s_per_gpu is not None and m.tokens_per_s_per_gpu > 0 and m.mfu is not None
    assert "exceeds" in m.reason


def test_ok_layout_fills_every_figure() -> None:
    m = AnalyticBackend().evaluate(_job("llama3-8b"), Layout(tp=2, dp=4, sp=True, dist_opt=True))
    assert m.status == "ok", m.reason
    assert m.memory_gib is not None and m.memory_gib < 80
    assert sum(m.time.values()) == pytest.approx(m.step_time_s)
    assert sum(m.memory.values()) == pytest.approx(m.memory_bytes)
    assert m.extra["dominant_time"] in m.time
    assert m.mfu is not None and 0 < m.mfu <= 1


def test_headroom_turns_a_tight_fit_into_oom() -> None:
    job, layout = _job("llama3-8b"), Layout(tp=2, dp=4, sp=True, dist_opt=True)
    peak = AnalyticBackend().evaluate(job, layout).memory_bytes
    assert peak is not None
    spare = job.cluster.gpu.memory_bytes - peak
    assert AnalyticBackend(headroom_bytes=spare * 0.5).evaluate(job, layout).status == "ok"
    assert AnalyticBackend(headroom_bytes=spare + GIB).evaluate(job, layout).status == "oom"

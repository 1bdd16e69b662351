"""Measured-stage strategies: the policy protocol, and the guided strategy learning a residual the model lacks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autotune.tuning.analytic_pass import analytic_pass
from autotune.tuning.residual import FEATURES, ResidualModel
from autotune.tuning.strategy import STRATEGIES, StrategyContext, make_strategy
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.measurement import Measurement
from search_spaces.space import SpaceOptions, feasible_space
from search_spaces.training import TrainingSpec

JOB = Job(model=get_model("tiny-gpt"), cluster=build_cluster(nodes=1, gpus_per_node=4),
          training=TrainingSpec(seq_length=256, global_batch_size=16))
# the truth ignores graphs; Megatron-FSDP, offload and the one-slot PP 2 x VPP 5 split stay out (the strategies' test
# needs a space of one kind, and its truth a fixed order); CP is searched at this toy sequence (min_cp_tokens 0)
OPTIONS = SpaceOptions(recompute=("none",), dist_opt=(True,), cuda_graphs=("none",), fsdp=(False,), offload_step=0,
                       max_vpp=4, min_cp_tokens=0)


def _truth(answer) -> dict[Layout, float]:
    """A 'measured' world unlike the GPU model: each pipeline stage and TP rank costs a factor (as on gloo),
    larger micro-batches help; tokens/s = 1000 x 0.5^log2(pp) x 0.7^log2(tp) x 1.2^log2(mbs) x 0.6^(vpp>1)."""
    out = {}
    for i in range(answer.size):
        lay = answer.layout(i)
        out[lay] = 1000 * 0.5 ** math.log2(lay.pp) * 0.7 ** math.log2(lay.tp) * 1.2 ** math.log2(lay.mbs) \
            * (0.6 if lay.vpp_size > 1 else 1.0) * (1.0 + 0.001 * (i % 7))  # a little spread: one best
    return out


def _context(budget: int, seed: int = 0) -> StrategyContext:
    space = feasible_space(JOB, OPTIONS)
    answer = analytic_pass(JOB, space)
    return StrategyContext(job=JOB, space=space, analytic=answer, capacity_bytes=JOB.cluster.gpu.memory_bytes,
                           budget=budget, seed=seed)


def _run(name: str, ctx: StrategyContext, truth: dict[Layout, float]) -> list[Layout]:
    s = make_strategy(name, ctx)
    seen = []
    while (layout := s.propose()) is not None:
        assert layout not in seen, "a strategy never proposes a layout twice"
        seen.append(layout)
        s.observe(layout, Measurement(layout=layout, status="ok", source="megatron-cpu-proxy",
                                      tokens_per_s_per_gpu=truth[layout], memory_bytes=1.0))
    return seen


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_keeps_to_its_budget(name: str) -> None:
    ctx = _context(budget=7)
    seen = _run(name, ctx, _truth(ctx.analytic))
    assert len(seen) == 7
    assert all(lay in set(ctx.space.layouts()) for lay in seen)


def test_guided_starts_from_the_analytic_pick() -> None:
    ctx = _context(budget=3)
    s = make_strategy("guided", ctx)
    pick = ctx.analytic.ranking.pick
    assert pick is not None
    assert s.propose() == ctx.analytic.layout(pick)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_guided_finds_a_best_the_model_misranks_within_a_fifth(seed: int) -> None:
    ctx = _context(budget=feasible_space(JOB, OPTIONS).size // 5, seed=seed)
    truth = _truth(ctx.analytic)
    best = max(truth, key=truth.__getitem__)
    rank = [ctx.analytic.layout(int(r)) for r in ctx.analytic.ranking.order].index(best)
    assert rank > ctx.budget  # the analytic ranking alone would not measure it within the budget
    assert best in _run("guided", ctx, truth)


def test_residual_model_recovers_a_linear_residual() -> None:
    # residual = 0.3 * feature 1 exactly; with enough rows the posterior mean finds it
    rng = np.random.default_rng(0)
    x = np.column_stack([np.ones(200), rng.normal(size=(200, len(FEATURES) - 1))])
    prior = rng.normal(size=200)
    model = ResidualModel(x, prior, band_sd=0.1)
    rows = np.arange(0, 200, 4)
    model.observe(rows, prior[rows] + 0.3 * x[rows, 1] + 0.5)
    truth = prior + 0.3 * x[:, 1] + 0.5
    assert np.max(np.abs(model.mean() - truth)) < 0.05
    assert model.sd().max() < model.band_sd * 10


def test_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="strategy must be one of"):
        make_strategy("nope", _context(budget=1))
    with pytest.raises(ValueError, match="cannot load"):
        make_strategy("autotune.tuning.nowhere:Thing", _context(budget=1))

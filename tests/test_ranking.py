"""The pick, ties, equivalent layouts and the confidence of the ranking."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autotune.cost.layout_table import LayoutTable
from autotune.tuning.ranking import (
    MEMORY_RESOLUTION,
    canonical,
    complexity,
    decide,
    dominated,
    equivalent_to_simpler,
    inside_memory_error,
    memory_margin,
    riskier_layout,
)
from search_spaces.layout import Layout
from search_spaces.units import GIB

BAND = (-0.113, 0.104)  # the dense band: tokens/s x 0.893 .. x 1.110


def _decide(tokens, free_gib, simple=None, **kw):
    n = len(tokens)
    return decide(np.array(tokens, float), np.array(free_gib, float) * GIB,
                  np.array(simple if simple is not None else [0] * n), **kw)


CAPACITY_GIB = 80.0


def _pick(tokens, memory_gib, simple=None, **kw):
    """`decide` with each row's peak (GiB) on an 80 GiB GPU."""
    memory = np.array(memory_gib, float) * GIB
    return decide(np.array(tokens, float), CAPACITY_GIB * GIB - memory,
                  np.array(simple if simple is not None else [0] * len(tokens)), memory_bytes=memory, **kw)


@pytest.mark.parametrize("tokens, memory, simple, pick, tied", [
    # alone at the top (next is 5% slower): the fastest
    ([100, 95, 90], [79, 50, 50], None, 0, 1),
    # the README case: recompute saves 0.008 GiB at -1.4% tokens/s; the faster one at equal memory wins
    ([98.6, 100, 90], [77.131, 77.139, 50], [4, 1, 0], 1, 2),
    # 78 GiB is within 3.9% of 76 GiB (76 x 1.039 = 79.0): the faster one dominates the leaner one
    ([100, 99, 90], [78, 76, 50], None, 0, 2),
    # tied and not dominated (60 x 1.039 = 62.3 < 78): the one whose 20 GiB free is outside the model's error wins
    # over one with 2 GiB free (the error is 3.9% x 78 = 3.0 GiB), even if the other is simpler
    ([100, 98.5, 90], [78, 60, 50], [0, 5, 0], 1, 2),
    # both outside the error: the simpler wins
    ([100, 99, 90], [60, 40, 30], [5, 3, 1], 1, 2),
    # both outside the error, equally simple: the faster
    ([100, 99, 90], [60, 40, 30], [3, 3, 1], 0, 2),
    # exactly 2% below is still tied (>= best * 0.98)
    ([100, 98, 50], [60, 40, 30], [3, 1, 0], 1, 2),
])
def test_the_pick(tokens, memory, simple, pick, tied) -> None:
    d = _pick(tokens, memory, simple)
    assert d.pick == pick and len(d.tied) == tied
    assert d.order[0] == pick and sorted(d.order) == [0, 1, 2]
    assert d.fastest == 0 if tokens[0] >= max(tokens) else d.fastest == int(np.argmax(tokens))


def test_the_pick_is_never_dominated() -> None:
    # random spaces: no layout that fits is faster than the pick at a peak within the resolution of the pick's
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(2, 40))
        tokens = rng.uniform(95, 100, n)
        memory = rng.uniform(40, 80, n)
        d = _pick(tokens, memory, rng.integers(0, 4, n))
        beats = (tokens > tokens[d.pick]) & (memory <= memory[d.pick] * (1 + MEMORY_RESOLUTION))
        assert not beats.any()


def test_dominated_rows() -> None:
    tokens, memory = np.array([100.0, 99.0, 99.0, 98.0]), np.array([50.0, 51.0, 40.0, 40.0])
    # row 1: row 0 is faster at less memory; row 2: nothing faster within 40 x 1.0 (exact); row 3: row 2 is
    assert dominated(tokens, memory, np.arange(4), 0.0).tolist() == [False, True, False, True]
    # at 30% resolution row 2 (40 GiB) is beaten by row 0 (50 <= 40 x 1.3)
    assert dominated(tokens, memory, np.arange(4), 0.3).tolist() == [False, True, True, True]


def test_memory_margin_names_the_headroom_and_the_pick_it_gives() -> None:
    tokens, memory = np.array([100.0, 97.0, 90.0]), np.array([78.0, 70.0, 50.0]) * GIB
    simple, eligible = np.zeros(3, dtype=np.int64), np.ones(3, dtype=bool)
    d = decide(tokens, 80 * GIB - memory, simple, memory_bytes=memory)
    assert d.pick == 0  # alone at the top: 97 is 3% slower
    w = memory_margin(tokens, memory, 80 * GIB, simple, eligible=eligible, pick=d.pick, labels=["a", "b", "c"])
    assert w is not None
    # 2 GiB free < 3.9% x 78 = 3.042 GiB: keep 3.1 GiB free; then row 1 (10 GiB free) is the pick, 3% slower
    assert w.headroom_gib == pytest.approx(3.1) and w.layout == "b" and w.change == pytest.approx(-0.03)
    assert "--headroom-gib 3.1" in w.text
    safe = memory_margin(tokens, memory, 90 * GIB, simple, eligible=eligible, pick=0)
    assert safe is None  # 12 GiB free: outside the error
    # the headroom a search already keeps counts: 2 GiB free + 1.1 GiB kept is outside the 3.042 GiB error
    assert memory_margin(tokens, memory, 80 * GIB, simple, eligible=eligible, pick=0, kept_bytes=1.1 * GIB) is None
    kept = memory_margin(tokens, memory, 80 * GIB, simple, eligible=eligible, pick=0, kept_bytes=0.5 * GIB,
                         labels=["a", "b", "c"])
    assert kept is not None and kept.headroom_gib == pytest.approx(3.1) and kept.layout == "b"
    assert "beyond the 0.5 GiB headroom kept" in kept.text


def test_the_pick_leaves_the_memory_error_free_and_names_the_riskier_one() -> None:
    # 80 GiB GPU, 3.9% error: 78 GiB (2 GiB free < 3.04) and 77.5 GiB (2.5 < 3.02) are inside it, 70 and 50 are not
    tokens, memory = [100.0, 99.0, 95.0, 90.0], [78.0, 77.5, 70.0, 50.0]
    assert list(inside_memory_error(CAPACITY_GIB * GIB - np.array(memory) * GIB, np.array(memory) * GIB)) == [
        True, True, False, False]
    r = _pick(tokens, memory, keep_error_free=True)
    assert r.pick == 2 and r.error_free and r.riskier == 0  # the fastest outside the error; the fastest inside named
    assert list(r.order) == [2, 3, 0, 1]  # outside the error first, then inside it, each fastest first
    assert list(r.tied) == [2] and r.details["fastest_tokens_per_s_per_gpu"] == 95.0
    assert r.reason.startswith("2 of the 4 layouts that fit leave the memory model's error free")
    note = riskier_layout(np.array(tokens), np.array(memory) * GIB, CAPACITY_GIB * GIB, pick=r.pick,
                          riskier=r.riskier, labels=["a", "b", "c", "d"])
    assert note is not None and note.layout == "a" and note.change == pytest.approx(100 / 95 - 1)
    assert note.free_gib == pytest.approx(2.0) and note.error_gib == pytest.approx(MEMORY_RESOLUTION * 78)
    assert "--headroom-gib 0" in note.text
    # without the rule (the user's --headroom-gib) the error only breaks ties: 99 is within 2% of 100 and inside too
    assert _pick(tokens, memory).pick == 0 and _pick(tokens, memory).riskier is None
    # when every layout is inside the error, the rule cannot hold: the usual pick, flagged by memory_margin
    every = _pick(tokens[:2], memory[:2], keep_error_free=True)
    assert every.pick == 0 and not every.error_free and every.riskier is None
    # a slower layout inside the error is no riskier alternative
    slow = _pick([100.0, 90.0], [70.0, 78.0], keep_error_free=True)
    assert slow.pick == 0 and slow.error_free and slow.riskier is None and list(slow.order) == [0, 1]


def test_ineligible_rows_are_not_ranked() -> None:
    d = _decide([100, 99, 90], [1, 30, 30], eligible=np.array([True, False, True]))
    assert d.pick == 0 and list(d.order) == [0, 2]
    none = _decide([100], [1], eligible=np.array([False]))
    assert none.pick is None and none.confidence == "none"


def test_confidence_counts_the_band() -> None:
    # 100 vs 95 (inside the dense band: 100 x 0.893 = 89.3) and 80 (outside): one other layout in the band
    d = _decide([100, 95, 80], [1, 1, 1], band=BAND)
    assert d.in_band == 1 and d.confidence == "within the model's uncertainty"
    assert "1 other layouts lie within the model's band" in d.reason
    clear = _decide([100, 85, 80], [1, 1, 1], band=BAND)
    assert clear.in_band == 0 and clear.confidence == "clear"
    assert clear.details["runner_up_margin"] == pytest.approx(0.15)


def test_measured_decisions_say_so() -> None:
    d = _pick([100, 99.5], [60, 50], [1, 0], measured=True, tolerance=0.01)  # tied: the simpler
    assert d.pick == 1 and d.confidence == "measured, tied" and "measured" in d.reason
    assert _decide([100, 90], [5, 6], measured=True).confidence == "measured"


def test_equivalent_layouts() -> None:
    # dist_opt at DP x CP = 1 and expert-DP = 1 shards over one rank: the same as dist_opt=false
    same = Layout(tp=8, dp=1, dist_opt=True)
    differs = Layout(tp=4, dp=2, dist_opt=True)
    moe = Layout(tp=1, dp=8, ep=8, dist_opt=True)  # expert-DP = 8 / 8 = 1 but DP = 8: not equivalent
    table = LayoutTable.from_layouts([same, differs, moe, Layout(tp=8, dp=1)])
    assert equivalent_to_simpler(table).tolist() == [True, False, False, False]
    assert not equivalent_to_simpler(table, dist_opt_choices=(True,)).any()  # no simpler twin in that space
    assert canonical(same) == Layout(tp=8, dp=1) and canonical(differs) == differs


def test_complexity_orders_simpler_first() -> None:
    # sizes first among layouts without switches; any switch (recompute, graphs, the a2a overlap) after them
    layouts = [Layout(dp=8), Layout(tp=2, dp=4), Layout(tp=2, pp=2, dp=2), Layout(tp=2, pp=2, vpp=2, dp=2),
               Layout(dp=8, recompute="selective"), Layout(dp=8, recompute="full"),
               Layout(dp=8, recompute="selective", cuda_graphs="transformer_engine")]
    c = complexity(LayoutTable.from_layouts(layouts))
    assert list(np.argsort(c, kind="stable")) == [0, 1, 2, 3, 4, 5, 6]
    assert math.isfinite(float(c.max()))

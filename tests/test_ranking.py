"""The pick, ties, equivalent layouts and the confidence of the ranking."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autotune.cost.layout_table import LayoutTable
from autotune.tuning.ranking import canonical, complexity, decide, equivalent_to_simpler
from search_spaces.layout import Layout

GIB = 1024**3
BAND = (-0.113, 0.104)  # the dense band: tokens/s x 0.893 .. x 1.110


def _decide(tokens, free_gib, simple=None, **kw):
    n = len(tokens)
    return decide(np.array(tokens, float), np.array(free_gib, float) * GIB,
                  np.array(simple if simple is not None else [0] * n), **kw)


@pytest.mark.parametrize("tokens, free, simple, pick, tied", [
    # alone at the top (next is 5% slower): the fastest
    ([100, 95, 90], [1, 30, 30], None, 0, 1),
    # 1.5% apart: tied; the one with more free memory wins
    ([100, 98.5, 90], [1, 30, 30], None, 1, 2),
    # tied with equal free memory: the simpler (lower complexity) wins
    ([100, 99, 90], [10, 10, 30], [5, 3, 1], 1, 2),
    # tied, equal memory and simplicity: the faster
    ([100, 99, 90], [10, 10, 30], [3, 3, 1], 0, 2),
    # exactly 2% below is still tied (>= best * 0.98)
    ([100, 98, 50], [1, 2, 3], None, 1, 2),
])
def test_the_pick(tokens, free, simple, pick, tied) -> None:
    d = _decide(tokens, free, simple)
    assert d.pick == pick and len(d.tied) == tied
    assert d.order[0] == pick and sorted(d.order) == [0, 1, 2]
    assert d.fastest == 0


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
    d = _decide([100, 99.5], [5, 6], measured=True, tolerance=0.01)
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
    layouts = [Layout(dp=8), Layout(tp=2, dp=4), Layout(tp=2, pp=2, dp=2), Layout(tp=2, pp=2, vpp=2, dp=2),
               Layout(tp=2, pp=2, vpp=2, dp=2, recompute="full")]
    c = complexity(LayoutTable.from_layouts(layouts))
    assert list(np.argsort(c)) == [0, 1, 2, 3, 4]
    assert math.isfinite(float(c.max()))

"""Nothing moved: every estimate and search pick of the bench set equals tests/data/golden_figures.json.

The file is written by `bench/golden.py --write` and rewritten only by a change that means to move figures (its
commit says which and why). The one-layout calls and the vectorised scorer are both held to it, so a term changed
in one place changes both or fails here.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from autotune.cost.layout_table import LayoutTable
from autotune.cost.score import score_layouts
from bench import golden
from search_spaces.layout import parse_layout


@cache
def _golden() -> dict[str, Any]:
    return json.loads(golden.PATH.read_text())


def _same(expected: Any, got: Any, where: str) -> None:
    changes = golden.diff(expected, got, where)
    assert not changes, "\n".join(changes[:20])


def test_the_published_rows_one_layout_at_a_time() -> None:
    rows = list(golden._rows())
    assert len(rows) == len(_golden()["rows"])
    for name, job, layout in rows:
        expected = _golden()["rows"][name]
        assert expected["layout"] == str(layout), name
        _same(expected, {"layout": str(layout), **golden.figures(job, layout)}, name)


def test_the_published_rows_scored_as_one_row_tables() -> None:
    for name, job, layout in golden._rows():
        scores = score_layouts(job, LayoutTable.from_layouts([layout]))
        _same(_golden()["rows"][name], {"layout": str(layout), **golden.score_figures(scores, 0)}, name)


@pytest.mark.parametrize("name", list(golden.SAMPLED))
def test_sampled_layouts_one_at_a_time_and_as_a_table(name: str) -> None:
    job, options = golden.SAMPLED[name]
    expected = _golden()["sampled"][name]
    layouts = golden.sampled_layouts(job, options)
    assert [str(lay) for lay in layouts] == [e["layout"] for e in expected]
    scores = score_layouts(job, LayoutTable.from_layouts(layouts))
    for i, (layout, want) in enumerate(zip(layouts, expected, strict=True)):
        assert parse_layout(want["layout"], world_size=job.world_size) == layout
        _same(want, {"layout": str(layout), **golden.figures(job, layout)}, f"{name}[{i}] one layout")
        _same(want, {"layout": str(layout), **golden.score_figures(scores, i)}, f"{name}[{i}] scored")


def test_search_picks() -> None:
    _same(_golden()["picks"], golden._picks(), "picks")

"""The search's terminal output: tables that fit the width, rows that differ, and the no-fit explanation."""

from __future__ import annotations

import io

import pytest

from autotune.outputs.tables import layout_flags, make_console, ranked_table, terminal_width
from autotune.tuning.answer import SearchResult
from autotune.ui.commands.search import explain_impossible, render
from search_spaces.layout import parse_layout

from sample_results import sampled_result


@pytest.fixture(scope="module")
def mixtral():
    return sampled_result("mixtral", 4)


@pytest.fixture(scope="module")
def deepseek():
    return sampled_result("deepseek-v3", 128)


def _render(result: SearchResult, width: int, *, wide: bool = False) -> str:
    out = io.StringIO()
    console = make_console(wide=wide, width=width)
    console.file = out
    render(result, top=10, console=console, wide=wide)
    return out.getvalue()


def _table_lines(text: str, title: str) -> list[str]:
    """The lines of the table under `title` (up to the next blank or unindented non-row line)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 1:]:
        if not line.strip() or line.startswith(("flags:", "Pareto", "Winner")):
            break
        rows.append(line)
    return rows


@pytest.mark.parametrize("name", ["mixtral", "deepseek"])
@pytest.mark.parametrize("width", [80, 120])
def test_no_table_line_is_wider_than_the_terminal(name, width, request):
    text = _render(request.getfixturevalue(name), width)
    for title in ("Best layouts", "Pareto front"):
        lines = _table_lines(text, title)
        assert lines and max(len(line) for line in lines) <= width


@pytest.mark.parametrize("name", ["mixtral", "deepseek"])
def test_rows_at_80_columns_tell_layouts_apart(name, request):
    # every field of the ten ranked layouts is in its row, so distinct layouts give distinct rows
    result = request.getfixturevalue(name)
    lines = _table_lines(_render(result, 80), "Best layouts")[2:]  # after the header and its rule
    rows, row = [], ""
    for line in lines:  # a row's flags may wrap onto a second line that starts with spaces
        if line[:4].strip().rstrip("*=!").isdigit():  # a rank and its mark (the pick, tied, inside the error)
            rows.append(row)
            row = line
        else:
            row += " " + line.strip()
    rows = [r for r in rows + [row] if r]
    ranked = result.ranked[:10]
    assert len(rows) == len(ranked)
    for line, record in zip(rows, ranked, strict=True):
        lay = record.layout
        assert line.split()[1:9] == [str(v) for v in (lay.tp, lay.pp, lay.vpp or "-", lay.cp, lay.ep, lay.expert_tp,
                                                      lay.dp, lay.mbs)]
        for flag in layout_flags(lay).split():
            assert flag in line or flag in "".join(line.split())  # a long flag may wrap inside the cell
    assert len(set(rows)) == len(rows)


def test_120_columns_add_what_bounds_the_step(mixtral):
    # 80 columns keep the layout, tokens/s, MFU and memory and drop "from" (and "largest non-compute" when its texts are
    # long); 120 columns show both
    narrow, wide = _render(mixtral, 80), _render(mixtral, 120)
    assert "from" not in _table_lines(narrow, "Best layouts")[0]
    header = _table_lines(wide, "Best layouts")[0]
    assert "largest non-compute" in header and "from" in header


def test_wide_shows_every_column_and_the_layout_text(mixtral):
    text = _render(mixtral, 80, wide=True)
    header = _table_lines(text, "Best layouts")[0]
    for column in ("MFU", "GiB", "free", "largest non-compute", "from", "step s", "TFLOP/s", "layout"):
        assert column in header
    assert str(mixtral.ranked[0].layout) in text


def test_dense_models_have_no_expert_columns():
    result = sampled_result("llama3-8b", 1, sample=60)
    console = make_console(width=80)
    header = _table_lines(_render(result, 80), "Best layouts")[0].split()
    assert "ep" not in header and "etp" not in header and "tp" in header
    assert console.width == 80


@pytest.mark.parametrize("env, tty, expected", [({"COLUMNS": "80"}, False, 80), ({"COLUMNS": "132"}, True, 132),
                                                ({}, False, 120)])
def test_terminal_width_honours_columns_when_piped(monkeypatch, env, tty, expected):
    monkeypatch.delenv("COLUMNS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return tty

    assert terminal_width(Stream()) == expected


@pytest.mark.parametrize("text, flags", [
    ("tp=2,pp=2,sp=true,dist_opt=true,recompute=selective", "sp dopt rc=sel"),
    ("tp=1,pp=16,first_stage_layers=3,last_stage_layers=2,recompute=full", "rc=full split=3|..|2"),
    ("tp=8,pp=8,vpp=2,embedding_loss_split=true", "split=emb+loss"),
    ("tp=1", "-"),
])
def test_layout_flags(text, flags):
    assert layout_flags(parse_layout(text)) == flags


def test_narrow_table_keeps_the_layout_and_throughput_columns(mixtral):
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=60).print(ranked_table(mixtral.ranked[:3], moe=True, width=60))
    lines = out.getvalue().splitlines()
    assert lines[1].split()[:11] == ["#", "tp", "pp", "vpp", "cp", "ep", "etp", "dp", "mbs", "flags", "tok/s/GPU"]
    assert max(map(len, lines)) <= 60


# --- nothing fits ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def impossible():
    # Llama-3.1-405B on 2 nodes: no layout fits in 79.6 GiB per GPU
    return sampled_result("llama3.1-405b", 2, sample=200, seq=8192, gbs=64)


def test_no_fit_is_said_once(impossible):
    assert impossible.best is None
    text = explain_impossible(impossible)
    assert text.lower().count("no layout fits") == 1
    assert text.startswith("No layout fits in 79.6 GiB per GPU (GPU memory minus headroom).")


def test_hints_follow_the_largest_memory_term(impossible):
    data = explain_impossible(impossible, as_text=False)
    terms = [row["largest_memory_term"] for row in data["closest"]]
    first = data["try"][0]
    if max(set(terms), key=terms.count) in ("optimizer", "weights", "gradients"):
        assert "--seq-length" not in first and "--nodes" in first
    else:
        assert "--seq-length" in first


@pytest.mark.parametrize("term, expected, unexpected", [
    ("optimizer", "--optimizer-moments bf16", "--seq-length"),
    ("activations", "--seq-length", "--optimizer-moments"),
    ("weights", "--nodes", "--seq-length"),
])
def test_memory_hints_by_term(impossible, term, expected, unexpected):
    from autotune.ui.commands.search import memory_hints

    hints = memory_hints(impossible, [term, term])
    assert expected in hints[0] and unexpected not in hints[0]

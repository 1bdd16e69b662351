"""`python -m autotune` with the analytic backend, in process (no Ray starts): what the screen and best.json say."""

from __future__ import annotations

import json
import math
import re

import pytest

from autotune.ui.cli import main

SMALL = ["--model", "llama3-8b", "--nodes", "1", "--global-batch-size", "64"]


def _run(capsys, tmp_path, *args: str) -> tuple[int, str, str]:
    code = main([*args, "--output", str(tmp_path / "run"), "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def test_partial_and_invalid_layouts_are_reported_and_the_run_goes_on(capsys, tmp_path) -> None:
    # the partial recipe layout of docs/cli.md is evaluated beside the search; tp=3 breaks world_size_divisible
    # (8 GPUs) and is reported with its violation, and the search still answers (exit 0)
    code, out, _ = _run(capsys, tmp_path, "--model", "mixtral", "--nodes", "4",
                        "--layout", "tp=1,pp=4,vpp=8,ep=8,dist_opt=true", "--layout", "tp=3")
    assert code == 0
    yours = out[out.index("Your layouts"):out.index("Pareto front")]
    assert "\n  tp=3," in yours and "invalid: world_size_divisible" in yours
    # the recipe's layout has its verdict: whether it fits, and its rank or the nearest variant that fits
    verdict = " ".join(yours[yours.index("  tp=1,pp=4,vpp=8"):].split("\n  tp=3,")[0].split())
    assert "fits" in verdict and ("rank" in verdict or "nearest that fits" in verdict), verdict
    trials = (tmp_path / "run" / "trials.csv").read_text()
    assert "tp=1,pp=4,vpp=8,cp=1,ep=8" in trials and ",user," in trials


def test_best_json_says_how_sure_the_pick_is(capsys, tmp_path) -> None:
    code, out, _ = _run(capsys, tmp_path, *SMALL)
    best = json.loads((tmp_path / "run" / "best.json").read_text())
    d = best["decision"]
    assert code == 0 and d["stage"] == "analytic" and d["pick"] == best["layout_text"]
    assert d["confidence"] in ("clear", "within the model's uncertainty") and d["reason"]
    assert d["tied"] == len(d["tied_layouts"]) >= 1 and best["layout_text"] in d["tied_layouts"]
    assert "Pick: " + d["confidence"] in out
    # the band is in log units (docs/search.md): the terminal's percentages are exp(low) - 1 and exp(high) - 1
    low, high = d["band"]
    assert low < 0 < high and (d["within_band"] == 0 or f"{math.exp(low) - 1:+.0%} / {math.exp(high) - 1:+.0%}"
                                in d["reason"])
    # MFU's reference precision is said beside the table
    assert "dense peak at the job's precision" in " ".join(out.split())
    # the ranked table marks the pick '1*' and the rows tied with it '2=', ...
    assert re.search(r"^ *1\* ", out, re.M) and bool(re.search(r"^ *2= ", out, re.M)) == (d["tied"] > 1)


def test_a_starved_pipeline_is_warned_on_screen_with_a_batch_to_use(capsys, tmp_path) -> None:
    # llama3.1-405b on 16 nodes with GBS 16: at most 16 micro-batches (tests/test_analytic_pass.py)
    code, out, _ = _run(capsys, tmp_path, "--model", "llama3.1-405b", "--nodes", "16", "--global-batch-size", "16")
    assert code == 0 and "Warning: global batch 16 leaves" in out and "--global-batch-size " in out


@pytest.mark.parametrize("flag", ["--cross-node-tp", "--allow-cross-node-tp"])
def test_cross_node_tp_flags_widen_the_search(capsys, tmp_path, flag) -> None:
    # tiny-gpt has 16 heads: TP 16 spans the 2 nodes of 8 GPUs only with the flag
    args = ["--model", "tiny-gpt", "--nodes", "2", "--seq-length", "1024", "--global-batch-size", "32", "--json"]
    _, narrow, _ = _run(capsys, tmp_path / "a", *args)
    _, wide, _ = _run(capsys, tmp_path / "b", *args, flag)
    assert json.loads(wide)["space_size"] > json.loads(narrow)["space_size"]


def test_layout_strings_are_never_broken_across_lines(capsys, tmp_path, monkeypatch) -> None:
    # issue 46: at 80 columns the reasons and warnings broke layout strings mid-word, so a copied line was not
    # a layout; every layout the decision names is whole on one line of the screen
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = _run(capsys, tmp_path, "--model", "mixtral", "--nodes", "4", "--layout", "tp=1,pp=4,ep=8")
    d = json.loads((tmp_path / "run" / "best.json").read_text())["decision"]
    named = [d["pick"], d["fastest"], d["riskier"]["layout"], *(v["layout"] for v in d["yours"])]
    lines = out.splitlines()
    assert code == 0 and len(named) == 4
    for layout in named:
        assert any(layout in line for line in lines), layout
    # and the prose around them still fits 80 columns wherever no layout is in the way (the launch lines are one
    # line each, on purpose: paste-able)
    prose = [line for line in lines if "tp=" not in line and not line.startswith(("--", "model.", "Results: "))]
    assert all(len(line) <= 80 for line in prose), max(prose, key=len)


def test_the_summary_says_how_many_layouts_trials_csv_keeps(capsys, tmp_path) -> None:
    # issue 46: `--trials 64` kept 108 rows without saying why: the summary counts them and names what they are
    code, out, _ = _run(capsys, tmp_path, *SMALL, "--trials", "8", "--layout", "tp=2,pp=1")
    kept = re.search(r"trials\.csv keeps ([\d,]+): the top --trials, the Pareto-optimal ones and your --layouts",
                     " ".join(out.split()))
    rows = (tmp_path / "run" / "trials.csv").read_text().strip().splitlines()[1:]
    assert code == 0 and kept is not None and int(kept.group(1).replace(",", "")) == len(rows) >= 8 + 1

"""`--release`: the software release a prediction is for, with a warning for one autotune has no factors for."""

from __future__ import annotations

import json

from autotune.ui.cli import main

ESTIMATE = ["estimate", "--model", "qwen3-30b-a3b", "--nodes", "2", "--gpu", "gb200", "--precision", "fp8",
            "--layout", "tp=1,ep=8,etp=1,mbs=4,dist_opt=true", "--global-batch-size", "512", "--json"]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_known_release_changes_the_prediction(capsys) -> None:
    code, newest, _ = _run(capsys, *ESTIMATE)
    code_old, older, err = _run(capsys, *ESTIMATE, "--release", "26.04")
    assert code == code_old == 0 and "warning" not in err
    tokens = [json.loads(text)["tokens_per_s_per_gpu"] for text in (newest, older)]
    assert tokens[0] != tokens[1]
    assert [json.loads(text)["release"] for text in (newest, older)] == ["26.08", "26.04"]
    code, text, _ = _run(capsys, *ESTIMATE[:-1], "--release", "0.5.1")  # a Bridge version: its container
    assert code == 0 and "release 26.06.01" in text.splitlines()[0]


def test_an_unknown_release_falls_back_to_the_nearest_with_one_warning_line(capsys) -> None:
    code, out, err = _run(capsys, *ESTIMATE, "--release", "26.05")
    assert code == 0 and json.loads(out)
    lines = [line for line in err.splitlines() if "warning" in line]
    assert len(lines) == 1 and "26.04.01" in lines[0] and "Traceback" not in err


def test_a_release_that_is_no_version_is_refused_in_one_line(capsys) -> None:
    code, out, err = _run(capsys, *ESTIMATE, "--release", "newest")
    assert code == 2 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "release" in err

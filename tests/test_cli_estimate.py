"""`python -m autotune estimate`: the --json object, the verdict, and exit codes."""

from __future__ import annotations

import json

import pytest

from autotune.ui.cli import main

JSON_KEYS = {"feasible", "violations", "memory_gib", "memory", "step_time_s", "tokens_per_s_per_gpu",
             "tflops_per_gpu", "mfu", "time", "layout"}


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_object_has_the_documented_keys(capsys) -> None:
    code, out, _ = _run(capsys, "estimate", "--model", "llama3-70b", "--nodes", "8", "--seq-length", "8192",
                        "--global-batch-size", "128", "--layout", "tp=8,pp=4,vpp=5,sp=true,dist_opt=true,"
                        "recompute=selective", "--json")
    obj = json.loads(out)
    assert JSON_KEYS <= set(obj)
    assert obj["feasible"] is True and code == 0
    # megatron-core names at the edge; dp derived: 64 / (8 * 4) = 2
    assert obj["layout"]["tensor_model_parallel_size"] == 8
    assert obj["layout"]["virtual_pipeline_model_parallel_size"] == 5
    assert obj["layout"]["dp"] == 2
    assert sum(obj["time"].values()) == pytest.approx(obj["step_time_s"])


def test_invalid_layout_exits_one_with_violations(capsys) -> None:
    code, out, _ = _run(capsys, "estimate", "--model", "llama3-70b", "--layout", "tp=3", "--json")
    obj = json.loads(out)
    assert code == 1 and obj["feasible"] is False and obj["violations"]


def test_bad_layout_text_is_a_usage_error(capsys) -> None:
    code, _, err = _run(capsys, "estimate", "--model", "llama3-8b", "--layout", "tp=two")
    assert code == 2 and "needs a positive integer" in err


def test_table_output_names_verdict_and_terms(capsys) -> None:
    code, out, _ = _run(capsys, "estimate", "--model", "llama3-8b", "--layout", "tp=2,sp=true,dist_opt=true")
    assert code == 0
    for word in ("verdict", "feasible", "activations", "tp_comm", "MFU"):
        assert word in out

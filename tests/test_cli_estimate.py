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


def test_default_headroom_is_the_searchs(capsys) -> None:
    # no headroom by default (the memory model counts the CUDA context, NCCL and the allocator's reserve itself):
    # an 80 GB H100 shows 81,559 MiB = 79.65 GiB, all usable
    _, out, _ = _run(capsys, "estimate", "--model", "mixtral", "--nodes", "4", "--layout", "tp=2,ep=8,etp=1,sp=true",
                     "--json")
    obj = json.loads(out)
    assert obj["usable_gib"] == pytest.approx(81559 / 1024) and obj["headroom_gib"] == pytest.approx(0.0)


@pytest.mark.parametrize("layout", ["tp=2,pp=2,ep=8,etp=1,sp=true", "tp=1,ep=8,dist_opt=true",
                                    "tp=8,pp=4,ep=8,etp=1,sp=true,mbs=4"])
def test_estimate_and_check_agree_on_what_fits(capsys, layout) -> None:
    _, est, _ = _run(capsys, "estimate", "--model", "mixtral", "--nodes", "4", "--layout", layout, "--json")
    _, chk, _ = _run(capsys, "check", "--model", "mixtral", "--nodes", "4", "--layout", layout, "--json")
    est_obj, chk_obj = json.loads(est), json.loads(chk)
    assert est_obj["memory_gib"] == pytest.approx(chk_obj["memory_gib"])
    assert est_obj["feasible"] is chk_obj["fits_in_memory"]


def test_headroom_beyond_the_gpu_is_a_usage_error(capsys) -> None:
    code, _, err = _run(capsys, "estimate", "--model", "llama3-8b", "--layout", "tp=1", "--headroom-gib", "90")
    assert code == 2 and "--headroom-gib" in err


def test_check_of_a_layout_that_does_not_fit_exits_1_and_names_the_nearest_that_does(capsys) -> None:
    # mixtral on 4 nodes with no PP and micro-batch 8: valid, but its 8 x 4096-token micro-batch needs ~359 GiB
    code, out, _ = _run(capsys, "check", "--model", "mixtral", "--nodes", "4", "--layout", "tp=1,pp=1,ep=8,mbs=8",
                        "--json")
    obj = json.loads(out)
    assert code == 1 and obj["valid"] and obj["fits_in_memory"] is False
    near = obj["nearest"]
    assert near["free_gib"] >= 0 and near["changes"]  # a variant of it, a field or two changed, that fits
    _, est, _ = _run(capsys, "estimate", "--model", "mixtral", "--nodes", "4", "--layout", near["layout"], "--json")
    assert json.loads(est)["feasible"] is True and json.loads(est)["memory_gib"] == pytest.approx(near["memory_gib"])
    fits, text, _ = _run(capsys, "check", "--model", "mixtral", "--nodes", "4", "--layout", near["layout"])
    assert fits == 0 and "nearest" not in text  # a layout that fits gets no suggestion


def test_estimate_of_a_layout_that_does_not_fit_suggests_the_nearest_that_does(capsys) -> None:
    code, out, _ = _run(capsys, "estimate", "--model", "mixtral", "--nodes", "4", "--layout", "tp=1,pp=1,ep=8,mbs=8")
    text = " ".join(out.split())
    assert code == 1 and "out of memory" in text and "nearest that fits (" in text

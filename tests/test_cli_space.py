"""`python -m autotune space` and `check`: output, --json, exit codes and bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from autotune.cli import main
from search_spaces.catalog import get_model
from search_spaces.space import feasible_layouts
from test_rules import make_job

MEGATRON_KEYS = {"tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
                 "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
                 "sequence_parallel", "micro_batch_size", "use_distributed_optimizer", "recompute_granularity",
                 "dp", "expert_dp"}


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _independently_valid(obj: dict, model, world: int, gpus_per_node: int, seq: int, gbs: int) -> list[str]:
    """The reference's arithmetic (shared/reference/parallelism.md), written out without search_spaces.rules."""
    tp, pp, cp = obj["tensor_model_parallel_size"], obj["pipeline_model_parallel_size"], obj["context_parallel_size"]
    vpp, ep, etp = obj["virtual_pipeline_model_parallel_size"], obj["expert_model_parallel_size"], \
        obj["expert_tensor_parallel_size"]
    dp, edp, mbs, sp = obj["dp"], obj["expert_dp"], obj["micro_batch_size"], obj["sequence_parallel"]
    groups = model.num_query_groups or model.num_attention_heads
    wrong = []
    checks = {
        "world": tp * pp * cp * dp == world,
        "expert grid": tp * cp * dp == ep * etp * edp,
        "heads": model.num_attention_heads % tp == 0,
        "groups": groups % tp == 0 or tp % groups == 0,
        "layers": model.num_layers % (pp * (vpp or 1)) == 0,
        "vpp": vpp is None or (pp > 1 and (gbs // (mbs * dp)) % pp == 0),
        "cp": cp == 1 or seq % (2 * cp) == 0,
        "sp": (not sp or (tp > 1 and (seq // cp) % tp == 0)) and (model.moe is None or tp == 1 or sp),
        "experts": ep == 1 if model.moe is None else model.moe.num_experts % ep == 0,
        "batch": gbs % (mbs * dp) == 0,
        "ffn": model.ffn_hidden_size % tp == 0 and (model.moe is None or model.moe.expert_ffn_hidden_size % etp == 0),
        "in node": gpus_per_node % tp == 0 and (model.moe is None or gpus_per_node % (ep * etp) == 0),
    }
    return [name for name, ok in checks.items() if not ok]


def test_space_prints_size_rejections_and_sample(capsys) -> None:
    code, out, _ = _run(capsys, "space", "--model", "mixtral", "--nodes", "4", "--sample", "3")
    size = len(list(feasible_layouts(make_job("mixtral", 32))))
    assert code == 0
    assert f"feasible layouts: {size:,}" in out
    assert "world_size_divisible" in out and "tp_within_node" in out  # rejection table rows
    assert "sample of 3 layouts" in out


def test_space_json_prints_only_valid_layouts_and_all_of_them(capsys) -> None:
    code, out, _ = _run(capsys, "space", "--model", "mixtral", "--nodes", "4", "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(lines) == len(list(feasible_layouts(make_job("mixtral", 32))))
    model = get_model("mixtral")
    for obj in lines:
        assert set(obj) == MEGATRON_KEYS
        assert _independently_valid(obj, model, 32, 8, 4096, 256) == [], obj


def test_space_json_honours_seq_length_gbs_and_limit(capsys) -> None:
    code, out, _ = _run(capsys, "space", "--model", "llama3-8b", "--nodes", "2", "--seq-length", "8192",
                        "--global-batch-size", "64", "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and lines
    for obj in lines:
        assert _independently_valid(obj, get_model("llama3-8b"), 16, 8, 8192, 64) == [], obj
    code, out, _ = _run(capsys, "space", "--model", "llama3-8b", "--nodes", "2", "--json", "--limit", "3")
    assert code == 0 and len(out.splitlines()) == 3


def test_allow_cross_node_tp_widens_the_space(capsys) -> None:
    _, out, _ = _run(capsys, "space", "--model", "tiny-gpt", "--nodes", "2", "--json")
    _, wide, _ = _run(capsys, "space", "--model", "tiny-gpt", "--nodes", "2", "--json", "--allow-cross-node-tp")
    tps = {json.loads(line)["tensor_model_parallel_size"] for line in out.splitlines()}
    wide_tps = {json.loads(line)["tensor_model_parallel_size"] for line in wide.splitlines()}
    assert max(tps) == 8 and max(wide_tps) == 16  # 16 heads, 2 nodes of 8


def test_list_models(capsys) -> None:
    code, out, _ = _run(capsys, "space", "--list-models")
    assert code == 0 and "mixtral-8x7b" in out.split()


def test_check_valid_layout(capsys) -> None:
    # 8 experts / EP 4 = 2 per GPU; DP = 32 / 2 = 16; expert DP = 2*16 / (4*1) = 8
    code, out, _ = _run(capsys, "check", "--model", "mixtral", "--nodes", "4", "--layout", "tp=2,ep=4,etp=1,sp=true")
    assert code == 0
    assert "valid" in out and "2 experts per GPU" in out and "DP 16" in out and "expert DP 8" in out


def test_check_lists_every_violation_and_exits_1(capsys) -> None:
    # heads 32 % 3; groups 8 vs 3; world 32 % 3; MoE TP without SP; 14336 % 3 != 0
    code, out, _ = _run(capsys, "check", "--model", "mixtral", "--nodes", "4", "--layout", "tp=3,ep=8", "--json")
    obj = json.loads(out)
    assert code == 1 and obj["valid"] is False
    rules = {v["rule"] for v in obj["violations"]}
    assert {"heads_divisible_by_tp", "query_groups_vs_tp", "world_size_divisible", "moe_tp_needs_sp"} <= rules
    assert all(v["message"] and v["fields"] for v in obj["violations"])


def test_check_issue_example(capsys) -> None:
    code, out, _ = _run(capsys, "check", "--model", "mixtral", "--nodes", "4", "--layout", "tp=2,pp=2,ep=8")
    assert code == 1 and "moe_tp_needs_sp" in out and "sequence parallelism" in out


def test_check_uses_seq_length(capsys) -> None:
    args = ("check", "--model", "tiny-gpt", "--layout", "cp=3,pp=1", "--nodes", "3", "--gpus-per-node", "1")
    code, out, _ = _run(capsys, *args, "--json")
    assert code == 1 and {v["rule"] for v in json.loads(out)["violations"]} == {"cp_sequence_divisible"}  # 4096 % 6
    code, _, _ = _run(capsys, *args, "--seq-length", "4098", "--global-batch-size", "8", "--json")
    assert code == 0  # 4098 % 6 == 0


@pytest.mark.parametrize(("argv", "match"), [
    (("check", "--model", "no-such-model", "--layout", "tp=1"), "mixtral-8x7b"),
    (("check", "--model", "mixtral", "--nodes", "0", "--layout", "tp=1"), "nodes"),
    (("check", "--model", "mixtral", "--nodes", "-2", "--layout", "tp=1"), "nodes"),
    (("check", "--model", "mixtral", "--layout", "tp=two"), "positive integer"),
    (("check", "--model", "mixtral", "--layout", "tp"), "name=value"),
    (("check", "--model", "mixtral", "--layout", "tpp=2"), "unknown layout field"),
    (("space", "--model", "no-such-model"), "known|use one of"),
    (("space", "--model", "/nonexistent/config.json"), "config"),
    (("space",), "--model"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, match) -> None:
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert re.search(match, err)


def test_unreadable_config_json(capsys, tmp_path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    code, _, err = _run(capsys, "space", "--model", str(bad))
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_module_entry_point_exit_code() -> None:
    result = subprocess.run([sys.executable, "-m", "autotune", "check", "--model", "tiny-gpt", "--layout", "sp=true"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "sp_needs_tp" in result.stdout

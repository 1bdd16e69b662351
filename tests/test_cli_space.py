"""`python -m autotune space` and `check`: output, --json, exit codes and bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from autotune.ui.cli import main
from search_spaces.catalog import get_model
from search_spaces.space import DEFAULT_SPACE, feasible_layouts

from test_rules import make_job

MEGATRON_KEYS = {"tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
                 "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
                 "sequence_parallel", "micro_batch_size", "use_distributed_optimizer", "recompute_granularity",
                 "dp", "expert_dp", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                 "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                 "pipeline_model_parallel_layout", "cuda_graphs", "ep_overlap", "cpu_offloading",
                 "cpu_offloading_num_layers", "fsdp", "offload_layers"}


def _layout_split(text: str, pp: int, v: int, num_layers: int, mtp: int) -> bool:
    """megatron-core's layout string (pipeline_parallel_layer_layout.py), expanded here without search_spaces:
    groups `(x)*n`, then `c*n`; stages split on `|`; E first, L last, t count = num_layers, m count = mtp,
    and stages = PP * VPP with no stage split into two PP ranks' share of MTP layers."""
    flat = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text.replace(",", ""))
    flat = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), flat)
    stages = flat.split("|")
    joined = "".join(stages)
    return (len(stages) == pp * v and set(joined) <= set("ELtm") and joined[0] == "E" and joined[-1] == "L"
            and joined.count("E") == joined.count("L") == 1 and joined.count("t") == num_layers
            and joined.count("m") == mtp and all(stages))


def _layers_split(obj: dict, num_layers: int, mtp: int = 0) -> bool:
    """megatron-core's pipeline split arithmetic (transformer_config.py "Uneven PP", transformer_block.py)."""
    pp, v = obj["pipeline_model_parallel_size"], obj["virtual_pipeline_model_parallel_size"] or 1
    if obj["pipeline_model_parallel_layout"]:
        others = (obj["num_layers_in_first_pipeline_stage"], obj["num_layers_in_last_pipeline_stage"])
        return others == (None, None) and not obj["account_for_embedding_in_pipeline_split"] and \
            _layout_split(obj["pipeline_model_parallel_layout"], pp, v, num_layers, mtp)
    first, last = obj["num_layers_in_first_pipeline_stage"], obj["num_layers_in_last_pipeline_stage"]
    extra = obj["account_for_embedding_in_pipeline_split"] + obj["account_for_loss_in_pipeline_split"]
    if first is None and last is None and not extra:
        return num_layers % (pp * v) == 0
    if pp == 1 or (extra and (first or last)):
        return False
    if extra:
        return (num_layers + extra) % (pp * v) == 0
    ends = [n for n in (first, last) if n is not None]
    if pp == 2 and v > 1 and len(ends) == 2:  # megatron-core fails to build PP rank 1 (0 middle stages)
        return False
    middle_layers, middle_stages = num_layers - sum(ends), pp - len(ends)
    if any(n <= 0 or n % v for n in ends) or middle_layers < 0 or bool(middle_layers) != bool(middle_stages):
        return False
    return middle_stages == 0 or middle_layers % (middle_stages * v) == 0


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
    checks = {
        "world": tp * pp * cp * dp == world,
        "expert grid": tp * cp * dp == ep * etp * edp,
        "heads": model.num_attention_heads % tp == 0,
        "groups": groups % tp == 0 or tp % groups == 0,
        "layers": _layers_split(obj, model.num_layers, model.mtp_num_layers),
        "vpp": vpp is None or (pp > 1 and (gbs // (mbs * dp)) % pp == 0),
        "cp": cp == 1 or seq % (2 * cp) == 0,
        "sp": (not sp or (tp > 1 and (seq // cp) % tp == 0)) and (model.moe is None or tp == 1 or sp),
        "experts": ep == 1 if model.moe is None else model.moe.num_experts % ep == 0,
        "batch": gbs % (mbs * dp) == 0,
        "ffn": model.ffn_hidden_size % tp == 0 and (model.moe is None or model.moe.expert_ffn_hidden_size % etp == 0),
        "in node": gpus_per_node % tp == 0,  # TP inside a node; EP*ETP may cross nodes (the search's default space)
    }
    return [name for name, ok in checks.items() if not ok]


def test_space_prints_size_rejections_and_sample(capsys) -> None:
    code, out, _ = _run(capsys, "space", "--model", "mixtral", "--nodes", "4", "--sample", "3")
    size = len(list(feasible_layouts(make_job("mixtral", 32), DEFAULT_SPACE)))
    assert code == 0
    assert f"feasible layouts: {size:,}" in out
    assert "world_size_divisible" in out and "tp_within_node" in out  # rejection table rows
    assert "sample of 3 layouts" in out
    # issue 46: "13,664 parallel shapes x 2 dist_opt x 3 recompute" did not multiply out to the size; now the
    # settings per shape are given as the range they take, and the shapes times that range hold the size
    found = re.search(r"\(([\d,]+) parallel shapes, each with the (\d+) to (\d+) dist_opt x recompute x CUDA-graph "
                      r"settings", " ".join(out.split()))
    assert found is not None, out
    shapes, low, high = (int(g.replace(",", "")) for g in found.groups())
    assert shapes * low <= size <= shapes * high


def test_space_json_prints_only_valid_layouts_and_all_of_them(capsys) -> None:
    code, out, _ = _run(capsys, "space", "--model", "mixtral", "--nodes", "4", "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(lines) == len(list(feasible_layouts(make_job("mixtral", 32), DEFAULT_SPACE)))
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
    _, new_name, _ = _run(capsys, "space", "--model", "tiny-gpt", "--nodes", "2", "--json", "--cross-node-tp")
    assert new_name == wide  # --allow-cross-node-tp is the old name of --cross-node-tp


def test_min_cp_tokens_flag_lifts_the_cp_limit(capsys) -> None:
    # seq 4096 on 16 GPUs: by default each CP rank keeps 1,024 tokens (CP <= 4); 0 lifts it to CP 16
    args = ("space", "--model", "tiny-gpt", "--nodes", "2", "--json", "--seq-length", "4096")
    _, out, _ = _run(capsys, *args)
    _, wide, _ = _run(capsys, *args, "--min-cp-tokens", "0")
    def cps(text: str) -> set[int]:
        return {json.loads(line)["context_parallel_size"] for line in text.splitlines()}
    assert max(cps(out)) == 4 and max(cps(wide)) == 16


def test_experts_cross_nodes_unless_kept_inside(capsys) -> None:
    # mixtral (8 experts) on 2 nodes of 8: EP 8 x ETP 2 = 16 spans both nodes, allowed by default
    _, out, _ = _run(capsys, "space", "--model", "mixtral", "--nodes", "2", "--json")
    _, kept, _ = _run(capsys, "space", "--model", "mixtral", "--nodes", "2", "--json", "--experts-within-node")
    def groups(text: str) -> set[int]:
        return {o["expert_model_parallel_size"] * o["expert_tensor_parallel_size"]
                for o in map(json.loads, text.splitlines())}
    assert max(groups(out)) == 16 and max(groups(kept)) == 8


@pytest.mark.parametrize(("model", "nodes", "pp", "vpp"), [
    ("deepseek-v3", 256, 16, None),  # 61 layers + 1 MTP layer: Bridge's Et*4|(t*4|)*14tmL
    ("llama3.1-405b", 64, 8, 8),  # 126 + 2 = 128 = 8 x 8 x 2
    pytest.param("qwen3-235b", 32, 8, 4, marks=pytest.mark.slow),  # 94 + 2 = 96 = 8 x 4 x 3; 127k lines
])
def test_space_json_offers_the_published_uneven_splits(capsys, model, nodes, pp, vpp) -> None:
    code, out, _ = _run(capsys, "space", "--model", model, "--nodes", str(nodes), "--global-batch-size", "1024",
                        "--micro-batch-sizes", "1", "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    picked = [o for o in lines if o["pipeline_model_parallel_size"] == pp
              and o["virtual_pipeline_model_parallel_size"] == vpp]
    assert code == 0 and picked
    spec = get_model(model)
    for obj in picked[:: max(1, len(picked) // 20)]:
        assert _independently_valid(obj, spec, nodes * 8, 8, 4096, 1024) == [], obj
    assert all(o["num_layers_in_first_pipeline_stage"] or o["account_for_embedding_in_pipeline_split"]
               or o["pipeline_model_parallel_layout"] for o in picked)


def test_check_deepseek_v3_pp16_uneven_split(capsys) -> None:
    layout = "tp=2,pp=16,ep=64,sp=true,first_stage_layers=3,last_stage_layers=2"
    code, out, _ = _run(capsys, "check", "--model", "deepseek-v3", "--nodes", "256", "--layout", layout, "--json")
    obj = json.loads(out)
    assert code == 0 and obj["valid"] and obj["stage_layers"] == [3] + [4] * 14 + [2]  # 3 + 56 + 2 = 61
    assert obj["layout"]["num_layers_in_first_pipeline_stage"] == 3
    code, out, _ = _run(capsys, "check", "--model", "deepseek-v3", "--nodes", "256", "--layout",
                        "tp=2,pp=16,ep=64,sp=true", "--json")
    assert code == 1 and {v["rule"] for v in json.loads(out)["violations"]} == {"layers_divisible_by_pp"}


def test_list_models(capsys) -> None:
    code, out, _ = _run(capsys, "space", "--list-models")
    assert code == 0 and "mixtral-8x7b" in out.split()


def test_check_valid_layout(capsys) -> None:
    # 8 experts / EP 4 = 2 per GPU; DP = 32 / 2 = 16; expert DP = 2*16 / (4*1) = 8
    # valid, but 231 GiB per GPU at PP 1: exit 1 (it does not fit) with the nearest variant that does
    code, out, _ = _run(capsys, "check", "--model", "mixtral", "--nodes", "4", "--layout", "tp=2,ep=4,etp=1,sp=true")
    assert code == 1 and "does not fit" in out and "nearest that fits" in out
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
    assert code == 1 and "moe_tp_needs_sp" in out and "rules: megatron-core" in out
    code, out, _ = _run(capsys, "check", "--model", "mixtral", "--nodes", "4", "--layout", "tp=2,pp=2,ep=8", "--json")
    (violation,) = json.loads(out)["violations"]
    # a hard error in megatron-core, said so, with megatron-core's own (misleading) words quoted
    assert "needs sequence_parallel true" in violation["message"] and "raises ValueError" in violation["message"]
    assert violation["stricter"] is False


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


def test_check_accepts_a_layout_string(capsys) -> None:
    # Megatron-Bridge v0.3.1's H100 preset for DeepSeek-V3: PP 8 x VPP 4 from the string's 32 stages
    layout = "tp=2,pp=8,ep=64,etp=1,sp=true,pipeline_layout=Et|(tt|)*30mL"
    code, out, _ = _run(capsys, "check", "--model", "deepseek-v3", "--nodes", "128", "--global-batch-size", "8192",
                        "--layout", layout, "--json")
    obj = json.loads(out)
    assert code == 1 and obj["valid"] and not obj["fits_in_memory"]  # valid, but over an H100's memory: exit 1
    assert obj["layout"]["pipeline_model_parallel_layout"] == "Et|(tt|)*30mL"
    assert obj["layout"]["virtual_pipeline_model_parallel_size"] == 4
    assert obj["stage_layers"] == [7] + [8] * 6 + [6]  # rank 0 holds E+t, tt, tt, tt; rank 7 tt, tt, tt, mL
    assert obj["megatron_core"]["megatron_core_rules"] in ("0.16.1", "0.19.2")


def test_check_and_space_say_which_rules_were_applied(capsys) -> None:
    from search_spaces.megatron_version import version_line

    _, out, _ = _run(capsys, "check", "--model", "tiny-gpt", "--layout", "tp=2")
    assert version_line() in out.replace("\n", "") and "valid in megatron-core 0.19.2" in out
    _, out, _ = _run(capsys, "space", "--model", "tiny-gpt", "--sample", "0")
    assert version_line() in out.replace("\n", "")
    code, out, _ = _run(capsys, "check", "--model", "tiny-gpt", "--layout", "tp=16", "--megatron-core", "0.16.1")
    flat = out.replace("\n", "")
    assert code == 1 and version_line("0.16.1") in flat and "invalid in megatron-core 0.16.1" in flat


def test_check_marks_a_deliberate_refusal(capsys) -> None:
    code, out, _ = _run(capsys, "check", "--model", "tiny-gpt", "--layout", "pp=1,embedding_loss_split=true", "--json")
    (violation,) = json.loads(out)["violations"]
    assert code == 1 and violation["stricter"] is True
    assert "megatron-core would accept this layout" in violation["message"]

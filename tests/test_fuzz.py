"""Property-based tests (hypothesis): whatever a user types, autotune answers with a value or a ValueError, and the
CLI with an exit code and at most one line on stderr, never a traceback.

- layout strings: `parse_layout` returns a Layout that reads back the same from its own text, or ValueError;
- Layout fields: `Layout(**fields)` validates its own fields (ValueError, nothing else);
- cluster YAML: any mapping of the cluster keys (catalog names, inline GPU/link specs, numbers of every kind)
  gives a ClusterSpec with positive finite figures, or ValueError;
- the CLI (`check`, `space`) on fuzzed layouts, node counts, cluster files and HF config.json values.
"""

from __future__ import annotations

import json
import math

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.ui.cli import main
from search_spaces.gpus import build_cluster
from search_spaces.layout import Layout, parse_layout

FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "mbs", "sp", "dist_opt", "recompute", "first_stage_layers",
          "last_stage_layers", "embedding_loss_split")
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# values a user might type: digits (ASCII and not), signs, underscores, floats, words, blanks, huge numbers
value_text = st.one_of(
    st.integers(-5, 10**12).map(str),
    st.sampled_from(["", " ", "true", "false", "none", "null", "selective", "full", "0_2", "+2", "2.0", "1e3",
                     "\uff12", "\u0662", "٣", "2 ", " 2", "-0", "9" * 40, "NaN", "inf"]),
    st.text(max_size=6),
)
item = st.tuples(st.one_of(st.sampled_from(FIELDS), st.text(max_size=5)), st.sampled_from(["=", "", "==", ":"]),
                 value_text).map(lambda t: f"{t[0]}{t[1]}{t[2]}")
layout_text = st.lists(item, max_size=6).map(",".join) | st.text(max_size=30)


@FUZZ
@given(layout_text)
def test_parse_layout_gives_a_layout_that_reads_back_or_a_value_error(text: str) -> None:
    try:
        layout = parse_layout(text, world_size=64)
    except ValueError:
        return
    assert parse_layout(str(layout)) == layout
    assert all(type(getattr(layout, f)) is int for f in ("tp", "pp", "cp", "ep", "dp", "mbs"))


field_value = st.one_of(st.integers(-3, 10**6), st.none(), st.booleans(), st.floats(allow_nan=True),
                        st.sampled_from(["none", "full", "2"]))


@FUZZ
@given(st.dictionaries(st.sampled_from(FIELDS), field_value, max_size=6))
def test_layout_validates_its_own_fields(fields: dict) -> None:
    try:
        layout = Layout(**fields)
    except ValueError:
        return
    assert min(layout.tp, layout.pp, layout.cp, layout.ep, layout.dp, layout.mbs) >= 1
    assert layout.recompute in ("none", "selective", "full")


number = st.one_of(st.integers(-10, 10**16), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                   st.none(), st.sampled_from(["989.4e12", "80", ".inf", "x", "", "1e400"]),
                   st.lists(st.integers(), max_size=2))
gpu_spec = st.fixed_dictionaries({}, optional={
    "name": st.one_of(st.text(max_size=5), st.integers()), "memory_bytes": number, "bf16_flops": number,
    "fp8_flops": number, "hbm_bytes_per_s": number, "arch": st.sampled_from(["hopper", "ampere", "z80", 3]),
    "aliases": st.one_of(st.lists(st.text(max_size=3), max_size=2), st.integers())})
link_spec = st.fixed_dictionaries({}, optional={
    "name": st.text(max_size=5), "bandwidth_bytes_per_s": number, "latency_s": number})
cluster_yaml = st.fixed_dictionaries({}, optional={
    "nodes": number, "gpus_per_node": number,
    "gpu": st.one_of(st.sampled_from(["h100", "a100", "nope", ""]), gpu_spec, number),
    "intra_node": st.one_of(st.sampled_from(["nvlink4", "bogus"]), link_spec),
    "inter_node": st.one_of(st.sampled_from(["ib-ndr", "ethernet-100g", "bogus"]), link_spec, number),
    "extra_key": st.integers()})


def _finite_positive(*values: float) -> bool:
    return all(math.isfinite(v) and v > 0 for v in values)


@FUZZ
@given(cluster_yaml)
def test_cluster_yaml_gives_a_sound_cluster_or_a_value_error(tmp_path_factory, data: dict) -> None:
    path = tmp_path_factory.mktemp("yaml") / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        c = build_cluster(yaml_path=path)
    except ValueError:
        return
    assert 1 <= c.world_size <= 2**20
    assert _finite_positive(c.gpu.memory_bytes, c.gpu.bf16_flops, c.gpu.hbm_bytes_per_s,
                            c.intra_node.bandwidth_bytes_per_s, c.inter_node.bandwidth_bytes_per_s)
    assert math.isfinite(c.inter_node.latency_s) and c.inter_node.latency_s >= 0


def _one_line_or_none(err: str) -> bool:
    lines = err.strip().splitlines()
    return "Traceback" not in err and len(lines) <= 1


@FUZZ
@given(layout_text, st.integers(-2, 10**13))
def test_check_verb_never_crashes(capsys, text: str, nodes: int) -> None:
    code = main(["check", "--model", "tiny-gpt", "--nodes", str(nodes), "--layout", text, "--json"])
    err = capsys.readouterr().err
    assert code in (0, 1, 2)
    assert _one_line_or_none(err)
    if code == 2:
        assert "error" in err


@FUZZ
@given(cluster_yaml)
def test_space_verb_on_fuzzed_cluster_files_never_crashes(tmp_path_factory, capsys, data: dict) -> None:
    path = tmp_path_factory.mktemp("cluster") / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    code = main(["space", "--model", "tiny-gpt", "--cluster", str(path), "--json", "--limit", "1"])
    assert code in (0, 2)
    assert _one_line_or_none(capsys.readouterr().err)


CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
               "vocab_size", "max_position_embeddings")
hf_value = st.one_of(st.integers(-4, 10**7), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                     st.none(), st.text(max_size=5), st.sampled_from(["32", "4096", "32000.5"]),
                     st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))


@FUZZ
@given(st.dictionaries(st.sampled_from(CONFIG_KEYS), hf_value, max_size=3))
def test_space_verb_on_fuzzed_hf_configs_answers_in_one_line(tmp_path_factory, capsys, changes: dict) -> None:
    # HF config.json validation itself belongs to search_spaces/hf_config.py; the CLI around it must never show
    # a traceback, whatever the values' types
    base = json.loads(open("tests/data/hf/llama3-8b.json").read())
    path = tmp_path_factory.mktemp("hf") / "config.json"
    path.write_text(json.dumps({**base, **changes}))
    code = main(["space", "--model", str(path), "--json", "--limit", "1"])
    assert code in (0, 1, 2)
    assert _one_line_or_none(capsys.readouterr().err)


@pytest.mark.parametrize("text", ["tp=\uff12", "tp=0_2", "tp=+2", "tp=2.0", "", " , "])
def test_the_issue_cases_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_layout(text)

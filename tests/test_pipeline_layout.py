"""megatron-core's pipeline_model_parallel_layout string: grammar, counts, the Layout field and its parsing."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from search_spaces.layout import Layout, parse_layout
from search_spaces.pipeline_layout import (
    LayoutSyntaxError,
    balanced_layout,
    chunk_counts,
    compress,
    layout_from_chunks,
    mtp_layout,
    parse_stages,
)


@pytest.mark.parametrize(("text", "stages"), [
    ("Et|(tt|)*30mL", ("Et",) + ("tt",) * 30 + ("mL",)),  # DeepSeek-V3 PP 8 x VPP 4 (Megatron-Bridge)
    ("Et*4|(t*4|)*14tmL", ("Etttt",) + ("tttt",) * 14 + ("tmL",)),  # PP 8 x VPP 2
    ("Ettt|(tt|)*29,m|L", ("Ettt",) + ("tt",) * 29 + ("m", "L")),  # commas are cosmetic
    ("Ett||tt|L", ("Ett", "", "tt", "L")),  # an empty stage is allowed
    ("Et*3|t*3L", ("Ettt", "tttL")),
    ("E|*3L", ("E", "", "", "L")),  # x*n repeats the single character before it, `|` too
])
def test_parse_like_megatron_core(text, stages):
    assert parse_stages(text) == stages


@pytest.mark.parametrize(("text", "char"), [
    ("E t|tL", " "),  # spaces are not part of the grammar
    ("Ee|tL", "e"),  # case-sensitive
    ("E((t|)*2)*2L", "("),  # no nesting: a parenthesis is left behind
])
def test_invalid_characters_fail_with_megatron_cores_message(text, char):
    with pytest.raises(LayoutSyntaxError, match=re.escape(f"Invalid layer character: {char} ")):
        parse_stages(text)


def test_a_huge_repeat_is_refused_before_it_is_expanded():
    with pytest.raises(LayoutSyntaxError, match="unrolls to more than"):
        parse_stages("Et*1000000000L")


def test_chunk_counts_are_in_chunk_order():
    # flat stage i is PP rank i % PP, virtual chunk i // PP: `Et|tt|ttt|tL` on PP 2 is rank 0: 1, 3; rank 1: 2, 1
    assert chunk_counts("Et|tt|ttt|tL") == (1, 2, 3, 1)
    assert chunk_counts("Et|tt|mL", "m") == (0, 0, 1)


@pytest.mark.parametrize(("layers", "pp", "vpp", "mtp", "expected"), [
    (61, 8, 4, 1, "Et|(tt|)*30mL"),  # 61 + E + m + L = 64 slots, 2 per chunk: the published layout
    (61, 8, 2, 1, "Et*3|(t*4|)*14ttmL"),  # 64 / 16 = 4 slots per chunk (the space offers mtp_layout's instead)
    (28, 2, 4, 0, "Et*3|(t*4|)*5t*3|ttL"),  # 30 slots over 8 chunks: 4 x 6 + 3 x 2; ranks get 15 and 15
    (61, 16, 4, 1, None),  # 64 / 64 = 1 slot per chunk: fewer than 2
])
def test_balanced_layout(layers, pp, vpp, mtp, expected):
    text = balanced_layout(layers, pp, vpp, mtp)
    assert text == expected
    if text is not None:
        stages = parse_stages(text)
        assert len(stages) == pp * vpp and "".join(stages).count("t") == layers
        slots = [sum(len(stages[c]) for c in range(p, pp * vpp, pp)) for p in range(pp)]
        assert max(slots) - min(slots) <= 1  # every pipeline rank within one slot of the others


@pytest.mark.parametrize(("layers", "pp", "vpp", "mtp", "expected"), [
    (61, 8, 4, 1, "Et|(tt|)*30mL"),  # Megatron-Bridge's DeepSeek-V3 PP 8 x VPP 4 string
    (61, 4, 4, 1, "Et*4|(t*4|)*14tmL"),  # Bridge's 16-chunk string (26.06-26.08 GB200 recipes: Etttt|(tttt|)*14tmL)
    (61, 8, 1, 1, "Et*8|(t*8|)*6t*5mL"),  # cost 64 over 8: the last takes m (2) + L (1) + 5 layers
    (61, 16, 4, 1, None),  # 64 chunks: one would hold no layer
    (60, 4, 4, 1, None),  # cost 63 does not divide over 16 chunks
    (27, 2, 4, 2, "Et*3|(t*4|)*6mmL"),  # cost 32 over 8 is 4, but the last chunk alone costs 2 * 2 + 1 = 5
])
def test_mtp_layout_is_bridges_deepseek_split(layers, pp, vpp, mtp, expected):
    text = mtp_layout(layers, pp, vpp, mtp)
    assert text == expected
    if text is not None:
        stages = parse_stages(text)
        cost = [s.count("t") + s.count("L") + 2 * s.count("m") for s in stages]
        assert len(stages) == pp * vpp and "".join(stages).count("t") == layers and "".join(stages).count("m") == mtp
        assert max(cost) == max(-(-(layers + 2 * mtp + 1) // (pp * vpp)), 2 * mtp + 1)  # the cap is reached
        assert cost[:-1] == sorted(cost[:-1]) and max(cost[:-1]) - min(cost[:-1]) <= 1  # lighter first, even


@given(st.lists(st.integers(min_value=0, max_value=9), min_size=2, max_size=40), st.integers(min_value=0, max_value=2))
def test_compress_round_trips(decoders, mtp):
    text = layout_from_chunks(decoders, mtp)
    stages = parse_stages(text)
    assert chunk_counts(text) == tuple(decoders)
    assert stages[0].startswith("E") and stages[-1].endswith("m" * mtp + "L")


@given(st.lists(st.text(alphabet="ELtm", max_size=6), min_size=1, max_size=30))
def test_compress_keeps_any_stages(stages):
    assert parse_stages(compress(stages)) == tuple(stages)


# --- the Layout field ------------------------------------------------------------------------------------------
def test_layout_derives_vpp_from_the_string_as_megatron_core_does():
    assert Layout(pp=8, pipeline_layout="Et|(tt|)*30mL").vpp == 4  # 32 stages / PP 8
    assert Layout(pp=2, pipeline_layout="Ettt|tttL").vpp is None  # 2 stages / PP 2 = 1: no interleaving
    assert Layout(pp=8, vpp=2, pipeline_layout="Et|(tt|)*30mL").vpp == 2  # explicit: the rules say it conflicts


def test_one_split_is_one_layout_however_it_is_spelled():
    # Bridge's 26.08 recipe spells DeepSeek-V3's 16-chunk split out; the space builds it compressed
    spelled = "Etttt|" + "tttt|" * 14 + "tmL"
    assert Layout(pp=4, pipeline_layout=spelled) == Layout(pp=4, pipeline_layout="Et*4|(t*4|)*14tmL")
    assert Layout(pp=4, pipeline_layout=spelled).pipeline_layout == "Et*4|(t*4|)*14tmL"
    assert Layout(pp=2, pipeline_layout="EtX|tL").pipeline_layout == "EtX|tL"  # unparsable: kept for the rules


def test_layout_counts_follow_the_string():
    layout = Layout(pp=8, pipeline_layout="Et|(tt|)*30mL")
    assert layout.chunk_layer_counts(61) == (1,) + (2,) * 30 + (0,)
    assert layout.stage_layer_counts(61) == (7,) + (8,) * 6 + (6,)  # rank 7: 2+2+2+0
    assert layout.chunk_mtp_counts(1) == (0,) * 31 + (1,)


def test_mtp_without_a_string_sits_on_the_last_chunk():
    assert Layout(pp=2, vpp=2).chunk_mtp_counts(1) == (0, 0, 0, 1)  # get_mtp_num_layers_to_build


@pytest.mark.parametrize(("text", "value"), [
    ("tp=2,pp=8,pipeline_layout=Et|(tt|)*30mL,ep=64", "Et|(tt|)*30mL"),
    ("pp=16,pipeline_layout=Ettt|(tt|)*29,m|L,sp=true", "Et*3|(tt|)*29m|L"),  # the comma continues the string
    ("PIPELINE_LAYOUT=EttL", "EttL"),  # the key is case-insensitive, the value is not
    ("pp=2,pipeline_layout=none", None),
])
def test_parse_layout_reads_the_string(text, value):
    assert parse_layout(text).pipeline_layout == value


def test_parse_layout_round_trips_through_str():
    layout = parse_layout("tp=2,pp=8,pipeline_layout=Et|(tt|)*30mL,ep=64,sp=true", world_size=1024)
    assert parse_layout(str(layout)) == layout and layout.vpp == 4


@pytest.mark.parametrize(("text", "match"), [
    ("pp=2,pipeline_layout=", "needs megatron-core's layout string"),
    ("pipeline_layout=EtL,pipeline_layout=EtL", "given twice"),
])
def test_parse_layout_bad_strings(text, match):
    with pytest.raises(ValueError, match=match):
        parse_layout(text)


def test_layout_rejects_a_non_string():
    with pytest.raises(ValueError, match="pipeline_layout must be a string"):
        Layout(pipeline_layout=3)  # type: ignore[arg-type]

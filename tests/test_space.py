"""The feasible space: generated layouts are valid, nothing valid is omitted, counts and choices agree."""

from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Any

import pytest

from search_spaces.gpus import build_cluster
from search_spaces.layout import Layout
from search_spaces.model import ModelSpec, MoESpec
from search_spaces.pipeline_layout import parse_stages
from search_spaces.rules import RULES, SPLIT_FIELDS, check
from search_spaces.space import (
    DIMENSIONS,
    OFFLOAD_COUNTS_MAX,
    SHAPE_DIMENSIONS,
    SpaceOptions,
    dimension_ranges,
    feasible_layouts,
    feasible_space,
    offload_values,
    pipeline_fields,
    space_rules,
)
from search_spaces.space_report import rejections

from test_rules import FLEX, GQA12, MOE6, MOE_BIAS, MTP12, make_job

# 14 layers: PP 4 splits (14 + 2) / 4 = 4 with embedding_loss_split; PP 3: 5 + 5 + 4; PP 6: 1 + 4*3 + 1
GQA14 = dataclasses.replace(GQA12, name="gqa14", num_layers=14)

SMALL = SpaceOptions(micro_batch_sizes=(1, 2), recompute=("none",), dist_opt=(False,))
WIDE = SpaceOptions(micro_batch_sizes=(1, 4), recompute=("full",), dist_opt=(True,), tp_within_node=False,
                    expert_within_node=False, min_pp_for_vpp=3, cuda_graphs=("local", "full_iteration"))

# (model, world, gpus per node, seq, gbs): small enough to enumerate the naive product
SMALL_JOBS = [
    ("tiny-gpt", 8, 4, 4096, 16),
    ("tiny-moe", 8, 4, 4096, 16),
    (GQA12, 12, 4, 4104, 24),
    (MOE6, 12, 4, 96, 24),
    (MOE_BIAS, 8, 8, 64, 16),
    (GQA14, 12, 4, 4104, 48),
    (MTP12, 12, 4, 4104, 24),  # MTP: eh_proj splits hidden 100 over TP; layout strings carry its `m`
    # per-layer graphs cannot capture a dropless MoE block: only no graphs (and full-iteration ones with HybridEP)
    ("tiny-moe", 8, 4, 4096, 16, {"cuda_graph_modules": ("attn", "moe")}),
    ("tiny-moe", 8, 4, 4096, 16, FLEX),  # the flex dispatcher needs ETP x EP > 1
    ("tiny-moe", 8, 4, 4096, 16, {**FLEX, "moe_flex_backend": "hybridep"}),  # full-iteration graphs of MoE too
    ("tiny-moe", 8, 4, 4096, 16, {"recompute_modules": ("moe",)}),  # no moe recompute under router graphs
]
GQA14_JOB = (GQA14, 12, 4, 4104, 48)


def _job(spec):
    model, world, gpn, seq, gbs, *training = spec
    return make_job(model, world, gpus_per_node=gpn, seq=seq, gbs=gbs, **(training[0] if training else {}))


def _level(rule) -> int:
    """The dimension at which a rule becomes checkable (dp is known once pp is, the split once vpp is)."""
    reads = {"pp" if name == "dp" else "vpp" if name in SPLIT_FIELDS else name for name in rule.reads}
    # the switches the space never turns on (fsdp, offload_layers) are off in every row: such a rule is checkable
    # with the dimensions it reads beside them
    return max((DIMENSIONS.index(name) for name in reads if name in DIMENSIONS), default=0)


def _brute_force(job, options):
    """Filter the whole naive product through every rule; count each rejection at its first rule."""
    ranges = dimension_ranges(job, options)
    rules = sorted(RULES + space_rules(job, options), key=_level)  # stable: RULES order within a dimension
    valid: set[Layout] = set()
    first: dict[str, int] = {}
    for values in itertools.product(*ranges.values()):
        d: dict[str, Any] = dict(zip(ranges, values, strict=True))  # one value per dimension, each its own type
        model_size = d["tp"] * d["cp"] * d["pp"]
        d["dp"] = job.world_size // model_size if job.world_size % model_size == 0 else 1
        layout = Layout(**d, **pipeline_fields(job.model.num_layers, d["pp"], d["vpp"], job.model.mtp_num_layers))
        broken = next((r.name for r in rules if r.check(job, layout)), None)
        if broken is None:
            valid.add(layout)
        else:
            first[broken] = first.get(broken, 0) + 1
    return valid, first


@pytest.mark.parametrize("options", [SMALL, WIDE], ids=["default-node", "cross-node"])
@pytest.mark.parametrize("spec", SMALL_JOBS, ids=lambda s: s[0] if isinstance(s, str) else getattr(s, "name", None))
def test_generator_equals_filtering_the_product(spec, options) -> None:
    job = _job(spec)
    valid, first = _brute_force(job, options)
    assert set(feasible_layouts(job, options)) == valid
    report = rejections(job, options)
    assert report.feasible == len(valid)
    assert {k: v for k, v in report.rejected_by.items() if v} == first


@pytest.mark.parametrize(("model", "nodes"), [("mixtral", 4), ("llama3-70b", 8), ("deepseek-v3", 32),
                                              ("qwen3-30b-a3b", 2), ("tiny-mla", 1), ("gpt3-175b", 16)])
def test_every_generated_layout_is_valid(model, nodes) -> None:
    job = make_job(model, nodes * 8, gpus_per_node=8)
    layouts = list(feasible_layouts(job))
    assert layouts
    assert all(check(job, layout) == () for layout in layouts)
    assert len(set(layouts)) == len(layouts)  # no duplicates
    report = rejections(job)
    assert report.feasible == len(layouts)
    assert report.rejected + report.feasible == report.candidates == sum(report.rejected_by.values()) + report.feasible


def test_dense_models_do_not_search_experts() -> None:
    layouts = list(feasible_layouts(make_job("tiny-gpt", 8)))
    assert {(x.ep, x.etp) for x in layouts} == {(1, None)}


def test_moe_layouts_carry_an_explicit_etp() -> None:
    layouts = list(feasible_layouts(make_job("tiny-moe", 8)))
    assert all(x.etp is not None for x in layouts)
    assert {x.ep for x in layouts} == {1, 2, 4, 8}


def test_moe_with_bias_only_gets_etp1() -> None:
    assert {x.etp for x in feasible_layouts(make_job(MOE_BIAS, 8))} == {1}


def test_moe_with_tp_always_has_sp_and_tp1_never() -> None:
    for x in feasible_layouts(make_job("tiny-moe", 8)):
        assert x.sp == (x.tp > 1)


def test_tp_stays_inside_a_node_unless_lifted() -> None:
    job = make_job("tiny-gpt", 16, gpus_per_node=8)
    default = {x.tp for x in feasible_layouts(job)}
    lifted = {x.tp for x in feasible_layouts(job, SpaceOptions(tp_within_node=False))}
    assert default == {1, 2, 4, 8} and lifted == {1, 2, 4, 8, 16}


def test_cp_keeps_min_cp_tokens_per_rank_unless_lifted() -> None:
    # seq 4096 on 16 GPUs: CP 8 and 16 would leave 512 and 256 tokens per rank
    job = make_job("tiny-gpt", 16, gpus_per_node=8, seq=4096)
    default = {x.cp for x in feasible_layouts(job)}
    lifted = {x.cp for x in feasible_layouts(job, SpaceOptions(min_cp_tokens=0))}
    assert default == {1, 2, 4} and lifted == {1, 2, 4, 8, 16}
    refused = [r for r in space_rules(job, SpaceOptions()) if r.name == "cp_min_tokens"][0]
    violation = refused.check(job, Layout(cp=8, dp=2))
    assert violation is not None and "leaves 512" in violation.message and "--min-cp-tokens 0" in violation.message
    assert refused.check(job, Layout(cp=4, dp=4)) is None
    with pytest.raises(ValueError, match="min_cp_tokens"):
        SpaceOptions(min_cp_tokens=-1)


def test_expert_tp_stays_inside_a_node_unless_tp_is_lifted() -> None:
    job = make_job("tiny-moe", 16, gpus_per_node=4)
    default = {x.expert_tp for x in feasible_layouts(job, SpaceOptions(expert_within_node=False))}
    lifted = {x.expert_tp for x in feasible_layouts(job, SpaceOptions(tp_within_node=False, expert_within_node=False))}
    assert max(default) == 4 and max(lifted) > 4
    rule = [r for r in space_rules(job, SpaceOptions()) if r.name == "tp_within_node"][0]
    violation = rule.check(job, Layout(tp=1, ep=1, etp=8, dp=16))
    assert violation is not None and "expert_tensor_parallel_size (8)" in violation.message


def test_tp_stays_inside_the_nvlink_domain_not_the_node() -> None:
    # GB200 NVL72: 4 GPUs per node, 72 on one NVLink fabric; 32 nodes = 128 GPUs. TP may span nodes inside the rack
    # (72 % 8 == 0) but not straddle racks (72 % 16 != 0); on HGX the domain is the node
    job = dataclasses.replace(make_job("tiny-gpt", 128, gpus_per_node=4), cluster=build_cluster(nodes=32, gpu="gb200"))
    assert job.cluster.nvlink_domain == 72
    assert {x.tp for x in feasible_layouts(job)} == {1, 2, 4, 8}  # tiny-gpt's 16 heads: TP divides 16


def test_min_pp_for_vpp_3_drops_interleaving_on_two_stages() -> None:
    job = make_job("tiny-gpt", 8)
    assert any(x.pp == 2 and x.vpp for x in feasible_layouts(job))
    assert not any(x.pp == 2 and x.vpp for x in feasible_layouts(job, SpaceOptions(min_pp_for_vpp=3)))


def test_an_impossible_job_has_an_empty_space() -> None:
    # one head, 3 layers, odd sequence: TP = CP = PP = 1, DP = 8 does not divide GBS 3
    model = ModelSpec(name="one-head", num_layers=3, hidden_size=64, ffn_hidden_size=64, num_attention_heads=1,
                      vocab_size=128)
    job = make_job(model, 8, seq=7, gbs=3)
    space = feasible_space(job, SMALL)
    assert space.size == 0 and list(space.layouts()) == [] and space.choices("tp", {}) == ()
    assert rejections(job, SMALL).feasible == 0


# --- the define-by-run choices API ----------------------------------------------------------------
def _walk(space, rng: random.Random) -> Layout:
    values: dict[str, object] = {}
    for name in DIMENSIONS:
        options = space.choices(name, values)
        assert options, f"dead end at {name} after {values}"
        values[name] = rng.choice(options)
    return space.layout(values)


@pytest.mark.parametrize(("model", "nodes"), [("mixtral", 4), ("deepseek-v3", 16), ("llama3-8b", 1)])
def test_random_walks_never_dead_end_and_land_on_valid_layouts(model, nodes) -> None:
    job = make_job(model, nodes * 8)
    space = feasible_space(job)
    rng = random.Random(0)
    members = set(space.layouts())
    for _ in range(200):
        layout = _walk(space, rng)
        assert layout in members and check(job, layout) == ()


def test_choices_are_exactly_the_next_values_of_the_shapes() -> None:
    space = feasible_space(make_job("tiny-moe", 8))
    shapes = space.shapes
    for shape in shapes[:: max(1, len(shapes) // 25)]:
        for k, name in enumerate(SHAPE_DIMENSIONS):
            prefix = dict(zip(SHAPE_DIMENSIONS[:k], shape[:k], strict=True))
            expected = {s[k] for s in shapes if s[:k] == shape[:k]}
            assert set(space.choices(name, prefix)) == expected


def test_choices_need_the_earlier_dimensions() -> None:
    space = feasible_space(make_job("tiny-gpt", 8))
    with pytest.raises(ValueError, match="earlier dimensions tp, cp"):
        space.choices("pp", {})
    with pytest.raises(ValueError, match="not a prefix"):
        space.choices("cp", {"tp": 3})
    with pytest.raises(ValueError, match="unknown dimension"):
        space.choices("dp", {})


def test_layout_of_values_outside_the_space_is_refused() -> None:
    space = feasible_space(make_job("tiny-gpt", 8))
    values = dict(tp=1, cp=1, pp=1, vpp=None, ep=1, etp=None, mbs=1, sp=True, ep_overlap=False, fsdp=False,
                  offload_layers=0, dist_opt=False, recompute="none", cuda_graphs="none")
    with pytest.raises(ValueError, match="not a layout of this space"):
        space.layout(values)  # SP with TP 1
    assert space.layout({**values, "sp": False}).dp == 8  # 8 / (1 * 1 * 1)


def test_param_names_carry_the_prefix() -> None:
    space = feasible_space(make_job("tiny-gpt", 8))
    assert space.param_name("tp", {}) == "tp"
    assert space.param_name("pp", {"tp": 2, "cp": 1}) == "pp_tp2_cp1"
    assert space.param_name("recompute", {"tp": 2, "ep_overlap": False, "dist_opt": True}) == \
        "recompute_ep_overlapFalse_dist_optTrue"


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"micro_batch_sizes": ()}, "micro_batch_sizes"),
    ({"recompute": ("some",)}, "recompute"),
    ({"dist_opt": ()}, "dist_opt"),
    ({"min_pp_for_vpp": 1}, "min_pp_for_vpp"),
    ({"max_tp": 0}, "max_tp"),
])
def test_bad_space_options_are_refused(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        SpaceOptions(**kwargs)


def test_caps_shrink_the_space() -> None:
    job = make_job("tiny-gpt", 8)
    capped = list(feasible_layouts(job, SpaceOptions(max_tp=2, max_cp=1, max_pp=2, max_vpp=2)))
    assert capped and all(x.tp <= 2 and x.cp == 1 and x.pp <= 2 and (x.vpp or 1) <= 2 for x in capped)
    assert rejections(job, SpaceOptions(max_tp=2, max_cp=1, max_pp=2, max_vpp=2)).feasible == len(capped)


def test_moe_folding_appears_in_the_space() -> None:
    # TP2 with EP8, ETP1 on 8 GPUs: lcm(2, 8) = 8 fits, the folded layout is generated
    layouts = feasible_space(make_job("tiny-moe", 8)).layouts()
    assert any(x.tp == 2 and x.ep == 8 and x.etp == 1 and x.pp == 1 for x in layouts)


def test_mixture_of_dense_first_layers_keeps_dense_ffn_rule() -> None:
    model = ModelSpec(name="moe-dense-first", num_layers=4, hidden_size=64, ffn_hidden_size=100, num_attention_heads=8,
                      vocab_size=128, moe=MoESpec(num_experts=4, topk=1, expert_ffn_hidden_size=64,
                                                  first_dense_layers=1))
    # dense ffn 100 % 8 = 4: TP 8 is not offered, TP 4 is
    tps = {x.tp for x in feasible_layouts(make_job(model, 8, seq=64, gbs=16))}
    assert 4 in tps and 8 not in tps


# --- uneven pipeline splits (layout.pipeline_split_for) ---------------------------------------------
@pytest.mark.parametrize(("model", "world", "pp", "vpp", "fields"), [
    # Bridge's B200 recipes (25.09-26.04): PP 16, 4 layers a stage, the last one with the MTP layer and the loss
    ("deepseek-v3", 2048, 16, None, {"pipeline_layout": "Et*4|(t*4|)*14tmL"}),
    ("llama3.1-405b", 512, 8, 8, {"embedding_loss_split": True}),  # (126 + 2) / (8 * 8) = 2
    ("qwen3-235b", 256, 8, 4, {"embedding_loss_split": True}),  # (94 + 2) / (8 * 4) = 3
    ("llama3-70b", 64, 8, 2, {}),  # 80 / (8 * 2) = 5: even
])
def test_published_recipes_are_in_the_space_with_their_split(model, world, pp, vpp, fields) -> None:
    job = make_job(model, world, gbs=1024)
    space = feasible_space(job)
    layouts = [x for x in space.layouts() if x.pp == pp and x.vpp == vpp]
    assert layouts and all(check(job, x) == () for x in layouts[:: max(1, len(layouts) // 50)])
    assert {(x.first_stage_layers, x.last_stage_layers, x.embedding_loss_split, x.pipeline_layout)
            for x in layouts} == {(fields.get("first_stage_layers"), fields.get("last_stage_layers"),
                                   fields.get("embedding_loss_split", False), fields.get("pipeline_layout"))}


@pytest.mark.parametrize(("model", "nodes", "vpps"), [
    # the (PP 2, VPP) where the space used to offer first + last (notes/mcore_rules_diff.md, 3.1)
    ("qwen2-7b", 1, {4}), ("qwen3-8b", 1, {4, 12}), ("llama3-70b", 2, {16}), ("qwen3-30b-a3b", 2, {16}),
    ("mixtral-8x22b", 2, {8}),
])
def test_pp2_with_vpp_offers_a_string_not_first_and_last(model, nodes, vpps) -> None:
    # megatron-core fails to build PP rank 1 of that split (ZeroDivisionError): the space offers a layout string
    layouts = [x for x in feasible_space(make_job(model, nodes * 8)).layouts() if x.pp == 2 and x.vpp]
    assert not any(x.first_stage_layers and x.last_stage_layers for x in layouts)
    assert {x.vpp for x in layouts if x.pipeline_layout} == vpps


def test_qwen2_pp2_vpp4_is_the_balanced_string() -> None:
    # 28 layers + E + L = 30 slots over 8 chunks: 4, 4, 4, 4, 4, 4, 3, 3; rank 0 and rank 1 hold 15 each
    layouts = [x for x in feasible_space(make_job("qwen2-7b", 8)).layouts() if x.pp == 2 and x.vpp == 4]
    assert {x.pipeline_layout for x in layouts} == {"Et*3|(t*4|)*5t*3|ttL"}
    assert layouts[0].stage_layer_counts(28) == (14, 14)


@pytest.mark.parametrize(("pp", "vpp", "string"), [
    (8, 4, "Et|(tt|)*30mL"),  # Megatron-Bridge v0.3.1's H100 preset for DeepSeek-V3 (61 layers, 1 MTP layer)
    (8, 2, "Et*4|(t*4|)*14tmL"),  # Bridge's 16-chunk string (its 26.06-26.08 GB200 recipes run it on PP 4 x VPP 4)
    (4, 4, "Et*4|(t*4|)*14tmL"),
])
def test_the_space_offers_deepseek_layout_strings(pp, vpp, string) -> None:
    job = make_job("deepseek-v3", 1024, gbs=8192)
    space = feasible_space(job)
    layouts = [x for x in space.layouts() if x.pp == pp and x.vpp == vpp]
    assert layouts and {x.pipeline_layout for x in layouts} == {string}
    assert check(job, layouts[0]) == ()


@pytest.mark.parametrize(("model", "nodes"), [("qwen2-7b", 1), ("deepseek-v3", 128), ("mixtral-8x22b", 8)])
def test_layout_strings_balance_the_pipeline_ranks(model, nodes) -> None:
    # without MTP: every chunk within one slot of the others, every rank too (embedding and loss one slot each);
    # with MTP, Bridge's DeepSeek-V3 split (`mtp_layout`): the chunks before the last within one layer of each
    # other, lighter first, none heavier than the last (embedding free, loss one, an MTP layer two)
    job = make_job(model, nodes * 8, gbs=1024)
    strings = {(x.pp, x.pipeline_layout) for x in feasible_space(job).layouts() if x.pipeline_layout}
    assert strings
    for pp, text in strings:
        stages = parse_stages(text)
        if job.model.mtp_num_layers:
            cost = [s.count("t") + s.count("L") + 2 * s.count("m") for s in stages]
            assert cost[:-1] == sorted(cost[:-1]) and cost[-2] - cost[0] <= 1 and max(cost) == cost[-1], text
            continue
        chunks = [len(s) for s in stages]
        ranks = [sum(chunks[r::pp]) for r in range(pp)]
        assert max(chunks) - min(chunks) <= 1 and max(ranks) - min(ranks) <= 1 and min(chunks) >= 2, text


def test_layout_of_values_adds_the_split() -> None:
    # 14 layers on PP 4: (14 + 2) / 4 = 4 per stage with the embedding and the loss counted as layers
    space = feasible_space(_job(GQA14_JOB), SMALL)
    values = dict(tp=1, cp=1, pp=4, vpp=None, ep=1, etp=None, mbs=1, sp=False, ep_overlap=False, fsdp=False,
                  offload_layers=0, dist_opt=False, recompute="none", cuda_graphs="none")
    layout = space.layout(values)
    assert layout.embedding_loss_split and layout.stage_layer_counts(14) == (3, 4, 4, 3)


def test_no_split_means_no_such_pp() -> None:
    # 14 layers on PP 12: even fails, (14 + 2) % 12 = 4, and 12 stages of >= 2 layers need 24: PP 12 not offered
    space = feasible_space(_job(GQA14_JOB), SMALL)
    assert 12 not in space.choices("pp", {"tp": 1, "cp": 1})
    assert 4 in space.choices("pp", {"tp": 1, "cp": 1})


@pytest.mark.parametrize(("release", "offered"), [("26.06.01", True), ("26.08", False)])
def test_local_graphs_are_searched_where_the_releases_bridge_runs_them(release, offered) -> None:
    # Bridge 0.6.0 (release 26.08) refuses per-layer local graphs; 0.5.1 (26.06.01) runs them; asked for, any
    job = make_job("qwen3-30b-a3b", 8)
    job = dataclasses.replace(job, training=dataclasses.replace(job.training, release=release))
    graphs = {x.cuda_graphs for x in feasible_space(job).layouts()}
    assert ("local" in graphs) is offered and {"none", "transformer_engine"} <= graphs
    asked = feasible_space(job, SpaceOptions(cuda_graphs=("local",)))
    assert asked.size and {x.cuda_graphs for x in asked.layouts()} == {"local"}


def test_offload_counts_stay_few_on_a_deep_stack() -> None:
    # NVIDIA's 405B FSDP recipe offloads 95 of 126 layers: at 126 layers the step stays 5; a stack of 100,000
    # layers (a fuzzed config) gets 32 counts, each a multiple of 5, instead of 20,000
    for layers, step in ((126, 5), (100_000, 3125)):
        job = make_job(dataclasses.replace(GQA12, name=f"gqa{layers}", num_layers=layers), world=8, gpus_per_node=8)
        values = offload_values(job, SpaceOptions())
        assert values == (0, *range(step, layers, step))
        assert len(values) <= OFFLOAD_COUNTS_MAX + 1

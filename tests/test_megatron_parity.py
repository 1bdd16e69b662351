"""Parity with megatron-core 0.16.1: for a sample of accepted and refused layouts, the same decision, and every
layout that `space` offers for several real models builds.

megatron-core's decision is `megatron_build.megatron_decision`, run in one spawned process (its CPU patches stay
out of this one): `TransformerConfig`, then for every pipeline stage on its first rank of a fake process group of
the job's world `initialize_model_parallel`, every virtual chunk's `GPTModel` (on the meta device, so full-size
models build too) and the pipeline schedule up to its first forward step, then the CP batch split, the SP split,
`MoELayer.forward`'s guard and the micro-batch calculator. The core attention is a parameter-free stand-in for
Transformer Engine's (GPU runs use TE; the local one refuses CP and MLA's head dims on its own).
`data_parallel_size_matches` has no megatron counterpart (megatron derives DP), so sampled layouts carry the
derived DP; `flex_dispatcher_needs_tp_ep` is checked on the dispatcher itself (`test_flex_dispatcher`), as
building it further needs DeepEP. Rules that only 0.19 has are not sampled against the installed 0.16.1.
`bench/bench_parity_sweep.py` runs a larger sweep of `space` outputs.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import random
import sys
from pathlib import Path

import pytest

from search_spaces.catalog import get_model
from search_spaces.hf_config import model_from_hf_config
from search_spaces.layout import Layout, parse_layout
from search_spaces.model import MLASpec, MoESpec, ModelSpec
from search_spaces.pipeline_layout import layout_from_chunks
from search_spaces.rules import RULE_NAMES, check
from search_spaces.space import SpaceOptions, dimension_ranges, feasible_space, pipeline_fields
from test_rules import EP_OVERLAP, GQA12, GQA12_FFN198, MOE6, MOE_BIAS, MTP12, make_job

pytestmark = pytest.mark.slow
HF_DATA = Path(__file__).parent / "data" / "hf"

# 14 layers: PP 4 takes the embedding/loss split ((14 + 2) / 4), PP 3 is 5 + 5 + 4, PP 6 is 1 + 4 x 3 + 1
GQA14 = dataclasses.replace(GQA12, name="gqa14", num_layers=14)
# DeepSeek-V3's features small: MLA, a dense first layer, shared experts, group-limited sigmoid routing, one MTP layer
TINY_DSV3 = ModelSpec(
    name="tiny-dsv3", num_layers=7, hidden_size=128, ffn_hidden_size=256, num_attention_heads=8, vocab_size=1000,
    qk_layernorm=True, mtp_num_layers=1,
    moe=MoESpec(num_experts=8, topk=2, expert_ffn_hidden_size=64, shared_expert_ffn_hidden_size=64,
                first_dense_layers=1, score_function="sigmoid", num_groups=4, group_topk=2, expert_bias=True),
    mla=MLASpec(q_lora_rank=32, kv_lora_rank=16, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16))
# Gemma's and GPT-OSS's features small: post norms, sliding window, sinks, biases everywhere, tied embeddings
TINY_GEMMA = ModelSpec(name="tiny-gemma", num_layers=6, hidden_size=96, ffn_hidden_size=192, num_attention_heads=4,
                       num_query_groups=2, kv_channels=32, vocab_size=1000, tied_embeddings=True, activation="gelu",
                       post_norms=True, qk_layernorm=True, sliding_window=64, window_attn_skip_freq=3)
TINY_OSS = ModelSpec(name="tiny-oss", num_layers=6, hidden_size=96, ffn_hidden_size=96, num_attention_heads=8,
                     num_query_groups=2, kv_channels=16, vocab_size=1000, add_bias_linear=True, softmax_type="learnable",
                     sliding_window=32, window_attn_skip_freq=2, moe=MoESpec(num_experts=4, topk=2, expert_ffn_hidden_size=96))

SEARCHED = SpaceOptions(tp_within_node=False, expert_within_node=False, micro_batch_sizes=(1, 2, 4))
# (model, world, gpus per node, seq, gbs, training settings, hand-picked layouts besides the random sample)
JOBS = [
    (GQA12_FFN198, 12, 4, 36, 24, {}, ("ep=2", "tp=12", "pp=1,vpp=2", "pp=3,vpp=2,mbs=2",
                                       "pp=3,vpp=5,first_stage_layers=2,last_stage_layers=5",  # 2 % 5
                                       "pp=3,vpp=5,first_stage_layers=5,last_stage_layers=2")),
    (MOE6, 8, 4, 64, 16, {}, ("tp=2,ep=2,etp=1", "pp=2,vpp=2,ep=2,etp=1,mbs=4")),
    (MOE_BIAS, 8, 8, 64, 16, {}, ("tp=2,sp=true,ep=2", "tp=2,sp=true,ep=2,etp=1")),
    ("tiny-moe", 16, 8, 48, 32, {}, ("tp=2,cp=3,sp=true", "tp=4,cp=2,sp=true,ep=2,etp=1", "pp=4,vpp=2,mbs=2")),
    # heads 12 vs TP 8 and 16; 12 layers vs PP 8; SP: 68 / CP 2 = 34 tokens, 34 % TP 4 = 2
    (GQA12, 16, 8, 68, 32, {}, (
        "tp=8", "tp=16", "pp=8", "tp=4,cp=2,sp=true", "tp=4,cp=2", "tp=8,sp=true",  # TP 8 over 4 query groups
        # uneven PP on 12 layers: exclusive; PP 1 with a mismatch; 2 left for 0 stages; 10 % 3; 3 per middle
        # stage vs VPP 2; 14 % 4; 14 / 2 = 7 vs VPP 2; accepted ones
        "pp=2,first_stage_layers=6,embedding_loss_split=true", "pp=1,first_stage_layers=5",
        "pp=2,first_stage_layers=5,last_stage_layers=5", "pp=4,first_stage_layers=2",
        "pp=4,vpp=2,first_stage_layers=2,last_stage_layers=4", "pp=4,embedding_loss_split=true",
        "pp=2,vpp=2,embedding_loss_split=true", "pp=2,first_stage_layers=5",
        "pp=4,vpp=2,first_stage_layers=2,last_stage_layers=2", "pp=2,embedding_loss_split=true",
        # PP 2 + first + last + VPP: megatron-core's ZeroDivisionError on PP rank 1; the same as a string builds
        "pp=2,vpp=2,first_stage_layers=6,last_stage_layers=6", "pp=2,vpp=3,first_stage_layers=3,last_stage_layers=9",
        "pp=2,vpp=2,pipeline_layout=Et*3|t*3|t*3|t*3L", "pp=2,vpp=2,first_stage_layers=6",
        # layout strings
        "pp=4,pipeline_layout=Et*3|t*3|t*3|t*3L", "pp=4,pipeline_layout=Et*4|t*4|t*4L",
        "pp=2,vpp=3,pipeline_layout=Et*3|t*3|t*3|t*3L", "pp=2,pipeline_layout=t*6|Et*6L",
        "pp=2,pipeline_layout=Et*6|t*5L", "pp=2,pipeline_layout=Et*6|t*6mL", "pp=2,pipeline_layout=Et*6|t*5xL",
        "pp=2,vpp=2,pipeline_layout=Et*12|||L", "pp=4,pipeline_layout=E|t*12||L",
        "pp=2,first_stage_layers=6,pipeline_layout=Et*6|t*6L", "pp=1,pipeline_layout=Et*12L",
        "pp=1,pipeline_layout=Et*6|t*6L")),
    (GQA14, 12, 4, 36, 48, {}, ("pp=4,embedding_loss_split=true", "pp=4,vpp=2,embedding_loss_split=true",
                                "pp=4,vpp=4,embedding_loss_split=true",  # 16 / 16: the first chunk builds 0 layers
                                "pp=3,first_stage_layers=5,last_stage_layers=4",
                                "pp=6,first_stage_layers=1,last_stage_layers=1", "pp=3,first_stage_layers=3", "pp=4")),
    (MTP12, 12, 4, 64, 24, {}, ("pp=2,pipeline_layout=Et*6|t*6mL", "pp=2,vpp=2,pipeline_layout=Et*3|t*3m|t*3|t*3L",
                                "pp=2,vpp=2,pipeline_layout=Et*3|t*3|t*3|t*3mL", "pp=2,pipeline_layout=Et*6|mt*6L",
                                "pp=2,vpp=2,pipeline_layout=Et*6|t*6m||L", "pp=2,embedding_loss_split=true",
                                "pp=2,vpp=2,first_stage_layers=6,last_stage_layers=6", "tp=3", "tp=4",
                                "pp=4,first_stage_layers=9,last_stage_layers=9", "pp=1,embedding_loss_split=true")),
    (TINY_DSV3, 16, 8, 64, 32, {}, ("pp=2,vpp=2,pipeline_layout=Et*2|t*2|tt|tmL", "tp=2,sp=true,ep=4,pp=2",
                                    "pp=4,vpp=2,pipeline_layout=Et|(t|)*5tmL", "tp=2,ep=8")),
    (TINY_GEMMA, 8, 8, 64, 16, {}, ("tp=2,pp=2,sp=true", "tp=4,pp=2", "pp=3,vpp=2")),
    (TINY_OSS, 8, 8, 64, 16, {}, ("tp=2,sp=true,ep=4,etp=1", "tp=2,sp=true,ep=2", "pp=2,ep=4,etp=1")),
    ("tiny-moe", 8, 8, 64, 32, EP_OVERLAP, ("ep=1", "pp=2,ep=2", "pp=2,vpp=2,ep=2", "ep=2,recompute=full")),
    ("tiny-moe", 8, 8, 64, 32, {**EP_OVERLAP, "cuda_graphs": "local"}, ("ep=2",)),
    (TINY_DSV3, 8, 8, 64, 32, EP_OVERLAP, ("ep=2", "pp=2,vpp=2,ep=2,pipeline_layout=Et*2|t*2|tt|tmL")),
]
N_ACCEPTED, PER_RULE, N_STRINGS = 8, 2, 4
NOT_SAMPLED = {"data_parallel_size_matches", "flex_dispatcher_needs_tp_ep", "ep_overlap_recompute_modules"}
# accepted by megatron-core 0.16.1, refused here (model, world, layout, our rule): PP 1 has nothing to split
# (megatron builds all 12 layers, or, with first + last, only the last stage's 3); first + last > num_layers
STRICTER = [
    (GQA12, 16, "pp=1,first_stage_layers=12", "pipeline_split_needs_pp"),
    (GQA12, 16, "pp=1,embedding_loss_split=true", "pipeline_split_needs_pp"),
    (GQA12, 16, "pp=1,first_stage_layers=5,last_stage_layers=3", "pipeline_split_needs_pp"),
    (GQA12, 16, "pp=4,first_stage_layers=9,last_stage_layers=9", "first_last_within_num_layers"),  # -6 % 2 == 0
]
# the `space` of real models, sampled: (catalog name or HF fixture, nodes, gbs, layouts sampled)
SPACES = [
    ("qwen2-7b", 1, 256, 10), ("mixtral-8x7b", 4, 256, 10), ("llama3-70b", 4, 256, 8), ("deepseek-v3", 64, 1024, 6),
    ("hf:gpt-oss-20b", 1, 256, 8), ("hf:gemma-3-1b-it", 1, 256, 6), ("hf:olmoe-1b-7b-0125", 1, 256, 6),
    ("hf:phi3-mini-4k-instruct", 1, 256, 6), ("hf:deepseek-v2-lite", 2, 256, 6),
]


def _random_layout_string(job, rng: random.Random) -> Layout:
    """A layout string on a random (PP, VPP): the right number of layers, or one too few or too many, or the MTP
    layers misplaced."""
    m = job.model
    pp = rng.choice([p for p in (2, 3, 4) if job.world_size % p == 0])
    vpp = rng.choice((1, 2))
    cuts = sorted(rng.randint(0, m.num_layers) for _ in range(pp * vpp - 1))
    decoders = [b - a for a, b in zip([0] + cuts, cuts + [m.num_layers])]
    if rng.random() < 0.3:
        decoders[rng.randrange(len(decoders))] += rng.choice((-1, 1)) if decoders[0] else 1
    decoders = [max(0, n) for n in decoders]
    text = layout_from_chunks(decoders, m.mtp_num_layers if rng.random() < 0.8 else 1 - min(1, m.mtp_num_layers))
    return parse_layout(f"pp={pp},pipeline_layout={text}", world_size=job.world_size)


def _sample(job, hand: tuple[str, ...], rng: random.Random) -> list[Layout]:
    """Accepted layouts from the space, refused ones from the naive product (each rule alone if possible),
    random layout strings, and the hand-picked ones."""
    layouts = list(feasible_space(job, SEARCHED).layouts())
    chosen = rng.sample(layouts, min(N_ACCEPTED, len(layouts)))
    ranges = dimension_ranges(job, SEARCHED)
    by_rule: dict[str, list[Layout]] = {}
    for _ in range(4000):
        values = {name: rng.choice(options) for name, options in ranges.items()}
        model_size = values["tp"] * values["cp"] * values["pp"]
        values["dp"] = max(1, job.world_size // model_size)
        layout = Layout(**values, **pipeline_fields(job.model.num_layers, values["pp"], values["vpp"],
                                                    job.model.mtp_num_layers))
        violations = check(job, layout)
        if len(violations) == 1 and len(by_rule.setdefault(violations[0].rule, [])) < PER_RULE:
            by_rule[violations[0].rule].append(layout)
    chosen += [x for group in by_rule.values() for x in group]
    chosen += [_random_layout_string(job, rng) for _ in range(N_STRINGS)]
    chosen += [parse_layout(text, world_size=job.world_size) for text in hand]
    return chosen


def _cases():
    rng = random.Random(0)
    for model, world, gpn, seq, gbs, training, hand in JOBS:
        job = make_job(model, world, gpus_per_node=gpn, seq=seq, gbs=gbs, **training)
        for layout in _sample(job, hand, rng):
            yield job, layout


def _space_cases():
    rng = random.Random(1)
    for name, nodes, gbs, n in SPACES:
        model = model_from_hf_config(HF_DATA / f"{name[3:]}.json") if name.startswith("hf:") else get_model(name)
        job = make_job(model, nodes * 8, gbs=gbs)
        shapes = feasible_space(job).shapes
        layouts = list(feasible_space(job).layouts())
        # half evenly spread, half from the layouts with an uneven split or a layout string
        uneven = [x for x in layouts if x.first_stage_layers or x.embedding_loss_split or x.pipeline_layout]
        picked = rng.sample(layouts, min(n // 2, len(layouts))) + rng.sample(uneven, min(n - n // 2, len(uneven)))
        assert shapes
        yield from ((job, x) for x in picked)


def _decide(cases: list) -> list[tuple[bool, str]]:
    sys.path.insert(0, str(Path(__file__).parent))
    import megatron_build

    megatron_build.setup()
    return [megatron_build.megatron_decision(job, layout) for job, layout in cases]


@pytest.fixture(scope="module")
def cases() -> list:
    return list(_cases())


@pytest.fixture(scope="module")
def space_cases() -> list:
    return list(_space_cases())


@pytest.fixture(scope="module")
def decisions(cases, space_cases) -> dict[str, list[tuple[bool, str]]]:
    stricter = [(make_job(m, w, gpus_per_node=8, seq=68, gbs=32), parse_layout(t, world_size=w)) for m, w, t, _ in STRICTER]
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        done = pool.submit(_decide, cases + stricter + space_cases).result(timeout=900)
    n, s = len(cases), len(stricter)
    return {"cases": done[:n], "stricter": done[n:n + s], "spaces": done[n + s:]}


def test_the_sample_covers_every_rule(cases) -> None:
    alone = {check(job, x)[0].rule for job, x in cases if len(check(job, x)) == 1}
    accepted = sum(1 for job, x in cases if not check(job, x))
    assert set(RULE_NAMES) - NOT_SAMPLED <= alone
    assert accepted >= N_ACCEPTED * len(JOBS)
    assert any(x.pipeline_layout and not check(job, x) for job, x in cases)


def test_same_decision_as_megatron_core(cases, decisions) -> None:
    """A layout broken only by deliberate (stricter) refusals is one megatron-core accepts."""
    mismatches = []
    for (job, layout), (theirs, reason) in zip(cases, decisions["cases"]):
        ours = check(job, layout)
        if theirs != all(v.stricter for v in ours):
            mismatches.append(f"{job.model.name} on {job.world_size}: {layout}: ours={[v.rule for v in ours]} "
                              f"megatron={'accepts' if theirs else reason}")
    assert not mismatches, "\n".join(mismatches)


def test_the_pp2_split_crashes_on_rank_1_and_its_string_builds(cases, decisions) -> None:
    results = {str(x): d for (job, x), d in zip(cases, decisions["cases"]) if job.model.name == "gqa12"}
    crash = parse_layout("pp=2,vpp=2,first_stage_layers=6,last_stage_layers=6", world_size=16)
    string = parse_layout("pp=2,vpp=2,pipeline_layout=Et*3|t*3|t*3|t*3L", world_size=16)
    assert results[str(crash)][0] is False and results[str(crash)][1].startswith("pp rank 1: ZeroDivisionError")
    assert results[str(string)] == (True, "")


@pytest.mark.parametrize("index", range(len(STRICTER)), ids=[c[2] for c in STRICTER])
def test_stricter_than_megatron_core(decisions, index) -> None:
    model, world, text, rule = STRICTER[index]
    job = make_job(model, world, gpus_per_node=8, seq=68, gbs=32)
    violations = check(job, parse_layout(text, world_size=world))
    assert {v.rule for v in violations} == {rule} and all(v.stricter for v in violations)
    assert decisions["stricter"][index] == (True, "")


def test_every_sampled_space_layout_builds(space_cases, decisions) -> None:
    failed = [f"{job.model.name} on {job.world_size}: {x}: {reason}"
              for (job, x), (ok, reason) in zip(space_cases, decisions["spaces"]) if not ok]
    assert not failed, "\n".join(failed)
    assert len(space_cases) >= 50


def _flex(tp_ep: list[tuple[int, int]]) -> list[str]:
    sys.path.insert(0, str(Path(__file__).parent))
    import megatron_build as mb

    mb.setup()
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.moe.token_dispatcher import MoEFlexTokenDispatcher

    out = []
    model = get_model("tiny-moe")
    for ep, etp in tp_ep:
        layout = Layout(ep=ep, etp=etp, dp=ep * etp)
        mb.init_rank(layout, 0)
        config = dataclasses.replace(mb.make_config(model, layout), moe_token_dispatcher_type="flex")
        try:
            MoEFlexTokenDispatcher(model.moe.num_experts // ep, list(range(model.moe.num_experts // ep)), config,
                                   pg_collection=ProcessGroupCollection.use_mpu_process_groups())
            out.append("built")
        except AssertionError as error:
            out.append(f"AssertionError: {error}")
        except Exception as error:  # noqa: BLE001 - past the check, into DeepEP, which a CPU lacks
            out.append(f"past the check ({type(error).__name__})")
        finally:
            mb.teardown()
    return out


def test_flex_dispatcher() -> None:
    pairs = [(1, 1), (2, 1), (1, 2)]
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        theirs = pool.submit(_flex, pairs).result(timeout=300)
    for (ep, etp), result in zip(pairs, theirs):
        job = make_job("tiny-moe", ep * etp, moe_token_dispatcher="flex")
        ours = {v.rule for v in check(job, Layout(ep=ep, etp=etp, dp=ep * etp))}
        assert ("flex_dispatcher_needs_tp_ep" in ours) == result.startswith("AssertionError"), (ep, etp, result)

"""Parity with megatron-core 0.16.1 and 0.19.2: for a sample of accepted and refused layouts, each version's rules
(`check(..., version=v)`) and megatron-core v's own decision agree, and every layout that `space` offers for several
real models builds in both.

megatron-core's decision is `megatron_build.megatron_decisions`, run by `megatron_runner` in the interpreter of that
release (this one for 0.19.2, `.venv-mcore-0.16.1/bin/python` for 0.16.1; the two run at once, and megatron's CPU
patches stay out of this process): `TransformerConfig`, then for every pipeline stage on its first rank of a fake
process group of the job's world `initialize_model_parallel`, every virtual chunk's `GPTModel` (on the meta device,
so full-size models build too) and the pipeline schedule up to its first forward step, then the CP batch split, the
SP split, `MoELayer.forward`'s guard and the micro-batch calculator. The core attention is a parameter-free
stand-in for Transformer Engine's (GPU runs use TE; the local one refuses CP and MLA's head dims on its own).
Both versions judge the same sample: accepted layouts, each rule's breakers under either version's rules (a rule
new in 0.19 is sampled from 0.19's), random layout strings and hand-picked ones.
`data_parallel_size_matches` has no megatron counterpart (megatron derives DP), so sampled layouts carry the
derived DP; `flex_dispatcher_needs_tp_ep` is checked on the dispatcher itself (`test_flex_dispatcher`), as
building it further needs DeepEP. `bench/bench_parity_sweep.py` runs a larger sweep of `space` outputs.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from search_spaces.catalog import get_model
from search_spaces.fsdp_rules import FSDP_RULES
from search_spaces.hf_config import model_from_hf_config
from search_spaces.hybrid_rules import HYBRID_RULES
from search_spaces.job import Job
from search_spaces.layout import Layout, parse_layout
from search_spaces.model import MLASpec, ModelSpec, MoESpec
from search_spaces.pipeline_layout import layout_from_chunks
from search_spaces.rules import RULE_NAMES, check
from search_spaces.space import SpaceOptions, dimension_ranges, feasible_space, pipeline_fields

import megatron_runner
from test_rules import GQA12, GQA12_FFN198, MOE6, MOE_BIAS, MOE_MTP2, MTP12, OVERLAP, make_job

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
                     num_query_groups=2, kv_channels=16, vocab_size=1000, add_bias_linear=True,
                     softmax_type="learnable", sliding_window=32, window_attn_skip_freq=2,
                     moe=MoESpec(num_experts=4, topk=2, expert_ffn_hidden_size=96))

SEARCHED = SpaceOptions(tp_within_node=False, expert_within_node=False, micro_batch_sizes=(1, 2, 4))
# (model, world, gpus per node, seq, gbs, training settings, hand-picked layouts besides the random sample)
JOBS: list[tuple[ModelSpec | str, int, int, int, int, Mapping[str, object], tuple[str, ...]]] = [
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
    ("tiny-moe", 8, 8, 64, 32, {}, tuple(t + OVERLAP for t in ("ep=1", "pp=2,ep=2", "pp=2,vpp=2,ep=2",
                                                               "ep=2,recompute=full", "ep=2,cuda_graphs=local"))),
    (TINY_DSV3, 8, 8, 64, 32, {}, ("ep=2" + OVERLAP, "pp=2,vpp=2,ep=2,pipeline_layout=Et*2|t*2|tt|tmL" + OVERLAP)),
    # 0.19 refuses moe in recompute_modules with the overlap; both refuse 2 MTP layers and TE graphs on mlp with it
    ("tiny-moe", 8, 8, 64, 32, {"recompute_modules": ("moe",)}, ("ep=2,recompute=selective" + OVERLAP,)),
    (MOE_MTP2, 8, 8, 64, 32, {}, ("ep=2" + OVERLAP,)),
    (MOE6, 8, 8, 64, 32, {"cuda_graph_modules": ("mlp",)},
     ("ep=2,cuda_graphs=transformer_engine" + OVERLAP, "ep=2,recompute=selective,cuda_graphs=transformer_engine"
      + OVERLAP)),
    # CUDA graphs without the overlap: full recompute needs full-iteration graphs (both versions)
    ("tiny-moe", 8, 8, 64, 32, {}, ("ep=2,recompute=full,cuda_graphs=local", "pp=2,vpp=2,ep=2,cuda_graphs=local",
                                    "recompute=full,cuda_graphs=local")),
    ("tiny-gpt", 8, 8, 64, 32, {}, ("recompute=full,cuda_graphs=full_iteration",
                                    "pp=2,vpp=2,recompute=full,cuda_graphs=full_iteration")),
    # graph modules the model lacks or that need another (both versions): router graphs of a dense model,
    # moe_preprocess without moe_router
    ("tiny-gpt", 8, 8, 64, 32, {"cuda_graph_modules": ("attn", "moe_router")}, ("cuda_graphs=transformer_engine",)),
    ("tiny-moe", 8, 8, 64, 32, {"cuda_graph_modules": ("attn", "moe_preprocess")},
     ("ep=2,cuda_graphs=transformer_engine",)),
]
N_ACCEPTED, PER_RULE, N_STRINGS, DRAWS = 8, 2, 4, 5000
VERSIONS = ("0.16.1", "0.19.2")
# never sampled against megatron-core (module docstring)
NOT_SAMPLED = {"data_parallel_size_matches", "flex_dispatcher_needs_tp_ep"}
# the sample draws layouts of bf16 jobs; an FP8 job's BF16 edge layers are held to megatron-core's message in
# tests/test_rules.py (TRAINING_BROKEN)
NOT_SAMPLED |= {"bf16_layers_within_stage"}
# the hybrid Mamba rules need a HybridModel, which this GPT sample never builds: tests/test_hybrid.py holds them to
# megatron-core's own decisions on HybridModel stages (`test_megatron_core_decides_as_the_rules`)
NOT_SAMPLED |= {name for name, _, _ in HYBRID_RULES}
# Megatron-FSDP and the layer offload: the sample draws them (they are `space` dimensions), but their coverage is
# not required here; tests/test_fsdp_offload_launch.py holds the offload rules to megatron-core's TransformerConfig
# with their words and fsdp_needs_pp1 to Megatron-FSDP's device mesh
NOT_SAMPLED |= {name for name, _, _ in FSDP_RULES}
# checks `megatron_decision` never reaches: the model is not wrapped in Megatron-FSDP (its
# `FullyShardedDataParallel.__init__` builds CUDA device meshes first), where the EP overlap's refusal of the double
# buffer is; megatron-core accepts what only these break as far as the decision goes (tests/test_rules.py holds
# the message)
UNREACHED = {"fsdp_ep_overlap"}
# rules a version's rule set never breaks: `ep_overlap_recompute_modules` is new in 0.19
NOT_IN = {"0.16.1": {"ep_overlap_recompute_modules"}, "0.19.2": set()}
# accepted by megatron-core (both versions), refused here (model, world, layout, our rule): PP 1 has nothing to
# split (megatron builds all 12 layers, or, with first + last, only the last stage's 3); first + last > num_layers
STRICTER = [
    (GQA12, 16, "pp=1,first_stage_layers=12", "pipeline_split_needs_pp"),
    (GQA12, 16, "pp=1,embedding_loss_split=true", "pipeline_split_needs_pp"),
    (GQA12, 16, "pp=1,first_stage_layers=5,last_stage_layers=3", "pipeline_split_needs_pp"),
    (GQA12, 16, "pp=4,first_stage_layers=9,last_stage_layers=9", "first_last_within_num_layers"),  # -6 % 2 == 0
]
# the `space` of real models, sampled: (catalog name or HF fixture, nodes, gbs, layouts sampled)
SPACES = [
    ("qwen2-7b", 1, 256, 10), ("mixtral-8x7b", 4, 256, 10), ("llama3-70b", 4, 256, 8), ("deepseek-v3", 64, 1024, 4),
    ("hf:gpt-oss-20b", 1, 256, 8), ("hf:gemma-3-1b-it", 1, 256, 6), ("hf:olmoe-1b-7b-0125", 1, 256, 6),
    ("hf:phi3-mini-4k-instruct", 1, 256, 6), ("hf:deepseek-v2-lite", 2, 256, 6),
]
FLEX_PAIRS = [(1, 1), (2, 1), (1, 2)]  # (EP, ETP) on EP * ETP GPUs


def _for_version(job: Job, version: str) -> Job:
    return dataclasses.replace(job, training=dataclasses.replace(job.training, megatron_core=version))


def _random_layout_string(job, rng: random.Random) -> Layout:
    """A layout string on a random (PP, VPP): the right number of layers, or one too few or too many, or the MTP
    layers misplaced."""
    m = job.model
    pp = rng.choice([p for p in (2, 3, 4) if job.world_size % p == 0])
    vpp = rng.choice((1, 2))
    cuts = sorted(rng.randint(0, m.num_layers) for _ in range(pp * vpp - 1))
    decoders = [b - a for a, b in zip([0] + cuts, cuts + [m.num_layers], strict=True)]
    if rng.random() < 0.3:
        decoders[rng.randrange(len(decoders))] += rng.choice((-1, 1)) if decoders[0] else 1
    decoders = [max(0, n) for n in decoders]
    text = layout_from_chunks(decoders, m.mtp_num_layers if rng.random() < 0.8 else 1 - min(1, m.mtp_num_layers))
    return parse_layout(f"pp={pp},pipeline_layout={text}", world_size=job.world_size)


def _sample(job, hand: tuple[str, ...], rng: random.Random) -> list[Layout]:
    """Accepted layouts from the space (of the installed version's rules), refused ones from the naive product (each
    rule alone if possible, under either version's rules), random layout strings, and the hand-picked ones."""
    layouts = list(feasible_space(job, SEARCHED).layouts())
    chosen = rng.sample(layouts, min(N_ACCEPTED, len(layouts)))
    ranges = dimension_ranges(job, SEARCHED)
    by_rule: dict[tuple[str, str], list[Layout]] = {}
    for _ in range(DRAWS):
        # one value per dimension, each its own type
        values: dict[str, Any] = {name: rng.choice(options) for name, options in ranges.items()}
        if rng.random() < 0.75:  # FSDP and offload in a quarter of the draws: the other rules still break alone
            values.update(fsdp=False, offload_layers=0)
        model_size = values["tp"] * values["cp"] * values["pp"]
        values["dp"] = max(1, job.world_size // model_size)
        layout = Layout(**values, **pipeline_fields(job.model.num_layers, values["pp"], values["vpp"],
                                                    job.model.mtp_num_layers))
        for version in VERSIONS:
            violations = check(job, layout, version=version)
            if len(violations) == 1 and len(group := by_rule.setdefault((version, violations[0].rule), [])) < PER_RULE:
                group.append(layout)
    breakers = [x for group in by_rule.values() for x in group]
    chosen += list(dict.fromkeys(breakers))  # a layout breaking the same rule alone in both versions once
    chosen += [_random_layout_string(job, rng) for _ in range(N_STRINGS)]
    chosen += [parse_layout(text, world_size=job.world_size) for text in hand]
    return chosen


def _cases() -> list[tuple[Job, Layout]]:
    rng = random.Random(0)
    out = []
    for model, world, gpn, seq, gbs, training, hand in JOBS:
        job = make_job(model, world, gpus_per_node=gpn, seq=seq, gbs=gbs, **training)
        out += [(job, layout) for layout in _sample(job, hand, rng)]
    return out


def _space_cases(version: str) -> list[tuple[Job, Layout]]:
    """Layouts of version `version`'s `space` (its jobs target that release)."""
    rng = random.Random(1)
    out = []
    for name, nodes, gbs, n in SPACES:
        model = model_from_hf_config(HF_DATA / f"{name[3:]}.json") if name.startswith("hf:") else get_model(name)
        job = make_job(model, nodes * 8, gbs=gbs, megatron_core=version)
        layouts = list(feasible_space(job).layouts())
        # half evenly spread, half from the layouts with an uneven split or a layout string
        uneven = [x for x in layouts if x.first_stage_layers or x.embedding_loss_split or x.pipeline_layout]
        picked = rng.sample(layouts, min(n // 2, len(layouts))) + rng.sample(uneven, min(n - n // 2, len(uneven)))
        assert layouts, (name, version)
        out += [(job, x) for x in picked]
    return out


def _stricter_cases() -> list[tuple[Job, Layout]]:
    return [(make_job(m, w, gpus_per_node=8, seq=68, gbs=32), parse_layout(t, world_size=w)) for m, w, t, _ in STRICTER]


@pytest.fixture(scope="module")
def cases() -> list[tuple[Job, Layout]]:
    return _cases()


@pytest.fixture(scope="module")
def space_cases() -> dict[str, list[tuple[Job, Layout]]]:
    return {v: _space_cases(v) for v in VERSIONS}


@pytest.fixture(scope="module")
def megatron(cases, space_cases) -> dict[str, dict[str, Any]]:
    """Per version: megatron-core's decisions on the cases, the stricter cases and the version's space cases, and the
    flex dispatcher's verdicts, all four children running at once (an error when an interpreter is missing)."""
    stricter = _stricter_cases()
    pending: dict[str, tuple[megatron_runner.Pending, megatron_runner.Pending]] = {}
    for v in VERSIONS:
        if megatron_runner.python_for(v) is None:
            continue
        pending[v] = (megatron_runner.start("megatron_decisions", cases + stricter + space_cases[v], version=v,
                                            timeout=900),
                      megatron_runner.start("flex_dispatcher_decisions", get_model("tiny-moe"), FLEX_PAIRS,
                                            version=v, timeout=300))
    out: dict[str, dict[str, Any]] = {}
    try:
        for v, started in pending.items():
            decided, flex = started[0].result(), started[1].result()
            n, s = len(cases), len(stricter)
            out[v] = {"cases": decided[:n], "stricter": decided[n:n + s], "spaces": decided[n + s:], "flex": flex}
    finally:
        for started in pending.values():
            for child in started:
                child.cancel()
    return out


def _of(megatron: dict[str, dict[str, Any]], version: str) -> dict[str, Any]:
    if version not in megatron:
        pytest.skip(f"no interpreter with megatron-core {version} ({megatron_runner.INTERPRETERS[version]}; "
                    "scripts/bootstrap creates it)")
    return megatron[version]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_sample_covers_every_rule(cases, version) -> None:
    alone = {vs[0].rule for vs in (check(job, x, version=version) for job, x in cases) if len(vs) == 1}
    accepted = sum(1 for job, x in cases if not check(job, x, version=version))
    assert set(RULE_NAMES) - NOT_SAMPLED - NOT_IN[version] <= alone
    assert not NOT_IN[version] & alone  # a rule the version lacks is never broken under it
    assert accepted >= N_ACCEPTED * 12
    assert any(x.pipeline_layout and not check(job, x, version=version) for job, x in cases)


@pytest.mark.parametrize("version", VERSIONS)
def test_same_decision_as_megatron_core(cases, megatron, version) -> None:
    """A layout broken only by deliberate (stricter) refusals is one megatron-core accepts."""
    mismatches = []
    for (job, layout), (theirs, reason) in zip(cases, _of(megatron, version)["cases"], strict=True):
        ours = check(job, layout, version=version)
        if theirs != all(v.stricter or v.rule in UNREACHED for v in ours):
            mismatches.append(f"{job.model.name} on {job.world_size} {dict(_training_diff(job))}: {layout}: "
                              f"ours={[v.rule for v in ours]} megatron={'accepts' if theirs else reason}")
    assert not mismatches, "\n".join(mismatches)


def _training_diff(job: Job) -> Mapping[str, object]:
    """The job's training settings that differ from the defaults (to tell the parity jobs apart)."""
    base = make_job(job.model, job.world_size).training
    names = ("cuda_graph_modules", "recompute_modules")
    return {n: getattr(job.training, n) for n in names if getattr(job.training, n) != getattr(base, n)}


@pytest.mark.parametrize("version", VERSIONS)
def test_the_pp2_split_crashes_on_rank_1_and_its_string_builds(cases, megatron, version) -> None:
    """Still in 0.19.2: `get_transformer_layer_offset` divides by the 0 middle stages (transformer_layer.py:158)."""
    decided = _of(megatron, version)["cases"]
    results = {str(x): d for (job, x), d in zip(cases, decided, strict=True) if job.model.name == "gqa12"}
    crash = parse_layout("pp=2,vpp=2,first_stage_layers=6,last_stage_layers=6", world_size=16)
    string = parse_layout("pp=2,vpp=2,pipeline_layout=Et*3|t*3|t*3|t*3L", world_size=16)
    assert results[str(crash)][0] is False and results[str(crash)][1].startswith("pp rank 1: ZeroDivisionError")
    assert results[str(string)] == (True, "")
    job = make_job(GQA12, 16, megatron_core=version)
    assert [v.rule for v in check(job, crash)] == ["first_last_vpp_needs_middle_stage"]


@pytest.mark.parametrize("index", range(len(STRICTER)), ids=[c[2] for c in STRICTER])
@pytest.mark.parametrize("version", VERSIONS)
def test_stricter_than_megatron_core(megatron, version, index) -> None:
    job, layout = _stricter_cases()[index]
    violations = check(job, layout, version=version)
    assert {v.rule for v in violations} == {STRICTER[index][3]} and all(v.stricter for v in violations)
    assert _of(megatron, version)["stricter"][index] == (True, "")


@pytest.mark.parametrize("version", VERSIONS)
def test_every_sampled_space_layout_builds(space_cases, megatron, version) -> None:
    decided = _of(megatron, version)["spaces"]
    failed = [f"{job.model.name} on {job.world_size}: {x}: {reason}"
              for (job, x), (ok, reason) in zip(space_cases[version], decided, strict=True) if not ok]
    assert not failed, "\n".join(failed)
    assert len(space_cases[version]) >= 50


@pytest.mark.parametrize("version", VERSIONS)
def test_flex_dispatcher(megatron, version) -> None:
    """`MoEFlexTokenDispatcher`'s assert (default backend deepep in 0.19) against `flex_dispatcher_needs_tp_ep`, in
    megatron-core's words."""
    theirs = _of(megatron, version)["flex"]
    assert len(theirs) == len(FLEX_PAIRS)
    for (ep, etp), result in zip(FLEX_PAIRS, theirs, strict=True):
        job = make_job("tiny-moe", ep * etp, moe_token_dispatcher="flex", megatron_core=version)
        ours = [v for v in check(job, Layout(ep=ep, etp=etp, dp=ep * etp)) if v.rule == "flex_dispatcher_needs_tp_ep"]
        assert bool(ours) == result.startswith("AssertionError"), (ep, etp, result)
        if ours:
            assert ours[0].message.startswith(result.removeprefix("AssertionError: ")), (ours[0].message, result)


def test_the_runner_shows_the_childs_error() -> None:
    error = r"(?s)exited with 1.*has no attribute 'no_such_function'"  # the stderr's tail
    with pytest.raises(megatron_runner.MegatronRunError, match=error):
        megatron_runner.run("no_such_function", timeout=120)


def test_the_runner_stops_a_child_past_its_timeout() -> None:
    pending = megatron_runner.start("megatron_version", timeout=0.5)  # importing megatron takes seconds
    with pytest.raises(megatron_runner.MegatronRunError, match="ran past its timeout"):
        pending.result()
    assert pending.process.returncode is not None and pending.process.returncode != 0

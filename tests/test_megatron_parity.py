"""Parity with megatron-core 0.16.1: for a sample of accepted and rejected layouts, the same decision.

megatron-core's decision for one layout runs its own code in one process acting as rank 0 of a world
of N (torch's fake process group), in the order a training run meets it:

1. `TransformerConfig(...)` (its `__post_init__` checks: SP needs TP, heads and query groups vs TP,
   EP needs experts, bias in MoE needs ETP 1);
2. `parallel_state.initialize_model_parallel(...)` (world vs TP*PP*CP and vs ETP*EP*PP, VPP needs PP > 1);
3. building rank 0's `GPTModel` with the local layer spec (layers vs PP and PP*VPP, FFN sizes vs TP and
   ETP, experts vs EP). The local spec cannot build SP norms or CP attention (TE-only features), so
   the model is built from a copy of the config with SP off and CP 1; SP and CP are checked by 4 and 5;
4. `utils.get_batch_on_this_cp_rank` on a [1, seq_length] batch (seq_length vs 2*CP);
5. `tensor_parallel.mappings._split_along_first_dim` of the seq_length / CP tokens over TP (SP);
6. the first statement of `MoELayer.forward` in training (MoE with TP > 1 needs SP);
7. `ConstantNumMicroBatchesCalculator` (GBS vs MBS * DP).

Difference, explained: the interleaved schedule's micro-batch condition (schedules.py,
forward_backward_pipelining_with_interleaving) sits behind a CUDA allocation, so it cannot run on
a CPU build; step 8 evaluates the same two conditions as that function (M >= microbatch group = PP,
and M % PP not in (0, PP)). `data_parallel_size_matches` has no megatron counterpart (megatron
derives DP itself), so sampled layouts always carry the derived DP. MLA models (DeepSeek) are not
sampled: the local layer spec cannot build MLA attention without TransformerEngine in 0.16.1
(`DotProductAttention` has no `k_channels`); their rules are the same heads-vs-TP rules as MHA.

Uneven pipeline splits (first/last stage layers, the embedding/loss split) are checked by step 1
(`transformer_config.py`, "Uneven PP") and step 3 (`get_num_layers_to_build`); the random sample
derives them as the space does (`space.pipeline_fields`), hand-picked layouts break each rule.
`pipeline_split_needs_pp` and a negative middle are stricter than megatron-core, which accepts
them (`test_stricter_than_megatron_core`, `STRICTER`).
"""

from __future__ import annotations

import dataclasses
import random
import types
import warnings

import pytest

from search_spaces.layout import Layout, parse_layout
from search_spaces.rules import RULE_NAMES, check
from search_spaces.space import SpaceOptions, dimension_ranges, feasible_space, pipeline_fields
from test_rules import GQA12, GQA12_FFN198, MOE6, MOE_BIAS, make_job

# 14 layers: PP 4 takes the embedding/loss split ((14 + 2) / 4), PP 3 is 5 + 5 + 4, PP 6 is 1 + 4 x 3 + 1
GQA14 = dataclasses.replace(GQA12, name="gqa14", num_layers=14)

pytestmark = pytest.mark.slow

SEARCHED = SpaceOptions(tp_within_node=False, expert_within_node=False, micro_batch_sizes=(1, 2, 4))
# (model, world, gpus per node, seq, gbs, hand-picked layouts besides the random sample)
JOBS = [
    (GQA12_FFN198, 12, 4, 36, 24, ("ep=2", "tp=12", "pp=1,vpp=2", "pp=3,vpp=2,mbs=2",
                                   "pp=3,vpp=5,first_stage_layers=2,last_stage_layers=5",  # 2 % 5
                                   "pp=3,vpp=5,first_stage_layers=5,last_stage_layers=2")),
    (MOE6, 8, 4, 64, 16, ("tp=2,ep=2,etp=1", "pp=2,vpp=2,ep=2,etp=1,mbs=4")),
    (MOE_BIAS, 8, 8, 64, 16, ("tp=2,sp=true,ep=2", "tp=2,sp=true,ep=2,etp=1")),
    ("tiny-moe", 16, 8, 48, 32, ("tp=2,cp=3,sp=true", "tp=4,cp=2,sp=true,ep=2,etp=1", "pp=4,vpp=2,mbs=2")),
    # heads 12 vs TP 8 and 16; 12 layers vs PP 8; SP: 68 / CP 2 = 34 tokens, 34 % TP 4 = 2
    (GQA12, 16, 8, 68, 32, ("tp=8", "tp=16", "pp=8", "tp=4,cp=2,sp=true", "tp=4,cp=2",
                            # uneven PP on 12 layers: exclusive; PP 1 with a mismatch; 2 left for 0 stages;
                            # 10 % 3; 3 per middle stage vs VPP 2; 14 % 4; 14 / 2 = 7 vs VPP 2; then accepted
                            "pp=2,first_stage_layers=6,embedding_loss_split=true", "pp=1,first_stage_layers=5",
                            "pp=2,first_stage_layers=5,last_stage_layers=5", "pp=4,first_stage_layers=2",
                            "pp=4,vpp=2,first_stage_layers=2,last_stage_layers=4", "pp=4,embedding_loss_split=true",
                            "pp=2,vpp=2,embedding_loss_split=true", "pp=2,first_stage_layers=5",
                            "pp=4,vpp=2,first_stage_layers=2,last_stage_layers=2", "pp=2,embedding_loss_split=true")),
    (GQA14, 12, 4, 36, 48, ("pp=4,embedding_loss_split=true", "pp=4,vpp=2,embedding_loss_split=true",
                            "pp=4,vpp=4,embedding_loss_split=true",  # 16 / 16: the first chunk builds 0 layers
                            "pp=3,first_stage_layers=5,last_stage_layers=4", "pp=6,first_stage_layers=1,last_stage_layers=1",
                            "pp=3,first_stage_layers=3", "pp=4")),
]
N_ACCEPTED, PER_RULE = 8, 2
# accepted by megatron-core 0.16.1, rejected here (model, world, layout, our rule): PP 1 has nothing to split
# (megatron builds all 12 layers, or, with first + last, only the last stage's 3); first + last > num_layers
STRICTER = [
    (GQA12, 16, "pp=1,first_stage_layers=12", "pipeline_split_needs_pp"),
    (GQA12, 16, "pp=1,embedding_loss_split=true", "pipeline_split_needs_pp"),
    (GQA12, 16, "pp=1,first_stage_layers=5,last_stage_layers=3", "pipeline_split_needs_pp"),
    (GQA12, 16, "pp=4,first_stage_layers=9,last_stage_layers=9", "middle_layers_divisible"),  # -6 % 2 == 0
]


@pytest.fixture(scope="module")
def mcore():
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.tensor_parallel.mappings import _split_along_first_dim
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.utils import get_batch_on_this_cp_rank

    return types.SimpleNamespace(**locals())


def _config_kwargs(mc, job, layout: Layout) -> dict:
    m = job.model
    kw = dict(
        num_layers=m.num_layers, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups, kv_channels=m.kv_channels,
        gated_linear_unit=m.gated_linear_unit, add_bias_linear=m.add_bias_linear,
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp, context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep, expert_tensor_parallel_size=layout.etp, sequence_parallel=layout.sp,
        recompute_granularity=None if layout.recompute == "none" else layout.recompute,
        recompute_method="uniform" if layout.recompute == "full" else None,
        recompute_num_layers=1 if layout.recompute == "full" else None,
        num_layers_in_first_pipeline_stage=layout.first_stage_layers,
        num_layers_in_last_pipeline_stage=layout.last_stage_layers,
        account_for_embedding_in_pipeline_split=layout.embedding_loss_split,
        account_for_loss_in_pipeline_split=layout.embedding_loss_split,
        pipeline_dtype=mc.torch.float32, use_cpu_initialization=True, perform_initialization=False,
        gradient_accumulation_fusion=False, bias_activation_fusion=False, masked_softmax_fusion=False,
        persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False,
    )
    if m.moe is not None:
        dense = m.moe.first_dense_layers
        kw.update(num_moe_experts=m.moe.num_experts, moe_ffn_hidden_size=m.moe.expert_ffn_hidden_size,
                  moe_router_topk=m.moe.topk, moe_layer_freq=[0] * dense + [1] * (m.num_layers - dense),
                  moe_shared_expert_intermediate_size=m.moe.shared_expert_ffn_hidden_size or None,
                  moe_router_pre_softmax=m.moe.topk == 1)
    return kw


def megatron_accepts(mc, job, layout: Layout) -> tuple[bool, str]:
    """megatron-core's own decision (see the module docstring); the reason when it refuses."""
    seq, gbs = job.training.seq_length, job.training.global_batch_size
    mc.dist.init_process_group("fake", store=mc.FakeStore(), rank=0, world_size=job.world_size)
    try:
        config = mc.TransformerConfig(**_config_kwargs(mc, job, layout))  # 1
        mc.parallel_state.initialize_model_parallel(  # 2
            tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
            virtual_pipeline_model_parallel_size=layout.vpp, context_parallel_size=layout.cp,
            expert_model_parallel_size=layout.ep, expert_tensor_parallel_size=layout.etp,
            create_gloo_process_groups=False)
        build = dataclasses.replace(config, sequence_parallel=False, context_parallel_size=1)  # 3
        vp_stage = 0 if layout.vpp else None
        mc.GPTModel(config=build, vocab_size=job.model.vocab_size, max_sequence_length=seq, pre_process=True,
                    post_process=layout.pp == 1, vp_stage=vp_stage,
                    transformer_layer_spec=mc.get_gpt_decoder_block_spec(build, use_transformer_engine=False,
                                                                         vp_stage=vp_stage))
        mc.get_batch_on_this_cp_rank({"tokens": mc.torch.zeros(1, seq)})  # 4
        if config.sequence_parallel:  # 5
            local = mc.torch.zeros(seq // layout.cp, 1)
            mc._split_along_first_dim(local, mc.parallel_state.get_tensor_model_parallel_group())
        if job.model.is_moe:  # 6
            fake_layer = types.SimpleNamespace(training=True, config=config,
                                               attn_tp_group=mc.parallel_state.get_tensor_model_parallel_group())
            try:
                mc.MoELayer.forward(fake_layer, mc.torch.zeros(1, 1, 1))
            except AttributeError:
                pass  # got past the check, into the layer body the fake lacks
        dp = mc.parallel_state.get_data_parallel_world_size()
        mc.ConstantNumMicroBatchesCalculator(gbs, layout.mbs, dp, False, 0)  # 7
        if layout.vpp:  # 8: schedules.py's conditions, with microbatch_group_size_per_vp_stage = PP
            m, group = gbs // (layout.mbs * dp), config.microbatch_group_size_per_vp_stage
            if group > m or group < layout.pp or 0 < m % group < layout.pp:
                raise ValueError(f"interleaved schedule: M={m}, PP={layout.pp}")
        return True, ""
    except (AssertionError, ValueError, RuntimeError, TypeError, ZeroDivisionError) as error:
        return False, f"{type(error).__name__}: {error}"
    finally:
        mc.parallel_state.destroy_model_parallel()
        mc.dist.destroy_process_group()


def _sample(job, hand: tuple[str, ...], rng: random.Random) -> list[Layout]:
    """Accepted layouts from the space, rejected ones from the naive product (each rule alone if possible)."""
    space = feasible_space(job, SEARCHED)
    layouts = list(space.layouts())
    chosen = rng.sample(layouts, min(N_ACCEPTED, len(layouts)))
    ranges = dimension_ranges(job, SEARCHED)
    by_rule: dict[str, list[Layout]] = {}
    for _ in range(4000):
        values = {name: rng.choice(options) for name, options in ranges.items()}
        model_size = values["tp"] * values["cp"] * values["pp"]
        values["dp"] = max(1, job.world_size // model_size)
        layout = Layout(**values, **pipeline_fields(job.model.num_layers, values["pp"], values["vpp"]))
        violations = check(job, layout)
        if len(violations) == 1 and len(by_rule.setdefault(violations[0].rule, [])) < PER_RULE:
            by_rule[violations[0].rule].append(layout)
    chosen += [x for group in by_rule.values() for x in group]
    chosen += [parse_layout(text, world_size=job.world_size) for text in hand]
    return chosen


def _cases():
    rng = random.Random(0)
    for model, world, gpn, seq, gbs, hand in JOBS:
        job = make_job(model, world, gpus_per_node=gpn, seq=seq, gbs=gbs)
        for layout in _sample(job, hand, rng):
            yield job, layout


CASES = list(_cases())


def test_the_sample_covers_every_rule() -> None:
    alone = {check(job, x)[0].rule for job, x in CASES if len(check(job, x)) == 1}
    accepted = sum(1 for job, x in CASES if not check(job, x))
    assert set(RULE_NAMES) - {"data_parallel_size_matches"} <= alone
    assert accepted >= N_ACCEPTED * len(JOBS)


def test_same_decision_as_megatron_core(mcore) -> None:
    mismatches = []
    for job, layout in CASES:
        ours = check(job, layout)
        theirs, reason = megatron_accepts(mcore, job, layout)
        if theirs != (not ours):
            mismatches.append(f"{job.model.name} on {job.world_size}: {layout}: ours={[v.rule for v in ours]} "
                              f"megatron={'accepts' if theirs else reason}")
    assert not mismatches, "\n".join(mismatches)


@pytest.mark.parametrize(("model", "world", "text", "rule"), STRICTER, ids=[c[2] for c in STRICTER])
def test_stricter_than_megatron_core(mcore, model, world, text, rule) -> None:
    job = make_job(model, world, gpus_per_node=8, seq=68, gbs=32)
    layout = parse_layout(text, world_size=world)
    assert {v.rule for v in check(job, layout)} == {rule}
    assert megatron_accepts(mcore, job, layout) == (True, "")

"""The CPU proxy keeps the layout's parallel structure and shrinks only what the sizes must divide."""

from __future__ import annotations

import pytest

from search_spaces.catalog import get_model
from search_spaces.layout import parse_layout
from search_spaces.training import TrainingSpec
from trainers.proxy import plan_proxy, reduce_data_parallel

TRAINING = TrainingSpec(seq_length=4096, global_batch_size=256)

LAYOUTS = [
    ("tiny-gpt", "tp=2,pp=2,sp=true"),
    ("tiny-gpt", "tp=4,pp=2,vpp=2,dp=1"),
    ("tiny-gpt", "tp=2,cp=2,sp=true,dp=2"),
    ("tiny-moe", "tp=2,ep=4,etp=1,sp=true,dp=2"),
    ("tiny-moe", "pp=2,ep=2,dp=2,dist_opt=true"),
    ("llama3-70b", "tp=8,pp=4,vpp=5,cp=2,dp=4"),
    ("mixtral-8x7b", "tp=2,pp=4,ep=8,etp=1,sp=true,dp=8"),
]


@pytest.mark.parametrize(("model_name", "text"), LAYOUTS)
def test_proxy_keeps_every_parallel_size_but_dp(model_name: str, text: str) -> None:
    layout = parse_layout(text)
    plan = plan_proxy(get_model(model_name), layout, TRAINING, max_workers=64)
    kept = ("tp", "pp", "vpp", "cp", "ep", "etp", "sp", "dist_opt", "recompute", "mbs")
    assert {k: getattr(plan.layout, k) for k in kept} == {k: getattr(layout, k) for k in kept}


@pytest.mark.parametrize(("model_name", "text"), LAYOUTS)
def test_proxy_model_divides_like_megatron_core_needs(model_name: str, text: str) -> None:
    plan = plan_proxy(get_model(model_name), parse_layout(text), TRAINING, max_workers=64)
    m, lay, seq = plan.model, plan.layout, plan.training.seq_length
    assert m.num_layers % (lay.pp * lay.vpp_size) == 0
    assert m.num_attention_heads % lay.tp == 0 and m.query_groups % lay.tp == 0
    assert m.ffn_hidden_size % lay.tp == 0 and m.vocab_size % (128 * lay.tp) == 0
    assert seq % (2 * lay.cp if lay.cp > 1 else 1) == 0 and (not lay.sp or seq % lay.tp == 0)
    if m.moe is not None:
        assert m.moe.num_experts % lay.ep == 0 and m.moe.topk <= m.moe.num_experts
        assert m.moe.expert_ffn_hidden_size % lay.expert_tp == 0
    assert plan.num_microbatches % lay.pp == 0
    assert plan.training.global_batch_size == plan.num_microbatches * lay.mbs * lay.dp


@pytest.mark.parametrize(
    ("text", "max_workers", "dp"),
    [
        ("tp=2,pp=2,dp=4", 8, 2),  # 2*2*2 = 8 workers
        ("tp=2,pp=2,dp=4", 16, 4),  # fits as is
        ("tp=1,ep=4,dp=8", 6, 4),  # 6 workers allow dp<=6; expert dp = dp/4 needs dp in {4}
        ("tp=2,pp=1,dp=3", 5, 2),  # 2*2 = 4 <= 5
    ],
)
def test_data_parallel_is_reduced_to_fit_and_keep_expert_dp_whole(text: str, max_workers: int, dp: int) -> None:
    assert reduce_data_parallel(parse_layout(text), max_workers).dp == dp


def test_reduction_is_recorded() -> None:
    plan = plan_proxy(get_model("tiny-gpt"), parse_layout("tp=2,pp=2,dp=4"), TRAINING, max_workers=8)
    assert plan.dp_reduction == "dp 4 -> 2 (max_workers=8)"


def test_model_parallel_part_larger_than_the_machine_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"tp\(8\) \* pp\(2\) \* cp\(1\) = 16 workers are needed"):
        reduce_data_parallel(parse_layout("tp=8,pp=2"), 8)


def test_gpu_plan_keeps_the_model_shape() -> None:
    model = get_model("tiny-gpt")
    plan = plan_proxy(model, parse_layout("tp=2"), TRAINING, max_workers=2, scale_model=False)
    assert plan.model == model and plan.training.seq_length == TRAINING.seq_length


@pytest.mark.parametrize(
    ("text", "layers", "split"),
    [
        ("pp=2,vpp=2", 4, (2, 2)),  # even: 2 * 2 * 1
        ("pp=3,embedding_loss_split=true", 4, (1, 2, 1)),  # (4 + 2) / 3 = 2 slots per stage; first and last lose one
        ("pp=3,first_stage_layers=3,last_stage_layers=2", 5, (2, 2, 1)),  # middle 2, first 2, last 1
        ("pp=4,vpp=2,last_stage_layers=2", 14, (4, 4, 4, 2)),  # middle 2 * 1 * 2 = 4, last 1 * 2
    ],
)
def test_proxy_keeps_the_kind_of_pipeline_split(text: str, layers: int, split: tuple[int, ...]) -> None:
    plan = plan_proxy(get_model("tiny-gpt"), parse_layout(text), TRAINING, max_workers=64)
    assert plan.model.num_layers == layers
    assert plan.layout.stage_layer_counts(layers) == split
    assert plan.layout.embedding_loss_split == parse_layout(text).embedding_loss_split


def test_moe_with_a_leading_dense_layer_keeps_a_moe_layer() -> None:
    plan = plan_proxy(get_model("tiny-mla"), parse_layout("ep=2,dp=2"), TRAINING, max_workers=4)
    assert plan.model.moe is not None
    assert plan.model.num_layers == 2 and plan.model.moe.first_dense_layers == 1  # 1 dense + 1 MoE

"""Throughput model: Megatron FLOPs, communication primitives, and the sanity properties of the step time."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from autotune.cost.comm import group_collective_s, ring_collective_s
from autotune.cost.efficiency import DEFAULT_CALIBRATION, gemm_efficiency
from autotune.cost.flops import forward_flops_per_token, model_flops_per_step
from autotune.cost.score import estimate_time
from autotune.cost.throughput import TIME_KEYS, pipeline_bubble_s
from search_spaces.catalog import get_model
from search_spaces.cluster import ClusterSpec, LinkSpec
from search_spaces.gpus import build_cluster, get_gpu
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.model import ModelSpec, MoESpec
from search_spaces.training import TrainingSpec


def _job(model: str | ModelSpec, nodes: int = 1, gpus_per_node: int = 8, seq: int = 4096, gbs: int = 64,
         gpu: str = "h100") -> Job:
    spec = get_model(model) if isinstance(model, str) else model
    return Job(model=spec, cluster=build_cluster(nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu),
               training=TrainingSpec(seq_length=seq, global_batch_size=gbs))


# --- model FLOPs ---------------------------------------------------------------------------------
def _megatron_flops(L, h, a, g, d, f, V, s, B, gate, topk=1, shared=0, moe_ffn=None):
    """Megatron-LM num_floating_point_operations, written out (expansion factor 12, causal 1/2)."""
    mlp_f = f if moe_ffn is None else moe_ffn * topk + shared
    attn = (1 + g / a + s / h * 0.5) * (a * d / h)
    return 12 * B * s * L * h * h * (attn + mlp_f / h * gate) + 6 * B * s * h * V


@pytest.mark.parametrize(
    "model",
    [
        # GQA + SwiGLU, V = 128256 is a multiple of 128
        ModelSpec(name="gqa", num_layers=4, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                  num_query_groups=4, vocab_size=128256),
        # MHA + GELU, kv_channels != h / a
        ModelSpec(name="mha", num_layers=2, hidden_size=768, ffn_hidden_size=3072, num_attention_heads=8,
                  kv_channels=128, vocab_size=1024, gated_linear_unit=False),
    ],
)
def test_model_flops_match_megatron_formula(model: ModelSpec) -> None:
    training = TrainingSpec(seq_length=2048, global_batch_size=8)
    gate = 1.5 if model.gated_linear_unit else 1.0
    expected = _megatron_flops(model.num_layers, model.hidden_size, model.num_attention_heads, model.query_groups,
                               model.head_dim, model.ffn_hidden_size, model.vocab_size, 2048, 8, gate)
    assert model_flops_per_step(model, training) == pytest.approx(expected, rel=1e-12)


def test_moe_flops_count_topk_and_shared_experts() -> None:
    # every layer MoE: MLP FLOPs use topk * moe_ffn + shared, not the dense ffn
    model = ModelSpec(name="moe", num_layers=4, hidden_size=512, ffn_hidden_size=9999, num_attention_heads=8,
                      num_query_groups=2, vocab_size=1024,
                      moe=MoESpec(num_experts=16, topk=4, expert_ffn_hidden_size=256,
                                  shared_expert_ffn_hidden_size=512))
    training = TrainingSpec(seq_length=1024, global_batch_size=2)
    expected = _megatron_flops(4, 512, 8, 2, 64, 0, 1024, 1024, 2, 1.5, topk=4, shared=512, moe_ffn=256)
    assert model_flops_per_step(model, training) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("mtp", "tflops", "tokens"), [
    # Megatron-Bridge performance summary: DeepSeekV3 on 256 B200, MXFP8, 26.02 (with MTP): 699 TFLOP/s/GPU at
    # 2,689 tokens/s/GPU; 25.11 'DeepSeekV3 (w/o MTP)' on 256 GB200, BF16: 782 at 3,139. Their ratio is the model
    # FLOPs per token of Megatron-LM's formula (3 digits published, so 0.5%)
    (1, 699e12, 2689),
    (0, 782e12, 3139),
])
def test_mtp_flops_match_the_published_tflops_per_token(mtp: int, tflops: float, tokens: float) -> None:
    model = replace(get_model("deepseek-v3"), mtp_num_layers=mtp)
    assert 3 * forward_flops_per_token(model, 4096) == pytest.approx(tflops / tokens, rel=0.005)


def test_an_mtp_layer_adds_a_layer_its_projection_and_one_more_logits_gemm() -> None:
    # Megatron-LM core_v0.16.1 training.py:354-360, 553-572: attention + MLP of the last layer's kind, then
    # 2 * (3h + 2h^2) for the norms and eh_proj, and 2 * h * V more logits, per token forward
    base = get_model("llama3-8b")
    with_mtp = replace(base, mtp_num_layers=2)
    h, v = base.hidden_size, 128256
    one_layer = (forward_flops_per_token(base, 4096) - 2.0 * h * v) / base.num_layers
    expected = 2 * (one_layer + 2 * (3 * h + 2 * h * h) + 2.0 * h * v)
    assert forward_flops_per_token(with_mtp, 4096) - forward_flops_per_token(base, 4096) == pytest.approx(expected)


def test_causal_attention_is_half_the_square_term() -> None:
    # doubling s adds 2*s*a*d per token per layer forward (causal), i.e. the core term is linear in s
    model = get_model("tiny-gpt")
    d1 = forward_flops_per_token(model, 2048) - forward_flops_per_token(model, 1024)
    # 8 layers * 2 * (2048 - 1024) * a * d = 8 * 2 * 1024 * 16 * 8
    assert d1 == pytest.approx(8 * 2 * 1024 * 16 * 8)


# --- primitives ----------------------------------------------------------------------------------
def test_ring_collective_arithmetic() -> None:
    link = LinkSpec(name="x", bandwidth_bytes_per_s=100e9, latency_s=1e-5, source="test")
    cal = replace(DEFAULT_CALIBRATION, link_fraction=1.0)
    # 8 ranks, 1 GB: 7/8 * 1e9 / 100e9 + 7 * 1e-5 = 8.75 ms + 0.07 ms
    assert ring_collective_s(1e9, 8, link, cal) == pytest.approx(8.75e-3 + 7e-5)
    assert ring_collective_s(1e9, 1, link, cal) == 0.0


def test_group_collective_shares_the_node_nics() -> None:
    # 16 ranks on 2 nodes of 8, 1 GB, links at full rate, no latency:
    # stride 1 (8 per node): 7/8 * 1e9 / 400e9 on NVLink + 1/2 * 1e9/8 / 50e9 on IB = 2.1875 ms + 1.25 ms
    # stride 8 on 16 nodes (one member per node): a plain ring on IB: 15/16 * 1e9 / 50e9 = 18.75 ms
    nvlink = LinkSpec(name="nv", bandwidth_bytes_per_s=400e9, latency_s=0.0, source="test")
    ib = LinkSpec(name="ib", bandwidth_bytes_per_s=50e9, latency_s=0.0, source="test")
    cal = replace(DEFAULT_CALIBRATION, link_fraction=1.0)
    two = ClusterSpec(nodes=2, gpu=get_gpu("h100"), intra_node=nvlink, inter_node=ib)
    sixteen = ClusterSpec(nodes=16, gpu=get_gpu("h100"), intra_node=nvlink, inter_node=ib)
    assert group_collective_s(1e9, 16, 1, two, cal) == pytest.approx(7 / 8 * 1e9 / 400e9 + 0.5 * 1e9 / 8 / 50e9)
    assert group_collective_s(1e9, 16, 8, sixteen, cal) == pytest.approx(15 / 16 * 1e9 / 50e9)
    assert group_collective_s(1e9, 8, 1, two, cal) == pytest.approx(7 / 8 * 1e9 / 400e9)  # inside one node


@pytest.mark.parametrize(("pp", "vpp", "expected"), [(1, None, 0.0), (4, None, 3.0), (4, 3, 1.0), (8, 7, 1.0)])
def test_bubble_is_pp_minus_one_over_vpp(pp, vpp, expected) -> None:
    # equal stages of 1 s: (sum - max) / v = (p - 1) / v
    assert pipeline_bubble_s(1.0 * pp, 1.0, Layout(pp=pp, vpp=vpp).vpp_size) == pytest.approx(expected)


@pytest.mark.parametrize(("stages", "vpp", "expected"), [
    ((3.0, 4.0, 4.0, 2.0), None, 9.0),  # 13 - 4: every stage but the heaviest fills or drains once
    ((3.0, 4.0, 4.0, 2.0), 2, 4.5),  # / v
    ((1.0, 1.0, 5.0), None, 2.0),
])
def test_uneven_bubble_is_the_other_stages(stages, vpp, expected) -> None:
    assert pipeline_bubble_s(sum(stages), max(stages), Layout(pp=len(stages), vpp=vpp).vpp_size) \
        == pytest.approx(expected)


# 14 layers, a tiny vocabulary (the logits cost next to nothing): splits of PP 4
GQA14 = ModelSpec(name="gqa14", num_layers=14, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
                  num_query_groups=4, vocab_size=1024)


def test_the_heaviest_stage_sets_the_pace() -> None:
    # embedding/loss split: stages 3, 4, 4, 3 (the heaviest 4); first 5, last 3: stages 5, 3, 3, 3 (the heaviest 5)
    job = _job(GQA14, nodes=1, gbs=64)
    even_ish = estimate_time(job, Layout(pp=4, dp=2, embedding_loss_split=True))
    lopsided = estimate_time(job, Layout(pp=4, dp=2, first_stage_layers=5, last_stage_layers=3))
    # (the first stage also runs the embedding lookup, a memory-bound gather worth ~0.1% of a layer here)
    assert lopsided.breakdown["compute"] / even_ish.breakdown["compute"] == pytest.approx(5 / 4, rel=2e-3)
    assert lopsided.step_time_s > even_ish.step_time_s
    # bubble: other stages' layers, (14 - 4) vs (14 - 5) layer-times
    assert lopsided.breakdown["pp_bubble"] / even_ish.breakdown["pp_bubble"] == pytest.approx(9 / 10, rel=3e-3)


def test_deepseek_v3_pp16_split_runs_four_layers_per_stage() -> None:
    # 61 = 3 + 14 x 4 + 2: the heaviest stage holds 4 layers, as many as ceil(61 / 16)
    job = _job("deepseek-v3", nodes=32, gbs=128)
    layout = Layout(tp=2, pp=16, ep=64, etp=1, dp=8, sp=True, first_stage_layers=3, last_stage_layers=2)
    est = estimate_time(job, layout)
    assert layout.stage_layer_counts(61) == (3,) + (4,) * 14 + (2,)
    assert 0 < est.mfu <= 1 and est.breakdown["pp_bubble"] > 0


def test_thinner_gemms_are_less_efficient() -> None:
    # N = K = h / t: t = 8 gives 1024-wide matrices, t = 2 gives 4096-wide ones
    h, m = 8192, 8192
    assert gemm_efficiency(m, h / 8, h / 8, 128) < gemm_efficiency(m, h / 2, h / 2, 128) < 1.0


# --- the step ------------------------------------------------------------------------------------
LAYOUTS = [
    ("llama3-8b", 1, Layout(tp=1, dp=8)),
    ("llama3-8b", 1, Layout(tp=2, dp=4, sp=True, dist_opt=True)),
    ("llama3-70b", 4, Layout(tp=8, pp=4, vpp=5, dp=1, sp=True, dist_opt=True)),
    ("llama3-70b", 4, Layout(tp=4, pp=2, cp=2, dp=2, sp=True, recompute="full")),
    ("mixtral", 4, Layout(tp=2, pp=2, ep=8, dp=8, sp=True, dist_opt=True)),
    ("deepseek-v3", 32, Layout(tp=2, pp=16, ep=64, etp=1, dp=8, sp=True, dist_opt=True, recompute="selective",
                               first_stage_layers=3, last_stage_layers=2)),
    ("qwen3-235b", 32, Layout(tp=4, pp=8, vpp=4, ep=8, etp=1, dp=8, sp=True, dist_opt=True,
                              embedding_loss_split=True)),
]


@pytest.mark.parametrize(("model", "nodes", "layout"), LAYOUTS)
def test_mfu_never_above_one_and_breakdown_sums(model, nodes, layout) -> None:
    est = estimate_time(_job(model, nodes=nodes, gbs=128), layout)
    assert 0 < est.mfu <= 1
    assert set(est.breakdown) == set(TIME_KEYS)
    assert sum(est.breakdown.values()) == pytest.approx(est.step_time_s)
    assert all(v >= 0 for v in est.breakdown.values())


@pytest.mark.parametrize("model", ["llama3-8b", "mixtral"])
def test_full_recompute_raises_step_time(model) -> None:
    job = _job(model, nodes=2)
    base = Layout(tp=2, pp=2, ep=4 if model == "mixtral" else 1, dp=4, sp=True)
    times = [estimate_time(job, replace(base, recompute=r)).step_time_s for r in ("none", "selective", "full")]
    assert times[0] < times[1] < times[2]


def test_tp_across_nodes_is_slower_than_inside() -> None:
    # TP = 8: one node of 8 GPUs vs two nodes of 4 (the TP group crosses InfiniBand)
    layout = Layout(tp=8, dp=2, sp=True)
    inside = estimate_time(_job("llama3-70b", nodes=2, gpus_per_node=8), layout)
    across = estimate_time(_job("llama3-70b", nodes=4, gpus_per_node=4), layout)
    assert across.step_time_s > inside.step_time_s
    assert across.breakdown["tp_comm"] > inside.breakdown["tp_comm"]


def test_more_tp_lowers_compute_efficiency() -> None:
    # same FLOPs per GPU: TP=2 x DP=4 runs 1/4 of the batch on 1/2 of each layer, TP=8 x DP=1 the whole
    # batch on 1/8 of each layer (1/8 either way); the thinner TP=8 GEMMs take longer
    job = _job("llama3-8b", nodes=1)
    t2 = estimate_time(job, Layout(tp=2, dp=4, sp=True)).breakdown["compute"]
    t8 = estimate_time(job, Layout(tp=8, dp=1, sp=True)).breakdown["compute"]
    assert t8 > t2


def test_vpp_shrinks_the_bubble() -> None:
    job = _job("llama3-70b", nodes=4, gbs=64)
    plain = estimate_time(job, Layout(tp=8, pp=4, dp=1, sp=True))
    inter = estimate_time(job, Layout(tp=8, pp=4, vpp=5, dp=1, sp=True))
    assert inter.breakdown["pp_bubble"] < plain.breakdown["pp_bubble"]


def test_analytic_path_imports_nothing_heavy() -> None:
    code = ("import sys, autotune.cost.analytic, autotune.cost.throughput, autotune.ui.commands.estimate; "
            "heavy = [m for m in ('torch', 'ray', 'megatron', 'optuna', 'pandas') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_context_parallel_on_a_short_sequence_costs_time() -> None:
    # same DP x CP = 8 group and tokens per GPU; CP=4 splits 4096 tokens into 1024-token ring blocks
    job = _job("llama3-8b", nodes=1, seq=4096)
    plain = estimate_time(job, Layout(tp=1, cp=1, dp=8, mbs=1))
    ring = estimate_time(job, Layout(tp=1, cp=4, dp=2, mbs=4))
    assert ring.step_time_s > plain.step_time_s


def test_fp8_gemms_are_faster_than_bf16() -> None:
    bf16 = _job("llama3-70b", nodes=2)
    fp8 = Job(model=bf16.model, cluster=bf16.cluster, training=replace(bf16.training, precision="fp8"))
    layout = Layout(tp=8, pp=2, dp=1, sp=True, dist_opt=True)
    assert estimate_time(fp8, layout).breakdown["compute"] < estimate_time(bf16, layout).breakdown["compute"]


def test_calibration_fractions_are_fractions() -> None:
    cal = DEFAULT_CALIBRATION
    for _, f in cal.per_arch:
        for value in (f.gemm_bf16, f.attention, *(v for _, v in f.gemm_fp8)):
            assert 0 < value <= 1
        assert 0 < f.host_op_s < 1e-3
    for value in (cal.hbm_fraction, cal.link_fraction, cal.grouped_gemm_fraction, cal.tp_overlap_exposed,
                  cal.ep_overlap_exposed, cal.cp_overlap_fraction, cal.pp_p2p_exposed):
        assert 0 <= value <= 1

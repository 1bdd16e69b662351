"""The memory model: exact byte counts per parameter, Korthikanti's activation formulas, pipeline in-flight
micro-batches, parameter placement over stages, and the sanity properties (more TP/PP, the distributed
optimizer and recompute never raise memory)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.cost.memory import (
    DEFAULT_ASSUMPTIONS,
    LOCAL_SPEC_ASSUMPTIONS,
    MemoryAssumptions,
    estimate_memory,
    estimate_memory_per_stage,
    microbatch_activation_terms,
)
from autotune.cost.placement import chunk_layer_counts, padded_vocab_size, stage_params
from autotune.cost.activations import (
    ActivationAssumptions,
    inflight_microbatches_per_chunk,
    layer_activation_bytes,
)
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.training import TrainingSpec
from search_spaces.model import ModelSpec

# Korthikanti's GPT: MHA, ffn = 4h, GeLU, LayerNorm, learned positions, dropout masks kept, no flash attention.
GPT = ModelSpec(name="gpt-k", num_layers=8, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                vocab_size=51200, gated_linear_unit=False, normalization="LayerNorm", add_bias_linear=True,
                max_position_embeddings=2048)
KORTHIKANTI = ActivationAssumptions(flash_attention=False, dropout=True)


def _job(model: ModelSpec | str, *, seq: int = 2048, gbs: int = 64, precision: str = "bf16", nodes: int = 8) -> Job:
    model = get_model(model) if isinstance(model, str) else model
    return Job(model=model, cluster=build_cluster(nodes=nodes, gpu="h100"),
               training=TrainingSpec(seq_length=seq, global_batch_size=gbs, precision=precision))


def _state_bytes(job: Job, layout: Layout) -> tuple[float, int]:
    est = estimate_memory(job, layout)
    return est.weights_bytes + est.gradients_bytes + est.optimizer_bytes, est.params_per_gpu


# --- bytes per parameter (Megatron-LM theoretical_memory_usage.py) -----------------------------------------
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 2), (8, 4)])
def test_18_bytes_per_param_without_distributed_optimizer(tp, pp):
    # 2 (bf16 weight) + 4 (fp32 grad) + 12 (fp32 master, Adam m, v) = 18
    state, params = _state_bytes(_job("llama3-8b"), Layout(tp=tp, pp=pp, dp=4))
    assert state == 18 * params


@pytest.mark.parametrize("dp", [1, 2, 8, 64])
def test_distributed_optimizer_costs_6_plus_12_over_dp(dp):
    state, params = _state_bytes(_job("llama3-8b"), Layout(tp=2, dp=dp, dist_opt=True))
    assert state == pytest.approx((6 + 12 / dp) * params)


def test_distributed_optimizer_shards_over_dp_times_cp():
    # dense params: optimizer over intra_dp_cp_group: 12 / (DP * CP) = 12 / (4 * 2) = 1.5 B/param
    est = estimate_memory(_job("llama3-8b", seq=8192), Layout(tp=2, cp=2, dp=4, dist_opt=True))
    assert est.optimizer_bytes == pytest.approx(1.5 * est.params_per_gpu)


def test_expert_optimizer_shards_over_expert_dp():
    # tiny-moe, TP=2 DP=4 EP=4 ETP=1: expert_dp = 2*1*4 / (4*1) = 2, dense shard DP*CP = 4
    job = _job("tiny-moe")
    layout = Layout(tp=2, dp=4, ep=4, etp=1, sp=True, dist_opt=True)
    sp = stage_params(job.model, layout)[0]
    est = estimate_memory(job, layout)
    assert est.optimizer_bytes == pytest.approx(12 / 4 * sp.dense_params_per_gpu + 12 / 2 * sp.expert_params_per_gpu)


def test_fp8_adds_weight_caches_for_gemm_weights_only():
    layout = Layout(tp=2, dp=4)
    bf16 = estimate_memory(_job("llama3-8b"), layout)
    fp8 = estimate_memory(_job("llama3-8b", precision="fp8"), layout)
    gemm = stage_params(get_model("llama3-8b"), layout)[bf16.stage].gemm_params_per_gpu
    assert fp8.weights_bytes - bf16.weights_bytes == 2 * gemm  # FP8 copy + transpose, 1 B each
    assert 0 < gemm < bf16.params_per_gpu  # embeddings, norms are not GEMM weights


# --- parameter placement ----------------------------------------------------------------------------------
@pytest.mark.parametrize("vocab,tp,padded", [(50257, 1, 50304), (50257, 8, 51200), (1024, 8, 1024), (128256, 8, 129024)])
def test_vocab_padded_to_multiple_of_128_tp(vocab, tp, padded):
    assert padded_vocab_size(vocab, tp) == padded


@pytest.mark.parametrize("layers,pp,vpp,split,counts", [
    (8, 2, 1, (None, None, False), (4, 4)),
    (8, 2, 2, (None, None, False), (2, 2, 2, 2)),
    (94, 8, 4, (None, None, True), (2,) + (3,) * 30 + (2,)),  # (94 + 2) / 32 = 3, embedding and loss count as a layer
    (61, 16, 1, (3, 2, False), (3,) + (4,) * 14 + (2,)),  # 3 + 14 * 4 + 2 = 61 (num_layers_in_first/last_pipeline_stage)
    (126, 8, 2, (16, 14, False), (8,) * 7 + (7,) + (8,) * 7 + (7,)),  # each stage's layers split over its 2 chunks
])
def test_chunk_layer_counts(layers, pp, vpp, split, counts):
    assert chunk_layer_counts(layers, pp, vpp, split) == counts
    assert sum(counts) == layers


@pytest.mark.parametrize("name,pp", [("tiny-gpt", 1), ("tiny-gpt", 4), ("tiny-moe", 2), ("tiny-mla", 2),
                                     ("gpt3-175b", 8), ("deepseek-v3", 16)])
def test_stage_totals_add_up_to_the_model(name, pp):
    model = get_model(name)
    stages = stage_params(model, Layout(pp=pp))
    pad_rows = padded_vocab_size(model.vocab_size, 1) - model.vocab_size
    tied_copy = model.vocab_size + pad_rows if (model.tied_embeddings and pp > 1) else 0
    outputs = 1 if model.tied_embeddings else 2  # padded embedding and (untied) output layer
    mtp_copy = model.vocab_size + pad_rows if (model.mtp_num_layers and pp > 1) else 0  # the MTP stage's embedding
    expected = model.dense_params + outputs * pad_rows * model.hidden_size + (tied_copy + mtp_copy) * model.hidden_size
    assert sum(s.dense_params for s in stages) == expected
    assert sum(s.expert_params for s in stages) == model.routed_expert_params
    assert [s.dense_params_per_gpu for s in stages] == [s.dense_params for s in stages]  # TP = EP = 1


def test_deepseek_first_dense_layers_land_in_stage_0():
    stages = stage_params(get_model("deepseek-v3"), Layout(pp=16))
    assert (stages[0].layers, stages[0].moe_layers) == (4, 1)  # 3 dense + 1 MoE
    assert all(s.moe_layers == s.layers for s in stages[1:])


def test_embedding_first_stage_output_last_stage_with_vpp():
    stages = stage_params(get_model("tiny-gpt"), Layout(pp=2, vpp=2))
    assert [(s.has_embedding, s.has_output) for s in stages] == [(True, False), (False, True)]


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-moe", "llama3-70b", "mixtral-8x7b", "deepseek-v3"])
def test_more_tp_never_raises_weight_memory(name):
    model = get_model(name)
    per_gpu = [max(s.params_per_gpu for s in stage_params(model, Layout(tp=tp))) for tp in (1, 2, 4, 8)]
    assert per_gpu == sorted(per_gpu, reverse=True)


@pytest.mark.parametrize("name,pps", [("tiny-gpt", (1, 2, 4, 8)), ("llama3-70b", (1, 2, 4, 8, 16)),
                                      ("deepseek-v3", (1, 2, 4, 8, 16))])
def test_more_pp_never_raises_weight_memory(name, pps):
    model = get_model(name)
    per_gpu = [max(s.params_per_gpu for s in stage_params(model, Layout(tp=2, pp=pp))) for pp in pps]
    assert per_gpu == sorted(per_gpu, reverse=True)


# --- activations: Korthikanti et al. 2022, Table 2 ---------------------------------------------------------
def _layer(model, layout, seq=2048, assumptions=KORTHIKANTI, moe=False):
    return sum(layer_activation_bytes(model, TrainingSpec(seq_length=seq), layout, assumptions, moe=moe).values())


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_korthikanti_tp_with_sequence_parallel(t):
    s, b, h, a = 2048, 2, 1024, 16
    expected = s * b * h / t * (34 + 5 * a * s / h)
    assert _layer(GPT, Layout(tp=t, sp=t > 1, mbs=b)) == pytest.approx(expected)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_korthikanti_tp_without_sequence_parallel(t):
    s, b, h, a = 2048, 1, 1024, 16
    expected = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert _layer(GPT, Layout(tp=t)) == pytest.approx(expected)


def test_korthikanti_selective_recompute_drops_the_attention_scores():
    s, h, t = 2048, 1024, 4
    assert _layer(GPT, Layout(tp=t, sp=True, recompute="selective")) == pytest.approx(s * h / t * 34)


def test_korthikanti_full_recompute_keeps_the_layer_input():
    s, h, t = 2048, 1024, 4
    assert _layer(GPT, Layout(tp=t, sp=True, recompute="full")) == pytest.approx(2 * s * h / t)


def test_gated_mlp_keeps_both_fc1_halves_and_the_activation():
    # SwiGLU, RMSNorm, no dropout, flash: the MLP part is 2sbh (norm) + 2sbh (fc1 in) + (4 + 2) sb*ffn / t
    model = get_model("llama3-8b")
    terms = layer_activation_bytes(model, TrainingSpec(seq_length=4096), Layout(tp=2, sp=True),
                                   DEFAULT_ASSUMPTIONS, moe=False)
    s, f, t = 4096, 14336, 2
    assert terms["fc1_output"] + terms["activation_output"] == 6 * s * f / t


def test_gqa_keys_and_values_are_g_over_a_of_the_queries():
    # llama3-8b: a = 32, g = 8, d = 128. The mixed QKV output (a + 2g)d stays alive through the V view; RoPE
    # writes new Q and K, (a + g)d
    model = get_model("llama3-8b")
    terms = layer_activation_bytes(model, TrainingSpec(seq_length=4096), Layout(), DEFAULT_ASSUMPTIONS, moe=False)
    assert terms["qkv"] == 2 * 4096 * ((32 + 2 * 8) + (32 + 8)) * 128


def test_unfused_attention_repeats_keys_and_values_over_the_groups():
    # LOCAL_SPEC_ASSUMPTIONS (no flash): rotated Q (ad) + K and V repeated to a heads (2ad) = 3ad per token
    model = get_model("llama3-8b")
    terms = layer_activation_bytes(model, TrainingSpec(seq_length=4096), Layout(), LOCAL_SPEC_ASSUMPTIONS, moe=False)
    assert terms["qkv"] == 2 * 4096 * 3 * 32 * 128


@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_divides_activations(cp):
    model = get_model("llama3-8b")
    one = _layer(model, Layout(tp=2, sp=True), seq=8192, assumptions=DEFAULT_ASSUMPTIONS)
    assert _layer(model, Layout(tp=2, sp=True, cp=cp), seq=8192, assumptions=DEFAULT_ASSUMPTIONS) == \
        pytest.approx(one / cp)


def test_moe_expert_activations_scale_with_topk():
    # expert tensors hold T * topk token copies: doubling topk doubles them
    base = get_model("tiny-moe")
    top4 = replace(base, moe=replace(base.moe, topk=4))
    x = (TrainingSpec(seq_length=256), Layout(tp=2, sp=True, ep=2, etp=1), DEFAULT_ASSUMPTIONS)
    e2 = layer_activation_bytes(base, *x, moe=True)["experts"]
    e4 = layer_activation_bytes(top4, *x, moe=True)["experts"]
    assert e4 == 2 * e2
    h, f, tokens = 128, 256, 256 / 2 * 2  # SP shard of 256 tokens, top-2
    assert e2 == 2 * tokens * (h + 2 * f + f)  # expert input, gated fc1 output, fc2 input


# --- pipeline in-flight micro-batches ----------------------------------------------------------------------
@pytest.mark.parametrize("pp,m,expected", [(4, 16, 4), (8, 4, 4), (1, 8, 1)])
def test_1f1b_first_stage_keeps_min_pp_microbatches(pp, m, expected):
    assert inflight_microbatches_per_chunk(pp, 1, m, 0) == (expected,)


def test_1f1b_last_stage_keeps_one_microbatch():
    assert inflight_microbatches_per_chunk(8, 1, 64, 7) == (1,)


@pytest.mark.parametrize("pp,vpp", [(4, 2), (8, 4), (16, 3)])
def test_interleaving_factor_on_first_stage(pp, vpp):
    # in stage-micro-batches: sum(chunk counts) / VPP = PP * (1 + (PP - 1) / (PP * VPP))
    counts = inflight_microbatches_per_chunk(pp, vpp, 64, 0)
    assert sum(counts) / vpp == pytest.approx(pp * (1 + (pp - 1) / (pp * vpp)))


# --- the estimate and its sanity properties -----------------------------------------------------------------
LAYOUTS = [
    Layout(tp=2, pp=2, dp=16, sp=True),
    Layout(tp=4, pp=4, vpp=2, dp=4, sp=True, mbs=2),
    Layout(tp=8, pp=1, cp=2, dp=4, sp=True),
    Layout(tp=1, pp=8, dp=8),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("name", ["llama3-70b", "mixtral-8x7b"])
def test_distributed_optimizer_never_raises_memory(name, layout):
    job = _job(name, seq=4096, gbs=256)
    if job.model.moe is not None:
        layout = replace(layout, ep=2, etp=1)
    assert estimate_memory(job, replace(layout, dist_opt=True)).total_bytes <= estimate_memory(job, layout).total_bytes


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("name", ["llama3-70b", "deepseek-v3"])
def test_full_recompute_lowers_activations(name, layout):
    job = _job(name, seq=4096, gbs=256)
    by = {r: estimate_memory(job, replace(layout, recompute=r)).activations_bytes for r in ("none", "selective", "full")}
    assert by["full"] < by["selective"] <= by["none"]


def test_breakdown_sums_to_total_and_names_the_dominant_term():
    est = estimate_memory(_job("llama3-70b", seq=4096, gbs=256), Layout(tp=8, pp=4, dp=2, sp=True))
    parts = est.as_dict()
    assert set(parts) == {"weights", "gradients", "optimizer", "activations", "overhead"}
    assert sum(parts.values()) == pytest.approx(est.total_bytes)
    assert est.dominant == max(parts, key=parts.get)
    assert sum(v for _, v in est.activation_terms) == pytest.approx(est.activations_bytes)


def test_first_stage_is_the_peak_for_an_even_dense_pipeline():
    # stage 0 holds PP micro-batches and the embedding; the last stage holds one micro-batch and the logits
    est = estimate_memory(_job("llama3-70b", seq=4096, gbs=256), Layout(tp=8, pp=4, dp=2, sp=True))
    assert est.stage == 0


def test_overhead_is_fixed_plus_a_fraction():
    custom = MemoryAssumptions(cuda_context_bytes=0, nccl_buffer_bytes=0, fragmentation_fraction=0.1)
    est = estimate_memory(_job("tiny-gpt"), Layout(), custom)
    counted = est.total_bytes - est.overhead_bytes
    assert est.overhead_bytes == pytest.approx(0.1 * counted)


# --- published layouts ran, so they must fit (the full table: bench/bench_memory_published.py) ----------------
GPT_1T = ModelSpec(name="gpt-1t", num_layers=128, hidden_size=25600, ffn_hidden_size=102400, num_attention_heads=160,
                   kv_channels=160, vocab_size=51200, gated_linear_unit=False, tied_embeddings=True,
                   add_bias_linear=True, normalization="LayerNorm", max_position_embeddings=2048)
GPT_462B = ModelSpec(name="gpt-462b", num_layers=112, hidden_size=18432, ffn_hidden_size=73728,
                     num_attention_heads=144, kv_channels=128, vocab_size=131072, gated_linear_unit=False,
                     tied_embeddings=True, add_bias_linear=True, normalization="LayerNorm",
                     max_position_embeddings=4096)
PRE_FLASH = MemoryAssumptions(flash_attention=False, dropout=True)  # 2021-2022 runs
MODELZOO = MemoryAssumptions(recompute_modules=("layernorm", "moe_act"))  # "selective: norm, act"
PUBLISHED = [  # calibration-runs.csv rows: (row, model, gpu, seq, gbs, layout, assumptions)
    (28, GPT_1T, "a100-80gb", 2048, 512, Layout(tp=8, pp=64, mbs=1, sp=True, recompute="selective"), PRE_FLASH),
    (8, GPT_462B, "h100", 4096, 3072, Layout(tp=8, pp=16, dp=48, sp=True, dist_opt=True), DEFAULT_ASSUMPTIONS),
    (30, "qwen3-235b-a22b", "h100", 4096, 2048,
     Layout(tp=2, pp=8, vpp=4, ep=32, etp=1, dp=16, sp=True, dist_opt=True, recompute="selective",
            embedding_loss_split=True), MODELZOO),  # the recipe's split: (94 + 2) / (8 * 4) = 3 per chunk
    (33, "qwen3-235b-a22b", "h100", 4096, 2048,
     Layout(tp=2, pp=32, vpp=3, ep=8, etp=1, dp=4, sp=True, dist_opt=True, recompute="selective",
            embedding_loss_split=True), MODELZOO),  # (94 + 2) / (32 * 3) = 1 per chunk
]


@pytest.mark.parametrize("row,model,gpu,seq,gbs,layout,assumptions", PUBLISHED, ids=[str(p[0]) for p in PUBLISHED])
def test_published_layout_is_not_predicted_out_of_memory(row, model, gpu, seq, gbs, layout, assumptions):
    model = get_model(model) if isinstance(model, str) else model
    job = Job(model=model, cluster=build_cluster(nodes=max(1, layout.world_size // 8), gpu=gpu),
              training=TrainingSpec(seq_length=seq, global_batch_size=gbs))
    assert estimate_memory(job, layout, assumptions).fits(job.cluster.gpu.memory_bytes)


@pytest.mark.parametrize("name", ["llama3-70b", "mixtral-8x22b", "deepseek-v3"])
def test_more_tp_or_pp_never_raises_the_estimated_weight_bytes(name):
    job = _job(name, seq=4096, gbs=1024, nodes=64)
    ep = 8 if job.model.moe is not None else 1

    def heaviest(layout):  # the heaviest stage's weights (the peak-memory stage can be another one)
        return max(s.weights_bytes for s in estimate_memory_per_stage(job, layout))

    for pp in (1, 2, 4, 8):
        by_tp = [heaviest(Layout(tp=tp, pp=pp, ep=ep, etp=1 if ep > 1 else None, sp=tp > 1,
                                 dp=512 // (tp * pp))) for tp in (1, 2, 4, 8)]
        assert by_tp == sorted(by_tp, reverse=True), pp
    for tp in (1, 8):
        by_pp = [heaviest(Layout(tp=tp, pp=pp, ep=ep, etp=1 if ep > 1 else None, sp=tp > 1,
                                 dp=512 // (tp * pp))) for pp in (1, 2, 4, 8, 16)]
        assert by_pp == sorted(by_pp, reverse=True), tp


def test_microbatch_terms_are_one_chunk_of_one_microbatch():
    # tiny-gpt, PP=2: stage 1 holds layers 4..7 and the output layer; 4 x one layer + the output terms
    job = _job("tiny-gpt", seq=256)
    layout = Layout(tp=2, pp=2, sp=True)
    terms = microbatch_activation_terms(job, layout, stage=1)
    one_layer = sum(layer_activation_bytes(job.model, job.training, layout, DEFAULT_ASSUMPTIONS, moe=False).values())
    output = terms["final_norm_input"] + terms["output_layer_input"] + terms["logits_fp32"]
    assert sum(terms.values()) == pytest.approx(4 * one_layer + output)
    assert "logits_fp32" not in microbatch_activation_terms(job, layout, stage=0)


def test_microbatch_terms_reject_a_stage_outside_the_pipeline():
    with pytest.raises(ValueError, match="stage must be in"):
        microbatch_activation_terms(_job("tiny-gpt"), Layout(pp=2), stage=2)


@pytest.mark.parametrize("layout", LAYOUTS + [Layout(tp=2, pp=16, ep=8, etp=1, dp=16, sp=True)], ids=str)
def test_peak_is_the_heaviest_stage(layout):
    job = _job("deepseek-v3", seq=4096, gbs=256, nodes=64)
    per_stage = estimate_memory_per_stage(job, layout)
    peak = estimate_memory(job, layout)
    assert [e.stage for e in per_stage] == list(range(layout.pp))
    assert peak.total_bytes == max(e.total_bytes for e in per_stage)
    assert peak.total_bytes == per_stage[peak.stage].total_bytes


def test_layernorm_recompute_discards_only_unfused_norm_outputs():
    # TE fuses the GQA input norm and the dense pre-MLP norm into their GEMMs (megatron-core skips IdentityOp);
    # the MoE pre-MLP norm is its own module, so its output is discarded
    model, training = get_model("tiny-moe"), TrainingSpec(seq_length=256)
    plain = Layout(tp=2, sp=True, recompute="selective")
    norm = MemoryAssumptions(recompute_modules=("layernorm",))
    dense = layer_activation_bytes(model, training, plain, norm, moe=False)
    assert dense == layer_activation_bytes(model, training, plain, MemoryAssumptions(recompute_modules=()), moe=False)
    moe_terms = layer_activation_bytes(model, training, plain, norm, moe=True)
    assert moe_terms["moe_input"] == 0 and moe_terms["qkv_input"] == 2 * 256 * 128 / 2


def test_mla_down_projections_duplicated_by_default_split_in_the_local_spec():
    # tiny-mla: h = 128, q_lora = 64, kv_lora + rope = 32 + 8; TP = 2 keeps half of them on each rank when split
    model, layout = get_model("tiny-mla"), Layout(tp=2, pp=2, ep=2, etp=1, sp=True)
    te = stage_params(model, layout)[1]
    local = stage_params(model, layout, mla_down_proj_split=True)[1]
    layers = te.layers
    assert te.dense_params_per_gpu - local.dense_params_per_gpu == layers * 128 * (64 + 32 + 8) // 2


def test_a_70b_model_on_plain_data_parallel_is_out_of_memory():
    # 70.6e9 params x (6 + 12/8) B = 530 GB per GPU with the distributed optimizer over DP = 8: far over 80 GiB
    job = _job("llama3-70b", seq=4096, gbs=64, nodes=1)
    est = estimate_memory(job, Layout(dp=8, dist_opt=True))
    assert not est.fits(job.cluster.gpu.memory_bytes)
    assert est.dominant == "gradients"  # 4 B/param, unsharded

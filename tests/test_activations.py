"""Activations per layer and micro-batch (autotune/cost/activations.py): Korthikanti et al. 2022's Table 2, then
what Transformer Engine keeps on a GPU (FP8 copies of GEMM inputs, fused attention's contiguous V), the MoE
terms, CUDA-graph buffers, the loss, and the pipeline's in-flight micro-batches."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.cost.activation_units import layer_activation_bytes
from autotune.cost.activations import (
    ActivationAssumptions,
    inflight_microbatches_per_chunk,
    output_activation_bytes,
    saved_gemm_input_bytes,
    shape_of,
)
from autotune.cost.memory import LOCAL_SPEC_ASSUMPTIONS
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.model import ModelSpec
from search_spaces.training import TrainingSpec

# Korthikanti's GPT: MHA, ffn = 4h, GeLU, LayerNorm, learned positions, dropout masks kept, no flash attention.
GPT = ModelSpec(name="gpt-k", num_layers=8, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                vocab_size=51200, gated_linear_unit=False, normalization="LayerNorm", add_bias_linear=True,
                max_position_embeddings=2048)
KORTHIKANTI = ActivationAssumptions(flash_attention=False, dropout=True)
TE = ActivationAssumptions()


def _job(model: ModelSpec | str, *, seq: int = 2048, gpu: str = "h100", **training: object) -> Job:
    model = get_model(model) if isinstance(model, str) else model
    return Job(model=model, cluster=build_cluster(nodes=8, gpu=gpu),
               training=TrainingSpec(seq_length=seq, **training))  # type: ignore[arg-type]


def _terms(model, layout, *, seq=2048, assumptions=KORTHIKANTI, moe=False, **training) -> dict[str, float]:
    return layer_activation_bytes(_job(model, seq=seq, **training), layout, assumptions, moe=moe)


def _layer(model, layout, **kw) -> float:
    return sum(_terms(model, layout, **kw).values())


def _norm_stats(s: int, b: int, sp_div: int) -> float:
    """The two LayerNorms' fp32 mean and rsigma per token, which Korthikanti's table leaves out: 2 x 8 B."""
    return 2 * 8 * s * b / sp_div


# --- Korthikanti et al. 2022, Table 2 ------------------------------------------------------------------------
@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_korthikanti_tp_with_sequence_parallel(t):
    s, b, h, a = 2048, 2, 1024, 16
    expected = s * b * h / t * (34 + 5 * a * s / h) + _norm_stats(s, b, t)
    assert _layer(GPT, Layout(tp=t, sp=t > 1, mbs=b)) == pytest.approx(expected)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_korthikanti_tp_without_sequence_parallel(t):
    s, b, h, a = 2048, 1, 1024, 16
    expected = s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) + _norm_stats(s, b, 1)
    assert _layer(GPT, Layout(tp=t)) == pytest.approx(expected)


def test_korthikanti_selective_recompute_drops_the_attention_scores():
    s, h, t = 2048, 1024, 4
    assert _layer(GPT, Layout(tp=t, sp=True, recompute="selective")) == pytest.approx(
        s * h / t * 34 + _norm_stats(s, 1, t))


def test_korthikanti_full_recompute_keeps_the_layer_input():
    s, h, t = 2048, 1024, 4
    assert _layer(GPT, Layout(tp=t, sp=True, recompute="full")) == pytest.approx(2 * s * h / t)


# --- what Transformer Engine keeps ---------------------------------------------------------------------------
def test_fused_attention_keeps_new_q_k_and_a_contiguous_copy_of_v():
    # llama3-8b: a = 32, g = 8, d = 128; RoPE writes Q and K, TE copies the strided V view: (a + 2g) d per token
    terms = _terms("llama3-8b", Layout(), seq=4096, assumptions=TE)
    assert terms["qkv"] == 2 * 4096 * (32 + 2 * 8) * 128


def test_the_local_spec_keeps_the_mixed_qkv_tensor_through_the_v_view():
    # local spec, unfused: rotated Q (ad) + K and V repeated to a heads (2ad) = 3ad per token (CPU probe)
    terms = _terms("llama3-8b", Layout(), seq=4096, assumptions=LOCAL_SPEC_ASSUMPTIONS)
    assert terms["qkv"] == 2 * 4096 * 3 * 32 * 128


def test_gated_mlp_keeps_the_swiglu_input_and_the_fc2_input():
    # fused SwiGLU keeps its 2f-wide bf16 input, fc2 its f-wide bf16 input: (4 + 2) s f / t
    terms = _terms("llama3-8b", Layout(tp=2, sp=True), seq=4096, assumptions=TE)
    s, f, t = 4096, 14336, 2
    assert terms["fc1_output"] + terms["activation_output"] == 6 * s * f / t


@pytest.mark.parametrize("recipe,gpu,expected", [(None, "h100", 2.0), ("tensorwise", "h100", 1.0),
                                                 ("delayed", "h100", 1.0), ("mxfp8", "b200", 1 + 1 / 32)])
def test_saved_gemm_input_bytes_by_recipe(recipe, gpu, expected):
    assert saved_gemm_input_bytes(recipe, transformer_engine=True) == expected
    assert saved_gemm_input_bytes(recipe, transformer_engine=False) == 2.0  # the local spec never quantizes


def test_fp8_saves_gemm_inputs_as_one_byte_copies():
    # llama3-8b TP 2 + SP, FP8 current scaling (H100's default recipe): ln_out (qkv_input, fc1_input) and the fc2
    # input halve; proj keeps O in bf16 only: megatron-core sets `set_save_original_input(linear_proj)` for every FP8
    # recipe but delayed scaling (transformer/attention.py:427-443); norm inputs and the SwiGLU input stay bf16
    layout = Layout(tp=2, sp=True)
    bf16 = _terms("llama3-8b", layout, seq=4096, assumptions=TE)
    fp8 = _terms("llama3-8b", layout, seq=4096, assumptions=TE, precision="fp8")
    for name in ("qkv_input", "fc1_input", "activation_output"):
        assert fp8[name] == bf16[name] / 2, name
    for name in ("attn_norm_input", "mlp_norm_input", "fc1_output", "qkv", "proj_input"):
        assert fp8[name] == bf16[name], name


@pytest.mark.parametrize("recipe, gpu, extra", [("delayed", "h100", 1), ("tensorwise", "h100", 0),
                                                ("mxfp8", "b200", 0), ("blockwise", "h100", 0)])
def test_only_delayed_scaling_keeps_a_quantized_copy_of_proj_input(recipe, gpu, extra):
    # delayed scaling quantizes linear_proj's input and saves that copy (1 B) beside O (2 B, the attention
    # backward's); every other recipe saves proj's original bf16 input, the same storage as O
    layout = Layout(tp=2, sp=True)
    bf16 = layer_activation_bytes(_job("llama3-8b", seq=4096, gpu=gpu), layout, TE, moe=False)["proj_input"]
    fp8 = layer_activation_bytes(_job("llama3-8b", seq=4096, gpu=gpu, precision="fp8", fp8_recipe=recipe), layout,
                                 TE, moe=False)["proj_input"]
    assert fp8 == bf16 * (2 + extra) / 2


def test_core_attention_recompute_under_fp8_keeps_proj_input_once():
    # delayed scaling: O is recomputed, only proj's FP8 copy stays; current scaling: proj's saved input is O itself
    layout = Layout(tp=2, sp=True, recompute="selective")
    delayed = _terms("llama3-8b", layout, seq=4096, assumptions=TE, precision="fp8", fp8_recipe="delayed")
    assert delayed["core_attention"] == 0
    assert delayed["proj_input"] == 1 * 4096 * 32 * 128 / 2
    current = _terms("llama3-8b", layout, seq=4096, assumptions=TE, precision="fp8")
    assert current["proj_input"] == 2 * 4096 * 32 * 128 / 2


@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_divides_activations(cp):
    one = _layer("llama3-8b", Layout(tp=2, sp=True), seq=8192, assumptions=TE)
    assert _layer("llama3-8b", Layout(tp=2, sp=True, cp=cp), seq=8192, assumptions=TE) == pytest.approx(one / cp)


def test_layernorm_recompute_discards_only_unfused_norm_outputs():
    # TE fuses the GQA input norm and the dense pre-MLP norm into their GEMMs (megatron-core skips IdentityOp);
    # the MoE pre-MLP norm is its own module, so its output is discarded
    plain = Layout(tp=2, sp=True, recompute="selective")
    dense = _terms("tiny-moe", plain, seq=256, assumptions=TE, recompute_modules=("layernorm",))
    assert dense == _terms("tiny-moe", plain, seq=256, assumptions=TE, recompute_modules=("shared_experts",))
    moe = _terms("tiny-moe", plain, seq=256, assumptions=TE, moe=True, recompute_modules=("layernorm",))
    assert moe["moe_input"] == 0 and moe["qkv_input"] == 2 * 256 * 128 / 2


# --- MoE -----------------------------------------------------------------------------------------------------
def test_moe_act_recompute_frees_fc2_input_under_fp8_too():
    # megatron-core makes the experts' fc2 save its original (bf16) input under FP8/FP4 when 'moe_act' is
    # recomputed (`set_save_original_input`, moe/experts.py:268-275), and the checkpoint discards that input: the
    # recompute frees fc2's input under FP8 as under bf16; the FP8 run saved a 1-byte copy, bf16 a 2-byte one
    layout = Layout(tp=2, sp=True, ep=2, etp=1, recompute="selective")
    freed = {}
    for precision in ("bf16", "fp8"):
        keep = _terms("tiny-moe", layout, seq=256, assumptions=TE, moe=True, precision=precision,
                      recompute_modules=("core_attn",))["experts"]
        drop = _terms("tiny-moe", layout, seq=256, assumptions=TE, moe=True, precision=precision,
                      recompute_modules=("core_attn", "moe_act"))["experts"]
        freed[precision] = keep - drop
    assert freed["fp8"] > 0 and freed["fp8"] == pytest.approx(freed["bf16"] / 2)


def test_moe_expert_activations_scale_with_topk():
    base = get_model("tiny-moe")
    assert base.moe is not None
    top4 = replace(base, moe=replace(base.moe, topk=4))
    layout = Layout(tp=2, sp=True, ep=2, etp=1)
    e2 = _terms(base, layout, seq=256, assumptions=TE, moe=True)["experts"]
    e4 = _terms(top4, layout, seq=256, assumptions=TE, moe=True)["experts"]
    assert e4 == 2 * e2
    h, f, tokens = 128, 256, 256 / 2 * 2  # SP shard of 256 tokens, top-2
    assert e2 == tokens * (2 * h + 2 * 2 * f + 2 * f + 4)  # fc1 input, gated fc1 output, fc2 input, fp32 probs


def test_fp8_experts_keep_one_byte_gemm_inputs():
    layout = Layout(tp=2, sp=True, ep=2, etp=1)
    e = _terms("tiny-moe", layout, seq=256, assumptions=TE, moe=True, precision="fp8")["experts"]
    h, f, tokens = 128, 256, 256
    assert e == tokens * (1 * h + 2 * 2 * f + 1 * f + 4)


def test_fused_permutation_keeps_an_int32_row_map():
    # TE's row_id_map: int32 [T_r, 2E + 1]; T_r = 256 / TP 2 tokens, E = 8
    terms = _terms("tiny-moe", Layout(tp=2, sp=True, ep=2, etp=1), seq=256, assumptions=TE, moe=True)
    assert terms["permute_maps"] == 4 * 128 * (2 * 8 + 1)


def test_te_cuda_graphs_keep_static_buffers_per_captured_part():
    # whole layer: input, output and both gradients, 4 x 2 T h / t*
    plain = Layout(tp=2, sp=True, ep=2, etp=1)
    layout = Layout(tp=2, sp=True, ep=2, etp=1, cuda_graphs="transformer_engine")
    whole = _terms("tiny-moe", layout, seq=256, assumptions=TE, moe=True, cuda_graph_modules=())
    assert whole["cuda_graph_buffers"] == 4 * 2 * 256 * 128 / 2
    routed, e, k, h = 128, 8, 2, 128
    router = 2 * 2 * routed * h + 5 * routed * e
    # the alltoall dispatcher permutes the tokens inside moe_preprocess; the flex one keeps only fp32 probs there
    alltoall = _terms("tiny-moe", layout, seq=256, assumptions=TE, moe=True,
                      cuda_graph_modules=("moe_router", "moe_preprocess"))
    assert alltoall["cuda_graph_buffers"] == router + routed * k * (2 * h + 4)
    flex = _terms("tiny-moe", layout, seq=256, assumptions=TE, moe=True,
                  cuda_graph_modules=("moe_router", "moe_preprocess"), moe_token_dispatcher="flex")
    assert flex["cuda_graph_buffers"] == router + 4 * routed * e
    none = _terms("tiny-moe", plain, seq=256, assumptions=TE, moe=True)
    assert "cuda_graph_buffers" not in none


# --- the loss ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fusion,name,per_logit", [("te", "logits_bf16", 2), ("native", "logits_fp32", 4),
                                                   ("none", "logits_fp32", 4)])
def test_the_loss_keeps_bf16_logits_when_fused_by_te(fusion, name, per_logit):
    job = _job("tiny-gpt", seq=256, cross_entropy_fusion=fusion)
    terms = output_activation_bytes(job.model, shape_of(job, Layout(tp=2), TE), vocab=1024)
    assert terms[name] == per_logit * 256 * 1024 / 2


# --- pipeline in-flight micro-batches ------------------------------------------------------------------------
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


def test_expert_overlap_adds_one_warmup_microbatch():
    # schedules.py: overlap_moe_expert_parallel_comm schedules one more forward before the 1F1B steps
    assert sum(inflight_microbatches_per_chunk(4, 2, 64, 0, extra_warmup=1)) == \
        sum(inflight_microbatches_per_chunk(4, 2, 64, 0)) + 1

"""The model catalog: named `ModelSpec`s with the published parameter counts beside them.

Architecture values are the public Hugging Face `config.json` values of each model (or the paper's
table where no config exists: GPT-3). Published totals are what the model's card or paper states;
`tests/test_models.py` checks that each spec's exact count lands within 1% of them.
`get_model` also accepts a path to a local `config.json` (see `hf_config.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from search_spaces.model import MambaSpec, MLASpec, ModelSpec, MoESpec

__all__ = ["PublishedCounts", "PUBLISHED", "get_model", "list_models", "model_names"]


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedCounts:
    """Parameter counts a model's authors publish; `active_params` is None for dense models (= total).

    `last_digit` is the place value of the last digit given ("37B" -> 1e9, "3.3B" -> 1e8): authors round
    or truncate to it, so a count is consistent with the figure when within max(1%, last_digit) of it.
    DeepSeek-V3's 37.55B active reads "37B" and Qwen3-30B-A3B's 3.35B reads "3.3B" (truncated).
    `total_params` is None where the authors give no total a count can be held to (Kimi-K2's "1T").
    """

    total_params: float | None
    active_params: float | None
    source: str
    last_digit: float = 0.0

    def tolerance(self, published: float) -> float:
        return max(0.01 * published, self.last_digit)


# --- production models -----------------------------------------------------------------------
LLAMA3_8B = ModelSpec(
    name="llama3-8b", aliases=("llama-3-8b", "meta-llama-3-8b", "llama3.1-8b", "llama-3.1-8b"),
    num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, num_query_groups=8,
    vocab_size=128256,
)
LLAMA3_70B = ModelSpec(
    name="llama3-70b", aliases=("llama-3-70b", "meta-llama-3-70b", "llama3.1-70b", "llama-3.1-70b"),
    num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64, num_query_groups=8,
    vocab_size=128256,
)
LLAMA31_405B = ModelSpec(
    name="llama3.1-405b", aliases=("llama-3.1-405b", "llama3-405b", "meta-llama-3.1-405b"),
    num_layers=126, hidden_size=16384, ffn_hidden_size=53248, num_attention_heads=128, num_query_groups=8,
    vocab_size=128256,
)
MISTRAL_7B = ModelSpec(
    name="mistral-7b", aliases=("mistral-7b-v0.1", "mistral"),
    num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, num_query_groups=8,
    vocab_size=32000, sliding_window=4096,  # every layer attends to the last 4096 tokens
)
MIXTRAL_8X7B = ModelSpec(
    name="mixtral-8x7b", aliases=("mixtral", "mixtral-8x7b-v0.1"),
    num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, num_query_groups=8,
    vocab_size=32000,
    moe=MoESpec(num_experts=8, topk=2, expert_ffn_hidden_size=14336),
)
MIXTRAL_8X22B = ModelSpec(
    name="mixtral-8x22b", aliases=("mixtral-8x22b-v0.1",),
    num_layers=56, hidden_size=6144, ffn_hidden_size=16384, num_attention_heads=48, num_query_groups=8,
    vocab_size=32768,
    moe=MoESpec(num_experts=8, topk=2, expert_ffn_hidden_size=16384),
)
QWEN2_7B = ModelSpec(
    name="qwen2-7b", aliases=("qwen2-7b-instruct",),
    num_layers=28, hidden_size=3584, ffn_hidden_size=18944, num_attention_heads=28, num_query_groups=4,
    vocab_size=152064, add_qkv_bias=True,
)
QWEN3_8B = ModelSpec(
    name="qwen3-8b", aliases=("qwen3-8b-base",),
    num_layers=36, hidden_size=4096, ffn_hidden_size=12288, num_attention_heads=32, num_query_groups=8,
    vocab_size=151936, qk_layernorm=True,
)
QWEN3_30B_A3B = ModelSpec(
    name="qwen3-30b-a3b", aliases=("qwen3-30b",),
    num_layers=48, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=32, num_query_groups=4,
    kv_channels=128, vocab_size=151936, qk_layernorm=True,
    moe=MoESpec(num_experts=128, topk=8, expert_ffn_hidden_size=768),
)
QWEN3_235B_A22B = ModelSpec(
    name="qwen3-235b-a22b", aliases=("qwen3-235b",),
    num_layers=94, hidden_size=4096, ffn_hidden_size=12288, num_attention_heads=64, num_query_groups=4,
    kv_channels=128, vocab_size=151936, qk_layernorm=True,
    moe=MoESpec(num_experts=128, topk=8, expert_ffn_hidden_size=1536),
)
# One multi-token-prediction layer (num_nextn_predict_layers=1; Megatron-Bridge trains it, `mtp_num_layers=1`),
# left out of the published 671B / 37B; group-limited routing over 8 groups of 32 experts, 4 groups per token,
# sigmoid scores with the aux-loss-free expert bias, scaled by 2.5 (noaux_tc).
DEEPSEEK_V3 = ModelSpec(
    name="deepseek-v3", aliases=("deepseek-v3-671b", "deepseek-r1", "dsv3"),
    num_layers=61, hidden_size=7168, ffn_hidden_size=18432, num_attention_heads=128, vocab_size=129280,
    qk_layernorm=True, mtp_num_layers=1,
    moe=MoESpec(num_experts=256, topk=8, expert_ffn_hidden_size=2048, shared_expert_ffn_hidden_size=2048,
                first_dense_layers=3, score_function="sigmoid", num_groups=8, group_topk=4,
                topk_scaling_factor=2.5, expert_bias=True),
    mla=MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128),
)
# Kimi-K2 (Moonshot AI): DeepSeek-V3's architecture at 384 experts, 64 heads, one dense layer and no MTP. The sizes
# are Megatron-Bridge's `models/kimi/kimi_provider.py::KimiK2Provider` (v0.3.x, the class the Kimi-K2 performance
# recipes build): 61 layers (`moe_layer_freq` [0] + [1] * 60), hidden 7168, ffn 18432, 384 experts of 2048 top-8
# and one shared expert of 2048, sigmoid scores with the expert bias over one group, scaled by 2.827; MLA with
# q_lora 1536, kv_lora 512, qk 128 + 64, v 128; vocabulary 163840; untied; qk-layernorm. Counted: 1,026.4B total,
# 32.86B active (`PUBLISHED` below).
KIMI_K2 = ModelSpec(
    name="kimi-k2", aliases=("kimi-k2-instruct", "kimi-k2-base", "moonshotai/kimi-k2-instruct"),
    num_layers=61, hidden_size=7168, ffn_hidden_size=18432, num_attention_heads=64, vocab_size=163840,
    qk_layernorm=True,
    moe=MoESpec(num_experts=384, topk=8, expert_ffn_hidden_size=2048, shared_expert_ffn_hidden_size=2048,
                first_dense_layers=1, score_function="sigmoid", num_groups=1, group_topk=1,
                topk_scaling_factor=2.827, expert_bias=True),
    mla=MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128),
)
# GPT-OSS-120B (Hugging Face openai/gpt-oss-120b config.json): 36 layers alternating a 128-token sliding window
# with full attention (layer_types), attention sinks (a learnable softmax offset per head), biased linears, 128
# experts of which 4 per token (experts_per_token), SwiGLU experts of 2880, no shared expert, untied embeddings.
GPT_OSS_120B = ModelSpec(
    name="gpt-oss-120b", aliases=("gpt-oss", "openai/gpt-oss-120b"),
    num_layers=36, hidden_size=2880, ffn_hidden_size=2880, num_attention_heads=64, num_query_groups=8,
    kv_channels=64, vocab_size=201088, add_bias_linear=True, softmax_type="learnable", sliding_window=128,
    window_attn_skip_freq=2,
    moe=MoESpec(num_experts=128, topk=4, expert_ffn_hidden_size=2880),
)
# GPT-3 (Brown et al. 2020, Table 2.1): learned positions (n_ctx 2048), biases, LayerNorm, GELU, tied embeddings.
GPT3_175B = ModelSpec(
    name="gpt3-175b", aliases=("gpt3", "gpt-3", "gpt-3-175b"),
    num_layers=96, hidden_size=12288, ffn_hidden_size=4 * 12288, num_attention_heads=96, vocab_size=50257,
    gated_linear_unit=False, tied_embeddings=True, add_bias_linear=True, normalization="LayerNorm",
    max_position_embeddings=2048,
)

# --- tiny models for tests and CPU runs --------------------------------------------------------
# 8 layers, 16 heads, 8 query groups, 8 experts, ffn and vocab multiples of 8: every TP, PP, PP*VPP,
# EP and ETP in {1, 2, 4, 8} divides them. vocab 1024 = 128 * 8 needs no padding up to TP=8.
TINY_GPT = ModelSpec(
    name="tiny-gpt", aliases=("tiny", "tiny-dense"),
    num_layers=8, hidden_size=128, ffn_hidden_size=512, num_attention_heads=16, num_query_groups=8,
    vocab_size=1024,
)
TINY_MOE = ModelSpec(
    name="tiny-moe", aliases=("tiny-mixtral",),
    num_layers=8, hidden_size=128, ffn_hidden_size=512, num_attention_heads=16, num_query_groups=8,
    vocab_size=1024,
    moe=MoESpec(num_experts=8, topk=2, expert_ffn_hidden_size=256),
)
TINY_MLA = ModelSpec(
    name="tiny-mla", aliases=("tiny-deepseek",),
    num_layers=8, hidden_size=128, ffn_hidden_size=512, num_attention_heads=16, vocab_size=1024,
    qk_layernorm=True,
    moe=MoESpec(num_experts=8, topk=2, expert_ffn_hidden_size=128, shared_expert_ffn_hidden_size=128,
                first_dense_layers=1),
    mla=MLASpec(q_lora_rank=64, kv_lora_rank=32, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16),
)

# --- hybrid Mamba-Transformer models (megatron-core HybridModel) -------------------------------------------
# Architectures from Megatron-Bridge 0.6.2's recipes (`megatron/bridge/recipes/nemotronh/h100/nemotronh.py`:
# nemotronh_{8b,47b,56b}_pretrain_*_config; `h100/nemotron_3_nano.py::
# nemotron_3_nano_pretrain_8gpu_h100_bf16_config`)
# and `models/hybrid/hybrid_provider.py`'s defaults (no gated MLP, RMSNorm, no biases, untied, no position
# embedding); squared-ReLU MLPs (`activation_func=squared_relu`); vocabulary 131072 (the Nemotron-H tokenizer, HF
# `vocab_size`). Mamba: head dim 64, 8 groups, d_conv 4, chunk 128 (HybridModelProvider / MambaMixer defaults).
_NEMOTRON_H_SMALL = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
_NEMOTRON_H_47B = "M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---M-M*-M-M-M-M-M-"
_NEMOTRON_H_56B = ("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-"
                   "M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-")


def _nemotron_h(name: str, pattern: str, h: int, ffn: int, heads: int, mamba_heads: int, state: int,
                aliases: tuple[str, ...], kv_channels: int | None = None, moe: MoESpec | None = None) -> ModelSpec:
    return ModelSpec(
        name=name, aliases=aliases, num_layers=len(pattern), hybrid_pattern=pattern, hidden_size=h,
        ffn_hidden_size=ffn, num_attention_heads=heads, num_query_groups=8 if moe is None else 2,
        kv_channels=kv_channels, vocab_size=131072, gated_linear_unit=False, activation="squared_relu", moe=moe,
        mamba=MambaSpec(num_heads=mamba_heads, head_dim=64, state_dim=state, num_groups=8),
    )


NEMOTRON_H_8B = _nemotron_h("nemotron-h-8b", _NEMOTRON_H_SMALL, 4096, 21504, 32, 128, 128,
                            ("nemotronh-8b", "nemotron-h-8b-base-8k"))
NEMOTRON_H_47B = _nemotron_h("nemotron-h-47b", _NEMOTRON_H_47B, 8192, 30720, 64, 256, 256,
                             ("nemotronh-47b", "nemotron-h-47b-base-8k"))
NEMOTRON_H_56B = _nemotron_h("nemotron-h-56b", _NEMOTRON_H_56B, 8192, 32768, 64, 256, 256,
                             ("nemotronh-56b", "nemotron-h-56b-base-8k"))
# Nemotron 3 Nano 30B-A3B: 128 routed experts of 1856, top-6 (sigmoid, expert bias, scaling 2.5, one group), one
# shared expert of 3712, 2 KV groups (recipe above)
NEMOTRON_3_NANO = _nemotron_h(
    "nemotron-3-nano-30b-a3b", "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", 2688, 1856, 32, 64, 128,
    ("nemotron-3-nano", "nemotron3-nano", "nvidia-nemotron-3-nano-30b-a3b"), kv_channels=128,
    moe=MoESpec(num_experts=128, topk=6, expert_ffn_hidden_size=1856, shared_expert_ffn_hidden_size=3712,
                score_function="sigmoid", expert_bias=True, topk_scaling_factor=2.5, num_groups=1, group_topk=1))

# Nemotron 3 Super 120B-A12B (LatentMoE + MTP). Bridge's recipe takes the architecture from the HF checkpoint
# (`megatron/bridge/recipes/nemotronh/h100/nemotron_3_super.py::nemotron_3_super_pretrain_16gpu_h100_bf16_config`:
# `AutoBridge.from_hf_pretrained(NEMOTRON_3_SUPER_HF_MODEL_ID)`, not available offline); the numbers are Megatron-LM's
# launch of that checkpoint (`examples/post_training/modelopt/conf/nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16.sh`,
# the same as `tests/functional_tests/test_cases/nemotron/nemotron3_super_release_gb200/model_config.yaml`): 88 layers
# of the pattern below, hidden 4096, 32 heads, 2 query groups, kv_channels 128, ffn 2688 (no --moe-ffn-hidden-size,
# so the experts' is 2688 too), 512 experts top-22 (sigmoid, expert bias, scaling 5.0), shared expert 5376,
# moe_latent_size 1024, 128 Mamba heads of 64, squared ReLU, untied, no bias; mamba_state_dim 128 and
# mamba_num_groups 8 are megatron-core's TransformerConfig defaults (the launch sets neither); vocabulary 131072
# (the recipe's tokenizer is Nano's, `cfg.tokenizer.tokenizer_model`). MTP: Bridge's perf recipes set
# mtp_num_layers=2, mtp_hybrid_override_pattern="*E", mtp_use_repeated_layer=True
# (`perf_recipes/nemotronh/b200/nemotronh.py:40-45`, and the h100 recipe above, lines 96-102).
NEMOTRON_3_SUPER = replace(_nemotron_h(
    "nemotron-3-super-120b-a12b",
    "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME", 4096, 2688, 32, 128,
    128, ("nemotron-3-super", "nemotron3-super", "nvidia-nemotron-3-super-120b-a12b"), kv_channels=128,
    moe=MoESpec(num_experts=512, topk=22, expert_ffn_hidden_size=2688, shared_expert_ffn_hidden_size=5376,
                score_function="sigmoid", expert_bias=True, topk_scaling_factor=5.0, latent_size=1024)),
    mtp_num_layers=2, mtp_repeated_layer=True)

# Nemotron 3.5 Lightning 30B-A3B: Nemotron-3 Nano's architecture with Super's MTP. The one published run (26.08
# GB200 MXFP8) is Bridge v0.6.0's `perf_recipes/nemotronh/gb200/nemotronh.py::
# nemotron_3_5_lightning_pretrain_8gpu_gb200_fp8mx_config`, which builds Nano's recipe
# (`_build_nemotron_3_nano_gb200_mxfp8`) and adds mtp_num_layers=2, mtp_hybrid_override_pattern="*E",
# mtp_use_repeated_layer=True (the Bridge 0.6.2 wheel, lines 597-609): every other size is Nano's. Its
# `keep_mtp_spec_in_bf16=True` is a HybridModelProvider field nothing reads in Bridge 0.6.2 or megatron-core 0.19.2
# (`multi_token_prediction.py` runs MTP under the global FP8 context), so the MTP layers run in FP8 there.
NEMOTRON_35_LIGHTNING = replace(
    NEMOTRON_3_NANO, name="nemotron-3.5-lightning-30b-a3b",
    aliases=("nemotron-3.5-lightning", "nemotron3.5-lightning", "nvidia-nemotron-3.5-lightning-30b-a3b"),
    mtp_num_layers=2, mtp_repeated_layer=True)

_MODELS: tuple[ModelSpec, ...] = (
    LLAMA3_8B, LLAMA3_70B, LLAMA31_405B, MISTRAL_7B, MIXTRAL_8X7B, MIXTRAL_8X22B, QWEN2_7B, QWEN3_8B, QWEN3_30B_A3B,
    QWEN3_235B_A22B, DEEPSEEK_V3, KIMI_K2, GPT_OSS_120B, GPT3_175B, NEMOTRON_H_8B, NEMOTRON_H_47B,
    NEMOTRON_H_56B, NEMOTRON_3_NANO, NEMOTRON_3_SUPER, NEMOTRON_35_LIGHTNING, TINY_GPT, TINY_MOE, TINY_MLA,
)

PUBLISHED: dict[str, PublishedCounts] = {
    "llama3-8b": PublishedCounts(
        total_params=8.03e9, active_params=None,
        source="Hugging Face meta-llama/Meta-Llama-3-8B safetensors metadata (8.03B params)"),
    "llama3-70b": PublishedCounts(
        total_params=70.6e9, active_params=None,
        source="Hugging Face meta-llama/Meta-Llama-3-70B safetensors metadata (70.6B params)"),
    "llama3.1-405b": PublishedCounts(
        total_params=405.9e9, active_params=None,
        source="Hugging Face meta-llama/Llama-3.1-405B safetensors metadata (405.85B); model card says 405B"),
    "mistral-7b": PublishedCounts(
        total_params=7.24e9, active_params=None,
        source="Hugging Face mistralai/Mistral-7B-v0.1 safetensors metadata (7.24B); Mistral AI's blog says 7.3B"),
    "mixtral-8x7b": PublishedCounts(
        total_params=46.7e9, active_params=12.9e9,
        source="Mistral AI, 'Mixtral of experts' blog (Dec 2023) and arXiv 2401.04088: 46.7B total, 12.9B active"),
    "mixtral-8x22b": PublishedCounts(
        total_params=141e9, active_params=39e9,
        source="Mistral AI, 'Cheaper, Better, Faster, Stronger' blog (Apr 2024): 141B total, 39B active"),
    "qwen2-7b": PublishedCounts(
        total_params=7.62e9, active_params=None,
        source="Hugging Face Qwen/Qwen2-7B safetensors metadata (7.62B); Qwen2 report arXiv 2407.10671 says 7B"),
    "qwen3-8b": PublishedCounts(
        total_params=8.2e9, active_params=None, last_digit=0.1e9,
        source="Hugging Face Qwen/Qwen3-8B model card: 8.2B parameters (6.95B non-embedding)"),
    "qwen3-30b-a3b": PublishedCounts(
        total_params=30.5e9, active_params=3.3e9, last_digit=0.1e9,
        source="Hugging Face Qwen/Qwen3-30B-A3B model card: 30.5B total, 3.3B activated"),
    "qwen3-235b-a22b": PublishedCounts(
        total_params=235e9, active_params=22e9,
        source="Hugging Face Qwen/Qwen3-235B-A22B model card: 235B total, 22B activated"),
    "deepseek-v3": PublishedCounts(
        total_params=671e9, active_params=37e9, last_digit=1e9,
        source="DeepSeek-V3 technical report arXiv 2412.19437: 671B total, 37B activated (MTP module excluded: "
               "tests compare the counts without `mtp_params`)"),
    "kimi-k2": PublishedCounts(
        total_params=None, active_params=32e9, last_digit=1e9,
        source="Hugging Face moonshotai/Kimi-K2-Instruct model card: 'Activated Parameters 32B'; its 'Total "
               "Parameters 1T' holds a count to nothing, and the Kimi K2 report's (arXiv 2507.20534) '1.04 "
               "trillion' is 1.3% above the 1,026.4B its published sizes give, a gap not explained here"),
    "gpt-oss-120b": PublishedCounts(
        total_params=116.83e9, active_params=None, last_digit=0.01e9,
        source="OpenAI, 'gpt-oss-120b & gpt-oss-20b Model Card' (Aug 2025), Table 1: 116.83B total; its 5.13B "
               "active per token leaves the input embedding out (tests/test_models.py)"),
    "gpt3-175b": PublishedCounts(
        total_params=175e9, active_params=None,
        source="Brown et al. 2020, 'Language Models are Few-Shot Learners' arXiv 2005.14165, Table 2.1: 175.0B"),
    "nemotron-h-8b": PublishedCounts(
        total_params=8e9, active_params=None, last_digit=1e9,
        source="NVIDIA, 'Nemotron-H: A Family of Accurate and Efficient Hybrid Mamba-Transformer Models' arXiv "
               "2504.03624 (Nemotron-H-8B)"),
    "nemotron-h-47b": PublishedCounts(
        total_params=47e9, active_params=None, last_digit=1e9,
        source="NVIDIA, Nemotron-H arXiv 2504.03624 (Nemotron-H-47B, compressed from the 56B)"),
    "nemotron-h-56b": PublishedCounts(
        total_params=56e9, active_params=None, last_digit=1e9,
        source="NVIDIA, Nemotron-H arXiv 2504.03624 (Nemotron-H-56B)"),
    "nemotron-3-nano-30b-a3b": PublishedCounts(
        total_params=31.6e9, active_params=3.6e9, last_digit=0.1e9,
        source="Hugging Face nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 model card: 31.6B total, about 3.6B "
               "active per token including embeddings (3.2B without)"),
    "nemotron-3-super-120b-a12b": PublishedCounts(
        total_params=120e9, active_params=12e9, last_digit=1e9,
        source="Hugging Face nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16 (the name; Megatron-Bridge "
               "docs/models/llm/nemotron3-super.md: '12B active parameters and 120B parameters in total'); "
               "MTP layers excluded"),
    "nemotron-3.5-lightning-30b-a3b": PublishedCounts(
        total_params=31.6e9, active_params=3.6e9, last_digit=0.1e9,
        source="Nemotron-3 Nano's counts (its Hugging Face model card: 31.6B total, about 3.6B active including "
               "embeddings), whose sizes the Lightning recipe builds; the checkpoint's name says 30B-A3B; MTP "
               "layers excluded"),
}


def list_models() -> list[ModelSpec]:
    """Every catalog model, production models first, then the tiny test models."""
    return list(_MODELS)


def model_names() -> list[str]:
    return [m.name for m in _MODELS]


def _by_name() -> dict[str, ModelSpec]:
    table: dict[str, ModelSpec] = {}
    for model in _MODELS:
        for key in (model.name, *model.aliases):
            table[key.lower()] = model
    return table


def _looks_like_path(name: str) -> bool:
    return name.lower().endswith(".json") or Path(name).is_file()


def get_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name or alias (case-insensitive), or a model read from a local HF config.json.

    A directory holding a `config.json` is accepted too. Unknown names raise ValueError listing the known ones.
    """
    key = name_or_path.strip()
    if _looks_like_path(key) or (Path(key).is_dir() and (Path(key) / "config.json").is_file()):
        from search_spaces.hf_config import model_from_hf_config

        return model_from_hf_config(key)
    model = _by_name().get(key.lower())
    if model is None:
        raise ValueError(
            f"Unknown model {name_or_path!r}; use one of {', '.join(model_names())}, "
            "or give a path to a Hugging Face config.json."
        )
    return model

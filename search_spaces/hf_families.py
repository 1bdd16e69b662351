"""One builder per Hugging Face architecture: config.json keys -> `ModelSpec` fields.

The mapping of each family follows the `transformers` modelling code and Megatron-Bridge's bridges
(v0.3.1, `src/megatron/bridge/models/<family>/`), which say how megatron-core builds the model:
- Llama, Mistral, Phi-3: GQA, SwiGLU, RMSNorm (Phi-3's fused qkv/gate_up weights hold the same numbers);
  Mistral and Phi-3 window every layer (`sliding_window`).
- Qwen2/2.5: bias on q, k, v only (`add_qkv_bias`); Qwen3: per-head q/k norms; Qwen3-MoE and Qwen2-MoE
  (Qwen1.5-MoE, with a sigmoid-gated shared expert) route with softmax, renormalising the top-k when
  `norm_topk_prob` (else megatron-core's `moe_router_pre_softmax`).
- Mixtral, OLMoE: MoE without shared experts; OLMoE's q/k norms span all heads (Bridge's `OLMoESelfAttention`).
- DeepSeek-V2/V3 (one builder, driven by the routing keys, whatever the architecture name says): MLA,
  `first_k_dense_replace` dense layers, shared experts, `topk_method` greedy / group_limited_greedy / noaux_tc
  (megatron-core's `moe_router_num_groups` / `moe_router_group_topk`; noaux_tc adds the sigmoid score and the
  expert bias), `routed_scaling_factor` and `num_nextn_predict_layers` MTP layers. DeepSeek-V2's group score
  is the group's best expert, megatron-core's the sum of its top (topk / group_topk) experts: the parameters and
  the layout rules are the same, the routing differs in detail (Megatron-Bridge maps V2 the same way).
- Gemma 2/3: GeGLU, tied embeddings, post-attention and post-feedforward norms (`post_norms`), sliding window
  on all but every 2nd (Gemma 2) / 6th (Gemma 3) layer, Gemma 2's logit soft-capping, Gemma 3's q/k norms.
- GPT-OSS: biases on every linear (router and experts included), attention sinks (`softmax_type learnable`),
  sliding window on every other layer, a clamped SwiGLU (`swiglu_limit`, numerics only).
- Nemotron-H / Nemotron-3 (`NemotronHForCausalLM`, Bridge 0.6.2 `models/nemotronh/nemotron_h_bridge.py`): a
  hybrid pattern (`hybrid_override_pattern`, or `layers_block_type` in transformers 5), Mamba-2 mixers
  (`mamba_num_heads`, `mamba_head_dim`, `ssm_state_size`, `n_groups`, `conv_kernel`, `chunk_size`), squared-ReLU
  MLPs, and MoE layers routed as the bridge sets them (sigmoid with the expert bias), LatentMoE's
  `moe_latent_size` (Nemotron-3 Super / Ultra) included. MTP layers (`num_nextn_predict_layers`) are refused: the
  HF config's one MTP block becomes Bridge's repeated layer at the recipe's depth, which the config does not say.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from search_spaces.model import MambaSpec, MLASpec, MoESpec

if TYPE_CHECKING:
    from search_spaces.hf_keys import HFConfig

__all__ = ["SUPPORTED_ARCHITECTURES", "builder_for"]

_SILU = ("silu", "swish")
_GELU = ("gelu_pytorch_tanh", "gelu", "gelu_new", "gelu_fast")


def _activation(c: HFConfig, allowed: tuple[str, ...], *keys: str) -> str:
    """The gated MLP's activation ("silu" or "gelu") from the first of `keys` that is set."""
    keys = keys or ("hidden_act",)
    values = [c.str(k) for k in keys]
    value = next((v for v in values if v is not None), allowed[0])
    if value not in allowed:
        raise ValueError(f"{c.path}: {keys[0]}={value!r} is not supported (this family's MLP is "
                         f"{'SwiGLU' if allowed is _SILU else 'GeGLU'}); only {', '.join(allowed)} are.")
    return "silu" if value in _SILU else "gelu"


def _decoder(c: HFConfig, *, tie_default: bool = False) -> dict[str, Any]:
    """Sizes every decoder shares: layers, hidden, FFN, heads, KV heads, head_dim, vocabulary, tying."""
    heads = c.int("num_attention_heads")
    hidden = c.int("hidden_size")
    head_dim = c.int("head_dim", required=False)
    explicit = head_dim is not None and (hidden % heads or head_dim != hidden // heads)
    return dict(
        num_layers=c.int("num_hidden_layers"),
        hidden_size=hidden,
        ffn_hidden_size=c.int("intermediate_size"),
        num_attention_heads=heads,
        num_query_groups=c.int("num_key_value_heads", heads),
        kv_channels=head_dim if explicit else None,
        vocab_size=c.int("vocab_size"),
        tied_embeddings=c.bool("tie_word_embeddings", tie_default),
    )


def _no_bias(c: HFConfig) -> None:
    c.refuse("attention_bias", False, "bias on the q/k/v/o projections: megatron-core's add_bias_linear would put "
             "one on every linear layer, add_qkv_bias on q/k/v only")
    c.refuse("mlp_bias", False, "bias on the MLP projections")


def _window_all_layers(c: HFConfig) -> dict[str, Any]:
    """Mistral / Mixtral / Phi-3: `sliding_window` (null: none) on every layer."""
    return {"sliding_window": c.int("sliding_window", required=False)}


def _window_from_layer_types(c: HFConfig, num_layers: int, pattern: int | None = None) -> dict[str, Any]:
    """`layer_types` (or `sliding_window_pattern`) as megatron-core's `window_attn_skip_freq`: layer i
    (0-based) is full attention when (i + 1) % freq == 0 (`is_layer_window_attention`)."""
    types = c.list("layer_types")
    window = c.int("sliding_window", required=False)
    if types is None:
        if pattern is None or window is None:
            return {"sliding_window": window}
        full = [(i + 1) % pattern == 0 for i in range(num_layers)]
    else:
        if len(types) != num_layers or not set(types) <= {"sliding_attention", "full_attention"}:
            raise ValueError(f"{c.path}: layer_types must list 'sliding_attention' / 'full_attention' for each of "
                             f"the {num_layers} layers, but got {types!r}.")
        full = [t == "full_attention" for t in types]
    if all(full) or window is None:
        if not all(full):
            raise ValueError(f"{c.path}: layer_types asks for sliding-window layers but sliding_window is not set.")
        return {"sliding_window": None}
    if not any(full):
        return {"sliding_window": window}
    freq = full.index(True) + 1
    if full != [(i + 1) % freq == 0 for i in range(num_layers)]:
        raise ValueError(f"{c.path}: layer_types {types!r} is not 'every {freq}-th layer full attention', the only "
                         "pattern megatron-core's window_attn_skip_freq (an integer) expresses.")
    return {"sliding_window": window, "window_attn_skip_freq": freq}


def _qwen_window(c: HFConfig) -> None:
    if c.bool("use_sliding_window", False):
        raise ValueError(f"{c.path}: use_sliding_window=true is not supported (Qwen then windows only the layers "
                         "from max_window_layers on, which megatron-core's window_attn_skip_freq cannot express).")
    c.int("sliding_window", required=False)  # read: unused while use_sliding_window is false
    types = c.list("layer_types")
    if types is not None and set(types) != {"full_attention"}:
        raise ValueError(f"{c.path}: layer_types {sorted(set(types))} is not supported for Qwen (only full attention).")


def _softmax_routing(c: HFConfig, key: str = "norm_topk_prob", default: bool = False) -> dict[str, Any]:
    """Softmax routing: renormalised top-k (`norm_topk_prob`) or softmax over all experts first (megatron-core's
    `moe_router_pre_softmax`, the probabilities of the chosen experts not renormalised)."""
    return {"score_function": "softmax", "pre_softmax": not c.bool(key, default)}


# --- families ----------------------------------------------------------------------------------------------
def _llama(c: HFConfig) -> dict[str, Any]:
    _no_bias(c)
    return {**_decoder(c), "activation": _activation(c, _SILU)}


def _mistral(c: HFConfig) -> dict[str, Any]:
    return {**_llama(c), **_window_all_layers(c)}


def _mixtral(c: HFConfig) -> dict[str, Any]:
    shape = _mistral(c)
    moe = MoESpec(num_experts=c.int("num_local_experts"), topk=c.int("num_experts_per_tok"),
                  expert_ffn_hidden_size=shape["ffn_hidden_size"])  # softmax, then top-k renormalised
    return {**shape, "moe": moe}


def _phi3(c: HFConfig) -> dict[str, Any]:
    return {**_llama(c), **_window_all_layers(c)}


def _qwen2(c: HFConfig) -> dict[str, Any]:
    # Qwen2Attention always has bias on q, k and v (not on o_proj): `attention_bias` is not in its config.
    _qwen_window(c)
    c.refuse("mlp_bias", False, "bias on the MLP projections")
    return {**_decoder(c), "activation": _activation(c, _SILU), "add_qkv_bias": True}


def _qwen2_moe(c: HFConfig) -> dict[str, Any]:
    c.refuse("decoder_sparse_step", 1, "every layer must be a MoE layer")
    c.refuse("mlp_only_layers", [], "every layer must be a MoE layer")
    shared = c.int("shared_expert_intermediate_size", 0, minimum=0)
    moe = MoESpec(num_experts=c.int("num_experts"), topk=c.int("num_experts_per_tok"),
                  expert_ffn_hidden_size=c.int("moe_intermediate_size"), shared_expert_ffn_hidden_size=shared,
                  shared_expert_gate=bool(shared), **_softmax_routing(c))
    return {**_qwen2(c), "moe": moe}


def _qwen3(c: HFConfig) -> dict[str, Any]:
    _qwen_window(c)
    _no_bias(c)
    return {**_decoder(c), "activation": _activation(c, _SILU), "qk_layernorm": True}


def _qwen3_moe(c: HFConfig) -> dict[str, Any]:
    c.refuse("decoder_sparse_step", 1, "every layer must be a MoE layer")
    c.refuse("mlp_only_layers", [], "every layer must be a MoE layer")
    moe = MoESpec(num_experts=c.int("num_experts"), topk=c.int("num_experts_per_tok"),
                  expert_ffn_hidden_size=c.int("moe_intermediate_size"), **_softmax_routing(c))
    return {**_qwen3(c), "moe": moe}


def _olmoe(c: HFConfig) -> dict[str, Any]:
    _no_bias(c)
    c.refuse("clip_qkv", None, "clipping q/k/v activations")
    shape = _decoder(c)
    if shape["num_query_groups"] != shape["num_attention_heads"]:
        raise ValueError(f"{c.path}: num_key_value_heads={shape['num_query_groups']} is not supported for OLMoE: "
                         "Megatron-Bridge's OLMoE attention builds its k norm over num_attention_heads heads.")
    moe = MoESpec(num_experts=c.int("num_experts"), topk=c.int("num_experts_per_tok"),
                  expert_ffn_hidden_size=shape["ffn_hidden_size"], **_softmax_routing(c))
    return {**shape, "activation": _activation(c, _SILU), "qk_layernorm": True, "qk_layernorm_per_head": False,
            "moe": moe}


_TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


def _deepseek(c: HFConfig) -> dict[str, Any]:
    c.refuse("moe_layer_freq", 1, "every layer after first_k_dense_replace must be a MoE layer")
    c.refuse("attention_bias", False, "bias on attention projections")
    heads = c.int("num_attention_heads")
    c.refuse("num_key_value_heads", heads, "MLA has one latent KV per layer; the published configs repeat the heads")
    experts, topk = c.int("n_routed_experts"), c.int("num_experts_per_tok")
    method = c.str("topk_method", "greedy", choices=_TOPK_METHODS)
    score: Literal["softmax", "sigmoid"] = (
        "sigmoid" if c.str("scoring_func", "softmax", choices=("softmax", "sigmoid")) == "sigmoid" else "softmax")
    groups, group_topk = c.int("n_group", 1), c.int("topk_group", 1)
    if method == "greedy" and (groups, group_topk) != (1, 1):
        raise ValueError(f"{c.path}: topk_method='greedy' routes without groups, but n_group={groups} and "
                         f"topk_group={group_topk} ask for group-limited routing.")
    if method == "noaux_tc" and score != "sigmoid":
        raise ValueError(f"{c.path}: topk_method='noaux_tc' (aux-loss-free expert bias) needs scoring_func='sigmoid' "
                         f"(megatron-core: moe_router_enable_expert_bias supports only sigmoid), but got {score!r}.")
    grouped = method != "greedy" and groups > 1
    scale = c.number("routed_scaling_factor", 1.0)
    norm_topk = c.bool("norm_topk_prob", False)
    if score == "sigmoid" and not norm_topk and topk > 1:
        raise ValueError(f"{c.path}: scoring_func='sigmoid' with norm_topk_prob=false is not supported "
                         "(megatron-core renormalises sigmoid top-k scores).")
    expert_ffn = c.int("moe_intermediate_size")
    moe = MoESpec(
        num_experts=experts, topk=topk, expert_ffn_hidden_size=expert_ffn,
        shared_expert_ffn_hidden_size=c.int("n_shared_experts", 0, minimum=0) * expert_ffn,
        first_dense_layers=c.int("first_k_dense_replace", 0, minimum=0),
        score_function=score,
        pre_softmax=score == "softmax" and not norm_topk,
        num_groups=groups if grouped else None, group_topk=group_topk if grouped else None,
        topk_scaling_factor=scale if scale != 1.0 else None, expert_bias=method == "noaux_tc",
    )
    mla = MLASpec(
        q_lora_rank=c.int("q_lora_rank", required=False),  # null in DeepSeek-V2-Lite: uncompressed queries
        kv_lora_rank=c.int("kv_lora_rank"),
        qk_head_dim=c.int("qk_nope_head_dim"),
        qk_pos_emb_head_dim=c.int("qk_rope_head_dim"),
        v_head_dim=c.int("v_head_dim"),
    )
    c.int("head_dim", required=False)  # transformers >= 5 writes qk_rope_head_dim here; MLA sizes come from above
    return dict(
        num_layers=c.int("num_hidden_layers"),
        hidden_size=c.int("hidden_size"),
        ffn_hidden_size=c.int("intermediate_size"),
        num_attention_heads=heads,
        vocab_size=c.int("vocab_size"),
        tied_embeddings=c.bool("tie_word_embeddings", False),
        activation=_activation(c, _SILU),
        qk_layernorm=True,  # MLA's q_layernorm / kv_layernorm on the compressed latents
        mtp_num_layers=c.int("num_nextn_predict_layers", 0, minimum=0),
        moe=moe,
        mla=mla,
    )


def _gemma(c: HFConfig, *, qk_norm: bool, pattern: int | None) -> dict[str, Any]:
    c.refuse("attention_bias", False, "bias on attention projections")
    shape = _decoder(c, tie_default=True)
    window = _window_from_layer_types(c, shape["num_layers"], pattern)
    old = c.int("sliding_window_size", required=False)  # early Gemma 2 configs repeat the window here
    if old is not None and old != window.get("sliding_window"):
        raise ValueError(f"{c.path}: sliding_window_size={old} disagrees with sliding_window="
                         f"{window.get('sliding_window')}.")
    return {**shape, **window, "activation": _activation(c, _GELU, "hidden_activation", "hidden_act"),
            "post_norms": True, "qk_layernorm": qk_norm,
            "attn_logit_softcapping": c.number("attn_logit_softcapping"),
            "final_logit_softcapping": c.number("final_logit_softcapping")}


def _gemma2(c: HFConfig) -> dict[str, Any]:
    return _gemma(c, qk_norm=False, pattern=2)  # Gemma2DecoderLayer: even layers sliding, odd layers global


def _gemma3(c: HFConfig) -> dict[str, Any]:
    pattern = c.int("sliding_window_pattern", 6)  # Gemma3TextConfig default
    return _gemma(c, qk_norm=True, pattern=pattern)


def _gemma3_multimodal(c: HFConfig) -> dict[str, Any]:
    raise ValueError(f"{c.path}: Gemma3ForConditionalGeneration is not supported: its SigLIP vision tower "
                     "(vision_config) and multimodal projector are not part of the GPT decoder megatron-core's "
                     "GPTModel builds. Give the text model's config (text_config, as a Gemma3ForCausalLM config.json).")


def _gpt_oss(c: HFConfig) -> dict[str, Any]:
    c.refuse("attention_bias", True, "GPT-OSS has bias on every linear layer (megatron-core's add_bias_linear)")
    shape = _decoder(c)
    topk = c.int("num_experts_per_tok")
    duplicate = c.int("experts_per_token", required=False)
    if duplicate is not None and duplicate != topk:
        raise ValueError(f"{c.path}: experts_per_token={duplicate} disagrees with num_experts_per_tok={topk}.")
    moe = MoESpec(num_experts=c.int("num_local_experts"), topk=topk, expert_ffn_hidden_size=shape["ffn_hidden_size"])
    return {**shape, **_window_from_layer_types(c, shape["num_layers"]), "activation": _activation(c, _SILU),
            "add_bias_linear": True, "softmax_type": "learnable", "moe": moe}


_BLOCK_SYMBOLS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}  # transformers NemotronHConfig


def _nemotron_pattern(c: HFConfig) -> str:
    """The hybrid pattern: `hybrid_override_pattern` (transformers 4 configs), else `layers_block_type`."""
    pattern = c.str("hybrid_override_pattern")
    blocks = c.list("layers_block_type")
    if pattern is None and blocks is not None:
        unknown = sorted(set(map(str, blocks)) - set(_BLOCK_SYMBOLS))
        if unknown:
            raise ValueError(f"{c.path}: layers_block_type has block types autotune does not model: {unknown}.")
        pattern = "".join(_BLOCK_SYMBOLS[b] for b in blocks)
    if not pattern:
        raise ValueError(f"{c.path}: missing key 'hybrid_override_pattern' (or 'layers_block_type'), which a "
                         "hybrid model needs.")
    if "/" in pattern or "|" in pattern:
        raise ValueError(f"{c.path}: hybrid_override_pattern {pattern!r} carries MTP ('/') or pipeline ('|') "
                         "separators; give the decoder's layers only (autotune chooses the pipeline split).")
    return pattern


def _nemotron_h(c: HFConfig) -> dict[str, Any]:
    pattern = _nemotron_pattern(c)
    layers = c.int("num_hidden_layers", len(pattern), required=False)
    if layers != len(pattern):
        raise ValueError(f"{c.path}: num_hidden_layers ({layers}) must equal the hybrid pattern's length "
                         f"({len(pattern)}).")
    c.refuse("mamba_proj_bias", False, "megatron-core's MambaMixer builds in_proj and out_proj without bias")
    c.refuse("use_conv_bias", True, "megatron-core's MambaMixer always has a conv1d bias")
    c.refuse("use_bias", False, "bias on every linear layer (megatron-core's add_bias_linear) in a hybrid model")
    _no_bias(c)
    c.refuse("mlp_hidden_act", "relu2", "Nemotron-H's MLPs are squared ReLU (Bridge's activation_func=squared_relu)")
    c.refuse("mamba_hidden_act", "silu", "megatron-core's MambaMixer applies SiLU")
    # LatentMoE (Nemotron-3 Super / Ultra): Bridge's NemotronHBridge passes `moe_latent_size` through to the provider
    latent = c.int("moe_latent_size", required=False, minimum=1)
    if c.int("num_nextn_predict_layers", 0, minimum=0, required=False):
        raise ValueError(f"{c.path}: num_nextn_predict_layers > 0 (multi-token prediction in a hybrid model): "
                         "the recipe sets the MTP depth (Bridge's Super and Lightning recipes: 2, one repeated '*E' "
                         "layer), so load the catalog's nemotron-3-super or nemotron-3.5-lightning, or drop the MTP "
                         "keys.")
    c.str("mtp_hybrid_override_pattern")
    c.list("mtp_layers_block_type")
    c.refuse("sliding_window", None, "sliding-window attention in a hybrid model")
    heads = c.int("num_attention_heads")
    hidden = c.int("hidden_size")
    head_dim = c.int("head_dim", required=False) or c.int("attention_head_dim", required=False)
    mamba_head_dim = c.int("mamba_head_dim", 64, required=False)
    mamba_heads = c.int("mamba_num_heads", required=False)
    if mamba_heads is None:  # MambaMixer: d_inner = expand * d_model, nheads = d_inner / headdim
        mamba_heads = c.int("expand", 2, required=False) * hidden // mamba_head_dim
    else:
        c.int("expand", 2, required=False)
    mamba = MambaSpec(num_heads=mamba_heads, head_dim=mamba_head_dim, state_dim=c.int("ssm_state_size", 128,
                      required=False), num_groups=c.int("n_groups", 8, required=False),
                      conv_kernel=c.int("conv_kernel", 4, required=False),
                      chunk_size=c.int("chunk_size", 128, required=False)) if "M" in pattern else None
    moe = None
    if "E" in pattern:
        shared = c.int("moe_shared_expert_intermediate_size", 0, minimum=0, required=False)
        c.int("n_shared_experts", 1, minimum=0, required=False)
        groups, group_topk = c.int("n_group", 1, required=False), c.int("topk_group", 1, required=False)
        c.bool("norm_topk_prob", True)
        moe = MoESpec(num_experts=c.int("n_routed_experts"), topk=c.int("num_experts_per_tok"),
                      expert_ffn_hidden_size=c.int("moe_intermediate_size"), shared_expert_ffn_hidden_size=shared,
                      score_function="sigmoid", expert_bias=True,
                      topk_scaling_factor=c.number("routed_scaling_factor"), num_groups=groups, group_topk=group_topk,
                      latent_size=latent)
    elif latent is not None:
        raise ValueError(f"{c.path}: moe_latent_size ({latent}) is set but the hybrid pattern has no MoE layer ('E').")
    return dict(
        num_layers=len(pattern), hybrid_pattern=pattern, hidden_size=hidden,
        ffn_hidden_size=c.int("intermediate_size", c.int("moe_intermediate_size", 1, required=False),
                              required=False),
        num_attention_heads=heads, num_query_groups=c.int("num_key_value_heads", heads),
        kv_channels=head_dim if head_dim is not None and head_dim * heads != hidden else None,
        vocab_size=c.int("vocab_size"), tied_embeddings=c.bool("tie_word_embeddings", False),
        gated_linear_unit=False, activation="squared_relu", mamba=mamba, moe=moe,
    )


_BUILDERS: dict[str, Callable[[HFConfig], dict[str, Any]]] = {
    "LlamaForCausalLM": _llama,
    "MistralForCausalLM": _mistral,
    "MixtralForCausalLM": _mixtral,
    "Phi3ForCausalLM": _phi3,
    "Qwen2ForCausalLM": _qwen2,
    "Qwen2MoeForCausalLM": _qwen2_moe,
    "Qwen3ForCausalLM": _qwen3,
    "Qwen3MoeForCausalLM": _qwen3_moe,
    "OlmoeForCausalLM": _olmoe,
    "DeepseekV2ForCausalLM": _deepseek,
    "DeepseekV3ForCausalLM": _deepseek,
    "Gemma2ForCausalLM": _gemma2,
    "Gemma3ForCausalLM": _gemma3,
    "Gemma3ForConditionalGeneration": _gemma3_multimodal,
    "GptOssForCausalLM": _gpt_oss,
    "NemotronHForCausalLM": _nemotron_h,
}
_MODEL_TYPES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
    "phi3": "Phi3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM", "gemma3": "Gemma3ForConditionalGeneration", "gpt_oss": "GptOssForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
}
# accepted architectures (Gemma3ForConditionalGeneration is recognised only to be refused with its reason)
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(a for a in _BUILDERS if a != "Gemma3ForConditionalGeneration")


def builder_for(data: Mapping[str, Any], path: Path) -> Callable[[HFConfig], dict[str, Any]]:
    names = data.get("architectures") or []
    if not isinstance(names, list):
        raise ValueError(f"{path}: architectures must be a list of class names, but got {names!r}.")
    model_type = data.get("model_type")
    if not names and isinstance(model_type, str) and model_type in _MODEL_TYPES:
        names = [_MODEL_TYPES[model_type]]
    for name in names:
        if name in _BUILDERS:
            return _BUILDERS[name]
    found = names or [f"model_type={model_type!r}"]
    raise ValueError(f"{path}: unsupported architecture {', '.join(map(str, found))}; "
                     f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}.")

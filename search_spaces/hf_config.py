"""`ModelSpec` from a local Hugging Face `config.json` (never the network).

Field mapping per architecture follows the `transformers` modelling code (`modeling_llama.py`,
`modeling_mixtral.py`, `modeling_qwen2.py`, `modeling_qwen3.py`, `modeling_qwen3_moe.py`,
`modeling_deepseek_v3.py`) and Megatron-Bridge's HF-to-Megatron config bridges. HF's
`max_position_embeddings` is the RoPE context length, not a learned table, so it is not carried over.
DeepSeek-V3's multi-token-prediction layers (`num_nextn_predict_layers`) are left out of the model, as in
the published parameter counts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from search_spaces.model import MLASpec, MoESpec, ModelSpec

__all__ = ["SUPPORTED_ARCHITECTURES", "model_from_hf_config"]


class _Config:
    """A config.json mapping that names the file and the key when a required key is missing."""

    def __init__(self, data: Mapping[str, Any], path: Path) -> None:
        self._data, self._path = data, path

    def need(self, key: str) -> Any:
        if self._data.get(key) is None:
            raise ValueError(f"{self._path}: missing key {key!r}, which this architecture needs.")
        return self._data[key]

    def get(self, key: str, default: Any = None) -> Any:
        value = self._data.get(key)
        return default if value is None else value

    def refuse(self, key: str, supported: Any, why: str) -> None:
        """Raise when `key` is set to something the ModelSpec cannot express."""
        value = self._data.get(key)
        if value is not None and value != supported:
            raise ValueError(f"{self._path}: {key}={value!r} is not supported ({why}); only {supported!r} is.")


def _gqa_shape(c: _Config, *, attention_bias_key: bool = True) -> dict[str, Any]:
    """The fields every Llama-style decoder shares: GQA attention, SwiGLU MLP, RMSNorm, RoPE.

    `attention_bias_key=False` for configs whose attention bias is fixed by the architecture (Qwen2).
    """
    heads = c.need("num_attention_heads")
    hidden = c.need("hidden_size")
    head_dim = c.get("head_dim")
    if attention_bias_key:
        c.refuse("attention_bias", False, "bias on q/k/v/o projections")
    c.refuse("mlp_bias", False, "bias on MLP projections")
    c.refuse("hidden_act", "silu", "the MLP is SwiGLU")
    return dict(
        num_layers=c.need("num_hidden_layers"),
        hidden_size=hidden,
        ffn_hidden_size=c.need("intermediate_size"),
        num_attention_heads=heads,
        num_query_groups=c.get("num_key_value_heads", heads),
        kv_channels=head_dim if head_dim is not None and head_dim != hidden // heads else None,
        vocab_size=c.need("vocab_size"),
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
    )


def _llama(c: _Config) -> dict[str, Any]:
    return _gqa_shape(c)


def _mixtral(c: _Config) -> dict[str, Any]:
    shape = _gqa_shape(c)
    moe = MoESpec(
        num_experts=c.need("num_local_experts"), topk=c.need("num_experts_per_tok"),
        expert_ffn_hidden_size=shape["ffn_hidden_size"],
    )
    return {**shape, "moe": moe}


def _qwen2(c: _Config) -> dict[str, Any]:
    # Qwen2Attention always has bias on q, k and v (not on o_proj): `attention_bias` is not in its config.
    return {**_gqa_shape(c, attention_bias_key=False), "add_qkv_bias": True}


def _qwen3(c: _Config) -> dict[str, Any]:
    return {**_gqa_shape(c), "qk_layernorm": True}


def _qwen3_moe(c: _Config) -> dict[str, Any]:
    c.refuse("decoder_sparse_step", 1, "every layer must be a MoE layer")
    c.refuse("mlp_only_layers", [], "every layer must be a MoE layer")
    moe = MoESpec(
        num_experts=c.need("num_experts"), topk=c.need("num_experts_per_tok"),
        expert_ffn_hidden_size=c.need("moe_intermediate_size"),
    )
    return {**_qwen3(c), "moe": moe}


def _deepseek_v3(c: _Config) -> dict[str, Any]:
    c.refuse("moe_layer_freq", 1, "every layer after first_k_dense_replace must be a MoE layer")
    c.refuse("hidden_act", "silu", "the MLP is SwiGLU")
    c.refuse("attention_bias", False, "bias on attention projections")
    expert_ffn = c.need("moe_intermediate_size")
    mla = MLASpec(
        q_lora_rank=c.get("q_lora_rank"),  # null in DeepSeek-V2-Lite: uncompressed queries
        kv_lora_rank=c.need("kv_lora_rank"),
        qk_head_dim=c.need("qk_nope_head_dim"),
        qk_pos_emb_head_dim=c.need("qk_rope_head_dim"),
        v_head_dim=c.need("v_head_dim"),
    )
    moe = MoESpec(
        num_experts=c.need("n_routed_experts"), topk=c.need("num_experts_per_tok"),
        expert_ffn_hidden_size=expert_ffn,
        shared_expert_ffn_hidden_size=c.get("n_shared_experts", 0) * expert_ffn,
        first_dense_layers=c.get("first_k_dense_replace", 0),
    )
    return dict(
        num_layers=c.need("num_hidden_layers"),
        hidden_size=c.need("hidden_size"),
        ffn_hidden_size=c.need("intermediate_size"),
        num_attention_heads=c.need("num_attention_heads"),
        vocab_size=c.need("vocab_size"),
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        qk_layernorm=True,  # MLA's q_layernorm / kv_layernorm on the compressed latents
        moe=moe,
        mla=mla,
    )


_BUILDERS: dict[str, Callable[[_Config], dict[str, Any]]] = {
    "LlamaForCausalLM": _llama,
    "MistralForCausalLM": _llama,
    "MixtralForCausalLM": _mixtral,
    "Qwen2ForCausalLM": _qwen2,
    "Qwen3ForCausalLM": _qwen3,
    "Qwen3MoeForCausalLM": _qwen3_moe,
    "DeepseekV3ForCausalLM": _deepseek_v3,
}
_MODEL_TYPES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_BUILDERS)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(f"Cannot read Hugging Face config {str(path)!r}: {err.strerror or err}.") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}.") from None
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ValueError(f"{path} must hold a JSON object (a Hugging Face config.json), but holds a {kind}.")
    return data


def _architecture(data: Mapping[str, Any], path: Path) -> str:
    names = data.get("architectures") or []
    if not names and data.get("model_type") in _MODEL_TYPES:
        names = [_MODEL_TYPES[data["model_type"]]]
    for name in names:
        if name in _BUILDERS:
            return name
    found = names or [f"model_type={data.get('model_type')!r}"]
    raise ValueError(
        f"{path}: unsupported architecture {', '.join(map(str, found))}; "
        f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}."
    )


def _model_name(data: Mapping[str, Any], path: Path) -> str:
    """The model's directory name for `<dir>/config.json`, else the file's stem."""
    stem = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return stem or str(data.get("_name_or_path", "hf-model"))


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Read a local config.json (or a directory holding one) into a ModelSpec.

    Raises ValueError naming the file for unreadable or invalid JSON, a missing key, a setting the
    ModelSpec cannot express, or an architecture outside `SUPPORTED_ARCHITECTURES`.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    data = _read_json(path)
    builder = _BUILDERS[_architecture(data, path)]
    return ModelSpec(name=_model_name(data, path), **builder(_Config(data, path)))

"""Immutable model specs and their exact parameter counts.

The counts follow megatron-core's GPT model as built with the local layer spec
(`megatron/core/models/gpt/gpt_layer_specs.py`): per layer an input norm, attention
(GQA `linear_qkv` + `linear_proj`, or MLA's down/up projections), a pre-MLP norm and
either a dense MLP (`linear_fc1` + `linear_fc2`, fc1 doubled when gated) or a MoE layer
(router + experts + optional shared experts). Counts here are unpadded (the published
convention); megatron pads the vocabulary to a multiple of 128 * TP, which the memory
model adds on top.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["MLASpec", "MoESpec", "ModelSpec"]


@dataclass(frozen=True, kw_only=True, slots=True)
class MoESpec:
    """Mixture-of-experts part of a model (megatron-core `num_moe_experts`, `moe_*`)."""

    num_experts: int
    topk: int
    expert_ffn_hidden_size: int
    shared_expert_ffn_hidden_size: int = 0  # total intermediate size of all shared experts
    first_dense_layers: int = 0  # DeepSeek's first_k_dense_replace: leading layers with a dense MLP
    shared_expert_gate: bool = False  # Qwen2-MoE's sigmoid gate on the shared expert

    def __post_init__(self) -> None:
        if not 1 <= self.topk <= self.num_experts:
            raise ValueError(
                f"`1 <= topk <= num_experts` must hold, but got (topk={self.topk}, num_experts={self.num_experts})."
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class MLASpec:
    """DeepSeek multi-latent attention (megatron-core `MLATransformerConfig`)."""

    q_lora_rank: int | None  # None: queries are not compressed (DeepSeek-V2-Lite)
    kv_lora_rank: int
    qk_head_dim: int  # the no-position part of each query/key head
    qk_pos_emb_head_dim: int  # the rotary part
    v_head_dim: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """A GPT-style decoder as megatron-core builds it. Field names follow `TransformerConfig`."""

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    vocab_size: int
    num_query_groups: int | None = None  # None: multi-head attention (groups == heads)
    kv_channels: int | None = None  # None: hidden_size // num_attention_heads
    gated_linear_unit: bool = True  # SwiGLU-style MLP: fc1 has two halves
    tied_embeddings: bool = False  # share_embeddings_and_output_weights
    add_bias_linear: bool = False  # biases on every linear layer (GPT-3 style)
    add_qkv_bias: bool = False  # bias on the QKV projection only (Qwen2)
    qk_layernorm: bool = False
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    max_position_embeddings: int = 0  # >0: learned absolute position embeddings (GPT-3); 0: RoPE
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    aliases: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"`{name} > 0` must hold, but got ({name}={value}) for model {self.name!r}.")
        if self.num_query_groups is not None and (
            self.num_query_groups <= 0 or self.num_attention_heads % self.num_query_groups != 0
        ):
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_query_groups ({self.num_query_groups}) for model {self.name!r}."
            )
        if self.mla is None and self.kv_channels is None and self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads}) unless kv_channels is given, for model {self.name!r}."
            )
        if self.moe is not None and self.moe.first_dense_layers >= self.num_layers:
            raise ValueError(
                f"`first_dense_layers < num_layers` must hold, but got "
                f"({self.moe.first_dense_layers}, {self.num_layers}) for model {self.name!r}."
            )

    # --- derived shape facts -------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def num_moe_layers(self) -> int:
        return 0 if self.moe is None else self.num_layers - self.moe.first_dense_layers

    @property
    def num_dense_mlp_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def _norm_params_per_dim(self) -> int:
        """RMSNorm has a weight per channel; LayerNorm a weight and a bias."""
        return 2 if self.normalization == "LayerNorm" else 1

    @property
    def _norm_params(self) -> int:
        return self.hidden_size * self._norm_params_per_dim

    # --- parameter counts per component (unpadded vocabulary) ------------------------------
    @property
    def embedding_params(self) -> int:
        """Word (and learned position) embeddings, held by the first pipeline stage."""
        return self.vocab_size * self.hidden_size + self.max_position_embeddings * self.hidden_size

    @property
    def output_params(self) -> int:
        """Final norm plus the output projection (a copy of the embedding when tied), held by the last stage."""
        return self._norm_params + self.vocab_size * self.hidden_size

    @property
    def attention_params(self) -> int:
        """One layer's attention block including its input norm."""
        h, d, a, g = self.hidden_size, self.head_dim, self.num_attention_heads, self.query_groups
        norm = self._norm_params
        if self.mla is not None:
            m = self.mla
            qk = m.qk_head_dim + m.qk_pos_emb_head_dim
            if m.q_lora_rank is None:
                q = h * a * qk
            else:  # linear_q_down_proj, q_layernorm, linear_q_up_proj
                q = h * m.q_lora_rank + m.q_lora_rank * self._norm_params_per_dim + m.q_lora_rank * a * qk
            kv = h * (m.kv_lora_rank + m.qk_pos_emb_head_dim)  # linear_kv_down_proj
            kv += m.kv_lora_rank * self._norm_params_per_dim  # kv_layernorm
            kv += m.kv_lora_rank * a * (m.qk_head_dim + m.v_head_dim)  # linear_kv_up_proj
            proj = a * m.v_head_dim * h
            bias = h if self.add_bias_linear else 0
            return norm + q + kv + proj + bias
        qkv = h * (a + 2 * g) * d
        proj = a * d * h
        bias = 0
        if self.add_bias_linear or self.add_qkv_bias:
            bias += (a + 2 * g) * d
        if self.add_bias_linear:
            bias += h
        qk_norm = 2 * d * self._norm_params_per_dim if self.qk_layernorm else 0  # q_layernorm + k_layernorm
        return norm + qkv + proj + bias + qk_norm

    def mlp_params(self, ffn: int) -> int:
        """One MLP (dense layer, one expert or the shared experts) of intermediate size `ffn`, no norm."""
        h = self.hidden_size
        fc1_out = 2 * ffn if self.gated_linear_unit else ffn
        weights = h * fc1_out + ffn * h
        bias = fc1_out + h if self.add_bias_linear else 0
        return weights + bias

    @property
    def dense_mlp_params(self) -> int:
        """One dense layer's MLP including its pre-MLP norm."""
        return self._norm_params + self.mlp_params(self.ffn_hidden_size)

    @property
    def expert_params(self) -> int:
        """One routed expert."""
        return 0 if self.moe is None else self.mlp_params(self.moe.expert_ffn_hidden_size)

    @property
    def moe_non_expert_params(self) -> int:
        """One MoE layer's parameters outside the routed experts: pre-MLP norm, router, shared experts."""
        if self.moe is None:
            return 0
        m = self.moe
        shared = self.mlp_params(m.shared_expert_ffn_hidden_size) if m.shared_expert_ffn_hidden_size else 0
        gate = self.hidden_size if m.shared_expert_gate else 0
        return self._norm_params + self.hidden_size * m.num_experts + shared + gate

    # --- totals -------------------------------------------------------------------------
    @property
    def dense_params(self) -> int:
        """Everything except routed experts: what TP/PP/DP shard (the 'dense' part)."""
        layers = self.num_layers * self.attention_params
        layers += self.num_dense_mlp_layers * self.dense_mlp_params
        layers += self.num_moe_layers * self.moe_non_expert_params
        output = self.output_params - (self.vocab_size * self.hidden_size if self.tied_embeddings else 0)
        return self.embedding_params + layers + output

    @property
    def routed_expert_params(self) -> int:
        """All routed experts of all MoE layers: what EP/ETP shard."""
        return 0 if self.moe is None else self.num_moe_layers * self.moe.num_experts * self.expert_params

    @property
    def total_params(self) -> int:
        return self.dense_params + self.routed_expert_params

    @property
    def active_params(self) -> int:
        """Parameters touched per token: dense part plus top-k of the routed experts."""
        if self.moe is None:
            return self.total_params
        return self.dense_params + self.num_moe_layers * self.moe.topk * self.expert_params

"""Immutable model specs and their exact parameter counts.

The counts follow megatron-core's GPT model as built with the local layer spec
(`megatron/core/models/gpt/gpt_layer_specs.py`): per layer an input norm, attention
(GQA `linear_qkv` + `linear_proj`, or MLA's down/up projections), a pre-MLP norm and
either a dense MLP (`linear_fc1` + `linear_fc2`, fc1 doubled when gated) or a MoE layer
(router + experts + optional shared experts). Counts here are unpadded (the published
convention); megatron pads the vocabulary to a multiple of 128 * TP, which the memory
model adds on top (`padded_vocab_size`).

Model features megatron-core builds with its own modules or Megatron-Bridge's, each counted as built:
- multi-token prediction (`mtp_num_layers`, `transformer/multi_token_prediction.py`): per MTP layer
  `enorm` and `hnorm` (norms), `eh_proj` (a column-parallel 2h -> h linear, no bias), one transformer
  layer with the spec of the decoder's last layer (a MoE layer for DeepSeek-V3) and a `final_layernorm`;
  its embedding and output head are the model's own (a copy on the MTP stage, see `placement.py`);
- Gemma 2/3's post-attention and post-feedforward norms (`post_norms`: Megatron-Bridge's
  `TERowParallelLinearLayerNorm`, a norm after `linear_proj` and after `linear_fc2`);
- OLMoE's full-width q/k norms (`qk_layernorm_per_head=False`: Megatron-Bridge's `OLMoESelfAttention`
  builds `q_layernorm` / `k_layernorm` over all heads instead of one head);
- GPT-OSS's attention sinks (`softmax_type="learnable"`: `DotProductAttention.softmax_offset`, one value
  per head) and biases on every linear including the router (`add_bias_linear`, `moe/router.py`).

Hybrid Mamba models (Nemotron-H, Nemotron-3; megatron-core `models/hybrid/hybrid_model.py`) set `hybrid_pattern`,
one symbol per decoder layer (`hybrid_layer_allocation.py::Symbols`): `M` a Mamba-2 layer (`ssm/mamba_layer.py`:
its norm and `MambaMixer`), `*` an attention-only `TransformerLayer` (input norm + attention, no MLP), `-` an
`MLPLayer` (pre-MLP norm + MLP) and `E` a MoE-only `TransformerLayer` (pre-MLP norm + router + experts). Each
layer is one block, so `num_layers == len(hybrid_pattern)` and the per-block counts below apply per symbol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["MLASpec", "MambaSpec", "MoESpec", "ModelSpec", "padded_vocab_size", "VOCAB_DIVISOR", "HYBRID_SYMBOLS"]

VOCAB_DIVISOR = 128  # Megatron-LM `--make-vocab-size-divisible-by` default
# megatron-core `models/hybrid/hybrid_layer_allocation.py::Symbols` that autotune models: Mamba, attention, MLP, MoE
# (GDN `G`, DSA `D` and MLA `+` layers are not modelled and are refused)
HYBRID_SYMBOLS = ("M", "*", "-", "E")


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = VOCAB_DIVISOR) -> int:
    """Megatron-LM's `_vocab_size_with_padding` (`megatron/training/tokenizer/tokenizer.py`): round up to a
    multiple of `divisible_by * TP`, so that `VocabParallelEmbedding` and the output layer split it evenly."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


@dataclass(frozen=True, kw_only=True, slots=True)
class MoESpec:
    """Mixture-of-experts part of a model (megatron-core `num_moe_experts`, `moe_*`)."""

    num_experts: int
    topk: int
    expert_ffn_hidden_size: int
    shared_expert_ffn_hidden_size: int = 0  # total intermediate size of all shared experts
    first_dense_layers: int = 0  # DeepSeek's first_k_dense_replace: leading layers with a dense MLP
    shared_expert_gate: bool = False  # Qwen2-MoE's sigmoid gate on the shared expert
    # routing (megatron-core `moe_router_*`; they change no parameter count, only what the router computes)
    score_function: Literal["softmax", "sigmoid"] = "softmax"  # moe_router_score_function
    pre_softmax: bool = False  # moe_router_pre_softmax: softmax over all experts before top-k (no renormalising)
    num_groups: int | None = None  # moe_router_num_groups: group-limited routing (DeepSeek's n_group)
    group_topk: int | None = None  # moe_router_group_topk: groups each token may use (DeepSeek's topk_group)
    topk_scaling_factor: float | None = None  # moe_router_topk_scaling_factor (DeepSeek's routed_scaling_factor)
    expert_bias: bool = False  # moe_router_enable_expert_bias: aux-loss-free balancing bias (a buffer, no parameter)
    # LatentMoE (megatron-core `moe_latent_size`, Nemotron-3 Super): the routed experts run in this width. The MoE
    # layer projects hidden -> latent before dispatch (`fc1_latent_proj`) and latent -> hidden after combine
    # (`fc2_latent_proj`), both TELinear(parallel_mode="duplicated"): a full copy on every TP rank, applied to the
    # rank's own (sequence-parallel) tokens (moe/moe_layer.py:264-296, 482-483, 584-585); the experts' fc1 takes and
    # fc2 returns the latent width (moe/experts.py:214-245, mlp.py:218-245); tokens are dispatched at the latent
    # width (token_dispatcher.py:1519-1522). The shared expert stays at the hidden width.
    latent_size: int | None = None

    def __post_init__(self) -> None:
        if self.latent_size is not None and self.latent_size <= 0:  # megatron/training/arguments.py:1981
            raise ValueError(f"MoE latent projection dimension has to be greater than zero, but got "
                             f"(moe_latent_size={self.latent_size}).")
        if not 1 <= self.topk <= self.num_experts:
            raise ValueError(
                f"`1 <= topk <= num_experts` must hold, but got (topk={self.topk}, num_experts={self.num_experts})."
            )
        if (self.num_groups is None) != (self.group_topk is None):
            raise ValueError(f"group-limited routing needs both num_groups and group_topk, but got "
                             f"(num_groups={self.num_groups}, group_topk={self.group_topk}).")
        # megatron-core transformer_config.py (__post_init__, moe_router_group_topk); both set, or neither (above)
        if self.num_groups is not None and self.group_topk is not None:
            if self.num_groups <= 0 or self.num_experts % self.num_groups:
                raise ValueError(f"num_moe_experts ({self.num_experts}) should be divisible by "
                                 f"moe_router_num_groups ({self.num_groups}).")
            if not 0 < self.group_topk <= self.num_groups:
                raise ValueError(f"moe_router_group_topk ({self.group_topk}) should be smaller than "
                                 f"moe_router_num_groups ({self.num_groups}).")
        if self.expert_bias and self.score_function != "sigmoid":
            raise ValueError("Expert bias for aux-loss-free routing only supports sigmoid score function "
                             f"(moe_router_enable_expert_bias with moe_router_score_function={self.score_function!r}).")


@dataclass(frozen=True, kw_only=True, slots=True)
class MLASpec:
    """DeepSeek multi-latent attention (megatron-core `MLATransformerConfig`)."""

    q_lora_rank: int | None  # None: queries are not compressed (DeepSeek-V2-Lite)
    kv_lora_rank: int
    qk_head_dim: int  # the no-position part of each query/key head
    qk_pos_emb_head_dim: int  # the rotary part
    v_head_dim: int


@dataclass(frozen=True, kw_only=True, slots=True)
class MambaSpec:
    """The Mamba-2 mixer of a hybrid model (megatron-core `ssm/mamba_mixer.py::MambaMixer`; `TransformerConfig`
    `mamba_num_heads`, `mamba_head_dim`, `mamba_state_dim`, `mamba_num_groups`; the mixer's `d_conv` and
    `chunk_size`). Symbols of Dao & Gu 2024 ("Transformers are SSMs", arXiv 2405.21060, Sec. 7-8): H heads of
    P channels (d_inner = H P), state size N, G groups of B and C, convolution width K, scan chunk Q."""

    num_heads: int  # H, mamba_num_heads
    head_dim: int  # P, mamba_head_dim
    state_dim: int  # N, mamba_state_dim
    num_groups: int  # G, mamba_num_groups
    conv_kernel: int = 4  # K, MambaMixer d_conv (HF conv_kernel)
    chunk_size: int = 128  # Q, MambaMixer chunk_size (HF chunk_size)

    def __post_init__(self) -> None:
        for name in ("num_heads", "head_dim", "state_dim", "num_groups", "conv_kernel", "chunk_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name} > 0` must hold, but got ({name}={getattr(self, name)}) for the Mamba mixer.")
        if self.num_heads % self.num_groups:  # mamba_mixer.py:272
            raise ValueError(f"nheads must be evenly divisible by ngroups, but got (mamba_num_heads={self.num_heads}, "
                             f"mamba_num_groups={self.num_groups}).")

    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal convolution: x, B and C (`conv_dim = d_inner + 2 G N`, mamba_mixer.py:317)."""
        return self.d_inner + 2 * self.num_groups * self.state_dim

    @property
    def in_proj_width(self) -> int:
        """Output width of `in_proj`: z, x, B, C and dt (`2 d_inner + 2 G N + H`, mamba_mixer.py:282)."""
        return 2 * self.d_inner + 2 * self.num_groups * self.state_dim + self.num_heads

    def mixer_params(self, h: int) -> int:
        """One `MambaMixer` (no layer norm): in_proj h x in_proj_width (no bias), conv1d weight conv_dim x K and
        bias conv_dim, dt_bias, A_log and D one per head (`D_has_hdim=False`), the gated RMSNorm's weight
        (d_inner) and out_proj d_inner x h (no bias); mamba_mixer.py:279-443."""
        return (h * self.in_proj_width + self.conv_dim * (self.conv_kernel + 1) + 3 * self.num_heads
                + self.d_inner + self.d_inner * h)


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
    mtp_num_layers: int = 0  # multi-token-prediction layers (DeepSeek-V3's num_nextn_predict_layers)
    # megatron-core `mtp_use_repeated_layer`: one MTP layer's parameters applied mtp_num_layers times
    # (transformer/multi_token_prediction.py:1741-1750; Nemotron-3 Super's recipes set it with mtp_num_layers=2)
    mtp_repeated_layer: bool = False
    # None is resolved: SiLU when gated (SwiGLU), else GeLU (GPT-3); "squared_relu": Nemotron-H's relu(x)^2
    activation: Literal["silu", "gelu", "squared_relu"] | None = None
    qk_layernorm_per_head: bool = True  # False: OLMoE's q/k norms over all heads (Megatron-Bridge OLMoESelfAttention)
    post_norms: bool = False  # Gemma 2/3: a norm after attention and after the MLP (post_layernorm)
    softmax_type: Literal["vanilla", "learnable"] = "vanilla"  # "learnable": GPT-OSS's attention sinks
    # attention variants that change no parameter count but the attention's cost (see docs/catalog.md)
    sliding_window: int | None = None  # tokens a sliding-window layer attends to (HF sliding_window)
    window_attn_skip_freq: int | None = None  # megatron-core: every N-th layer full attention; None: all windowed
    attn_logit_softcapping: float | None = None  # Gemma 2: tanh soft-capping of attention logits
    final_logit_softcapping: float | None = None  # Gemma 2: tanh soft-capping of the output logits
    # hybrid Mamba models (megatron-core HybridModel): one symbol of HYBRID_SYMBOLS per decoder layer, and the mixer
    hybrid_pattern: str | None = None  # hybrid_layer_pattern without '|' or '/' (HF hybrid_override_pattern)
    mamba: MambaSpec | None = None
    aliases: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.activation is None:
            object.__setattr__(self, "activation", "silu" if self.gated_linear_unit else "gelu")
        if self.activation not in ("silu", "gelu", "squared_relu"):
            raise ValueError(f"activation must be 'silu', 'gelu' or 'squared_relu', but got {self.activation!r} "
                             f"for model {self.name!r}.")
        self._check_hybrid()
        if self.moe is not None and self.moe.latent_size is not None and self.hybrid_pattern is None:
            raise ValueError(f"autotune models LatentMoE (moe_latent_size) in hybrid Mamba models only (Nemotron-3), "
                             f"for model {self.name!r}.")
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
        if self.mtp_num_layers < 0:
            raise ValueError(f"`mtp_num_layers >= 0` must hold, but got ({self.mtp_num_layers}) "
                             f"for model {self.name!r}.")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"`sliding_window > 0` (or unset) must hold, but got ({self.sliding_window}) "
                             f"for model {self.name!r}.")
        if self.window_attn_skip_freq is not None and (self.window_attn_skip_freq <= 0 or self.sliding_window is None):
            raise ValueError(f"window_attn_skip_freq ({self.window_attn_skip_freq}) needs a sliding_window and "
                             f"must be > 0, for model {self.name!r}.")

    def _check_hybrid(self) -> None:
        """A hybrid pattern as megatron-core parses it (`hybrid_layer_allocation.py::_validate_pattern`,
        `hybrid_model.py`), restricted to what autotune models."""
        p = self.hybrid_pattern
        if p is None:
            if self.mamba is not None:
                raise ValueError(f"a Mamba mixer needs a hybrid_pattern, for model {self.name!r}.")
            return
        bad = sorted(set(p) - set(HYBRID_SYMBOLS))
        if bad:
            raise ValueError(f"hybrid_pattern {p!r} has layer symbols autotune does not model: {bad} (it models "
                             f"M mamba, * attention, - mlp, E moe; pipe '|' and MTP '/' separators are layout, not "
                             f"model), for model {self.name!r}.")
        if len(p) != self.num_layers:
            raise ValueError(f"num_layers ({self.num_layers}) must equal the hybrid pattern's length ({len(p)}), "
                             f"for model {self.name!r}.")
        if ("M" in p) != (self.mamba is not None):
            raise ValueError(f"hybrid_pattern {p!r} has Mamba layers exactly when a Mamba mixer is given, "
                             f"for model {self.name!r}.")
        if ("E" in p) != (self.moe is not None):
            raise ValueError(f"hybrid_pattern {p!r} has MoE layers ('E') exactly when the model has a MoE spec, "
                             f"for model {self.name!r}.")
        if self.moe is not None and self.moe.first_dense_layers:
            raise ValueError(f"a hybrid model places its dense and MoE layers by its pattern, not first_dense_layers, "
                             f"for model {self.name!r}.")
        if self.mla is not None or self.post_norms or self.sliding_window is not None:
            raise ValueError(f"autotune models hybrid Mamba models without MLA, post-norms or sliding windows, for "
                             f"model {self.name!r}.")
        if self.mtp_num_layers and self.moe is None:
            raise ValueError(f"autotune models a hybrid model's MTP layers as '*E' (an attention and a MoE layer, "
                             f"Nemotron-3 Super's mtp_hybrid_override_pattern); a model without MoE has none, for "
                             f"model {self.name!r}.")

    # --- derived shape facts -------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def is_hybrid(self) -> bool:
        return self.hybrid_pattern is not None

    @property
    def expert_width(self) -> int:
        """The width the routed experts take and return and the tokens are dispatched at: the LatentMoE latent size
        (megatron-core `moe_latent_size`, token_dispatcher.py:1519-1522, moe/experts.py:214-245), else the hidden
        size."""
        if self.moe is not None and self.moe.latent_size is not None:
            return self.moe.latent_size
        return self.hidden_size

    @property
    def num_mamba_layers(self) -> int:
        return (self.hybrid_pattern or "").count("M")

    @property
    def num_attention_layers(self) -> int:
        """Layers with an attention block: every GPT layer, a hybrid model's `*` layers."""
        return self.num_layers if self.hybrid_pattern is None else self.hybrid_pattern.count("*")

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def num_moe_layers(self) -> int:
        if self.hybrid_pattern is not None:
            return self.hybrid_pattern.count("E")
        return 0 if self.moe is None else self.num_layers - self.moe.first_dense_layers

    @property
    def num_dense_mlp_layers(self) -> int:
        if self.hybrid_pattern is not None:
            return self.hybrid_pattern.count("-")
        return self.num_layers - self.num_moe_layers

    @property
    def mamba_layer_params(self) -> int:
        """One hybrid `M` layer: its norm (`MambaLayer.norm`, fused into in_proj with TE) and the mixer."""
        return 0 if self.mamba is None else self._norm_params + self.mamba.mixer_params(self.hidden_size)

    def is_sliding_window_layer(self, layer: int) -> bool:
        """Whether decoder layer `layer` (0-based) uses the sliding window: megatron-core's
        `is_layer_window_attention` (1-based layer_number % window_attn_skip_freq != 0)."""
        if self.sliding_window is None:
            return False
        return self.window_attn_skip_freq is None or (layer + 1) % self.window_attn_skip_freq != 0

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
            return norm + q + kv + proj + bias + self._sink_params + self._post_norm_params
        qkv = h * (a + 2 * g) * d
        proj = a * d * h
        bias = 0
        if self.add_bias_linear or self.add_qkv_bias:
            bias += (a + 2 * g) * d
        if self.add_bias_linear:
            bias += h
        return norm + qkv + proj + bias + self._qk_norm_params + self._sink_params + self._post_norm_params

    @property
    def _qk_norm_params(self) -> int:
        """q_layernorm + k_layernorm: one head wide each (megatron-core), or all query / key heads (OLMoE)."""
        if not self.qk_layernorm:
            return 0
        d = self.head_dim
        width = 2 * d if self.qk_layernorm_per_head else (self.num_attention_heads + self.query_groups) * d
        return width * self._norm_params_per_dim

    @property
    def _sink_params(self) -> int:
        """`softmax_offset`, one learnable logit per attention head (GPT-OSS's sinks)."""
        return self.num_attention_heads if self.softmax_type == "learnable" else 0

    @property
    def _post_norm_params(self) -> int:
        """Gemma's post-attention (or post-feedforward) norm, one per block when `post_norms`."""
        return self._norm_params if self.post_norms else 0

    def mlp_params(self, ffn: int, width: int | None = None) -> int:
        """One MLP (dense layer, one expert or the shared experts) of intermediate size `ffn`, no norm; its input
        and output width is `width` (a LatentMoE expert's latent size) or the hidden size."""
        h = self.hidden_size if width is None else width
        fc1_out = 2 * ffn if self.gated_linear_unit else ffn
        weights = h * fc1_out + ffn * h
        bias = fc1_out + h if self.add_bias_linear else 0
        return weights + bias

    @property
    def dense_mlp_params(self) -> int:
        """One dense layer's MLP including its pre-MLP norm (and Gemma's post-feedforward norm)."""
        return self._norm_params + self.mlp_params(self.ffn_hidden_size) + self._post_norm_params

    @property
    def expert_params(self) -> int:
        """One routed expert (its fc1 / fc2 in the latent width under LatentMoE, moe/experts.py:214-245)."""
        if self.moe is None:
            return 0
        return self.mlp_params(self.moe.expert_ffn_hidden_size, width=self.moe.latent_size)

    @property
    def latent_proj_params(self) -> int:
        """One MoE layer's two latent projections, h x L each, biased only with add_bias_linear
        (moe/moe_layer.py:273-296); 0 without LatentMoE."""
        if self.moe is None or self.moe.latent_size is None:
            return 0
        bias = self.moe.latent_size + self.hidden_size if self.add_bias_linear else 0
        return 2 * self.hidden_size * self.moe.latent_size + bias

    @property
    def moe_non_expert_params(self) -> int:
        """One MoE layer's parameters outside the routed experts: pre-MLP norm, router (with its bias when
        every linear has one, `moe/router.py`), shared experts."""
        if self.moe is None:
            return 0
        m = self.moe
        shared = self.mlp_params(m.shared_expert_ffn_hidden_size) if m.shared_expert_ffn_hidden_size else 0
        gate = self.hidden_size if m.shared_expert_gate else 0
        router = self.hidden_size * m.num_experts + (m.num_experts if self.add_bias_linear else 0)
        return self._norm_params + router + shared + gate + self.latent_proj_params + self._post_norm_params

    # --- multi-token prediction (transformer/multi_token_prediction.py, MultiTokenPredictionLayer) ---------
    @property
    def mtp_dense_params(self) -> int:
        """One MTP layer outside its routed experts: enorm + hnorm, eh_proj (2h -> h, no bias), the transformer
        layer (the spec of the decoder's last layer: a MoE layer when the model has one) and final_layernorm.
        Its embedding and output head are the model's (a copy on the MTP stage, counted in `placement.py`)."""
        h = self.hidden_size
        last_is_moe = self.moe is not None
        layer = self.attention_params + (self.moe_non_expert_params if last_is_moe else self.dense_mlp_params)
        return 3 * self._norm_params + 2 * h * h + layer

    @property
    def mtp_expert_params(self) -> int:
        """One MTP layer's routed experts (its MoE layer)."""
        return 0 if self.moe is None else self.moe.num_experts * self.expert_params

    @property
    def mtp_param_layers(self) -> int:
        """MTP layers that hold parameters: one when they repeat one layer (`mtp_use_repeated_layer`)."""
        return min(self.mtp_num_layers, 1) if self.mtp_repeated_layer else self.mtp_num_layers

    @property
    def mtp_params(self) -> int:
        """All MTP layers (left out of published totals: DeepSeek-V3's 671B excludes its 14B MTP module)."""
        return self.mtp_param_layers * (self.mtp_dense_params + self.mtp_expert_params)

    # --- totals -------------------------------------------------------------------------
    @property
    def dense_params(self) -> int:
        """Everything except routed experts: what TP/PP/DP shard (the 'dense' part)."""
        layers = self.num_attention_layers * self.attention_params + self.num_mamba_layers * self.mamba_layer_params
        layers += self.num_dense_mlp_layers * self.dense_mlp_params
        layers += self.num_moe_layers * self.moe_non_expert_params
        output = self.output_params - (self.vocab_size * self.hidden_size if self.tied_embeddings else 0)
        return self.embedding_params + layers + output + self.mtp_param_layers * self.mtp_dense_params

    @property
    def routed_expert_params(self) -> int:
        """All routed experts of all MoE layers (MTP layers' included): what EP/ETP shard."""
        if self.moe is None:
            return 0
        return (self.num_moe_layers + self.mtp_param_layers) * self.moe.num_experts * self.expert_params

    @property
    def total_params(self) -> int:
        return self.dense_params + self.routed_expert_params

    @property
    def active_params(self) -> int:
        """Parameters touched per token: dense part plus top-k of the routed experts."""
        if self.moe is None:
            return self.total_params
        return self.dense_params + (self.num_moe_layers + self.mtp_param_layers) * self.moe.topk * self.expert_params

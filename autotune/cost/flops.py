"""Model FLOPs, the MFU numerator: Megatron-LM's `num_floating_point_operations`, independent of the layout.

Recompute and other hardware work are not model FLOPs; the step time (`autotune/cost/throughput.py`) divides these
by the time to give model TFLOP/s and MFU, as Megatron-LM's logs and NVIDIA's performance tables do.
"""

from __future__ import annotations

from functools import lru_cache

from search_spaces.model import ModelSpec
from search_spaces.training import TrainingSpec

__all__ = ["padded_vocab_size", "forward_flops_per_token", "hybrid_forward_flops_per_token", "model_flops_per_step",
           "VOCAB_DIVISOR"]

VOCAB_DIVISOR = 128  # Megatron-LM --make-vocab-size-divisible-by default


def padded_vocab_size(model: ModelSpec) -> int:
    """V padded to a multiple of 128 (Megatron-LM `make_vocab_size_divisible_by`, TP=1 so MFU is layout-free)."""
    return -(-model.vocab_size // VOCAB_DIVISOR) * VOCAB_DIVISOR


def _attention_forward_flops_per_token(model: ModelSpec, s: int) -> float:
    """Forward FLOPs of one attention block per token, causal (half of the s x s scores are computed)."""
    h, a = model.hidden_size, model.num_attention_heads
    if model.mla is not None:
        x = model.mla
        qk = x.qk_head_dim + x.qk_pos_emb_head_dim
        q = h * a * qk if x.q_lora_rank is None else x.q_lora_rank * (h + a * qk + 1)
        kv = x.kv_lora_rank * (h + a * (x.qk_head_dim + x.v_head_dim) + 1) + h * x.qk_pos_emb_head_dim
        proj = a * x.v_head_dim * h
        core = 0.5 * s * a * (qk + x.v_head_dim)
        return 2.0 * (q + kv + proj + core)
    d, g = model.head_dim, model.query_groups
    qkv_proj = h * (a + 2 * g) * d + a * d * h
    core = 0.5 * s * a * d * 2  # QK^T and PV, causal halving
    return 2.0 * (qkv_proj + core)


def hybrid_forward_flops_per_token(model: ModelSpec, s: int) -> float:
    """Forward FLOPs per token of a hybrid model as Megatron-Bridge 0.6's `training/utils/flop_utils.py::hybrid_flops`
    counts them (Megatron-LM `megatron/training/training.py::hybrid_flops` alike), per symbol of the pattern:
    - `*`: 4 h p (h + h g / a) + 2 h p s with p = d a / h (`attn_layer_flops`: no causal halving);
    - `M`: 2 h (2 d_in + 2 G N + H) + 7 d_in N + 2 d_in h with d_in = 2 h (`mamba_layer_flops` takes d_in = 2 h
      whatever `mamba_num_heads * mamba_head_dim` is, the published figures' convention; the step time uses the
      real widths, `mamba_time.py`);
    - `-`: 4 h f (`mlp_layer_flops`, f = ffn_hidden_size, 3/2 of it for a gated MLP);
    - `E`: 4 h (k f_e + f_s) (`moe_layer_flops`, 3/2 of it gated); with LatentMoE (`moe_latent_size` L) the routed
      part runs at L and the two projections add 4 h L: 4 L k f_e + 4 h L + 4 h f_s (`moe_layer_flops`'s latent
      branch); logits 2 h V (padded V).
    Hybrid MTP (Nemotron-3 Super): `get_hybrid_layer_counts` counts each MTP depth's pattern (`*E`) once per depth
    (megatron-core `models/hybrid/hybrid_layer_allocation.py`), and the logits are counted (1 + mtp_num_layers)
    times; `eh_proj` and the MTP norms are not counted (`hybrid_flops`)."""
    h, a, g, d = model.hidden_size, model.num_attention_heads, model.query_groups, model.head_dim
    gate = 1.5 if model.gated_linear_unit else 1.0
    p = d * a / h
    attention = 4 * h * p * (h + h * g / a) + 2 * h * p * s
    mamba = 0.0
    if model.mamba is not None:
        m, d_in = model.mamba, 2 * h
        mamba = 2 * h * (2 * d_in + 2 * m.num_groups * m.state_dim + m.num_heads) + 7 * d_in * m.state_dim \
            + 2 * d_in * h
    mlp = 4 * h * model.ffn_hidden_size * gate
    moe = 0.0
    if model.moe is not None:
        x = model.moe
        if x.latent_size is None:
            moe = 4 * h * (x.topk * x.expert_ffn_hidden_size + x.shared_expert_ffn_hidden_size) * gate
        else:
            moe = (4 * x.latent_size * x.topk * x.expert_ffn_hidden_size * gate + 4 * h * x.latent_size
                   + 4 * h * x.shared_expert_ffn_hidden_size * gate)
    mtp = model.mtp_num_layers  # each an attention and a MoE layer ('*E'), ModelSpec._check_hybrid
    return ((model.num_attention_layers + mtp) * attention + model.num_mamba_layers * mamba
            + model.num_dense_mlp_layers * mlp + (model.num_moe_layers + mtp) * moe
            + (1 + mtp) * 2.0 * h * padded_vocab_size(model))


def forward_flops_per_token(model: ModelSpec, seq_length: int) -> float:
    """Forward FLOPs per token, Megatron-LM `num_floating_point_operations` / (3 * B * s).

    Per layer: GQA/MLA projections 2*h*(a+2g)*d + 2*a*d*h, causal attention core 2*s*a*d
    (QK^T and PV, halved for causality), MLP 2*h*f*(3 if gated else 2) for dense layers, and
    top-k routed experts plus shared experts for MoE layers; logits 2*h*V (padded V). Router,
    norms and embeddings are not counted (as in Megatron-LM).

    Multi-token prediction (core_v0.16.1 `megatron/training/training.py:354-360, 553-572`): each MTP layer counts
    as one more layer of the decoder's last kind (attention and a MoE or dense MLP), plus its norms and `eh_proj`
    2*(3h + 2h^2), plus one more logits GEMM 2*h*V.
    """
    if model.is_hybrid:
        return hybrid_forward_flops_per_token(model, seq_length)
    h = model.hidden_size
    gate = 3 if model.gated_linear_unit else 2
    mtp = model.mtp_num_layers
    attention = (model.num_layers + mtp) * _attention_forward_flops_per_token(model, seq_length)
    dense_mlp_layer = 2.0 * h * model.ffn_hidden_size * gate
    dense_mlp = model.num_dense_mlp_layers * dense_mlp_layer
    moe_mlp = 0.0
    if model.moe is not None:
        x = model.moe
        per_layer = 2.0 * h * gate * (x.topk * x.expert_ffn_hidden_size + x.shared_expert_ffn_hidden_size)
        moe_mlp = (model.num_moe_layers + mtp) * per_layer
    else:
        dense_mlp += mtp * dense_mlp_layer
    mtp_proj = mtp * 2.0 * (3 * h + 2 * h * h)
    logits = (1 + mtp) * 2.0 * h * padded_vocab_size(model)
    return attention + dense_mlp + moe_mlp + mtp_proj + logits


@lru_cache(maxsize=256)
def model_flops_per_step(model: ModelSpec, training: TrainingSpec) -> float:
    """Model FLOPs of one iteration: 3 (forward, dgrad, wgrad) * forward FLOPs/token * GBS * s.

    Megatron-LM `num_floating_point_operations(args, batch_size)` (megatron/training/training.py,
    recent versions with causal attention); Narayanan et al. 2021 Appendix for the 3x. Recompute
    is hardware work, not model FLOPs, so it is not counted here.
    """
    tokens = training.global_batch_size * training.seq_length
    return 3.0 * forward_flops_per_token(model, training.seq_length) * tokens

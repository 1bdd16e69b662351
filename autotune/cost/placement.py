"""Where the parameters are: per pipeline stage, per GPU of that stage, as megatron-core 0.16.1 places them.

One placement serves both cost models (memory: weights, gradients, optimizer state per stage; step time: the
DP gradient reduction and the optimizer step of the heaviest stage).

Conventions (megatron-core 0.16): the vocabulary is padded to a multiple of 128 * TP
(`make_vocab_size_divisible_by`), the word embedding lives in the first stage's first chunk and the output
layer in the last stage's last chunk (a tied copy there when PP > 1), layers are split over the PP * VPP
model chunks as `Layout.chunk_layer_counts` says (even, uneven, or embedding + loss counted as layers), and
MoE models' leading dense layers land wherever the split puts them (stage 0 for DeepSeek-V3).
Sources: `models/gpt/gpt_model.py`, `transformer/attention.py`, `transformer/multi_latent_attention.py`,
`transformer/mlp.py`, `transformer/moe/`, Megatron-LM `_vocab_size_with_padding`. Checked exactly against real
megatron-core models in `tests/test_memory_megatron_params.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from search_spaces.layout import Layout
from search_spaces.model import ModelSpec

__all__ = ["StageParams", "stage_params", "heaviest_stage", "chunk_layer_counts", "padded_vocab_size",
           "pipeline_split", "Split", "EVEN", "VOCAB_DIVISOR"]

VOCAB_DIVISOR = 128  # megatron `--make-vocab-size-divisible-by` default


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = VOCAB_DIVISOR) -> int:
    """Megatron's `_vocab_size_with_padding`: round up to a multiple of `divisible_by * TP`."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


Split = tuple[int | None, int | None, bool]  # (first_stage_layers, last_stage_layers, embedding_loss_split)
EVEN: Split = (None, None, False)


def pipeline_split(layout: Layout) -> Split:
    """The layout's pipeline split fields, as a hashable cache key."""
    return (layout.first_stage_layers, layout.last_stage_layers, layout.embedding_loss_split)


@lru_cache(maxsize=4096)
def chunk_layer_counts(num_layers: int, pp: int, vpp: int = 1, split: Split = EVEN) -> tuple[int, ...]:
    """Transformer layers in each of the PP * VPP model chunks, in model order (chunk k on stage k % PP).

    Exactly `Layout.chunk_layer_counts`: megatron-core's even split, its uneven split
    (`num_layers_in_first/last_pipeline_stage`) or its embedding+loss split
    (`account_for_embedding/loss_in_pipeline_split`), from `transformer_config.py` / `get_num_layers_to_build`.
    """
    first, last, embedding_loss = split
    layout = Layout(pp=pp, vpp=vpp if vpp > 1 else None, first_stage_layers=first, last_stage_layers=last,
                    embedding_loss_split=embedding_loss)
    return layout.chunk_layer_counts(num_layers)


@dataclass(frozen=True, kw_only=True, slots=True)
class StageParams:
    """Parameters of one pipeline stage (all its VPP chunks). `*_per_gpu` is what one GPU of the stage holds:
    dense parameters after the TP split (replicated norms, routers and row-parallel biases counted whole),
    expert parameters after the EP * ETP split. `dense_params` / `expert_params` are the unsplit stage totals
    (padded vocabulary). `gemm_params_per_gpu` counts transformer-layer GEMM weights only (FP8 caches)."""

    stage: int
    layers: int
    moe_layers: int
    has_embedding: bool
    has_output: bool
    dense_params: int
    expert_params: int
    dense_params_per_gpu: int
    expert_params_per_gpu: int
    gemm_params_per_gpu: int

    @property
    def params_per_gpu(self) -> int:
        return self.dense_params_per_gpu + self.expert_params_per_gpu


def _attention_params_per_gpu(model: ModelSpec, tp: int, mla_down_split: bool = False) -> tuple[int, int]:
    """One layer's attention block incl. input norm on one TP rank: (all params, GEMM weights).

    Column-parallel `linear_qkv` (weight and bias split), row-parallel `linear_proj` (bias replicated),
    norms and qk-layernorm replicated (`megatron/core/transformer/attention.py`). MLA follows the
    Transformer Engine spec: `linear_q_down_proj` / `linear_kv_down_proj` are duplicated on every TP rank
    (`parallel_mode='duplicated'`), the up projections are column-parallel (`multi_latent_attention.py`);
    `mla_down_split` counts the local spec instead, where the down projections are column-parallel too."""
    h, d, a, g = model.hidden_size, model.head_dim, model.num_attention_heads, model.query_groups
    per_dim = _norm_params_per_dim(model)
    norm = h * per_dim
    proj_bias = h if model.add_bias_linear else 0
    if model.mla is not None:
        m = model.mla
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        if m.q_lora_rank is None:
            q_gemm_rep, q_norm, q_split = 0, 0, h * a * qk
        else:
            q_gemm_rep, q_norm, q_split = h * m.q_lora_rank, m.q_lora_rank * per_dim, m.q_lora_rank * a * qk
        kv_gemm_rep, kv_norm = h * (m.kv_lora_rank + m.qk_pos_emb_head_dim), m.kv_lora_rank * per_dim
        kv_split = m.kv_lora_rank * a * (m.qk_head_dim + m.v_head_dim)
        proj = a * m.v_head_dim * h
        down = q_gemm_rep + kv_gemm_rep
        gemm = (down // tp if mla_down_split else down) + (q_split + kv_split + proj) // tp
        return norm + gemm + q_norm + kv_norm + proj_bias, gemm
    qkv = h * (a + 2 * g) * d
    proj = a * d * h
    qkv_bias = (a + 2 * g) * d if (model.add_bias_linear or model.add_qkv_bias) else 0
    qk_norm = 2 * d * per_dim if model.qk_layernorm else 0
    gemm = (qkv + proj) // tp
    return norm + gemm + qkv_bias // tp + proj_bias + qk_norm, gemm


def _norm_params_per_dim(model: ModelSpec) -> int:
    """RMSNorm keeps a weight per channel, LayerNorm a weight and a bias."""
    return 2 if model.normalization == "LayerNorm" else 1


def _mlp_params_per_gpu(model: ModelSpec, ffn: int, tp: int) -> tuple[int, int]:
    """One MLP of intermediate size `ffn` on one rank of a `tp`-way split, no norm: (all params, GEMM weights).
    fc1 column-parallel (doubled when gated; weight and bias split), fc2 row-parallel (bias replicated)."""
    h = model.hidden_size
    fc1_out = 2 * ffn if model.gated_linear_unit else ffn
    gemm = (h * fc1_out + ffn * h) // tp
    bias = fc1_out // tp + h if model.add_bias_linear else 0
    return gemm + bias, gemm


@lru_cache(maxsize=4096)
def _layer_params_per_gpu(model: ModelSpec, tp: int, ep: int, etp: int, mla_down_split: bool) -> dict[str, int]:
    """Per-GPU parameter counts of the building blocks for one (TP, EP, ETP)."""
    norm = model.hidden_size * _norm_params_per_dim(model)
    attn, attn_gemm = _attention_params_per_gpu(model, tp, mla_down_split)
    dense_mlp, dense_mlp_gemm = _mlp_params_per_gpu(model, model.ffn_hidden_size, tp)
    out = {
        "attention": attn, "attention_gemm": attn_gemm,
        "dense_mlp": norm + dense_mlp, "dense_mlp_gemm": dense_mlp_gemm,
        "moe_dense": 0, "moe_dense_gemm": 0, "experts": 0, "experts_gemm": 0,
    }
    if model.moe is not None:
        m = model.moe
        shared, shared_gemm = (0, 0)
        if m.shared_expert_ffn_hidden_size:
            shared, shared_gemm = _mlp_params_per_gpu(model, m.shared_expert_ffn_hidden_size, tp)
        gate = model.hidden_size if m.shared_expert_gate else 0
        router = model.hidden_size * m.num_experts  # replicated on every rank (`moe/router.py`)
        out["moe_dense"] = norm + router + shared + gate
        out["moe_dense_gemm"] = shared_gemm
        expert, expert_gemm = _mlp_params_per_gpu(model, m.expert_ffn_hidden_size, etp)
        local_experts = m.num_experts // ep
        out["experts"] = local_experts * expert
        out["experts_gemm"] = local_experts * expert_gemm
    return out


@lru_cache(maxsize=4096)
def _stage_params_cached(model: ModelSpec, tp: int, pp: int, vpp: int, ep: int, etp: int, split: Split,
                         divisible_by: int, mla_down_split: bool) -> tuple[StageParams, ...]:
    counts = chunk_layer_counts(model.num_layers, pp, vpp, split)
    blocks = _layer_params_per_gpu(model, tp, ep, etp, mla_down_split)
    unsplit = _layer_params_per_gpu(model, 1, 1, 1, mla_down_split)
    h = model.hidden_size
    vocab = padded_vocab_size(model.vocab_size, tp, divisible_by)
    first_dense = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    norm = h * _norm_params_per_dim(model)
    stages = []
    for p in range(pp):
        layers = moe_layers = 0
        start = 0
        for k, n in enumerate(counts):
            if k % pp == p:
                layers += n
                moe_layers += max(0, start + n - max(start, first_dense)) if model.moe is not None else 0
            start += n
        dense_layers = layers - moe_layers
        has_emb, has_out = p == 0, p == pp - 1
        dense_gpu = layers * blocks["attention"] + dense_layers * blocks["dense_mlp"]
        dense_gpu += moe_layers * blocks["moe_dense"]
        dense_all = layers * unsplit["attention"] + dense_layers * unsplit["dense_mlp"]
        dense_all += moe_layers * unsplit["moe_dense"]
        if has_emb:  # VocabParallelEmbedding rows split over TP; learned positions replicated
            dense_gpu += vocab // tp * h + model.max_position_embeddings * h
            dense_all += vocab * h + model.max_position_embeddings * h
        if has_out:  # final norm + column-parallel output layer (a tied copy when PP > 1)
            output = 0 if (model.tied_embeddings and pp == 1) else vocab * h
            dense_gpu += norm + output // tp
            dense_all += norm + output
        gemm = layers * blocks["attention_gemm"] + dense_layers * blocks["dense_mlp_gemm"]
        gemm += moe_layers * (blocks["moe_dense_gemm"] + blocks["experts_gemm"])
        stages.append(StageParams(
            stage=p, layers=layers, moe_layers=moe_layers, has_embedding=has_emb, has_output=has_out,
            dense_params=dense_all, expert_params=moe_layers * unsplit["experts"],
            dense_params_per_gpu=dense_gpu, expert_params_per_gpu=moe_layers * blocks["experts"],
            gemm_params_per_gpu=gemm,
        ))
    return tuple(stages)


def stage_params(model: ModelSpec, layout: Layout, *, make_vocab_size_divisible_by: int = VOCAB_DIVISOR,
                 mla_down_proj_split: bool = False) -> list[StageParams]:
    """Parameters per pipeline stage and per GPU of that stage (what a real megatron-core rank holds).

    `mla_down_proj_split=False` is the Transformer Engine spec (GPU runs: MLA down projections duplicated on
    every TP rank); True is the local spec the CPU proxy builds (they are column-parallel there)."""
    return list(_stage_params_cached(model, layout.tp, layout.pp, layout.vpp_size, layout.ep, layout.expert_tp,
                                     pipeline_split(layout), make_vocab_size_divisible_by, mla_down_proj_split))


def heaviest_stage(stages: list[StageParams] | tuple[StageParams, ...]) -> StageParams:
    """The stage whose GPUs hold the most parameters (ties: the earlier stage): it paces the DP gradient
    reduction and the optimizer step."""
    return max(stages, key=lambda s: (s.params_per_gpu, -s.stage))

"""Where the parameters are: per pipeline stage, per GPU of that stage, as megatron-core 0.16.1 places them.

One placement serves both cost models (memory: weights, gradients, optimizer state per stage; step time: the
DP gradient reduction and the optimizer step of the heaviest stage).

Conventions (megatron-core 0.16): the vocabulary is padded to a multiple of 128 * TP
(`make_vocab_size_divisible_by`), the word embedding lives in the first stage's first chunk and the output
layer in the last stage's last chunk (a tied copy there when PP > 1), layers are split over the PP * VPP
model chunks as `Layout.chunk_layer_counts` says (even, uneven, or embedding + loss counted as layers), and
MoE models' leading dense layers land wherever the split puts them (stage 0 for DeepSeek-V3).
A `pipeline_model_parallel_layout` string places layers and MTP layers itself (`Layout.chunk_layer_counts`,
`Layout.chunk_mtp_counts`). Multi-token-prediction layers sit on the last chunk without a string
(`get_mtp_num_layers_to_build`); a chunk holding MTP builds its own copy of the word embedding unless it is
the first chunk (`GPTModel.__init__`: `if self.pre_process or self.mtp_process: self.embedding = ...`).
A hybrid model (`ModelSpec.hybrid_pattern`, megatron-core `models/hybrid/`) is split the same way
(`hybrid_layer_allocation.py::select_pipeline_segment` without '|': even, or first/last stage layers) and each
stage holds its slice of the pattern: `M` layers (norm replicated; in_proj, conv1d, dt_bias, A_log, D, the gated
norm and out_proj split over TP, `ssm/mamba_mixer.py`), `*` attention-only, `-` MLP-only and `E` MoE-only layers.
Sources: `models/gpt/gpt_model.py`, `transformer/attention.py`, `transformer/multi_latent_attention.py`,
`transformer/mlp.py`, `transformer/moe/`, Megatron-LM `_vocab_size_with_padding`. Checked exactly against real
megatron-core models in `tests/test_memory_megatron_params.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.model import VOCAB_DIVISOR, ModelSpec, padded_vocab_size

__all__ = ["StageParams", "stage_params", "heaviest_stage", "chunk_layer_counts", "chunk_mtp_counts", "chunk_kinds",
           "bf16_chunk_kinds", "bf16_stage_layers", "final_norm_chunk", "layer_gemm_params_per_gpu",
           "padded_vocab_size", "pipeline_split", "Split", "EVEN", "VOCAB_DIVISOR", "fsdp_unit_params_per_gpu",
           "nonunit_params_per_gpu"]

# (first_stage_layers, last_stage_layers, embedding_loss_split, pipeline_layout); 3-tuples (no layout string)
# are accepted too
Split = tuple[int | None, int | None, bool, str | None]
EVEN: Split = (None, None, False, None)


def pipeline_split(layout: Layout) -> Split:
    """The layout's pipeline split fields, as a hashable cache key."""
    return (layout.first_stage_layers, layout.last_stage_layers, layout.embedding_loss_split, layout.pipeline_layout)


def _split_layout(pp: int, vpp: int, split: tuple) -> Layout:
    first, last, embedding_loss, *rest = split
    return Layout(pp=pp, vpp=vpp if vpp > 1 else None, first_stage_layers=first, last_stage_layers=last,
                  embedding_loss_split=embedding_loss, pipeline_layout=rest[0] if rest else None)


@lru_cache(maxsize=4096)
def chunk_layer_counts(num_layers: int, pp: int, vpp: int = 1, split: Split = EVEN) -> tuple[int, ...]:
    """Transformer layers in each of the PP * VPP model chunks, in model order (chunk k on stage k % PP).

    Exactly `Layout.chunk_layer_counts`: megatron-core's even split, its uneven split
    (`num_layers_in_first/last_pipeline_stage`), its embedding+loss split
    (`account_for_embedding/loss_in_pipeline_split`) or a `pipeline_model_parallel_layout` string, from
    `transformer_config.py` / `get_num_layers_to_build`.
    """
    return _split_layout(pp, vpp, split).chunk_layer_counts(num_layers)


@lru_cache(maxsize=4096)
def chunk_mtp_counts(mtp_layers: int, pp: int, vpp: int = 1, split: Split = EVEN) -> tuple[int, ...]:
    """MTP layers in each model chunk (`Layout.chunk_mtp_counts`)."""
    return _split_layout(pp, vpp, split).chunk_mtp_counts(mtp_layers)


@dataclass(frozen=True, kw_only=True, slots=True)
class StageParams:
    """Parameters of one pipeline stage (all its VPP chunks). `*_per_gpu` is what one GPU of the stage holds:
    dense parameters after the TP split (replicated norms, routers and row-parallel biases counted whole),
    expert parameters after the EP * ETP split. `dense_params` / `expert_params` are the unsplit stage totals
    (padded vocabulary). `gemm_params_per_gpu` counts transformer-layer GEMM weights only (FP8 caches).
    `layers` / `moe_layers` count decoder layers; `mtp_layers` the stage's multi-token-prediction layers
    (their parameters, and the embedding copy their chunk builds, are in the totals)."""

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
    mtp_layers: int = 0
    mamba_layers: int = 0  # hybrid `M` layers
    attention_layers: int = 0  # hybrid `*` (attention-only) layers; 0 for a GPT model, whose every layer has one

    @property
    def params_per_gpu(self) -> int:
        return self.dense_params_per_gpu + self.expert_params_per_gpu

    @property
    def dense_layers(self) -> int:
        """Layers with a dense MLP: a GPT model's attention + MLP layers, a hybrid model's `-` layers."""
        return self.layers - self.moe_layers - self.mamba_layers - self.attention_layers


def final_norm_chunk(counts: tuple[int, ...], has_mtp: bool) -> int:
    """The model chunk that holds the decoder's final norm: the post-process chunk, or with MTP the chunk of the
    last decoder layer (megatron-core `TransformerBlock.has_final_layernorm_in_this_stage`)."""
    if has_mtp:
        return max((k for k, n in enumerate(counts) if n), default=len(counts) - 1)
    return len(counts) - 1


def chunk_kinds(pattern: str | None, first_dense: int, start: int, n: int) -> tuple[int, int, int, int]:
    """(dense, MoE, Mamba, attention-only) layers of the chunk of `n` layers from `start`: a GPT model's by its
    first dense layers (Mamba and attention-only 0), a hybrid model's `-`, `E`, `M` and `*` symbols there."""
    if pattern is None:
        dense = max(0, min(start + n, first_dense) - start)
        return dense, n - dense, 0, 0
    part = pattern[start:start + n]
    return part.count("-"), part.count("E"), part.count("M"), part.count("*")


def bf16_chunk_kinds(pattern: str | None, first_dense: int, num_layers: int, edges: tuple[int, int], start: int,
                     n: int) -> tuple[int, int, int, int]:
    """`chunk_kinds` of the chunk's layers that run in BF16 in a low-precision run: the decoder's first `edges[0]`
    and last `edges[1]` layers by global index (megatron-core `fp8_utils.py::is_first_last_bf16_layer`,
    `fp4_utils.py::get_fp4_context`: `layer_no < num_layers_at_start_in_bf16` or `layer_no >= num_layers -
    num_layers_at_end_in_bf16`)."""
    head_end = min(start + n, edges[0])
    tail_start = max(start, head_end, num_layers - edges[1])
    head = chunk_kinds(pattern, first_dense, start, head_end - start) if head_end > start else (0, 0, 0, 0)
    tail = chunk_kinds(pattern, first_dense, tail_start, start + n - tail_start) if start + n > tail_start \
        else (0, 0, 0, 0)
    return (head[0] + tail[0], head[1] + tail[1], head[2] + tail[2], head[3] + tail[3])


def bf16_stage_layers(job: Job, layout: Layout) -> tuple[tuple[int, int, int, int, int], ...]:
    """Per pipeline stage, its layers that run in BF16 in this low-precision run, as (dense, MoE, Mamba,
    attention-only, MTP) counts: the decoder's edge layers (`TrainingSpec.bf16_edges`, `bf16_chunk_kinds`) and
    the MTP layers when they run in BF16 (`Job.mtp_in_bf16`)."""
    return _bf16_stage_layers(job.model, layout.pp, layout.vpp_size, pipeline_split(layout),
                              job.training.bf16_edges, job.mtp_in_bf16)


@lru_cache(maxsize=1024)
def _bf16_stage_layers(model: ModelSpec, pp: int, vpp: int, split: Split, edges: tuple[int, int],
                       mtp_in_bf16: bool) -> tuple[tuple[int, int, int, int, int], ...]:
    counts = chunk_layer_counts(model.num_layers, pp, vpp, split)
    mtp = chunk_mtp_counts(model.mtp_num_layers, pp, vpp, split) if mtp_in_bf16 else (0,) * len(counts)
    first_dense = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    out = []
    for p in range(pp):
        total = [0, 0, 0, 0, 0]
        start = 0
        for k, n in enumerate(counts):
            if k % pp == p:
                kinds = bf16_chunk_kinds(model.hybrid_pattern, first_dense, model.num_layers, edges, start, n)
                for j, v in enumerate((*kinds, mtp[k])):
                    total[j] += v
            start += n
        out.append((total[0], total[1], total[2], total[3], total[4]))
    return tuple(out)


def layer_gemm_params_per_gpu(model: ModelSpec, tp: int, ep: int, etp: int,
                              mla_down_split: bool = False) -> tuple[int, int, int, int, int]:
    """GEMM weights one GPU holds of one (dense, MoE, Mamba, attention-only, MTP) layer: a GPT layer's attention
    and MLP, a hybrid `-` / `E` / `M` / `*` layer's own block; an MTP layer's eh_proj, attention and MLP."""
    b = _layer_params_per_gpu(model, tp, ep, etp, mla_down_split)
    hybrid = model.hybrid_pattern is not None
    attn = 0 if hybrid else b["attention_gemm"]
    moe = b["moe_dense_gemm"] + b["experts_gemm"]
    mtp_mlp = moe if model.moe is not None else b["dense_mlp_gemm"]
    return (attn + b["dense_mlp_gemm"], attn + moe, b["mamba_gemm"], b["attention_gemm"],
            b["mtp_extra_gemm"] + b["attention_gemm"] + mtp_mlp)


def fsdp_unit_params_per_gpu(model: ModelSpec, sp: StageParams, tp: int, ep: int, etp: int) -> int:
    """Parameters of the largest Megatron-FSDP unit one GPU gathers: one decoder layer's GEMM weights after the
    TP / EP split (`TransformerLayer`, `MoETransformerLayer`, `MambaLayer` are the units of `optim_grads_params`,
    megatron-core `distributed/fsdp/mcore_fsdp_adapter.py`), the largest kind the stage has; an MTP layer is a unit
    too. Norms are left out (a few thousand parameters)."""
    per = layer_gemm_params_per_gpu(model, tp, ep, etp)
    counts = (sp.dense_layers, sp.moe_layers, sp.mamba_layers, sp.attention_layers, sp.mtp_layers)
    return max((g for g, n in zip(per, counts, strict=True) if n), default=0)


def nonunit_params_per_gpu(model: ModelSpec, sp: StageParams, tp: int,
                           divisible_by: int = VOCAB_DIVISOR) -> int:
    """Parameters outside every FSDP unit on one GPU of stage `sp`: the word embedding (and learned positions) and
    the untied output layer, split over TP; Megatron-FSDP keeps them gathered all step ("Non-unit modules remain
    persistently un-sharded", Megatron-LM docs `megatron_fsdp.md`; `AllGatherPipeline.release_bucket`)."""
    h = model.hidden_size
    vocab = padded_vocab_size(model.vocab_size, tp, divisible_by)
    out = vocab // tp * h + model.max_position_embeddings * h if sp.has_embedding else 0
    if sp.has_output and not (model.tied_embeddings and sp.has_embedding):
        out += vocab // tp * h
    return out


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
    norm += h * per_dim if model.post_norms else 0  # Gemma's post-attention norm, replicated
    sinks = a // tp if model.softmax_type == "learnable" else 0  # softmax_offset per local head
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
        return norm + gemm + q_norm + kv_norm + proj_bias + sinks, gemm
    qkv = h * (a + 2 * g) * d
    proj = a * d * h
    qkv_bias = (a + 2 * g) * d if (model.add_bias_linear or model.add_qkv_bias) else 0
    qk_width = 2 * d if model.qk_layernorm_per_head else (a + g) * d  # OLMoE: full-width, replicated
    qk_norm = qk_width * per_dim if model.qk_layernorm else 0
    gemm = (qkv + proj) // tp
    return norm + gemm + qkv_bias // tp + proj_bias + qk_norm + sinks, gemm


def _mamba_params_per_gpu(model: ModelSpec, tp: int) -> tuple[int, int]:
    """One hybrid `M` layer on one TP rank: (all params, GEMM weights). The layer norm is replicated (fused into
    in_proj with TE); in_proj (column-parallel, z x B C dt each split), conv1d weight and bias, dt_bias, A_log, D and
    the gated RMSNorm's weight are split over TP (`tensor_model_parallel=True`), out_proj is row-parallel without
    bias (megatron-core `ssm/mamba_mixer.py:279-443`; the rules make H, G and so d_inner divide by TP)."""
    m = model.mamba
    if m is None:
        return 0, 0
    h = model.hidden_size
    gemm = (h * m.in_proj_width + m.d_inner * h) // tp
    rest = (m.conv_dim * (m.conv_kernel + 1) + 3 * m.num_heads + m.d_inner) // tp
    return h * _norm_params_per_dim(model) + gemm + rest, gemm


def _norm_params_per_dim(model: ModelSpec) -> int:
    """RMSNorm keeps a weight per channel, LayerNorm a weight and a bias."""
    return 2 if model.normalization == "LayerNorm" else 1


def _mlp_params_per_gpu(model: ModelSpec, ffn: int, tp: int, width: int | None = None) -> tuple[int, int]:
    """One MLP of intermediate size `ffn` on one rank of a `tp`-way split, no norm: (all params, GEMM weights).
    fc1 column-parallel (doubled when gated; weight and bias split), fc2 row-parallel (bias replicated). `width`:
    its input / output width when not the hidden size (a LatentMoE expert's latent size, moe/experts.py:214-245)."""
    h = model.hidden_size if width is None else width
    fc1_out = 2 * ffn if model.gated_linear_unit else ffn
    gemm = (h * fc1_out + ffn * h) // tp
    bias = fc1_out // tp + h if model.add_bias_linear else 0
    return gemm + bias, gemm


@lru_cache(maxsize=4096)
def _layer_params_per_gpu(model: ModelSpec, tp: int, ep: int, etp: int, mla_down_split: bool) -> dict[str, int]:
    """Per-GPU parameter counts of the building blocks for one (TP, EP, ETP)."""
    norm = model.hidden_size * _norm_params_per_dim(model)
    post_norm = norm if model.post_norms else 0  # Gemma's post-feedforward norm, replicated
    attn, attn_gemm = _attention_params_per_gpu(model, tp, mla_down_split)
    dense_mlp, dense_mlp_gemm = _mlp_params_per_gpu(model, model.ffn_hidden_size, tp)
    h = model.hidden_size
    mamba, mamba_gemm = _mamba_params_per_gpu(model, tp)
    out = {
        "attention": attn, "attention_gemm": attn_gemm, "mamba": mamba, "mamba_gemm": mamba_gemm,
        "dense_mlp": norm + dense_mlp + post_norm, "dense_mlp_gemm": dense_mlp_gemm,
        "moe_dense": 0, "moe_dense_gemm": 0, "experts": 0, "experts_gemm": 0,
        # MTP layer outside its decoder layer: enorm, hnorm, final_layernorm (replicated), eh_proj
        # (ColumnParallelLinear 2h -> h, gather_output=False, no bias: h / TP rows of 2h)
        "mtp_extra": 3 * norm + 2 * h * h // tp, "mtp_extra_gemm": 2 * h * h // tp,
    }
    if model.moe is not None:
        m = model.moe
        shared, shared_gemm = (0, 0)
        if m.shared_expert_ffn_hidden_size:
            shared, shared_gemm = _mlp_params_per_gpu(model, m.shared_expert_ffn_hidden_size, tp)
        gate = model.hidden_size if m.shared_expert_gate else 0
        router = model.hidden_size * m.num_experts  # replicated on every rank (`moe/router.py`)
        router += m.num_experts if model.add_bias_linear else 0  # the router's bias (GPT-OSS)
        # LatentMoE's fc1/fc2_latent_proj: TELinear(parallel_mode="duplicated"), a full copy on every TP rank
        # (moe/moe_layer.py:273-296)
        latent = model.latent_proj_params
        out["moe_dense"] = norm + router + shared + gate + latent + post_norm
        out["moe_dense_gemm"] = shared_gemm + (2 * h * m.latent_size if m.latent_size else 0)
        expert, expert_gemm = _mlp_params_per_gpu(model, m.expert_ffn_hidden_size, etp, width=m.latent_size)
        local_experts = m.num_experts // ep
        out["experts"] = local_experts * expert
        out["experts_gemm"] = local_experts * expert_gemm
    return out


@lru_cache(maxsize=4096)
def _stage_params_cached(model: ModelSpec, tp: int, pp: int, vpp: int, ep: int, etp: int, split: Split,
                         divisible_by: int, mla_down_split: bool) -> tuple[StageParams, ...]:
    counts = chunk_layer_counts(model.num_layers, pp, vpp, split)
    mtp_counts = chunk_mtp_counts(model.mtp_num_layers, pp, vpp, split) if model.mtp_num_layers else (0,) * len(counts)
    blocks = _layer_params_per_gpu(model, tp, ep, etp, mla_down_split)
    unsplit = _layer_params_per_gpu(model, 1, 1, 1, mla_down_split)
    h = model.hidden_size
    vocab = padded_vocab_size(model.vocab_size, tp, divisible_by)
    first_dense = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    norm = h * _norm_params_per_dim(model)
    # an MTP layer's transformer layer has the spec of the decoder's last layer: MoE when the model is MoE
    mtp_mlp = "moe_dense" if model.moe is not None else "dense_mlp"
    mtp_mlp_gemm = (blocks["moe_dense_gemm"] + blocks["experts_gemm"] if model.moe is not None
                    else blocks["dense_mlp_gemm"])
    embedding_gpu = vocab // tp * h + model.max_position_embeddings * h  # VocabParallelEmbedding + positions
    embedding_all = vocab * h + model.max_position_embeddings * h
    final_chunk = final_norm_chunk(counts, bool(model.mtp_num_layers))
    stages = []
    for p in range(pp):
        layers = moe_layers = mtp_layers = mtp_param_layers = embedding_copies = mamba_layers = attention_layers = 0
        start = 0
        for k, n in enumerate(counts):
            if k % pp == p:
                layers += n
                if model.hybrid_pattern is not None:  # the stage's slice of the pattern
                    symbols = model.hybrid_pattern[start:start + n]
                    moe_layers += symbols.count("E")
                    mamba_layers += symbols.count("M")
                    attention_layers += symbols.count("*")
                else:
                    moe_layers += max(0, start + n - max(start, first_dense)) if model.moe is not None else 0
                mtp_layers += mtp_counts[k]
                # `mtp_use_repeated_layer`: one layer's parameters for all depths (multi_token_prediction.py:1741)
                mtp_param_layers += min(mtp_counts[k], 1) if model.mtp_repeated_layer else mtp_counts[k]
                embedding_copies += 1 if mtp_counts[k] and k != 0 else 0  # an MTP chunk builds the embedding
            start += n
        dense_layers = layers - moe_layers - mamba_layers - attention_layers
        with_attention = attention_layers if model.hybrid_pattern is not None else layers
        has_emb, has_out = p == 0, p == pp - 1
        dense_gpu = with_attention * blocks["attention"] + dense_layers * blocks["dense_mlp"]
        dense_gpu += moe_layers * blocks["moe_dense"]
        dense_gpu += mtp_param_layers * (blocks["mtp_extra"] + blocks["attention"] + blocks[mtp_mlp])
        dense_all = with_attention * unsplit["attention"] + dense_layers * unsplit["dense_mlp"]
        dense_all += moe_layers * unsplit["moe_dense"]
        if mamba_layers:
            dense_gpu += mamba_layers * blocks["mamba"]
            dense_all += mamba_layers * unsplit["mamba"]
        dense_all += mtp_param_layers * (unsplit["mtp_extra"] + unsplit["attention"] + unsplit[mtp_mlp])
        dense_gpu += embedding_copies * embedding_gpu
        dense_all += embedding_copies * embedding_all
        if has_emb:  # VocabParallelEmbedding rows split over TP; learned positions replicated
            dense_gpu += embedding_gpu
            dense_all += embedding_all
        if has_out:  # column-parallel output layer (a tied copy when PP > 1)
            output = 0 if (model.tied_embeddings and pp == 1) else vocab * h
            dense_gpu += output // tp
            dense_all += output
        if p == final_chunk % pp:  # the final norm, replicated
            dense_gpu += norm
            dense_all += norm
        expert_layers = moe_layers + (mtp_param_layers if model.moe is not None else 0)
        gemm = with_attention * blocks["attention_gemm"] + dense_layers * blocks["dense_mlp_gemm"]
        gemm += moe_layers * (blocks["moe_dense_gemm"] + blocks["experts_gemm"]) + mamba_layers * blocks["mamba_gemm"]
        gemm += mtp_param_layers * (blocks["mtp_extra_gemm"] + blocks["attention_gemm"] + mtp_mlp_gemm)
        stages.append(StageParams(
            stage=p, layers=layers, moe_layers=moe_layers, has_embedding=has_emb, has_output=has_out,
            dense_params=dense_all, expert_params=expert_layers * unsplit["experts"],
            dense_params_per_gpu=dense_gpu, expert_params_per_gpu=expert_layers * blocks["experts"],
            gemm_params_per_gpu=gemm, mtp_layers=mtp_layers, mamba_layers=mamba_layers,
            attention_layers=attention_layers,
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

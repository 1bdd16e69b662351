"""Activation memory per GPU: Korthikanti et al. 2022 (arXiv 2205.05198, Section 4, Table 2), generalised.

Korthikanti counts, per transformer layer and micro-batch, the tensors autograd keeps for the backward pass,
in bytes (2-byte activations, 1-byte dropout masks): attention 11sbh + 5as^2b, MLP 19sbh, two LayerNorm inputs
4sbh; 34sbh + 5as^2b in all. Tensor parallelism splits everything except the LayerNorm/dropout tensors and the
GEMM inputs after a norm (10sbh stay replicated: `sbh(10 + 24/t + 5as/(ht))`); sequence parallelism splits those
too (`sbh/t (34 + 5as/h)`); selective recompute drops the 5as^2b attention-core term; full recompute keeps only
each layer's input (2sbh, /t with SP). Here each tensor is one named term so that the generalisations show:
gated MLPs (SwiGLU keeps fc1's 2*ffn output and the ffn-wide activation), GQA (K and V are g/a of Q), MLA
latents, MoE routing (top-k copies of each token reach the experts), context parallelism (s -> s/CP) and flash
attention (no s^2 scores, only the fp32 log-sum-exp). The pipeline schedule decides how many micro-batches each
stage keeps (`inflight_microbatches_per_chunk`); the loss adds fp32 logits on the last stage.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from search_spaces.layout import Layout
from search_spaces.training import TrainingSpec
from search_spaces.model import ModelSpec

__all__ = [
    "ActivationAssumptions",
    "attention_activation_bytes",
    "mlp_activation_bytes",
    "moe_activation_bytes",
    "layer_activation_bytes",
    "embedding_activation_bytes",
    "output_activation_bytes",
    "transient_activation_bytes",
    "UnitActivations",
    "unit_activation_bytes",
    "inflight_microbatches_per_chunk",
]

ACT_BYTES = 2  # bf16 activations (FP8 runs too: see `ActivationAssumptions`)
MASK_BYTES = 1  # dropout masks (Korthikanti: 1 byte per element)
FP32_BYTES = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class ActivationAssumptions:
    """What the activation formulas assume beyond the `Layout`.

    - `flash_attention`: Transformer Engine's fused/flash attention (megatron-core's default with TE) stores no
      s^2 scores, only Q, K, V, the output and an fp32 log-sum-exp. Set False for pre-2022 runs (Korthikanti).
    - `recompute_modules`: what `recompute="selective"` recomputes; megatron-core's default is `("core_attn",)`.
      Others: "layernorm", "mlp", "moe", "moe_act", "shared_experts", "mla_up_proj" (`TransformerConfig`).
    - `dropout`: whether dropout masks are kept; None means "LayerNorm (GPT-style) models yes, RMSNorm models
      no" (megatron's default is 0.1, Llama/Qwen/DeepSeek recipes set hidden and attention dropout to 0).
    - `moe_token_imbalance`: tokens on the busiest expert rank over the balanced share (1.0: forced balance).
    - `attention_score_bytes`: bytes kept per attention score without flash attention. Korthikanti's 5 (fused
      fp16 softmax 2, dropout mask 1, dropout output 2); megatron-core's unfused local path (the CPU proxy, no
      dropout) keeps 6 (fp32 softmax 4 and its bf16 copy 2).
    - `fused_swiglu`: megatron-core's fused SwiGLU (`bias_swiglu_impl`, `weighted_bias_swiglu_impl`; GPU runs)
      keeps only its input. False (the local spec with `bias_activation_fusion=False`, as the CPU proxy runs it):
      the unfused SwiGLU also keeps silu(x) and a contiguous copy of x's first half (and, in the experts, the
      product before the routing-probability multiply).
    - `torch_rmsnorm`: megatron-core's local spec builds torch's RMSNorm, whose composite kernel keeps fp32 copies
      of its input and normalised output (8 B per element where TE keeps the 2 B input). The CPU proxy
      (`trainers.cpu_patches`) swaps in norms that save what TE's save, so False there too.
    - FP8: activations are counted as BF16. TE saves FP8 copies of GEMM inputs, but norms, attention and
      activation-function tensors stay in BF16; the BF16 count is an upper bound.
    """

    flash_attention: bool = True
    recompute_modules: tuple[str, ...] = ("core_attn",)
    dropout: bool | None = None
    moe_token_imbalance: float = 1.0
    attention_score_bytes: float = 5.0
    fused_swiglu: bool = True
    torch_rmsnorm: bool = False


@dataclass(frozen=True, slots=True)
class _Shape:
    """Symbols of Korthikanti's Table 2 for one GPU: s (local sequence), b, h, a, t, and the SP divisor."""

    s: int  # sequence per CP rank
    s_full: int
    b: int
    t: int  # TP
    sp_div: int  # t with SP, 1 without
    recompute: str
    modules: frozenset[str]
    dropout: bool
    flash: bool
    score_bytes: float
    norm_bytes: float  # bytes per element a norm keeps of its input: 2 (TE, torch LayerNorm), 8 (torch RMSNorm)
    fused_swiglu: bool

    @property
    def tokens(self) -> int:
        return self.s * self.b


def _shape(model: ModelSpec, training: TrainingSpec, layout: Layout, assumptions: ActivationAssumptions) -> _Shape:
    dropout = assumptions.dropout if assumptions.dropout is not None else model.normalization == "LayerNorm"
    modules = frozenset(assumptions.recompute_modules) if layout.recompute == "selective" else frozenset()
    return _Shape(
        s=training.seq_length // layout.cp, s_full=training.seq_length, b=layout.mbs, t=layout.tp,
        sp_div=layout.tp if layout.sp else 1, recompute=layout.recompute, modules=modules, dropout=dropout,
        flash=assumptions.flash_attention, score_bytes=assumptions.attention_score_bytes,
        norm_bytes=8.0 if assumptions.torch_rmsnorm and model.normalization == "RMSNorm" else ACT_BYTES,
        fused_swiglu=assumptions.fused_swiglu,
    )


def attention_activation_bytes(model: ModelSpec, x: _Shape) -> dict[str, float]:
    """One layer's attention block incl. its input norm (Korthikanti Sec. 4.1 'Attention block' + LayerNorm).

    norm_input 2sbh, qkv_input (norm output) 2sbh — both /t only with SP; Q, K, V 2sb(a + 2g)d/t (Korthikanti's
    4sbh + 2sbh for MHA; without flash attention megatron-core's `DotProductAttention` expands K and V to all a
    heads, 2sb 3ad/t); core attention: 5as^2b/t without flash attention (softmax 2, its dropout mask 1,
    dropout output 2), an fp32 log-sum-exp 4sba/t with it, none when selective recompute covers 'core_attn';
    proj_input (attention output) 2sbh/t; dropout mask sbh. qk-layernorm keeps its inputs (2sb(a + g)d/t).
    MLA keeps the two latents before and after their norms (2 x 2sb(q_lora + kv_lora), /t with SP).
    """
    T, t, sd = x.tokens, x.t, x.sp_div
    h, a, g, d = model.hidden_size, model.num_attention_heads, model.query_groups, model.head_dim
    terms = {"attn_norm_input": x.norm_bytes * T * h / sd}
    # 'layernorm' recompute discards a norm's output only where the norm is its own module: MLA's input norm,
    # not the norm Transformer Engine fuses into `linear_qkv` (`transformer_layer.py`: IdentityOp is skipped)
    separate_norm = model.mla is not None
    terms["qkv_input"] = 0.0 if "layernorm" in x.modules and separate_norm else ACT_BYTES * T * h / sd
    if model.mla is not None:
        m = model.mla
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        latent = 2 * ((m.q_lora_rank or 0) + m.kv_lora_rank)
        terms["mla_latents"] = ACT_BYTES * T * latent / sd
        qkv_width, o_width = a * (2 * qk + m.v_head_dim), a * m.v_head_dim
    else:
        qkv_width, o_width = _qkv_saved_width(model, x), a * d
        if model.qk_layernorm and x.norm_bytes > ACT_BYTES:  # torch RMSNorm: fp32 copies; TE: the (counted) view
            terms["qk_norm_input"] = (x.norm_bytes - ACT_BYTES) * T * (a + g) * d / t
    terms["qkv"] = ACT_BYTES * T * qkv_width / t
    if "core_attn" in x.modules:
        terms["core_attention"] = 0.0
    elif x.flash:
        terms["core_attention"] = FP32_BYTES * T * a / t
    else:  # Korthikanti: 2as^2b softmax + as^2b mask + 2as^2b dropout output; K/V span the full sequence
        terms["core_attention"] = x.score_bytes * a * x.b * x.s * x.s_full / t
    terms["proj_input"] = ACT_BYTES * T * o_width / t
    terms["attn_dropout_mask"] = MASK_BYTES * T * h / sd if x.dropout else 0.0
    return terms


def _qkv_saved_width(model: ModelSpec, x: _Shape) -> int:
    """Per token and before the TP split, the width of the Q, K, V storages autograd keeps.

    `linear_qkv` writes one mixed tensor of width (a + 2g)d; Q, K and V are views of it (`attention.py`).
    RoPE and qk-layernorm make new Q and K ((a + g)d), while V stays a view that keeps the whole mixed tensor
    alive: (a + 2g)d + (a + g)d when the attention core (flash attention, or the selective-recompute checkpoint)
    keeps Q, K, V as given. Without flash attention megatron-core's `DotProductAttention` repeats K and V over
    the query groups (new tensors of width ad each) when g < a. Korthikanti's GPT (MHA, learned positions) keeps
    just the mixed tensor, 3h: his 4sbh (Q, K) + 2sbh (V). Measured on CPU with the saved-tensor probe.
    """
    a, g, d = model.num_attention_heads, model.query_groups, model.head_dim
    rotated = model.max_position_embeddings == 0 or model.qk_layernorm
    mixed, q_new, k_new = (a + 2 * g) * d, a * d, g * d
    if x.flash or "core_attn" in x.modules or g == a:
        return mixed + (q_new + k_new if rotated else 0)
    # unfused attention with GQA: K and V are repeated to a heads; the mixed tensor stays alive only through
    # a Q view (no RoPE) or the qk-layernorm inputs
    q = q_new if rotated else 0
    alive = mixed if (not rotated or model.qk_layernorm) else 0
    return alive + q + 2 * a * d


def mlp_activation_bytes(model: ModelSpec, x: _Shape, ffn: int) -> dict[str, float]:
    """One dense layer's MLP incl. its pre-MLP norm (Korthikanti Sec. 4.1 'MLP': 19sbh for ffn = 4h).

    norm_input 2sbh and fc1_input 2sbh (/t with SP); fc1 output 2sb*ffn/t (4sb*ffn/t when gated: SwiGLU keeps
    both halves); activation output = fc2 input 2sb*ffn/t; dropout mask sbh. 'mlp' recompute keeps only the input.
    'layernorm' recompute changes nothing here: the pre-MLP norm is fused into `linear_fc1` (TE LayerNormLinear).
    """
    T, t, sd, h = x.tokens, x.t, x.sp_div, model.hidden_size
    fc1_out = 2 * ffn if model.gated_linear_unit else ffn
    inner = "mlp" in x.modules
    # unfused SwiGLU also keeps silu(x) and the contiguous copy of x's first half that silu saves (CPU probe)
    unfused_glu = 0 if x.fused_swiglu or not model.gated_linear_unit else 2 * ffn
    return {
        "mlp_norm_input": x.norm_bytes * T * h / sd,
        "fc1_input": ACT_BYTES * T * h / sd,
        "fc1_output": 0.0 if inner else ACT_BYTES * T * fc1_out / t,
        "activation_output": 0.0 if inner else ACT_BYTES * T * (ffn + unfused_glu) / t,
        "mlp_dropout_mask": MASK_BYTES * T * h / sd if x.dropout else 0.0,
    }


def moe_activation_bytes(model: ModelSpec, x: _Shape, layout: Layout, imbalance: float) -> dict[str, float]:
    """One MoE layer incl. its pre-MLP norm (megatron-core `moe_layer.py`, `experts.py`, `token_dispatcher.py`).

    Each GPU routes T_r = sb/t tokens (SP shard); with balanced routing every EP rank receives T_r * topk token
    copies, all-gathered over the ETP group: T_e = T_r * topk * ETP. The experts keep their input 2T_e*h, fc1
    output 2T_e*fc1/ETP and the fc2 input 2T_e*ffn/ETP; the routing probabilities are applied inside the fused
    activation (`weighted_bias_swiglu_impl` in `TEGroupedMLP`, which keeps only its input and the probs).
    'moe_act' recompute drops the fc2 input, 'moe' recompute the whole expert part. The router keeps fp32 scores and
    probabilities (8 T_r E). Shared experts are a TP-split dense MLP on the same input. The MoE layer's pre-MLP
    norm is its own module, so 'layernorm' recompute discards its output (`moe_input`).
    """
    assert model.moe is not None
    m = model.moe
    T, t, sd, h = x.tokens, x.t, x.sp_div, model.hidden_size
    etp = layout.expert_tp
    routed = T / sd
    expert_tokens = routed * m.topk * etp * imbalance
    ffn = m.expert_ffn_hidden_size
    fc1 = 2 * ffn if model.gated_linear_unit else ffn
    if "moe" in x.modules:
        experts = 0.0
    elif "moe_act" in x.modules:
        experts = ACT_BYTES * expert_tokens * (h + fc1 / etp)
    else:  # unfused (local spec): silu(x) and the product before the probs multiply are kept too
        extra = 0 if x.fused_swiglu else (3 * ffn if model.gated_linear_unit else ffn)
        experts = ACT_BYTES * expert_tokens * (h + fc1 / etp + (ffn + extra) / etp)
    shared = 0.0
    if m.shared_expert_ffn_hidden_size and "shared_experts" not in x.modules and "moe" not in x.modules:
        sffn = m.shared_expert_ffn_hidden_size
        shared = ACT_BYTES * T * ((2 * sffn if model.gated_linear_unit else sffn) + sffn) / t
    return {
        "mlp_norm_input": x.norm_bytes * T * h / sd,
        "moe_input": 0.0 if "layernorm" in x.modules else ACT_BYTES * T * h / sd,  # separate pre-MLP norm
        "router": 2 * FP32_BYTES * routed * m.num_experts,
        "experts": experts,
        "shared_experts": shared,
        "mlp_dropout_mask": MASK_BYTES * T * h / sd if x.dropout else 0.0,
    }


def layer_activation_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout,
                           assumptions: ActivationAssumptions, *, moe: bool) -> dict[str, float]:
    """One transformer layer, one micro-batch, one GPU, by tensor. Full recompute keeps only the layer input
    (Korthikanti Table 2 'full': 2sbh, /t with SP); the rest is recomputed in the backward pass."""
    x = _shape(model, training, layout, assumptions)
    if x.recompute == "full":
        return {"layer_input": ACT_BYTES * x.tokens * model.hidden_size / x.sp_div}
    terms = attention_activation_bytes(model, x)
    if moe:
        terms.update(moe_activation_bytes(model, x, layout, assumptions.moe_token_imbalance))
    else:
        terms.update(mlp_activation_bytes(model, x, model.ffn_hidden_size))
    return terms


def embedding_activation_bytes(model: ModelSpec, x: _Shape) -> dict[str, float]:
    """First chunk: the embedding's dropout mask (sbh, /t with SP). Its output is the first layer's input,
    counted there; the backward of the lookup needs only the token ids."""
    return {"embedding_dropout_mask": MASK_BYTES * x.tokens * model.hidden_size / x.sp_div if x.dropout else 0.0}


def output_activation_bytes(model: ModelSpec, x: _Shape, vocab: int) -> dict[str, float]:
    """Last chunk: final-norm input and output-layer input (2sbh each, /t with SP) and the fp32 softmax that
    `vocab_parallel_cross_entropy` keeps for the backward pass (4sbV/t; Korthikanti Sec. 4.3 counts 4sbv/t
    for the output layer and loss)."""
    T, h = x.tokens, model.hidden_size
    return {
        "final_norm_input": x.norm_bytes * T * h / x.sp_div,
        "output_layer_input": ACT_BYTES * T * h / x.sp_div,
        "logits_fp32": FP32_BYTES * T * vocab / x.t,
    }


def transient_activation_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout,
                               assumptions: ActivationAssumptions, *, has_output: bool, has_moe: bool,
                               vocab: int) -> dict[str, float]:
    """Memory live for one micro-batch only, counted once per stage:
    - full recompute: one layer's complete activations while it is recomputed in the backward pass
      (Korthikanti Sec. 5: the recomputed layer's working set);
    - loss: the bf16 logits (2 B per logit) alive beside their fp32 copy during the cross-entropy forward
      (megatron-core `tensor_parallel/cross_entropy.py` casts to float, then exponentiates and normalises in
      place and saves that fp32 softmax, counted in `output_activation_bytes`); the backward's bf16 logit
      gradient is the same size."""
    out: dict[str, float] = {}
    x = _shape(model, training, layout, assumptions)
    loss = ACT_BYTES * x.tokens * vocab / x.t if has_output else 0.0
    if layout.recompute == "full":
        working = sum(layer_activation_bytes(model, training, replace(layout, recompute="none"), assumptions,
                                             moe=has_moe and model.moe is not None).values())
        if has_output:
            # The last stage recomputes its layers only after the cross-entropy backward has freed the
            # micro-batch's fp32 softmax and the logit transient: the peak is the larger of the two, so the
            # working set only adds what exceeds them (measured on CPU proxies, bench_memory_calibration.py).
            working = max(0.0, working - loss - sum(output_activation_bytes(model, x, vocab).values()))
        out["recompute_working_set"] = working
    if has_output:
        out["loss_transient"] = loss
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitActivations:
    """Per-micro-batch activation bytes of the building blocks for one layout, so that a stage's activations
    are `sum(in-flight x chunk)` plus the transients. `*_terms` keep the breakdown by tensor."""

    dense_terms: tuple[tuple[str, float], ...]
    moe_terms: tuple[tuple[str, float], ...]
    embedding_terms: tuple[tuple[str, float], ...]
    output_terms: tuple[tuple[str, float], ...]
    transient_terms: dict[tuple[bool, bool], tuple[tuple[str, float], ...]]
    dense_layer: float
    moe_layer: float
    embedding: float
    output: float

    def chunk(self, *, dense: int, moe: int, has_embedding: bool, has_output: bool) -> float:
        total = dense * self.dense_layer + moe * self.moe_layer
        if has_embedding:
            total += self.embedding
        if has_output:
            total += self.output
        return total

    def transient(self, *, has_output: bool, has_moe: bool) -> float:
        return sum(v for _, v in self.transient_terms[(has_output, has_moe)])

    def breakdown(self, *, chunks: tuple[tuple[int, int, int], ...], inflight: tuple[int, ...], first_dense: int,
                  last: int, has_output: bool, has_moe: bool, transients: bool = True,
                  ) -> tuple[tuple[str, float], ...]:
        """The named terms of one stage: in-flight micro-batches x chunk terms, plus (optionally) transients."""
        out: dict[str, float] = {}

        def add(terms: tuple[tuple[str, float], ...], weight: float) -> None:
            if not weight:
                return
            for name, value in terms:
                out[name] = out.get(name, 0.0) + weight * value

        for (k, start, n), n_inflight in zip(chunks, inflight):
            dense = max(0, min(start + n, first_dense) - start)
            add(self.dense_terms, n_inflight * dense)
            add(self.moe_terms, n_inflight * (n - dense))
            if k == 0:
                add(self.embedding_terms, n_inflight)
            if k == last:
                add(self.output_terms, n_inflight)
        if transients:
            add(self.transient_terms[(has_output, has_moe)], 1)
        return tuple(out.items())


def unit_activation_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout,
                          assumptions: ActivationAssumptions, vocab: int) -> UnitActivations:
    """The building blocks for `layout` (only TP, SP, CP, MBS, ETP and recompute matter)."""
    x = _shape(model, training, layout, assumptions)
    dense = tuple(layer_activation_bytes(model, training, layout, assumptions, moe=False).items())
    moe = tuple(layer_activation_bytes(model, training, layout, assumptions, moe=True).items()) \
        if model.moe is not None else ()
    emb = tuple(embedding_activation_bytes(model, x).items())
    out = tuple(output_activation_bytes(model, x, vocab).items())
    transients = {
        (o, m): tuple(transient_activation_bytes(model, training, layout, assumptions, has_output=o, has_moe=m,
                                                 vocab=vocab).items())
        for o in (False, True) for m in (False, True)
    }
    return UnitActivations(
        dense_terms=dense, moe_terms=moe, embedding_terms=emb, output_terms=out, transient_terms=transients,
        dense_layer=sum(v for _, v in dense), moe_layer=sum(v for _, v in moe),
        embedding=sum(v for _, v in emb), output=sum(v for _, v in out),
    )


def inflight_microbatches_per_chunk(pp: int, vpp: int, microbatches: int, stage: int) -> tuple[int, ...]:
    """Micro-batches whose activations stage `stage` holds at its peak, per model chunk (megatron-core
    `pipeline_parallel/schedules.py`).

    1F1B: `min(PP - stage - 1, m)` warm-up forwards, then one more before the first backward: stage 0 keeps
    min(PP, m) (Narayanan et al. 2021 Sec. 2.2.1). Interleaved: `(PP - stage - 1) * 2 + (VPP - 1) * PP` warm-up
    forwards plus one, visiting the chunks in groups of PP micro-batches; for stage 0 that is PP*VPP + PP - 1
    chunk-micro-batches, PP * (1 + (PP - 1) / (PP * VPP)) stage-micro-batches (Korthikanti Sec. 4.2.3).
    """
    if vpp == 1:
        return (min(pp - stage, microbatches),)
    total = microbatches * vpp
    n = min((pp - stage - 1) * 2 + (vpp - 1) * pp + 1, total)
    groups, rem = divmod(n, pp)
    cycles, partial = divmod(groups, vpp)
    return tuple(cycles * pp + (pp if c < partial else 0) + (rem if c == partial else 0) for c in range(vpp))

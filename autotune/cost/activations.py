"""Activation memory per GPU, tensor by tensor, as a real GPU run keeps it (and as the CPU proxy keeps it).

The frame is Korthikanti et al. 2022 (arXiv 2205.05198, Sec. 4, Table 2): per transformer layer and
micro-batch, the tensors autograd keeps for the backward pass; tensor parallelism splits what follows a
column-parallel GEMM, sequence parallelism (SP) also the norm and residual tensors, selective recompute drops
the attention core, full recompute keeps each layer's input. Each tensor is one named term here, and what
each term holds follows what the modules of a real run save:

- GPU runs (`ActivationAssumptions.transformer_engine=True`, megatron-core 0.16.1 with Transformer Engine 2.x,
  read in TE v2.11 `module/layernorm_linear.py`, `module/linear.py`, `module/grouped_linear.py`,
  `attention/dot_product_attention/`; the research notes are summarised in docs/memory-model.md):
  norm inputs in bf16 plus fp32 statistics; GEMM inputs saved as the FP8 copy TE quantizes them to under FP8
  (1 B per element, MXFP8 and blockwise add one scale per 32 elements) and bf16 otherwise; fused attention
  keeps Q, K (new tensors after RoPE), a contiguous copy of V, the output O and fp32 softmax statistics;
  megatron's fused SwiGLU keeps its bf16 input; MoE permutation keeps index maps only; TE's fused
  cross-entropy keeps the bf16 logits (the gradient is written into them in place).
- The CPU proxy (`transformer_engine=False`, megatron-core's local layer spec, `LOCAL_SPEC_ASSUMPTIONS`):
  unfused attention with s x s scores, unfused SwiGLU, torch GEMMs that keep bf16/fp32 inputs. Measured on CPU
  with a saved-tensors probe (`tests/test_memory_megatron_params.py`).

The pipeline schedule decides how many micro-batches each stage keeps (`inflight_microbatches_per_chunk`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from autotune.cost.efficiency import OPERAND_BYTES
from autotune.cost.placement import chunk_kinds
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.model import ModelSpec

__all__ = [
    "ActivationAssumptions",
    "chunk_bytes",
    "Shape",
    "shape_of",
    "attention_activation_bytes",
    "mamba_activation_bytes",
    "hybrid_layer_activation_bytes",
    "chunk_kinds",
    "mlp_activation_bytes",
    "moe_activation_bytes",
    "layer_activation_bytes",
    "embedding_activation_bytes",
    "output_activation_bytes",
    "transient_activation_bytes",
    "UnitActivations",
    "unit_activation_bytes",
    "inflight_microbatches_per_chunk",
    "saved_gemm_input_bytes",
    "cuda_graph_static_bytes",
    "PagedStash",
    "paged_stash_of",
    "rank_capacity_tokens",
    "expert_bytes_per_token",
]

BF16 = 2  # activations and their gradients
MASK_BYTES = 1  # dropout masks (Korthikanti: 1 byte per element)
FP32 = 4
INDEX32 = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class ActivationAssumptions:
    """What the activation formulas assume beyond the job and the layout.

    - `transformer_engine`: GPU runs with TE modules (see the module docstring); False is megatron-core's local
      spec as the CPU proxy runs it.
    - `flash_attention`: a fused attention kernel that stores no s x s scores (TE's cuDNN / flash backends,
      and torch SDPA in the proxy's CP attention). False for pre-2022 runs and the local spec's unfused path.
    - `dropout`: whether dropout masks are kept; None means "LayerNorm (GPT-style) models yes, RMSNorm models no"
      (megatron's default is 0.1; the Llama, Qwen and DeepSeek recipes set hidden and attention dropout to 0).
    - `moe_token_imbalance`: tokens on the busiest expert rank over the balanced share (1.0: the forced balance
      of NVIDIA's published MoE benchmarks, Megatron-Bridge `moe_router_force_load_balancing=True`).
    - `attention_score_bytes`: bytes kept per attention score without flash attention: Korthikanti's 5 (fused
      fp16 softmax 2, dropout mask 1, dropout output 2); megatron-core's unfused local path keeps 6 (fp32
      softmax 4 and its bf16 copy 2).
    - `fused_swiglu`: megatron-core's fused SwiGLU (`bias_swiglu_impl`, `weighted_bias_swiglu_impl`) keeps only
      its input; the unfused one (local spec with `bias_activation_fusion=False`) also keeps silu(x) and a
      contiguous copy of x's first half.
    - `torch_rmsnorm`: torch's composite RMSNorm keeps fp32 copies of its input and output (8 B per element);
      the CPU proxy swaps in norms that save what TE's save (`trainers.proxy_norm`), so False there too.
    - `paged_stash_buffer_factor`: the MoE paged stash of full-iteration graphs
      (`moe_paged_stash_buffer_size_factor_cuda`): 1.2, the value of every full-iteration MoE recipe of
      Megatron-Bridge 0.6 (`perf_recipes/qwen/common.py::_enable_hybridep_full_iteration_mxfp8`; megatron-core's own
      default is 1.10). Its pages (`moe_paged_stash_page_size`, 64 tokens) are not rounded to: a page is far
      smaller than the buffer. `TrainingSpec` has no field for it.
    """

    transformer_engine: bool = True
    flash_attention: bool = True
    dropout: bool | None = None
    moe_token_imbalance: float = 1.0
    attention_score_bytes: float = 5.0
    fused_swiglu: bool = True
    torch_rmsnorm: bool = False
    paged_stash_buffer_factor: float = 1.2


def saved_gemm_input_bytes(fp8_recipe: str | None, transformer_engine: bool) -> float:
    """Bytes per element of a GEMM input that a TE linear saves for its weight gradient.

    bf16: the input itself (2 B, often a view of a tensor saved anyway). FP8 (TE v2.11 `module/linear.py`,
    `module/layernorm_linear.py`: `update_usage(rowwise_usage=False)` before `prepare_for_saving`): one FP8
    copy of 1 B per element (the transpose on Hopper, the rowwise data on Blackwell); MXFP8 adds an E8M0 scale
    per 32 elements (`MXFP8Quantizer`), blockwise (1 x 128 tiles) an fp32 scale per 128 elements; NVFP4 one 4-bit
    copy with an E4M3 scale per 16 elements (`NVFP4Quantizer`, `tensor/nvfp4_tensor.py`)."""
    if fp8_recipe is None or not transformer_engine:
        return float(BF16)
    return {"mxfp8": 1.0 + 1.0 / 32, "blockwise": 1.0 + FP32 / 128, "nvfp4": OPERAND_BYTES["fp4"]}.get(fp8_recipe, 1.0)


@dataclass(frozen=True, slots=True)
class Shape:
    """Korthikanti's symbols for one GPU and what this run's kernels keep: s (sequence per CP rank), b, t."""

    s: int  # sequence per CP rank
    s_full: int
    b: int
    t: int  # TP
    sp_div: int  # t with SP, 1 without
    recompute: str
    modules: frozenset[str]  # what selective recompute recomputes
    dropout: bool
    flash: bool
    te: bool
    score_bytes: float
    norm_bytes: float  # bytes per element a norm keeps of its input: 2 (TE, proxy norms), 8 (torch RMSNorm)
    stat_bytes: float  # fp32 statistics a norm keeps per token: 4 (RMSNorm rsigma), 8 (LayerNorm mu + rsigma)
    gemm_in: float  # bytes per element of a GEMM input saved as FP8 (or bf16): `saved_gemm_input_bytes`
    fused_swiglu: bool
    ce_fused: bool  # TE's fused cross-entropy: the bf16 logits are the only copy
    # linear_proj saves its bf16 input under FP8/FP4 (`set_save_original_input`): every recipe but delayed scaling
    proj_saves_original: bool = False

    @property
    def tokens(self) -> int:
        return self.s * self.b

    @property
    def fp8(self) -> bool:
        return self.gemm_in < BF16


def shape_of(job: Job, layout: Layout, assumptions: ActivationAssumptions) -> Shape:
    model, training = job.model, job.training
    dropout = assumptions.dropout if assumptions.dropout is not None else model.normalization == "LayerNorm"
    modules = frozenset(training.recompute_modules) if layout.recompute == "selective" else frozenset()
    te = assumptions.transformer_engine
    return Shape(
        s=training.seq_length // layout.cp, s_full=training.seq_length, b=layout.mbs, t=layout.tp,
        sp_div=layout.tp if layout.sp else 1, recompute=layout.recompute, modules=modules, dropout=dropout,
        flash=assumptions.flash_attention, te=te, score_bytes=assumptions.attention_score_bytes,
        norm_bytes=8.0 if assumptions.torch_rmsnorm and model.normalization == "RMSNorm" else BF16,
        stat_bytes=2 * FP32 if model.normalization == "LayerNorm" else FP32,
        gemm_in=saved_gemm_input_bytes(job.gemm_recipe, te),
        fused_swiglu=assumptions.fused_swiglu,
        ce_fused=te and training.cross_entropy_fusion == "te",
        proj_saves_original=te and job.gemm_recipe not in (None, "delayed"),
    )


def _norm_terms(prefix: str, x: Shape, h: int) -> dict[str, float]:
    """A norm's saved input (bf16, /t with SP) and its fp32 per-token statistics."""
    T, sd = x.tokens, x.sp_div
    return {f"{prefix}_input": x.norm_bytes * T * h / sd, f"{prefix}_stats": x.stat_bytes * T / sd}


def attention_activation_bytes(model: ModelSpec, x: Shape) -> dict[str, float]:
    """One layer's attention block incl. its input norm (Korthikanti Sec. 4.1 'Attention block' + LayerNorm).

    - `qkv_input`: the norm output = the QKV GEMM input (TE `LayerNormLinear` saves `ln_out`: bf16, or its FP8
      copy), /t with SP. MLA's down projections save their bf16 input (`save_original_input`).
    - `qkv`: TE's fused attention keeps Q and K as RoPE wrote them and a contiguous copy of V (V is a strided
      view of the QKV output, TE v2.11 `dot_product_attention/utils.py::get_qkv_layout` copies it), so
      2 T (a + 2g) d / t; the local spec's views keep the whole mixed QKV tensor alive (`_local_qkv_width`).
    - `core_attention`: fp32 softmax statistics [b, a/t, s, 1] with a fused kernel; Korthikanti's 5 as^2 b / t
      (score bytes) without; nothing when selective recompute covers 'core_attn'.
    - `proj_input`: the attention output O (2 T a d / t), kept by the attention backward and shared with
      `linear_proj`'s saved input in bf16; only under FP8 delayed scaling `linear_proj` keeps its own FP8 copy on
      top (1 B): every other FP8 recipe and FP4 save proj's original input (`set_save_original_input`).
    - MLA latents (`mla_latents`): the q / kv down-projection outputs (their norms' inputs) and the norm outputs
      the up projections save; 'mla_up_proj' recompute keeps only the former and drops Q, K, V.
    """
    T, t, sd = x.tokens, x.t, x.sp_div
    h, a, g, d = model.hidden_size, model.num_attention_heads, model.query_groups, model.head_dim
    terms = _norm_terms("attn_norm", x, h)
    mla = model.mla
    if mla is not None:
        terms["qkv_input"] = (0.0 if "layernorm" in x.modules else BF16 * T * h / sd)  # its own norm module
        latent = (mla.q_lora_rank or 0) + mla.kv_lora_rank
        up_recomputed = "mla_up_proj" in x.modules
        ln_out = 0.0 if up_recomputed else x.gemm_in
        terms["mla_latents"] = (BF16 + ln_out) * T * latent / sd
        qk = mla.qk_head_dim + mla.qk_pos_emb_head_dim
        qkv_width, o_width = a * (2 * qk + mla.v_head_dim), a * mla.v_head_dim
        terms["qkv"] = 0.0 if up_recomputed else BF16 * T * qkv_width / t
    else:
        terms["qkv_input"] = x.gemm_in * T * h / sd if x.te else BF16 * T * h / sd
        qkv_width, o_width = ((a + 2 * g) * d if x.te else _local_qkv_width(model, x)), a * d
        terms["qkv"] = BF16 * T * qkv_width / t
        if model.qk_layernorm and x.norm_bytes > BF16:  # torch RMSNorm: fp32 copies; TE: the (counted) view
            terms["qk_norm_input"] = (x.norm_bytes - BF16) * T * (a + g) * d / t
    recompute_core = "core_attn" in x.modules
    if recompute_core:
        terms["core_attention"] = 0.0
    elif x.flash:
        terms["core_attention"] = FP32 * T * a / t
    else:  # Korthikanti: 2as^2b softmax + as^2b mask + 2as^2b dropout output; K/V span the full sequence
        terms["core_attention"] = x.score_bytes * a * x.b * x.s * x.s_full / t
    # O: kept by the attention backward, and saved by linear_proj as the same bf16 storage. megatron-core marks
    # linear_proj `set_save_original_input` under FP8 with any recipe but delayed scaling, and under FP4
    # (transformer/attention.py:427-443 in 0.19.2, :366-376 in 0.16.1; TE >= 2.6 / 2.7), so it keeps O itself,
    # not a quantized copy. Only delayed scaling (GQA/MHA) still quantizes proj's input: then proj keeps a 1-byte
    # copy, and O stays only while the attention core is not recomputed. MLA's linear_proj saves its original
    # bf16 input too (`save_original_input`).
    if x.te and x.fp8 and mla is None and not x.proj_saves_original:
        proj = x.gemm_in + (0.0 if recompute_core else BF16)
    else:
        proj = BF16
    terms["proj_input"] = proj * T * o_width / t
    terms["attn_dropout_mask"] = MASK_BYTES * T * h / sd if x.dropout else 0.0
    return terms


def _local_qkv_width(model: ModelSpec, x: Shape) -> int:
    """Local spec (CPU proxy): per token and before the TP split, the width of the Q, K, V storages kept.

    `linear_qkv` writes one mixed tensor of width (a + 2g)d; Q, K and V are views of it (`attention.py`).
    RoPE and qk-layernorm make new Q and K ((a + g)d) while V stays a view that keeps the whole mixed tensor
    alive: (a + 2g)d + (a + g)d when the attention core (torch SDPA, or the selective-recompute checkpoint)
    keeps Q, K, V as given. Unfused attention repeats K and V over the query groups (new tensors of width ad
    each) when g < a. Korthikanti's GPT (MHA, learned positions) keeps just the mixed tensor, 3h.
    Measured on CPU with the saved-tensor probe.
    """
    a, g, d = model.num_attention_heads, model.query_groups, model.head_dim
    rotated = model.max_position_embeddings == 0 or model.qk_layernorm
    mixed, q_new, k_new = (a + 2 * g) * d, a * d, g * d
    if x.flash or "core_attn" in x.modules or g == a:
        return mixed + (q_new + k_new if rotated else 0)
    q = q_new if rotated else 0
    alive = mixed if (not rotated or model.qk_layernorm) else 0
    return alive + q + 2 * a * d


def _swiglu_terms(model: ModelSpec, x: Shape, tokens: float, ffn: float, split: int) -> tuple[float, float]:
    """(fc1 output = activation input, fc2 input) bytes of one MLP of `tokens` rows, intermediate `ffn`, split
    `split` ways. Fused SwiGLU keeps its bf16 input (2 x ffn wide when gated); fc2 keeps its input: the bf16
    activation output, or its FP8 copy under FP8 (TE), the bf16 output then being freed. The unfused local
    SwiGLU also keeps silu(x) and the contiguous copy of x's first half."""
    fc1_out = (2 if model.gated_linear_unit else 1) * ffn / split
    act_out = ffn / split
    unfused = 0.0 if x.fused_swiglu or not model.gated_linear_unit else 2 * ffn / split
    fc2_in = x.gemm_in if x.te else BF16
    return BF16 * tokens * fc1_out, tokens * (fc2_in * act_out + BF16 * unfused)


def mlp_activation_bytes(model: ModelSpec, x: Shape, ffn: int) -> dict[str, float]:
    """One dense layer's MLP incl. its pre-MLP norm (Korthikanti Sec. 4.1 'MLP': 19sbh for ffn = 4h).

    TE fuses the pre-MLP norm into `linear_fc1` (`LayerNormLinear`): the norm input (bf16) and `ln_out` (bf16,
    or its FP8 copy) are kept, /t with SP; then the fc1 output and the fc2 input (`_swiglu_terms`).
    'mlp' recompute keeps only the checkpoint's input (the norm input with TE, the norm output with the local
    spec, whose norm is its own module); 'layernorm' recompute changes nothing where the norm is fused.
    """
    T, sd, h = x.tokens, x.sp_div, model.hidden_size
    terms = _norm_terms("mlp_norm", x, h)
    inner = "mlp" in x.modules
    fc1_output, fc2_input = _swiglu_terms(model, x, T, ffn, x.t)
    fc1_in = (0.0 if inner else x.gemm_in) if x.te else BF16
    terms.update({
        "fc1_input": fc1_in * T * h / sd,
        "fc1_output": 0.0 if inner else fc1_output,
        "activation_output": 0.0 if inner else fc2_input,
        "mlp_dropout_mask": MASK_BYTES * T * h / sd if x.dropout else 0.0,
    })
    return terms


def mamba_activation_bytes(model: ModelSpec, x: Shape) -> dict[str, float]:
    """One hybrid `M` layer (megatron-core `ssm/mamba_mixer.py`, training path `use_mem_eff_path=True`), by tensor:
    - the norm fused into `in_proj` (TE `LayerNormColumnParallelLinear`): its input and `ln_out` (bf16, or the FP8
      copy), /t with SP, and its statistics;
    - `mamba_in_proj_output`: zxBCdt, 2 d_inner + 2 G N + H wide over TP, which mamba_ssm's
      `MambaSplitConv1dScanCombinedFn` saves whole (it recomputes the conv output and the chunk states in the
      backward, `ops/triton/ssd_combined.py`);
    - `mamba_scan_output`: the scan output it saves for the gate's backward (d_inner / t);
    - `mamba_norm_input`: the gated RMSNorm's saved input (`ExtendedRMSNorm`, d_inner / t) and its fp32 per-group
      statistics;
    - `mamba_out_proj_input`: out_proj's saved input (d_inner / t, bf16 or its FP8 copy).
    Context parallelism moves these to full sequences of H / (t c) heads: the same bytes per rank as b s / c rows
    of H / t heads."""
    m = model.mamba
    assert m is not None
    T, t, sd, h = x.tokens, x.t, x.sp_div, model.hidden_size
    terms = _norm_terms("mamba_norm", x, h)
    terms["mamba_in_proj_input"] = (x.gemm_in if x.te else BF16) * T * h / sd
    terms["mamba_in_proj_output"] = BF16 * T * m.in_proj_width / t
    terms["mamba_scan_output"] = BF16 * T * m.d_inner / t
    terms["mamba_norm_input"] = BF16 * T * m.d_inner / t + FP32 * T * m.num_groups / t
    terms["mamba_out_proj_input"] = (x.gemm_in if x.te else BF16) * T * m.d_inner / t
    return terms


@dataclass(frozen=True, slots=True)
class PagedStash:
    """The MoE paged stash of one layout (full-iteration CUDA graphs of a MoE model), per GPU and MoE layer:
    `capacity_tokens` rows every routed-expert tensor is allocated with (the rank capacity budget),
    `avg_tokens` the average-based rows the stash buffer is sized by, `buffer_factor` its headroom."""

    capacity_tokens: int
    avg_tokens: int
    buffer_factor: float


def rank_capacity_tokens(job: Job, x: Shape) -> int:
    """Rows of the static token buffers one MoE layer dispatches into at the rank capacity factor
    (`moe_expert_rank_capacity_factor`, `TrainingSpec.moe_rank_capacity_factor`): megatron-core 0.19
    `transformer/moe/token_dispatcher.py::_HybridEPManager.setup_metadata`,
    `budget = int(num_tokens * moe_router_topk * moe_expert_rank_capacity_factor)` with `num_tokens` the tokens
    this rank routes (T_r = T / t*, `routing_map.shape[0]`), rounded up to `get_align_size_for_quantization`:
    256 with `use_transformer_engine_op_fuser` (which the hybridep backend requires with a capacity factor,
    `transformer_config.py`), else 32 for MXFP8, 16 for other FP8, none for bf16 (`fp8_utils.get_fp8_align_size`).
    HybridEP returns the dispatched tokens with exactly this many rows (`num_permuted_tokens`), and every
    tensor of the expert MLP follows. The budget has no ETP factor (the source's formula)."""
    assert job.model.moe is not None
    routed = int(x.tokens // x.sp_div)
    budget = int(routed * job.model.moe.topk * job.training.moe_rank_capacity_factor)
    if job.moe_dispatcher[1] == "hybridep":
        pad = 256
    elif job.fp8_recipe is None:
        pad = 0
    else:
        pad = 32 if job.fp8_recipe == "mxfp8" else 16
    return budget + (-budget % pad if pad else 0)


def paged_stash_of(job: Job, layout: Layout, assumptions: ActivationAssumptions) -> PagedStash | None:
    """The paged stash this layout runs with, or None. On exactly when `search_spaces.megatron_names` turns it on:
    full-iteration CUDA graphs of a MoE model on megatron-core >= 0.17 (`moe_paged_stash=True` with
    `moe_expert_rank_capacity_factor`, as every full-iteration MoE recipe of Bridge 0.6 sets them), with TE
    (the stash pages only what TE's grouped MLP marks). `avg_tokens = int(max_num_tokens // cap_factor)`
    (megatron-core `transformer/moe/experts.py::TEGroupedMLP._fused_forward`), `max_num_tokens` the capacity."""
    if not (layout.cuda_graphs == "full_iteration" and job.model.moe is not None
            and job.training.megatron_core >= "0.17" and assumptions.transformer_engine):
        return None
    x = shape_of(job, layout, assumptions)
    cap = rank_capacity_tokens(job, x)
    return PagedStash(capacity_tokens=cap, avg_tokens=int(cap // job.training.moe_rank_capacity_factor),
                      buffer_factor=assumptions.paged_stash_buffer_factor)


def expert_bytes_per_token(model: ModelSpec, x: Shape, layout: Layout) -> float:
    """Bytes the routed experts of one MoE layer save for backward per dispatched token copy: the grouped fc1
    input (bf16, or its FP8 copy), the fc1 output the weighted SwiGLU keeps with the fp32 routing probability,
    and the fc2 input (see `moe_activation_bytes`). Exactly the tensors TE's fused grouped MLP marks for the
    paged stash (`mark_grouped_tensor(grouped_fc1_x, swiglu_in, scales, grouped_fc2_x)`, TE
    `ops/fused/forward_grouped_mlp.py`); 0 when 'moe' recompute recomputes the whole layer."""
    assert model.moe is not None
    if "moe" in x.modules:
        return 0.0
    # the experts' fc1 input is `expert_width` wide: LatentMoE's latent size (moe/experts.py:214-245), else h
    etp, ffn, h = layout.expert_tp, model.moe.expert_ffn_hidden_size, model.expert_width
    fc1_in = x.gemm_in if x.te else BF16
    fc1_out, fc2_in = _swiglu_terms(model, x, 1.0, ffn, etp)
    # the fused weighted squared ReLU (`use_fused_weighted_squared_relu`, which every Nemotron-3 recipe of Bridge sets,
    # e.g. `recipes/nemotronh/h100/nemotron_3_super.py:147`, `h100/nemotron_3_nano.py:238`) keeps only its input and
    # the probabilities (megatron-core `fusions/fused_weighted_squared_relu.py:65-75`, `experts.py:850-856`)
    fused_srelu = model.activation == "squared_relu" and not model.gated_linear_unit and x.fused_swiglu
    if (not model.gated_linear_unit and not fused_srelu) or (model.gated_linear_unit and not x.te
                                                              and not x.fused_swiglu):
        # the probs multiply `act(x) * probs` keeps act(x) (`experts.py`, `activation_func_with_probs`): only the
        # fused weighted SwiGLU (gated, GPU) and the fused weighted squared ReLU avoid it
        fc2_in += BF16 * ffn / etp
    # 'moe_act' recompute discards the activation's output, fc2's saved input: under FP8/FP4 megatron-core sets
    # `set_save_original_input(linear_fc2)` so that fc2 keeps that bf16 tensor, not a quantized copy, and the
    # discard frees it too (moe/experts.py:268-275 and 882-893 in 0.19.2; :588-595 in 0.16.1)
    if "moe_act" in x.modules:
        fc2_in = 0.0
    return fc1_in * h + fc1_out + fc2_in + FP32  # + fp32 probs


def paged_stash_bytes(stash: PagedStash, per_token: float) -> float:
    """One MoE layer's share, per micro-batch in flight, of the paged stash's CUDA buffer (megatron-core 0.19
    `transformer/moe/paged_stash.py`). During the first (eager, 'capture') iteration `on_save_for_backward`
    adds each saved expert tensor's `avg_num_tokens` to a running count per (dtype, hidden) and takes its peak
    over the whole iteration (it falls again as `on_get_saved_tensor` hands them back in the backward):
    `max_avg_tokens_across_vp_stages`, the average-based tokens of every (MoE layer, micro-batch) in flight at
    once on this GPU, all model chunks together. `allocate_stash_buffers` then allocates one static buffer per
    (dtype, hidden) of `int(peak x moe_paged_stash_buffer_size_factor_cuda)` tokens in pages of
    `moe_paged_stash_page_size` (`PagedStashBuffer`: [pages x page_size, hidden]); MXFP8's columnwise scales
    count one row per 32 tokens. Summed over the in-flight micro-batches of the stage's MoE layers (as the
    memory model sums every per-layer term), this per-layer share gives that buffer; the page rounding (under
    one page per buffer) is left out. The pinned host buffer (`..._cpu`, 1.0 in Bridge's recipes) is host
    memory."""
    return stash.buffer_factor * stash.avg_tokens * per_token


def moe_activation_bytes(model: ModelSpec, x: Shape, layout: Layout, imbalance: float,
                         permute_fusion: bool = True, stash: PagedStash | None = None) -> dict[str, float]:
    """One MoE layer incl. its pre-MLP norm (megatron-core `moe_layer.py`, `experts.py`, `token_dispatcher.py`).

    Each GPU routes T_r = T / t* tokens (its SP shard); balanced routing brings every EP rank T_r * topk token
    copies, all-gathered over the ETP group: T_e = T_r * topk * ETP (x `moe_token_imbalance`).
    - `moe_input`: the pre-MLP norm output (its own module), kept by the router GEMM, the dispatcher and the
      shared experts; 'layernorm' recompute discards it.
    - `router`: two fp32 [T_r, E] tensors (scores and probabilities) and the bool routing map.
    - `permute_maps`: what permutation keeps: TE's fused `row_id_map`, int32 [T_r, 2E + 1] (`moe_permute_fusion`),
      or int64 sorted indices [T_r * topk] and the bool mask [E, T_r]. The tokens themselves are not kept.
    - `experts`: per grouped GEMM (TE `GroupedLinear`) the fc1 input (bf16 view of the sorted tokens, or per-expert
      FP8 copies), the fc1 output that the weighted SwiGLU keeps with the fp32 routing probabilities, and the fc2
      input; 'moe_act' recompute drops the bf16 fc2 input (under FP8 the fc2 FP8 copy stays), 'moe' the whole part.
    - `shared_experts`: a TP-split MLP on `moe_input` (its fc1 keeps an FP8 copy of it under FP8).
    - with the paged stash (`stash`, full-iteration graphs): the expert tensors are paged into the stash's static
      buffer after the layer's forward and their capacity-sized originals freed (`PagedStashManager.
      wait_for_stash_to_complete`), so `experts` is 0 and `paged_stash` holds this layer's average-based share of
      the buffer (`paged_stash_bytes`), whatever the routing imbalance.
    """
    assert model.moe is not None
    m = model.moe
    T, t, sd, h = x.tokens, x.t, x.sp_div, model.hidden_size
    etp = layout.expert_tp
    routed = T / sd
    expert_tokens = routed * m.topk * etp * imbalance
    whole = "moe" in x.modules
    per_token = expert_bytes_per_token(model, x, layout)
    experts = per_token * expert_tokens
    shared = 0.0
    if m.shared_expert_ffn_hidden_size and "shared_experts" not in x.modules and not whole:
        s_out, s_in = _swiglu_terms(model, x, T, m.shared_expert_ffn_hidden_size, t)
        shared = s_out + s_in + (x.gemm_in * T * h / sd if x.fp8 else 0.0)
    latent = 0.0
    if m.latent_size is not None and not whole:
        # LatentMoE's fc2_latent_proj keeps its input, the combined latent tokens [T_r, L] (bf16, or TE's FP8 copy),
        # and under FP8 fc1_latent_proj an FP8 copy of `moe_input` (moe/moe_layer.py:273-296, duplicated TELinears)
        latent = (x.gemm_in if x.te else BF16) * routed * m.latent_size + (x.gemm_in * routed * h if x.fp8 else 0.0)
    if permute_fusion and x.te:
        maps = INDEX32 * routed * (2 * m.num_experts + 1)
    else:
        maps = 8.0 * routed * m.topk + routed * m.num_experts
    terms = _norm_terms("mlp_norm", x, h)
    terms.update({
        "moe_input": 0.0 if "layernorm" in x.modules else BF16 * T * h / sd,
        "router": 0.0 if whole else (2 * FP32 + 1) * routed * m.num_experts,
        "permute_maps": 0.0 if whole else maps,
        "experts": experts,
        "shared_experts": shared,
        "mlp_dropout_mask": MASK_BYTES * T * h / sd if x.dropout else 0.0,
    })
    if m.latent_size is not None:
        terms["latent_projections"] = latent
    if stash is not None:
        terms["experts"] = 0.0
        terms["paged_stash"] = paged_stash_bytes(stash, per_token)
    return terms


def layer_activation_bytes(job: Job, layout: Layout, assumptions: ActivationAssumptions, *,
                           moe: bool, kind: str | None = None) -> dict[str, float]:
    """One transformer layer, one micro-batch, one GPU, by tensor. Full recompute keeps only the layer input
    (Korthikanti Table 2 'full': 2sbh, /t with SP); the rest is recomputed in the backward pass. `kind` is a hybrid
    layer's symbol (`M`, `*`, `-`, `E`: one block each, `hybrid_layer_activation_bytes`)."""
    model = job.model
    x = shape_of(job, layout, assumptions)
    if x.recompute == "full":
        return {"layer_input": BF16 * x.tokens * model.hidden_size / x.sp_div}
    if kind is not None:
        return hybrid_layer_activation_bytes(job, layout, assumptions, x, kind)
    terms = attention_activation_bytes(model, x)
    if moe:
        terms.update(moe_activation_bytes(model, x, layout, assumptions.moe_token_imbalance,
                                          job.training.moe_permute_fusion, paged_stash_of(job, layout, assumptions)))
    else:
        terms.update(mlp_activation_bytes(model, x, model.ffn_hidden_size))
    if layout.cuda_graphs == "transformer_engine" and x.te:
        terms["cuda_graph_buffers"] = cuda_graph_static_bytes(job, layout, x, moe=moe)
    return terms


def hybrid_layer_activation_bytes(job: Job, layout: Layout, assumptions: ActivationAssumptions, x: Shape,
                                  kind: str) -> dict[str, float]:
    """One hybrid layer of symbol `kind` (megatron-core `models/hybrid/hybrid_block.py`): `M` the Mamba layer,
    `*` the attention block alone, `-` the MLP alone, `E` the MoE block alone; plus the static buffers of its
    captured graphs (TE graphs: input, output and their gradients, 4 x 2 T h / t*, when its scope is captured)."""
    model = job.model
    if kind == "M":
        terms = mamba_activation_bytes(model, x)
    elif kind == "*":
        terms = attention_activation_bytes(model, x)
    elif kind == "-":
        terms = mlp_activation_bytes(model, x, model.ffn_hidden_size)
    else:
        terms = moe_activation_bytes(model, x, layout, assumptions.moe_token_imbalance,
                                     job.training.moe_permute_fusion, paged_stash_of(job, layout, assumptions))
    if layout.cuda_graphs == "transformer_engine" and x.te:
        scopes = set(job.cuda_graph_modules)
        scope = {"M": "mamba", "*": "attn", "-": "mlp"}.get(kind)
        boundary = 4 * BF16 * x.tokens * model.hidden_size / x.sp_div
        if kind == "E":
            terms["cuda_graph_buffers"] = cuda_graph_static_bytes(job, layout, x, moe=True) - (
                boundary if "attn" in scopes or not scopes else 0.0)
        else:
            terms["cuda_graph_buffers"] = boundary if (not scopes or scope in scopes) else 0.0
    return terms


def cuda_graph_static_bytes(job: Job, layout: Layout, x: Shape, *, moe: bool) -> float:
    """Static buffers of one layer's captured graphs, per micro-batch the schedule keeps in flight
    (`cuda_graph_impl="transformer_engine"`: TE `make_graphed_callables` keeps every graph's inputs and outputs,
    and for the backward graph the output gradients it is fed and the input gradients it returns, as static
    tensors; megatron-core `transformer/cuda_graphs.py`). Per captured part:
    - the whole layer, 'attn', 'mlp' (dense layers), 'moe': input, output and their gradients, 4 x 2 T h / t*;
    - 'moe_router': its input and input gradient (2 x 2 T_r h) and its fp32 probabilities and bool routing map
      (5 T_r E);
    - 'moe_preprocess': the dispatcher's prepared tokens. The alltoall dispatcher permutes them there (2 T_r k h
      plus fp32 probabilities, `token_dispatcher.py::MoEAlltoAllTokenDispatcher.dispatch_preprocess`); the flex
      dispatcher only sets up metadata and returns a view of its input (`MoEFlexTokenDispatcher`), so its part
      holds the fp32 token probabilities.
    Megatron-Bridge's performance guide: CUDA graphs add "typically ... a few gigabytes ... over 10GB" with PP > 1."""
    model = job.model
    T, sd, h = x.tokens, x.sp_div, model.hidden_size
    boundary = 4 * BF16 * T * h / sd
    scopes = set(job.cuda_graph_modules)
    if not scopes:
        return boundary
    total = boundary if "attn" in scopes else 0.0
    if not moe:
        return total + (boundary if "mlp" in scopes else 0.0)
    if "moe" in scopes:
        return total + boundary
    assert model.moe is not None
    routed = T / sd
    e, k = model.moe.num_experts, model.moe.topk
    if "moe_router" in scopes:
        total += 2 * BF16 * routed * h + 5 * routed * e
    if "moe_preprocess" in scopes:
        w = model.expert_width  # LatentMoE: fc1_latent_proj runs in preprocess, its latent output is the graph's
        if job.moe_dispatcher[0] == "alltoall":
            total += routed * k * (BF16 * w + FP32)
        else:
            total += FP32 * routed * e + (BF16 * routed * w if model.moe.latent_size is not None else 0.0)
    return total


def embedding_activation_bytes(model: ModelSpec, x: Shape) -> dict[str, float]:
    """First chunk: the embedding's dropout mask (sbh, /t with SP). Its output is the first layer's input,
    counted there; the backward of the lookup needs only the token ids."""
    return {"embedding_dropout_mask": MASK_BYTES * x.tokens * model.hidden_size / x.sp_div if x.dropout else 0.0}


def output_activation_bytes(model: ModelSpec, x: Shape, vocab: int) -> dict[str, float]:
    """Last chunk: the final norm (input and statistics), the output layer's input (megatron's own
    `ColumnParallelLinear`, bf16, the local shard with SP) and the logits the loss keeps for its backward:
    TE's fused cross-entropy (`cross_entropy_fusion="te"`, TE v2.11 `cross_entropy.py`) writes the gradient into
    the bf16 logits in place and saves them (2 B per logit); megatron's `vocab_parallel_cross_entropy` saves an
    fp32 softmax (4 B; Korthikanti Sec. 4.3 counts 4sbv/t)."""
    T, h = x.tokens, model.hidden_size
    terms = _norm_terms("final_norm", x, h)
    terms["output_layer_input"] = BF16 * T * h / x.sp_div
    if x.ce_fused:
        terms["logits_bf16"] = BF16 * T * vocab / x.t
    else:
        terms["logits_fp32"] = FP32 * T * vocab / x.t
    return terms


def mtp_activation_bytes(job: Job, layout: Layout, assumptions: ActivationAssumptions,
                         vocab: int) -> dict[str, float]:
    """One multi-token-prediction layer, one micro-batch (megatron-core 0.16.1
    `transformer/multi_token_prediction.py::MultiTokenPredictionLayer`, `models/gpt/gpt_model.py:608-660`): the
    embedding of the shifted tokens, `enorm` and `hnorm` (inputs and statistics), `eh_proj`'s input [s, b, 2h]
    (a TE column-parallel linear, saved like the other GEMM inputs), one transformer layer of the decoder's last
    kind, `final_layernorm`, and the output layer's input and logits once more. With full recompute the MTP layer
    is checkpointed (`_checkpointed_forward`): it keeps its two inputs, the logits stay."""
    model = job.model
    x = shape_of(job, layout, assumptions)
    T, h = x.tokens, model.hidden_size
    out = {f"mtp_{k}": v for k, v in output_activation_bytes(model, x, vocab).items()}
    if x.recompute == "full":
        out["mtp_layer_inputs"] = 2 * BF16 * T * h / x.sp_div
        return out
    terms = {f"mtp_{k}": v for k, v in embedding_activation_bytes(model, x).items()}
    terms.update({f"mtp_{k}": v for k, v in _norm_terms("enorm", x, h).items()})
    terms.update({f"mtp_{k}": v for k, v in _norm_terms("hnorm", x, h).items()})
    terms["mtp_eh_proj_input"] = x.gemm_in * T * 2 * h / x.sp_div
    layer = layer_activation_bytes(job, layout, assumptions, moe=model.moe is not None)
    terms.update({f"mtp_layer_{k}": v for k, v in layer.items()})
    terms.update(out)
    return terms


def _backward_working_set(job: Job, layout: Layout, x: Shape, *, has_moe: bool, stash: bool = False) -> float:
    """The gradients alive while one layer runs its backward: the activation gradients of the MLP (d of the
    fc2 input and of the fc1 output, 3 x ffn wide when gated) or of the experts, or of attention (dQ, dK, dV
    and dO), plus the incoming and outgoing gradient of the layer (2 x 2 T h / t*). Counted once per stage."""
    model = job.model
    T, t, sd, h = x.tokens, x.t, x.sp_div, model.hidden_size
    gate = 3 if model.gated_linear_unit else 2
    layer_io = 2 * BF16 * T * h / sd
    candidates = [BF16 * T * gate * model.ffn_hidden_size / t]
    if model.mla is None:
        a, g, d = model.num_attention_heads, model.query_groups, model.head_dim
        candidates.append(BF16 * T * (2 * a + 2 * g) * d / t)
    else:
        m = model.mla
        candidates.append(BF16 * T * model.num_attention_heads * (2 * (m.qk_head_dim + m.qk_pos_emb_head_dim)
                                                                  + 2 * m.v_head_dim) / t)
    if model.mamba is not None:  # d zxBCdt and d y of a Mamba layer (`mamba_activation_bytes`)
        candidates.append(BF16 * T * (model.mamba.in_proj_width + 2 * model.mamba.d_inner) / t)
    if has_moe and model.moe is not None and not stash:
        e = model.moe
        tokens = T / sd * e.topk * layout.expert_tp * 1.0
        candidates.append(BF16 * tokens * (gate * e.expert_ffn_hidden_size / layout.expert_tp + model.expert_width))
    return layer_io + max(candidates)


def moe_capacity_working_set(model: ModelSpec, x: Shape, layout: Layout, stash: PagedStash) -> float:
    """The static token buffers of the one MoE layer in flight at the rank capacity factor (full-iteration
    graphs): every routed-expert tensor of the layer has `capacity_tokens` rows (`rank_capacity_tokens`), the
    rows HybridEP dispatches into whatever arrives. Forward: the dispatched bf16 tokens and fp32 probabilities
    (`hybrid_ep_dispatch`, PyTorch tensors of `num_permuted_tokens` rows), the expert tensors before the stash
    pages them (`expert_bytes_per_token`), and the bf16 fc2 output the combine reads. Backward: the saved
    tensors reloaded at full capacity (`PagedStashManager.reload_paged_tensors` allocates
    `torch.empty(original_shape)`) beside the experts' activation gradients (the fc2 and fc1 output gradients,
    3 f_e / etp wide when gated, and the dispatched tokens' gradient, h). The larger of the two, counted once
    per stage; it replaces the experts' candidate of `backward_working_set`."""
    assert model.moe is not None
    e, h, etp = model.moe, model.expert_width, layout.expert_tp  # LatentMoE: tokens at the latent width
    gate = 3 if model.gated_linear_unit else 2
    per_token = expert_bytes_per_token(model, x, layout)
    forward = 2 * BF16 * h + FP32 + per_token
    backward = per_token + BF16 * (gate * e.expert_ffn_hidden_size / etp + h)
    return stash.capacity_tokens * max(forward, backward)


def _loss_transient_bytes(job: Job, x: Shape, vocab: int) -> float:
    """Per logit, beyond what the loss saves: megatron's `vocab_parallel_cross_entropy` (`cross_entropy_fusion=
    "none"`) casts the bf16 logits to fp32 and works in place, so the bf16 logits (2 B) are alive beside the fp32
    softmax during the forward (the backward's bf16 gradient is the same size); the jit-fused native version
    (`fusions/fused_cross_entropy.py`, `"native"`) also keeps the fp32 cast beside the fp32 exp_logits it returns
    (2 + 4 B); TE's fused cross-entropy writes the gradient into the bf16 logits in place (0)."""
    per_logit = 0.0 if x.ce_fused else (2.0 + 4.0 if job.training.cross_entropy_fusion == "native" else 2.0)
    return per_logit * x.tokens * vocab / x.t


def transient_activation_bytes(job: Job, layout: Layout, assumptions: ActivationAssumptions, *,
                               has_output: bool, has_moe: bool, vocab: int) -> dict[str, float]:
    """Memory live for one micro-batch only, counted once per stage:
    - `backward_working_set`: one layer's activation gradients (`_backward_working_set`);
    - `moe_capacity_working_set`: with the paged stash, the MoE layer in flight at the rank capacity
      (`moe_capacity_working_set`);
    - full recompute: one layer's complete activations while it is recomputed in the backward pass
      (Korthikanti Sec. 5), on the last stage only what exceeds the freed logits (measured on CPU proxies);
    - `loss_transient`: what the loss holds beside its saved tensors while it runs (`_loss_transient_bytes`)."""
    model = job.model
    x = shape_of(job, layout, assumptions)
    out: dict[str, float] = {}
    loss = _loss_transient_bytes(job, x, vocab) if has_output else 0.0
    stash = paged_stash_of(job, layout, assumptions) if has_moe else None
    if assumptions.transformer_engine:
        out["backward_working_set"] = _backward_working_set(job, layout, x, has_moe=has_moe, stash=stash is not None)
    if stash is not None:
        out["moe_capacity_working_set"] = moe_capacity_working_set(model, x, layout, stash)
    if layout.recompute == "full":
        plain = replace(layout, recompute="none")
        if model.hybrid_pattern is not None:  # the largest of the hybrid layer kinds the model has
            working = max(sum(layer_activation_bytes(job, plain, assumptions, moe=False, kind=k).values())
                          for k in set(model.hybrid_pattern) if k != "E" or has_moe)
        else:
            working = sum(layer_activation_bytes(job, plain, assumptions,
                                                 moe=has_moe and model.moe is not None).values())
        if has_output:
            working = max(0.0, working - loss - sum(output_activation_bytes(model, x, vocab).values()))
        out["recompute_working_set"] = working
    if has_output and loss:
        out["loss_transient"] = loss
    return out


def chunk_bytes(u: Any, split: tuple[Any, Any, Any, Any], *, mamba: int, attention: int, mtp: int,
                has_embedding: bool, has_output: bool) -> Any:
    """What one micro-batch leaves saved on a model chunk: its layers by kind, MTP layers, the embedding on the
    first chunk and the output layer on the last, from the building blocks `u` (a `UnitActivations`, or its fields
    as arrays of layouts) and the chunk's `split` into (recomputed dense, recomputed MoE, kept dense, kept MoE)
    layers (`UnitActivations._split`)."""
    rd, rm, kd, km = split
    total = rd * u.dense_layer + rm * u.moe_layer + kd * u.dense_kept + km * u.moe_kept
    if mamba or attention:
        total = total + mamba * u.mamba_layer + attention * u.attention_layer
    if mtp:
        total = total + mtp * u.mtp
    if has_embedding:
        total = total + u.embedding
    if has_output:
        total = total + u.output
    return total


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitActivations:
    """Per-micro-batch activation bytes of the building blocks for one layout, so that a stage's activations
    are `sum(in-flight x chunk)` plus the transients. `*_terms` keep the breakdown by tensor.
    `full_layers` (None: every layer) is the block of layers per chunk that full recompute covers
    (`recompute_method=block`, `recompute_num_layers`); the other layers keep `*_kept_terms`."""

    dense_terms: tuple[tuple[str, float], ...]
    moe_terms: tuple[tuple[str, float], ...]
    dense_kept_terms: tuple[tuple[str, float], ...]
    moe_kept_terms: tuple[tuple[str, float], ...]
    embedding_terms: tuple[tuple[str, float], ...]
    output_terms: tuple[tuple[str, float], ...]
    mtp_terms: tuple[tuple[str, float], ...]
    transient_terms: dict[tuple[bool, bool], tuple[tuple[str, float], ...]]
    mamba_terms: tuple[tuple[str, float], ...]  # a hybrid `M` layer (() for a GPT model)
    attention_terms: tuple[tuple[str, float], ...]  # a hybrid `*` layer (() for a GPT model)
    full_layers: int | None
    dense_layer: float
    moe_layer: float
    dense_kept: float
    moe_kept: float
    embedding: float
    output: float
    mtp: float
    mamba_layer: float = 0.0
    attention_layer: float = 0.0

    def _split(self, dense: int, moe: int) -> tuple[int, int, int, int]:
        """(recomputed dense, recomputed MoE, kept dense, kept MoE) layers of a chunk: the block of
        `full_layers` is the chunk's first layers (megatron-core `transformer_block.py`, method 'block')."""
        if self.full_layers is None:
            return dense, moe, 0, 0
        n = min(self.full_layers, dense + moe)
        rd = min(dense, n)
        rm = n - rd
        return rd, rm, dense - rd, moe - rm

    def chunk(self, *, dense: int, moe: int, has_embedding: bool, has_output: bool, mtp: int = 0, mamba: int = 0,
              attention: int = 0) -> float:
        """A chunk's layers: GPT dense and MoE layers, or a hybrid chunk's `-`, `E`, `M` and `*` layers."""
        return chunk_bytes(self, self._split(dense, moe), mamba=mamba, attention=attention, mtp=mtp,
                           has_embedding=has_embedding, has_output=has_output)

    def transient(self, *, has_output: bool, has_moe: bool) -> float:
        return sum(v for _, v in self.transient_terms[(has_output, has_moe)])

    def breakdown(self, *, chunks: tuple[tuple[int, int, int], ...], inflight: tuple[int, ...], first_dense: int,
                  last: int, has_output: bool, has_moe: bool, transients: bool = True,
                  mtp: tuple[int, ...] | None = None, pattern: str | None = None) -> tuple[tuple[str, float], ...]:
        """The named terms of one stage: in-flight micro-batches x chunk terms, plus (optionally) transients.
        `mtp` gives the MTP layers of every model chunk (by chunk index k), None for none; `pattern` a hybrid
        model's layer symbols (`chunk_kinds`)."""
        out: dict[str, float] = {}

        def add(terms: tuple[tuple[str, float], ...], weight: float) -> None:
            if not weight:
                return
            for name, value in terms:
                out[name] = out.get(name, 0.0) + weight * value

        for (k, start, n), n_inflight in zip(chunks, inflight, strict=False):
            dense, moe, mamba, attention = chunk_kinds(pattern, first_dense, start, n)
            add(self.mamba_terms, n_inflight * mamba)
            add(self.attention_terms, n_inflight * attention)
            rd, rm, kd, km = self._split(dense, moe)
            add(self.dense_terms, n_inflight * rd)
            add(self.moe_terms, n_inflight * rm)
            add(self.dense_kept_terms, n_inflight * kd)
            add(self.moe_kept_terms, n_inflight * km)
            if k == 0:
                add(self.embedding_terms, n_inflight)
            if k == last:
                add(self.output_terms, n_inflight)
            if mtp is not None and mtp[k]:
                add(self.mtp_terms, n_inflight * mtp[k])
        if transients:
            add(self.transient_terms[(has_output, has_moe)], 1)
        return tuple(out.items())


def unit_activation_bytes(job: Job, layout: Layout, assumptions: ActivationAssumptions,
                          vocab: int) -> UnitActivations:
    """The building blocks for `layout` (only TP, SP, CP, MBS, ETP and recompute matter)."""
    model = job.model
    x = shape_of(job, layout, assumptions)
    hybrid = model.hybrid_pattern is not None

    def layer(kind: str | None, moe: bool) -> tuple[tuple[str, float], ...]:
        return tuple(layer_activation_bytes(job, layout, assumptions, moe=moe, kind=kind).items())

    dense = layer("-" if hybrid else None, False)
    moe = layer("E" if hybrid else None, True) if model.moe is not None else ()
    mamba = layer("M", False) if model.mamba is not None else ()
    attention = layer("*", False) if hybrid else ()
    full_layers = job.training.recompute_num_layers if layout.recompute == "full" else None
    if full_layers is not None:
        kept_layout = replace(layout, recompute="none")
        dense_kept = tuple(layer_activation_bytes(job, kept_layout, assumptions, moe=False).items())
        moe_kept = tuple(layer_activation_bytes(job, kept_layout, assumptions, moe=True).items()) \
            if model.moe is not None else ()
    else:
        dense_kept, moe_kept = (), ()
    emb = tuple(embedding_activation_bytes(model, x).items())
    out = tuple(output_activation_bytes(model, x, vocab).items())
    mtp = tuple(mtp_activation_bytes(job, layout, assumptions, vocab).items()) if model.mtp_num_layers else ()
    transients = {
        (o, m): tuple(transient_activation_bytes(job, layout, assumptions, has_output=o, has_moe=m,
                                                 vocab=vocab).items())
        for o in (False, True) for m in (False, True)
    }
    return UnitActivations(
        dense_terms=dense, moe_terms=moe, dense_kept_terms=dense_kept, moe_kept_terms=moe_kept,
        embedding_terms=emb, output_terms=out, mtp_terms=mtp, transient_terms=transients, full_layers=full_layers,
        dense_layer=sum(v for _, v in dense), moe_layer=sum(v for _, v in moe),
        dense_kept=sum(v for _, v in dense_kept), moe_kept=sum(v for _, v in moe_kept),
        embedding=sum(v for _, v in emb), output=sum(v for _, v in out), mtp=sum(v for _, v in mtp),
        mamba_terms=mamba, attention_terms=attention, mamba_layer=sum(v for _, v in mamba),
        attention_layer=sum(v for _, v in attention),
    )


def inflight_microbatches_per_chunk(pp: int, vpp: int, microbatches: int, stage: int,
                                    extra_warmup: int = 0) -> tuple[int, ...]:
    """Micro-batches whose activations stage `stage` holds at its peak, per model chunk (megatron-core 0.16.1
    `pipeline_parallel/schedules.py::get_pp_rank_microbatches`).

    1F1B: `min(PP - stage - 1, m)` warm-up forwards, then one more before the first backward: stage 0 keeps
    min(PP, m) (Narayanan et al. 2021 Sec. 2.2.1). Interleaved: `(PP - stage - 1) * 2 + (VPP - 1) * PP` warm-up
    forwards (+1 with `overlap_moe_expert_parallel_comm`: `extra_warmup`) plus one, visiting the chunks in groups
    of PP micro-batches; for stage 0 that is PP*VPP + PP - 1 chunk-micro-batches, PP * (1 + (PP - 1) / (PP * VPP))
    stage-micro-batches (Korthikanti Sec. 4.2.3).
    """
    if vpp == 1:
        return (min(pp - stage, microbatches),)
    total = microbatches * vpp
    n = min((pp - stage - 1) * 2 + (vpp - 1) * pp + extra_warmup + 1, total)
    groups, rem = divmod(n, pp)
    cycles, partial = divmod(groups, vpp)
    return tuple(cycles * pp + (pp if c < partial else 0) + (rem if c == partial else 0) for c in range(vpp))

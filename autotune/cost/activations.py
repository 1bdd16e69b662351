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

The pipeline schedule decides how many micro-batches each stage keeps (`inflight_microbatches_per_chunk`). This
module holds the tensors of attention, MLP, Mamba, embedding and output; the MoE layer's and its paged stash are in
`autotune/cost/moe_activations.py`; a layer's, a chunk's and a stage's sums (`UnitActivations`) in
`autotune/cost/activation_units.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.cost.efficiency import OPERAND_BYTES
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.model import ModelSpec

__all__ = [
    "ActivationAssumptions",
    "Shape",
    "shape_of",
    "saved_gemm_input_bytes",
    "norm_terms",
    "swiglu_terms",
    "attention_activation_bytes",
    "mlp_activation_bytes",
    "mamba_activation_bytes",
    "cuda_graph_static_bytes",
    "embedding_activation_bytes",
    "output_activation_bytes",
    "backward_working_set",
    "loss_transient_bytes",
    "inflight_microbatches_per_chunk",
    "BF16",
    "FP32",
    "INDEX32",
    "MASK_BYTES",
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


def norm_terms(prefix: str, x: Shape, h: int) -> dict[str, float]:
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
    terms = norm_terms("attn_norm", x, h)
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


def swiglu_terms(model: ModelSpec, x: Shape, tokens: float, ffn: float, split: int) -> tuple[float, float]:
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
    or its FP8 copy) are kept, /t with SP; then the fc1 output and the fc2 input (`swiglu_terms`).
    'mlp' recompute keeps only the checkpoint's input (the norm input with TE, the norm output with the local
    spec, whose norm is its own module); 'layernorm' recompute changes nothing where the norm is fused.
    """
    T, sd, h = x.tokens, x.sp_div, model.hidden_size
    terms = norm_terms("mlp_norm", x, h)
    inner = "mlp" in x.modules
    fc1_output, fc2_input = swiglu_terms(model, x, T, ffn, x.t)
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
    terms = norm_terms("mamba_norm", x, h)
    terms["mamba_in_proj_input"] = (x.gemm_in if x.te else BF16) * T * h / sd
    terms["mamba_in_proj_output"] = BF16 * T * m.in_proj_width / t
    terms["mamba_scan_output"] = BF16 * T * m.d_inner / t
    terms["mamba_norm_input"] = BF16 * T * m.d_inner / t + FP32 * T * m.num_groups / t
    terms["mamba_out_proj_input"] = (x.gemm_in if x.te else BF16) * T * m.d_inner / t
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
    terms = norm_terms("final_norm", x, h)
    terms["output_layer_input"] = BF16 * T * h / x.sp_div
    if x.ce_fused:
        terms["logits_bf16"] = BF16 * T * vocab / x.t
    else:
        terms["logits_fp32"] = FP32 * T * vocab / x.t
    return terms


def backward_working_set(job: Job, layout: Layout, x: Shape, *, has_moe: bool, stash: bool = False) -> float:
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


def loss_transient_bytes(job: Job, x: Shape, vocab: int) -> float:
    """Per logit, beyond what the loss saves: megatron's `vocab_parallel_cross_entropy` (`cross_entropy_fusion=
    "none"`) casts the bf16 logits to fp32 and works in place, so the bf16 logits (2 B) are alive beside the fp32
    softmax during the forward (the backward's bf16 gradient is the same size); the jit-fused native version
    (`fusions/fused_cross_entropy.py`, `"native"`) also keeps the fp32 cast beside the fp32 exp_logits it returns
    (2 + 4 B); TE's fused cross-entropy writes the gradient into the bf16 logits in place (0)."""
    per_logit = 0.0 if x.ce_fused else (2.0 + 4.0 if job.training.cross_entropy_fusion == "native" else 2.0)
    return per_logit * x.tokens * vocab / x.t


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

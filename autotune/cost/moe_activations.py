"""Activation memory of a MoE layer, tensor by tensor: the router, the token permutation and the routed and shared
experts (`moe_activation_bytes`), and the paged stash that full-iteration CUDA graphs keep the experts' tensors in
(`PagedStash`, megatron-core >= 0.17 `transformer/moe/paged_stash.py`). The frame and the GPU / CPU-proxy
conventions are `autotune/cost/activations.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.cost.activations import (
    BF16,
    FP32,
    INDEX32,
    MASK_BYTES,
    ActivationAssumptions,
    Shape,
    norm_terms,
    shape_of,
    swiglu_terms,
)
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.model import ModelSpec

__all__ = ["PagedStash", "rank_capacity_tokens", "paged_stash_of", "expert_bytes_per_token", "paged_stash_bytes",
           "moe_activation_bytes", "moe_capacity_working_set"]


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
    fc1_out, fc2_in = swiglu_terms(model, x, 1.0, ffn, etp)
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
        s_out, s_in = swiglu_terms(model, x, T, m.shared_expert_ffn_hidden_size, t)
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
    terms = norm_terms("mlp_norm", x, h)
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

"""Real megatron-core 0.19 hybrid (Mamba) models for a hybrid `ModelSpec` and a `Layout` on a CPU.

megatron-core's own hybrid spec (`models/hybrid/hybrid_layer_specs.py::hybrid_stack_spec`) is Transformer Engine
only, and `ssm/mamba_mixer.py::MambaMixer` refuses to build without `mamba_ssm` (`HAVE_MAMBA_SSM`) and its gated
RMSNorm (`RMSNormGated`). Construction runs no kernel, so this module builds megatron-core's real `HybridModel`,
`HybridStack`, `MambaLayer`, `MambaMixer`, `MLPLayer`, `TransformerLayer` and `MoETransformerLayer` with CPU
stand-ins that hold the same parameters:
- TE's `TELayerNormColumnParallelLinear` -> `megatron_build`'s `LayerNormColumnParallelLinear` (norm weight +
  column-parallel linear), `TERowParallelLinear` -> megatron-core's `RowParallelLinear`, `TENorm` (the MoE layer's
  pre-MLP norm, the final norm) -> `WrappedTorchNorm`, TE's core attention -> `TEStyleCoreAttention`;
- mamba_ssm's `RMSNormGated` (`ExtendedRMSNorm`) -> `GatedNormStandIn`, one weight of the local d_inner, as
  mamba_ssm's `layernorm_gated.RMSNorm` has (`norm_before_gate=False`, no bias);
- the module flags `HAVE_MAMBA_SSM` / `HAVE_EINOPS` set for the build only (restored after).
What this cannot check on a CPU (no CUDA kernels): the chunked scan and the causal convolution themselves
(mamba_ssm's Triton `mamba_split_conv1d_scan_combined`, causal_conv1d), so activations, forward and backward of
`M` layers, and the pipeline schedule over a hybrid model, are not run here.
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any

from search_spaces.layout import Layout
from search_spaces.model import ModelSpec, padded_vocab_size

import megatron_build as mb

__all__ = ["hybrid_config", "hybrid_stage_param_counts", "hybrid_stage_layers", "build_stage"]


def hybrid_config(model: ModelSpec, layout: Layout) -> Any:
    """The `TransformerConfig` Megatron-Bridge's `HybridModelProvider` builds for the model (squared ReLU, no gated
    MLP, `is_hybrid_model`, the Mamba sizes), in the layout."""
    mc = mb.setup()
    from megatron.core.activations import squared_relu

    kw = mb.config_kwargs(model, layout)
    kw.pop("moe_layer_freq", None)  # the pattern places the MoE layers
    assert model.mamba is not None
    kw.update(activation_func=squared_relu, is_hybrid_model=True, mamba_num_heads=model.mamba.num_heads,
              mamba_head_dim=model.mamba.head_dim, mamba_state_dim=model.mamba.state_dim,
              mamba_num_groups=model.mamba.num_groups)
    if model.moe is not None and model.moe.latent_size is not None:
        kw["moe_latent_size"] = model.moe.latent_size  # LatentMoE (moe/moe_layer.py:264-296)
    if model.mtp_num_layers:  # hybrid MTP: one '*E' depth per layer, one shared layer when repeated
        kw.update(mtp_num_layers=model.mtp_num_layers, mtp_use_repeated_layer=model.mtp_repeated_layer)
    return mc.TransformerConfig(**kw)


def _stack_spec() -> Any:
    mc = mb.setup()
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.models.hybrid.hybrid_block import HybridStack, HybridStackSubmodules
    from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
    from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
    from megatron.core.ssm.mlp_layer import MLPLayer
    from megatron.core.tensor_parallel.layers import RowParallelLinear
    from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from megatron.core.transformer.multi_token_prediction import (
        MultiTokenPredictionBlock,
        MultiTokenPredictionBlockSubmodules,
        MultiTokenPredictionLayer,
        MultiTokenPredictionLayerSubmodules,
    )
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_layer import (
        MoETransformerLayer,
        TransformerLayer,
        TransformerLayerSubmodules,
    )

    norm_linear = mc.LayerNormColumnParallelLinear
    return ModuleSpec(module=HybridStack, submodules=HybridStackSubmodules(
        mamba_layer=ModuleSpec(module=MambaLayer, submodules=MambaLayerSubmodules(
            mixer=ModuleSpec(module=MambaMixer, submodules=MambaMixerSubmodules(
                in_proj=norm_linear, out_proj=RowParallelLinear)),
            mamba_bda=get_bias_dropout_add)),
        attention_layer=ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules(
            self_attention=ModuleSpec(module=SelfAttention, params={"attn_mask_type": AttnMaskType.causal},
                                      submodules=SelfAttentionSubmodules(
                                          linear_qkv=norm_linear, core_attention=mc.TEStyleCoreAttention,
                                          linear_proj=RowParallelLinear)),
            self_attn_bda=get_bias_dropout_add)),
        mlp_layer=ModuleSpec(module=MLPLayer, submodules=TransformerLayerSubmodules(
            mlp=partial(MLP.as_mlp_submodule, submodules=MLPSubmodules(linear_fc1=norm_linear,
                                                                        linear_fc2=RowParallelLinear)),
            mlp_bda=get_bias_dropout_add)),
        moe_layer=ModuleSpec(module=MoETransformerLayer, submodules=TransformerLayerSubmodules(
            pre_mlp_layernorm=WrappedTorchNorm,
            mlp=get_moe_module_spec(use_te=False, num_experts=8, moe_grouped_gemm=False),
            mlp_bda=get_bias_dropout_add)),
        # megatron-core `hybrid_layer_specs.py::_hybrid_mtp_block_spec` with the CPU modules: enorm, hnorm and the
        # final norm, eh_proj column-parallel (TE's TEColumnParallelLinear on a GPU); the '*E' layers are the stack's
        mtp_block_spec=ModuleSpec(module=MultiTokenPredictionBlock, submodules=MultiTokenPredictionBlockSubmodules(
            layer_specs=[ModuleSpec(module=MultiTokenPredictionLayer, submodules=MultiTokenPredictionLayerSubmodules(
                enorm=WrappedTorchNorm, hnorm=WrappedTorchNorm, eh_proj=mc.ColumnParallelLinear,
                mtp_model_layer=None, layer_norm=WrappedTorchNorm))])),
    ))


@contextlib.contextmanager
def _mamba_stand_ins():
    """mamba_ssm's gated norm and the import flags, for the build only; TE's norm in the stack module."""
    import torch
    from megatron.core.models.hybrid import hybrid_block
    from megatron.core.ssm import mamba_mixer
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    class GatedNormStandIn(torch.nn.Module):
        """mamba_ssm `layernorm_gated.RMSNorm(hidden_size, eps, group_size, norm_before_gate)`: one weight."""

        def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=False, device=None, dtype=None):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(hidden_size, dtype=dtype))

    saved = {(mamba_mixer, k): getattr(mamba_mixer, k) for k in ("ExtendedRMSNorm", "RMSNormGated",
                                                                 "HAVE_MAMBA_SSM", "HAVE_EINOPS")}
    class DuplicatedLinearStandIn(torch.nn.Module):
        """TE's `TELinear(input_size, output_size, parallel_mode="duplicated", bias=...)`, LatentMoE's
        fc1/fc2_latent_proj (moe/moe_layer.py:273-296): the whole output x input weight on every rank (TE is not
        installed on CPU; `duplicated` splits nothing), a bias of the output width when asked."""

        def __init__(self, input_size, output_size, *, config, bias, **_):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype))
            self.bias = torch.nn.Parameter(torch.empty(output_size, dtype=config.params_dtype)) if bias else None

    from megatron.core.transformer.moe import moe_layer

    saved[(hybrid_block, "TENorm")] = hybrid_block.TENorm
    saved[(moe_layer, "HAVE_TE")] = moe_layer.HAVE_TE
    saved[(moe_layer, "TELinear")] = getattr(moe_layer, "TELinear", None)
    moe_layer.HAVE_TE = True
    moe_layer.TELinear = DuplicatedLinearStandIn
    mamba_mixer.ExtendedRMSNorm = mamba_mixer.RMSNormGated = GatedNormStandIn
    mamba_mixer.HAVE_MAMBA_SSM = mamba_mixer.HAVE_EINOPS = True
    hybrid_block.TENorm = WrappedTorchNorm
    try:
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def build_stage(model: ModelSpec, layout: Layout, config: Any, stage: int) -> list[tuple[str, Any]]:
    """Stage `stage`'s `HybridModel` on its first rank: ("__layers__", its layer symbols), then its parameters."""
    return _build_stage(model, layout, config, stage)


def _build_stage(model: ModelSpec, layout: Layout, config: Any, stage: int) -> list[tuple[str, Any]]:
    mc = mb.setup()
    from megatron.core.models.hybrid.hybrid_model import HybridModel
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, initialize_rng_tracker

    ps = mc.parallel_state
    mb.init_rank(layout, mb.stage_first_rank(layout.world_size, layout, stage), config)
    try:
        initialize_rng_tracker(force_reset=True)
        get_cuda_rng_tracker().add("model-parallel-rng", 1234)  # MambaMixer forks it (mamba_mixer.py:318)
        vpp = config.virtual_pipeline_model_parallel_size
        layers, params = "", []
        with _mamba_stand_ins(), mb.meta_device():
            for v in range(vpp or 1):  # one chunk per virtual stage, as Megatron-LM's hybrid builder makes them
                vp = v if vpp else None
                built = HybridModel(config=config, hybrid_stack_spec=_stack_spec(),
                                    # megatron-core's unified pattern: the MTP depths after '/' ('*E' each)
                                    hybrid_layer_pattern=f"{model.hybrid_pattern}{'/*E' * model.mtp_num_layers}",
                                    vocab_size=padded_vocab_size(model.vocab_size, layout.tp), max_sequence_length=4096,
                                    pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
                                    post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
                                    share_embeddings_and_output_weights=model.tied_embeddings,
                                    position_embedding_type="none", vp_stage=vp)
                layers += "".join(getattr(built.decoder, "layer_type_list", []))
                params += list(built.named_parameters())
        return [("__layers__", layers)] + params
    finally:
        mb.teardown()


def hybrid_stage_param_counts(cases: list[tuple[ModelSpec, Layout]]) -> list[list[tuple[int, int, str]]]:
    """For each (model, layout), the first rank of every pipeline stage: (dense parameters, expert parameters
    (`allreduce=False`), the stage's layer symbols), bf16 on the meta device."""
    out = []
    for model, layout in cases:
        config = hybrid_config(model, layout)
        stages = []
        for stage in range(layout.pp):
            built = _build_stage(model, layout, config, stage)
            layers = built[0][1]
            params = [p for _, p in built[1:]]
            stages.append((sum(p.numel() for p in params if getattr(p, "allreduce", True)),
                           sum(p.numel() for p in params if not getattr(p, "allreduce", True)), layers))
        out.append(stages)
    return out


def hybrid_stage_layers(cases: list[tuple[ModelSpec, Layout]]) -> list[list[str]]:
    """megatron-core's own pipeline segment per stage (`hybrid_layer_allocation.py::select_pipeline_segment`, the
    split `HybridModel` builds), or "error: <its ValueError>" for a split it refuses."""
    mc = mb.setup()
    from megatron.core.models.hybrid.hybrid_layer_allocation import select_pipeline_segment

    out = []
    for model, layout in cases:
        got: list[str] = []
        for stage in range(layout.pp):
            pipeline = Layout(pp=layout.pp)
            mb.init_rank(pipeline, stage)
            try:
                layers, _ = select_pipeline_segment(model.hybrid_pattern or "",
                                                    mc.parallel_state.get_pipeline_model_parallel_group(),
                                                    None, layout.first_stage_layers, layout.last_stage_layers)
                got.append("".join(layers))
            except ValueError as err:
                got.append(f"error: {err}")
                break
            finally:
                mb.teardown()
        out.append(got)
    return out

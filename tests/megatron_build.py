"""Real megatron-core GPT models for a `ModelSpec` and a `Layout` on a CPU: the tests' and benchmarks' builder.

Works with megatron-core 0.16.1 (Python 3.11) and 0.19.2 (Python 3.12); `tests/megatron_runner.py` runs its
functions in the interpreter of either. Where the two releases differ, a signature or feature check picks the
call (each cites its source file:line; paths under `megatron/core/`). This module and what it imports
(search_spaces, trainers.cpu_patches, megatron, torch) stay Python-3.11 compatible and need no pytest.

`build_chunks` builds one rank's model chunks (one `GPTModel` per virtual stage) the way Megatron-LM's
`gpt_builders.gpt_builder` does (identical in core_v0.16.1 and core_v0.19.0): a MoE model takes the decoder block
spec of `get_gpt_decoder_block_spec` (so `moe_layer_freq` makes DeepSeek's first layers dense), a dense one the
layer spec; the MTP block spec is built from the last decoder layer's spec (`get_gpt_decoder_layer_specs(...)[-1]`,
or the plain layer spec when this chunk's block holds no layer), the vocabulary padded to a multiple of 128 * TP,
pre/post-process from `parallel_state`. Where megatron-core needs Megatron-Bridge's modules or Transformer
Engine, the spec is patched with CPU stand-ins that build the same parameters:
- the core attention is `TEStyleCoreAttention`: parameter-free like TE's and megatron-core's (except GPT-OSS's
  learnable `softmax_offset`, one per local head), and without the local `DotProductAttention`'s CPU-only limits
  (CP 1, no MLA head dims), which Transformer Engine's attention does not have;
- MLA's down projections are `DuplicatedLinear` (Transformer Engine's `parallel_mode='duplicated'`), or
  megatron-core's column-parallel local ones with `mla_down_proj="column"` (what the CPU proxy builds);
- megatron-core 0.19's MLA with `qk_layernorm` and `q_lora_rank=None` (DeepSeek-V2-Lite) fuses a q norm into
  `linear_q_proj` (`transformer/mla_qk_norm_config.py:147-150`: the backend's `column_parallel_layer_norm_linear`,
  TE's `TELayerNormColumnParallelLinear` on a GPU); the local backend has none (`models/backends.py:114-116`),
  so megatron-core's own local spec cannot build it (`q_layernorm=... is non-trivial, but q_lora_rank is None`,
  `mla_qk_norm_config.py:259-263`). The stand-in is `LayerNormColumnParallelLinear` (TE's parameter names);
- Gemma's post norms: `RowParallelLinearPostNorm` for `linear_proj` and `linear_fc2` (Bridge's
  `TERowParallelLinearLayerNorm`); OLMoE's full-width q/k norms: `FullWidthQKNormSelfAttention` (Bridge's
  `OLMoESelfAttention`).
`with meta_device():` builds without allocating (numel and shapes only), so full-size models build in
milliseconds per layer. Call `setup()` once per process first (CPU patches; imports megatron).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import types
from typing import Any

from search_spaces.layout import Layout
from search_spaces.megatron_names import transformer_config_kwargs
from search_spaces.model import ModelSpec, padded_vocab_size
from search_spaces.training import default_cuda_graph_modules
from trainers.megatron_job import torch_activation

__all__ = ["setup", "config_kwargs", "make_config", "build_chunks", "meta_device", "init_rank", "stage_first_rank",
           "teardown", "megatron_version", "megatron_decision", "megatron_decisions", "timed_megatron_decisions",
           "flex_dispatcher_decisions",
           "param_counts", "stage_param_counts", "MEGATRON_ONLY_PARAMS", "hybrid_stage_param_counts",
           "hybrid_stage_layers", "hybrid_parity", "offload_config_decisions", "fsdp_mesh_decisions",
           "fsdp_offload_decisions"]

_FUSIONS_OFF = dict(gradient_accumulation_fusion=False, bias_activation_fusion=False, masked_softmax_fusion=False,
                    persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False)
# parameters megatron-core builds that autotune's counts (search_spaces/model.py) do not have: 0.19's q norm fused
# into MLA's linear_q_proj when q_lora_rank is None (module docstring); `param_counts` reports them apart
MEGATRON_ONLY_PARAMS = ("linear_q_proj.layer_norm_weight", "linear_q_proj.layer_norm_bias")
mc: Any = None  # the megatron namespace, set by setup()


def setup() -> Any:
    """Import megatron-core and torch, apply the CPU patches once, define the stand-in modules."""
    global mc
    if mc is not None:
        return mc
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from trainers.cpu_patches import apply_cpu_patches, cpu_device_mode

    apply_cpu_patches()
    import megatron.core
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_decoder_layer_specs,
        get_gpt_layer_local_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
    from megatron.core.utils import get_batch_on_this_cp_rank

    class TEStyleCoreAttention(MegatronModule):
        """Stands in for the core attention (TE's on a GPU): no parameters but GPT-OSS's sinks."""

        def __init__(self, config, layer_number, attn_mask_type, attention_type=None, attention_dropout=None,
                     softmax_scale=None, k_channels=None, v_channels=None, cp_comm_type=None, pg_collection=None,
                     **kwargs):
            super().__init__(config=config)
            tp = parallel_state.get_tensor_model_parallel_world_size()
            if config.softmax_type == "learnable":
                self.softmax_offset = torch.nn.Parameter(torch.empty(config.num_attention_heads // tp,
                                                                     dtype=config.params_dtype))

    class DuplicatedLinear(torch.nn.Module):
        """Transformer Engine's `TELinear(parallel_mode='duplicated')`: the whole weight on every TP rank."""

        def __init__(self, input_size, output_size, *, config, bias=False, **kwargs):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype))
            self.bias = torch.nn.Parameter(torch.empty(output_size, dtype=config.params_dtype)) if bias else None

    class LayerNormColumnParallelLinear(ColumnParallelLinear):
        """Transformer Engine's `TELayerNormColumnParallelLinear`: a norm over the input (its `layer_norm_weight`,
        and `layer_norm_bias` for LayerNorm), then a column-parallel linear."""

        def __init__(self, input_size, output_size, *, config, **kwargs):
            super().__init__(input_size, output_size, config=config, **kwargs)
            self.layer_norm_weight = torch.nn.Parameter(torch.empty(input_size, dtype=config.params_dtype))
            if config.normalization == "LayerNorm":
                self.layer_norm_bias = torch.nn.Parameter(torch.empty(input_size, dtype=config.params_dtype))

    class RowParallelLinearPostNorm(RowParallelLinear):
        """Megatron-Bridge's `TERowParallelLinearLayerNorm` (gemma2_provider.py): a norm after the projection."""

        def __init__(self, input_size, output_size, *, config, **kwargs):
            super().__init__(input_size, output_size, config=config, **kwargs)
            self.post_layernorm = WrappedTorchNorm(config=config, hidden_size=output_size,
                                                   eps=config.layernorm_epsilon)

    class FullWidthQKNormSelfAttention(SelfAttention):
        """Megatron-Bridge's `OLMoESelfAttention` (olmoe_provider.py): q/k norms over all heads."""

        def __init__(self, config, submodules, *args, **kwargs):
            super().__init__(config, submodules, *args, **kwargs)
            width = self.hidden_size_per_attention_head * self.config.num_attention_heads
            self.q_layernorm = build_module(submodules.q_layernorm, hidden_size=width, config=self.config,
                                            eps=self.config.layernorm_epsilon)
            self.k_layernorm = build_module(submodules.k_layernorm, hidden_size=width, config=self.config,
                                            eps=self.config.layernorm_epsilon)

    multi_latent_attention.TELinear = DuplicatedLinear  # accepted as 'duplicated' by MLASelfAttention
    qk_norm_resolver = hasattr(multi_latent_attention, "QKNormConfigResolver")  # 0.19: multi_latent_attention.py:39
    if qk_norm_resolver:
        from megatron.core.models.backends import LocalSpecProvider
        from megatron.core.transformer import mla_qk_norm_config

        class CpuTESpecProvider(LocalSpecProvider):
            """The resolver's backend (`mla_qk_norm_config.py:43`, TE's on a GPU): local modules, and TE's fused
            norm + linear as its CPU stand-in."""

            def column_parallel_layer_norm_linear(self) -> type:
                return LayerNormColumnParallelLinear

        mla_qk_norm_config.get_backend = lambda transformer_impl: CpuTESpecProvider()
    cp_batch_params = inspect.signature(get_batch_on_this_cp_rank).parameters
    config_fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    mc = types.SimpleNamespace(
        torch=torch, dist=dist, F=F, FakeStore=FakeStore, cpu_device_mode=cpu_device_mode,
        version=megatron.core.__version__,
        parallel_state=parallel_state, GPTModel=GPTModel, get_gpt_decoder_block_spec=get_gpt_decoder_block_spec,
        get_gpt_decoder_layer_specs=get_gpt_decoder_layer_specs, get_gpt_layer_local_spec=get_gpt_layer_local_spec,
        get_gpt_mtp_block_spec=get_gpt_mtp_block_spec, get_batch_on_this_cp_rank=get_batch_on_this_cp_rank,
        MLATransformerConfig=MLATransformerConfig, TransformerConfig=TransformerConfig, IdentityOp=IdentityOp,
        ColumnParallelLinear=ColumnParallelLinear, TEStyleCoreAttention=TEStyleCoreAttention,
        DuplicatedLinear=DuplicatedLinear, LayerNormColumnParallelLinear=LayerNormColumnParallelLinear,
        RowParallelLinearPostNorm=RowParallelLinearPostNorm, FullWidthQKNormSelfAttention=FullWidthQKNormSelfAttention,
        # 0.19 fuses MLA's q norm into linear_q_proj without q_lora_rank (mla_qk_norm_config.py:147-150)
        qk_norm_resolver=qk_norm_resolver,
        # 0.19: get_batch_on_this_cp_rank(batch, is_hybrid_cp, cp_group=None, ...) (utils.py:2612-2615);
        # 0.16.1: get_batch_on_this_cp_rank(batch) (utils.py:1994)
        cp_batch_needs_group="is_hybrid_cp" in cp_batch_params,
        # 0.19 renamed cuda_graph_scope to cuda_graph_modules (transformer_config.py:1047, the old name deprecated at
        # :1086); 0.16.1 has cuda_graph_scope only (transformer_config.py:784)
        cuda_graph_modules_field="cuda_graph_modules" if "cuda_graph_modules" in config_fields else "cuda_graph_scope",
    )
    return mc


def megatron_version() -> str:
    """The imported megatron-core's `__version__` (the runner's child checks it against the version asked for)."""
    return setup().version


@contextlib.contextmanager
def meta_device():
    """Build on torch's meta device (no memory) with megatron's `.cuda()` / `device="cuda"` sent to the CPU."""
    with mc.cpu_device_mode(), mc.torch.device("meta"):
        yield


def config_kwargs(model: ModelSpec, layout: Layout, *, bf16: bool = True, training: Any = None,
                  offload: bool = False) -> dict[str, Any]:
    """TransformerConfig keyword arguments of the model in the layout (megatron-core names); the layer offload
    (`cpu_offloading`) only with `offload`, for a config that is checked and not built."""
    torch = mc.torch
    dtype = torch.bfloat16 if bf16 else torch.float32
    kw: dict[str, Any] = transformer_config_kwargs(model, layout, training)  # the one ModelSpec -> config path
    kw.update(activation_func=torch_activation(str(kw["activation_func"])), params_dtype=dtype, pipeline_dtype=dtype,
              bf16=bf16, use_cpu_initialization=True, perform_initialization=False, hidden_dropout=0.0,
              attention_dropout=0.0, **_FUSIONS_OFF)
    if model.moe is not None:
        kw.update(moe_grouped_gemm=False, moe_token_dispatcher_type="alltoall")
    if model.mla is not None:
        kw.update(rope_type="rope")
    kw.update(overlap_moe_expert_parallel_comm=layout.ep_overlap)
    if offload and layout.offload_layers:
        # the layer offload for the config's checks only: megatron-core's local layer spec has no offload context
        # (Transformer Engine's: "CPU Offloading is enabled when TE is not present", transformer/transformer_block.py
        # :313-316 in 0.19.2), so models are built without it
        kw.update(cpu_offloading=True, cpu_offloading_num_layers=layout.offload_layers)
    if layout.cuda_graphs != "none":
        # the layout's graphs as megatron_names.job_settings spells them for the installed release: 0.16.1 has no
        # cuda_graph_impl "full_iteration" but local graphs of the scope ["full_iteration"]
        modules = (training.cuda_graph_modules if training is not None and training.cuda_graph_modules is not None
                   else default_cuda_graph_modules(model.is_moe))
        if layout.cuda_graphs == "full_iteration":
            new = mc.cuda_graph_modules_field == "cuda_graph_modules"
            kw.update(cuda_graph_impl="full_iteration" if new else "local")
            kw[mc.cuda_graph_modules_field] = [] if new else ["full_iteration"]
        else:
            kw.update(cuda_graph_impl=layout.cuda_graphs)
            kw[mc.cuda_graph_modules_field] = list(modules)  # () is the whole layer in both
    return kw


def make_config(model: ModelSpec, layout: Layout, **kwargs: Any) -> Any:
    kw = config_kwargs(model, layout, **kwargs)
    return (mc.MLATransformerConfig if model.mla is not None else mc.TransformerConfig)(**kw)


def _replace_submodules(spec: Any) -> Any:
    return dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules))


def _with_post_norm_fc2(mlp: Any) -> Any:
    """A dense MLP spec with `RowParallelLinearPostNorm` as linear_fc2 (a MoE spec unchanged). 0.19's dense MLP
    spec is `functools.partial(MLP.as_mlp_submodule, submodules=MLPSubmodules(...))`
    (models/gpt/gpt_layer_specs.py:547-552), 0.16.1's a `ModuleSpec(module=MLP, submodules=...)`."""
    if isinstance(mlp, functools.partial):
        submodules: Any = mlp.keywords.get("submodules")
        if not hasattr(submodules, "linear_fc2"):
            return mlp
        keywords = {**mlp.keywords, "submodules": dataclasses.replace(submodules,
                                                                      linear_fc2=mc.RowParallelLinearPostNorm)}
        return functools.partial(mlp.func, *mlp.args, **keywords)
    if hasattr(mlp, "submodules") and hasattr(mlp.submodules, "linear_fc2"):
        mlp = _replace_submodules(mlp)
        mlp.submodules.linear_fc2 = mc.RowParallelLinearPostNorm
    return mlp


def _patch_layer(model: ModelSpec, spec: Any, mla_down_proj: str) -> Any:
    """A copy of one transformer layer spec with the CPU stand-ins (module docstring)."""
    spec = _replace_submodules(spec)
    sub = spec.submodules
    attn = _replace_submodules(sub.self_attention)
    attn.submodules.core_attention = mc.TEStyleCoreAttention
    if model.mla is not None and mla_down_proj == "duplicated":
        if hasattr(attn.submodules, "linear_q_down_proj") and model.mla.q_lora_rank is not None:
            attn.submodules.linear_q_down_proj = mc.DuplicatedLinear
        attn.submodules.linear_kv_down_proj = mc.DuplicatedLinear
    if model.mla is not None and model.mla.q_lora_rank is None and model.qk_layernorm and mc.qk_norm_resolver:
        # as 0.19's TE spec: q_layernorm IdentityOp (models/gpt/gpt_layer_specs.py:308), the resolver fuses the q
        # norm into linear_q_proj (transformer/mla_qk_norm_config.py:147-150); the local spec's qk_norm
        # (gpt_layer_specs.py:428) is refused without q_lora_rank (mla_qk_norm_config.py:259-263)
        attn.submodules.q_layernorm = mc.IdentityOp
    if model.post_norms:
        attn.submodules.linear_proj = mc.RowParallelLinearPostNorm
        sub.mlp = _with_post_norm_fc2(sub.mlp)
    if model.qk_layernorm and not model.qk_layernorm_per_head:
        attn.module = mc.FullWidthQKNormSelfAttention
    sub.self_attention = attn
    return spec


def _layer_spec(config: Any) -> Any:
    """Megatron-LM's `gpt_builders._get_transformer_layer_spec` for `--transformer-impl local`."""
    return mc.get_gpt_layer_local_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=config.moe_grouped_gemm,
                                       qk_layernorm=config.qk_layernorm,
                                       multi_latent_attention=config.multi_latent_attention,
                                       normalization=config.normalization)


def _decoder_spec(model: ModelSpec, config: Any, vp: int | None, mla_down_proj: str) -> Any:
    """`gpt_builder`'s decoder spec: the block spec for a MoE model (`args.num_experts`), else the layer spec."""
    if config.num_moe_experts:
        block = mc.get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                              normalization=model.normalization, vp_stage=vp)
        return dataclasses.replace(block,
                                   layer_specs=[_patch_layer(model, s, mla_down_proj) for s in block.layer_specs])
    return _patch_layer(model, _layer_spec(config), mla_down_proj)


def _mtp_spec(model: ModelSpec, config: Any, decoder: Any, vp: int | None, mla_down_proj: str) -> Any:
    """`gpt_builder`'s MTP block spec: built on the last decoder layer's spec, or on the layer spec when this
    chunk's block holds no layer (Megatron-LM gpt_builders.py, core_v0.16.1 and core_v0.19.0)."""
    if not model.mtp_num_layers:
        return None
    if hasattr(decoder, "layer_specs") and len(decoder.layer_specs) == 0:
        last = _layer_spec(config)
    else:
        last = mc.get_gpt_decoder_layer_specs(config, use_transformer_engine=False,
                                              normalization=model.normalization, vp_stage=vp)[-1]
    return mc.get_gpt_mtp_block_spec(config, _patch_layer(model, last, mla_down_proj), use_transformer_engine=False,
                                     vp_stage=vp)


def build_chunks(model: ModelSpec, layout: Layout, config: Any, *, seq: int = 128,
                 mla_down_proj: str = "duplicated") -> list[Any]:
    """This rank's GPTModel chunks (parallel_state must be initialised for the layout)."""
    ps = mc.parallel_state
    vpp = config.virtual_pipeline_model_parallel_size
    chunks = []
    for v in range(vpp or 1):
        vp = v if vpp else None
        decoder = _decoder_spec(model, config, vp, mla_down_proj)
        chunks.append(mc.GPTModel(
            config=config, transformer_layer_spec=decoder,
            vocab_size=padded_vocab_size(model.vocab_size, layout.tp),
            max_sequence_length=max(seq, model.max_position_embeddings),
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            share_embeddings_and_output_weights=model.tied_embeddings,
            position_embedding_type="learned_absolute" if model.max_position_embeddings else "rope",
            mtp_block_spec=_mtp_spec(model, config, decoder, vp, mla_down_proj), vp_stage=vp,
        ))
    return chunks


def stage_first_rank(world: int, layout: Layout, stage: int) -> int:
    """The first global rank of pipeline stage `stage`: megatron-core orders ranks tp-cp-ep-dp-pp, PP outermost."""
    return stage * (world // layout.pp)


def init_rank(layout: Layout, rank: int, config: Any = None, world: int | None = None) -> None:
    """A fake process group for `rank` of a world of `world` GPUs (default the layout's; no communication),
    then megatron's groups."""
    dist, ps = mc.dist, mc.parallel_state
    ps.destroy_model_parallel()  # always: a failed initialize_model_parallel leaves globals (the VPP size) set
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=mc.FakeStore(), rank=rank, world_size=world or layout.world_size)
    vpp = config.virtual_pipeline_model_parallel_size if config is not None else layout.vpp
    ps.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=vpp, context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep, expert_tensor_parallel_size=layout.expert_tp,
        create_gloo_process_groups=False)


def teardown() -> None:
    dist, ps = mc.dist, mc.parallel_state
    ps.destroy_model_parallel()  # always: a failed initialize_model_parallel leaves globals (the VPP size) set
    if dist.is_initialized():
        dist.destroy_process_group()


# --- megatron-core's own decision on a layout: every stage, every chunk, the schedule's first step ------------
class _ReachedForward(Exception):
    """Raised by the forward-step stand-in: the pipeline schedule got as far as the first forward step."""


def _run_schedule(config: Any, chunks: list[Any], layout: Layout, num_microbatches: int, seq: int) -> None:
    """Call megatron-core's pipeline schedule (`get_forward_backward_func`: 1F1B, interleaved with VPP) until it
    asks for the first forward step. Its checks (micro-batches vs PP for the interleaved schedule, p2p shapes)
    run before that; the p2p receive of a later stage returns at once on the fake process group."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def forward_step(data_iterator, model, **kwargs):  # noqa: ANN001 - EP overlap passes return_schedule_plan
        raise _ReachedForward

    schedule = get_forward_backward_func()
    model = chunks if len(chunks) > 1 else chunks[0]
    iterators = [iter(())] * len(chunks) if len(chunks) > 1 else iter(())
    try:
        with mc.cpu_device_mode():
            schedule(forward_step_func=forward_step, data_iterator=iterators, model=model,
                     num_microbatches=num_microbatches, seq_length=seq // layout.cp,
                     micro_batch_size=layout.mbs, forward_only=False)
    except _ReachedForward:
        return
    raise RuntimeError("the pipeline schedule returned without calling the forward step")


def _cp_batch_split(seq: int) -> None:
    """`get_batch_on_this_cp_rank` on a batch of one sequence (the 2*CP load-balanced chunks)."""
    batch = {"tokens": mc.torch.zeros(1, seq)}
    if mc.cp_batch_needs_group:  # 0.19 (utils.py:2612-2615): no cu_seqlens, so the per-sequence split (:2652)
        mc.get_batch_on_this_cp_rank(batch, is_hybrid_cp=False,
                                     cp_group=mc.parallel_state.get_context_parallel_group())
    else:
        mc.get_batch_on_this_cp_rank(batch)


_COMPUTE_CAPABILITY = {"ampere": (8, 0), "hopper": (9, 0), "blackwell": (10, 0)}


def _init_rng_tracker(job: Any, layout: Layout) -> None:
    """The RNG tracker as Megatron-LM's `initialize._set_random_seed` makes it: cudagraph-safe when the run uses
    CUDA graphs (`use_cudagraphable_rng=args.cuda_graph_impl != "none"`, megatron/training/initialize.py:138 in
    core_v0.16.1, :119 in core_v0.19.0); local graphs refuse any other tracker (transformer/cuda_graphs.py:1406-1410
    in 0.16.1, :1822-1826 in 0.19.2). Nothing here captures a graph, so on a CPU build of torch two CUDA queries
    the graphs' setup makes get CPU stand-ins."""
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    torch = mc.torch
    graphs = layout.cuda_graphs != "none"
    if graphs and not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
        # torch 2.13.0+cpu lacks it; the tracker asks for it (tensor_parallel/random.py:176-181 in 0.16.1)
        torch.cuda.CUDAGraph.register_generator_state = lambda self, *args, **kwargs: None
    if graphs and not torch.cuda.is_available():
        # 0.16.1's CudaGraphManager reads the device's compute capability (the job's GPU's) and takes a graph
        # memory pool (transformer/cuda_graphs.py:1413, :1431); a CPU build has neither
        capability = _COMPUTE_CAPABILITY.get(job.cluster.gpu.arch, (9, 0))
        torch.cuda.get_device_capability = lambda device=None: capability
        torch.cuda.graph_pool_handle = lambda: None
    initialize_rng_tracker(use_cudagraphable_rng=graphs, force_reset=True)


def megatron_decision(job: Any, layout: Layout, *, schedule: bool = True) -> tuple[bool, str]:
    """megatron-core's own decision on `layout` in `job`, in the order a training run meets it:

    1. `TransformerConfig` (its `__post_init__` checks, the layout string's validation, the layer offload's);
    2. for every pipeline stage, on the stage's first rank of a fake process group of the job's world:
       `initialize_model_parallel`, every virtual chunk's `GPTModel` (layers and their offsets, MTP, the
       splits over TP / EP / ETP), then the pipeline schedule up to its first forward step;
    3. `get_batch_on_this_cp_rank` (the 2*CP split), `_split_along_first_dim` of seq / CP over TP (SP);
    4. the first statement of `MoELayer.forward` in training (MoE with TP > 1 needs SP);
    5. `ConstantNumMicroBatchesCalculator` (GBS vs MBS * DP).
    A hybrid Mamba model builds megatron-core's `HybridModel` per stage instead (`megatron_hybrid_build`: the
    stand-ins for TE and mamba_ssm); its schedule is not run (a Mamba layer's forward needs mamba_ssm's kernels).
    Returns (accepted, "") or (False, "<stage>: <exception type>: <message>")."""
    torch = mc.torch
    model, seq, gbs = job.model, job.training.seq_length, job.training.global_batch_size
    where = "config"
    try:
        if model.is_hybrid:
            import megatron_hybrid_build

            config = megatron_hybrid_build.hybrid_config(model, layout)
        else:
            if layout.offload_layers:  # 1 with the layer offload's checks
                make_config(model, layout, training=job.training, offload=True)
            config = make_config(model, layout, training=job.training)  # 1
        num_microbatches = max(1, gbs // (layout.mbs * max(1, job.world_size // (layout.tp * layout.pp * layout.cp))))
        for stage in range(layout.pp):  # 2
            where = f"pp rank {stage}"
            if model.is_hybrid:
                megatron_hybrid_build.build_stage(model, layout, config, stage)
                continue
            init_rank(layout, stage_first_rank(job.world_size, layout, stage), config, job.world_size)
            _init_rng_tracker(job, layout)
            with meta_device():
                chunks = build_chunks(model, layout, config, seq=seq)
            if schedule:
                where = f"pp rank {stage} schedule"
                _run_schedule(config, chunks, layout, num_microbatches, seq)
        where = "rank 0"
        init_rank(layout, 0, config, job.world_size)
        from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
        from megatron.core.tensor_parallel.mappings import _split_along_first_dim
        from megatron.core.transformer.moe.moe_layer import MoELayer

        _cp_batch_split(seq)  # 3
        if config.sequence_parallel:
            _split_along_first_dim(torch.zeros(seq // layout.cp, 1),
                                   mc.parallel_state.get_tensor_model_parallel_group())
        if model.is_moe:  # 4
            fake = types.SimpleNamespace(training=True, config=config,
                                         attn_tp_group=mc.parallel_state.get_tensor_model_parallel_group())
            try:
                MoELayer.forward(fake, torch.zeros(1, 1, 1))
            except AttributeError:
                pass  # got past the check, into the layer body the stand-in lacks
        dp = mc.parallel_state.get_data_parallel_world_size()
        ConstantNumMicroBatchesCalculator(gbs, layout.mbs, dp, False, 0)  # 5
        return True, ""
    except Exception as error:  # noqa: BLE001 - any exception is megatron-core refusing the layout
        return False, f"{where}: {type(error).__name__}: {str(error)[:300]}"
    finally:
        teardown()


# --- entry points for tests/megatron_runner.py (each runs in the interpreter of the megatron-core asked for) ----
def megatron_decisions(cases: list[tuple[Any, Layout]]) -> list[tuple[bool, str]]:
    """`megatron_decision` of every (job, layout)."""
    setup()
    return [megatron_decision(job, layout) for job, layout in cases]


def timed_megatron_decisions(cases: list[tuple[Any, Layout]]) -> list[tuple[bool, str, float]]:
    """`megatron_decision` of every (job, layout), with the seconds each took."""
    import time

    setup()
    out = []
    for job, layout in cases:
        start = time.perf_counter()
        ok, reason = megatron_decision(job, layout)
        out.append((ok, reason, time.perf_counter() - start))
    return out


def flex_dispatcher_decisions(model: ModelSpec, pairs: list[tuple[int, int]]) -> list[str]:
    """`MoEFlexTokenDispatcher.__init__` for each (EP, ETP) on EP * ETP GPUs, with megatron-core's default flex
    backend: "built", "AssertionError: <message>", or "past the check (<error>)" when it got into DeepEP, which a
    CPU lacks."""
    setup()
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.moe.token_dispatcher import MoEFlexTokenDispatcher

    assert model.moe is not None
    out = []
    for ep, etp in pairs:
        layout = Layout(ep=ep, etp=etp, dp=ep * etp)
        init_rank(layout, 0)
        config = dataclasses.replace(make_config(model, layout), moe_token_dispatcher_type="flex")
        try:
            MoEFlexTokenDispatcher(model.moe.num_experts // ep, list(range(model.moe.num_experts // ep)), config,
                                   pg_collection=ProcessGroupCollection.use_mpu_process_groups())
            out.append("built")
        except AssertionError as error:
            out.append(f"AssertionError: {error}")
        except Exception as error:  # noqa: BLE001 - past the check, into DeepEP, which a CPU lacks
            out.append(f"past the check ({type(error).__name__})")
        finally:
            teardown()
    return out


def _counts(chunks: list[Any]) -> tuple[int, int]:
    """(parameters autotune counts, `MEGATRON_ONLY_PARAMS`) of this rank's chunks."""
    ours = extra = 0
    for chunk in chunks:
        for name, p in chunk.named_parameters():
            if name.endswith(MEGATRON_ONLY_PARAMS):
                extra += p.numel()
            else:
                ours += p.numel()
    return ours, extra


def param_counts(models: list[ModelSpec]) -> list[tuple[int, int]]:
    """Each model built on one rank (fp32, meta device): (its parameters with the padded vocabulary unpadded
    back: one padded copy when tied, two when not, the `MEGATRON_ONLY_PARAMS` apart)."""
    setup()
    counts = []
    for m in models:
        layout = Layout()
        init_rank(layout, 0)
        try:
            with meta_device():
                chunks = build_chunks(m, layout, make_config(m, layout, bf16=False))
            ours, extra = _counts(chunks)
        finally:
            teardown()
        pad = (padded_vocab_size(m.vocab_size, 1) - m.vocab_size) * m.hidden_size * (1 if m.tied_embeddings else 2)
        counts.append((ours - pad, extra))
    return counts


def stage_param_counts(cases: list[tuple[ModelSpec, Layout]]) -> list[list[tuple[int, int, int]]]:
    """For each (model, layout), the first rank of every pipeline stage: (dense parameters, expert parameters
    (`allreduce=False`), `MEGATRON_ONLY_PARAMS`), bf16 on the meta device."""
    setup()
    out = []
    for model, layout in cases:
        config = make_config(model, layout)
        stages = []
        for stage in range(layout.pp):
            init_rank(layout, stage_first_rank(layout.world_size, layout, stage), config)
            try:
                with meta_device():
                    chunks = build_chunks(model, layout, config)
                params = [(n, p) for c in chunks for n, p in c.named_parameters()]
            finally:
                teardown()
            extra = sum(p.numel() for n, p in params if n.endswith(MEGATRON_ONLY_PARAMS))
            kept = [p for n, p in params if not n.endswith(MEGATRON_ONLY_PARAMS)]
            stages.append((sum(p.numel() for p in kept if getattr(p, "allreduce", True)),
                           sum(p.numel() for p in kept if not getattr(p, "allreduce", True)), extra))
        out.append(stages)
    return out


def hybrid_stage_param_counts(cases: list[tuple[ModelSpec, Layout]]) -> list[list[tuple[int, int, str]]]:
    """Hybrid (Mamba) models, stage by stage: `megatron_hybrid_build.hybrid_stage_param_counts`."""
    import megatron_hybrid_build

    return megatron_hybrid_build.hybrid_stage_param_counts(cases)


def hybrid_stage_layers(cases: list[tuple[ModelSpec, Layout]]) -> list[list[str]]:
    """megatron-core's pipeline segment of each stage of a hybrid model: `megatron_hybrid_build.hybrid_stage_layers`."""
    import megatron_hybrid_build

    return megatron_hybrid_build.hybrid_stage_layers(cases)


def hybrid_parity(param_cases: list[tuple[ModelSpec, Layout]], split_cases: list[tuple[ModelSpec, Layout]],
                  decision_cases: list[tuple[Any, Layout]]) -> tuple[list, list, list]:
    """The hybrid checks in one child process: (`hybrid_stage_param_counts`, `hybrid_stage_layers`,
    `megatron_decisions`)."""
    return hybrid_stage_param_counts(param_cases), hybrid_stage_layers(split_cases), megatron_decisions(decision_cases)


# --- Megatron-FSDP and layer-level activation offload (tests/test_fsdp_offload_launch.py) ----------------------
def offload_config_decisions(cases: list[tuple[Any, Layout, dict[str, Any]]]) -> list[tuple[bool, str]]:
    """`TransformerConfig` (its `__post_init__` only: no model, no process group) of each (job, layout) with the
    extra keywords given (the launch line's `cpu_offloading`, `cpu_offloading_num_layers` and, where the line sets
    it, the paged stash), the layout's graphs and recompute as `config_kwargs` spells them for the installed
    release. A model is not built: megatron-core's local layer spec refuses offload on its own ("CPU Offloading
    is enabled when TE is not present", transformer/transformer_block.py :313-316 in 0.19.2), which a GPU node
    with Transformer Engine does not. Returns (True, "") or (False, "<exception type>: <message>")."""
    setup()
    out = []
    for job, layout, extra in cases:
        kw = {**config_kwargs(job.model, layout, training=job.training), **extra}
        try:
            (mc.MLATransformerConfig if job.model.mla is not None else mc.TransformerConfig)(**kw)
            out.append((True, ""))
        except Exception as error:  # noqa: BLE001 - any exception is megatron-core refusing the config
            out.append((False, f"{type(error).__name__}: {str(error)[:300]}"))
    return out


def fsdp_mesh_decisions(cases: list[tuple[Layout, int]]) -> list[tuple[bool, str]]:
    """Megatron-FSDP's device meshes for each (layout, world) on the first rank of every pipeline stage of a fake
    process group: `mcore_fsdp_adapter._get_dp_tp_mesh` over the DP x CP and TP groups, and for a layout with EP
    the expert mesh over the expert-DP and expert-TP groups with the EP size, as `FullyShardedDataParallel.
    _init_dist_index` calls them (distributed/fsdp/mcore_fsdp_adapter.py :433-458 in 0.19.2). Needs einops (the
    0.19.2 interpreter has it). Returns (True, "") or (False, "pp rank <s>: <exception type>: <message>")."""
    setup()
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import _get_dp_tp_mesh

    ps = mc.parallel_state
    out = []
    for layout, world in cases:
        where = "pp rank 0"
        try:
            for stage in range(layout.pp):
                where = f"pp rank {stage}"
                init_rank(layout, stage_first_rank(world, layout, stage), world=world)
                _get_dp_tp_mesh(ps.get_data_parallel_group(with_context_parallel=True),
                                ps.get_tensor_model_parallel_group())
                if layout.ep > 1:
                    _get_dp_tp_mesh(ps.get_expert_data_parallel_group(), ps.get_expert_tensor_parallel_group(),
                                    ep_size=ps.get_expert_model_parallel_group().size())
                teardown()
            out.append((True, ""))
        except Exception as error:  # noqa: BLE001 - any exception is megatron-core refusing the mesh
            out.append((False, f"{where}: {type(error).__name__}: {' '.join(str(error).split())[:300]}"))
        finally:
            teardown()
    return out


def fsdp_offload_decisions(config_cases: list[tuple[Any, Layout, dict[str, Any]]], mesh_cases: list[tuple[Layout, int]]
                           ) -> tuple[list[tuple[bool, str]], list[tuple[bool, str]]]:
    """`offload_config_decisions` and `fsdp_mesh_decisions` in one child process (the mesh ones only where
    mesh_cases are given: they need einops)."""
    return offload_config_decisions(config_cases), fsdp_mesh_decisions(mesh_cases) if mesh_cases else []

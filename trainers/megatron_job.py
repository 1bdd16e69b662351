"""One short megatron-core training job for one layout, inside one worker of an initialised process group.

`run_job(config)` runs on every rank: it (re)initialises `parallel_state` for the layout, builds the GPT
model chunks (TransformerEngine spec where TE is installed on a GPU, else the local layer spec; dense or
MoE; one chunk per virtual stage), wraps them in megatron-core's
DDP and optimizer (distributed optimizer when the layout says so), runs warm-up and timed steps on
synthetic tokens through `get_forward_backward_func()` (1F1B, interleaved with VPP), and returns this
rank's `RankResult` as a plain dict. Device is the only difference between GPU (NCCL, cuda) and the CPU
proxy (gloo, patched megatron-core; see `cpu_patches`).

Sources: megatron-core 0.19.2 `models/gpt/gpt_model.py`, `models/gpt/gpt_layer_specs.py`,
`distributed/distributed_data_parallel.py`, `optimizer/__init__.py`, `pipeline_parallel/schedules.py`,
`utils.py::get_batch_on_this_cp_rank`. The same code runs on 0.16.1 (the two calls that differ check what the
installed megatron-core has: `_cp_split_flags`, `_reset_process_globals`). On the CPU proxy the two releases
give bit-identical losses and equal memory terms, but for MoE activations (docs/profiling.md).
"""

from __future__ import annotations

import gc
import inspect
import os
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from search_spaces.layout import Layout
from search_spaces.megatron_names import parallel_state_kwargs, transformer_config_kwargs
from search_spaces.model import ModelSpec, padded_vocab_size
from search_spaces.training import Dispatcher

__all__ = ["JobConfig", "Fault", "run_job", "JobRejected"]

# injected on rank 0 in the first step (tests of failure handling): an exception, a hang, or the process ending
# as a SIGKILL or a lost node ends it (no exception, no answer: Ray reports the actor dead)
Fault = Literal["none", "crash", "hang", "exit"]

SEED = 1234


class JobRejected(Exception):
    """megatron-core refused the layout: any exception while building (config, parallel groups, model,
    DDP, optimizer), or a ValueError / AssertionError / NotImplementedError while training (its validity
    checks, some of which run only in the first forward, e.g. MoE with TP and no SP)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobConfig:
    model: ModelSpec
    layout: Layout
    seq_length: int
    num_microbatches: int
    precision: Literal["bf16", "fp32"] = "bf16"
    warmup_steps: int = 1
    timed_steps: int = 3
    dropout: float = 0.0
    moe_dispatcher: Dispatcher = "alltoall"  # "flex" only on a GPU with DeepEP (the GPU probe)
    measure_memory: bool = True
    lr: float = 1e-3
    fault: Fault = "none"


def _device() -> Any:
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


# --- building ---------------------------------------------------------------------------------
def _reset_process_globals() -> None:
    """State megatron-core keeps per process that a previous job on a reused worker would leak into this one:
    the MoE aux-loss tracker holds one slot per layer of the first model that recorded into it, and a longer
    model indexes past it (IndexError in the router's first forward).

    megatron-core 0.19 keeps it in `moe_logging.MoEMetricsTracker` (transformer/moe/moe_logging.py:46-66), whose
    `clear()` only zeroes the entries it keeps, and `moe_utils.get_moe_layer_wise_logging_tracker()` now returns
    a copy (moe_utils.py:1085-1097), so clearing that dict clears nothing: the tracker is dropped instead
    (`destroy_moe_metrics_tracker`, recreated on the next record). 0.16.1 has no `moe_logging`; its
    `get_moe_layer_wise_logging_tracker()` returns the module's own dict."""
    try:
        from megatron.core.transformer.moe import moe_logging
    except ImportError:  # megatron-core 0.16.1
        from megatron.core.transformer.moe import moe_utils

        moe_utils.get_moe_layer_wise_logging_tracker().clear()
    else:
        moe_logging.destroy_moe_metrics_tracker()


def _drop_cached_modules() -> None:
    """Empty megatron-core's per-process caches that keep a previous job's modules, and with them its process groups:
    `RotaryEmbedding.forward` is an `lru_cache(maxsize=32)` method (0.19.2 and 0.16.1
    `models/common/embeddings/rotary_pos_embedding.py`), so it holds up to 32 earlier models' rotary embeddings,
    each with its CP group (`self.cp_group`: a gloo group's threads and sockets)."""
    from megatron.core.models.common.embeddings import rotary_pos_embedding

    forward = getattr(rotary_pos_embedding.RotaryEmbedding, "forward", None)
    cache_clear = getattr(forward, "cache_clear", None)
    if callable(cache_clear):
        cache_clear()


def destroy_job_groups() -> int:
    """Destroy every process group but the default one; returns how many.

    megatron-core's `destroy_model_parallel` only forgets its groups (0.19.2 `parallel_state.py:2506-2692`, 0.16.1
    `:2085-2230`, set them to None and destroy only the gloo DP groups, which `create_gloo_process_groups=False`
    never makes), while torch keeps each one registered with its gloo threads, or on a GPU its NCCL communicator
    and that communicator's device buffers. A reused worker would pile them up job after job: a 20-minute
    CPU-proxy search left 988 `pt_gloo_runloop` threads in each worker, and on a GPU every later trial would
    measure its peak memory on top of the earlier trials' communicators. torch has no public list of groups, so
    this reads `distributed_c10d._world.pg_map` (present since torch 2.0)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_initialized():
        return 0
    default = c10d._get_default_group()
    groups = [g for g in list(c10d._world.pg_map) if g is not default]
    for group in groups:
        dist.destroy_process_group(group)
    return len(groups)


def init_parallel_state(layout: Layout) -> None:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    destroy_job_groups()
    _drop_cached_modules()
    # A destroyed gloo group keeps its threads and sockets until its ProcessGroup object is freed, and the previous
    # job's model, optimizer and DDP buffers hold their groups in reference cycles that only the cycle collector
    # frees: without this a reused CPU worker gained 2 pt_gloo_runloop threads and 4 descriptors per group per job
    # (1,800 threads after 60 trials of bench/bench_soak.py) until Python's own collector happened to run.
    gc.collect()
    _reset_process_globals()
    parallel_state.initialize_model_parallel(**parallel_state_kwargs(layout), create_gloo_process_groups=False)
    model_parallel_cuda_manual_seed(SEED)


def torch_activation(name: str) -> Any:
    """The MLP activation `ModelSpec.activation` names, as the function megatron-core's config takes."""
    import torch.nn.functional as F

    if name == "squared_relu":
        from megatron.core.activations import squared_relu

        return squared_relu
    return {"silu": F.silu, "gelu": F.gelu}[name]


def transformer_config(cfg: JobConfig) -> Any:
    """ModelSpec + Layout -> megatron-core TransformerConfig (`megatron_names.transformer_config_kwargs`, the one
    path), with the job's dtype and dropout, the proxy's dispatcher and aux-loss router, and every fusion off (none
    exists on CPU)."""
    import torch
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    m = cfg.model
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
    kw: dict[str, Any] = transformer_config_kwargs(m, cfg.layout)
    kw.update(activation_func=torch_activation(str(kw["activation_func"])), hidden_dropout=cfg.dropout,
              attention_dropout=cfg.dropout, params_dtype=dtype, pipeline_dtype=dtype, bf16=cfg.precision == "bf16",
              gradient_accumulation_fusion=False, bias_activation_fusion=False, masked_softmax_fusion=False,
              persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False,
              deallocate_pipeline_outputs=True)
    if m.moe is not None:
        kw.update(moe_token_dispatcher_type=cfg.moe_dispatcher, moe_grouped_gemm=False,
                  moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2, moe_router_dtype="fp32")
    return (MLATransformerConfig if m.mla is not None else TransformerConfig)(**kw)


def transformer_engine_available() -> bool:
    """TE runs only on CUDA; on a CPU build it is never used even if importable."""
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def _layer_spec(cfg: JobConfig) -> Any:
    """TransformerEngine's spec where TE is installed (GPU), else the local spec (CP via cp_attention)."""
    from megatron.core.models.gpt import gpt_layer_specs

    m = cfg.model
    num_experts = m.moe.num_experts if m.moe else None
    if transformer_engine_available():
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=num_experts, moe_grouped_gemm=False, qk_layernorm=m.qk_layernorm)
    spec = gpt_layer_specs.get_gpt_layer_local_spec(
        num_experts=num_experts, moe_grouped_gemm=False, qk_layernorm=m.qk_layernorm, normalization=m.normalization,
    )
    if cfg.layout.cp > 1:
        from trainers.cp_attention import ContextParallelCoreAttention

        spec.submodules.self_attention.submodules.core_attention = ContextParallelCoreAttention
    return spec


def build_model_chunks(cfg: JobConfig, tconfig: Any) -> list[Any]:
    """One GPTModel per virtual pipeline stage, bf16-wrapped when asked, each on this rank's device."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec
    from megatron.core.transformer.module import Float16Module

    m = cfg.model
    spec = _layer_spec(cfg)
    chunks = []
    for vp_stage in range(cfg.layout.vpp_size):
        vp = vp_stage if cfg.layout.vpp else None
        # MTP layers take the decoder layer's spec (Megatron-LM gpt_builders.py); None on chunks without them
        mtp = get_gpt_mtp_block_spec(tconfig, spec, use_transformer_engine=transformer_engine_available(),
                                     vp_stage=vp) if m.mtp_num_layers else None
        model = GPTModel(
            config=tconfig,
            transformer_layer_spec=spec,
            # Megatron-LM pads the vocabulary to a multiple of 128 * TP (`_vocab_size_with_padding`): the
            # embedding and the output layer split it over TP (GPT-3's 50,257 does not divide by any TP > 1)
            vocab_size=padded_vocab_size(m.vocab_size, cfg.layout.tp),
            mtp_block_spec=mtp,
            max_sequence_length=max(cfg.seq_length, m.max_position_embeddings),
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            share_embeddings_and_output_weights=m.tied_embeddings,
            position_embedding_type="learned_absolute" if m.max_position_embeddings else "rope",
            vp_stage=vp,
        )
        model.to(_device())
        if cfg.precision == "bf16":
            model = Float16Module(tconfig, model)
        chunks.append(model)
    return chunks


def wrap_ddp_and_optimizer(cfg: JobConfig, tconfig: Any, chunks: list[Any]) -> tuple[list[Any], Any]:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=cfg.layout.dist_opt,
    )
    ddp_chunks = [
        DistributedDataParallel(config=tconfig, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0)
        for i, chunk in enumerate(chunks)
    ]
    opt_config = OptimizerConfig(
        optimizer="adam", lr=cfg.lr, weight_decay=0.01, clip_grad=1.0,
        bf16=cfg.precision == "bf16", params_dtype=tconfig.params_dtype,
        use_distributed_optimizer=cfg.layout.dist_opt,
    )
    optimizer = get_megatron_optimizer(opt_config, ddp_chunks, use_gloo_process_groups=False)
    tconfig.no_sync_func = [c.no_sync for c in ddp_chunks] if len(ddp_chunks) > 1 else ddp_chunks[0].no_sync
    tconfig.finalize_model_grads_func = finalize_model_grads
    tconfig.grad_scale_func = optimizer.scale_loss
    return ddp_chunks, optimizer


# --- data and step -----------------------------------------------------------------------------
def _batch(cfg: JobConfig, step: int, microbatch: int) -> dict[str, Any]:
    """Synthetic tokens, the same on every TP/CP/PP rank of one DP replica, split for this CP rank."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.utils import get_batch_on_this_cp_rank

    dp_rank = parallel_state.get_data_parallel_rank()
    gen = torch.Generator().manual_seed(SEED + 1_000_003 * step + 1009 * microbatch + dp_rank)
    b, s = cfg.layout.mbs, cfg.seq_length
    tokens = torch.randint(0, cfg.model.vocab_size, (b, s + 1), generator=gen)
    batch = {
        "tokens": tokens[:, :-1].contiguous(),
        "labels": tokens[:, 1:].contiguous(),
        "loss_mask": torch.ones(b, s),
        "position_ids": torch.arange(s).unsqueeze(0).expand(b, s).contiguous(),
    }
    batch = {k: v.to(_device()) for k, v in batch.items()}
    return get_batch_on_this_cp_rank(batch, cp_group=parallel_state.get_context_parallel_group(),
                                     **_cp_split_flags(get_batch_on_this_cp_rank))


def _cp_split_flags(split: Any) -> dict[str, Any]:
    """megatron-core 0.19 added a required `is_hybrid_cp` to `get_batch_on_this_cp_rank` (utils.py:2612-2618;
    0.16.1 has none). Megatron-LM core_v0.19.0's pretrain_gpt.py passes `is_hybrid_cp=False` and the CP
    group: without `cp_group`, 0.19 splits over the default group, i.e. the whole world."""
    import inspect

    return {"is_hybrid_cp": False} if "is_hybrid_cp" in inspect.signature(split).parameters else {}


def _loss_func(loss_mask: Any, output_tensor: Any) -> tuple[Any, dict[str, Any]]:
    """Mean token loss. With CP each rank holds part of the sequence: the count (and the reported loss)
    is summed over the CP group, and the loss scaled by CP because DDP averages grads over DP x CP
    (as in Megatron-LM's pretrain_gpt loss_func)."""
    import torch
    from megatron.core import parallel_state

    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    local = torch.stack([torch.sum(losses * mask), mask.sum()])
    total = local.detach().clone()
    cp = parallel_state.get_context_parallel_world_size()
    if cp > 1:
        torch.distributed.all_reduce(total, group=parallel_state.get_context_parallel_group())
    loss = local[0] / total[1] * cp
    return loss, {"lm loss": total[0] / total[1]}


def _forward_step(batches: Any, model: Any) -> tuple[Any, Any]:
    batch = next(batches)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, partial(_loss_func, batch["loss_mask"])


def _train_step(cfg: JobConfig, chunks: list[Any], optimizer: Any, step: int) -> float | None:
    from megatron.core.pipeline_parallel import get_forward_backward_func

    for chunk in chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    # each chunk of the interleaved schedule pulls micro-batches from its own iterator
    iterators = [iter([_batch(cfg, step, i) for i in range(cfg.num_microbatches)]) for _ in chunks]
    data = iterators if len(chunks) > 1 else iterators[0]
    losses = get_forward_backward_func()(
        forward_step_func=_forward_step,
        data_iterator=data,
        model=chunks if len(chunks) > 1 else chunks[0],
        num_microbatches=cfg.num_microbatches,
        seq_length=cfg.seq_length,
        micro_batch_size=cfg.layout.mbs,
        forward_only=False,
    )
    optimizer.step()
    if not losses:
        return None
    return float(sum(float(x["lm loss"]) for x in losses) / len(losses))


# --- measuring ---------------------------------------------------------------------------------
def group_sizes() -> dict[str, int]:
    """The group sizes megatron-core formed, as its own getters report them."""
    from megatron.core import parallel_state as ps

    return {
        "world": ps.torch.distributed.get_world_size(),
        "tp": ps.get_tensor_model_parallel_world_size(),
        "pp": ps.get_pipeline_model_parallel_world_size(),
        "vpp": ps.get_virtual_pipeline_model_parallel_world_size() or 1,
        "cp": ps.get_context_parallel_world_size(),
        "dp": ps.get_data_parallel_world_size(),
        "ep": ps.get_expert_model_parallel_world_size(),
        "etp": ps.get_expert_tensor_parallel_world_size(),
        "expert_dp": ps.get_expert_data_parallel_world_size(),
    }


def _ranks() -> dict[str, int]:
    from megatron.core import parallel_state as ps

    return {"rank": ps.torch.distributed.get_rank(), "tp_rank": ps.get_tensor_model_parallel_rank(),
            "pp_rank": ps.get_pipeline_model_parallel_rank(), "dp_rank": ps.get_data_parallel_rank(),
            "cp_rank": ps.get_context_parallel_rank()}


def _memory(cfg: JobConfig, chunks: list[Any], optimizer: Any, activations_peak_bytes: int) -> dict[str, float]:
    import torch

    from trainers import memory_probe

    grads, grads_unpadded = memory_probe.gradient_bytes(chunks)
    memory = {
        "weights": float(memory_probe.weights_bytes(chunks)),
        "gradients": float(grads),
        "gradients_unpadded": float(grads_unpadded),
        "optimizer": float(memory_probe.optimizer_bytes(optimizer, chunks)),
        "activations": float(activations_peak_bytes),
    }
    memory["total"] = memory["weights"] + memory["gradients"] + memory["optimizer"] + memory["activations"]
    if torch.cuda.is_available():
        memory["allocator_peak"] = float(torch.cuda.max_memory_allocated())
    return memory


def _measured_step(cfg: JobConfig, chunks: list[Any], optimizer: Any, step: int) -> tuple[float | None, int]:
    """One step with the saved-tensor tracker on: (loss, peak bytes of saved activations)."""
    from trainers.memory_probe import SavedTensorTracker, param_storage_ptrs

    tracker = SavedTensorTracker(param_storage_ptrs(chunks))
    with tracker.hooks():
        loss = _train_step(cfg, chunks, optimizer, step)
    return loss, tracker.peak_bytes


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    torch.distributed.barrier()


def run_job(cfg: JobConfig) -> dict[str, Any]:
    """Build and train `cfg` on this rank; return its measurements (a plain dict).

    Raises JobRejected when megatron-core refuses the layout while building, with its message.
    Any other exception propagates (a crash, or out-of-memory).
    """
    import torch

    from trainers.cpu_patches import apply_cpu_patches, cpu_device_mode

    apply_cpu_patches()
    with cpu_device_mode():
        t0 = time.perf_counter()
        try:
            init_parallel_state(cfg.layout)
            tconfig = transformer_config(cfg)
            chunks = build_model_chunks(cfg, tconfig)
            chunks, optimizer = wrap_ddp_and_optimizer(cfg, tconfig, chunks)
        except Exception as e:  # noqa: BLE001 - building is deterministic: a failure here is the layout's
            raise JobRejected(f"{type(e).__name__}: {e}") from e
        build_s = time.perf_counter() - t0
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        try:
            result = _train_and_measure(cfg, chunks, optimizer)
        except (AssertionError, ValueError, NotImplementedError) as e:
            raise JobRejected(f"{type(e).__name__}: {e}") from e
        result["build_s"] = build_s
        result["job_s"] = time.perf_counter() - t0  # build + every step + measuring, on this rank
        _drop_hooks(tconfig)
        del chunks, optimizer
    return result


def _drop_hooks(tconfig: Any) -> None:
    """Forget the job's callbacks on its TransformerConfig (bound methods of the model chunks and the optimizer,
    alone or in lists: `no_sync_func`, `grad_scale_func`, what megatron-core's distributed optimizer adds). Something
    outside the job keeps the config of a distributed-optimizer job alive, and through those methods its optimizer,
    model and every process group (2 gloo threads and 4 descriptors each, per job; bench/bench_soak.py)."""
    for name, value in list(vars(tconfig).items()):
        items = value if isinstance(value, (list, tuple)) else [value]
        if items and all(inspect.ismethod(v) for v in items):
            setattr(tconfig, name, None)


def _inject_fault(fault: str) -> None:
    if fault == "none" or torch_rank() != 0:
        return
    if fault == "crash":
        raise RuntimeError("injected crash on rank 0")
    if fault == "exit":
        os._exit(1)
    while True:  # "hang": the other ranks block in the next collective
        time.sleep(3600)


def torch_rank() -> int:
    import torch

    return torch.distributed.get_rank()


def _train_and_measure(cfg: JobConfig, chunks: list[Any], optimizer: Any) -> dict[str, Any]:
    """Warm-up and timed steps; the first step also tracks saved activations. Returns this rank's report."""
    losses: list[float | None] = []
    step_times: list[float] = []
    activations = 0
    for step in range(cfg.warmup_steps + cfg.timed_steps):
        _inject_fault(cfg.fault)
        _sync()
        start = time.perf_counter()
        if step == 0 and cfg.measure_memory:
            loss, activations = _measured_step(cfg, chunks, optimizer, step)
        else:
            loss = _train_step(cfg, chunks, optimizer, step)
        _sync()
        losses.append(loss)
        if step >= cfg.warmup_steps:
            step_times.append(time.perf_counter() - start)
    memory = _memory(cfg, chunks, optimizer, activations)
    return {
        **_ranks(),
        "groups": group_sizes(),
        "losses": losses,
        "step_times_s": step_times,
        "memory": memory,
    }

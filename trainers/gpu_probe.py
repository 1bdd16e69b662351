"""Peak memory of any one rank of any layout, measured on one device with the other ranks emulated.

`probe_rank(model, layout, training, rank=r, device=d)` runs, in this one process, what rank `r` of
`layout.world_size` ranks runs in a real megatron-core job: torch's fake process group (backend "fake",
`torch.testing._internal.distributed.fake_pg.FakeStore`) stands in for the world, so
`parallel_state.initialize_model_parallel` forms the layout's real groups and this rank builds its real model
chunks (every virtual stage of its pipeline stage, at full size), megatron-core's DDP and (distributed)
optimizer, and runs two full training steps of `get_forward_backward_func()` and `optimizer.step()`.

What the fake group does (torch 2.13 and 2.14, c10d `FakeProcessGroup`; checked at start-up, `_check_fake_group`):
every collective completes at once; all-gathers write this rank's input into every slot, all-reduce and
broadcast leave the input as it is, reduce-scatter keeps this rank's slice, all-to-all copies; point-to-point
send / recv / `batch_isend_irecv` complete without touching the buffer. So every emulated peer "sends what
this rank sends": the pipeline receives are megatron's own freshly allocated buffers (their values are
whatever memory held; only shapes matter here), and MoE token counts gathered over EP are this rank's own,
which keeps the alltoall dispatcher's split sizes consistent (each peer routes like this rank). Nothing is
patched for the fake group: it supports every call the schedule, DDP, the distributed optimizer and the MoE
dispatchers make.

What it reports: on a GPU `torch.cuda.max_memory_allocated` / `max_memory_reserved` over the second step
(the Adam states exist from the first step's `optimizer.step()`), and the first step's peak; on a CPU there
is no allocator peak, so the figure is the saved-tensor peak of one step (`memory_probe.SavedTensorTracker`)
plus the exact weights, gradients and optimizer bytes (`memory_probe`), labelled as such. Both report the
static bytes by `memory_probe`'s accounting, the pipeline stage, the layers of each chunk, how many
forward and backward passes each chunk ran, and timing. Every failure (megatron-core refusing the layout,
out of memory, anything else) comes back as `{"status": "failed", "reason": ...}`.

Model and recipe: `trainers.megatron_job` builds the `TransformerConfig`, the chunks (Transformer Engine's
layer spec where TE imports on a GPU, else the local spec) and runs the step. The vocabulary is padded as
Megatron-LM pads it (`_vocab_size_with_padding`: a multiple of 128 * TP). With TE the fusions a production
run uses are turned on (SwiGLU, bias-dropout, RoPE, masked softmax, and the cross-entropy fusion the
`TrainingSpec` asks for); the local spec runs unfused. Honoured from the `TrainingSpec`: sequence, global
batch (micro-batches = GBS / (MBS * DP)), `grad_reduce_in_fp32`, the precision-aware optimizer and its moment
dtype (TE's FusedAdam with the distributed optimizer only), the MoE dispatcher (alltoall, allgather; an unset
one runs alltoall), recompute modules and layers. Forced, and reported in `result["training"]` so that a
comparison uses what ran: no grad-reduce / param-gather / TP-comm overlap, no grouped GEMM, no permute fusion.
Refused: fp8, the flex dispatcher, CUDA graphs, the EP all-to-all overlap (each read from the Layout where the
search spaces have the switch there, else from the TrainingSpec), MLA models (`megatron_job` builds no MLA
attention).
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from typing import Any

from search_spaces.layout import Layout
from search_spaces.model import ModelSpec
from search_spaces.training import TrainingSpec

__all__ = ["probe_rank", "padded_vocab_size", "CPU_PEAK_LABEL"]

VOCAB_DIVISOR = 128  # Megatron-LM `--make-vocab-size-divisible-by` default
CPU_PEAK_LABEL = ("cpu: saved-tensor peak of one step + weights + gradients + optimizer (memory_probe); "
                  "not an allocator figure")
GPU_PEAK_LABEL = "torch.cuda.max_memory_allocated over the second step"


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = VOCAB_DIVISOR) -> int:
    """Megatron-LM `training/tokenizer/tokenizer.py::_vocab_size_with_padding`: up to a multiple of
    divisible_by * TP."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def probe_rank(model: ModelSpec, layout: Layout, training: TrainingSpec, *, rank: int, device: str) -> dict[str, Any]:
    """Measure rank `rank` of `layout` on `device` ("cuda" or "cpu"); a plain dict, never an exception."""
    start = time.perf_counter()
    context: dict[str, Any] = {"rank": rank, "device": device}
    try:
        refusal = _refusal(model, layout, training, rank, device)
        if refusal:
            return {**context, **_failed(refusal, start)}
        from trainers.megatron_job import transformer_engine_available

        te = transformer_engine_available()
        effective = _effective_training(training, te=te, dist_opt=layout.dist_opt)
        context.update(spec="transformer_engine" if te else "local", training=_as_json(effective))
        return {**context, **_probe(model, layout, effective, rank=rank, device=device, te=te, start=start)}
    except Exception as e:  # noqa: BLE001 - every failure is a result
        oom = "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"
        result = {**context, **_failed(f"{'out of memory: ' if oom else ''}{type(e).__name__}: {e}"[:2000], start)}
        result["oom"] = oom
        result["traceback_tail"] = traceback.format_exc()[-3000:]
        if device == "cuda":
            result["max_memory_allocated_at_failure"] = _cuda_peak()
        return result
    finally:
        _teardown()


def _cuda_peak() -> int | None:
    try:
        import torch

        return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a broken CUDA context has no figure to give
        return None


# --- what the probe can run ------------------------------------------------------------------------
def _refusal(model: ModelSpec, layout: Layout, training: TrainingSpec, rank: int, device: str) -> str:
    import torch

    if device not in ("cuda", "cpu"):
        return f"device must be 'cuda' or 'cpu', but got {device!r}."
    if device == "cuda" and not torch.cuda.is_available():
        return "device 'cuda' asked for, but torch sees no CUDA device."
    if device == "cpu" and torch.cuda.is_available():
        return "device 'cpu' needs a process without visible GPUs (run it with CUDA_VISIBLE_DEVICES=)."
    if not 0 <= rank < layout.world_size:
        return f"rank must be in [0, {layout.world_size}), but got {rank}."
    if training.fp8:
        return "fp8 is not supported by the probe (bf16 only)."
    if training.muon:
        return "the Muon optimizer is not supported by the probe (it builds megatron-core's Adam)."
    if training.moe_token_dispatcher == "flex":
        return "the flex dispatcher (DeepEP) is not supported by the probe; use alltoall or allgather."
    if _switch(layout, training, "cuda_graphs", "cuda_graphs", "none") != "none":
        return "CUDA graphs are not supported by the probe."
    if _switch(layout, training, "ep_overlap", "overlap_moe_expert_parallel_comm", False):
        return "the EP all-to-all overlap is not supported by the probe."
    if model.mla is not None:
        return f"{model.name}: MLA attention is not built by trainers.megatron_job."
    if training.global_batch_size % (layout.mbs * layout.dp):
        return (f"global_batch_size ({training.global_batch_size}) must be a multiple of mbs * dp "
                f"({layout.mbs} * {layout.dp}).")
    return ""


def _switch(layout: Layout, training: TrainingSpec, layout_name: str, training_name: str, default: Any) -> Any:
    """A switch the search spaces are moving from the TrainingSpec to the Layout (CUDA graphs, the EP overlap):
    the layout's where it has the field, else the TrainingSpec's."""
    if hasattr(layout, layout_name):
        return getattr(layout, layout_name)
    return getattr(training, training_name, default)


def _failed(reason: str, start: float) -> dict[str, Any]:
    return {"status": "failed", "reason": reason, "time": {"total_s": time.perf_counter() - start}}


def _teardown() -> None:
    import torch.distributed as dist

    if not dist.is_initialized():  # refused before building: nothing to tear down (and no megatron import)
        return
    try:
        from megatron.core import parallel_state

        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
    except Exception:  # noqa: BLE001 - best effort: the caller gets the probe's own result
        pass
    dist.destroy_process_group()


def _check_fake_group() -> None:
    """The fake group must mirror all-gathers (MoE split sizes come from one); older torch left them empty."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    local = torch.arange(2, dtype=torch.int64) + 7
    out = torch.zeros(2 * world, dtype=torch.int64)
    dist.all_gather_into_tensor(out, local)
    if not torch.equal(out, local.repeat(world)):
        raise RuntimeError("this torch's fake process group does not mirror all_gather_into_tensor "
                           "(every peer must send what this rank sends); use torch >= 2.13")


# --- the recipe that runs ----------------------------------------------------------------------------
def _effective_training(training: TrainingSpec, *, te: bool, dist_opt: bool) -> TrainingSpec:
    """The TrainingSpec of what the probe builds (see the module docstring)."""
    precision_aware = te and dist_opt and training.precision_aware_optimizer and _te_fused_adam()
    changes: dict[str, Any] = {"moe_token_dispatcher": training.moe_token_dispatcher or "alltoall"}  # None: the
    #   GPU's own, flex on Blackwell, which the probe refuses when named: it runs alltoall, and says so
    if any(f.name == "overlap_moe_expert_parallel_comm" for f in dataclasses.fields(training)):
        changes["overlap_moe_expert_parallel_comm"] = False  # a TrainingSpec switch before it moved to the Layout
    return dataclasses.replace(
        training, **changes,
        overlap_grad_reduce=False, overlap_param_gather=False, tp_comm_overlap=False,
        moe_grouped_gemm=False, moe_permute_fusion=False,
        precision_aware_optimizer=precision_aware,
        optimizer_moments=training.optimizer_moments if precision_aware else "fp32",
        cross_entropy_fusion=training.cross_entropy_fusion if te else "none",
    )


def _te_fused_adam() -> bool:
    try:
        from transformer_engine.pytorch.optimizers import FusedAdam  # noqa: F401
    except ImportError:
        return False
    return True


def _transformer_config(cfg: Any, training: TrainingSpec, *, te: bool) -> Any:
    """megatron_job's config, with the fusions a TE run uses and the recompute the TrainingSpec asks for."""
    from trainers import megatron_job

    base = megatron_job.transformer_config(cfg)
    changes: dict[str, Any] = {}
    if te:
        # megatron-core fuses SwiGLU / GeGLU, or GeLU with a bias (`transformer_config.py` refuses the rest)
        changes.update(bias_activation_fusion=cfg.model.gated_linear_unit or cfg.model.add_bias_linear,
                       bias_dropout_fusion=True, apply_rope_fusion=not cfg.model.max_position_embeddings,
                       masked_softmax_fusion=True)
        if training.cross_entropy_fusion != "none":
            changes.update(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl=training.cross_entropy_fusion)
    if cfg.model.moe is not None:  # random router logits: the balanced routing the analytic model assumes
        changes["moe_router_force_load_balancing"] = True
    if cfg.layout.recompute == "selective":
        changes["recompute_modules"] = list(training.recompute_modules)
    elif cfg.layout.recompute == "full" and training.recompute_num_layers is not None:
        changes.update(recompute_method="block", recompute_num_layers=training.recompute_num_layers)
    return dataclasses.replace(base, **changes) if changes else base


def _wrap_ddp_and_optimizer(tconfig: Any, chunks: list[Any], layout: Layout,
                            training: TrainingSpec) -> tuple[list[Any], Any]:
    """As `megatron_job.wrap_ddp_and_optimizer`, with the grad buffer dtype and the optimizer the TrainingSpec says."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=training.grad_reduce_in_fp32, overlap_grad_reduce=False,
        use_distributed_optimizer=layout.dist_opt)
    ddp_chunks = [DistributedDataParallel(config=tconfig, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0)
                  for i, chunk in enumerate(chunks)]
    precision_aware: dict[str, Any] = {}
    if training.precision_aware_optimizer:
        moments = torch.bfloat16 if training.optimizer_moments == "bf16" else torch.float32
        precision_aware = dict(use_precision_aware_optimizer=True, exp_avg_dtype=moments, exp_avg_sq_dtype=moments,
                               main_grads_dtype=torch.float32, main_params_dtype=torch.float32)
    opt_config = OptimizerConfig(optimizer="adam", lr=1e-3, weight_decay=0.01, clip_grad=1.0, bf16=True,
                                 params_dtype=tconfig.params_dtype, use_distributed_optimizer=layout.dist_opt,
                                 **precision_aware)
    optimizer = get_megatron_optimizer(opt_config, ddp_chunks, use_gloo_process_groups=False)
    tconfig.no_sync_func = [c.no_sync for c in ddp_chunks] if len(ddp_chunks) > 1 else ddp_chunks[0].no_sync
    tconfig.finalize_model_grads_func = finalize_model_grads
    tconfig.grad_scale_func = optimizer.scale_loss
    return ddp_chunks, optimizer


# --- measuring ---------------------------------------------------------------------------------------
class _PassCounter:
    """Forward and backward passes per chunk: a forward hook on the chunk, a gradient hook on its output
    (it fires when the schedule's backward reaches that micro-batch's output; megatron frees the output's
    data, not its graph node)."""

    def __init__(self, chunks: list[Any]) -> None:
        self.forward = [0] * len(chunks)
        self.backward = [0] * len(chunks)
        for i, chunk in enumerate(chunks):
            chunk.register_forward_hook(self._on_forward(i))

    def _on_forward(self, i: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            self.forward[i] += 1
            tensor = output[0] if isinstance(output, tuple) else output
            if getattr(tensor, "requires_grad", False):
                tensor.register_hook(self._on_backward(i))

        return hook

    def _on_backward(self, i: int) -> Any:
        def hook(grad: Any) -> None:
            self.backward[i] += 1

        return hook


def _step_counter_bytes(optimizer: Any) -> int:
    """Bytes of torch Adam's per-parameter `step` tensors (part of `memory_probe.optimizer_bytes` once a step ran;
    the analytic model does not count them: 4 B per parameter tensor)."""
    total = 0
    for leaf in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        inner = getattr(leaf, "optimizer", None)
        for state in (inner.state.values() if inner is not None else ()):
            step = state.get("step")
            if hasattr(step, "untyped_storage"):
                total += step.untyped_storage().nbytes()
    return total


def _chunk_layers(chunks: list[Any]) -> list[int]:
    from megatron.core.utils import get_attr_wrapped_model

    return [len(get_attr_wrapped_model(chunk, "decoder").layers) for chunk in chunks]


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _probe(model: ModelSpec, layout: Layout, effective: TrainingSpec, *, rank: int, device: str, te: bool,
           start: float) -> dict[str, Any]:
    """Build and run two steps; `effective` is the recipe that runs (`_effective_training`)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from trainers import megatron_job, memory_probe
    from trainers.cpu_patches import apply_cpu_patches, cpu_device_mode
    from trainers.megatron_job import _train_step as train_step  # one step: zero grads, schedule, optimizer.step

    if device == "cuda":
        torch.cuda.set_device(0)
    apply_cpu_patches()  # a no-op where CUDA is available
    with cpu_device_mode():
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.world_size)
        _check_fake_group()
        megatron_job.init_parallel_state(layout)
        microbatches = effective.global_batch_size // (layout.mbs * layout.dp)
        cfg = megatron_job.JobConfig(
            model=dataclasses.replace(model, vocab_size=padded_vocab_size(model.vocab_size, layout.tp)),
            layout=layout, seq_length=effective.seq_length, num_microbatches=microbatches, precision="bf16",
            dropout=0.0, moe_dispatcher=effective.moe_token_dispatcher or "alltoall", measure_memory=False)
        tconfig = _transformer_config(cfg, effective, te=te)
        chunks = megatron_job.build_model_chunks(cfg, tconfig)
        chunks, optimizer = _wrap_ddp_and_optimizer(tconfig, chunks, layout, effective)
        counter = _PassCounter(chunks)
        _sync(device)
        build_s = time.perf_counter() - start
        allocated_after_build = torch.cuda.memory_allocated() if device == "cuda" else None
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()

        t0 = time.perf_counter()
        tracker = memory_probe.SavedTensorTracker(memory_probe.param_storage_ptrs(chunks))
        with tracker.hooks():  # step 1: saved activations; Adam states are created by its optimizer.step()
            losses = [train_step(cfg, chunks, optimizer, 0)]
        _sync(device)
        step_s = [time.perf_counter() - t0]
        first_peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        losses.append(train_step(cfg, chunks, optimizer, 1))
        _sync(device)
        step_s.append(time.perf_counter() - t0)

        grads, grads_unpadded = memory_probe.gradient_bytes(chunks)
        static = {"weights": memory_probe.weights_bytes(chunks), "gradients": grads,
                  "gradients_unpadded": grads_unpadded, "optimizer": memory_probe.optimizer_bytes(optimizer, chunks),
                  "optimizer_step_counters": _step_counter_bytes(optimizer)}
        result: dict[str, Any] = {
            "status": "ok",
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "stage": parallel_state.get_pipeline_model_parallel_rank(),
            "groups": megatron_job.group_sizes(),
            "chunk_layers": _chunk_layers(chunks),
            "num_microbatches": microbatches,
            "passes": {"forward": counter.forward, "backward": counter.backward, "steps": 2},
            "static": static,
            "saved_activations_peak": tracker.peak_bytes,
            "losses": losses,
        }
        if device == "cuda":
            result.update(
                peak_bytes=torch.cuda.max_memory_allocated(), peak_label=GPU_PEAK_LABEL,
                allocator={"max_memory_allocated": torch.cuda.max_memory_allocated(),
                           "max_memory_reserved": torch.cuda.max_memory_reserved(),
                           "first_step_max_allocated": first_peak,
                           "allocated_after_build": allocated_after_build,
                           "allocated_after_steps": torch.cuda.memory_allocated()})
        else:
            static_sum = static["weights"] + static["gradients"] + static["optimizer"]
            result.update(peak_bytes=static_sum + tracker.peak_bytes, peak_label=CPU_PEAK_LABEL, allocator=None)
        result["time"] = {"build_s": build_s, "step_s": step_s, "total_s": time.perf_counter() - start}
        del chunks, optimizer
    return result


def _as_json(training: TrainingSpec) -> dict[str, Any]:
    return {f.name: (list(v) if isinstance(v := getattr(training, f.name), tuple) else v)
            for f in dataclasses.fields(training)}

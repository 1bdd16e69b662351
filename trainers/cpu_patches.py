"""Make megatron-core run on a CPU-only machine (gloo), for the CPU proxy jobs.

Applied only when `torch.cuda.is_available()` is False; on a GPU none of this runs. Written for megatron-core
0.19.2 (Python 3.12, torch 2.14.1, a CUDA build running without a GPU); `tests/megatron_build.py` also applies it
under megatron-core 0.16.1 (Python 3.11, torch 2.13.0+cpu), where every patch works too (version-specific parts are
guarded by what the module has, not by version strings). Each patch is one function below whose docstring names
the megatron-core 0.19.2 calls (`megatron/core/<file>:<line>`) that fail without it, as found by running the
proxy's layouts with that patch removed:

- `_patch_torch_cuda`: `torch.cuda.current_device / synchronize / current_stream / Stream / stream /
  get_rng_state / manual_seed`, called unconditionally by DDP's grad buffers, pipeline p2p, the MoE alltoall
  dispatcher and the RNG tracker ("Found no NVIDIA driver"), plus stand-ins the parity builds reach.
- `cpu_device_mode()` (`CudaToCpuMode`): literal `device="cuda"`, `.cuda()`, `pin_memory=True` and the
  `tensor.type() == "torch.cuda.FloatTensor"` checks of the optimizer and grad clipping. Function modes are
  thread-local, so it must be entered by the thread that runs the job (Ray Train runs the training function in
  its own thread).
- `_patch_rng_tracker`: the RNG tracker's CUDA state get/set, routed to the CPU generator.
- `_patch_torch_norm`: `WrappedTorchNorm` builds `trainers.proxy_norm` norms (what TE's / Apex's fused norms save
  for backward), marked `sequence_parallel` under SP, which the torch-norm wrapper asserts against.
- `_patch_moe`: split sizes as numpy for gloo's `all_to_all_single`; 0.16.1's undefined `te_general_gemm`.
- `_patch_uneven_collectives`: uneven token gathers / reduce-scatters over TP (MoE with ETP > 1), which gloo
  refuses.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["apply_cpu_patches", "cpu_device_mode", "cuda_available"]

_APPLIED = False


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


class _FakeStream:
    """Stands in for `torch.cuda.Stream`: everything on the CPU runs in program order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _FakeEvent:
        return event or _FakeEvent()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def __enter__(self) -> _FakeStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class _FakeEvent:
    """Stands in for `torch.cuda.Event` (timing events are never read on the CPU path)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Any) -> float:
        return 0.0


def _patch_torch_cuda() -> None:
    """`torch.cuda` functions megatron-core calls whatever the device; on a CUDA build without a GPU each raises
    "Found no NVIDIA driver" (on a +cpu build "Torch not compiled with CUDA enabled"). 0.19.2 callers on the proxy's
    paths: `current_device` as the allocation device (distributed/param_and_grad_buffer.py:1180,1186,
    tensor_parallel/layers.py:305,647,1000,1363, tensor_parallel/mappings.py:145,152,185,447,
    pipeline_parallel/p2p_communication.py:334,342, transformer/moe/router.py:98, utils.py:715,
    models/common/embeddings/rotary_pos_embedding.py:78,162); `synchronize` after batched p2p
    (pipeline_parallel/p2p_communication.py:419); `current_stream` (distributed/param_and_grad_buffer.py:632,
    transformer/moe/token_dispatcher.py:922,924); `Stream` and `stream` (the alltoall dispatcher's device-to-host
    stream, transformer/moe/token_dispatcher.py:469,925); `get_rng_state` / `manual_seed` (the RNG tracker,
    tensor_parallel/random.py:303-306,490: without the `manual_seed` shim the CUDA build queues the seed lazily and
    never applies it, so the weights are initialised from another seed). `Event`, `default_stream`, `set_stream`,
    `empty_cache` and `manual_seed_all` are not reached by the proxy; the parity builds reach them (the EP-overlap
    schedule plan's event, transformer/moe/moe_layer.py:434, models/common/model_chunk_schedule_plan.py:376; CUDA
    graphs, transformer/cuda_graphs.py:662,709)."""
    import torch

    cpu_state = torch.random.get_rng_state
    shims: dict[str, Any] = {
        "current_device": lambda: torch.device("cpu"),
        "synchronize": lambda *a, **k: None,
        "current_stream": lambda *a, **k: _FakeStream(),
        "default_stream": lambda *a, **k: _FakeStream(),
        "Stream": _FakeStream,
        "Event": _FakeEvent,
        "stream": lambda s=None: contextlib.nullcontext(s),
        "set_stream": lambda *a, **k: None,
        "empty_cache": lambda: None,
        "get_rng_state": lambda device=None: cpu_state(),
        "set_rng_state": lambda state, device=None: torch.random.set_rng_state(state),
        # torch.manual_seed would call torch.cuda.manual_seed_all -> recursion; seed the CPU generator only.
        "manual_seed": lambda seed: torch.random.default_generator.manual_seed(int(seed)),
        "manual_seed_all": lambda seed: None,
    }
    for name, fn in shims.items():
        setattr(torch.cuda, name, fn)
    for name in ("get_rng_state", "set_rng_state", "manual_seed", "manual_seed_all"):
        setattr(torch.cuda.random, name, shims[name])


def _patch_rng_tracker() -> None:
    """`tensor_parallel.random._set_cuda_rng_state` (tensor_parallel/random.py:135-174) queues its work with
    torch's `_lazy_call` (:174), which never runs without a GPU: every fork of the tracker (random.py:308,323,345,
    538; each attention forward forks it) would leak a queued closure and never restore the state, so the weights
    would differ from a run with a real RNG state. Get and set (random.py:318,341,528) go to the CPU generator."""
    import logging

    import torch
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = lambda *a, **k: torch.random.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.random.set_rng_state(state)
    # the "CUDA" generator is the CPU one here, so the tracker's fork always sees the CPU state change
    logging.getLogger(mrandom.__name__).setLevel(logging.ERROR)


def _patch_torch_norm() -> None:
    """The local spec's norms are `WrappedTorchNorm` (models/backends.py:37,126), which asserts
    `not config.sequence_parallel` (transformer/torch_norm.py:50: "sequence parallel not supported by torch
    LayerNorm") and builds torch's norms, whose composite RMSNorm saves fp32 copies for backward (4x the bytes of
    TE's / Apex's fused norms). It builds `trainers.proxy_norm` norms instead (same parameters; they save what the
    fused kernels save) and, under SP, marks their parameters `sequence_parallel = True`, so megatron-core
    all-reduces their grads over TP as it does for TE's norms. Other normalizations keep torch's, built with SP off
    (the assert is the only thing that reads it)."""
    from megatron.core.transformer import torch_norm

    from trainers.proxy_norm import ProxyLayerNorm, ProxyRMSNorm

    original_new = torch_norm.WrappedTorchNorm.__new__

    def new(cls, config, hidden_size, eps=1e-5, **kwargs):  # noqa: ANN001
        proxy_cls = {"RMSNorm": ProxyRMSNorm, "LayerNorm": ProxyLayerNorm}.get(config.normalization)
        if proxy_cls is not None:
            norm = proxy_cls(hidden_size, eps)
        else:
            norm = original_new(cls, _without_sp(config), hidden_size, eps, **kwargs)
        if config.sequence_parallel:
            for p in norm.parameters():
                # megatron-core's mark of a sequence-parallel parameter: an attribute torch does not declare
                p.sequence_parallel = True  # type: ignore[attr-defined]
        return norm

    torch_norm.WrappedTorchNorm.__new__ = staticmethod(new)


def _without_sp(config: Any) -> Any:
    """A shallow copy of a TransformerConfig with sequence_parallel off (only read by the norm's asserts)."""
    import copy

    clone = copy.copy(config)
    object.__setattr__(clone, "sequence_parallel", False)
    return clone


def _patch_moe() -> None:
    """The alltoall dispatcher turns its split sizes into numpy with `maybe_move_tensor_to_cpu(..., as_numpy=True)`
    (transformer/moe/token_dispatcher.py:927-945), which converts only CUDA tensors (moe_utils.py:1169-1190): on the
    CPU the sizes reach gloo's `all_to_all_single` as tensors, a TypeError ("incompatible function arguments").
    This version converts CPU tensors too (it is imported by name into both modules). 0.16.1 only: without TE
    `moe_utils.te_general_gemm` is undefined (a NameError in the router); 0.19.2 sets it to None itself
    (moe_utils.py:41-53, the no-TE branch), so the hasattr guard leaves it alone."""
    import torch
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):  # noqa: ANN001
        if torch.is_tensor(tensor):
            tensor = tensor.cpu()
            if as_numpy:
                tensor = tensor.numpy()
        return tensor

    moe_utils.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
    token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _patch_uneven_collectives() -> None:
    """gloo's all_gather / reduce_scatter need equal sizes ("ProcessGroupGloo::allgather: invalid tensor size");
    MoE with ETP > 1 gathers and reduce-scatters uneven token counts over the TP group
    (`_GatherFromSequenceParallelRegion`, tensor_parallel/mappings.py:329,342, and
    `_ReduceScatterToSequenceParallelRegion`, mappings.py:369,377, calling `_gather_along_first_dim` /
    `_reduce_scatter_along_first_dim` with split sizes, mappings.py:118,159). Uneven cases pad to the largest split
    (gather) or all-reduce and slice (reduce-scatter); equal ones keep megatron-core's path."""
    import torch
    from megatron.core.tensor_parallel import mappings

    gather, scatter = mappings._gather_along_first_dim, mappings._reduce_scatter_along_first_dim

    def gather_along_first_dim(input_, group, output_split_sizes=None, use_global_buffer=False):  # noqa: ANN001
        if output_split_sizes is None or len(set(output_split_sizes)) <= 1 or group.size() == 1:
            return gather(input_, group, output_split_sizes, use_global_buffer)
        longest = max(output_split_sizes)
        padded = input_.new_zeros((longest, *input_.shape[1:]))
        padded[: input_.shape[0]] = input_
        parts = [torch.empty_like(padded) for _ in output_split_sizes]
        torch.distributed.all_gather(parts, padded.contiguous(), group=group)
        return torch.cat([part[:n] for part, n in zip(parts, output_split_sizes, strict=True)], dim=0)

    def reduce_scatter_along_first_dim(input_, group, input_split_sizes=None, use_global_buffer=False):  # noqa: ANN001
        if input_split_sizes is None or len(set(input_split_sizes)) <= 1 or group.size() == 1:
            return scatter(input_, group, input_split_sizes, use_global_buffer)
        total = input_.contiguous().clone()
        torch.distributed.all_reduce(total, group=group)
        rank = torch.distributed.get_rank(group)
        start = sum(input_split_sizes[:rank])
        return total[start : start + input_split_sizes[rank]].contiguous()

    mappings._gather_along_first_dim = gather_along_first_dim
    mappings._reduce_scatter_along_first_dim = reduce_scatter_along_first_dim


def apply_cpu_patches() -> bool:
    """Patch torch.cuda and megatron-core for a CPU-only run. Returns False (and does nothing) on a GPU."""
    global _APPLIED
    if cuda_available():
        return False
    if not _APPLIED:
        _patch_torch_cuda()
        _patch_rng_tracker()
        _patch_torch_norm()
        _patch_moe()
        _patch_uneven_collectives()
        _APPLIED = True
    return True


def _is_cuda_device(device: Any) -> bool:
    import torch

    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


def _make_mode() -> Any:
    """The `TorchFunctionMode` of `cpu_device_mode()`. Without it the first CUDA allocation fails ("Found no NVIDIA
    driver"). 0.19.2 callers on the proxy's paths: `device="cuda"` in the optimizer (optimizer/optimizer.py:315,702),
    grad clipping (optimizer/clip_grads.py:108,112,180), the schedules (pipeline_parallel/schedules.py:749,1121,
    2292), the causal mask (transformer/utils.py:39) and utils.py:1332; `.cuda()` and `pin_memory=True` in the CP
    split of rotary embeddings (models/common/embeddings/rope_utils.py:62,64); `tensor.type()` compared with
    "torch.cuda.FloatTensor" (optimizer/clip_grads.py:174, optimizer/distrib_optimizer.py:401,758,
    optimizer/optimizer.py:1009)."""
    import torch
    from torch.overrides import TorchFunctionMode

    cpu = torch.device("cpu")

    class CudaToCpuMode(TorchFunctionMode):
        """Redirect `device="cuda"` (or an int device), `.cuda()` and `.to("cuda")` to the CPU."""

        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            kwargs = dict(kwargs or {})
            name = getattr(func, "__name__", "")
            if name in ("cuda", "pin_memory"):
                return args[0]
            if kwargs.get("pin_memory"):  # no pinned-memory allocator without an accelerator
                kwargs["pin_memory"] = False
            if name == "type" and len(args) == 1 and not kwargs:
                result = func(*args)
                if result.startswith("torch.") and "cuda" not in result:
                    return result.replace("torch.", "torch.cuda.", 1)
                return result
            if "device" in kwargs and _is_cuda_device(kwargs["device"]):
                kwargs["device"] = cpu
            if name == "to" and args and len(args) > 1 and _is_cuda_device(args[1]) and not isinstance(args[1], bool):
                args = (args[0], cpu, *args[2:])
            return func(*args, **kwargs)

    return CudaToCpuMode()


@contextlib.contextmanager
def cpu_device_mode():
    """Enter the cuda -> cpu redirect for this thread (a no-op on a GPU)."""
    if cuda_available():
        yield
        return
    with _make_mode():
        yield

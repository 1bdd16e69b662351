"""Make megatron-core run on a CPU-only torch build (gloo), for the CPU proxy jobs.

Applied only when `torch.cuda.is_available()` is False; on a GPU none of this runs. Each patch
answers one failure seen on torch 2.13.0+cpu with megatron-core 0.16.1:

- `torch.cuda.current_device / synchronize / current_stream / Stream / stream / Event /
  get_rng_state / set_rng_state / manual_seed / empty_cache` are called unconditionally by the
  pipeline p2p code, DDP grad buffers, the MoE alltoall dispatcher and the RNG tracker: shims.
- Literal `device="cuda"` allocations, `.cuda()` calls and `pin_memory=True` (optimizer loss scale,
  grad clipping, causal masks, MoE counters, the CP split of rotary embeddings): `CudaToCpuMode`, a
  `TorchFunctionMode` that sends them to the CPU.
  Function modes are thread-local, so `cpu_device_mode()` must be entered by the thread that runs
  the job (Ray Train runs the training function in its own thread).
- `tensor_parallel.random` CUDA RNG get/set: routed to the CPU generator (else every attention
  forward queues a lazy CUDA call that never runs: a leak).
- Norms: `WrappedTorchNorm` builds `trainers.proxy_norm` norms instead of torch's, which save for
  backward what TE's / Apex's fused norms save (bf16 input + fp32 statistics; torch's composite
  RMSNorm keeps fp32 copies, 4x the bytes). With sequence parallelism (which `WrappedTorchNorm`
  asserts against) their parameters are marked `sequence_parallel = True`, so megatron-core
  all-reduces their grads over TP as it does for TE's norms.
- MoE alltoall on gloo: split sizes must be numpy, and `maybe_move_tensor_to_cpu` converts only
  CUDA tensors. 0.16.1 also leaves `moe_utils.te_general_gemm` undefined without TE. With ETP > 1 the
  dispatcher gathers uneven token counts over TP, which gloo refuses: padded / all-reduced instead.
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
    import logging

    import torch
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = lambda *a, **k: torch.random.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.random.set_rng_state(state)
    # the "CUDA" generator is the CPU one here, so the tracker's fork always sees the CPU state change
    logging.getLogger(mrandom.__name__).setLevel(logging.ERROR)


def _patch_torch_norm() -> None:
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
    """gloo's all_gather / reduce_scatter need equal sizes; MoE with ETP > 1 gathers uneven token counts
    over the TP group (`mappings._gather_along_first_dim(..., output_split_sizes)`). Uneven cases pad to the
    largest split (gather) or all-reduce and slice (reduce-scatter); equal ones keep megatron-core's path."""
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

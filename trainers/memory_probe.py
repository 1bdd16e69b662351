"""Exact memory accounting of one megatron-core rank, by storage, with the analytic model's term names.

- weights: `numel * element_size` over the model chunks' parameters (each storage once, by data pointer).
- gradients: the DDP buffers' `grad_data` storages (fp32 main grads, padded as megatron-core pads them).
- optimizer: the optimizer's state tensors and fp32 master parameters (shards, with the distributed
  optimizer), excluding storages already counted as weights or gradients.
- activations: the peak, over one training step (the whole pipeline schedule), of the bytes of live
  tensors saved for backward (`torch.autograd.graph.saved_tensors_hooks`), each storage counted once and
  parameter storages excluded. A saved tensor is live until autograd frees its graph node. Tensors that
  custom autograd functions keep as attributes and the pipeline's send/receive buffers are not seen.

On a GPU the allocator's peak (`torch.cuda.max_memory_allocated`) is reported beside these.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import Any

__all__ = ["SavedTensorTracker", "weights_bytes", "gradient_bytes", "optimizer_bytes", "param_storage_ptrs"]


def _storage_key(t: Any) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def _unique_bytes(tensors: Iterable[Any], exclude: AbstractSet[int] = frozenset()) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        ptr, nbytes = _storage_key(t)
        if ptr and ptr not in exclude:
            seen[ptr] = nbytes
    return sum(seen.values())


def _chunk_params(model_chunks: list[Any]) -> list[Any]:
    return [p for chunk in model_chunks for p in chunk.parameters()]


def weights_bytes(model_chunks: list[Any]) -> int:
    """Sum of numel * element_size over distinct parameters (shared/tied parameters once)."""
    seen: dict[int, int] = {}
    for p in _chunk_params(model_chunks):
        seen[id(p)] = p.numel() * p.element_size()
    return sum(seen.values())


def param_storage_ptrs(model_chunks: list[Any]) -> set[int]:
    ptrs = {_storage_key(p)[0] for p in _chunk_params(model_chunks)}
    for chunk in model_chunks:
        for buffer in _ddp_buffers(chunk):
            if getattr(buffer, "param_data", None) is not None:
                ptrs.add(_storage_key(buffer.param_data)[0])
    return ptrs


def _ddp_buffers(chunk: Any) -> list[Any]:
    return list(getattr(chunk, "buffers", [])) + list(getattr(chunk, "expert_parallel_buffers", []))


def gradient_bytes(model_chunks: list[Any]) -> tuple[int, int]:
    """(bytes of the DDP grad buffers, bytes of the unpadded main grads they hold)."""
    storages = [b.grad_data for chunk in model_chunks for b in _ddp_buffers(chunk)]
    logical = sum(b.numel * b.grad_data.element_size() for chunk in model_chunks for b in _ddp_buffers(chunk)
                  if hasattr(b, "numel"))
    return _unique_bytes(storages), logical


def _leaf_optimizers(optimizer: Any) -> list[Any]:
    return list(getattr(optimizer, "chained_optimizers", None) or [optimizer])


def optimizer_bytes(optimizer: Any, model_chunks: list[Any]) -> int:
    """Optimizer state plus fp32 master copies, excluding weight and gradient storages."""
    exclude = param_storage_ptrs(model_chunks)
    exclude |= {_storage_key(b.grad_data)[0] for chunk in model_chunks for b in _ddp_buffers(chunk)}
    tensors: list[Any] = []
    for leaf in _leaf_optimizers(optimizer):
        torch_optimizer = getattr(leaf, "optimizer", None)
        if torch_optimizer is None:
            continue
        for group in torch_optimizer.param_groups:
            tensors += list(group["params"])
        for state in torch_optimizer.state.values():
            tensors += [v for v in state.values() if hasattr(v, "untyped_storage")]
    return _unique_bytes(tensors, exclude)


class _Saved:
    """What the pack hook returns; autograd drops it when the graph node is freed."""

    __slots__ = ("tensor", "tracker", "key")

    def __init__(self, tensor: Any, tracker: SavedTensorTracker, key: int | None) -> None:
        self.tensor, self.tracker, self.key = tensor, tracker, key

    def __del__(self) -> None:
        if self.key is not None:
            self.tracker._release(self.key)


class SavedTensorTracker:
    """Peak bytes of tensors saved for backward (unique storages, parameters excluded)."""

    def __init__(self, exclude_ptrs: set[int]) -> None:
        self.exclude = exclude_ptrs
        self.refs: dict[int, list[int]] = {}  # storage ptr -> [holders, nbytes]
        self.live_bytes = 0
        self.peak_bytes = 0

    def _pack(self, tensor: Any) -> _Saved:
        ptr, nbytes = _storage_key(tensor)
        if not ptr or ptr in self.exclude or tensor.device.type == "meta":
            return _Saved(tensor, self, None)
        entry = self.refs.get(ptr)
        if entry is None:
            self.refs[ptr] = [1, nbytes]
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        else:
            entry[0] += 1
        return _Saved(tensor, self, ptr)

    @staticmethod
    def _unpack(saved: _Saved) -> Any:
        return saved.tensor

    def _release(self, ptr: int) -> None:
        entry = self.refs.get(ptr)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live_bytes -= entry[1]
            del self.refs[ptr]

    def hooks(self) -> Any:
        import torch

        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

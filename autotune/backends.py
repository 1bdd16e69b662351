"""The backends a search can drive, behind one small interface (`evaluate(job, layout) -> Measurement`).

- `analytic`: autotune's memory and cost models (`autotune.analytic.AnalyticBackend`), pure
  arithmetic, microseconds per layout; the default when no GPU is visible.
- `megatron`: real megatron-core profiling trainers (`trainers.backend.MegatronBackend`), on GPUs
  where present, otherwise a CPU proxy.

Both are imported only when asked for, so choosing a backend costs nothing until it runs.
"""

from __future__ import annotations

import importlib
import os
from typing import Literal

from autotune.measurement import Backend

__all__ = ["BACKENDS", "BackendName", "get_backend", "default_backend", "resolve_backend_name", "gpus_visible"]

BackendName = Literal["analytic", "megatron"]
BACKENDS: dict[str, tuple[str, str]] = {
    "analytic": ("autotune.analytic", "AnalyticBackend"),
    "megatron": ("trainers.backend", "MegatronBackend"),
}


def gpus_visible() -> bool:
    """True when a CUDA device is visible, found without importing torch (nvidia-smi's device nodes)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl") and os.path.exists("/dev/nvidia-uvm")


def default_backend() -> BackendName:
    """`megatron` where GPUs are visible (measured beats modelled), `analytic` otherwise."""
    return "megatron" if gpus_visible() else "analytic"


def resolve_backend_name(name: str | None) -> BackendName:
    """`auto` (or None) becomes `default_backend()`; anything else must be a known backend name."""
    if name in (None, "auto"):
        return default_backend()
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of auto, {', '.join(BACKENDS)}, but got {name!r}.")
    return name  # type: ignore[return-value]


def get_backend(name: str | None = "auto") -> Backend:
    """A fresh backend instance by name (`auto`, `analytic`, `megatron`); its module is imported now."""
    module_name, class_name = BACKENDS[resolve_backend_name(name)]
    module = importlib.import_module(module_name)
    return getattr(module, class_name)()

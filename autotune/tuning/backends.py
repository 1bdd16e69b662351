"""The backends a search can drive, behind one small interface (`evaluate(job, layout) -> Measurement`).

- `analytic`: autotune's memory and cost models (`autotune.cost.analytic.AnalyticBackend`), pure
  arithmetic, microseconds per layout; the default when no GPU is visible.
- `megatron`: real megatron-core profiling trainers (`trainers.backend.MegatronBackend`), on GPUs
  where present, otherwise a CPU proxy.

Both are imported only when asked for, so choosing a backend costs nothing until it runs.
"""

from __future__ import annotations

import importlib
import os
from typing import Literal

from search_spaces.measurement import Backend

__all__ = ["BACKENDS", "BackendName", "get_backend", "default_backend", "resolve_backend_name", "gpus_visible",
           "with_prediction", "trainer_entry"]

BackendName = Literal["analytic", "megatron"]
BACKENDS: dict[str, tuple[str, str]] = {
    "analytic": ("autotune.cost.analytic", "AnalyticBackend"),
    "megatron": ("trainers.backend", "MegatronBackend"),
}


def gpus_visible() -> bool:
    """True when a CUDA device is visible, found without importing torch (nvidia-smi's device nodes)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl") and os.path.exists("/dev/nvidia-uvm")


def default_backend() -> BackendName:
    """`analytic`: the cost models are the default backend everywhere. Real megatron-core jobs (`megatron`)
    start only when asked for by name, also on a machine with GPUs."""
    return "analytic"


def resolve_backend_name(name: str | None) -> BackendName:
    """`auto` (or None) becomes `default_backend()`; anything else must be a known backend name."""
    if name in (None, "auto"):
        return default_backend()
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of auto, {', '.join(BACKENDS)}, but got {name!r}.")
    return name  # type: ignore[return-value]


def get_backend(name: str | None = "auto") -> Backend:
    """A fresh backend instance by name (`auto`, `analytic`, `megatron`); its module is imported now.
    A measuring backend comes wrapped in `Predicted` (the analytic model's figures beside each measurement)."""
    module_name, class_name = BACKENDS[resolve_backend_name(name)]
    module = importlib.import_module(module_name)
    return with_prediction(getattr(module, class_name)())


def with_prediction(backend: Backend) -> Backend:
    """The `megatron` backend wrapped in `Predicted`; any other backend (analytic, a test's own) as it is."""
    from autotune.tuning.measured import Predicted

    if isinstance(backend, Predicted) or getattr(backend, "name", "") != "megatron":
        return backend
    return Predicted(backend)


def trainer_entry(module: str, attribute: str):
    """A function of the `trainers` package, loaded by name (the UI's `smoke` verb runs one job through it)."""
    if not module.startswith("trainers."):
        raise ValueError(f"trainer entries live in the trainers package, not {module!r}.")
    return getattr(importlib.import_module(module), attribute)

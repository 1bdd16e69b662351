"""autotune: find the fastest valid Megatron-Core parallel layout for a model on a GPU cluster.

    import autotune
    result = autotune.search("mixtral", nodes=4, trials=64, seed=0)

The API (`autotune.ui.api`) and the helper modules load on first use, so `import autotune` stays light.

Layers, imported one way: `search_spaces` <- `autotune.cost` <- `autotune.tuning` <- `autotune.outputs`
<- `autotune.ui` (docs/architecture.md).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["search", "estimate", "profile", "make_job", "ray_session", "Result",
           "models", "clusters", "plots", "report", "launch", "dashboard", "api"]

_API = frozenset({"search", "estimate", "profile", "make_job", "ray_session", "Result"})
_SUBMODULES = {"models": "autotune.ui.models", "clusters": "autotune.ui.clusters", "plots": "autotune.outputs.plots",
               "report": "autotune.outputs.report", "launch": "autotune.outputs.launch",
               "dashboard": "autotune.ui.dashboard", "api": "autotune.ui.api"}


def __getattr__(name: str) -> Any:
    if name in _API:
        value = getattr(importlib.import_module("autotune.ui.api"), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name])
    else:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

"""Model specs for scripts and notebooks: the catalog, Hugging Face configs, and variants built in code.

A thin layer over `search_spaces.catalog`; every value is an immutable `ModelSpec`, so specs compose
with `variant` (a checked `dataclasses.replace`) and can be passed to `autotune.search` directly.

    >>> from autotune import models
    >>> m = models.get("llama3-70b")
    >>> m.num_layers, round(m.total_params / 1e9, 1)
    (80, 70.6)
    >>> models.variant(m, num_layers=40).num_layers
    40
    >>> "mixtral-8x7b" in models.names()
    True
"""

from __future__ import annotations

import builtins
import dataclasses
from pathlib import Path

from search_spaces.model import MLASpec, ModelSpec, MoESpec

__all__ = ["get", "list", "names", "from_hf_config", "variant", "resolve", "ModelSpec", "MoESpec", "MLASpec"]


def get(name_or_path: str) -> ModelSpec:
    """A catalog model by name or alias (`"mixtral"`, `"llama3-70b"`), or a path to a HF `config.json`.

    Raises ValueError listing the known names when the name is unknown.
    """
    from search_spaces.catalog import get_model

    return get_model(name_or_path)


def list() -> builtins.list[ModelSpec]:  # noqa: A001 - `models.list()` reads well beside `models.get()`
    """Every catalog model, production models first, then the tiny test models."""
    from search_spaces.catalog import list_models

    return list_models()


def names() -> builtins.list[str]:
    """The catalog's model names (aliases such as `mixtral` also work with `get`)."""
    from search_spaces.catalog import model_names

    return model_names()


def from_hf_config(path: str | Path) -> ModelSpec:
    """A model from a Hugging Face `config.json` (a file, or a folder that holds one).

        >>> models.from_hf_config("checkpoints/Mixtral-8x7B/config.json")   # doctest: +SKIP
    """
    from search_spaces.hf_config import model_from_hf_config

    return model_from_hf_config(path)


def variant(model: ModelSpec, **changes: object) -> ModelSpec:
    """A copy of `model` with some `ModelSpec` fields changed; the spec's own checks run again.

    Unknown fields raise ValueError naming the allowed ones. Give `name=` to tell the variant apart
    in reports; by default it is the base name plus the changes (`llama3-70b[num_layers=40]`).
    """
    allowed = {f.name for f in dataclasses.fields(ModelSpec)}
    unknown = sorted(set(changes) - allowed)
    if unknown:
        raise ValueError(f"ModelSpec has no field(s) {unknown}; fields are {sorted(allowed)}.")
    if "name" not in changes:
        suffix = ",".join(f"{k}={v}" for k, v in changes.items())
        changes["name"] = f"{model.name}[{suffix}]"
    return dataclasses.replace(model, **changes)  # type: ignore[arg-type]


def resolve(model: str | Path | ModelSpec) -> ModelSpec:
    """A `ModelSpec` as is, or one looked up by name or config path (what `autotune.search(model=...)` takes)."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, (str, Path)):
        return get(str(model))
    raise ValueError("model must be a catalog name, a config.json path or a ModelSpec, "
                     f"but got {type(model).__name__}.")

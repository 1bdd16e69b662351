"""`ModelSpec` from a local Hugging Face `config.json` (never the network).

Every key of the file is accounted for: a family's builder (`hf_families.py`) reads the keys that shape the
model (sizes, attention and MLP variants, MoE routing, MTP) and refuses a setting the ModelSpec cannot express
with a message naming the key; keys that change neither a parameter count nor a layout rule are listed in
`hf_keys.NO_EFFECT_KEYS` with the reason. Any other key is reported in a warning (`UnreadKeysWarning`), never
dropped silently. Values are checked by type and range: a size given as a string (`"32"`), a fraction
(`32000.5`), a boolean or a negative number is a ValueError naming the file and the key.

HF's `max_position_embeddings` is the RoPE context length, not a learned table, so it is not carried over.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from search_spaces.hf_families import SUPPORTED_ARCHITECTURES, builder_for
from search_spaces.hf_keys import HFConfig
from search_spaces.model import ModelSpec

__all__ = ["SUPPORTED_ARCHITECTURES", "UnreadKeysWarning", "model_from_hf_config"]


class UnreadKeysWarning(UserWarning):
    """A config.json holds keys autotune does not know; it assumes they change no parameter count or rule."""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(f"Cannot read Hugging Face config {str(path)!r}: {err.strerror or err}.") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file (a Hugging Face config.json is JSON).") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}.") from None
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ValueError(f"{path} must hold a JSON object (a Hugging Face config.json), but holds a {kind}.")
    return data


def _model_name(data: Mapping[str, Any], path: Path) -> str:
    """The model's directory name for `<dir>/config.json`, else the file's stem."""
    stem = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return stem or str(data.get("_name_or_path", "hf-model"))


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Read a local config.json (or a directory holding one) into a ModelSpec.

    Raises ValueError naming the file for unreadable or invalid JSON, a missing or mistyped key, a setting
    the ModelSpec cannot express, or an architecture outside `SUPPORTED_ARCHITECTURES`. Keys autotune does
    not know are named in an `UnreadKeysWarning`.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    data = _read_json(path)
    config = HFConfig(data, path)
    builder = builder_for(data, path)
    try:
        spec = ModelSpec(name=_model_name(data, path), **builder(config))
    except (ValueError, TypeError) as err:  # MoESpec / ModelSpec checks: say which file they are about
        raise ValueError(str(err) if str(err).startswith(str(path)) else f"{path}: {err}") from None
    unread = config.unread()
    if unread:
        warnings.warn(f"{path}: autotune does not read {', '.join(unread)}; it assumes they change neither the "
                      "parameter count nor the layout rules.", UnreadKeysWarning, stacklevel=2)
    return spec

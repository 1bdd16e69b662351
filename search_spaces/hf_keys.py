"""The keys of a Hugging Face `config.json`, read with their types and ranges checked (`HFConfig`), and the keys that
change nothing autotune models (`NO_EFFECT_KEYS`). The family builders (`hf_families.py`) read through `HFConfig`;
the loader (`hf_config.py`) warns about the keys nobody read.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, overload

__all__ = ["NO_EFFECT_KEYS", "HFConfig"]


# keys read by no builder because they change neither a parameter count nor a layout rule, with the reason
NO_EFFECT_KEYS: dict[str, str] = {
    **dict.fromkeys(("_name_or_path", "architectures", "model_type", "auto_map", "transformers_version",
                     "torch_dtype", "dtype", "use_cache", "cache_implementation", "_attn_implementation",
                     "attn_implementation", "return_dict", "use_bfloat16", "tf_legacy_loss"),
                    "bookkeeping of the Hugging Face checkpoint"),
    **dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id"), "tokenizer ids"),
    **dict.fromkeys(("rms_norm_eps", "layer_norm_eps", "initializer_range", "rope_theta", "rope_scaling",
                     "rope_parameters", "rope_local_base_freq", "rope_interleave", "partial_rotary_factor",
                     "original_max_position_embeddings", "initial_context_length", "max_position_embeddings",
                     "query_pre_attn_scalar", "swiglu_limit"),
                    "numerics of the forward pass (RoPE, norms, scales), no parameters"),
    **dict.fromkeys(("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop"),
                    "dropout, a training setting"),
    **dict.fromkeys(("router_aux_loss_coef", "aux_loss_alpha", "seq_aux", "output_router_logits",
                     "router_jitter_noise"), "the MoE load-balancing loss, a training setting"),
    "quantization_config": "how the published weights are stored (e.g. FP8 blocks, MXFP4), not how they train",
    "ep_size": "DeepSeek's inference expert parallelism, not a model dimension",
    "pretraining_tp": "a numerics switch of the HF implementation; 1 in the published configs",
    "max_window_layers": "only read with use_sliding_window (refused when true)",
    **dict.fromkeys(("layer_norm_epsilon", "residual_in_fp32", "rescale_prenorm_residual", "time_step_min",
                     "time_step_max", "time_step_floor", "time_step_limit", "use_mamba_kernels",
                     "mamba_ssm_cache_dtype", "num_logits_to_keep", "moe_shared_expert_overlap", "norm_eps"),
                    "Nemotron-H numerics, inference settings or an overlap switch, no parameters"),
}


class HFConfig:
    """A config.json mapping whose accessors check type and range and name the file and key on failure.
    It records which keys were read, so the loader can say which were not.
    (Annotations say `builtins.int` etc.: inside the class, `int`, `str`, `bool` and `list` name the accessors.)
    The overloads say when a value is certain: a required key, or one with a default, is never None."""

    def __init__(self, data: Mapping[str, Any], path: Path) -> None:
        self._data, self.path = data, path
        self.read: set[builtins.str] = set()

    def _raw(self, key: builtins.str) -> Any:
        self.read.add(key)
        return self._data.get(key)

    @overload
    def int(self, key: builtins.str, default: builtins.int | None = None, *, minimum: builtins.int = 1,
            required: Literal[True] = True) -> builtins.int: ...
    @overload
    def int(self, key: builtins.str, default: builtins.int, *, minimum: builtins.int = 1,
            required: builtins.bool) -> builtins.int: ...
    @overload
    def int(self, key: builtins.str, default: None = None, *, minimum: builtins.int = 1,
            required: builtins.bool) -> builtins.int | None: ...
    def int(self, key: builtins.str, default: builtins.int | None = None, *, minimum: builtins.int = 1,
            required: builtins.bool = True) -> builtins.int | None:
        """An integer >= minimum; `default` when absent or null; a missing required key is an error."""
        value = self._raw(key)
        if value is None:
            if default is None and required:
                raise ValueError(f"{self.path}: missing key {key!r}, which this architecture needs.")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            kind = "a string" if isinstance(value, str) else type(value).__name__
            raise ValueError(f"{self.path}: {key} must be an integer, but got {value!r} ({kind}).")
        if value < minimum:
            raise ValueError(f"{self.path}: `{key} >= {minimum}` must hold, but got ({key}={value}).")
        return value

    @overload
    def number(self, key: builtins.str, default: float) -> float: ...
    @overload
    def number(self, key: builtins.str, default: None = None) -> float | None: ...
    def number(self, key: builtins.str, default: float | None = None) -> float | None:
        """A finite number (int or float), `default` when absent or null."""
        value = self._raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (
                float("inf"), float("-inf")):
            raise ValueError(f"{self.path}: {key} must be a number, but got {value!r}.")
        return float(value)

    def bool(self, key: builtins.str, default: builtins.bool) -> builtins.bool:
        value = self._raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ValueError(f"{self.path}: {key} must be true or false, but got {value!r}.")
        return value

    @overload
    def str(self, key: builtins.str, default: builtins.str, *,
            choices: tuple[builtins.str, ...] | None = None) -> builtins.str: ...
    @overload
    def str(self, key: builtins.str, default: None = None, *,
            choices: tuple[builtins.str, ...] | None = None) -> builtins.str | None: ...
    def str(self, key: builtins.str, default: builtins.str | None = None, *,
            choices: tuple[builtins.str, ...] | None = None) -> builtins.str | None:
        value = self._raw(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ValueError(f"{self.path}: {key} must be a string, but got {value!r}.")
        if choices is not None and value not in choices:
            raise ValueError(f"{self.path}: {key}={value!r} is not supported; supported: {', '.join(choices)}.")
        return value

    def list(self, key: builtins.str) -> builtins.list[Any] | None:
        value = self._raw(key)
        if value is not None and not isinstance(value, list):
            raise ValueError(f"{self.path}: {key} must be a list, but got {value!r}.")
        return value

    def refuse(self, key: builtins.str, supported: Any, why: builtins.str) -> None:
        """Raise when `key` is set to something other than `supported` (absent and null are fine)."""
        value = self._raw(key)
        if value is not None and value != supported:
            raise ValueError(f"{self.path}: {key}={value!r} is not supported ({why}); only {supported!r} is.")

    def unread(self) -> builtins.list[builtins.str]:
        return sorted(k for k in self._data if k not in self.read and k not in NO_EFFECT_KEYS)

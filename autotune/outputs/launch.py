"""A layout as a training launch: Megatron-Bridge overrides and Megatron-LM arguments that reproduce the prediction.

Both forms come from one table, `search_spaces.megatron_names` (megatron-core field -> Megatron-LM flag ->
Megatron-Bridge key), over `job_settings(job, layout)`: every switch the step time and memory assume, with its
effective value, set explicitly (a recipe's own values would otherwise win). Targets: Megatron-LM
`megatron/training/arguments.py` at core_v0.16.1 and Megatron-Bridge v0.3.1's `ConfigContainer`, both checked
against their real definitions in `tests/test_launch_parsers.py`.

Megatron-Bridge (`scripts/training/run_recipe.py --recipe R` followed by Hydra overrides):
- `None` is `null`: a recipe's uneven split, pipeline layout or recompute method is cleared when the layout has none.
- The precision is one `MixedPrecisionConfig` and the overlap switches one `CommOverlapConfig`, built by the line
  (`mixed_precision=null 'mixed_precision={_target_:...}'`): Bridge copies both objects' fields over the model's,
  DDP's and the optimizer's in `runtime_config_update`, and a recipe holds them either as an object or as a name /
  None, which no dotted override can reach both of. Setting the group to null first makes the assignment work on
  either. Bridge instantiates a `_target_` dict when it applies the overrides (`utils/omegaconf_utils.py`
  `_apply_overrides`). A recipe's tuned userbuffer preset (`tp_comm_overlap_cfg`) is not kept: Transformer
  Engine's default userbuffer settings are used.
Megatron-LM (`pretrain_gpt.py` with your model's architecture arguments): a switch that is off is left out where
Megatron-LM's default is off; bf16 gradient reduction is `--grad-reduce-in-bf16` (Megatron-LM's default for bf16
is fp32).

Each form is one shell line (`shlex.join`), items quoted where the shell or Hydra needs it.
"""

from __future__ import annotations

import re
import shlex

from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.megatron_names import NAMES, job_settings

__all__ = ["bridge_overrides", "megatron_lm_args", "launch_forms", "bridge_recipe", "launch_header",
           "BRIDGE_RECIPES", "BRIDGE_SCRIPT", "MEGATRON_LM_SCRIPT", "COMM_OVERLAP_CLASS", "MIXED_PRECISION_CLASS"]

BRIDGE_SCRIPT = "scripts/training/run_recipe.py"
MEGATRON_LM_SCRIPT = "pretrain_gpt.py"
COMM_OVERLAP_CLASS = "megatron.bridge.training.comm_overlap.CommOverlapConfig"
MIXED_PRECISION_CLASS = "megatron.bridge.training.mixed_precision.MixedPrecisionConfig"
# catalog model -> Megatron-Bridge v0.3.1 pretraining recipe (`src/megatron/bridge/recipes/`); Mixtral and Mistral
# have none there.
BRIDGE_RECIPES: dict[str, str] = {
    "llama3-8b": "llama3_8b_pretrain_config",
    "llama3-70b": "llama3_70b_pretrain_config",
    "llama3.1-405b": "llama31_405b_pretrain_config",
    "qwen2-7b": "qwen2_7b_pretrain_config",
    "qwen3-8b": "qwen3_8b_pretrain_config",
    "qwen3-30b-a3b": "qwen3_30b_a3b_pretrain_config",
    "qwen3-235b-a22b": "qwen3_235b_a22b_pretrain_config",
    "deepseek-v3": "deepseek_v3_pretrain_config",
    "gpt3-175b": "gpt3_175b_pretrain_config",
}
# MixedPrecisionConfig fields that are False unless set (training/mixed_precision.py): left out when off
_OFF_BY_DEFAULT = frozenset({"fp8_param_gather", "reuse_grad_buf_for_mxfp8_param_ag"})
_GROUP_ORDER = ("model", "train", "dataset", "ddp", "optimizer", "rng")
_TORCH_DTYPES = {"fp32": "torch.float32", "bf16": "torch.bfloat16"}
_HYDRA_PLAIN = re.compile(r"[A-Za-z0-9_.\-]+")  # a value Hydra's override grammar reads unquoted
# Megatron-Bridge's `bf16_with_fp8_delayed_scaling_mixed` amax settings (`training/mixed_precision.py`)
_DELAYED_AMAX = {"fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "max"}


def bridge_recipe(model_name: str) -> str | None:
    """The Megatron-Bridge v0.3.1 pretraining recipe of a catalog model, or None when Bridge has none."""
    return BRIDGE_RECIPES.get(model_name)


def _hydra(value: object, *, dtype: bool = False) -> str:
    """A value in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra(v) for v in value) + "]"
    text = _TORCH_DTYPES[str(value)] if dtype else str(value)
    return text if _HYDRA_PLAIN.fullmatch(text) else '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _target(cls: str, kwargs: dict[str, object]) -> str:
    """A Hydra dict Bridge instantiates: `{_target_:cls,key:value,...}`."""
    return "{" + ",".join([f"_target_:{cls}"] + [f"{k}:{v}" for k, v in kwargs.items()]) + "}"


def _torch_dtype(name: str) -> str:
    return _target(_TORCH_DTYPES[name], {"_call_": "false"})  # the dtype object itself, not a call


def bridge_overrides(job: Job, layout: Layout) -> list[str]:
    """Hydra overrides for a Megatron-Bridge recipe (`group.field=value`), one argv item each, unquoted."""
    out: list[str] = []
    objects: dict[str, dict[str, object]] = {"comm_overlap": {}, "mixed_precision": {}}
    for core, value in job_settings(job, layout).items():
        name = NAMES[core]
        for key in name.bridge:
            group, sep, field = key.partition(":")
            if sep:
                if value is not None and not (value is False and field in _OFF_BY_DEFAULT):
                    objects[group][field] = _hydra(value)
            else:
                out.append(f"{key}={_hydra(value, dtype=name.kind == 'dtype')}")
    comm = {"tp_comm_overlap": "false", **objects["comm_overlap"]}  # tp_comm_overlap is its one required field
    precision = {**objects["mixed_precision"], "params_dtype": _torch_dtype("bf16"),
                 "pipeline_dtype": _torch_dtype("bf16"), "autocast_enabled": "false"}
    if job.fp8_recipe == "delayed":
        precision.update({k: _hydra(v) for k, v in _DELAYED_AMAX.items()})
    out.sort(key=lambda item: _GROUP_ORDER.index(item.split(".", 1)[0]))  # stable: grouped, table order inside
    out += ["comm_overlap=null", f"comm_overlap={_target(COMM_OVERLAP_CLASS, comm)}",
            "mixed_precision=null", f"mixed_precision={_target(MIXED_PRECISION_CLASS, precision)}"]
    return out


def megatron_lm_args(job: Job, layout: Layout) -> list[str]:
    """`pretrain_gpt.py` arguments (flag and value as separate items, ready for a shell line)."""
    settings = job_settings(job, layout)
    if settings.get("pipeline_model_parallel_layout") is not None:
        # Megatron-LM derives VPP from the layout string and refuses both (arguments.py L503-527)
        settings.pop("virtual_pipeline_model_parallel_size")
    out: list[str] = []
    for core, value in settings.items():
        name = NAMES[core]
        if name.lm is None or value is None:
            continue
        if name.kind == "bool":
            flag = name.lm if value else name.lm_false
            out += [flag] if flag else []
        elif name.kind == "list":
            out += [name.lm, *(str(v) for v in value)]  # type: ignore[attr-defined]
        else:
            out += [name.lm, str(value)]
    return out


def launch_forms(job: Job, layout: Layout) -> dict[str, str]:
    """Both launch forms as single shell lines: `{"megatron_bridge": "...", "megatron_lm": "..."}`."""
    return {"megatron_bridge": shlex.join(bridge_overrides(job, layout)),
            "megatron_lm": shlex.join(megatron_lm_args(job, layout))}


def launch_header(job: Job, form: str) -> str:
    """What to run the form's arguments with, in words (the CLI and the report print it above the line)."""
    if form == "megatron_bridge":
        recipe = bridge_recipe(job.model.name)
        where = (f"--recipe {recipe}" if recipe
                 else f"--recipe <your recipe> (Bridge v0.3.1 has none for {job.model.name})")
        return f"Megatron-Bridge v0.3.1 overrides for {BRIDGE_SCRIPT} {where}"
    return f"Megatron-LM (core_v0.16.1) arguments for {MEGATRON_LM_SCRIPT}, after the model's architecture arguments"

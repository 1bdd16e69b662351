"""A layout as a training launch: Megatron-Bridge overrides and Megatron-LM arguments that reproduce the prediction.

Both forms come from one table, `search_spaces.megatron_names` (megatron-core field -> Megatron-LM flag ->
Megatron-Bridge key), over `job_settings(job, layout)`: every switch the step time and memory assume, with its
effective value, set explicitly (a recipe's own values would otherwise win). The targets follow the megatron-core
release the job runs (`search_spaces.megatron_version.LAUNCH_TARGETS`): for 0.19.2, Megatron-Bridge 0.6.2's
`ConfigContainer` and Megatron-LM's `megatron/training/arguments.py` as the megatron-core 0.19.2 wheel ships it,
both loaded by their own code in `tests/test_launch_bridge.py` (Bridge's overrides and `runtime_config_update`,
Megatron-LM's parser and `validate_args`); for 0.16.1, Bridge v0.3.1 and Megatron-LM core_v0.16.1, checked against
their recorded definitions in `tests/test_launch_parsers.py`.

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

from search_spaces.bridge_recipes import bridge_recipe as bridge_recipe_for
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.megatron_names import NAMES, job_settings
from search_spaces.megatron_version import LAUNCH_TARGETS
from search_spaces.releases import local_layer_graphs_refused

__all__ = ["bridge_overrides", "megatron_lm_args", "megatron_lm_settings", "megatron_lm_notes", "bridge_notes",
           "megatron_lm_environment", "launch_forms",
           "bridge_recipe", "launch_header",
           "BRIDGE_RECIPES", "BRIDGE_SCRIPT", "MEGATRON_LM_SCRIPT", "MEGATRON_LM_HYBRID_SCRIPT",
           "megatron_lm_script", "COMM_OVERLAP_CLASS", "MIXED_PRECISION_CLASS"]

BRIDGE_SCRIPT = "scripts/training/run_recipe.py"
MEGATRON_LM_SCRIPT = "pretrain_gpt.py"
MEGATRON_LM_HYBRID_SCRIPT = "pretrain_hybrid.py"  # Megatron-LM core_v0.19.0's HybridModel entry point
COMM_OVERLAP_CLASS = "megatron.bridge.training.comm_overlap.CommOverlapConfig"
MIXED_PRECISION_CLASS = "megatron.bridge.training.mixed_precision.MixedPrecisionConfig"
# catalog model -> Megatron-Bridge v0.3.1 pretraining recipe (`src/megatron/bridge/recipes/`; the --megatron-core
# 0.16.1 target); Mixtral and Mistral
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
_OFF_BY_DEFAULT = frozenset({"fp8_param_gather", "reuse_grad_buf_for_mxfp8_param_ag", "first_last_layers_bf16"})
# settings that mean nothing unless another is set (their value is the default either way): left out then
_ONLY_WITH = {"fp4_recipe": "fp4", "num_layers_at_start_in_bf16": "first_last_layers_bf16",
              "num_layers_at_end_in_bf16": "first_last_layers_bf16", "cpu_offloading_num_layers": "cpu_offloading"}


def _shown(settings: dict[str, object]) -> dict[str, object]:
    """`settings` less those `_ONLY_WITH` says mean nothing here (what a launch line spells out)."""
    return {k: v for k, v in settings.items() if k not in _ONLY_WITH or settings.get(_ONLY_WITH[k])}
_GROUP_ORDER = ("model", "train", "dataset", "ddp", "dist", "optimizer", "checkpoint", "rng", "rerun_state_machine")
_TORCH_DTYPES = {"fp32": "torch.float32", "bf16": "torch.bfloat16"}
_HYDRA_PLAIN = re.compile(r"[A-Za-z0-9_.\-]+")  # a value Hydra's override grammar reads unquoted
# keys a Bridge release's recipes may still set that would fight the line's: megatron-core 0.19 migrates a
# deprecated `cuda_graph_scope` over `cuda_graph_modules` and refuses both together (transformer_config.py), and
# Bridge 0.6's recipes still write the old name (perf_recipes/llama/*/llama3.py: ["full_iteration"])
_BRIDGE_CLEARED = {"0.6.2": ("model.cuda_graph_scope",)}
# Megatron-FSDP asserts "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset." (Bridge 0.6.2 training/config.py
# `_validate_and_apply_megatron_fsdp_configs` :1102-1104), and a Hopper TP recipe's env_vars set it to 1
# (perf_recipes/llama/h100/llama3.py :57), which `runtime_config_update` applies before it validates
# (`apply_environment_variables` :1832-1850, :1870): the FSDP line sets the 32 of NVIDIA's FSDP recipes
# (perf_recipes/llama/gb200/llama3.py :236). `++` adds or replaces the key (a recipe's dict may lack it). A value
# already in the shell still wins (os.environ.setdefault); Bridge v0.3.1 has no env_vars.
_BRIDGE_FSDP_ENV = {"0.6.2": ("++env_vars.CUDA_DEVICE_MAX_CONNECTIONS=32",)}
# Megatron-Bridge's `bf16_with_fp8_delayed_scaling_mixed` amax settings (`training/mixed_precision.py`)
_DELAYED_AMAX = {"fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "max"}


def bridge_recipe(model_name: str) -> str | None:
    """The Megatron-Bridge v0.3.1 pretraining recipe of a catalog model, or None when Bridge has none (0.6.2's:
    `search_spaces.bridge_recipes.bridge_recipe`)."""
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
    release = LAUNCH_TARGETS[job.training.megatron_core].bridge
    for core, value in _shown(job_settings(job, layout)).items():
        name = NAMES[core]
        for key in name.bridge_keys(release):
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
    out += [f"{key}=null" for key in _BRIDGE_CLEARED.get(release, ())]
    out.sort(key=lambda item: _GROUP_ORDER.index(item.split(".", 1)[0]))  # stable: grouped, table order inside
    out += list(_BRIDGE_FSDP_ENV.get(release, ())) if layout.fsdp else []
    out += ["comm_overlap=null", f"comm_overlap={_target(COMM_OVERLAP_CLASS, comm)}",
            "mixed_precision=null", f"mixed_precision={_target(MIXED_PRECISION_CLASS, precision)}"]
    return out


def megatron_lm_settings(job: Job, layout: Layout) -> dict[str, object]:
    """`job_settings` as Megatron-LM of the job's release accepts them (`megatron_lm_notes` says what differs)."""
    settings = job_settings(job, layout)
    if _lm_refuses_te_loss(job) and settings.get("cross_entropy_loss_fusion"):
        settings["cross_entropy_fusion_impl"] = "native"
    return settings


def _lm_refuses_te_loss(job: Job) -> bool:
    """Megatron-LM 0.19 asserts against TE's fused cross-entropy ("disabled due to stability issues",
    megatron/training/arguments.py `validate_args`, megatron-core 0.19.2 wheel L1642); Bridge 0.6 and
    megatron-core themselves run it."""
    return job.training.megatron_core >= "0.19" and job.training.cross_entropy_fusion == "te"


def megatron_lm_notes(job: Job) -> list[str]:
    """Where the Megatron-LM line cannot carry a switch the prediction assumes, in words."""
    notes = []
    if _lm_refuses_te_loss(job):
        notes.append("Megatron-LM core_v0.19.2 refuses Transformer Engine's fused cross-entropy, so this line uses the "
                     "native fused loss, which keeps more bytes per logit than the prediction assumes (Bridge runs "
                     "TE's)")
    if job.training.fp8 and job.training.fp8_dot_product_attention:
        notes.append("Megatron-LM has no flag for FP8 attention (fp8_dot_product_attention is excluded from its "
                     "arguments), so this line runs BF16 attention, slower than predicted; Bridge's line sets it")
    return notes


def megatron_lm_environment(job: Job, layout: Layout) -> dict[str, str]:
    """Environment Megatron-LM requires for the layout: `CUDA_DEVICE_MAX_CONNECTIONS=1` with TP or CP on GPUs before
    Blackwell (megatron/training/arguments.py `validate_args` asserts it unless the EP A2A overlap, which wants more
    connections, is on: 0.19.2 wheel L1413-1437; core_v0.16.1 asserts it for TP or CP alike)."""
    if job.cluster.gpu.capability[0] >= 10 or (layout.tp == 1 and layout.cp == 1):
        return {}
    if layout.fsdp:  # "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset." (with TP/CP on Hopper it only warns)
        return {}
    settings = job_settings(job, layout)
    if settings.get("overlap_moe_expert_parallel_comm") and job.training.megatron_core >= "0.17":
        return {}
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def bridge_notes(job: Job, layout: Layout | None) -> list[str]:
    """Where the Bridge line cannot run as the prediction assumes, in words."""
    refused = local_layer_graphs_refused(job.training.release)
    if layout is not None and layout.cuda_graphs == "local" and refused:
        return [f"{refused} (or use the Megatron-LM line)"]
    return []


def megatron_lm_script(job: Job) -> str:
    """The Megatron-LM entry point: `pretrain_hybrid.py` for a hybrid Mamba model (its architecture arguments
    include `--hybrid-layer-pattern`), `pretrain_gpt.py` otherwise."""
    return MEGATRON_LM_HYBRID_SCRIPT if job.model.is_hybrid else MEGATRON_LM_SCRIPT


def megatron_lm_args(job: Job, layout: Layout) -> list[str]:
    """`pretrain_gpt.py` (`pretrain_hybrid.py`) arguments (flag and value as separate items, ready for a shell
    line)."""
    settings = megatron_lm_settings(job, layout)
    if settings.get("pipeline_model_parallel_layout") is not None:
        # Megatron-LM derives VPP from the layout string and refuses both (arguments.py L503-527)
        settings.pop("virtual_pipeline_model_parallel_size")
    tag = LAUNCH_TARGETS[job.training.megatron_core].megatron_lm
    out: list[str] = []
    for core, value in _shown(settings).items():
        name = NAMES[core]
        flag = name.lm_flag(tag)
        if value is None:
            continue
        if name.kind == "bool":
            chosen = flag if value else name.lm_false
            out += [chosen] if chosen else []
        elif flag is None:
            continue
        elif name.kind == "list":
            out += [flag, *(str(v) for v in value)] if value else []  # type: ignore[attr-defined]  # empty: default
        else:
            out += [flag, str(value)]
    return out


def launch_forms(job: Job, layout: Layout) -> dict[str, str]:
    """Both launch forms as single shell lines: `{"megatron_bridge": "...", "megatron_lm": "..."}`."""
    return {"megatron_bridge": shlex.join(bridge_overrides(job, layout)),
            "megatron_lm": shlex.join(megatron_lm_args(job, layout))}


def launch_header(job: Job, form: str, layout: Layout | None = None) -> str:
    """What to run the form's arguments with, in words (the CLI and the report print it above the line); with the
    layout, the environment the line needs too."""
    target = LAUNCH_TARGETS[job.training.megatron_core]
    if form == "megatron_bridge":
        notes = "".join(f" ({note})" for note in bridge_notes(job, layout))
        return (f"Megatron-Bridge {target.bridge} overrides for {BRIDGE_SCRIPT} {_recipe_words(job, target.bridge)}"
                f"{notes}")
    env = megatron_lm_environment(job, layout) if layout is not None else {}
    run = f" (run with {' '.join(f'{k}={v}' for k, v in env.items())}: Megatron-LM asserts it for this layout)" \
        if env else ""
    notes = "".join(f" ({note})" for note in megatron_lm_notes(job))
    m = job.model
    # megatron-core's unified pattern carries the MTP depths after '/' (`hybrid_layer_allocation.py::
    # ParsedHybridPattern`: "<main>/<mtp>/<mtp>"); Nemotron-3 Super's MTP depth is '*E'
    pattern = f"{m.hybrid_pattern}{'/*E' * m.mtp_num_layers}"
    extra = "".join([f", --moe-latent-size {m.moe.latent_size}" if m.moe is not None and m.moe.latent_size else "",
                     f", --mtp-num-layers {m.mtp_num_layers}" if m.mtp_num_layers else "",
                     ", --mtp-use-repeated-layer" if m.mtp_repeated_layer and m.mtp_num_layers else ""])
    arch = (f"the model's architecture arguments (--hybrid-layer-pattern {pattern}{extra} and the Mamba "
            "sizes among them)" if m.is_hybrid else "the model's architecture arguments")
    return f"Megatron-LM {target.megatron_lm} arguments for {megatron_lm_script(job)}{run}, after {arch}{notes}"


def _recipe_words(job: Job, release: str) -> str:
    if release == "0.3.1":
        recipe = bridge_recipe(job.model.name)
        if recipe:
            return f"--recipe {recipe}"
        return f"--recipe <your recipe> (Bridge v0.3.1 has none for {job.model.name})"
    found = bridge_recipe_for(job)
    if found is None:
        return f"--recipe <your recipe> (Bridge {release} has no pretraining recipe for {job.model.name})"
    how = ("NVIDIA's recipe for this job" if found.exact
           else f"the closest of the model's recipes, for {found.gpus} GPUs; the overrides set the layout")
    return f"--recipe {found.function} ({found.file}: {how})"

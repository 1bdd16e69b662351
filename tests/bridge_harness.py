"""Megatron-Bridge 0.6.2's own config machinery on a CPU, for the launch-line tests (tests/test_launch_bridge.py).

What runs is Bridge's code, installed from the package index (`scripts/bootstrap --test`): a real recipe function
(NVIDIA's `perf_recipes/<family>/<gpu>/*.py` or a library recipe) or Bridge's `_pretrain_common()` template with a
model provider, `process_config_with_overrides` (what `scripts/training/run_recipe.py` applies the Hydra overrides
with, `recipe_runner.apply_cli_overrides`), then `runtime_config_update` (mixed precision and comm-overlap setup,
the data-parallel size, `ConfigContainer.validate()` with megatron-core's own `TransformerConfig.__post_init__`),
the step every Bridge training run takes before it builds the model.

Three things stand in for what a CPU machine lacks, each named where it is made:
- `megatron.bridge.peft.lora_layers`: Bridge 0.6.2 imports `transformer_engine.pytorch` unguarded there
  (peft/lora_layers.py line 20), on the import path of `ConfigContainer` (models/conversion/peft_bridge.py); a
  placeholder module takes its place. Nothing on the config, override or validation path uses LoRA layers.
- `megatron.bridge.recipes`: the package's `__init__` imports every family's recipes, the diffusion ones among
  them, which need nvidia-modelopt (a GPU package). The package is registered without running its `__init__`, so
  a recipe module imports by its own path.
- `te_present()`: Transformer Engine, as installed on the GPU nodes the line is for (version `TE_VERSION`).
  `runtime_config_update` only asks whether TE is there: its version (`megatron.core.utils.get_te_version`), that
  `transformer_engine.pytorch.optimizers.FusedAdam` takes the precision-aware optimizer's arguments
  (`OptimizerConfig.__post_init__`), and that megatron-core found TE's fused permutation kernels
  (`TransformerConfig.__post_init__`, `moe_permute_fusion`). These answer yes, and only inside the call.
- the model provider's `gradient_accumulation_fusion`, whose default Bridge computes when the provider is made
  (`utils/fusions.py::can_enable_gradient_accumulation_fusion`: True where Transformer Engine is installed), is set
  to what it is on the GPU node, True (megatron-core refuses delayed weight gradients under CUDA graphs without it).
- `gpu_present()`: the job's GPU as torch reports it on the node (name, compute capability), which Bridge's
  flex-dispatcher validation reads (`training/flex_dispatcher_backend.py`).
Hugging Face configs come from tests/data/hf through an offline cache (`hf_cache`), so recipes that build their
model provider with `AutoBridge.from_hf_pretrained` run without the network.

Run as a script it reads pickled `Case` fields on stdin and writes pickled `Outcome` fields on stdout (`load`
does both), so the test process never imports Bridge or its placeholders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import pickle
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

BRIDGE_VERSION = "0.6.2"
TE_VERSION = "2.12.0"
# Hugging Face repository -> tests/data/hf file: the configs the recipes and providers read
HF_CONFIGS = {
    "meta-llama/Meta-Llama-3-8B": "llama3-8b.json",
    "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b.json",
    "Qwen/Qwen3-8B": "qwen3-8b.json",
    "Qwen/Qwen2-7B": "qwen2-7b.json",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3.json",
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b.json",
    "mistralai/Mistral-7B-v0.1": "mistral-7b.json",
    "openai/gpt-oss-20b": "gpt-oss-20b.json",
}
# revisions Bridge's recipes pin (`revision=`, recipes/qwen/h100/qwen3_moe.py and qwen3.py): the same published file
HF_REVISIONS = {"Qwen/Qwen3-30B-A3B": ("ad44e777bcd18fa416d9da3bd8f70d33ebb85d39",),
                "Qwen/Qwen3-8B": ("b968826d9c46dd6066d109eabc6255188de91218",)}
_SNAPSHOT = "0" * 40


@dataclasses.dataclass(frozen=True)
class Case:
    """One launch line to load: the Bridge overrides, and where the config starts from."""

    overrides: tuple[str, ...]
    world_size: int
    gpu: tuple[str, tuple[int, int], int]  # the device as torch reports it: name, compute capability, memory bytes
    recipe: str | None = None  # "module:function" of a Bridge recipe, or None: `_pretrain_common()` + a provider
    hf_model: str | None = None  # the Hugging Face repository whose provider the template gets, or None:
    provider: dict[str, Any] | None = None  # GPTModelProvider's fields (a model Bridge has no converter for)
    megatron_lm: tuple[str, ...] = ()  # Megatron-LM arguments (the model's architecture first), or () for none
    megatron_lm_env: tuple[tuple[str, str], ...] = ()  # the environment the Megatron-LM line runs with


@dataclasses.dataclass(frozen=True)
class Outcome:
    error: str | None  # the exception Bridge raised (type: message), or None
    values: dict[str, Any]  # the ConfigContainer's values after `runtime_config_update` (see `read_values`)
    lm_error: str | None = None  # what Megatron-LM's parser or validate_args raised, or None
    lm_values: dict[str, Any] = dataclasses.field(default_factory=dict)  # its namespace after validate_args


def hf_cache(root: Path) -> None:
    """An offline Hugging Face cache of the HF_CONFIGS under `root` (HF_HOME layout: hub/models--org--name)."""
    for repo, name in HF_CONFIGS.items():
        folder = root / "hub" / f"models--{repo.replace('/', '--')}"
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text(_SNAPSHOT)
        config = json.loads((HERE / "data" / "hf" / name).read_text())
        for snapshot in (_SNAPSHOT, *HF_REVISIONS.get(repo, ())):
            (folder / "snapshots" / snapshot).mkdir(parents=True, exist_ok=True)
            (folder / "snapshots" / snapshot / "config.json").write_text(json.dumps(config))


def import_bridge() -> types.SimpleNamespace:
    """Bridge's config, override and runtime modules, with the two import placeholders (module docstring)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    sys.modules.setdefault("megatron.bridge.peft.lora_layers", _placeholder("megatron.bridge.peft.lora_layers"))
    import megatron.bridge

    recipes = types.ModuleType("megatron.bridge.recipes")
    recipes.__path__ = [str(Path(megatron.bridge.__file__).parent / "recipes")]
    sys.modules.setdefault("megatron.bridge.recipes", recipes)
    from megatron.bridge.models import GPTModelProvider
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge
    from megatron.bridge.models.mla_provider import MLAModelProvider
    from megatron.bridge.recipes.common import _pretrain_common
    from megatron.bridge.training.config import ConfigContainer, runtime_config_update
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    return types.SimpleNamespace(ConfigContainer=ConfigContainer, runtime_config_update=runtime_config_update,
                                 process_config_with_overrides=process_config_with_overrides,
                                 pretrain_common=_pretrain_common, AutoBridge=AutoBridge,
                                 GPTModelProvider=GPTModelProvider, MLAModelProvider=MLAModelProvider)


def _placeholder(name: str) -> types.ModuleType:
    """A module whose every attribute is a distinct empty class (what importers take names from)."""
    module = types.ModuleType(name)

    def attribute(attr: str) -> type:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return type(attr, (), {})

    module.__getattr__ = attribute  # type: ignore[method-assign]
    return module


@contextlib.contextmanager
def te_present(version: str = TE_VERSION) -> Iterator[None]:
    """Transformer Engine `version` as the GPU nodes have it, for what config validation asks (module docstring):
    the `transformer_engine` modules, megatron-core's and Bridge's flags and kernel handles that record whether TE
    imported. Every one is put back on exit."""
    class FusedAdam:  # the signature OptimizerConfig.__post_init__ inspects (TE >= 2.1)
        def __init__(self, params: Any, master_weight_dtype: Any = None, exp_avg_dtype: Any = None,
                     exp_avg_sq_dtype: Any = None, use_decoupled_grad: bool = False) -> None:
            raise RuntimeError("Transformer Engine's FusedAdam is not on this CPU machine")

    te, te_pytorch, te_optimizers = (types.ModuleType(n) for n in (
        "transformer_engine", "transformer_engine.pytorch", "transformer_engine.pytorch.optimizers"))
    te.__version__ = version  # type: ignore[attr-defined]
    te.pytorch = te_pytorch  # type: ignore[attr-defined]
    te_pytorch.optimizers = te_optimizers  # type: ignore[attr-defined]
    te_optimizers.FusedAdam = FusedAdam  # type: ignore[attr-defined]
    patches: list[tuple[str, str, Any]] = [
        ("megatron.core.utils", "_te_version", None),  # recomputed from te.__version__
        ("megatron.bridge.training.comm_overlap", "HAVE_TE", True),  # tp_comm_overlap stays on (comm_overlap.py)
    ]
    # TransformerConfig.__post_init__ refuses moe_permute_fusion / apply_rope_fusion when these handles are None
    patches += [("megatron.core.transformer.moe.moe_utils", name, _te_kernel(name)) for name in (
        "fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
        "fused_sort_chunks_by_index_with_probs", "fused_unpermute")]
    patches += [("megatron.core.models.common.embeddings.rope_utils", name, _te_kernel(name))
                for name in ("fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd")]
    with _patched_modules({m.__name__: m for m in (te, te_pytorch, te_optimizers)}), _patched(patches):
        yield


@contextlib.contextmanager
def gpu_present(name: str, capability: tuple[int, int], memory_bytes: int) -> Iterator[None]:
    """The job's GPU as `torch.cuda.get_device_properties` / `get_device_capability` report it on the node
    (Bridge's flex-dispatcher checks read the name and the compute capability, `flex_dispatcher_backend.py`)."""
    props = types.SimpleNamespace(name=name, major=capability[0], minor=capability[1], total_memory=memory_bytes,
                                  multi_processor_count=132)
    with _patched([("torch.cuda", "get_device_properties", lambda device=None: props),
                   ("torch.cuda", "get_device_capability", lambda device=None: capability)]):
        yield


@contextlib.contextmanager
def _patched_modules(modules: dict[str, types.ModuleType]) -> Iterator[None]:
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


@contextlib.contextmanager
def _patched(patches: list[tuple[str, str, Any]]) -> Iterator[None]:
    saved = []
    for module_name, attr, value in patches:
        module = importlib.import_module(module_name)
        saved.append((module, attr, getattr(module, attr)))
        setattr(module, attr, value)
    try:
        yield
    finally:
        for module, attr, value in reversed(saved):
            setattr(module, attr, value)


def _te_kernel(name: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"Transformer Engine's {name} is not on this CPU machine")
    return kernel


def base_config(bridge: types.SimpleNamespace, case: Case) -> Any:
    """The ConfigContainer the line is applied to: the recipe's, or the template with the model's provider, with
    the fusion Bridge decides by Transformer Engine's presence as on the GPU node (module docstring)."""
    cfg = _base_config(bridge, case)
    cfg.model.gradient_accumulation_fusion = True
    return cfg


def _base_config(bridge: types.SimpleNamespace, case: Case) -> Any:
    if case.recipe is not None:
        module, function = case.recipe.split(":")
        return getattr(importlib.import_module(module), function)()
    cfg = bridge.pretrain_common()
    if case.hf_model is not None:
        cfg.model = bridge.AutoBridge.from_hf_pretrained(case.hf_model).to_megatron_provider(load_weights=False)
    else:
        assert case.provider is not None, "a case names a recipe, a Hugging Face model or the provider's fields"
        cfg.model = provider(bridge, case.provider)
    cfg.tokenizer.tokenizer_type = "NullTokenizer"
    cfg.tokenizer.vocab_size = cfg.model.vocab_size
    return cfg


def provider(bridge: types.SimpleNamespace, fields: dict[str, Any]) -> Any:
    """Bridge's GPT (or MLA) model provider with `fields` (megatron_names.architecture_settings plus the vocabulary,
    sequence and embedding fields; the activation by name)."""
    import torch.nn.functional as F

    fields = dict(fields)
    fields["activation_func"] = {"silu": F.silu, "gelu": F.gelu}[fields["activation_func"]]
    if fields.pop("multi_latent_attention", False):
        return bridge.MLAModelProvider(**fields)
    return bridge.GPTModelProvider(**fields)


# the ConfigContainer attribute each megatron-core setting ends up in after runtime_config_update
_RENAMED = {"check_for_nan_in_loss_and_grad": ("rerun_state_machine", "check_for_nan_in_loss")}
_WHERE = {"micro_batch_size": "train", "global_batch_size": "train", "use_distributed_optimizer": "ddp",
          "grad_reduce_in_fp32": "ddp", "overlap_grad_reduce": "ddp", "overlap_param_gather": "ddp",
          "fp8_param_gather": "ddp", "reuse_grad_buf_for_mxfp8_param_ag": "ddp",
          "use_precision_aware_optimizer": "optimizer", "exp_avg_dtype": "optimizer", "exp_avg_sq_dtype": "optimizer",
          "optimizer": "optimizer",
          "use_megatron_fsdp": "ddp", "data_parallel_sharding_strategy": "ddp", "fsdp_double_buffer": "ddp",
          "ckpt_format": "checkpoint"}


def read_values(cfg: Any, names: list[str]) -> dict[str, Any]:
    """Each megatron-core setting's value in the finished ConfigContainer (`model.<name>` unless `_WHERE` says
    otherwise; dtypes by their short name), plus the dataset's sequence length, the optimizer's copy of
    use_distributed_optimizer, `dist.use_megatron_fsdp` and the CUDA_DEVICE_MAX_CONNECTIONS in effect."""
    out: dict[str, Any] = {}
    for name in names:
        group, attr = _RENAMED.get(name, (_WHERE.get(name, "model"), name))
        out[name] = plain(getattr(getattr(cfg, group), attr, "<missing>"))
    out["dataset.seq_length"] = cfg.dataset.seq_length
    out["dataset.sequence_length"] = cfg.dataset.sequence_length
    out["optimizer.use_distributed_optimizer"] = cfg.optimizer.use_distributed_optimizer
    out["rng.te_rng_tracker"] = cfg.rng.te_rng_tracker
    out["data_parallel_size"] = cfg.data_parallel_size
    out["dist.use_megatron_fsdp"] = cfg.dist.use_megatron_fsdp
    # the value Bridge's validation saw (the recipe's env_vars applied, before `run_case` puts the environment back)
    out["env.CUDA_DEVICE_MAX_CONNECTIONS"] = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    return out


def plain(value: Any) -> Any:
    """A config value as plain data: dtypes and enums by name (`bf16`, `attn`), lists of them too, other objects by
    their text (megatron-core's PipelineParallelLayerLayout prints its string)."""
    import enum

    import torch

    if isinstance(value, torch.dtype):
        return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(value, str(value))
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    return str(value)


def run_case(bridge: types.SimpleNamespace, case: Case, names: list[str]) -> Outcome:
    error, values = None, {}
    environment = dict(os.environ)  # Bridge applies the recipe's env_vars (runtime_config_update): undone below
    try:
        cfg = bridge.process_config_with_overrides(base_config(bridge, case), cli_overrides=list(case.overrides))
        os.environ.update(WORLD_SIZE=str(case.world_size), RANK="0", LOCAL_RANK="0")
        with te_present(), gpu_present(*case.gpu):
            bridge.runtime_config_update(cfg)
        values = read_values(cfg, names)
    except Exception as e:  # noqa: BLE001 - Bridge refusing the line is the outcome under test
        error = _one_line(e)
    os.environ.clear()
    os.environ.update(environment)
    lm_error, lm_values = None, {}
    if case.megatron_lm:
        try:
            lm_values = megatron_lm_namespace(case)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - argparse exits; validate_args asserts
            lm_error = _one_line(e)
    return Outcome(error=error, values=values, lm_error=lm_error, lm_values=lm_values)


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())[:600]}"


def megatron_lm_namespace(case: Case) -> dict[str, Any]:
    """Megatron-LM's own parser (`add_megatron_arguments`, megatron/training/arguments.py of the installed
    megatron-core 0.19.2 wheel, the release branch's) on the arguments, then its `validate_args` as rank 0 of
    the job's world on the job's GPU with Transformer Engine; the namespace's plain values."""
    import argparse

    from megatron.training.arguments import add_megatron_arguments, validate_args

    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    add_megatron_arguments(parser)
    args, unknown = parser.parse_known_args(list(case.megatron_lm))
    if unknown:
        raise ValueError(f"Megatron-LM has no argument(s) {unknown}")
    args.world_size, args.rank = case.world_size, 0
    saved = {k: os.environ.get(k) for k, _ in case.megatron_lm_env}
    os.environ.update(dict(case.megatron_lm_env))
    try:
        with te_present(), gpu_present(*case.gpu), contextlib.redirect_stdout(sys.stderr):
            validate_args(args)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {k: plain(v) for k, v in vars(args).items()}


def main() -> None:
    raw_cases, names = pickle.load(sys.stdin.buffer)
    cases = [Case(**raw) for raw in raw_cases]
    with tempfile.TemporaryDirectory(prefix="hf-") as home:
        hf_cache(Path(home))
        os.environ.update(HF_HOME=home, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        bridge = import_bridge()
        with contextlib.redirect_stdout(sys.stderr):  # Bridge prints; stdout carries the pickle only
            outcomes = [run_case(bridge, case, names) for case in cases]
    sys.stdout.buffer.write(pickle.dumps([dataclasses.asdict(o) for o in outcomes]))


def load(cases: list[Case], names: list[str], timeout: float = 600) -> list[Outcome]:
    """Run the cases through Bridge in a fresh interpreter (this one stays free of Bridge and its placeholders)."""
    import subprocess

    payload = pickle.dumps(([dataclasses.asdict(c) for c in cases], names))  # plain data: the script's classes
    done = subprocess.run([sys.executable, str(Path(__file__))], input=payload,
                          capture_output=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"tests/bridge_harness.py exited {done.returncode}:\n{done.stderr.decode()[-4000:]}")
    return [Outcome(**raw) for raw in pickle.loads(done.stdout)]


if __name__ == "__main__":
    main()

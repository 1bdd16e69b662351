"""The --megatron-core 0.16.1 launch lines against the real parsers of their targets: Megatron-LM core_v0.16.1's
argument parser and Megatron-Bridge v0.3.1's config tree (the 0.19.2 lines: tests/test_launch_bridge.py, which loads
Bridge 0.6.2 and Megatron-LM's 0.19.2 arguments by their own code).

References (tests/data/make_launch_references.py writes both from the real sources and says how):
- `megatron_lm_core_v0.16.1_arguments.json`: every action of Megatron-LM's parser, built by running
  `add_megatron_arguments` of `megatron/training/arguments.py` at core_v0.16.1. Rebuilt here as an argparse
  parser with the same flags, actions, arity, choices and types, the Megatron-LM line must parse with it.
- `megatron_bridge_v0.3.1_config.json`: the dataclass fields of Megatron-Bridge v0.3.1's ConfigContainer groups
  (read from the wheel; megatron-core base classes from the installed 0.16.1). The Bridge line is applied to a tree
  of those fields exactly as Bridge's `parse_hydra_overrides` does (OmegaConf struct mode, Hydra's
  `OverridesParser`, `ConfigLoaderImpl._apply_overrides_to_config`), so an unknown key or bad syntax fails as it
  would in `run_recipe.py`; every value is then checked against its field's annotation.
The slow test downloads the Bridge wheel and builds the precision and overlap objects with Bridge's own code.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import json
import random
import shlex
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import cast

import pytest

from autotune.cost.analytic import AnalyticBackend
from autotune.outputs.launch import (
    COMM_OVERLAP_CLASS,
    MIXED_PRECISION_CLASS,
    bridge_overrides,
    launch_forms,
    megatron_lm_args,
)
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import Layout, parse_layout
from search_spaces.megatron_names import LAYOUT_NAMES, NAMES, TRAINING_NAMES
from search_spaces.megatron_version import LAUNCH_TARGETS
from search_spaces.space import feasible_space
from search_spaces.training import TrainingSpec

DATA = Path(__file__).parent / "data"
LM = json.loads((DATA / "megatron_lm_core_v0.16.1_arguments.json").read_text())
BRIDGE = json.loads((DATA / "megatron_bridge_v0.3.1_config.json").read_text())
LM_ACTIONS = {flag: a for a in LM["actions"] for flag in a["flags"]}
GPT_PROVIDER = "megatron.bridge.models.gpt_provider.GPTModelProvider"
DEEPSEEK_PROVIDER = "megatron.bridge.models.deepseek.deepseek_provider.DeepSeekV3ModelProvider"


# --- the parsers ------------------------------------------------------------------------------------------------
def megatron_lm_parser() -> argparse.ArgumentParser:
    """Megatron-LM's parser rebuilt from its recorded actions (flags, action, nargs, choices, type, default)."""
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    types_ = {"int": int, "float": float, "str": str}
    for a in LM["actions"]:
        kw: dict = {"dest": a["dest"], "default": a["default"]}
        if a["action"] in ("_StoreTrueAction", "_StoreFalseAction"):
            kw["action"] = "store_true" if a["action"] == "_StoreTrueAction" else "store_false"
        elif a["action"] == "BooleanOptionalAction":
            kw["action"] = argparse.BooleanOptionalAction
            p.add_argument(a["flags"][0], **kw)
            continue
        else:
            conv = types_.get(a["type"] or "str", str)
            kw.update(nargs=a["nargs"], type=conv)
            if a["choices"] is not None and conv in (int, str):
                kw["choices"] = [conv(c) for c in a["choices"]]
        p.add_argument(*a["flags"], **kw)
    return p


def parse_megatron_lm(line: str) -> argparse.Namespace:
    args, unknown = megatron_lm_parser().parse_known_args(shlex.split(line))
    assert unknown == [], f"Megatron-LM core_v0.16.1 has no argument {unknown}"
    return args


def _fields(group: str, model_class: str = GPT_PROVIDER) -> dict[str, str]:
    if group == "model":
        return BRIDGE["model_providers"][model_class]["fields"]
    return BRIDGE["groups"][group].get("fields", {})


def apply_bridge(line: str, *, comm_overlap: object, mixed_precision: object,
                 model_class: str = GPT_PROVIDER) -> dict:
    """The line's overrides on a ConfigContainer-shaped tree, as Bridge's `parse_hydra_overrides` applies them."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    tree: dict = {group: {f: None for f in _fields(group, model_class)} for group in BRIDGE["groups"]}
    tree.update(comm_overlap=comm_overlap, mixed_precision=mixed_precision)
    cfg = OmegaConf.create(tree)
    OmegaConf.set_struct(cfg, True)
    parsed = OverridesParser.create().parse_overrides(overrides=shlex.split(line))
    ConfigLoaderImpl._apply_overrides_to_config(overrides=parsed, cfg=cfg)
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def accepts(annotation: str, value: object) -> bool:
    """Whether a value fits a dataclass field annotation (the subset of typing the fields use)."""
    return _accepts(ast.parse(annotation, mode="eval").body, value)


_TORCH_DTYPES = {"torch.float32", "torch.bfloat16", "torch.float16"}


def _accepts(node: ast.expr, value: object) -> bool:
    if isinstance(node, ast.Constant):
        return value is node.value
    if isinstance(node, ast.BinOp):  # X | Y
        return _accepts(node.left, value) or _accepts(node.right, value)
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value)
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Optional":
            return value is None or _accepts(args[0], value)
        if head == "Union":
            return any(_accepts(a, value) for a in args)
        if head == "Literal":
            return value in [a.value for a in args if isinstance(a, ast.Constant)]
        if head in ("List", "list"):
            return isinstance(value, list) and all(_accepts(args[0], v) for v in value)
        return False
    name = ast.unparse(node)
    if name == "torch.dtype":  # Bridge turns "torch.bfloat16" back into the dtype (_apply_overrides)
        if isinstance(value, dict):  # a nested `{_target_: torch.bfloat16, _call_: false}`: the dtype itself
            return value.get("_target_") in _TORCH_DTYPES and value.get("_call_") is False
        return value in _TORCH_DTYPES
    checks = {"bool": lambda v: isinstance(v, bool), "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "str": lambda v: isinstance(v, str), "list": lambda v: isinstance(v, list), "None": lambda v: v is None}
    return checks.get(name, lambda v: False)(value)


def check_bridge_values(line: str, config: dict, model_class: str = GPT_PROVIDER) -> None:
    """Every key the line sets is a field of its group, and its value fits the field's annotation."""
    for item in shlex.split(line):
        key = item.split("=", 1)[0]
        group, _, field = key.partition(".")
        value = config[group] if not field else config[group][field]
        if not field:  # a whole object Bridge instantiates
            fields = BRIDGE["groups"][group]["fields"]
            if value is None:
                continue
            assert value["_target_"] == BRIDGE["groups"][group]["class"]
            for k, v in value.items():
                if k != "_target_":
                    assert k in fields, f"{group}: {BRIDGE['groups'][group]['class']} has no field {k!r}"
                    assert accepts(fields[k], v), f"{group}.{k}={v!r} does not fit {fields[k]}"
            continue
        annotation = _fields(group, model_class)[field]
        assert accepts(annotation, value), f"{key}={value!r} does not fit {annotation}"


# --- the table itself -------------------------------------------------------------------------------------------
def _mcore_fields() -> dict[str, set[str]]:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    return {owner: {f.name for f in dataclasses.fields(cls)} for owner, cls in
            (("transformer", TransformerConfig), ("ddp", DistributedDataParallelConfig),
             ("optimizer", OptimizerConfig))}


LM_TAG = LAUNCH_TARGETS["0.16.1"].megatron_lm
BRIDGE_RELEASE = LAUNCH_TARGETS["0.16.1"].bridge


@pytest.mark.parametrize("core", sorted(NAMES))
def test_core_name_is_a_megatron_core_field(core):
    """The table's names are the installed megatron-core's (0.19.2) fields, or Megatron-LM's own arguments."""
    name = NAMES[core]
    if name.owner == "training":  # no megatron-core field: Megatron-LM's own argument
        assert core in {a["dest"] for a in LM["actions"]}
    else:
        assert core in _mcore_fields()[name.owner], f"megatron-core's {name.owner} config has no {core}"


@pytest.mark.parametrize("core", sorted(NAMES))
def test_megatron_lm_flag_is_defined_with_its_arity(core):
    name = NAMES[core]
    if name.since > "0.16.1":
        return  # a setting 0.16.1 lacks: its lines never carry it
    for flag in (f for f in (name.lm_flag(LM_TAG), name.lm_false) if f is not None):
        action = LM_ACTIONS.get(flag)
        assert action is not None, f"Megatron-LM core_v0.16.1 defines no {flag}"
        if name.kind == "bool":
            # the flag that sets it, or one that clears it (store_false, or a store_true of the opposite meaning)
            allowed = ("_StoreTrueAction",) if flag == name.lm_flag(LM_TAG) else ("_StoreTrueAction",
                                                                                  "_StoreFalseAction")
            assert action["action"] in allowed and action["nargs"] == 0
        elif name.kind == "list":
            assert action["nargs"] in ("+", "*")
        else:
            assert action["action"] == "_StoreAction" and action["nargs"] is None
    on_flag = name.lm_flag(LM_TAG)
    if name.kind == "bool" and on_flag and not name.lm_false:  # a False switch is left out: the default must be off
        assert LM_ACTIONS[on_flag]["default"] is False


@pytest.mark.parametrize("core", sorted(NAMES))
def test_bridge_key_is_a_config_field(core):
    if NAMES[core].since > "0.16.1":
        return  # a setting 0.16.1 lacks: its lines never carry it
    for key in NAMES[core].bridge_keys(BRIDGE_RELEASE):
        group, sep, field = key.partition(":") if ":" in key else key.partition(".")
        assert group in BRIDGE["groups"], f"ConfigContainer has no group {group!r}"
        assert field in _fields(group), f"Bridge v0.3.1 {group} has no field {field!r}"


def test_object_classes_are_the_containers_own():
    assert BRIDGE["groups"]["comm_overlap"]["class"] == COMM_OVERLAP_CLASS
    assert BRIDGE["groups"]["mixed_precision"]["class"] == MIXED_PRECISION_CLASS


def test_every_layout_and_training_field_has_megatron_names():
    layout_fields = {f.name for f in dataclasses.fields(Layout)}
    training_fields = {f.name for f in dataclasses.fields(TrainingSpec)}
    assert layout_fields <= set(LAYOUT_NAMES)
    assert training_fields <= set(TRAINING_NAMES)
    named = {n for names in (*LAYOUT_NAMES.values(), *TRAINING_NAMES.values()) for n in names}
    assert named <= set(NAMES)


def test_dataset_wants_sequence_length_not_seq_length():
    # Bridge's GPTDatasetConfig field is megatron-core's `sequence_length`; `seq_length` is only a property, so
    # the Hydra tree (built from dataclass fields) refuses it in struct mode.
    apply_bridge("dataset.sequence_length=4096", comm_overlap=None, mixed_precision="bf16_mixed")
    with pytest.raises(Exception, match="seq_length"):
        apply_bridge("dataset.seq_length=4096", comm_overlap=None, mixed_precision="bf16_mixed")


# --- the lines of real layouts -----------------------------------------------------------------------------------
def _job(model: str, nodes: int, *, gpu: str = "h100", **training) -> Job:
    seq = {"llama3.1-405b": 8192}.get(model, 4096)
    gbs = {"deepseek-v3": 4096, "llama3.1-405b": 1536}.get(model, 256)
    return Job(model=get_model(model), cluster=build_cluster(nodes=nodes, gpu=gpu),
               training=TrainingSpec(seq_length=seq, global_batch_size=gbs, megatron_core="0.16.1", **training))


class _WithPipelineLayout:
    """A layout with megatron-core's `pipeline_model_parallel_layout` string (the Layout field being added)."""

    def __init__(self, layout: Layout, text: str) -> None:
        self._layout, self.pipeline_layout = layout, text

    def __getattr__(self, name: str) -> object:
        return getattr(self._layout, name)


CASES = {
    "mixtral-vpp-selective": (_job("mixtral", 4),
                              "tp=2,pp=2,vpp=2,ep=8,etp=1,dp=8,sp=true,dist_opt=true,recompute=selective"),
    "mixtral-fp8-blackwell": (_job("mixtral", 4, gpu="b200", precision="fp8"), "tp=1,pp=2,ep=8,dp=16,dist_opt=true"),
    "mixtral-ep-overlap-flex": (_job("mixtral", 4, moe_token_dispatcher="flex"),
                                "tp=1,pp=4,vpp=2,ep=8,dp=8,dist_opt=true,ep_overlap=true"),
    "deepseek-uneven-full": (_job("deepseek-v3", 32, optimizer_moments="bf16", recompute_num_layers=2),
                             "tp=2,pp=16,ep=64,etp=1,first_stage_layers=3,last_stage_layers=2,dp=8,sp=true,"
                             "dist_opt=true,recompute=full"),
    "llama405b-embedding-split-fp8": (_job("llama3.1-405b", 32, precision="fp8", fp8_recipe="delayed"),
                                      "tp=8,pp=8,vpp=2,cp=2,embedding_loss_split=true,dp=2,sp=true,dist_opt=true"),
    "llama8b-no-overlap-graphs": (_job("llama3-8b", 1, overlap_grad_reduce=False, tp_comm_overlap=False,
                                       grad_reduce_in_fp32=True), "tp=2,dp=4,sp=true,cuda_graphs=local"),
}


def _case(name: str) -> tuple[Job, Layout]:
    job, text = CASES[name]
    return job, parse_layout(text, world_size=job.world_size)


def expected_megatron_lm(job: Job, layout) -> dict[str, object]:
    """What Megatron-LM's namespace must hold for this job and layout (each rule written out, not read from the
    table under test)."""
    t, moe = job.training, job.model.moe is not None
    fp8 = t.precision == "fp8"
    recipe = job.fp8_recipe
    # Muon: Megatron-LM runs the layer-wise distributed Muon in place of the distributed optimizer (arguments.py)
    dist_opt = layout.dist_opt and t.optimizer == "adam"
    want: dict[str, object] = {
        "tensor_model_parallel_size": layout.tp, "pipeline_model_parallel_size": layout.pp,
        "context_parallel_size": layout.cp, "micro_batch_size": layout.mbs, "sequence_parallel": layout.sp,
        "use_distributed_optimizer": dist_opt, "seq_length": t.seq_length,
        "global_batch_size": t.global_batch_size, "bf16": True,
        "decoder_first_pipeline_num_layers": layout.first_stage_layers,
        "decoder_last_pipeline_num_layers": layout.last_stage_layers,
        "account_for_embedding_in_pipeline_split": layout.embedding_loss_split,
        "account_for_loss_in_pipeline_split": layout.embedding_loss_split,
        "recompute_granularity": None if layout.recompute == "none" else layout.recompute,
        "overlap_grad_reduce": t.overlap_grad_reduce,
        "overlap_param_gather": t.overlap_param_gather and t.overlap_grad_reduce and dist_opt,
        "tp_comm_overlap": t.tp_comm_overlap and layout.tp > 1 and layout.sp,
        "grad_reduce_in_bf16": not t.grad_reduce_in_fp32,
        "accumulate_allreduce_grads_in_fp32": t.grad_reduce_in_fp32,
        # megatron-core runs the precision-aware optimizer (and so bf16 moments) with the distributed optimizer only
        "use_precision_aware_optimizer": (dist_opt
                                          and (t.precision_aware_optimizer or t.optimizer_moments == "bf16")),
        "exp_avg_dtype": "bf16" if t.optimizer_moments == "bf16" and dist_opt else "fp32",
        "fp8": ({"mxfp8": "e4m3"}.get(recipe or "", "hybrid")) if fp8 else None,
        "fp8_recipe": recipe if fp8 else "delayed",  # Megatron-LM's default when unset
        "fp8_param_gather": fp8 and t.fp8_param_gather and dist_opt,
        # 0.16.1 spells full-iteration graphs as local graphs of the scope ["full_iteration"]
        "cuda_graph_impl": ("local" if layout.cuda_graphs == "full_iteration" and t.megatron_core < "0.17"
                            else layout.cuda_graphs),
        "te_rng_tracker": layout.cuda_graphs != "none",
        "pipeline_model_parallel_layout": getattr(layout, "pipeline_layout", None),
    }
    if getattr(layout, "pipeline_layout", None) is None:
        want["num_virtual_stages_per_pipeline_rank"] = layout.vpp
    if layout.recompute == "full":
        want.update(recompute_method="uniform" if t.recompute_num_layers is None else "block",
                    recompute_num_layers=t.recompute_num_layers or 1)
    if layout.recompute == "selective":
        want["recompute_modules"] = list(t.recompute_modules)
    if moe:
        want.update(expert_model_parallel_size=layout.ep, expert_tensor_parallel_size=layout.expert_tp,
                    moe_token_dispatcher_type=job.moe_dispatcher[0], moe_grouped_gemm=t.moe_grouped_gemm,
                    overlap_moe_expert_parallel_comm=layout.ep_overlap and layout.ep > 1)
    return want


def check_megatron_lm(job: Job, layout) -> None:
    line = launch_forms(job, layout)["megatron_lm"]
    ns = parse_megatron_lm(line)
    for dest, value in expected_megatron_lm(job, layout).items():
        assert getattr(ns, dest) == value, f"--{dest}: {getattr(ns, dest)!r}, the prediction assumes {value!r}"
    # Megatron-LM's cross-argument asserts (validate_args, arguments.py at core_v0.16.1)
    vpp_flags = [ns.num_layers_per_virtual_pipeline_stage, ns.num_virtual_stages_per_pipeline_rank,
                 ns.pipeline_model_parallel_layout]
    assert sum(v is not None for v in vpp_flags) <= 1  # "No more than one of the following arguments ..."
    if ns.overlap_param_gather:
        assert ns.use_distributed_optimizer and ns.overlap_grad_reduce
    if ns.tp_comm_overlap:
        assert ns.sequence_parallel
    if ns.fp8_param_gather:
        assert ns.use_distributed_optimizer
    if job.model.moe is None:
        assert "--expert-model-parallel-size" not in line


def check_bridge(job: Job, layout) -> None:
    line = launch_forms(job, layout)["megatron_bridge"]
    t = job.training
    model_class = DEEPSEEK_PROVIDER if job.model.mla is not None else GPT_PROVIDER
    # a recipe holds its overlap and precision either as objects or as None / a preset name: both must work
    for comm, precision in ((None, "bf16_mixed"), ({f: None for f in _fields("comm_overlap")},
                                                    {f: None for f in _fields("mixed_precision")})):
        cfg = apply_bridge(line, comm_overlap=comm, mixed_precision=precision, model_class=model_class)
        check_bridge_values(line, cfg, model_class)
        m = cfg["model"]
        assert (m["tensor_model_parallel_size"], m["pipeline_model_parallel_size"], m["context_parallel_size"]) == \
            (layout.tp, layout.pp, layout.cp)
        assert m["virtual_pipeline_model_parallel_size"] == layout.vpp
        assert (m["num_layers_in_first_pipeline_stage"], m["num_layers_in_last_pipeline_stage"]) == \
            (layout.first_stage_layers, layout.last_stage_layers)
        assert m["account_for_embedding_in_pipeline_split"] is m["account_for_loss_in_pipeline_split"] is \
            layout.embedding_loss_split
        assert m["pipeline_model_parallel_layout"] == getattr(layout, "pipeline_layout", None)
        assert m["sequence_parallel"] is layout.sp and m["seq_length"] == cfg["dataset"]["sequence_length"]
        assert cfg["train"]["micro_batch_size"] == layout.mbs
        # Muon's dist_opt is its layer-wise optimizer ("dist_muon"), with DDP's distributed optimizer off
        dist_opt = layout.dist_opt and t.optimizer == "adam"
        assert cfg["ddp"]["use_distributed_optimizer"] is cfg["optimizer"]["use_distributed_optimizer"] is dist_opt
        assert m["recompute_granularity"] == (None if layout.recompute == "none" else layout.recompute)
        assert m["cuda_graph_impl"] == ("local" if layout.cuda_graphs == "full_iteration" else layout.cuda_graphs)
        if layout.cuda_graphs == "full_iteration":  # 0.16.1's spelling of full-iteration graphs
            assert m["cuda_graph_scope"] == ["full_iteration"]
        if job.model.moe is not None:
            assert (m["expert_model_parallel_size"], m["moe_token_dispatcher_type"], m["moe_grouped_gemm"]) == \
                (layout.ep, job.moe_dispatcher[0], t.moe_grouped_gemm)
        overlap = cfg["comm_overlap"]
        assert overlap["tp_comm_overlap"] is (t.tp_comm_overlap and layout.tp > 1 and layout.sp)
        assert overlap["overlap_grad_reduce"] is t.overlap_grad_reduce
        assert overlap["overlap_param_gather"] is (t.overlap_param_gather and t.overlap_grad_reduce and dist_opt)
        mp = cfg["mixed_precision"]
        assert mp["bf16"] is True and mp["grad_reduce_in_fp32"] is t.grad_reduce_in_fp32
        assert mp["params_dtype"]["_target_"] == "torch.bfloat16"
        assert mp.get("fp8") == (None if job.fp8_recipe is None else {"mxfp8": "e4m3"}.get(job.fp8_recipe, "hybrid"))
        assert mp.get("fp8_recipe") == job.fp8_recipe


@pytest.mark.parametrize("case", sorted(CASES))
def test_megatron_lm_line_parses_and_carries_the_switches(case):
    check_megatron_lm(*_case(case))


@pytest.mark.parametrize("case", sorted(CASES))
def test_bridge_line_applies_and_carries_the_switches(case):
    check_bridge(*_case(case))


def test_pipeline_layout_string_replaces_the_vpp_flag():
    # DeepSeek-V3's Bridge v0.3.1 layout for PP 16 (recipes/deepseek/deepseek_v3.py): 4 + 14 x 4 + 1 layers
    job, _ = _case("deepseek-uneven-full")
    layout = _WithPipelineLayout(parse_layout("tp=2,pp=16,ep=64,etp=1,dp=8,sp=true,dist_opt=true,recompute=full"),
                                 "Et*4|(t*4|)*14tmL")
    check_megatron_lm(job, layout)
    check_bridge(job, layout)
    args = megatron_lm_args(job, cast(Layout, layout))
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et*4|(t*4|)*14tmL"
    assert 'model.pipeline_model_parallel_layout="Et*4|(t*4|)*14tmL"' in bridge_overrides(job, cast(Layout, layout))


# --- the winners -------------------------------------------------------------------------------------------------
WINNER_JOBS = {"mixtral": ("mixtral", 4), "deepseek-v3": ("deepseek-v3", 64), "llama3.1-405b": ("llama3.1-405b", 32)}


def _winner(job: Job, sample: int) -> Layout:
    """The fastest feasible layout (5% headroom) of a seeded sample of the space."""
    layouts = list(feasible_space(job).layouts())
    layouts = random.Random(0).sample(layouts, min(sample, len(layouts)))
    backend = AnalyticBackend(headroom_bytes=0.05 * job.cluster.gpu.memory_bytes)
    scored = [m for m in (backend.evaluate(job, lay) for lay in layouts) if m.status == "ok"]
    assert scored, "no feasible layout"
    return max(scored, key=lambda m: (m.tokens_per_s_per_gpu or 0.0)).layout


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
@pytest.mark.parametrize("model", sorted(WINNER_JOBS))
def test_sampled_winner_lines_parse(model, precision):
    job = _job(*WINNER_JOBS[model], precision=precision)
    layout = _winner(job, sample=1000)
    check_megatron_lm(job, layout)
    check_bridge(job, layout)


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(WINNER_JOBS))
def test_exhaustive_winner_lines_parse(model):
    # the pick of the whole space, as the analytic search makes it (every layout scored at once), both forms
    from autotune.tuning.analytic_pass import analytic_pass

    job = _job(*WINNER_JOBS[model])
    answer = analytic_pass(job, feasible_space(job), headroom_bytes=0.05 * job.cluster.gpu.memory_bytes)
    assert answer.ranking.pick is not None, "no feasible layout"
    layout = answer.layout(answer.ranking.pick)
    check_megatron_lm(job, layout)
    check_bridge(job, layout)


# --- Bridge's own code ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bridge_wheel(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bridge-wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "download", "megatron-bridge==0.3.1", "--no-deps", "-d",
                           str(folder)], capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"pip download megatron-bridge==0.3.1 failed (this test needs the package index): {done.stderr}")
    return next(folder.glob("megatron_bridge-0.3.1-*.whl"))


def _bridge_modules(wheel: Path, folder: Path) -> dict[str, types.ModuleType]:
    """Bridge's override, instantiation, precision and overlap modules, loaded from the wheel. Importing the package
    needs Transformer Engine, so `megatron.bridge.models` is a stand-in: the two config modules use its classes
    only in annotations."""
    with zipfile.ZipFile(wheel) as z:
        z.extractall(folder)
    root = folder / "megatron" / "bridge"
    for pkg in ("megatron.bridge", "megatron.bridge.training", "megatron.bridge.utils",
                "megatron.bridge.training.utils"):
        module = types.ModuleType(pkg)
        module.__path__ = []
        sys.modules[pkg] = module
    models = types.ModuleType("megatron.bridge.models")
    models.GPTModelProvider = type("GPTModelProvider", (), {})  # type: ignore[attr-defined]
    models.T5ModelProvider = type("T5ModelProvider", (), {})  # type: ignore[attr-defined]
    sys.modules["megatron.bridge.models"] = models
    out = {}
    for name, path in (("megatron.bridge.utils.instantiate_utils", "utils/instantiate_utils.py"),
                       ("megatron.bridge.training.mixed_precision", "training/mixed_precision.py"),
                       ("megatron.bridge.training.comm_overlap", "training/comm_overlap.py"),
                       ("megatron.bridge.training.utils.omegaconf_utils", "training/utils/omegaconf_utils.py")):
        spec = importlib.util.spec_from_file_location(name, root / path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        out[name.rsplit(".", 1)[1]] = module
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", ["mixtral-fp8-blackwell", "llama405b-embedding-split-fp8", "deepseek-uneven-full"])
def test_bridge_builds_the_objects_with_its_own_code(case, bridge_wheel, tmp_path, monkeypatch):
    import torch
    from omegaconf import OmegaConf

    saved = {k: v for k, v in sys.modules.items() if k.startswith("megatron.bridge")}
    try:
        mods = _bridge_modules(bridge_wheel, tmp_path)
        job, layout = _case(case)
        overrides = [o for o in bridge_overrides(job, layout)
                     if o.split("=", 1)[0] in ("comm_overlap", "mixed_precision")]
        for base in ({"comm_overlap": None, "mixed_precision": "bf16_mixed"},
                     {"comm_overlap": {"tp_comm_overlap": False}, "mixed_precision": {"bf16": True}}):
            cfg = mods["omegaconf_utils"].parse_hydra_overrides(OmegaConf.create(base), overrides)
            tree = cast(dict, OmegaConf.to_container(cfg, resolve=True))
            comm = mods["instantiate_utils"].instantiate(tree["comm_overlap"])
            precision = mods["instantiate_utils"].instantiate(tree["mixed_precision"])
            precision.finalize()  # Bridge's own checks (MXFP8 primary weights need the gradient-buffer reuse)
            assert isinstance(comm, mods["comm_overlap"].CommOverlapConfig)
            assert isinstance(precision, mods["mixed_precision"].MixedPrecisionConfig)
            assert precision.params_dtype is torch.bfloat16
            if job.fp8_recipe is None:
                assert precision.fp8 is None
            else:
                assert precision.fp8_recipe == job.fp8_recipe and precision.fp8 in ("hybrid", "e4m3")
            # kept in sync by Bridge; FP8 primary weights only in FP8 with the distributed optimizer
            assert precision.fp8_param is precision.fp8_param_gather is (job.fp8_recipe is not None and layout.dist_opt)
            assert comm.overlap_grad_reduce is job.training.overlap_grad_reduce
    finally:
        for k in [k for k in sys.modules if k.startswith("megatron.bridge")]:
            del sys.modules[k]
        sys.modules.update(saved)

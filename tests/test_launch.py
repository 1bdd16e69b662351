"""Launch forms of a layout: Megatron-Bridge overrides and Megatron-LM arguments (parsers: test_launch_parsers.py)."""

import shlex

import pytest

from autotune.outputs.launch import bridge_overrides, bridge_recipe, launch_forms, launch_header, megatron_lm_args
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import parse_layout
from search_spaces.training import TrainingSpec


def _job(model: str = "mixtral-8x7b", nodes: int = 4, gpu: str = "h100", **training) -> Job:
    return Job(model=get_model(model), cluster=build_cluster(nodes=nodes, gpu=gpu),
               training=TrainingSpec(seq_length=4096, global_batch_size=256, **training))


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_bridge_overrides_name_every_parallel_size():
    layout = parse_layout("tp=2,pp=4,vpp=2,cp=1,ep=8,etp=1,dp=4,mbs=1,sp=true,dist_opt=true,recompute=selective")
    out = bridge_overrides(_job(), layout)
    for item in ("model.tensor_model_parallel_size=2", "model.pipeline_model_parallel_size=4",
                 "model.virtual_pipeline_model_parallel_size=2", "model.context_parallel_size=1",
                 "model.expert_model_parallel_size=8", "model.expert_tensor_parallel_size=1",
                 "model.sequence_parallel=true", "train.micro_batch_size=1", "train.global_batch_size=256",
                 "ddp.use_distributed_optimizer=true", "optimizer.use_distributed_optimizer=true",
                 "model.recompute_granularity=selective", "model.recompute_modules=[core_attn]",
                 "dataset.seq_length=4096", "model.cuda_graph_scope=null"):
        assert item in out


def test_megatron_lm_interleaving_names_the_chunks_per_stage():
    # Megatron-LM sets virtual_pipeline_model_parallel_size = --num-virtual-stages-per-pipeline-rank (arguments.py)
    args = megatron_lm_args(_job(), parse_layout("tp=2,pp=4,vpp=2,ep=8,etp=1,dp=4,sp=true"))
    assert _value(args, "--num-virtual-stages-per-pipeline-rank") == "2"
    assert "--num-layers-per-virtual-pipeline-stage" not in args


@pytest.mark.parametrize("recompute, layers, expected", [
    ("none", None, []),
    ("selective", None, ["--recompute-granularity", "selective", "--recompute-modules", "core_attn"]),
    ("full", None, ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]),
    ("full", 4, ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "4"]),
])
def test_megatron_lm_recompute_flags(recompute, layers, expected):
    layout = parse_layout(f"tp=2,ep=8,dp=16,sp=true,recompute={recompute}")
    args = megatron_lm_args(_job(recompute_num_layers=layers), layout)
    picked = [a for i, a in enumerate(args) if a.startswith("--recompute") or args[i - 1].startswith("--recompute")]
    assert picked == expected


def test_dense_model_has_no_expert_flags():
    args = megatron_lm_args(_job("llama3-8b", 1), parse_layout("tp=2,dp=4,sp=true"))
    assert "--expert-model-parallel-size" not in args and "--moe-grouped-gemm" not in args
    assert "--sequence-parallel" in args


@pytest.mark.parametrize("gpu, recipe, fmt", [("h100", "tensorwise", "hybrid"), ("b200", "mxfp8", "e4m3")])
def test_fp8_takes_the_gpu_default_recipe(gpu, recipe, fmt):
    # Megatron-Bridge's fp8_cs (Hopper) and fp8_mx (Blackwell) recipes; MXFP8 is E4M3 throughout
    job, layout = _job(gpu=gpu, precision="fp8"), parse_layout("tp=2,ep=8,dp=16,sp=true,dist_opt=true")
    args = megatron_lm_args(job, layout)
    assert (_value(args, "--fp8-recipe"), _value(args, "--fp8-format")) == (recipe, fmt)
    assert "--fp8-param-gather" in args
    precision = bridge_overrides(job, layout)[-1]
    assert f"fp8_recipe:{recipe}" in precision and f"fp8:{fmt}" in precision


def test_switches_that_megatron_would_refuse_are_off():
    # no distributed optimizer: no parameter all-gather to overlap, no FP8 primary weights; TP 1: no TP overlap
    args = megatron_lm_args(_job(precision="fp8"), parse_layout("tp=1,ep=8,dp=32"))
    assert "--overlap-grad-reduce" in args
    for flag in ("--overlap-param-gather", "--fp8-param-gather", "--tp-comm-overlap"):
        assert flag not in args


def test_no_vpp_is_null_in_bridge_and_absent_in_megatron_lm():
    forms = launch_forms(_job(), parse_layout("tp=2,pp=2,ep=8,dp=8,sp=true"))
    assert "model.virtual_pipeline_model_parallel_size=null" in forms["megatron_bridge"]
    assert "virtual" not in forms["megatron_lm"]


def test_lines_split_back_into_the_arguments():
    # the shell line is quoted where Hydra's dict syntax or a list needs it; splitting it gives the items back
    job, layout = _job(), parse_layout("tp=2,pp=2,ep=8,dp=8,sp=true,dist_opt=true,recompute=selective")
    forms = launch_forms(job, layout)
    assert shlex.split(forms["megatron_bridge"]) == bridge_overrides(job, layout)
    assert shlex.split(forms["megatron_lm"]) == megatron_lm_args(job, layout)


@pytest.mark.parametrize("model, recipe", [("deepseek-v3", "deepseek_v3_pretrain_config"),
                                           ("llama3.1-405b", "llama31_405b_pretrain_config"), ("mixtral-8x7b", None)])
def test_bridge_v031_recipe_of_catalog_models(model, recipe):
    # the --megatron-core 0.16.1 target (Bridge v0.3.1); 0.6.2's recipes: tests/test_launch_bridge.py
    assert bridge_recipe(model) == recipe
    header = launch_header(_job(model, 32, megatron_core="0.16.1"), "megatron_bridge")
    assert header.startswith("Megatron-Bridge 0.3.1 overrides") and (recipe or "<your recipe>") in header

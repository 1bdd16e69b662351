"""Launch forms of a layout: Megatron-Bridge overrides and Megatron-LM arguments."""

import pytest

from autotune.outputs.launch import bridge_overrides, launch_forms, megatron_lm_args
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import parse_layout
from search_spaces.training import TrainingSpec


def _job(model: str = "mixtral-8x7b", nodes: int = 4, precision: str = "bf16") -> Job:
    return Job(model=get_model(model), cluster=build_cluster(nodes=nodes),
               training=TrainingSpec(seq_length=4096, global_batch_size=256, precision=precision))


def test_bridge_overrides_name_every_parallel_size():
    layout = parse_layout("tp=2,pp=4,vpp=2,cp=1,ep=8,etp=1,dp=4,mbs=1,sp=true,dist_opt=true,recompute=selective")
    out = bridge_overrides(_job(), layout)
    for item in ("model.tensor_model_parallel_size=2", "model.pipeline_model_parallel_size=4",
                 "model.virtual_pipeline_model_parallel_size=2", "model.context_parallel_size=1",
                 "model.expert_model_parallel_size=8", "model.expert_tensor_parallel_size=1",
                 "model.sequence_parallel=true", "train.micro_batch_size=1", "train.global_batch_size=256",
                 "ddp.use_distributed_optimizer=true", "optimizer.use_distributed_optimizer=true",
                 "model.recompute_granularity=selective", "mixed_precision=bf16_mixed"):
        assert item in out


def test_megatron_lm_args_interleaving_is_layers_per_chunk():
    # mixtral has 32 layers: PP 4 x VPP 2 chunks -> 32 / (4*2) = 4 layers per virtual stage
    layout = parse_layout("tp=2,pp=4,vpp=2,ep=8,etp=1,dp=4,sp=true")
    args = megatron_lm_args(_job(), layout)
    i = args.index("--num-layers-per-virtual-pipeline-stage")
    assert args[i + 1] == "4"


@pytest.mark.parametrize("recompute, expected", [
    ("none", []),
    ("selective", ["--recompute-granularity", "selective"]),
    ("full", ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]),
])
def test_megatron_lm_recompute_flags(recompute, expected):
    args = megatron_lm_args(_job(), parse_layout(f"tp=2,ep=8,dp=16,sp=true,recompute={recompute}"))
    tail = args[args.index("--seq-length") + 2:]
    assert [a for a in tail if a != "--bf16"] == expected


def test_dense_model_has_no_expert_flags():
    args = megatron_lm_args(_job("llama3-8b", 1), parse_layout("tp=2,dp=4,sp=true"))
    assert "--expert-model-parallel-size" not in args
    assert "--sequence-parallel" in args


def test_fp8_adds_format_flag_and_bridge_preset():
    job, layout = _job(precision="fp8"), parse_layout("tp=2,ep=8,dp=16,sp=true")
    assert megatron_lm_args(job, layout)[-3:] == ["--bf16", "--fp8-format", "hybrid"]
    assert bridge_overrides(job, layout)[-1] == "mixed_precision=bf16_with_fp8_delayed_scaling_mixed"


def test_no_vpp_is_null_in_bridge_and_absent_in_megatron_lm():
    forms = launch_forms(_job(), parse_layout("tp=2,pp=2,ep=8,dp=8,sp=true"))
    assert "model.virtual_pipeline_model_parallel_size=null" in forms["megatron_bridge"]
    assert "virtual" not in forms["megatron_lm"]

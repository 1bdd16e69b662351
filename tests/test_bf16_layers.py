"""BF16 layers of a low-precision run: megatron-core's `first_last_layers_bf16` edge layers and NVFP4's MTP layers.

megatron-core runs layer `layer_no` (global, 0-based) outside the FP8/FP4 autocast when `layer_no <
num_layers_at_start_in_bf16` or `layer_no >= num_layers - num_layers_at_end_in_bf16` (`fp8_utils.py::
is_first_last_bf16_layer`, `fp4_utils.py::get_fp4_context`), and never quantizes MTP layers to FP4
(`transformer/multi_token_prediction.py`: "currently ignoring FP4 in MTP layers")."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autotune.cost.placement import bf16_chunk_kinds, bf16_stage_layers
from autotune.cost.score import estimate_memory, estimate_memory_per_stage, estimate_time
from autotune.cost.throughput import LAYER_KEYS
from autotune.outputs.launch import bridge_overrides, megatron_lm_args
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import parse_layout
from search_spaces.training import TrainingSpec, training_spec

SUPER = "nemotron-3-super-120b-a12b"


def _job(model: str, gpu: str = "b200", nodes: int = 4, **training: object) -> Job:
    return Job(model=get_model(model), cluster=build_cluster(nodes=nodes, gpu=gpu),
               training=TrainingSpec(**training))  # type: ignore[arg-type]


def test_edge_layers_by_global_index() -> None:
    # a GPT model with 3 leading dense layers of 10: the first layer and the last two in BF16
    assert bf16_chunk_kinds(None, 3, 10, (1, 2), 0, 5) == (1, 0, 0, 0)
    assert bf16_chunk_kinds(None, 3, 10, (1, 2), 5, 5) == (0, 2, 0, 0)
    # overlapping edges count a layer once
    assert bf16_chunk_kinds(None, 0, 4, (3, 3), 0, 4) == (0, 4, 0, 0)
    # a hybrid pattern's symbols are its layers
    assert bf16_chunk_kinds("MEM*MEM-E", 0, 9, (0, 3), 0, 9) == (1, 1, 1, 0)


def test_super_recipe_keeps_its_last_14_pattern_layers_and_mtp_in_bf16() -> None:
    model = get_model(SUPER)
    pattern = model.hybrid_pattern
    assert pattern is not None
    tail = pattern[-14:]
    fp4 = _job(SUPER, precision="fp4", bf16_layers_at_end=14)
    (one,) = bf16_stage_layers(fp4, parse_layout("ep=8", world_size=32))
    assert one == (tail.count("-"), tail.count("E"), tail.count("M"), tail.count("*"), model.mtp_num_layers)
    # PP 2: only the last stage holds them; FP8 keeps the MTP layer in FP8
    fp8 = replace(fp4, training=replace(fp4.training, precision="fp8"))
    first, last = bf16_stage_layers(fp8, parse_layout("pp=2,ep=8", world_size=32))
    assert first == (0, 0, 0, 0, 0) and last[:4] == one[:4] and last[4] == 0


def test_an_fp8_run_with_every_layer_in_bf16_costs_what_the_bf16_run_costs() -> None:
    """All layers out of the autocast: every layer term of the step, and the weights and activations, are the BF16
    run's (FP8 primary weights off, so the DP gathers move bf16 either way)."""
    layers = get_model("llama3-8b").num_layers
    bf16 = _job("llama3-8b", nodes=1, global_batch_size=64)
    fp8 = replace(bf16, training=replace(bf16.training, precision="fp8", fp8_param_gather=False,
                                         bf16_layers_at_start=layers))
    layout = parse_layout("tp=2,pp=2,dp=2,mbs=1,sp=true,dist_opt=true,recompute=selective", world_size=8)
    a, b = estimate_time(fp8, layout), estimate_time(bf16, layout)
    for key in LAYER_KEYS:
        assert math.isclose(a.breakdown[key], b.breakdown[key], rel_tol=1e-9, abs_tol=1e-12), key
    assert estimate_time(replace(fp8, training=replace(fp8.training, bf16_layers_at_start=0)), layout).step_time_s \
        < a.step_time_s
    ma, mb = estimate_memory(fp8, layout), estimate_memory(bf16, layout)
    assert math.isclose(ma.weights_bytes, mb.weights_bytes, rel_tol=1e-12)
    # the transient buffers stay the FP8 run's; the saved tensors are the BF16 run's
    saved_a = dict(ma.activation_terms)
    for name, value in mb.activation_terms:
        if not name.startswith(("transient", "workspace")):
            assert math.isclose(saved_a.get(name, 0.0), value, rel_tol=1e-9, abs_tol=1.0), name


def test_edge_layers_slow_the_stage_that_holds_them_and_grow_its_memory() -> None:
    job = _job("llama3-70b", precision="fp8")
    edged = replace(job, training=replace(job.training, bf16_layers_at_end=4))
    layout = parse_layout("tp=4,pp=4,dp=2,mbs=1,sp=true,dist_opt=true,recompute=selective", world_size=32)
    plain, edge = estimate_memory_per_stage(job, layout), estimate_memory_per_stage(edged, layout)
    assert [round(e.total_bytes) for e in edge[:3]] == [round(e.total_bytes) for e in plain[:3]]
    # the last stage keeps bf16 GEMM inputs and no FP8 weight copies of its 4 BF16 layers
    assert edge[3].activations_bytes > plain[3].activations_bytes
    assert edge[3].weights_bytes < plain[3].weights_bytes
    assert estimate_time(edged, layout).step_time_s > estimate_time(job, layout).step_time_s


def test_launch_lines_carry_the_bf16_layers() -> None:
    job = _job(SUPER, gpu="gb200", nodes=16, precision="fp4", bf16_layers_at_end=14, global_batch_size=512)
    layout = parse_layout("tp=2,ep=64,dp=32,mbs=1,sp=true,dist_opt=true", world_size=64)
    args = megatron_lm_args(job, layout)
    assert "--first-last-layers-bf16" in args
    assert args[args.index("--num-layers-at-start-in-bf16") + 1] == "0"
    assert args[args.index("--num-layers-at-end-in-bf16") + 1] == "14"
    mixed = next(o for o in bridge_overrides(job, layout) if o.startswith("mixed_precision={"))
    assert "first_last_layers_bf16:true" in mixed and "num_layers_at_end_in_bf16:14" in mixed
    plain = replace(job, training=replace(job.training, bf16_layers_at_end=0))
    assert "--first-last-layers-bf16" not in megatron_lm_args(plain, layout)
    assert "first_last_layers_bf16" not in " ".join(bridge_overrides(plain, layout))


@pytest.mark.parametrize(("values", "message"), [
    (dict(bf16_layers_at_end=2), "this run is bf16 already"),
    (dict(precision="fp8", fp8_recipe="delayed", bf16_layers_at_start=1),
     "Delayed scaling does not support first / last layer in BF16."),
    (dict(precision="fp4", bf16_layers_at_end=-1), "bf16_layers_at_end >= 0"),
])
def test_bad_bf16_layers_are_refused(values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        training_spec(**values)

"""The Muon optimizer (`--optimizer muon`, `autotune.cost.muon`): its weights, state, step, rules, launch lines, and
NVIDIA's published Kimi-K2 runs, which train with it."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.cost.efficiency import DEFAULT_CALIBRATION, gemm_cost
from autotune.cost.memory import DEFAULT_ASSUMPTIONS
from autotune.cost.muon import (
    ADAM_STATE_BYTES,
    MUON_STATE_BYTES,
    NS_STEPS,
    group_items,
    layer_matrices,
    muon_params,
    ping_pong,
    rank_shares,
    stage_matrices,
    step_s,
)
from autotune.cost.placement import layer_gemm_params_per_gpu, stage_params
from autotune.cost.score import estimate_memory, estimate_time
from autotune.cost.throughput import dp_comm_s, optimizer_step_s
from autotune.outputs.launch import bridge_overrides, megatron_lm_args
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import parse_layout
from search_spaces.megatron_names import megatron_settings
from search_spaces.rules import check
from search_spaces.space import DIMENSIONS, SpaceOptions, feasible_space
from search_spaces.training import training_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _job(model: str, nodes: int, gpu: str = "h100", **training: object) -> Job:
    return Job(model=get_model(model), cluster=build_cluster(nodes=nodes, gpu=gpu),
               training=training_spec(**training))


# --- which weights are Muon's: the 2-D weights placement counts, plus the router ------------------------------------
@pytest.mark.parametrize(("model", "tp", "ep", "etp"), [
    ("llama3-8b", 1, 1, 1), ("llama3-70b", 4, 1, 4), ("mixtral-8x7b", 2, 8, 1), ("deepseek-v3", 2, 64, 1),
    ("kimi-k2", 1, 64, 1), ("qwen3-30b-a3b", 4, 8, 2), ("gpt-oss-120b", 1, 8, 1)])
def test_matrices_are_the_gemm_weights_placement_counts(model, tp, ep, etp):
    m = get_model(model)
    per = layer_matrices(m, tp, ep, etp)
    dense_layer, moe_layer, *_ = layer_gemm_params_per_gpu(m, tp, ep, etp)
    assert muon_params(list(per["dense"])) == dense_layer
    if m.moe is not None:
        router = m.moe.num_experts * m.hidden_size  # 2-D, so Muon's, though no GEMM of placement's
        assert muon_params(list(per["moe"]) + list(per["experts"])) == moe_layer + router


def test_kimi_k2_expert_matrices_written_out():
    # Kimi-K2 at EP 64: 6 local experts of fc1 (2 x 2048) x 7168 (SwiGLU) and fc2 7168 x 2048
    per = layer_matrices(get_model("kimi-k2"), 1, 64, 1)
    assert per["experts"] == ((4096, 7168, 6), (7168, 2048, 6))


# --- state: megatron-core's layer-wise shares, the busiest rank's ---------------------------------------------------
def test_ping_pong_is_megatron_cores_own_assignment():
    # megatron-core 0.19.2's `LayerWiseDistributedOptimizer._shard_params_ping_pong` itself, on Kimi-K2's first
    # stage at DP 64 (its dense group: the embedding whole, each Muon matrix whole), in a child interpreter
    import json
    import subprocess

    job = _job("kimi-k2", 64, gpu="gb300", optimizer="muon", seq_length=4096, global_batch_size=4096)
    layout = parse_layout("tp=1,pp=4,ep=64,etp=1,first_stage_layers=16,last_stage_layers=15,dp=64,dist_opt=true",
                          world_size=256)
    stage = stage_params(job.model, layout)[0]
    (items, _, size), _ = group_items(job.model, stage, layout)
    numels = [numel for numel, _ in items]
    script = (
        "import json, sys, types, torch\n"
        "from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer as L\n"
        "numels, size = json.load(sys.stdin)\n"
        "params = [torch.empty(n, device='meta') for n in numels]\n"
        "me = types.SimpleNamespace(expt_dp=None, dp_cp=None)\n"
        "L._shard_params_ping_pong(me, [types.SimpleNamespace(param_groups=[{'params': params}])], size, 1)\n"
        "where = {id(p): r for r, ps in enumerate(me.dp_cp_params_list) for p in ps}\n"
        "print(json.dumps([where[id(p)] for p in params]))\n")
    out = subprocess.run([sys.executable, "-c", script], input=json.dumps([numels, size]), capture_output=True,
                         text=True, timeout=600, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ping_pong(numels, size)
    assert size == 64 and max(numels) == get_model("kimi-k2").vocab_size * 7168  # the embedding, whole


def test_state_is_the_busiest_ranks_8_bytes_per_muon_weight_and_12_per_adam_one():
    job = _job("llama3-8b", 1, optimizer="muon")
    adam = replace(job, training=replace(job.training, optimizer="adam"))
    for text in ("tp=1,dp=8,dist_opt=true", "tp=2,sp=true,dp=4,dist_opt=false"):
        layout = parse_layout(text, world_size=8)
        (stage,) = stage_params(job.model, layout)
        dense, expert = rank_shares(job.model, stage, layout)
        assert expert == ((),) or all(s.muon == 0 and s.adam == 0 for s in expert)
        # the shares partition the GPU's parameters, and every rank's all-gather receives the others'
        assert sum(s.muon + s.adam for s in dense) == pytest.approx(stage.dense_params_per_gpu, rel=1e-12)
        assert all(s.others == pytest.approx(stage.dense_params_per_gpu - s.muon - s.adam) for s in dense)
        busiest = max(MUON_STATE_BYTES * s.muon + ADAM_STATE_BYTES * s.adam for s in dense)
        got = estimate_memory(job, layout, DEFAULT_ASSUMPTIONS).optimizer_bytes
        assert got == pytest.approx(busiest, rel=1e-12)
        if not layout.dist_opt:  # one rank: every Muon weight at 8 B, the rest at Adam's 12
            muon = muon_params(stage_matrices(job.model, stage, layout)[0])
            assert got == pytest.approx(8.0 * muon + 12.0 * (stage.dense_params_per_gpu - muon), rel=1e-12)
        else:  # the rank with the word embedding (525M elements, Adam's) is the busiest: uneven, unlike ZeRO-1
            assert got > 1.5 * (MUON_STATE_BYTES * muon_params(stage_matrices(job.model, stage, layout)[0])
                                + 12.0 * 2 * 128256 * 4096) / 8
        assert estimate_memory(adam, layout, DEFAULT_ASSUMPTIONS).optimizer_bytes == pytest.approx(
            12.0 * stage.dense_params_per_gpu / (8 if layout.dist_opt else 1), rel=1e-12)


# --- the step: Newton-Schulz GEMMs and all-reduced gradients ----------------------------------------------------------
def test_newton_schulz_time_is_five_iterations_of_three_gemms_per_matrix():
    # Kimi-K2's second stage at EP 64, expert-DP 1: one rank updates all 15 layers x 6 experts of its own
    job = _job("kimi-k2", 64, gpu="gb300", optimizer="muon", seq_length=4096, global_batch_size=4096)
    layout = parse_layout("tp=1,pp=4,ep=64,etp=1,first_stage_layers=16,last_stage_layers=15,dp=64,dist_opt=true",
                          world_size=256)
    stage = stage_params(job.model, layout)[1]
    assert layout.expert_dp == 1 and stage.moe_layers == 15
    cal = DEFAULT_CALIBRATION.for_release(job.training.release)
    g = gemm_cost(job.cluster.gpu, "bf16", None, cal)

    def ns(r: int, c: int) -> float:
        m, k = min(r, c), max(r, c)
        return NS_STEPS * (g.time_s(m, m, k) + g.time_s(m, m, m) + g.time_s(m, k, m))

    experts = 15 * 6 * (ns(4096, 7168) + ns(7168, 2048))
    dense, _ = rank_shares(job.model, stage, layout)
    busiest_dense = max(sum(ns(r, c) for r, c in s.matrices) for s in dense)
    assert 0 < busiest_dense < experts
    assert step_s(job, layout, stage, cal, 0.0, 0.0) == pytest.approx(experts + busiest_dense, rel=1e-12)


def test_muon_all_reduces_gradients_and_still_gathers_the_weights():
    # FP8 on Hopper: Adam's distributed optimizer gathers FP8 primary weights, Muon's layer-wise one bf16 weights
    job = _job("mixtral-8x7b", 4, optimizer="muon", precision="fp8")
    adam = replace(job, training=replace(job.training, optimizer="adam"))
    layout = parse_layout("tp=2,sp=true,ep=8,etp=1,dp=16,dist_opt=true", world_size=32)
    (stage,) = stage_params(job.model, layout)
    grads, gather, _ = dp_comm_s(job, layout, DEFAULT_CALIBRATION, stage)
    grads_adam, gather_adam, _ = dp_comm_s(adam, layout, DEFAULT_CALIBRATION, stage)
    assert grads == pytest.approx(2 * grads_adam)  # all-reduced, not reduce-scattered
    bf16_weights = replace(adam, training=replace(adam.training, fp8_param_gather=False))
    assert gather > gather_adam and gather == pytest.approx(dp_comm_s(bf16_weights, layout, DEFAULT_CALIBRATION,
                                                                      stage)[1])  # 2 B per weight, not 1
    assert optimizer_step_s(job, layout, DEFAULT_CALIBRATION, stage) > optimizer_step_s(adam, layout,
                                                                                       DEFAULT_CALIBRATION, stage)


# --- rules and the space ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("version", "words"), [
    ("0.19", "Emerging optimizer does not support Megatron-FSDP for now."),
    ("0.16.1", "muon with dist optimizer is not supported.")])
def test_muon_with_megatron_fsdp_is_refused_in_each_releases_words(version, words):
    job = _job("llama3-8b", 1, optimizer="muon", megatron_core=version)
    (v,) = [v for v in check(job, parse_layout("dp=8,dist_opt=true,fsdp=true", world_size=8))]
    assert v.rule == "muon_no_fsdp" and v.message.startswith(words)
    fsdp = DIMENSIONS.index("fsdp")  # the space never offers the layouts (Adam's does)
    assert not any(shape[fsdp] for shape in feasible_space(job, SpaceOptions(max_tp=2)).shapes)
    adam = replace(job, training=replace(job.training, optimizer="adam"))
    assert any(shape[fsdp] for shape in feasible_space(adam, SpaceOptions(max_tp=2)).shapes)


def test_a_hybrid_model_with_muon_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="Muon step of a hybrid Mamba model"):
        _job("nemotron-3-nano-30b-a3b", 1, optimizer="muon")


# --- launch lines -----------------------------------------------------------------------------------------------------
def test_launch_lines_run_the_layer_wise_muon_without_the_distributed_optimizer():
    job = _job("qwen3-30b-a3b", 2, gpu="b200", optimizer="muon", precision="fp8")
    layout = parse_layout("ep=8,etp=1,dp=16,mbs=1,dist_opt=true", world_size=16)
    lm = megatron_lm_args(job, layout)
    assert lm[lm.index("--optimizer") + 1] == "dist_muon"
    for flag in ("--use-distributed-optimizer", "--overlap-param-gather", "--fp8-param-gather",
                 "--use-precision-aware-optimizer"):
        assert flag not in lm
    bridge = bridge_overrides(job, layout)
    for key in ("optimizer.optimizer=dist_muon", "ddp.use_distributed_optimizer=false",
                "optimizer.use_distributed_optimizer=false", "ddp.overlap_param_gather=false"):
        assert key in bridge
    plain = parse_layout("ep=8,etp=1,dp=16,mbs=1,dist_opt=false", world_size=16)
    assert "optimizer.optimizer=muon" in bridge_overrides(job, plain)


@pytest.fixture(scope="module")
def outcomes():
    from test_launch_bridge import case_of

    from search_spaces.megatron_names import NAMES

    from bridge_harness import load

    cases = [(_job("qwen3-30b-a3b", 2, optimizer="muon"), "tp=1,ep=8,dp=16,dist_opt=true"),
             (_job("llama3-8b", 1, optimizer="muon"), "tp=2,sp=true,dp=4,dist_opt=false")]
    jobs = [(job, parse_layout(text, world_size=job.world_size)) for job, text in cases]
    return jobs, load([case_of(job, layout) for job, layout in jobs], sorted(NAMES))


def test_bridge_and_megatron_lm_take_the_muon_lines(outcomes):
    from test_launch_bridge import bridge_mismatches, megatron_lm_mismatches

    for (job, layout), outcome in zip(*outcomes, strict=True):
        assert bridge_mismatches(job, layout, outcome) == []
        assert megatron_lm_mismatches(job, layout, outcome) == []
        assert outcome.values["optimizer"] == ("dist_muon" if layout.dist_opt else "muon")
        # Megatron-LM 0.19 turns the deprecated name into muon with its layer-wise distributed optimizer
        assert outcome.lm_values["optimizer"] == "muon"
        assert outcome.lm_values["use_layer_wise_distributed_optimizer"] is layout.dist_opt
        assert outcome.lm_values["use_distributed_optimizer"] is False


# --- NVIDIA's Kimi-K2 runs (GB300, held out: never fitted) -----------------------------------------------------------
def test_kimi_k2_rows_are_scored_with_muon_fit_and_are_predicted_within_10_percent():
    from bench.recipe_rows import load_recipe_rows

    rows = [r for r in load_recipe_rows() if r.model == "Kimi_K2"]
    assert len(rows) == 4 and all(not r.skip and r.held_out for r in rows)
    for r in rows:
        assert r.job is not None and r.layout is not None and r.published is not None
        assert r.job.training.muon and r.layout.dist_opt  # "dist_muon"
        memory = estimate_memory(r.job, r.layout, DEFAULT_ASSUMPTIONS)
        assert memory.fits(r.job.cluster.gpu.memory_bytes)
        adam = replace(r.job, training=replace(r.job.training, optimizer="adam"))
        # the experts' state is not sharded (expert-DP 1): Muon keeps 8 B of their 12 under Adam (16 GB saved), but
        # the rank that holds the word embedding whole keeps its Adam state (14 GB) where ZeRO-1 spreads it
        assert memory.optimizer_bytes < estimate_memory(adam, r.layout, DEFAULT_ASSUMPTIONS).optimizer_bytes
        # measured 2026-12-04 (bench/bench_throughput.py): -0.7%, -6.5%, -3.8%, -0.5%
        predicted = estimate_time(r.job, r.layout, DEFAULT_CALIBRATION).tokens_per_s_per_gpu
        assert predicted == pytest.approx(r.published, rel=0.10), r.release


def test_the_0_16_1_target_lines_take_dist_muon():
    # Megatron-LM core_v0.16.1's recorded parser and Bridge v0.3.1's recorded config fields
    # (tests/test_launch_parsers.py): --optimizer dist_muon parses, and Bridge's optimizer.optimizer is a field
    from autotune.outputs.launch import launch_forms

    from test_launch_parsers import _job as job_0161
    from test_launch_parsers import check_bridge, check_megatron_lm, parse_megatron_lm

    job = job_0161("qwen3-30b-a3b", 2, optimizer="muon")
    layout = parse_layout("tp=1,ep=8,etp=1,dp=16,dist_opt=true", world_size=16)
    check_megatron_lm(job, layout)
    check_bridge(job, layout)
    assert parse_megatron_lm(launch_forms(job, layout)["megatron_lm"]).optimizer == "dist_muon"


@pytest.mark.parametrize("argv", [
    ["--model", "llama3-8b", "--nodes", "1", "--optimizer", "muon", "--backend", "megatron"],
    ["estimate", "--model", "nemotron-3-nano", "--nodes", "1", "--optimizer", "muon", "--layout", "ep=8,etp=1"]])
def test_what_autotune_cannot_run_with_muon_is_one_line_and_exit_2(capsys, argv):
    from autotune.ui.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--optimizer muon" in err and "Traceback" not in err


def test_json_layouts_say_what_megatron_runs_for_muon(capsys):
    """The --json layout objects (estimate, check, best.json, trials) carry the optimizer's megatron settings: with
    dist_opt Muon is "dist_muon" with `use_distributed_optimizer` off, as the launch lines set it; Adam's layout is
    the layout's own."""
    import json

    from autotune.ui.cli import main

    layout = parse_layout("ep=8,etp=1,dp=16,mbs=1,dist_opt=true", world_size=16)
    muon = _job("qwen3-30b-a3b", 2, gpu="b200", optimizer="muon").training
    adam = _job("qwen3-30b-a3b", 2, gpu="b200").training
    settings = megatron_settings(layout)
    assert settings["use_distributed_optimizer"] is True and "optimizer" not in settings
    assert megatron_settings(layout, adam) == megatron_settings(layout)
    settings = megatron_settings(layout, muon)
    assert settings["use_distributed_optimizer"] is False and settings["optimizer"] == "dist_muon"
    plain = parse_layout("ep=8,etp=1,dp=16,mbs=1,dist_opt=false", world_size=16)
    assert megatron_settings(plain, muon)["optimizer"] == "muon"
    argv = ["--model", "qwen3-30b-a3b", "--nodes", "2", "--gpu", "b200", "--optimizer", "muon", "--json",
            "--layout", "tp=1,ep=8,etp=1,mbs=1,dist_opt=true"]
    for command in ("estimate", "check"):
        assert main([command, *argv]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["layout"]["use_distributed_optimizer"] is False and out["layout"]["optimizer"] == "dist_muon"

"""Real megatron-core jobs on CPU (gloo) through MegatronBackend: one Ray session and one kept-alive group
of 4 workers for the whole module, each layout a trial on it. Checks finite losses and the group sizes
megatron-core formed; failures come back as outcomes, and the workers survive a rejection."""

from __future__ import annotations

import math
import os

import pytest

from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import parse_layout
from search_spaces.training import TrainingSpec

pytestmark = pytest.mark.slow

WORLD = 4


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory):
    import ray

    from trainers.backend import MegatronBackend, ensure_ray
    from trainers.worker_pool import shutdown_pool

    tmp = tmp_path_factory.mktemp("ray")
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "TMPDIR")}
    os.environ.update(RAY_AUTH_MODE="disabled", TMPDIR=str(tmp))  # no ~/.ray/auth_token; torch/Ray temp files here
    started = not ray.is_initialized()
    ensure_ray(str(tmp), num_cpus=2)
    from autotune.tuning.measured import Predicted

    yield Predicted(MegatronBackend(precision="fp32", warmup_steps=1, timed_steps=1))
    shutdown_pool()
    if started:
        ray.shutdown()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _job(model: str) -> Job:
    cluster = build_cluster(nodes=1, gpus_per_node=WORLD)
    return Job(model=get_model(model), cluster=cluster, training=TrainingSpec(seq_length=4096, global_batch_size=64))


def _evaluate(backend, model: str, text: str):
    return backend.evaluate(_job(model), parse_layout(text, world_size=WORLD))


@pytest.mark.parametrize(
    ("model", "text", "groups"),
    [
        ("tiny-gpt", "tp=2,pp=2", {"tp": 2, "pp": 2, "dp": 1}),
        ("tiny-gpt", "tp=2,sp=true", {"tp": 2, "dp": 2}),  # 4 / 2 = dp 2
        ("tiny-gpt", "pp=2,vpp=2,dist_opt=true", {"pp": 2, "vpp": 2, "dp": 2}),
        ("tiny-moe", "tp=2,ep=2,etp=1,sp=true", {"tp": 2, "ep": 2, "etp": 1, "expert_dp": 2}),  # 2*2/(2*1) = 2
        ("tiny-moe", "tp=2,ep=2,sp=true", {"etp": 2, "expert_dp": 1}),  # ETP = TP: uneven token gathers over TP
        ("tiny-gpt", "tp=2,cp=2", {"tp": 2, "cp": 2, "dp": 1}),
        ("tiny-gpt", "pp=2,embedding_loss_split=true", {"pp": 2, "dp": 2}),  # uneven split, megatron's own
        ("tiny-mla", "tp=2,ep=2,sp=true", {"tp": 2, "ep": 2}),  # 2 layers after 1-layer jobs: no stale MoE state
    ],
)
def test_layout_trains_with_finite_losses_and_the_layouts_groups(backend, model: str, text: str, groups: dict) -> None:
    m = _evaluate(backend, model, text)
    assert m.status == "ok", m.reason
    assert m.source == "megatron-cpu-proxy"
    assert all(math.isfinite(x) for x in m.extra["losses"])
    assert {k: m.extra["groups"][k] for k in groups} == groups
    assert m.step_time_s > 0 and m.tokens_per_s_per_gpu > 0
    # what the proxy measured (memory_bytes / memory are the real model's, corrected by it: tuning/measured.py)
    assert set(m.extra["measured_memory"]) == {"weights", "gradients", "optimizer", "activations"}
    assert m.extra["analytic_prediction"]["status"] in ("ok", "oom", "invalid")  # shown beside the measurement


def test_context_parallel_attention_matches_the_unsplit_sequence(backend) -> None:
    # step-0 loss is on DP rank 0's tokens before any update; CP=2 splits the same sequence in zig-zag halves
    cp = _evaluate(backend, "tiny-gpt", "tp=2,cp=2")
    plain = _evaluate(backend, "tiny-gpt", "tp=2,dp=2")
    assert cp.status == plain.status == "ok"
    assert cp.extra["losses"][0] == pytest.approx(plain.extra["losses"][0], rel=1e-5)


def test_distributed_optimizer_divides_optimizer_state_by_dp(backend) -> None:
    # fp32 Adam keeps exp_avg + exp_avg_sq = 8 B/param; sharded over DP=2 -> 4 B/param (+ padding)
    plain = _evaluate(backend, "tiny-gpt", "pp=2,dp=2")
    sharded = _evaluate(backend, "tiny-gpt", "pp=2,dp=2,dist_opt=true")
    plain, sharded = plain.extra["measured_memory"], sharded.extra["measured_memory"]  # the proxy's own figures
    assert plain["weights"] == sharded["weights"]
    assert sharded["optimizer"] == pytest.approx(plain["optimizer"] / 2, rel=0.02)


def test_megatron_rejection_is_an_outcome_and_the_workers_survive(backend) -> None:
    rejected = _evaluate(backend, "tiny-moe", "tp=2,ep=2")  # MoE + TP needs SP (moe_layer.py)
    assert rejected.status == "invalid"
    assert "sequence parallelism" in rejected.reason
    after = _evaluate(backend, "tiny-gpt", "tp=2,pp=2")
    assert after.status == "ok" and after.extra["fresh_workers"] is False


def test_smoke_verb_prints_the_groups_and_passes(backend, capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.ui.cli import main

    code = main(["smoke", "--layout", "tp=2,pp=2,sp=true", "--iterations", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "TP=2 PP=2 DP=1" in out and "step 3: loss" in out


def _tiny_job_config(fault: str):
    from trainers.megatron_job import JobConfig
    from trainers.proxy import plan_proxy

    plan = plan_proxy(get_model("tiny-gpt"), parse_layout("tp=2,pp=2"), TrainingSpec(), max_workers=WORLD)
    return JobConfig(model=plan.model, layout=plan.layout, seq_length=plan.training.seq_length,
                     num_microbatches=plan.num_microbatches, precision="fp32", timed_steps=1, fault=fault)


@pytest.mark.parametrize(("fault", "status"), [("crash", "failed"), ("hang", "timeout")])
def test_crash_and_hang_are_outcomes_and_the_next_trial_gets_fresh_workers(backend, fault: str, status: str) -> None:
    from trainers.worker_pool import run_pooled

    out = run_pooled(_tiny_job_config(fault), world_size=WORLD, use_gpu=False, timeout_s=15)
    assert out.status == status, out.reason
    after = _evaluate(backend, "tiny-gpt", "tp=2,pp=2")
    assert after.status == "ok" and after.extra["fresh_workers"] is True

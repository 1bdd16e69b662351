"""Real megatron-core jobs on CPU (gloo) through MegatronBackend: one Ray session and one kept-alive group
of 4 workers for the whole module, each layout a trial on it. Checks finite losses and the group sizes
megatron-core formed; failures come back as outcomes, and the workers survive a rejection."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

import pytest

from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import parse_layout
from search_spaces.training import TrainingSpec

if TYPE_CHECKING:
    from trainers.megatron_job import Fault

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


def _tiny_job_config(fault: Fault):
    from trainers.megatron_job import JobConfig
    from trainers.proxy import plan_proxy

    plan = plan_proxy(get_model("tiny-gpt"), parse_layout("tp=2,pp=2"), TrainingSpec(), max_workers=WORLD)
    return JobConfig(model=plan.model, layout=plan.layout, seq_length=plan.training.seq_length,
                     num_microbatches=plan.num_microbatches, precision="fp32", timed_steps=1, fault=fault)


# a rank's own error or hang is the layout's failure, which the search does not retry
@pytest.mark.parametrize(("fault", "status"), [("crash", "failed"), ("hang", "timeout")])
def test_crash_and_hang_are_outcomes_and_the_next_trial_gets_fresh_workers(backend, fault: Fault,
                                                                           status: str) -> None:
    from trainers.worker_pool import run_pooled

    out = run_pooled(_tiny_job_config(fault), world_size=WORLD, use_gpu=False, timeout_s=15)
    assert (out.status, out.failure) == (status, "layout"), out.reason
    after = _evaluate(backend, "tiny-gpt", "tp=2,pp=2")
    assert after.status == "ok" and after.extra["fresh_workers"] is True


def test_a_worker_process_that_ends_is_the_infrastructures_failure(backend) -> None:
    """Rank 0's process ends mid-step as a SIGKILL or a lost node ends it: Ray says the actor died, the other ranks
    lose their peer; the trial is the infrastructure's failure (the search retries it) and the group is dropped, as
    after a crash (above: the next trial gets fresh workers; nothing later in this module needs the pool)."""
    from trainers.worker_pool import pool_stats, run_pooled

    out = run_pooled(_tiny_job_config("exit"), world_size=WORLD, use_gpu=False, timeout_s=15)
    assert (out.status, out.failure) == ("failed", "infrastructure"), out.reason
    assert out.reason.startswith("rank 0's worker on node ") and " died: " in out.reason, out.reason
    assert len(out.nodes) == WORLD
    assert pool_stats()["workers"] == []  # the group is gone, its processes with it


def test_each_job_destroys_the_previous_jobs_process_groups() -> None:
    # megatron-core's destroy_model_parallel only forgets its groups (0.19.2: parallel_state.py:2506-2692 sets them
    # to None; it destroys only the gloo DP groups, which create_gloo_process_groups=False never makes); a reused
    # worker must destroy them, or every job adds its TP/PP/DP/CP/EP/... groups (gloo threads, NCCL communicators on
    # a GPU) to the ones before
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.distributed import distributed_c10d as c10d

    from trainers.cpu_patches import apply_cpu_patches, cpu_device_mode
    from trainers.megatron_job import destroy_job_groups, init_parallel_state

    assert not dist.is_initialized()
    apply_cpu_patches()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        layout = parse_layout("tp=1", world_size=1)
        with cpu_device_mode():
            init_parallel_state(layout)
            after_first = len(c10d._world.pg_map)
            assert after_first > 1  # the world group and megatron's groups
            for _ in range(3):
                init_parallel_state(layout)
                assert len(c10d._world.pg_map) == after_first
        parallel_state.destroy_model_parallel()
        assert len(c10d._world.pg_map) == after_first  # why destroy_job_groups exists: megatron-core leaves them
        assert destroy_job_groups() == after_first - 1
        assert len(c10d._world.pg_map) == 1
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


@pytest.mark.parametrize(("text", "cp"), [("tp=2,cp=2", 2), ("tp=2,dp=2", 1)])
def test_each_rank_gets_its_cp_ranks_zigzag_chunks_of_the_sequence(text: str, cp: int) -> None:
    # get_batch_on_this_cp_rank splits over the group it is given; 0.19 without cp_group splits over the whole world
    # (utils.py:2483): a CP=1 layout on 4 ranks would train on a quarter of each sequence. Every rank of a 4-rank
    # world, emulated by torch's fake process group (collectives complete at once; only the group layout matters)
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from trainers.cp_attention import zigzag_positions
    from trainers.cpu_patches import apply_cpu_patches, cpu_device_mode
    from trainers.megatron_job import JobConfig, _batch, init_parallel_state

    assert not dist.is_initialized()
    apply_cpu_patches()
    layout = parse_layout(text, world_size=WORLD)
    seq = 64
    cfg = JobConfig(model=get_model("tiny-gpt"), layout=layout, seq_length=seq, num_microbatches=1)
    for rank in range(WORLD):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)
        try:
            with cpu_device_mode():
                init_parallel_state(layout)
                batch = _batch(cfg, step=0, microbatch=0)
            cp_rank = parallel_state.get_context_parallel_rank()
            want = zigzag_positions(seq // cp, cp_rank, cp) if cp > 1 else torch.arange(seq)
            assert {k: tuple(v.shape) for k, v in batch.items()} == dict.fromkeys(batch, (1, seq // cp))
            assert torch.equal(batch["position_ids"][0], want)
        finally:
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()


def test_a_job_drops_the_moe_tracker_the_previous_model_sized() -> None:
    # 0.19's MoE metrics tracker keeps one slot per layer of the first model that recorded (moe_logging.py:117-125)
    # and clear() only zeroes them; the legacy getter returns a copy. A 2-layer model after a 1-layer one would
    # index past the slot (IndexError in the router's first forward) unless the job drops the tracker.
    import torch
    from megatron.core.transformer.moe.moe_logging import destroy_moe_metrics_tracker, get_moe_metrics_tracker

    from trainers.megatron_job import _reset_process_globals

    get_moe_metrics_tracker().record("load_balancing_loss", torch.tensor(1.0), layer_number=1, num_layers=1)
    try:
        _reset_process_globals()
        tracker = get_moe_metrics_tracker()
        tracker.record("load_balancing_loss", torch.tensor(3.0), layer_number=2, num_layers=2)
        assert tracker.metrics["load_balancing_loss"].values.tolist() == [0.0, 3.0]
    finally:
        destroy_moe_metrics_tracker()


def test_each_cpu_patch_replaces_the_name_megatron_core_calls() -> None:
    # the proxy's layouts above fail without each patch (trainers/cpu_patches.py names the calls); these check that
    # every patch still lands where megatron-core 0.19.2 looks the function up, and does what the CPU needs
    import numpy as np
    import torch
    from megatron.core.tensor_parallel import mappings
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.moe import token_dispatcher
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_config import TransformerConfig

    from trainers.cpu_patches import apply_cpu_patches, cpu_device_mode
    from trainers.proxy_norm import ProxyRMSNorm

    assert apply_cpu_patches()  # True: patched (no CUDA device here)
    assert torch.cuda.current_device() == torch.device("cpu")
    state = torch.random.get_rng_state()
    torch.rand(3)
    mrandom._set_cuda_rng_state(state)  # megatron-core's own queues a lazy CUDA call that never runs
    assert torch.equal(torch.random.get_rng_state(), state)
    splits = token_dispatcher.maybe_move_tensor_to_cpu(torch.tensor([3, 5]), as_numpy=True)
    assert isinstance(splits, np.ndarray) and splits.tolist() == [3, 5]  # gloo's all_to_all_single takes lists
    assert mappings._gather_along_first_dim.__module__ == "trainers.cpu_patches"
    assert mappings._reduce_scatter_along_first_dim.__module__ == "trainers.cpu_patches"
    with cpu_device_mode():
        t = torch.ones(2, device="cuda")
        assert t.device.type == "cpu" and t.type() == "torch.cuda.FloatTensor"
        config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, normalization="RMSNorm",
                                   tensor_model_parallel_size=2, sequence_parallel=True)
        norm = WrappedTorchNorm(config=config, hidden_size=8)  # megatron-core's asserts against SP
    assert isinstance(norm, ProxyRMSNorm)
    assert all(getattr(p, "sequence_parallel", False) for p in norm.parameters())

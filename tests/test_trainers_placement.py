"""Placement of a measured trial's ranks (trainers/placement.py) and whose failure a lost rank is
(trainers/worker_pool.py): pure arithmetic on node resources and rank reports, no Ray started."""

from __future__ import annotations

import pytest

from trainers.placement import GroupPlacement, alive_nodes, ranks_held, ranks_per_bundle, refusal
from trainers.worker_pool import _failure, summarise

GPU8 = {"CPU": 64.0, "GPU": 8.0}


@pytest.mark.parametrize(("tp", "ep", "etp", "within", "k"), [
    (2, 1, 1, False, 2),  # a TP group
    (4, 8, 1, False, 4),  # EP may cross nodes (the default space)
    (2, 4, 1, True, 4),  # lcm(2, 4 * 1) = 4
    (4, 2, 1, True, 4),  # lcm(4, 2) = 4
    (2, 3, 2, True, 6),  # lcm(2, 3 * 2) = 6
])
def test_a_bundle_holds_whole_tp_and_asked_for_ep_groups(tp, ep, etp, within, k) -> None:
    assert ranks_per_bundle(tp=tp, ep=ep, etp=etp, experts_within_node=within) == k


def test_sixteen_gpus_with_tp_8_are_two_bundles_of_a_node_each() -> None:
    p = GroupPlacement(world=16, ranks_per_bundle=8, per_rank=(("CPU", 1.0), ("GPU", 1.0)))
    assert p.bundles == [{"CPU": 8.0, "GPU": 8.0}] * 2
    assert [p.bundle_of(r) for r in (0, 7, 8, 15)] == [0, 0, 1, 1]  # ranks 0-7 one TP group, one node
    assert refusal(p, [GPU8, GPU8]) == ""


def test_ranks_that_hold_nothing_need_no_placement_group() -> None:
    p = GroupPlacement(world=4, ranks_per_bundle=2, per_rank=(("CPU", 0.0),))
    assert p.bundle == {} and refusal(p, []) == ""


@pytest.mark.parametrize(("nodes", "placement", "words"), [
    # TP 16 on 8-GPU nodes: no node holds a bundle
    ([GPU8, GPU8], GroupPlacement(world=16, ranks_per_bundle=16, per_rank=(("GPU", 1.0),)), "on one node"),
    # 3 bundles of 8, 2 nodes of 8: 2 * 8 = 16 < 24 GPUs
    ([GPU8, GPU8], GroupPlacement(world=24, ranks_per_bundle=8, per_rank=(("GPU", 1.0),)), "hold 2 when idle"),
    # 4 x 3 GPUs on nodes of 8: each node holds 8 // 6 = 1 bundle of two ranks, 2 < 3
    ([GPU8, GPU8], GroupPlacement(world=6, ranks_per_bundle=2, per_rank=(("GPU", 3.0),)), "hold 2 when idle"),
])
def test_a_group_the_cluster_can_never_hold_is_refused_with_the_reason(nodes, placement, words) -> None:
    assert words in refusal(placement, nodes)


def test_only_alive_nodes_count_and_ranks_are_held_in_whole_bundles() -> None:
    ray_nodes = [{"Alive": True, "Resources": {"fake_gpu": 2.0}}, {"Alive": False, "Resources": {"fake_gpu": 2.0}},
                 {"Alive": True, "Resources": {"fake_gpu": 3.0}}]
    nodes = alive_nodes(ray_nodes)
    assert nodes == [{"fake_gpu": 2.0}, {"fake_gpu": 3.0}]
    assert ranks_held(nodes, ranks_per_bundle=2, per_rank={"fake_gpu": 1.0}) == 4  # 3 // 2 = 1 bundle on the second


def test_world_must_be_a_multiple_of_the_bundle() -> None:
    with pytest.raises(ValueError, match=r"world \(6\) must be a positive multiple of ranks_per_bundle \(4\)"):
        GroupPlacement(world=6, ranks_per_bundle=4)


OK = {"status": "ok", "reason": ""}
CRASH = {"status": "failed", "reason": "RuntimeError: injected crash on rank 0"}
DIED = {"status": "failed", "lost": True, "reason": "rank 1's worker on node n1 died: ActorDiedError: ..."}
PEER = {"status": "failed", "reason": "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:41234"}


@pytest.mark.parametrize(("ranks", "failure"), [
    ([CRASH, OK], "layout"),  # the job's own error
    ([OK, DIED], "infrastructure"),  # Ray says the process is gone
    ([PEER, DIED], "infrastructure"),
    ([PEER, OK], "infrastructure"),  # a peer's connection dropped: the peer went away
])
def test_whose_failure_a_trial_is(ranks, failure) -> None:
    status, _ = summarise(ranks, 60.0)
    assert _failure(ranks, ["n0", "n1"], status) == failure


def test_a_call_refused_while_ray_restarts_the_pool_waits_instead_of_being_lost() -> None:
    # Ray's words when the pool's actor is mid-restart (the call never ran) and when its socket closed mid-call
    from ray import exceptions as rex

    from trainers.worker_pool import _is_lost_worker, _is_restarting

    restarting = rex.ActorUnavailableError("The actor is temporarily unavailable: IOError: The actor is restarting.",
                                           b"1" * 16)
    closed = rex.ActorUnavailableError("The actor is temporarily unavailable: RpcError: RPC error: Socket closed "
                                       "rpc_code: 14.", b"1" * 16)
    assert _is_restarting(restarting) and _is_lost_worker(restarting)
    assert not _is_restarting(closed) and _is_lost_worker(closed)  # lost mid-call: an attempt to record and retry
    assert not _is_restarting(RuntimeError("The actor is restarting"))

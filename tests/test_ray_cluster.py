"""Searches on a shared multi-raylet Ray cluster (issue 24), one loopback-only cluster for the module: a head and two
worker raylets (`ray.cluster_utils.Cluster`, every node on 127.0.0.1), each with 2 CPUs or 1 and 2 units of a fake
GPU resource (`fake_gpu`) that the megatron backend's workers hold as they would hold GPUs.

One test, two searches at once on that cluster (`--address`), each in its own driver process as a user's would:
- A's layouts need 4 workers (more than a raylet has): its ranks land on two raylets, every TP group on one; its
  TP-4 layout (4 fake GPUs on one node; nodes have 2) is refused with the reason. Once A has a measured row and
  its pool runs another trial, a worker raylet that holds A's ranks is killed (SIGKILL): no row is lost, nothing
  but one line per lost attempt reaches either terminal (no traceback, no Ray message), and each lost attempt is a
  row marked `infrastructure (retried)` followed by its retry on the nodes left (the worker pools live on the
  head, the search drivers' node).
- B runs beside A (2 workers): the searches keep separate Ray namespaces and worker pools (both alive at once, none
  left after), share the fake GPUs through Ray's placement-group scheduler (A's 4 and B's 2 are all 6 the cluster
  has; after the kill a retry waits for what the other holds), and both complete with disjoint rows.

Slow: a megatron worker group starts in 20-40 s on 2 shared cores, and A starts two (the retry's are fresh); the
module's time is in docs/profiling.md.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
STARTUP_S: list[float] = []  # the cluster's start, for the timing line
NODE: dict[str, Any] = {"num_cpus": 1, "resources": {"fake_gpu": 2}, "node_ip_address": "127.0.0.1"}
FAST_FAILURE_DETECTION = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                          "health_check_failure_threshold": 4}  # a dead raylet is marked dead in about 2 s

# The driver of one search. Its strategy measures the space's TP-2 layouts in the model's order, so every trial
# keeps one placement shape (bundles of 2 ranks) and reuses one worker group.
DRIVER = """
import json, sys
from autotune.tuning.driver import run_search
from autotune.tuning.ray_run import search_namespace
from autotune.tuning.measured import Predicted
from autotune.ui.api import make_job
from trainers.backend import MegatronBackend


class TP2:
    name = "tp2"

    def __init__(self, context):
        self.left = [context.analytic.layout(int(r)) for r in context.analytic.ranking.order]
        self.left = [lay for lay in self.left if lay.tp == 2][: context.budget]

    def propose(self):
        return self.left.pop(0) if self.left else None

    def observe(self, layout, measurement):
        pass


address, out, nodes, gbs, trials, compare = sys.argv[1:]
job = make_job("tiny-gpt", nodes=int(nodes), gpus_per_node=2, seq_length=64, global_batch_size=int(gbs))
backend = Predicted(MegatronBackend(worker_resources=(("fake_gpu", 1.0),), precision="fp32", timed_steps=1,
                                    timeout_s=120, placement_timeout_s=120))
result = run_search(job, trials=int(trials), backend=backend, strategy="__main__:TP2", use_seeds=False,
                    compare=[c for c in compare.split(";") if c], exhaustive_threshold=0, address=address,
                    output_dir=out + "/megatron", progress=False)
print(json.dumps({"namespace": search_namespace(out + "/megatron"), "records": len(result.records),
                  "interrupted": result.interrupted}))
"""


def _rows(folder: Path) -> list[dict[str, str]]:
    path = folder / "trials.csv"
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    from search_spaces.ray_session import _single_host

    assert not ray.is_initialized()
    temp_dir = tempfile.mkdtemp(prefix="rc-", dir="/tmp")  # Ray's socket paths must stay under 107 bytes
    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "RAY_AUTH_MODE")}
    os.environ.update(RAY_TMPDIR=temp_dir, RAY_AUTH_MODE="disabled")  # the address file stays in temp_dir
    os.makedirs(os.path.join(temp_dir, "ray"))
    t0 = time.perf_counter()
    with _single_host():  # every node on 127.0.0.1 (search_spaces/ray_session.py)
        c = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "resources": {"fake_gpu": 2}, "node_ip_address": "127.0.0.1", "temp_dir": temp_dir,
            "include_dashboard": False, "_system_config": FAST_FAILURE_DETECTION})
        for _ in range(2):
            c.add_node(**NODE)
        ray.init(address=c.address, log_to_driver=False, logging_level=logging.ERROR)  # to watch the pools
    STARTUP_S.append(time.perf_counter() - t0)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _Search:
    """One search's driver process; its stdout and stderr go to files (a full pipe would stall it)."""

    def __init__(self, cluster: Any, out: Path, *, nodes: int, gbs: int, trials: int, compare: str = "") -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("RAY_ADDRESS", None)
        out.mkdir(parents=True, exist_ok=True)
        self.folder = out / "megatron"
        self.stdout, self.stderr = out / "stdout.txt", out / "stderr.txt"
        with open(self.stdout, "w") as o, open(self.stderr, "w") as e:
            self.proc = subprocess.Popen([sys.executable, "-c", DRIVER, cluster.address, str(out), str(nodes),
                                          str(gbs), str(trials), compare], env=env, cwd=out, stdout=o, stderr=e)

    def running(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.stdout.read_text() + self.stderr.read_text()

    def finish(self, timeout_s: float = 400) -> tuple[dict[str, Any], str]:
        """(what the driver printed last, as JSON; its stderr) once it exits 0."""
        self.proc.wait(timeout=timeout_s)
        assert self.proc.returncode == 0, self.output()[-4000:]
        return json.loads(self.stdout.read_text().strip().splitlines()[-1]), self.stderr.read_text()

    def kill(self) -> None:
        if self.running():
            self.proc.kill()
            self.proc.wait()


class _Pools:
    """The worker pools alive on the cluster (named actors, any namespace), watched while the searches run."""

    def __init__(self) -> None:
        self.most: set[str] = set()  # the most pools seen alive at once

    def look(self) -> set[str]:
        import ray

        now = {a["namespace"] for a in ray.util.list_named_actors(all_namespaces=True)
               if a["name"] == "autotune-megatron-pool"}
        if len(now) > len(self.most):
            self.most = now
        return now


def _kill_a_rank_node(cluster: Any, search: _Search, pools: _Pools) -> str:
    """Once `search` has a measured row and its pool runs the next trial, kill (SIGKILL) a worker raylet that holds
    ranks of its worker group; its node id.

    "Runs the next trial": the pool runs one call at a time, so a ping to it that stays unanswered for a second
    waits behind a trial in flight, on the group of the measured row (the search keeps one group: one placement
    shape). Without that wait the kill can land between two trials; the pool then drops the group of the dead node
    before the next trial and starts fresh workers, so nothing is lost, and the lost attempt this test checks never
    happens."""
    from autotune.tuning.ray_run import search_namespace

    deadline = time.monotonic() + 300
    ping: Any = None
    sent = 0.0
    while time.monotonic() < deadline and search.running():
        pools.look()
        rows = [r for r in _rows(search.folder) if r["rank_nodes"] and r["status"] == "ok"]
        if rows:
            if ping is None:
                ping, sent = _pool_of(search_namespace(search.folder)).ping.remote(), time.monotonic()
            if _answered(ping, 0.2):
                ping = None  # the pool is idle (between trials): ask again
            elif time.monotonic() - sent > 1.0:
                ranks = set(json.loads(rows[0]["rank_nodes"]))
                node = next(n for n in cluster.worker_nodes if n.node_id in ranks)
                cluster.remove_node(node, allow_graceful=False)
                return str(node.node_id)
        else:
            time.sleep(0.2)
    pytest.fail(f"no megatron row and trial in flight to act on: {search.output()[-4000:]}")


def _pool_of(namespace: str) -> Any:
    import ray

    return ray.get_actor("autotune-megatron-pool", namespace=namespace)


def _answered(ref: Any, timeout_s: float) -> bool:
    import ray

    done, _ = ray.wait([ref], timeout=timeout_s)
    return bool(done)


def _quiet(err: str) -> None:
    """A search's terminal: one line per lost attempt, never a traceback or Ray's own messages about the dead node."""
    assert "Traceback" not in err and "(raylet)" not in err and "marked dead" not in err, err[-3000:]


def _lost_then_retried(rows: list[dict[str, str]], killed: str) -> list[dict[str, str]]:
    """The lost attempts; each layout's are followed by an attempt that is no lost one and ran on nodes Ray still
    has. At most two in a row: the trainable measures a lost attempt once more, and Tune retries a trial whose own
    process died with the node (`tune_glue`: both can hit one layout when the kill lands between them)."""
    lost = [r for r in rows if r["failure"] == "infrastructure (retried)"]
    for r in lost:
        later = [x for x in rows[rows.index(r) + 1:] if x["layout"] == r["layout"]]
        chain = 1 + next((i for i, x in enumerate(later) if x["failure"] != "infrastructure (retried)"), len(later))
        assert chain <= 2 and chain - 1 < len(later), later  # r, at most one more lost attempt, then the retry
        retry = later[chain - 1]
        assert killed not in retry["rank_nodes"], retry
    return lost


def test_two_searches_at_once_placement_across_raylets_and_a_raylet_killed(cluster, tmp_path):
    t0 = time.perf_counter()
    pools = _Pools()
    a = _Search(cluster, tmp_path / "a", nodes=2, gbs=8, trials=3, compare="tp=4,pp=1")
    b = _Search(cluster, tmp_path / "b", nodes=1, gbs=16, trials=2)
    try:
        killed = _kill_a_rank_node(cluster, a, pools)
        t_kill = time.perf_counter() - t0
        while a.running() or b.running():
            pools.look()
            time.sleep(0.5)
        (got_a, err_a), (got_b, err_b) = a.finish(), b.finish()
    finally:
        a.kill()
        b.kill()
    rows_a, rows_b = _rows(a.folder), _rows(b.folder)

    # two searches: their own namespaces and pools (both alive at once, none left after), disjoint rows
    assert got_a["namespace"] != got_b["namespace"]
    assert pools.most == {got_a["namespace"], got_b["namespace"]}
    assert pools.look() == set()
    assert {r["job"] for r in rows_a}.isdisjoint({r["job"] for r in rows_b})
    assert len({r["job"] for r in rows_a}) == len({r["job"] for r in rows_b}) == 1  # each folder: its own job

    # the kill: no traceback or Ray message on either terminal, one line per lost attempt, each retried
    lost_a, lost_b = _lost_then_retried(rows_a, killed), _lost_then_retried(rows_b, killed)
    for err, lost in ((err_a, lost_a), (err_b, lost_b)):
        _quiet(err)
        assert err.count("infrastructure failure") == len(lost), err[-3000:]
    assert lost_a, rows_a  # A had ranks on the killed node and a trial in flight
    assert not (a.folder / "ray_messages.log").read_text().count("Traceback")

    # every trial recorded: A's TP-4 layout and its 3 of the budget, B's 2, the lost attempts on top
    assert len(rows_a) - len(lost_a) == 4 and not got_a["interrupted"], rows_a
    assert len(rows_b) - len(lost_b) == 2 and not got_b["interrupted"], rows_b
    refused = next(r for r in rows_a if r["origin"] == "user")  # TP 4: 4 fake GPUs on one node, nodes have 2
    assert refused["failure"] == "placement" and "on one node" in refused["reason"], refused
    measured = [r for r in rows_a if r["status"] == "ok"]
    assert len(measured) == 3, rows_a
    for r in measured:  # 4 ranks on 2 raylets, each TP group (ranks 2k, 2k+1) on one
        nodes = json.loads(r["rank_nodes"])
        assert len(nodes) == 4 and len(set(nodes)) == 2 and nodes[0] == nodes[1] and nodes[2] == nodes[3], r
    assert [r["status"] for r in rows_b if r not in lost_b] == ["ok", "ok"], rows_b
    for r in rows_b:  # B's TP group of 2: one node
        if r["status"] == "ok":
            assert len(set(json.loads(r["rank_nodes"]))) == 1, r
    print(f"two searches, placement and a raylet killed: {time.perf_counter() - t0:.0f} s (the kill at "
          f"{t_kill:.0f} s, lost attempts A {len(lost_a)} B {len(lost_b)}; cluster start {STARTUP_S[-1]:.0f} s)")

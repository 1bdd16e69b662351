"""Worker processes for megatron-core jobs: a reusable Ray actor pool, and fresh Ray Train workers.

Reuse path (the default). A named, detached coordinator actor (`autotune-megatron-pool`) keeps one
group of worker actors per (world size, device) alive across trials. A group is created once: its
actors are placed with a Ray placement group, start one torch.distributed process group among
themselves (gloo on CPU, NCCL on GPU; rank 0 publishes the TCP rendezvous), import megatron-core once,
and then run layout after layout (`parallel_state` is destroyed and re-initialised per layout inside
`run_job`). A trial then costs the job itself (seconds), not worker start-up and `import megatron.core`
(35 to 48 s here). The coordinator runs one trial at a time, so concurrent Tune trials never interleave
collectives on the same workers. Being named and detached, it outlives the Tune trial actor that
created it; any later trial (another process) finds it by name.

Failures: a rank that raises, or a trial past its timeout (a hung collective), gets the whole group
killed, and the next trial of that world size starts fresh workers. A layout that megatron-core rejects
on every rank while building leaves the group intact. Each failed outcome says whose failure it was
(`PoolOutcome.failure`): "layout" (the job's own error, rejection, OOM or hang), "infrastructure" (a worker
process, its raylet or its node died, the coordinator died, or no placement came within the wait: the cluster's
failure, worth a retry on fresh workers), or "placement" (the group can never be placed on this cluster's nodes:
`trainers.placement.refusal`, said before anything starts). A kept group with a rank on a node Ray no longer counts
alive is never reused: the next trial drops it (its placement group too, whose bundles Ray would otherwise re-place
on the nodes left, holding what a retry needs) and starts fresh workers on alive nodes. A coordinator that Ray
restarted after its process died first removes the placement groups its dead incarnation left (they are the job's,
not the process's, and would hold their resources until the search ends); a call that lost the coordinator
returns only once the coordinator answers again, so the retry finds it back.

Fresh path (`trainers.fresh_workers.run_fresh`): Ray Train V2's `TorchTrainer` started from the caller (a Tune function
trainable in a search), one new worker group per trial; used when reuse is turned off and as the
baseline of `bench/bench_trainer_overhead.py`.

Rendezvous closed to the network: rank 0 opens the TCPStore on a socket it binds to its own Ray node IP
(127.0.0.1 on a local Ray; `TCPStore(master_listen_fd=...)`), never on all interfaces as torch's default
does, and on a loopback node gloo and NCCL bind their sockets to the loopback interface
(`GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`; `trainers.rendezvous`). Both paths (the pool and Ray Train's
`TorchConfig`) use it.

Placement (`trainers.placement`): a group's workers are placed by one placement group of world / k bundles, each
holding k consecutive ranks (k = TP, or lcm(TP, EP x ETP) where experts stay inside a node) with their CPU and,
where asked, extra resources (GPUs, or a test's fake GPU resource); a bundle is placed whole on one node, so a
TP group never spans nodes, and PACK fills a node before the next. A group that fits the cluster but finds its
resources held waits in Ray's queue (up to `placement_timeout_s`); first the pool gives back its own idle groups
(they may be what holds them). Each rank reports the Ray node it ran on.

One pool per search: the coordinator is a named actor in the Ray namespace of the job that opened it
(`open_pool`, the search driver: a namespace of its own per search), owned by that driver (it and its groups
end with it, also when the driver is killed), pinned to the driver's node (a worker node that leaves never takes
the coordinator with it) and restarted there by Ray if its process dies. Two searches on one
cluster therefore never share a pool, and their groups share the GPUs through Ray's placement-group scheduler.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass
from typing import Any

from trainers.rendezvous import join_process_group, open_store

__all__ = ["PoolOutcome", "run_pooled", "open_pool", "shutdown_pool", "pool_stats", "POOL_NAME", "Failure",
           "run_on_rank", "cpu_threads", "summarise"]

POOL_NAME = "autotune-megatron-pool"  # in the namespace of the job that opened it (one per search)
GRACE_AFTER_FIRST_ERROR_S = 10.0
PLACEMENT_POLL_S = 1.0  # a new group's placement not ready within this: give back this pool's idle groups first
POOL_RESTART_WAIT_S = 60.0  # how long a call waits for Ray to bring a dead pool back before it counts as lost
Failure = str  # "", "layout", "infrastructure", "placement"
# what gloo / NCCL / the TCPStore say on a rank whose peer's process went away (the peer died, not the layout)
PEER_LOST = ("connection closed by peer", "connection reset by peer", "broken pipe", "connection refused",
             "remote process exited", "socket closed")
MAX_KEPT_GROUPS = 2  # worker groups kept alive at once (each rank holds ~450 MB with torch + megatron-core)


@dataclass(frozen=True, kw_only=True, slots=True)
class PoolOutcome:
    """What the workers said: per-rank results, or a status and reason."""

    status: str  # "ok", "invalid", "failed", "oom", "timeout"
    reason: str
    ranks: list[dict[str, Any]]
    fresh_workers: bool  # True when this trial paid for starting workers
    startup_s: float  # worker start + process group + import, 0 when reused
    wall_s: float
    nodes: tuple[str, ...] = ()  # the Ray node of each rank, in rank order (when known)
    failure: Failure = ""  # whose failure a non-ok status is: "layout", "infrastructure" or "placement"


def _classify(exc: BaseException) -> str:
    name = type(exc).__name__
    text = str(exc).lower()
    if name in ("OutOfMemoryError", "MemoryError") or "out of memory" in text:
        return "oom"
    if name == "JobRejected":
        return "invalid"
    return "failed"


def run_on_rank(cfg: Any) -> dict[str, Any]:
    """Run one job on this rank: a megatron-core job (`trainers.megatron_job.JobConfig`), or any config with a
    `run() -> dict` of its own (`trainers.collectives.CollectivesConfig`); never raises (the error comes back as
    data)."""
    from trainers.megatron_job import JobConfig, run_job

    try:
        return {"status": "ok", **(run_job(cfg) if isinstance(cfg, JobConfig) else cfg.run())}
    except BaseException as e:  # noqa: BLE001 - a crash is a trial outcome
        tail = traceback.format_exc(limit=4)
        return {"status": _classify(e), "reason": f"{type(e).__name__}: {e}"[:2000], "traceback": tail[-3000:]}


def cpu_threads(world_size: int) -> int:
    """Intra-op threads per CPU rank: the machine's cores shared by the ranks, at least one."""
    return max(1, (os.cpu_count() or 1) // world_size)


def _worker_env(use_gpu: bool) -> None:
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")


def _runtime_env() -> dict[str, Any]:
    """Workers import `trainers` and `search_spaces` from this checkout, wherever Ray starts them."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {"env_vars": {"PYTHONPATH": path}}


def _make_worker_class() -> Any:
    import ray

    @ray.remote
    class MegatronWorker:
        """One rank: holds the torch.distributed process group between jobs."""

        def __init__(self, rank: int, world_size: int, use_gpu: bool) -> None:
            _worker_env(use_gpu)
            self.rank, self.world_size, self.use_gpu = rank, world_size, use_gpu
            self.store: Any = None

        def rendezvous(self, timeout_s: float) -> tuple[str, int]:
            """Rank 0: open the TCPStore (on this node's IP only) and say where it is."""
            self.store, addr, port = open_store(timeout_s)
            return addr, port

        def init(self, addr: str, port: int, timeout_s: float) -> float:
            import torch

            t0 = time.perf_counter()
            if not self.use_gpu:
                torch.set_num_threads(cpu_threads(self.world_size))
            else:
                torch.cuda.set_device(0)  # Ray sets CUDA_VISIBLE_DEVICES to this actor's GPU
            self.store = join_process_group(self.store, addr, port, self.rank, self.world_size,
                                            "nccl" if self.use_gpu else "gloo", timeout_s)
            import megatron.core  # noqa: F401  (pay the import once, here)

            from trainers.cpu_patches import apply_cpu_patches

            apply_cpu_patches()
            return time.perf_counter() - t0

        def run(self, cfg: Any) -> dict[str, Any]:
            return run_on_rank(cfg)

        def node(self) -> str:
            import ray

            return ray.get_runtime_context().get_node_id()

        def stats(self) -> dict[str, Any]:
            return process_stats()

    return MegatronWorker


def process_stats() -> dict[str, Any]:
    """This process's resident memory, threads and open files (the soak benchmark's figures)."""
    import psutil

    p = psutil.Process()
    return {"pid": p.pid, "rss_bytes": p.memory_info().rss, "threads": p.num_threads(), "open_files": p.num_fds()}


def _is_lost_worker(exc: BaseException) -> bool:
    """Ray's word that the process or node behind a call is gone (not an error of the job it ran)."""
    from ray import exceptions as rex

    lost = (rex.RayActorError, rex.NodeDiedError, rex.WorkerCrashedError, rex.ObjectLostError,
            rex.LocalRayletDiedError, rex.ActorUnschedulableError)
    return isinstance(exc, lost)


def _is_restarting(exc: BaseException) -> bool:
    """Ray refused the call because the pool's actor is being restarted after its process died ("The actor is
    restarting"): the call never ran, and the restarted pool can take it (the retry of a lost attempt otherwise
    lands on it mid-restart and is lost too, seen in test_ray_cluster on a fresh clone)."""
    from ray import exceptions as rex

    return isinstance(exc, rex.ActorUnavailableError) and "restarting" in str(exc)


def _actor_id() -> str:
    import ray

    return str(ray.get_runtime_context().get_actor_id())


def _placement_groups_named(prefix: str) -> list[Any]:
    """The placement groups of this cluster not yet removed whose names start with `prefix`."""
    import ray
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup

    table = ray.util.placement_group_table()
    return [PlacementGroup(PlacementGroupID.from_hex(pg_id)) for pg_id, info in table.items()
            if str(info.get("name", "")).startswith(prefix) and info.get("state") != "REMOVED"]


def _await_pool(pool: Any, wait_s: float) -> None:
    """Return once `pool` answers, or it is gone for good, or after `wait_s`: a call that lost the pool (its process
    died, Ray restarts it) returns only then, so the retry of the lost attempt lands on the restarted pool instead of
    on one still unreachable ('The actor is temporarily unavailable', lost again)."""
    import ray
    from ray import exceptions as rex

    deadline = time.perf_counter() + wait_s
    while time.perf_counter() < deadline:
        try:
            ray.get(pool.ping.remote(), timeout=max(1.0, deadline - time.perf_counter()))
            return
        except (rex.ActorUnavailableError, rex.GetTimeoutError):
            time.sleep(1.0)
        except rex.RayActorError:  # dead for good (no restart): the next call makes a new one
            return


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:500]


class _NoPlacement(Exception):
    """A group that cannot be placed: `failure` says whether never (placement) or not in time (infrastructure)."""

    def __init__(self, reason: str, failure: Failure) -> None:
        super().__init__(reason)
        self.failure = failure


def _make_pool_class() -> Any:
    """The coordinator actor class (module docstring). Long on purpose: an actor's methods live in its class, and the
    class is made inside a function so that importing this module imports no Ray."""
    import ray

    # ray.remote's typed keyword overload lists task options only; max_concurrency is an actor option
    @ray.remote(num_cpus=0, max_concurrency=1)  # type: ignore[call-overload]
    class MegatronPool:
        """Keeps worker groups alive by (world size, device, placement); runs one trial at a time."""

        def __init__(self) -> None:
            self.groups: dict[tuple[Any, ...], tuple[list[Any], Any]] = {}
            self.nodes: dict[tuple[Any, ...], list[str]] = {}
            self.worker_cls = _make_worker_class()
            self.started = 0  # groups started (placement group names)
            # this incarnation's own names: a pool Ray restarts after its process died counts from 0 again, while
            # the dead one's placement groups may still exist under the old names (same prefix: this actor's id)
            self.incarnation = os.urandom(4).hex()
            self.prefix = f"{POOL_NAME}-{_actor_id()}-"
            self._remove_stale_placement_groups()

        def _remove_stale_placement_groups(self) -> None:
            """Remove the placement groups an earlier incarnation of this pool left: they belong to the job, not to
            the dead process, so Ray keeps them (and re-places the bundles of a dead node) until the search ends."""
            from ray.util.placement_group import remove_placement_group

            for pg in _placement_groups_named(self.prefix):
                remove_placement_group(pg)

        def ping(self) -> str:
            """This incarnation's id (the pool answers: `run_pooled` waits for it after losing it mid-call)."""
            return str(self.incarnation)

        def _start_group(self, key: tuple[Any, ...], placement: Any, use_gpu: bool, timeout_s: float,
                         placement_timeout_s: float) -> list[Any]:
            import ray
            from ray.util.placement_group import placement_group, remove_placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            from trainers.placement import STRATEGY, alive_nodes, refusal

            per_rank = dict(placement.per_rank)
            options: dict[str, Any] = {"num_cpus": per_rank.pop("CPU", 0.0), "num_gpus": per_rank.pop("GPU", 0.0),
                                       "runtime_env": _runtime_env()}
            if per_rank:
                options["resources"] = per_rank
            pg = None
            if placement.bundle:
                why = refusal(placement, alive_nodes(ray.nodes()))
                if why:
                    raise _NoPlacement(f"cannot be placed on this cluster: {why}", "placement")
                self.started += 1
                pg = placement_group(placement.bundles, strategy=STRATEGY,
                                     name=f"{self.prefix}{placement.world}w-{self.started}-{self.incarnation}")
                if not pg.wait(PLACEMENT_POLL_S):
                    for other in [k for k in self.groups if k != key]:  # idle: this pool runs one trial at a time
                        self._kill_group(other)
                    if not pg.wait(placement_timeout_s):
                        remove_placement_group(pg)
                        raise _NoPlacement(f"no placement for {placement.describe()} within {placement_timeout_s:.0f}"
                                           f" s: the cluster's resources are held by other work", "infrastructure")
            self.groups[key] = ([], pg)  # killed with its placement group if start-up fails
            workers = []
            for rank in range(placement.world):
                strategy: Any = "DEFAULT"
                if pg is not None:
                    strategy = PlacementGroupSchedulingStrategy(
                        placement_group=pg, placement_group_bundle_index=placement.bundle_of(rank))
                workers.append(self.worker_cls.options(**options, scheduling_strategy=strategy).remote(
                    rank, placement.world, use_gpu))
            self.groups[key] = (workers, pg)
            addr, port = ray.get(workers[0].rendezvous.remote(timeout_s), timeout=timeout_s)
            ray.get([w.init.remote(addr, port, timeout_s) for w in workers], timeout=timeout_s)
            self.nodes[key] = ray.get([w.node.remote() for w in workers], timeout=timeout_s)
            return workers

        def _drop_lost_groups(self) -> None:
            """Kill every kept group with a rank on a node Ray no longer counts alive: its workers there are gone,
            and Ray re-places its placement group's bundles of that node on the nodes left, where they would hold
            the resources a fresh group (this pool's or another search's) waits for."""
            if not self.nodes:
                return
            lost = [key for key, nodes in self.nodes.items() if _dead_nodes(nodes)]
            for key in lost:
                self._kill_group(key)

        def _kill_group(self, key: tuple[Any, ...]) -> None:
            import ray
            from ray.util.placement_group import remove_placement_group

            workers, pg = self.groups.pop(key, ([], None))
            self.nodes.pop(key, None)
            for w in workers:
                ray.kill(w, no_restart=True)
            if pg is not None:
                remove_placement_group(pg)

        def run(self, placement: Any, use_gpu: bool, cfg: Any, timeout_s: float,
                placement_timeout_s: float | None = None) -> dict[str, Any]:
            import ray

            t0 = time.perf_counter()
            self._drop_lost_groups()
            key = (placement.world, use_gpu, placement.per_rank, placement.ranks_per_bundle if placement.bundle else 1)
            fresh = key not in self.groups
            if fresh:
                while len(self.groups) >= MAX_KEPT_GROUPS:  # dicts keep insertion order: the oldest goes first
                    self._kill_group(next(iter(self.groups)))
            else:
                self.groups[key] = self.groups.pop(key)  # most recently used last
            try:
                workers = (self._start_group(key, placement, use_gpu, timeout_s,
                                             timeout_s if placement_timeout_s is None else placement_timeout_s)
                           if fresh else self.groups[key][0])
            except Exception as e:  # noqa: BLE001
                self._kill_group(key)
                failure = e.failure if isinstance(e, _NoPlacement) else (
                    "infrastructure" if _is_lost_worker(e) or type(e).__module__.startswith("ray") else "")
                reason = str(e) if isinstance(e, _NoPlacement) else f"worker start-up failed: {_one_line(e)}"
                return {"status": "failed", "reason": reason[:2000], "failure": failure, "ranks": [], "fresh": True,
                        "startup_s": time.perf_counter() - t0, "nodes": []}
            startup_s = time.perf_counter() - t0 if fresh else 0.0
            nodes = list(self.nodes.get(key, []))
            refs = [w.run.remote(cfg) for w in workers]
            deadline = time.perf_counter() + timeout_s
            results: dict[Any, dict[str, Any]] = {}
            pending = list(refs)
            while pending and time.perf_counter() < deadline:
                done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.perf_counter()))
                for ref in done:
                    try:
                        results[ref] = ray.get(ref)
                    except Exception as e:  # noqa: BLE001 - the actor died (segfault, killed, its node gone)
                        rank = refs.index(ref)
                        where = f" on node {nodes[rank]}" if rank < len(nodes) else ""
                        results[ref] = {"status": "failed", "lost": _is_lost_worker(e),
                                        "reason": f"rank {rank}'s worker{where} died: {_one_line(e)}"}
                if any(r["status"] != "ok" for r in results.values()) and pending:
                    deadline = min(deadline, time.perf_counter() + GRACE_AFTER_FIRST_ERROR_S)
            ranks = [results.get(ref) for ref in refs]
            status, reason = summarise(ranks, timeout_s)
            failure = _failure(ranks, nodes, status) if status != "ok" else ""
            if failure == "infrastructure":
                reason = _infrastructure_reason(ranks, nodes, reason)
            if not _group_reusable(ranks):  # a rank crashed or hung: these processes are not trusted again
                self._kill_group(key)
            return {"status": status, "reason": reason, "failure": failure,
                    "ranks": [r for r in ranks if r is not None],
                    "fresh": fresh, "startup_s": startup_s, "nodes": nodes}

        def stats(self) -> dict[str, Any]:
            """This coordinator's and every kept worker's process figures (the soak benchmark)."""
            import ray

            workers = [w for group, _ in self.groups.values() for w in group]
            return {"pool": process_stats(), "workers": ray.get([w.stats.remote() for w in workers], timeout=60)}

        def shutdown(self) -> None:
            for key in list(self.groups):
                self._kill_group(key)

    return MegatronPool


def summarise(ranks: list[dict[str, Any] | None], timeout_s: float) -> tuple[str, str]:
    """One status for the trial. A rank's own error wins over ranks that hung waiting for it:
    oom, then a megatron-core rejection (invalid), then a crash (failed); timeout only when no rank said why."""
    errors = [r for r in ranks if r is not None and r["status"] != "ok"]
    for status in ("oom", "invalid", "failed"):
        hit = [r for r in errors if r["status"] == status]
        if hit:
            return status, hit[0]["reason"]
    missing = [i for i, r in enumerate(ranks) if r is None]
    if missing:
        return "timeout", f"ranks {missing} did not finish within {timeout_s:.0f} s (a hung collective?)"
    return "ok", ""


def _peer_lost(reason: str) -> bool:
    text = reason.lower()
    return any(phrase in text for phrase in PEER_LOST)


def _dead_nodes(nodes: list[str]) -> set[str]:
    """Those of `nodes` that Ray no longer counts alive."""
    import ray

    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    return {n for n in nodes if n not in alive}


def _failure(ranks: list[dict[str, Any] | None], nodes: list[str], status: str) -> Failure:
    """Infrastructure when a rank's process is gone (Ray says so), a rank lost its connection to a peer (the peer
    went away), or a rank that never answered sat on a node Ray no longer counts; otherwise the layout's."""
    if any(r is not None and r.get("lost") for r in ranks):
        return "infrastructure"
    if any(r is not None and r["status"] != "ok" and _peer_lost(r.get("reason", "")) for r in ranks):
        return "infrastructure"
    missing = [nodes[i] for i, r in enumerate(ranks) if r is None and i < len(nodes)]
    if missing and _dead_nodes(missing):
        return "infrastructure"
    return "layout"


def _infrastructure_reason(ranks: list[dict[str, Any] | None], nodes: list[str], reason: str) -> str:
    """The rank whose process went away, before the ranks that only lost their connection to it."""
    lost = [r["reason"] for r in ranks if r is not None and r.get("lost")]
    dead = sorted(_dead_nodes(sorted(set(nodes))))
    gone = f"; node {', '.join(dead)} left the cluster" if dead else ""
    return ((lost[0] if lost else reason) + gone)[:2000]


def _group_reusable(ranks: list[dict[str, Any] | None]) -> bool:
    """Every rank answered, and only with success or a rejection: the processes are in a known state."""
    return all(r is not None and r["status"] in ("ok", "invalid") for r in ranks)


def _driver_node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


# The handle of the pool this process opened, with the Ray session it belongs to. A named actor that is not detached
# is still reference counted: Ray ends it (and the worker groups it owns) once no handle to it is left, so the
# opener keeps one until `shutdown_pool` (or until it joins another Ray session: the handle is then stale).
_OPENED: dict[tuple[str, str], Any] = {}


def _session() -> tuple[str, str]:
    """This process's Ray session and job: a handle from another one is stale."""
    import ray
    from ray._private import worker

    node = getattr(worker.global_worker, "node", None)
    return str(getattr(node, "session_name", "")), ray.get_runtime_context().get_job_id()


def _opened() -> Any:
    """The pool this process opened in this Ray session, or None (a stale handle is forgotten)."""
    key = _session()
    for other in [k for k in _OPENED if k != key]:
        del _OPENED[other]
    return _OPENED.get(key)


def _existing_pool() -> Any:
    """The pool this process opened, else the one of this Ray job's namespace, else None."""
    import ray

    pool = _opened()
    if pool is not None:
        return pool
    try:
        return ray.get_actor(POOL_NAME)
    except ValueError:
        return None


def open_pool() -> Any:
    """The pool of this Ray job's namespace, created by this process when there is none: owned by it (it ends with
    this process, or at `shutdown_pool`), restarted by Ray if the pool's own process dies, placed on this node (the
    search driver's: a node that leaves takes the search with it anyway). Pinned hard: Ray places a zero-CPU actor
    with a soft affinity on other nodes too (seen with Ray 2.60 on a busy head: half of them), and a pool on a worker
    node that leaves loses the trial it runs and the next one that calls it mid-restart."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    pool = _existing_pool()
    if pool is not None:
        return pool
    # Pinned to this node, not in any placement group: a Tune trial's placement group captures child
    # actors by default, and removing that group at the trial's end would kill the pool with it.
    pool = _make_pool_class().options(
        name=POOL_NAME, get_if_exists=True, max_restarts=-1, runtime_env=_runtime_env(),
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=_driver_node(), soft=False)).remote()
    _OPENED[_session()] = pool
    return pool


def _get_pool() -> Any:
    """The pool `open_pool` made; without one, this driver's own (`open_pool`), or from inside a Ray worker (a Tune
    trial of a caller that opened none) a detached pool, so later trials (other processes) find the same workers;
    `shutdown_pool` ends it."""
    from ray._private import worker

    pool = _existing_pool()
    if pool is not None:
        return pool
    if worker.global_worker.mode == worker.SCRIPT_MODE:
        return open_pool()
    cls = _make_pool_class()
    # "DEFAULT" scheduling: a Tune trial's placement group captures child actors by default, and removing
    # that group at the trial's end would kill the pool with it.
    return cls.options(name=POOL_NAME, lifetime="detached", get_if_exists=True, runtime_env=_runtime_env(),
                       scheduling_strategy="DEFAULT").remote()


def run_pooled(cfg: Any, *, world_size: int, use_gpu: bool, timeout_s: float = 600.0,
               cpus_per_worker: float = 0.0, resources: dict[str, float] | None = None,
               ranks_per_bundle: int = 1, placement_timeout_s: float | None = None) -> PoolOutcome:
    """Run `cfg` on the kept-alive worker group of `world_size` ranks (started on first use). `resources`: extra
    Ray resources each worker holds (e.g. a test cluster's {"fake_gpu": 1}; GPU and CPU come from `use_gpu` and
    `cpus_per_worker`); `ranks_per_bundle` consecutive ranks share a node (TP); `placement_timeout_s` (default
    `timeout_s`): how long a group that fits waits for resources others hold."""
    import ray

    from trainers.placement import GroupPlacement

    t0 = time.perf_counter()
    per_rank = {"GPU": 1.0, "CPU": max(cpus_per_worker, 1.0)} if use_gpu else {"CPU": cpus_per_worker}
    per_rank.update(resources or {})
    placement = GroupPlacement(world=world_size, ranks_per_bundle=ranks_per_bundle,
                               per_rank=tuple(sorted((k, float(v)) for k, v in per_rank.items() if v > 0)))
    restarted_by = time.perf_counter() + min(timeout_s, POOL_RESTART_WAIT_S)
    while True:
        pool = _get_pool()
        try:
            out = ray.get(pool.run.remote(placement, use_gpu, cfg, timeout_s, placement_timeout_s))
            break
        except Exception as e:  # noqa: BLE001 - the coordinator's process or node went away mid-trial
            if _is_restarting(e) and time.perf_counter() < restarted_by:
                time.sleep(1.0)  # Ray is bringing the pool back (max_restarts=-1): the call never ran, so wait
                continue
            if not _is_lost_worker(e):
                raise
            _await_pool(pool, min(timeout_s, POOL_RESTART_WAIT_S))  # the retry finds the pool back
            return PoolOutcome(status="failed", reason=f"the worker pool's process died: {_one_line(e)}", ranks=[],
                               fresh_workers=True, startup_s=0.0, wall_s=time.perf_counter() - t0,
                               failure="infrastructure")
    return PoolOutcome(status=out["status"], reason=out["reason"], ranks=out["ranks"], fresh_workers=out["fresh"],
                       startup_s=out["startup_s"], wall_s=time.perf_counter() - t0, nodes=tuple(out.get("nodes", ())),
                       failure=out.get("failure", ""))


def pool_stats() -> dict[str, Any]:
    """The pool's and its workers' process figures ({} without a pool)."""
    import ray

    try:
        pool = ray.get_actor(POOL_NAME)
    except ValueError:
        return {}
    stats: dict[str, Any] = dict(ray.get(pool.stats.remote(), timeout=120))
    return stats


def shutdown_pool() -> None:
    """Kill every kept-alive worker group and the coordinator (end of a search)."""
    import ray

    opened = _opened()
    _OPENED.clear()
    try:
        pool = opened if opened is not None else ray.get_actor(POOL_NAME)
    except ValueError:
        return
    try:
        ray.get(pool.shutdown.remote(), timeout=60)
    except Exception as e:  # noqa: BLE001 - a dead coordinator's workers die with it
        if not _is_lost_worker(e) and not isinstance(e, TimeoutError):
            raise
    ray.kill(pool, no_restart=True)

"""`MegatronBackend`: profile a layout by running real megatron-core (GPU, or a CPU proxy on gloo).

`evaluate(job, layout) -> Measurement` plans the run (`trainers.proxy`), runs it on kept-alive Ray
workers (`trainers.worker_pool`), and turns the ranks' reports into one Measurement:

- status: ok, or oom / failed / timeout / invalid with the reason (a failure is data, never an exception);
- step time: the median over timed steps of the slowest rank's step (spread in `time`);
- tokens/s per GPU: tokens per step / median step time / ranks that ran;
- memory: the most loaded rank's breakdown with the analytic model's term names (weights, gradients,
  optimizer, activations; bytes), plus the allocator's peak on a GPU;
- extra: proxy shape, DP reduction, group sizes formed by megatron-core, losses, per-rank memory, each rank's Ray
  node (`worker_nodes`), and for a failure whose it was (`failure`: "layout", "infrastructure" when a worker,
  raylet or node died or no placement came in time, "placement" when this cluster can never hold the group).

Placement (`trainers.placement`): the workers' placement group has one bundle per TP group (per lcm(TP, EP x ETP)
ranks with `experts_within_node`), so a TP group never spans nodes; where the workers hold resources (GPUs, a
test's fake GPU) the layout's DP is reduced to what the cluster's nodes hold in such bundles, and a layout whose
model-parallel part (TP x PP x CP) the cluster cannot hold is refused with the reason.

On a machine without GPUs the figures come from a scaled-down proxy model (source
"megatron-cpu-proxy"): they show that the layout runs and how its memory terms scale, never GPU times.
Heavy imports (ray, torch, megatron) happen inside methods; the object is cheap to pickle into Tune trials.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar, Literal

from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.measurement import Measurement, Source, Status
from trainers.proxy import ProxyPlan, plan_proxy

__all__ = [
    "MegatronBackend", "ensure_ray", "default_max_workers", "expected_groups", "expert_folding_violation",
]

WORKER_RSS_BYTES = 700 * 1024**2  # one worker with torch + megatron-core and a tiny model, with headroom
MAX_CPU_WORKERS = 8


def default_max_workers() -> int:
    """CPU workers this machine holds: available memory / per-worker footprint, at most MAX_CPU_WORKERS."""
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 4
    return max(1, min(MAX_CPU_WORKERS, int(available * 0.6) // WORKER_RSS_BYTES))


def ensure_ray(temp_dir: str | None = None, num_cpus: int | None = None) -> None:
    """Start a local Ray unless one is running already: quiet, no dashboard, every port on 127.0.0.1 and Ray's
    token auth on (`search_spaces.ray_session.start_local`, the one way autotune starts Ray)."""
    import ray

    if ray.is_initialized():
        return
    from search_spaces.ray_session import start_local

    temp_dir = temp_dir or os.environ.get("RAY_TMPDIR") or os.path.join(tempfile.gettempdir(), "autotune-ray")
    os.makedirs(temp_dir, exist_ok=True)
    start_local(num_cpus=num_cpus or os.cpu_count() or 2, temp_dir=temp_dir)


def expected_groups(layout: Layout) -> dict[str, int]:
    """Group sizes megatron-core must form for `layout` (the layout's own arithmetic)."""
    return {"world": layout.world_size, "tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp_size, "cp": layout.cp,
            "dp": layout.dp, "ep": layout.ep, "etp": layout.expert_tp, "expert_dp": layout.expert_dp}


def expert_folding_violation(layout: Layout) -> str:
    """megatron-core's parallel folding needs world size % (pp * ep * etp) == 0 (parallel_state.py)."""
    world, need = layout.world_size, layout.pp * layout.ep * layout.expert_tp
    if world % need:
        return (f"world_size ({world}) is not divisible by pipeline_model_parallel_size * expert_model_parallel_size "
                f"* expert_tensor_parallel_size ({layout.pp} * {layout.ep} * {layout.expert_tp} = {need}).")
    return ""


def _cluster_gpus() -> int:
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


def _ranks_held(ranks_per_bundle: int, per_rank: dict[str, float]) -> int:
    """Ranks the cluster's alive nodes hold in whole bundles of `ranks_per_bundle` ranks (each rank `per_rank`)."""
    import ray

    from trainers.placement import alive_nodes, ranks_held

    return ranks_held(alive_nodes(ray.nodes()), ranks_per_bundle=ranks_per_bundle, per_rank=per_rank)


@dataclass(frozen=True, kw_only=True)
class MegatronBackend:
    """Runs each layout as a short megatron-core job on Ray workers kept alive across trials."""

    name: ClassVar[str] = "megatron"
    max_workers: int | None = None  # None: what this machine holds (CPU) or the cluster's GPUs
    warmup_steps: int = 1  # the first warm-up step also measures saved activations
    timed_steps: int = 3
    timeout_s: float = 300.0
    reuse_workers: bool = True
    precision: Literal["bf16", "fp32"] = "bf16"
    cpus_per_worker: float = 0.0  # CPU reserved per worker actor (0: do not compete with Tune trials)
    microbatches: int | None = None  # per step on the proxy; None: the layout's own, capped (see proxy)
    proxy_layers_per_virtual_stage: int = 1
    proxy_seq_length: int = 64
    ray_temp_dir: str | None = None
    # extra Ray resources each worker's placement-group bundle holds, e.g. {"fake_gpu": 1} on a test cluster
    # whose raylets advertise that resource: the workers then spread over the nodes as a multi-node job's do
    worker_resources: tuple[tuple[str, float], ...] = ()
    experts_within_node: bool = False  # also keep each EP x ETP group on one node (the space's --experts-within-node)
    placement_timeout_s: float = 600.0  # how long a group that fits the cluster waits for resources others hold

    def ranks_per_bundle(self, layout: Layout) -> int:
        from trainers.placement import ranks_per_bundle

        return ranks_per_bundle(tp=layout.tp, ep=layout.ep, etp=layout.expert_tp,
                                experts_within_node=self.experts_within_node)

    def plan(self, job: Job, layout: Layout, *, use_gpu: bool, max_workers: int) -> ProxyPlan:
        return plan_proxy(job.model, layout, job.training, max_workers=max_workers,
                          scale_model=not use_gpu, microbatches=self.microbatches,
                          layers_per_virtual_stage=self.proxy_layers_per_virtual_stage,
                          seq_length=self.proxy_seq_length)

    def job_config(self, plan: ProxyPlan) -> Any:
        from trainers.megatron_job import JobConfig

        return JobConfig(model=plan.model, layout=plan.layout, seq_length=plan.training.seq_length,
                         num_microbatches=plan.num_microbatches, precision=self.precision,
                         warmup_steps=max(1, self.warmup_steps), timed_steps=self.timed_steps)

    def _device(self, layout: Layout) -> tuple[bool, int, str]:
        """(on GPUs, workers at most, why the cluster can never hold the layout's model-parallel part or '')."""
        gpus = _cluster_gpus()
        if gpus > 0 and layout.tp * layout.pp * layout.cp <= gpus:
            per_rank = {"GPU": 1.0}
            held = _ranks_held(self.ranks_per_bundle(layout), per_rank)
            return True, min(held, self.max_workers or held), self._refusal(layout, per_rank, held)
        workers = self.max_workers or default_max_workers()
        if not self.worker_resources:
            return False, workers, ""
        # a test cluster's fake GPUs: as many ranks as its nodes hold in whole bundles
        per_rank = dict(self.worker_resources)
        held = _ranks_held(self.ranks_per_bundle(layout), per_rank)
        return False, min(workers, held), self._refusal(layout, per_rank, held)

    def _refusal(self, layout: Layout, per_rank: dict[str, float], held: int) -> str:
        """Why the cluster's nodes can never hold TP x PP x CP ranks in bundles of `ranks_per_bundle`, or ''."""
        import ray

        from trainers.placement import GroupPlacement, alive_nodes, refusal

        k = self.ranks_per_bundle(layout)
        need = math.lcm(layout.tp * layout.pp * layout.cp, k)
        if held >= need:
            return ""
        placement = GroupPlacement(world=need, ranks_per_bundle=k, per_rank=tuple(sorted(per_rank.items())))
        return refusal(placement, alive_nodes(ray.nodes()))

    def evaluate(self, job: Job, layout: Layout) -> Measurement:
        ensure_ray(self.ray_temp_dir)
        use_gpu, max_workers, refused = self._device(layout)
        source: Source = "megatron-gpu" if use_gpu else "megatron-cpu-proxy"
        folding = expert_folding_violation(layout)
        if folding:
            return Measurement(layout=layout, status="invalid", source=source, reason=folding, violations=(folding,),
                               extra={"failure": "layout"})
        if refused:
            return Measurement(layout=layout, status="failed", source=source,
                               reason=f"cannot be placed on this cluster: {refused}", extra={"failure": "placement"})
        try:
            plan = self.plan(job, layout, use_gpu=use_gpu, max_workers=max_workers)
        except ValueError as e:
            return Measurement(layout=layout, status="failed", source=source, reason=f"cannot profile here: {e}",
                               extra={"failure": "placement"})
        outcome = self.run_plan(plan, use_gpu=use_gpu)
        return measurement_from_outcome(layout, plan, outcome, source=source, precision=self.precision)

    def run_plan(self, plan: ProxyPlan, *, use_gpu: bool) -> Any:
        from trainers.fresh_workers import run_fresh
        from trainers.worker_pool import run_pooled

        cfg = self.job_config(plan)
        runner = run_pooled if self.reuse_workers else run_fresh
        kwargs: dict[str, Any] = {"world_size": plan.world_size, "use_gpu": use_gpu, "timeout_s": self.timeout_s}
        if self.reuse_workers or self.cpus_per_worker > 0:
            kwargs["cpus_per_worker"] = self.cpus_per_worker
        if self.reuse_workers:
            kwargs.update(ranks_per_bundle=self.ranks_per_bundle(plan.layout),
                          placement_timeout_s=self.placement_timeout_s)
            if self.worker_resources:
                kwargs["resources"] = dict(self.worker_resources)
        return runner(cfg, **kwargs)

    def hardware(self) -> dict[str, Any]:
        """What this cluster at hand runs on: {"use_gpu", "nodes", "gpus_per_node", "workers"} (on CPU: one node of
        `max_workers` proxy ranks, or what the machine holds)."""
        ensure_ray(self.ray_temp_dir)
        import ray

        from trainers.placement import alive_nodes

        gpus = [int(n.get("GPU", 0)) for n in alive_nodes(ray.nodes())]
        with_gpus = [g for g in gpus if g > 0]
        if with_gpus:
            per_node = min(with_gpus)
            workers = min(sum(with_gpus), self.max_workers or sum(with_gpus))
            return {"use_gpu": True, "nodes": max(1, workers // per_node), "gpus_per_node": min(per_node, workers),
                    "workers": workers}
        workers = self.max_workers or default_max_workers()
        return {"use_gpu": False, "nodes": 1, "gpus_per_node": workers, "workers": workers}

    def profile_collectives(self, sizes: tuple[int, ...], *, world_size: int, iterations: int = 5) -> dict[str, Any]:
        """Time all-reduce, all-gather, all-to-all and send/recv of each size over `world_size` ranks
        (`trainers.collectives`), on the workers the profiling jobs run on (`run_plan`'s: the kept-alive pool, or fresh
        Ray Train workers). Returns {"status", "reason", "timings": [...], "source"}."""
        from trainers.collectives import CollectivesConfig
        from trainers.fresh_workers import run_fresh
        from trainers.worker_pool import run_pooled

        ensure_ray(self.ray_temp_dir)
        use_gpu = bool(self.hardware()["use_gpu"])
        cfg = CollectivesConfig(sizes=tuple(int(s) for s in sizes), iterations=iterations)
        kwargs: dict[str, Any] = {"world_size": world_size, "use_gpu": use_gpu, "timeout_s": self.timeout_s}
        if self.reuse_workers:
            kwargs.update(cpus_per_worker=self.cpus_per_worker, placement_timeout_s=self.placement_timeout_s)
            if self.worker_resources:
                kwargs["resources"] = dict(self.worker_resources)
        outcome = (run_pooled if self.reuse_workers else run_fresh)(cfg, **kwargs)
        source = "megatron-gpu" if use_gpu else "megatron-cpu-proxy"
        if outcome.status != "ok" or not outcome.ranks:
            return {"status": outcome.status if outcome.status != "ok" else "failed",
                    "reason": outcome.reason or "no rank reported", "timings": [], "source": source}
        # every rank timed the same calls between barriers: the slowest rank's figure is the collective's
        by_rank = [r["timings"] for r in outcome.ranks]
        timings = [{**calls[0], "seconds": max(c["seconds"] for c in calls)} for calls in zip(*by_rank, strict=True)]
        return {"status": "ok", "reason": "", "timings": timings, "source": source}

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """The search's worker pool for the duration of the block (`trainers.worker_pool.open_pool`): owned by the
        calling driver, in its Ray namespace, ended after."""
        from trainers.worker_pool import open_pool, shutdown_pool

        if self.reuse_workers:
            ensure_ray(self.ray_temp_dir)  # autotune's own local Ray (quiet, loopback only) unless one runs already
            open_pool()
        try:
            yield
        finally:
            if self.reuse_workers:
                shutdown_pool()

    def with_options(self, **changes: Any) -> MegatronBackend:
        return replace(self, **changes)


# --- reports -> Measurement -----------------------------------------------------------------------
def _step_times(ranks: list[dict[str, Any]]) -> list[float]:
    """Per timed step, the slowest rank's time (ranks run in lockstep; the slowest sets the pace)."""
    per_rank = [r["step_times_s"] for r in ranks]
    return [max(times) for times in zip(*per_rank, strict=True)]  # same steps on every rank


def _losses(ranks: list[dict[str, Any]]) -> list[float]:
    last_stage = [r for r in ranks if any(x is not None for x in r["losses"])]
    return [] if not last_stage else [float(x) for x in min(last_stage, key=lambda r: r["rank"])["losses"]]


def _group_mismatch(ranks: list[dict[str, Any]], layout: Layout) -> str:
    want = expected_groups(layout)
    for r in ranks:
        got = r["groups"]
        diff = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
        if diff:
            return f"rank {r['rank']}: megatron-core formed groups {got}, the layout needs {want} (differs: {diff})"
    return ""


def measurement_from_outcome(layout: Layout, plan: ProxyPlan, outcome: Any, *, source: Source,
                             precision: str) -> Measurement:
    extra: dict[str, Any] = {
        "proxy": plan.describe(), "run_layout": str(plan.layout), "dp_reduction": plan.dp_reduction,
        "precision": precision, "fresh_workers": outcome.fresh_workers, "startup_s": outcome.startup_s,
        "trial_wall_s": outcome.wall_s, "worker_nodes": list(getattr(outcome, "nodes", ()) or ()),
        "timing_note": "CPU proxy (gloo) figures; not a GPU prediction" if source == "megatron-cpu-proxy" else "",
        "proxy_plan": plan,  # what ran (model, layout, batch): the caller compares the analytic model with it
        "ran_training": asdict(plan.training),  # the same batch and switches, as plain data
    }
    if outcome.status != "ok":
        extra["failure"] = getattr(outcome, "failure", "") or "layout"
        return Measurement(layout=layout, status=outcome.status, source=source, reason=outcome.reason, extra=extra)
    ranks = sorted(outcome.ranks, key=lambda r: r["rank"])
    losses = _losses(ranks)
    steps = _step_times(ranks)
    heaviest = max(ranks, key=lambda r: r["memory"].get("allocator_peak", r["memory"]["total"]))
    extra.update(groups=ranks[0]["groups"], losses=losses, step_times_s=steps,
                 memory_per_rank=[{"rank": r["rank"], "pp_rank": r["pp_rank"], **r["memory"]} for r in ranks],
                 build_s=max(r["build_s"] for r in ranks), job_s=max(r.get("job_s", 0.0) for r in ranks))
    status: Status = "ok"
    reason = _group_mismatch(ranks, plan.layout)
    if reason:
        status = "failed"
    elif not losses or not all(math.isfinite(x) for x in losses):
        status, reason = "failed", f"non-finite or missing loss: {losses}"
    if status != "ok":
        extra["failure"] = "layout"
    median = statistics.median(steps) if steps else None
    memory = {k: heaviest["memory"][k] for k in ("weights", "gradients", "optimizer", "activations")}
    peak = heaviest["memory"].get("allocator_peak", heaviest["memory"]["total"])
    return Measurement(
        layout=layout, status=status, source=source, reason=reason,
        memory_bytes=peak, memory=memory,
        step_time_s=median,
        time={"step_median": median or 0.0, "step_min": min(steps, default=0.0), "step_max": max(steps, default=0.0),
              "step_stdev": statistics.pstdev(steps) if len(steps) > 1 else 0.0},
        tokens_per_s_per_gpu=(plan.tokens_per_step / median / plan.world_size) if median else None,
        extra=extra,
    )

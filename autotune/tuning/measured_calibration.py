"""What the megatron backend measured, as a calibration file: a search's GPU trials, or one node profiled for many.

Two ways in, one fit (`autotune.tuning.calibrate.fit_factors`) and one file format
(`autotune.cost.calibration_file`):

- **A measured search** (`run_search` with `--backend megatron` on GPUs) ends with `calibration.yaml` in its folder,
  fitted on its own trials (`search_runs`): each ok trial measured the real model at the layout that ran (DP may be
  smaller than the candidate's, `extra["run_layout"]`) on the GPUs that ran it, with the batch and switches of
  `extra["ran_training"]`. The next search starts calibrated with `--calibration <folder>/calibration.yaml`. A CPU
  proxy search writes none: its timings are of a scaled-down model on gloo.
- **Profile one node, plan for a thousand** (`calibrate --profile`; `profile_node`): for a target cluster larger
  than the GPUs at hand, each candidate's exact per-rank shape (`stage_probe`: one pipeline stage's layers with the
  layout's TP, CP, ETP, micro-batch and local experts, PP 1, the fewest data-parallel ranks megatron-core's expert
  folding allows, on one node) runs as a short megatron-core job on Ray Train workers, and the collectives the
  cluster at hand can run (all-reduce, all-gather, all-to-all, send/recv over every rank, across its nodes) are
  timed (`trainers.collectives`). Both join the fit: each probe as a run of its own job (`Run`), each collective
  as a `Timing` the cost model's `autotune.cost.comm` predicts. On a machine without GPUs the same path runs on
  the CPU proxy; the file then says `source: megatron-cpu-proxy` and no verb applies it.

Only what ran is fitted: the backend trains in BF16 (`trainers.megatron_job`), so `compute` scales the BF16 GEMMs;
an FP8 or NVFP4 target keeps the published fit's fractions for its own GEMMs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from autotune.cost.calibration_file import PROXY_SOURCE, CalibrationFile
from autotune.cost.comm import all_to_all_s, group_collective_s, p2p_s
from autotune.cost.efficiency import DEFAULT_CALIBRATION, Calibration
from autotune.tuning.calibrate import Fit, Run, Timing, fit_factors
from search_spaces.cluster import ClusterSpec
from search_spaces.job import Job
from search_spaces.layout import Layout, parse_layout
from search_spaces.rules import check
from search_spaces.training import TrainingSpec

__all__ = ["StageProbe", "stage_probe", "search_runs", "collective_timings", "profile_node", "Profile",
           "calibration_file", "top_candidates", "run_profile", "PROBE_MICROBATCHES", "COLLECTIVE_BYTES"]

PROBE_MICROBATCHES = 4  # micro-batches per probe step: a stage's steady work, short enough to profile many
COLLECTIVE_BYTES = {"gpu": (64 * 2**20, 256 * 2**20), "cpu": (1 * 2**20, 4 * 2**20)}  # per collective (module doc)
MEASURED_GPU = "megatron-gpu"


@dataclass(frozen=True, kw_only=True, slots=True)
class StageProbe:
    """A candidate layout's per-rank shape as a job one node runs (module docstring)."""

    candidate: Layout
    job: Job  # one stage's layers, on one node of the target's GPU
    layout: Layout  # PP 1, the candidate's TP / CP / ETP / micro-batch / switches, the fewest DP ranks
    note: str = ""  # what differs from the candidate's ranks, if anything


def _node(cluster: ClusterSpec, gpus: int) -> ClusterSpec:
    """`cluster`'s GPU and links, as one node of `gpus` GPUs (inside one NVLink domain)."""
    return replace(cluster, nodes=1, gpus_per_node=gpus, nvlink_domain_gpus=None)


def stage_probe(job: Job, layout: Layout, gpus_per_node: int) -> StageProbe:
    """The probe of `layout` on a node of `gpus_per_node` GPUs; ValueError (one line) when it cannot be built.

    Layers: the heaviest pipeline stage's count (`Layout.stage_layer_counts`), all MoE layers when PP > 1 (the
    leading dense layers and MTP sit on the end stages). Ranks: TP x CP x DP' with DP' the smallest that makes
    TP x CP x DP' a multiple of EP x ETP (`trainers.backend.expert_folding_violation`). When that exceeds the node,
    EP halves and the model keeps the candidate's experts per rank (num_experts / EP), so every rank holds and
    computes what the candidate's does; only the all-to-all stays inside the node.
    """
    model, tp_cp = job.model, layout.tp * layout.cp
    if model.is_hybrid:
        raise ValueError(f"{layout}: {model.name} is a hybrid Mamba model, which the megatron backend cannot profile "
                         f"(it builds GPT models only)")
    if tp_cp > gpus_per_node:
        raise ValueError(f"{layout}: TP x CP = {tp_cp} ranks do not fit one node of {gpus_per_node} GPUs at hand")
    layers = max(layout.stage_layer_counts(model.num_layers))
    moe, ep, note = model.moe, layout.ep, ""
    etp = layout.expert_tp
    if moe is not None:
        local = moe.num_experts // layout.ep
        while ep > 1 and math.lcm(tp_cp, ep * etp) > gpus_per_node:
            ep //= 2
        if math.lcm(tp_cp, ep * etp) > gpus_per_node:
            raise ValueError(f"{layout}: ETP {etp} with TP x CP {tp_cp} does not fit one node of {gpus_per_node} "
                             f"GPUs at hand")
        if ep != layout.ep:
            note = (f"EP {layout.ep} -> {ep} on one node, {local} local expert{'s' if local != 1 else ''} per rank "
                    f"as the candidate has")
        moe = replace(moe, num_experts=local * ep, topk=min(moe.topk, local * ep),
                      first_dense_layers=moe.first_dense_layers if layout.pp == 1 else 0)
    world = math.lcm(tp_cp, ep * etp)
    probe_model = replace(model, num_layers=layers, moe=moe,
                          mtp_num_layers=model.mtp_num_layers if layout.pp == 1 else 0)
    probe_layout = replace(layout, pp=1, vpp=None, ep=ep, dp=world // tp_cp, first_stage_layers=None,
                           last_stage_layers=None, embedding_loss_split=False, pipeline_layout=None)
    training = replace(job.training, global_batch_size=PROBE_MICROBATCHES * layout.mbs * probe_layout.dp)
    probe_job = Job(model=probe_model, cluster=_node(job.cluster, world), training=training)
    broken = check(probe_job, probe_layout)
    if broken:
        raise ValueError(f"{layout}: its one-node probe {probe_layout} breaks {broken[0].rule}: {broken[0].message}")
    return StageProbe(candidate=layout, job=probe_job, layout=probe_layout, note=note)


def _ran_training(data: Any) -> TrainingSpec | None:
    """The TrainingSpec a measurement's `extra["ran_training"]` records (lists back to tuples), or None."""
    if not isinstance(data, dict):
        return None
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    try:
        return TrainingSpec(**fields)
    except (TypeError, ValueError):
        return None


def search_runs(job: Job, records: Sequence[Any]) -> tuple[list[Run], str]:
    """(a `Run` per ok GPU trial of a measured search, '' or why there is none). `records`: `TrialRecord`s."""
    runs, proxy = [], 0
    for r in records:
        m = r.measurement
        if m.status != "ok" or not m.step_time_s:
            continue
        if m.source != MEASURED_GPU:
            proxy += m.source == "megatron-cpu-proxy"
            continue
        training = _ran_training(m.extra.get("ran_training"))
        run_layout = m.extra.get("run_layout")
        if training is None or not run_layout:
            continue
        # trainers.megatron_job builds none of the searched switches beyond the sizes (no CUDA graphs, EP overlap,
        # Megatron-FSDP or activation offload reach its TransformerConfig), so the run is timed as it ran: without
        # them (and a graph saving it never measured is not credited by the file it writes)
        layout = replace(parse_layout(str(run_layout)), cuda_graphs="none", ep_overlap=False, fsdp=False,
                         offload_layers=0)
        nodes = len(set(m.extra.get("worker_nodes") or ())) or 1
        per_node = layout.world_size // nodes if layout.world_size % nodes == 0 else layout.world_size
        cluster = replace(job.cluster, nodes=layout.world_size // per_node, gpus_per_node=per_node,
                          nvlink_domain_gpus=None if per_node != job.cluster.gpus_per_node
                          else job.cluster.nvlink_domain_gpus)
        runs.append(Run(job=Job(model=job.model, cluster=cluster, training=training), layout=layout,
                        step_time_s=float(m.step_time_s), label=f"trial {r.number}: {r.layout}"))
    if runs:
        return runs, ""
    if proxy:
        return [], (f"no calibration written: the {proxy} measured trials ran on the CPU proxy, whose timings are of "
                    f"a scaled-down model on gloo, not of the GPUs")
    return [], "no calibration written: no trial measured a step on GPUs"


def _collective_s(name: str, nbytes: float, cluster: ClusterSpec, cal: Calibration) -> float:
    """The cost model's time of one `trainers.collectives` call over every rank of `cluster` (its docstring)."""
    n = cluster.world_size
    link = cluster.inter_node if cluster.nodes > 1 else cluster.intra_node
    if name == "all_reduce":  # reduce-scatter then all-gather
        return 2 * group_collective_s(nbytes, n, 1, cluster, cal)
    if name == "all_gather":
        return group_collective_s(nbytes, n, 1, cluster, cal)
    if name == "all_to_all":
        return all_to_all_s(nbytes, n, link, cal)
    if name == "send_recv":
        return p2p_s(nbytes, link, cal)
    raise ValueError(f"unknown collective {name!r}")


def collective_timings(timings: Sequence[dict[str, Any]], cluster: ClusterSpec) -> list[Timing]:
    """Each measured collective (`MegatronBackend.profile_collectives`' timings) with the cost model's prediction."""
    out = []
    for t in timings:
        if t["world"] != cluster.world_size or not t["seconds"] > 0:
            continue

        def predict(cal: Calibration, name: str = t["collective"], nbytes: float = float(t["bytes"])) -> float:
            return _collective_s(name, nbytes, cluster, cal)
        out.append(Timing(label=f"{t['collective']} {t['bytes'] / 2**20:.0f} MiB over {t['world']} ranks",
                          seconds=float(t["seconds"]), predict=predict))
    return out


def top_candidates(job: Job, k: int) -> list[Layout]:
    """The analytic ranking's best `k` layouts of `job` in the search's default space (what `--profile` profiles
    without `--layout`); ValueError when none fits."""
    from autotune.tuning.analytic_pass import analytic_pass
    from search_spaces.space import DEFAULT_SPACE, feasible_space

    if k < 1:
        raise ValueError(f"--top must be at least 1, but got {k}.")
    answer = analytic_pass(job, feasible_space(job, DEFAULT_SPACE))
    rows = answer.ranked_rows(k)
    if not len(rows):
        raise ValueError(f"no layout of {job.model.name} fits {job.world_size} x {job.cluster.gpu.name} by the model: "
                         f"nothing to profile.")
    return [answer.layout(int(i)) for i in rows]


@dataclass(frozen=True, kw_only=True)
class Profile:
    """What `profile_node` measured and fitted."""

    source: str  # "megatron-gpu" or "megatron-cpu-proxy"
    hardware: dict[str, Any]
    probes: tuple[tuple[StageProbe, Any], ...]  # (probe, its Measurement)
    skipped: tuple[tuple[Layout, str], ...]  # candidates without a probe here, and why
    runs: tuple[Run, ...]
    timings: tuple[Timing, ...]
    collectives: dict[str, Any]
    fit: Fit | None
    reason: str = ""  # why there is no fit

    def summary(self) -> dict[str, Any]:
        """What was measured, beside the predictions before and after, as plain data (a file's provenance, --json)."""
        fit = self.fit
        fitted = {r.label: (b, a) for r, b, a in zip(self.runs, fit.before, fit.after, strict=True)} if fit else {}
        probes = []
        for probe, m in self.probes:
            before_after = fitted.get(str(probe.candidate))
            row: dict[str, Any] = {"candidate": str(probe.candidate), "probe": str(probe.layout),
                                   "layers": probe.job.model.num_layers, "note": probe.note, "status": m.status,
                                   "reason": m.reason}
            if before_after:
                row.update(step_time_s=round(float(m.step_time_s), 6), predicted_before_s=round(before_after[0], 6),
                           predicted_after_s=round(before_after[1], 6))
            probes.append(row)
        probed = {str(p.candidate) for p, _ in self.probes}
        probes += [{"candidate": str(c), "reason": why} for c, why in self.skipped if str(c) not in probed]
        before = fit.timings_before if fit else (math.nan,) * len(self.timings)
        after = fit.timings_after if fit else (math.nan,) * len(self.timings)
        collectives = [{"label": t.label, "seconds": round(t.seconds, 9), "predicted_before_s": round(b, 9),
                        "predicted_after_s": round(a, 9)} for t, b, a in zip(self.timings, before, after, strict=True)]
        return {"source": self.source, "hardware": self.hardware, "probes": probes, "collectives": collectives,
                "collectives_status": self.collectives.get("status"),
                "collectives_reason": self.collectives.get("reason", ""),
                "factors": dict(fit.factors) if fit else None, "at_bound": list(fit.at_bound) if fit else [],
                "reason": self.reason}

    def calibration(self, job: Job, path: str = "") -> CalibrationFile | None:
        """The calibration file of the fit (None without one), its provenance the target job and `summary()`."""
        if self.fit is None:
            return None
        import datetime

        import autotune

        provenance = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                      "autotune_version": autotune.__version__, "relative_to": "DEFAULT_CALIBRATION of that version",
                      "from": "calibrate --profile",
                      "target": {"model": job.model.name, "gpu": job.cluster.gpu.name, "nodes": job.cluster.nodes,
                                 "gpus_per_node": job.cluster.gpus_per_node}, **self.summary()}
        return calibration_file(self.fit, source=self.source, provenance=provenance, path=path)


def profile_node(job: Job, candidates: Sequence[Layout], backend: Any, *,
                 say: Callable[[str], None] = lambda text: None,
                 base: Calibration = DEFAULT_CALIBRATION) -> Profile:
    """Profile each candidate's stage probe and the cluster's collectives on `backend` (a `MegatronBackend`), and
    fit the factors (module docstring). A probe that fails is reported, never raised."""
    hardware = backend.hardware()
    source = MEASURED_GPU if hardware["use_gpu"] else PROXY_SOURCE
    probes, skipped, runs = [], [], []
    for layout in candidates:
        try:
            probe = stage_probe(job, layout, int(hardware["gpus_per_node"]))
        except ValueError as e:
            skipped.append((layout, str(e)))
            continue
        say(f"profiling {layout} as {probe.layout} ({probe.job.model.num_layers} layers"
            f"{'; ' + probe.note if probe.note else ''})")
        m = backend.evaluate(probe.job, probe.layout)
        probes.append((probe, m))
        plan = m.extra.get("proxy_plan")
        if m.status != "ok" or plan is None or not m.step_time_s:
            skipped.append((layout, f"its probe {m.status}: {m.reason}"[:300]))
            continue
        ran = Job(model=plan.model, cluster=_node(job.cluster, plan.world_size), training=plan.training)
        runs.append(Run(job=ran, layout=plan.layout, step_time_s=float(m.step_time_s), label=str(layout)))
    at_hand = replace(job.cluster, nodes=int(hardware["nodes"]), gpus_per_node=int(hardware["gpus_per_node"]),
                      nvlink_domain_gpus=None)
    sizes = COLLECTIVE_BYTES["gpu" if hardware["use_gpu"] else "cpu"]
    say(f"timing all-reduce, all-gather, all-to-all and send/recv over {at_hand.world_size} ranks")
    collectives = backend.profile_collectives(sizes, world_size=at_hand.world_size)
    timings = collective_timings(collectives.get("timings", ()), at_hand)
    fit, reason = None, ""
    if runs or timings:
        fit = fit_factors(runs, base, timings=timings, arch=job.cluster.gpu.arch)
    else:
        reason = "nothing was measured: every probe failed and no collective ran"
    return Profile(source=source, hardware=dict(hardware), probes=tuple(probes), skipped=tuple(skipped),
                   runs=tuple(runs), timings=tuple(timings), collectives=collectives, fit=fit, reason=reason)


def run_profile(job: Job, candidates: Sequence[Layout], backend: Any, *,
                say: Callable[[str], None] = lambda text: None) -> Profile:
    """`profile_node` inside the backend's worker session (`MegatronBackend.session`); a Ray this call started is
    shut down after (as a search's own is), one that was running stays."""
    import ray

    started = not ray.is_initialized()
    try:
        with backend.session():
            return profile_node(job, candidates, backend, say=say)
    finally:
        if started and ray.is_initialized():
            ray.shutdown()


def calibration_file(fit: Fit, *, source: str, provenance: dict[str, Any], path: str = "") -> CalibrationFile:
    """The calibration file of `fit` (what a search or a profile writes)."""
    return CalibrationFile(gpu_arch=fit.arch, factors=fit.factors, at_bound=fit.at_bound, precisions=fit.precisions,
                           graphs=fit.graphs,
                           source=source, provenance=provenance, path=path)

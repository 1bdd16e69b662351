"""Step time of many layouts of one job, as a visible sum: the one step-time assembly.

    step = m * stage_max + bubble + m * p2p + dp_exposed + offload + optimizer + overhead

m = GBS / (b * DP) micro-batches; stage_* is one micro-batch's forward + backward (+ recompute) through a pipeline
stage: its dense and MoE layers (`autotune/cost/layer_time.py`, `moe_time.py`, each pass max(GPU, host)), the
embedding on the first stage and the logits and loss on the last. The heaviest stage paces the steady state; the
others fill and drain the pipeline (`throughput.pipeline_bubble_s`). DP communication overlaps with the backward
(gradient reduce-scatter) and the forward (parameter all-gather) when the training spec turns the overlap on; what
cannot hide stays exposed (`throughput.exposed_dp_s`, `fsdp_exposed_s`, `offload_exposed_s`).

Every term is a function of `autotune/cost/throughput.py` with its source, computed once per distinct value of the
layout fields it reads (`autotune/cost/groups.py`); this module only adds them up, on arrays of layouts. Estimating
one layout is the one-row case (`autotune.cost.score.estimate_time`). Every fitted or assumed constant is in
`autotune/cost/efficiency.py`; see docs/throughput-model.md for the terms, their sources and the fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from autotune.cost.efficiency import Calibration
from autotune.cost.flops import model_flops_per_step
from autotune.cost.groups import Rows, gather, group
from autotune.cost.memory import offload_host_bytes
from autotune.cost.placement import bf16_stage_layers, heaviest_stage, stage_params
from autotune.cost.throughput import (
    BF16_KINDS,
    LAYER_KEYS,
    LAYER_PARTS,
    LAYER_VECTOR,
    TIME_KEYS,
    bf16_job,
    dp_comm_s,
    exposed_dp_s,
    fsdp_comm_s,
    fsdp_exposed_s,
    fsdp_units,
    host_link_bytes_per_s,
    layer_vector,
    offload_exposed_s,
    optimizer_step_s,
    pipeline_bubble_s,
    pipeline_p2p_s,
    unpaired_share,
)
from search_spaces.job import Job
from search_spaces.layout import CUDA_GRAPH_CHOICES, RECOMPUTE_CHOICES

__all__ = ["step_times"]

FULL = RECOMPUTE_CHOICES.index("full")
_NO_BF16 = (0, 0, 0, 0, 0)
# the kinds of layer a stage counts (`LayerTimes`' parts; a GPT model's Mamba and attention-only parts are zero),
# and their BF16 twins in a low-precision run (the BF16 layers' times less the run's, `placement.bf16_stage_layers`)
PARTS = LAYER_PARTS
BF16_PARTS = tuple(f"bf16_{part}" for part in BF16_KINDS)


@dataclass(frozen=True, slots=True)
class _Layers:
    """One micro-batch's forward + backward through each kind of layer, per row: `terms[part][key]` by LAYER_KEYS,
    `total[part]` their sum, `wall[part]["fwd" | "bwd"]` the passes' walls (what DP traffic hides under); the last
    stage's output layer and loss (`output`, `output_total`) and the first stage's embedding."""

    terms: dict[str, dict[str, np.ndarray]]
    total: dict[str, np.ndarray]
    wall: dict[str, dict[str, np.ndarray]]
    output: dict[str, np.ndarray]
    output_total: np.ndarray
    embedding: np.ndarray


def _layers(job: Job, t: Rows, cal: Calibration, m: np.ndarray) -> _Layers:
    """`throughput.layer_times` once per distinct (TP, CP, EP, ETP, MBS, SP, recompute, graphs, EP overlap), spread
    to the rows; with the EP overlap, the share of chunk steps it cannot pair (`throughput.unpaired_share`) takes
    the unpaired layer times."""
    table, n = t.table, t.n
    full = table.recompute == FULL
    chunks = np.where(full, table.pp * t.vpp, 0) if job.training.recompute_num_layers else np.zeros(n, np.int64)
    layer = group(table.tp, table.cp, table.ep, t.etp, table.mbs, table.sp & (table.tp > 1), table.recompute, chunks,
                  table.cuda_graphs, table.ep_overlap)
    overlap = table.ep_overlap & (job.model.moe is not None)
    share = unpaired_share(overlap, table.pp, t.vpp, m)
    paired_groups = np.flatnonzero(overlap[layer.first])
    mixed = np.flatnonzero(overlap)

    def spread(of_job: Job) -> dict[tuple[str, str], np.ndarray]:
        """Each `LAYER_VECTOR` figure of every row."""
        paired = np.array([layer_vector(of_job, t.layout(int(i)), cal) for i in layer.first], dtype=np.float64)
        alone = paired[paired_groups]  # a layout without the overlap is its own unpaired layout (its share is 0)
        for j, g in enumerate(paired_groups):
            alone[j] = layer_vector(of_job, replace(t.layout(int(layer.first[g])), ep_overlap=False), cal)
        out = {}
        for j, name in enumerate(LAYER_VECTOR):
            column = paired[:, j].copy()
            values = column[layer.inverse]
            if len(paired_groups):
                column[paired_groups] = alone[:, j]
                values[mixed] = (1 - share[mixed]) * values[mixed] + share[mixed] * column[layer.inverse[mixed]]
            out[name] = values
        return out

    run = spread(job)
    terms = {part: {k: run[part, k] for k in LAYER_KEYS} for part in PARTS}
    total = {part: _sum(terms[part]) for part in PARTS}
    wall = {part: {d: run[part, d] for d in ("fwd", "bwd")} for part in PARTS}
    twin = bf16_job(job, cal)
    if twin is not None:  # BF16 layers of a low-precision run: their layer times less the run's
        bf16 = spread(twin)
        for part, name in zip(BF16_KINDS, BF16_PARTS, strict=True):
            terms[name] = {k: bf16[part, k] - terms[part][k] for k in LAYER_KEYS}
            total[name] = _sum(terms[name])
            wall[name] = {d: bf16[part, d] - wall[part][d] for d in ("fwd", "bwd")}
    output = {k: run["output", k] for k in LAYER_KEYS}
    return _Layers(terms=terms, total=total, wall=wall, output=output, output_total=_sum(output),
                   embedding=run["embedding", ""])


def _sum(terms: dict[str, np.ndarray]) -> np.ndarray:
    """The terms' sum, added in LAYER_KEYS order."""
    out = np.zeros_like(terms[LAYER_KEYS[0]])
    for k in LAYER_KEYS:
        out = out + terms[k]
    return out


def _stage_kinds(stages: Sequence[Any], bf16: Sequence[tuple[int, ...]] = ()) -> list[tuple[Any, ...]]:
    """Distinct stages as (dense layers, MoE layers, MTP layers, Mamba layers, attention-only layers, their BF16
    layers by `BF16_KINDS` (five counts; `placement.bf16_stage_layers`), embedding, output, last stage index,
    count), the latest stage first: equal stages take equal time, and the pace is the latest of the slowest."""
    kinds: dict[tuple[Any, ...], list[int]] = {}
    for s in stages:
        key = (s.dense_layers, s.moe_layers, s.mtp_layers, s.mamba_layers, s.attention_layers,
               *(bf16[s.stage] if bf16 else _NO_BF16), s.has_embedding, s.has_output)
        entry = kinds.setdefault(key, [0, 0])
        entry[0], entry[1] = s.stage, entry[1] + 1
    return sorted(((*k, last, count) for k, (last, count) in kinds.items()), key=lambda k: -k[-2])


def _pace(job: Job, t: Rows, layers: _Layers) -> tuple[dict[str, np.ndarray], np.ndarray, list[Any]]:
    """(the slowest stage's layer counts by part, with `emb` and `out`; the pipeline bubble; each placement's
    stages): every distinct stage of each placement timed as the sum of its layers (`_Layers.total`)."""
    rows = np.arange(t.n)
    stage_lists = t.placement.values(lambda i: stage_params(job.model, t.layout(i)))
    counted = (*PARTS, *BF16_PARTS) if BF16_PARTS[0] in layers.total else PARTS
    bf16_lists = t.placement.values(lambda i: bf16_stage_layers(job, t.layout(i))) if counted != PARTS \
        else [()] * len(stage_lists)
    kinds = [_stage_kinds(s, b) for s, b in zip(stage_lists, bf16_lists, strict=True)]
    width = max(len(k) for k in kinds)
    pad = [k + [(0, 0, 0, 0, 0, *_NO_BF16, False, False, -1, 0)] * (width - len(k)) for k in kinds]
    names = (*PARTS, *BF16_PARTS, "emb", "out", "last", "count")
    per_group = {name: np.array([[row[j] for row in k] for k in pad]) for j, name in enumerate(names)}
    present = [part for part in counted if per_group[part].any()]  # a part no stage holds adds nothing
    kind = {name: per_group[name][t.placement.inverse] for name in (*present, "emb", "out", "last", "count")}
    stage_s = sum((kind[part] * layers.total[part][:, None] for part in present), np.zeros((t.n, width)))
    stage_s = np.where(kind["out"], stage_s + layers.output_total[:, None], stage_s)
    stage_s = np.where(kind["emb"], stage_s + layers.embedding[:, None], stage_s)
    slow = np.argmax(np.where(kind["last"] >= 0, stage_s, -np.inf), axis=1)
    pace = {name: kind[name][rows, slow] if name in kind else np.zeros(t.n, dtype=np.int64)
            for name in (*counted, "emb", "out")}
    bubble = pipeline_bubble_s((kind["count"] * stage_s).sum(axis=1), stage_s[rows, slow], t.vpp)
    return pace, bubble, stage_lists


def _data_parallel(job: Job, t: Rows, cal: Calibration, m: np.ndarray, stage_lists: list[Any],
                   windows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The DP (or Megatron-FSDP) traffic, activation offload and optimizer step of each row's heaviest stage, and
    what of them the passes' walls (`windows`) leave exposed: the `dp_comm`, `offload` and `optimizer` terms."""
    table, training = t.table, job.training
    heavy = [heaviest_stage(s) for s in stage_lists]
    heavy_ids: dict[tuple[int, int], int] = {}
    heavy_of = np.array([heavy_ids.setdefault((h.dense_params_per_gpu, h.expert_params_per_gpu), len(heavy_ids))
                         for h in heavy])[t.placement.inverse]
    dp = group(heavy_of, table.tp, table.ep, t.etp, table.dp, table.cp, table.dist_opt, table.fsdp)

    def dp_and_optimizer(i: int) -> tuple[float, ...]:
        layout, stage = t.layout(i), heavy[t.placement.inverse[i]]
        fsdp = fsdp_comm_s(job, layout, cal, stage) if layout.fsdp else (0.0, 0.0, 0.0)
        return (*dp_comm_s(job, layout, cal, stage), optimizer_step_s(job, layout, cal, stage), *fsdp,
                float(fsdp_units(stage)))

    dp_terms = dp.values(dp_and_optimizer)
    grads, param_gather, params, optimizer, ag_fwd, ag_bwd, rs, units = (gather([v[j] for v in dp_terms], dp)
                                                                         for j in range(8))
    fwd_window, bwd_window = windows["fwd"], windows["bwd"]
    zero1 = (exposed_dp_s(grads, bwd_window, training.overlap_grad_reduce, params, cal)
             + exposed_dp_s(param_gather, fwd_window, training.overlap_param_gather & table.dist_opt
                            & (not training.muon) & training.overlap_grad_reduce, params, cal))
    zero3 = m * fsdp_exposed_s(ag_fwd, ag_bwd, rs, units, fwd_window, bwd_window, cal)
    out = {"dp_comm": np.where(table.fsdp, zero3, zero1), "offload": np.zeros(t.n), "optimizer": optimizer}
    offloading = table.offload_layers > 0
    if offloading.any():
        off = group(table.tp, table.sp, table.cp, table.mbs, t.etp, table.recompute, table.cuda_graphs,
                    table.offload_layers, table.pp, t.vpp, m)
        host = gather(off.values(lambda i: offload_host_bytes(job, t.layout(i))), off)
        share = table.offload_layers / max(job.model.num_layers, 1)
        exposed = offload_exposed_s(host / host_link_bytes_per_s(job), share, fwd_window, bwd_window, cal)
        out["offload"] = np.where(offloading & (host > 0), m * exposed, 0.0)
    return out


def step_times(job: Job, t: Rows, cal: Calibration) -> dict[str, Any]:
    """The step time of every row, its terms, tokens/s with its band, TFLOP/s, MFU and the dominant term (module
    docstring): m micro-batches through the slowest stage, the bubble, the pipeline p2p, then DP, offload and
    optimizer.

    A row whose CUDA graphs no fitted run of its GPU generation used is timed as the nearest setting the fit saw
    (`Calibration.credited_graphs`), where that is slower; its band's upper edge keeps the model's own figure."""
    cal = cal.for_release(job.training.release)
    out = _assemble(job, t, cal)
    arch, offload = job.cluster.gpu.arch, t.table.offload_layers > 0
    graphs = np.array([[CUDA_GRAPH_CHOICES.index(cal.credited_graphs(arch, g, off)) for g in CUDA_GRAPH_CHOICES]
                       for off in (False, True)])[offload.astype(np.int64), t.table.cuda_graphs]
    rows = np.flatnonzero(graphs != t.table.cuda_graphs)
    if len(rows):
        credited = _assemble(job, Rows(t.table.take(rows).with_column("cuda_graphs", graphs[rows])), cal)
        slower = credited["step_time_s"] > out["step_time_s"][rows]
        rows, pick = rows[slower], np.flatnonzero(slower)
        high = out["tokens_per_s_per_gpu_high"][rows]
        for key in ("step_time_s", "tokens_per_s_per_gpu", "tokens_per_s_per_gpu_low", "tokens_per_s_per_gpu_high",
                    "tflops_per_gpu", "mfu", "dominant_time_index"):
            out[key][rows] = credited[key][pick]
        out["tokens_per_s_per_gpu_high"][rows] = high
        for key, values in out["breakdown"].items():
            values[rows] = credited["breakdown"][key][pick]
    for a in (*out["breakdown"].values(), *(v for v in out.values() if isinstance(v, np.ndarray))):
        a.flags.writeable = False
    return out


def _assemble(job: Job, t: Rows, cal: Calibration) -> dict[str, Any]:
    """`step_times` of every row at its own settings, `cal` already at the job's release (writable arrays)."""
    table, training, n = t.table, job.training, t.n
    m = np.maximum(table.num_microbatches(training.global_batch_size), 1)
    layers = _layers(job, t, cal, m)
    pace, bubble, stage_lists = _pace(job, t, layers)
    counted = [part for part in pace if part not in ("emb", "out")]
    breakdown = {key: m * (sum(pace[part] * layers.terms[part][key] for part in counted)
                           + np.where(pace["out"], layers.output[key], 0.0)) for key in LAYER_KEYS}
    breakdown["compute"] = np.where(pace["emb"], breakdown["compute"] + m * layers.embedding, breakdown["compute"])
    breakdown["pp_bubble"] = bubble
    p2p = group(table.pp, table.tp, table.cp, table.dp, table.mbs, t.vpp, table.sp, table.cuda_graphs)
    breakdown["pp_p2p"] = m * gather(p2p.values(lambda i: pipeline_p2p_s(job, t.layout(i), cal)), p2p)
    windows = {d: sum(pace[part] * layers.wall[part][d] for part in counted) for d in ("fwd", "bwd")}
    breakdown.update(_data_parallel(job, t, cal, m, stage_lists, windows))
    breakdown["overhead"] = np.full(n, cal.step_overhead_s)
    breakdown = {k: breakdown[k] for k in TIME_KEYS}

    step = breakdown[TIME_KEYS[0]]
    for key in TIME_KEYS[1:]:
        step = step + breakdown[key]
    world = table.world_size
    flops = model_flops_per_step(job.model, training)
    peak = job.cluster.gpu.peak_flops(training.precision)
    tokens = training.global_batch_size * training.seq_length / step / world
    low, high = cal.band_for(job.cluster.gpu, training.precision, job.model.is_moe)
    others = np.stack([breakdown[k] for k in TIME_KEYS[1:]], axis=1)
    top = np.argmax(others, axis=1)
    dominant = np.where(others[np.arange(n), top] > 0, top + 1, 0)
    return {"step_time_s": step, "breakdown": breakdown, "tokens_per_s_per_gpu": tokens,
            "tokens_per_s_per_gpu_low": tokens * math.exp(low), "tokens_per_s_per_gpu_high": tokens * math.exp(high),
            "tflops_per_gpu": flops / step / world / 1e12, "mfu": flops / (step * peak * world),
            "model_flops_per_step": flops, "dominant_time_index": dominant}

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
from collections.abc import Callable, Sequence
from dataclasses import replace
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
    TIME_KEYS,
    bf16_job,
    dp_comm_s,
    ep_unpaired_share,
    exposed_dp_s,
    fsdp_comm_s,
    fsdp_exposed_s,
    fsdp_units,
    host_link_bytes_per_s,
    layer_times,
    offload_exposed_s,
    optimizer_step_s,
    pipeline_bubble_s,
    pipeline_p2p_s,
)
from search_spaces.job import Job
from search_spaces.layout import RECOMPUTE_CHOICES

__all__ = ["step_times"]

FULL = RECOMPUTE_CHOICES.index("full")
_NO_BF16 = (0, 0, 0, 0, 0)


def _stage_kinds(stages: Sequence[Any], bf16: Sequence[tuple[int, ...]] = ()) -> list[tuple[Any, ...]]:
    """Distinct stages as (dense layers, MoE layers, embedding, output, MTP layers, Mamba layers, attention-only
    layers, their BF16 layers by `BF16_KINDS` (five counts; `placement.bf16_stage_layers`), last stage index,
    count), the latest stage first: equal stages take equal time, and the scalar model's pace is the latest of the
    slowest."""
    kinds: dict[tuple[Any, ...], list[int]] = {}
    for s in stages:
        key = (s.dense_layers, s.moe_layers, s.has_embedding, s.has_output, s.mtp_layers, s.mamba_layers,
               s.attention_layers, *(bf16[s.stage] if bf16 else _NO_BF16))
        entry = kinds.setdefault(key, [0, 0])
        entry[0], entry[1] = s.stage, entry[1] + 1
    return sorted(((*k, last, count) for k, (last, count) in kinds.items()), key=lambda k: -k[12])


def _attribute(name: str) -> Callable[[Any], float]:
    return lambda lt: getattr(lt, name)


def step_times(job: Job, t: Rows, cal: Calibration) -> dict[str, Any]:
    """The step time of every row, its terms, tokens/s with its band, TFLOP/s, MFU and the dominant term (module
    docstring)."""
    table, training, n = t.table, job.training, t.n
    cal = cal.for_release(training.release)
    rows = np.arange(n)
    m = np.maximum(table.num_microbatches(training.global_batch_size), 1)
    full = table.recompute == FULL
    chunks = np.where(full, table.pp * t.vpp, 0) if training.recompute_num_layers else np.zeros(n, np.int64)
    layer = group(table.tp, table.cp, table.ep, t.etp, table.mbs, table.sp & (table.tp > 1), table.recompute, chunks,
                  table.cuda_graphs, table.ep_overlap)
    lts = layer.values(lambda i: layer_times(job, t.layout(i), cal))
    # the EP overlap's unpaired warm-up and cool-down chunk steps (`throughput.ep_unpaired_share`)
    overlap = table.ep_overlap & (job.model.moe is not None)
    # a layout without the overlap is its own (the memo returns the same layer times; its share is 0 below)
    alone_lts = layer.values(lambda i: layer_times(job, replace(t.layout(i), ep_overlap=False), cal))
    share = np.zeros(n)
    for i in np.flatnonzero(overlap):
        share[i] = ep_unpaired_share(t.layout(int(i)), int(m[i]))

    def per_layer(f: Callable[[Any], float]) -> np.ndarray:
        paired = gather([f(lt) for lt in lts], layer)
        if not overlap.any():
            return paired
        alone = gather([f(a) for a in alone_lts], layer)
        return (1 - share) * paired + share * alone

    def term(part: str, k: str) -> Callable[[Any], float]:
        return lambda lt: getattr(lt, part)[k]

    dense = {k: per_layer(term("dense", k)) for k in LAYER_KEYS}
    moe = {k: per_layer(term("moe", k)) for k in LAYER_KEYS}
    out = {k: per_layer(term("output", k)) for k in LAYER_KEYS}
    mtp = {k: per_layer(term("mtp", k)) for k in LAYER_KEYS}
    mtp_sum = per_layer(lambda lt: sum(lt.mtp.values()))
    dense_sum, moe_sum = per_layer(lambda lt: sum(lt.dense.values())), per_layer(lambda lt: sum(lt.moe.values()))
    hybrid = job.model.is_hybrid
    if hybrid:
        mamba = {k: per_layer(term("mamba", k)) for k in LAYER_KEYS}
        attention = {k: per_layer(term("attention", k)) for k in LAYER_KEYS}
        mamba_sum = per_layer(lambda lt: sum(lt.mamba.values()))
        attention_sum = per_layer(lambda lt: sum(lt.attention.values()))
    out_sum, emb = per_layer(lambda lt: sum(lt.output.values())), per_layer(lambda lt: lt.embedding_s)
    # BF16 layers of a low-precision run: per part, their layer times less the run's
    twin = bf16_job(job, cal)
    delta: dict[str, dict[str, np.ndarray]] = {}
    if twin is not None:
        b_lts = layer.values(lambda i: layer_times(twin, t.layout(i), cal))
        b_alone = layer.values(lambda i: layer_times(twin, replace(t.layout(i), ep_overlap=False), cal))

        def per_layer_bf16(f: Callable[[Any], float]) -> np.ndarray:
            paired = gather([f(lt) for lt in b_lts], layer)
            if not overlap.any():
                return paired
            return (1 - share) * paired + share * gather([f(a) for a in b_alone], layer)

        for part in BF16_KINDS:
            delta[part] = {k: per_layer_bf16(term(part, k)) - per_layer(term(part, k)) for k in LAYER_KEYS}
            for direction in ("fwd", "bwd"):
                wall = _attribute(f"{part}_{direction}_s")
                delta[part][direction] = per_layer_bf16(wall) - per_layer(wall)

    # stages: the scalar model's per-stage sum, per distinct stage of each placement (kinds padded to K)
    stage_lists = t.placement.values(lambda i: stage_params(job.model, t.layout(i)))
    bf16_lists = t.placement.values(lambda i: bf16_stage_layers(job, t.layout(i))) if twin is not None \
        else [()] * len(stage_lists)
    kinds = [_stage_kinds(s, b) for s, b in zip(stage_lists, bf16_lists, strict=True)]
    width = max(len(k) for k in kinds)
    pad = [k + [(0, 0, False, False, 0, 0, 0, *_NO_BF16, -1, 0)] * (width - len(k)) for k in kinds]
    bf16_names = tuple(f"bf16_{part}" for part in BF16_KINDS)
    names = ("dense", "moe", "emb", "out", "mtp", "mamba", "attention", *bf16_names, "last", "count")
    kind = {name: np.array([[row[j] for row in k] for k in pad])[t.placement.inverse] for j, name in enumerate(names)}
    stage_s = kind["dense"] * dense_sum[:, None] + kind["moe"] * moe_sum[:, None]
    if hybrid:
        stage_s = stage_s + kind["mamba"] * mamba_sum[:, None] + kind["attention"] * attention_sum[:, None]
    stage_s = np.where(kind["out"], stage_s + out_sum[:, None], stage_s)
    stage_s = np.where(kind["mtp"] > 0, stage_s + kind["mtp"] * mtp_sum[:, None], stage_s)
    stage_s = np.where(kind["emb"], stage_s + emb[:, None], stage_s)
    if delta:
        for part, name in zip(BF16_KINDS, bf16_names, strict=True):
            part_sum = np.sum([delta[part][k] for k in LAYER_KEYS], axis=0)
            stage_s = stage_s + kind[name] * part_sum[:, None]
    slow = np.argmax(np.where(kind["last"] >= 0, stage_s, -np.inf), axis=1)
    pace = {name: kind[name][rows, slow] for name in ("dense", "moe", "emb", "out", "mtp", "mamba", "attention",
                                                      *bf16_names)}
    bubble = pipeline_bubble_s((kind["count"] * stage_s).sum(axis=1), stage_s[rows, slow], t.vpp)

    breakdown = {}
    for key in LAYER_KEYS:
        breakdown[key] = m * (pace["dense"] * dense[key] + pace["moe"] * moe[key] + pace["mtp"] * mtp[key]
                              + np.where(pace["out"], out[key], 0.0))
        if hybrid:
            breakdown[key] = breakdown[key] + m * (pace["mamba"] * mamba[key] + pace["attention"] * attention[key])
        if delta:
            breakdown[key] = breakdown[key] + m * sum(pace[name] * delta[part][key]
                                                      for part, name in zip(BF16_KINDS, bf16_names, strict=True))
    breakdown["compute"] = np.where(pace["emb"], breakdown["compute"] + m * emb, breakdown["compute"])
    p2p = group(table.pp, table.tp, table.cp, table.dp, table.mbs, t.vpp, table.sp, table.cuda_graphs)
    breakdown["pp_bubble"] = bubble
    breakdown["pp_p2p"] = m * gather(p2p.values(lambda i: pipeline_p2p_s(job, t.layout(i), cal)), p2p)

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
    bwd_window = (pace["dense"] * per_layer(lambda lt: lt.dense_bwd_s)
                  + pace["moe"] * per_layer(lambda lt: lt.moe_bwd_s) + pace["mtp"] * per_layer(lambda lt: lt.mtp_bwd_s))
    fwd_window = (pace["dense"] * per_layer(lambda lt: lt.dense_fwd_s)
                  + pace["moe"] * per_layer(lambda lt: lt.moe_fwd_s) + pace["mtp"] * per_layer(lambda lt: lt.mtp_fwd_s))
    if hybrid:
        bwd_window = bwd_window + (pace["mamba"] * per_layer(lambda lt: lt.mamba_bwd_s)
                                   + pace["attention"] * per_layer(lambda lt: lt.attention_bwd_s))
        fwd_window = fwd_window + (pace["mamba"] * per_layer(lambda lt: lt.mamba_fwd_s)
                                   + pace["attention"] * per_layer(lambda lt: lt.attention_fwd_s))
    if delta:
        bwd_window = bwd_window + sum(pace[name] * delta[part]["bwd"]
                                      for part, name in zip(BF16_KINDS, bf16_names, strict=True))
        fwd_window = fwd_window + sum(pace[name] * delta[part]["fwd"]
                                      for part, name in zip(BF16_KINDS, bf16_names, strict=True))
    zero1 = (exposed_dp_s(grads, bwd_window, training.overlap_grad_reduce, params, cal)
             + exposed_dp_s(param_gather, fwd_window, training.overlap_param_gather & table.dist_opt
                            & (not training.muon) & training.overlap_grad_reduce, params, cal))
    zero3 = m * fsdp_exposed_s(ag_fwd, ag_bwd, rs, units, fwd_window, bwd_window, cal)
    breakdown["dp_comm"] = np.where(table.fsdp, zero3, zero1)
    breakdown["offload"] = np.zeros(n)
    offloading = table.offload_layers > 0
    if offloading.any():
        off = group(table.tp, table.sp, table.cp, table.mbs, t.etp, table.recompute, table.cuda_graphs,
                    table.offload_layers, table.pp, t.vpp, m)
        host = gather(off.values(lambda i: offload_host_bytes(job, t.layout(i))), off)
        share = table.offload_layers / max(job.model.num_layers, 1)
        exposed = offload_exposed_s(host / host_link_bytes_per_s(job), share, fwd_window, bwd_window, cal)
        breakdown["offload"] = np.where(offloading & (host > 0), m * exposed, 0.0)
    breakdown["optimizer"] = optimizer
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
    dominant = np.where(others[rows, top] > 0, top + 1, 0)
    for a in breakdown.values():
        a.flags.writeable = False
    return {"step_time_s": step, "breakdown": breakdown, "tokens_per_s_per_gpu": tokens,
            "tokens_per_s_per_gpu_low": tokens * math.exp(low), "tokens_per_s_per_gpu_high": tokens * math.exp(high),
            "tflops_per_gpu": flops / step / world / 1e12, "mfu": flops / (step * peak * world),
            "model_flops_per_step": flops, "dominant_time_index": dominant}

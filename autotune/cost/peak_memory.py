"""Peak memory per GPU of many layouts of one job, by term: the one memory assembly.

    weights + gradients + optimizer + activations + workspace   = peak allocated
    + overhead (device memory outside the allocator's tensors)   = device memory at the peak, what must fit

Every term is a function of `autotune/cost/memory.py`, `activations.py` or `allowance.py` with its source, computed
once per distinct value of the layout fields it reads (`autotune/cost/groups.py`); this module adds them up on
arrays of layouts. The most loaded GPU is found by evaluating every pipeline stage that can be the peak
(`memory._candidate_stages`) at two moments of the step: the activation peak (the first backward after the
pipeline's warm-up) and the optimizer step. Estimating one layout is the one-row case
(`autotune.cost.score.estimate_memory`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from autotune.cost.activations import chunk_kinds, inflight_microbatches_per_chunk
from autotune.cost.allowance import device_terms, workspace_terms
from autotune.cost.groups import Rows, gather, group
from autotune.cost.layout_table import LayoutTable
from autotune.cost.memory import (
    TERMS,
    MemoryAssumptions,
    _bf16_unit,
    _candidate_stages,
    _lookups,
    _mtp_counts,
    _optimizer_step_bytes,
    _state_bytes,
    bf16_chunk_terms,
)
from autotune.cost.placement import bf16_chunk_kinds
from search_spaces.job import Job
from search_spaces.layout import CUDA_GRAPH_CHOICES

__all__ = ["peak_memory", "OVERHEAD_TERMS"]

OVERHEAD_TERMS = ("cuda_context", "nccl_buffers", "tp_userbuffers", "deepep_buffers", "hybridep_buffers",
                  "allocator_reserve", "graph_pool_held")


def _chunk_shape(chunks: tuple[tuple[int, int, int], ...], first_dense: int, last: int, pattern: str | None = None,
                 ) -> list[tuple[int, int, bool, bool, int, int]]:
    """(dense layers, MoE layers, embedding, output, Mamba layers, attention-only layers) of each chunk of a
    stage, as `memory._stage_estimate` reads them (`activations.chunk_kinds`)."""
    out = []
    for k, start, count in chunks:
        dense, moe, mamba, attention = chunk_kinds(pattern, first_dense, start, count)
        out.append((dense, moe, k == 0, k == last, mamba, attention))
    return out


def peak_memory(job: Job, t: Rows, assumptions: MemoryAssumptions) -> dict[str, Any]:
    """The peak memory of every row's most loaded GPU, by term, its stage and phase (module docstring)."""
    table, model, training, n = t.table, job.model, job.training, t.n
    first_dense = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    m = np.maximum(table.num_microbatches(training.global_batch_size), 1)

    stage_lists = t.placement.values(lambda i: _lookups(job, t.layout(i), assumptions)[0])
    unit = group(table.tp, table.sp, table.cp, table.mbs, t.etp, table.recompute, table.cuda_graphs)
    units = unit.values(lambda i: _lookups(job, t.layout(i), assumptions)[1])
    u_rows = unit.inverse
    u = {name: np.array([getattr(x, name) for x in units], dtype=np.float64)[u_rows]
         for name in ("dense_layer", "moe_layer", "dense_kept", "moe_kept", "embedding", "output", "mtp",
                      "mamba_layer", "attention_layer")}
    combos = [(o, h) for o in (False, True) for h in (False, True)]
    transients = np.array([[x.transient(has_output=o, has_moe=h) for o, h in combos] for x in units])
    u_full = np.array([x.full_layers is not None for x in units])[u_rows]
    split_unit = {False: next((x for x in units if x.full_layers is None), None),
                  True: next((x for x in units if x.full_layers is not None), None)}

    # candidate peak stages per pipeline structure (pp, vpp, split)
    structure = group(table.pp, t.vpp, table.first_stage_layers, table.last_stage_layers, table.embedding_loss_split,
                       table.pipeline_layout)
    mtp_of = structure.values(lambda i: _mtp_counts(model, t.layout(i)))
    cands = [_candidate_stages(model.num_layers, first_dense, int(table.pp[i]), int(t.vpp[i]), _split_of(table, i),
                               mtp_of[g], model.hybrid_pattern, training.bf16_edges)
             for g, i in enumerate(structure.first)]
    # BF16 layers of a low-precision run: their units (`memory._bf16_unit`) per unit group
    bf16_units = unit.values(lambda i: _bf16_unit(job, t.layout(i), assumptions)) if job.has_bf16_layers else None
    width = max(len(c) for c in cands)
    depth = int(t.vpp.max())
    s_rows = structure.inverse
    stage_params_per_gpu = np.zeros((len(t.placement), width), dtype=np.int64)
    for g, i in enumerate(t.placement.first):
        for c, (p, _) in enumerate(cands[s_rows[i]]):
            stage_params_per_gpu[g, c] = stage_lists[g][p].params_per_gpu

    # per stage state: weights, gradients, optimizer, optimizer-step transient
    state = group(t.placement.inverse, table.dist_opt, table.dp, table.cp, table.fsdp)
    state_values = np.zeros((len(state), width, 4))
    for g, i in enumerate(state.first):
        layout, stages = t.layout(int(i)), stage_lists[t.placement.inverse[i]]
        for c, (p, _) in enumerate(cands[s_rows[i]]):
            state_values[g, c, :3] = _state_bytes(job, stages[p], layout)
            state_values[g, c, 3] = _optimizer_step_bytes(job, stages[p], layout)
    extra = table.ep_overlap & (model.moe is not None) & (t.vpp > 1)
    flight = group(table.pp, t.vpp, m, extra)
    flight_values = np.zeros((len(flight), width, depth), dtype=np.int64)
    for g, i in enumerate(flight.first):
        for c, (p, _) in enumerate(cands[s_rows[i]]):
            counts = inflight_microbatches_per_chunk(int(table.pp[i]), int(t.vpp[i]), int(m[i]), p,
                                                     extra_warmup=int(extra[i]))
            flight_values[g, c, :len(counts)] = counts
    work = group(table.tp, table.sp, table.cp, table.mbs, table.dp, table.cuda_graphs)
    work_values = np.array(work.values(lambda i: [sum(workspace_terms(job, t.layout(i), has_output=o).values())
                                                  for o in (False, True)]))
    allow = group(table.tp, table.cp, table.dp, table.ep, t.etp, table.pp, table.sp, table.mbs)
    allow_terms = allow.values(lambda i: device_terms(job, t.layout(i), assumptions.allowance))
    overhead_terms = {name: gather([d[name] for d in allow_terms], allow) for name in OVERHEAD_TERMS[:-1]}
    overhead = gather([sum(d.values()) for d in allow_terms], allow)
    full_graphs = table.cuda_graphs == CUDA_GRAPH_CHOICES.index("full_iteration")
    offload = table.offload_layers
    held_out = np.zeros(n)  # `memory.graph_pool_held_bytes` of each row's peak stage

    result = {name: np.zeros(n) for name in ("weights", "gradients", "optimizer", "activations", "workspace")}
    stage_out, phase_out, params_out = np.zeros(n, np.int64), np.zeros(n, bool), np.zeros(n, np.int64)
    order = np.argsort(s_rows, kind="stable")
    bounds = np.searchsorted(s_rows[order], np.arange(len(structure) + 1))
    for g in range(len(structure)):
        idx = order[bounds[g]:bounds[g + 1]]
        i0 = idx[0]
        pp, vpp = int(table.pp[i0]), int(t.vpp[i0])
        st = state_values[state.inverse[idx]]
        fl = flight_values[flight.inverse[idx]]
        uu = {k: v[idx] for k, v in u.items()}
        full = u_full[idx]
        totals, parts = [], []
        for c, (p, chunks) in enumerate(cands[g]):
            sp0 = stage_lists[t.placement.inverse[i0]][p]
            has_out, has_moe = sp0.has_output, sp0.moe_layers > 0
            act = transients[u_rows[idx], combos.index((has_out, has_moe))]
            shapes = _chunk_shape(chunks, first_dense, pp * vpp - 1, model.hybrid_pattern)
            for j, ((k, start, count), (dense, moe, has_emb, is_last, mamba, attention)) in enumerate(
                    zip(chunks, shapes, strict=True)):
                rd, rm, kd, km = _layer_split(split_unit, full, dense, moe)
                value = rd * uu["dense_layer"] + rm * uu["moe_layer"] + kd * uu["dense_kept"] + km * uu["moe_kept"]
                if mamba or attention:
                    value = value + mamba * uu["mamba_layer"] + attention * uu["attention_layer"]
                mtp_k = mtp_of[g][k] if mtp_of[g] else 0
                if mtp_k:
                    value = value + mtp_k * uu["mtp"]
                if has_emb:
                    value = value + uu["embedding"]
                if is_last:
                    value = value + uu["output"]
                if start == 0 and offload.any():  # `memory.offloaded_activation_bytes`: the first k layers
                    value = value - _offloaded(offload[idx], count, first_dense, model.hybrid_pattern, split_unit,
                                               full, uu)
                if bf16_units is not None:
                    kinds = bf16_chunk_kinds(model.hybrid_pattern, first_dense, model.num_layers,
                                             training.bf16_edges, start, count)
                    b_mtp = mtp_k if job.mtp_in_bf16 else 0
                    per_unit = np.array([sum(bf16_chunk_terms(x, b, kinds, b_mtp).values())
                                         for x, b in zip(units, bf16_units, strict=True)])
                    value = value + per_unit[u_rows[idx]]
                act = act + fl[:, c, j] * value
            step = st[:, c, 3]
            held = np.where(full_graphs[idx], np.minimum(act, step), 0.0)
            optimizer_phase = step > act
            act = np.where(optimizer_phase, step, act)
            ws = work_values[work.inverse[idx], int(has_out)]
            allocated = st[:, c, 0] + st[:, c, 1] + st[:, c, 2] + act + ws
            totals.append(allocated + overhead[idx] + held)
            parts.append((st[:, c, 0], st[:, c, 1], st[:, c, 2], act, ws, optimizer_phase, p, held))
        best = np.argmax(np.stack(totals, axis=1), axis=1)
        for c, (w, gr, o, act, ws, phase, p, held) in enumerate(parts):
            sel = best == c
            rows = idx[sel]
            held_out[rows] = held[sel]
            for name, value in zip(result, (w, gr, o, act, ws), strict=True):
                result[name][rows] = value[sel]
            phase_out[rows] = phase[sel]
            stage_out[rows] = p
            params_out[rows] = stage_params_per_gpu[t.placement.inverse[rows], c]
    allocated = result["weights"] + result["gradients"] + result["optimizer"] + result["activations"] \
        + result["workspace"]
    overhead = overhead + held_out
    overhead_terms["graph_pool_held"] = held_out
    total = allocated + overhead
    memory = {**{name: result[name] for name in TERMS[:-1]}, "overhead": overhead}
    dominant = np.argmax(np.stack([memory[name] for name in TERMS], axis=1), axis=1)
    return {"memory": memory, "overhead_terms": overhead_terms, "allocated_bytes": allocated, "total_bytes": total,
            "memory_stage": stage_out, "optimizer_phase": phase_out, "params_per_gpu": params_out,
            "dominant_memory_index": dominant}


def _offloaded(k: np.ndarray, count: int, first_dense: int, pattern: str | None, units: Mapping[bool, Any],
               full: np.ndarray, u: Mapping[str, np.ndarray]) -> np.ndarray:
    """What the first min(k, count) layers of a stage's first chunk save per micro-batch, per row (0 where k is 0):
    `memory.offloaded_activation_bytes` over arrays."""
    out = np.zeros(len(k))
    for value in np.unique(k[k > 0]):
        rows = k == value
        dense, moe, mamba, attention = chunk_kinds(pattern, first_dense, 0, min(int(value), count))
        rd, rm, kd, km = _layer_split(units, full, dense, moe)
        saved = rd * u["dense_layer"] + rm * u["moe_layer"] + kd * u["dense_kept"] + km * u["moe_kept"]
        if mamba or attention:
            saved = saved + mamba * u["mamba_layer"] + attention * u["attention_layer"]
        out = np.where(rows, saved, out)
    return out


def _layer_split(units: Mapping[bool, Any], full: np.ndarray, dense: int, moe: int) -> tuple[np.ndarray, ...]:
    """`UnitActivations._split` of a chunk's layers per row: (recomputed dense, recomputed MoE, kept dense, kept
    MoE), from a unit without block recompute (`full_layers` None) and one with it, where the rows have such."""
    plain = units[False]._split(dense, moe) if units[False] is not None else (0, 0, 0, 0)
    if units[True] is None:
        return tuple(np.full(len(full), float(v)) for v in plain)
    block = units[True]._split(dense, moe)
    return tuple(np.where(full, float(b), float(a)) for a, b in zip(plain, block, strict=True))


def _split_of(table: LayoutTable, i: int) -> tuple[int | None, int | None, bool, str | None]:
    """`placement.pipeline_split` of row i."""
    return (int(table.first_stage_layers[i]) or None, int(table.last_stage_layers[i]) or None,
            bool(table.embedding_loss_split[i]), table.layout_strings[int(table.pipeline_layout[i])])

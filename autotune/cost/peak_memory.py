"""Peak memory per GPU of many layouts of one job, by term: the one memory assembly.

    weights + gradients + optimizer + activations + workspace   = peak allocated
    + overhead (device memory outside the allocator's tensors)   = device memory at the peak, what must fit

Every term is a function of `autotune/cost/memory.py`, the activation modules or `allowance.py` with its source,
computed once per distinct value of the layout fields it reads (`autotune/cost/groups.py`); this module adds them up on
arrays of layouts. The most loaded GPU is found by evaluating every pipeline stage that can be the peak
(`memory._candidate_stages`) at two moments of the step: the activation peak (the first backward after the
pipeline's warm-up) and the optimizer step. Estimating one layout is the one-row case
(`autotune.cost.score.estimate_memory`), which also asks for every stage (`every_stage`) and for the activations
by tensor name (`by_name`): the same sums, over a column per name instead of one for the total.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from autotune.cost.activation_units import UnitActivations, chunk_bytes
from autotune.cost.activations import inflight_microbatches_per_chunk
from autotune.cost.allowance import device_terms, workspace_terms
from autotune.cost.groups import Rows, gather, group
from autotune.cost.layout_table import LayoutTable
from autotune.cost.memory import (
    TERMS,
    MemoryAssumptions,
    _bf16_unit,
    _candidate_stages,
    _every_stage,
    _lookups,
    _mtp_counts,
    _optimizer_step_bytes,
    _state_bytes,
    bf16_chunk_terms,
    graph_pool_held_bytes,
    offload_host_bytes,
    offloaded_kinds,
)
from autotune.cost.placement import bf16_chunk_kinds, chunk_kinds
from search_spaces.job import Job
from search_spaces.layout import CUDA_GRAPH_CHOICES

__all__ = ["peak_memory", "OVERHEAD_TERMS"]

OVERHEAD_TERMS = ("cuda_context", "nccl_buffers", "tp_userbuffers", "deepep_buffers", "hybridep_buffers",
                  "allocator_reserve", "graph_pool_held")


# the UnitActivations totals and the named terms they sum
_UNIT_FIELDS = {"dense_layer": "dense_terms", "moe_layer": "moe_terms", "dense_kept": "dense_kept_terms",
                "moe_kept": "moe_kept_terms", "embedding": "embedding_terms", "output": "output_terms",
                "mtp": "mtp_terms", "mamba_layer": "mamba_terms", "attention_layer": "attention_terms"}
OFFLOADED = "cpu_offloaded"  # the named term of what activation offload takes off the GPU (negative)
_COMBOS = [(o, h) for o in (False, True) for h in (False, True)]  # (has_output, has_moe) of the transients


class _Columns:
    """The activation columns: one, the total (the search), or (`by_name`) one per tensor name and after them one
    per name that says whether the name was added at all (its value may be 0: a term replaced by another)."""

    def __init__(self, units: Sequence[UnitActivations | None], by_name: bool) -> None:
        self.by_name = by_name
        names: dict[str, int] = {}
        if by_name:
            for x in units:
                if x is None:
                    continue
                for terms in (*(getattr(x, f) for f in _UNIT_FIELDS.values()), *x.transient_terms.values()):
                    for name, _ in terms:
                        names.setdefault(name, len(names))
            names.setdefault(OFFLOADED, len(names))
        self.names = names
        self.width = 2 * len(names) if by_name else 1

    def of(self, terms: Sequence[tuple[str, float]] | Mapping[str, float], total: float) -> np.ndarray:
        """A vector of `terms` (named bytes) over the columns; `total` is their sum, as the unit computed it."""
        out = np.zeros(self.width)
        if not self.by_name:
            out[0] = total
            return out
        for name, value in (terms.items() if isinstance(terms, Mapping) else terms):
            out[self.names[name]] += value
            out[len(self.names) + self.names[name]] = 1.0
        return out

    def total(self, a: np.ndarray) -> np.ndarray:
        """The total of each row of (rows, columns) `a`."""
        return a[:, :len(self.names)].sum(axis=1) if self.by_name else a[:, 0]

    def offloaded(self, value: np.ndarray, off: np.ndarray) -> np.ndarray:
        """`value` less what activation offload takes off the GPU (`off` per row), as its own named term."""
        out = value.copy()
        k = self.names.get(OFFLOADED, 0)
        out[:, k] -= off
        if self.by_name:
            out[:, len(self.names) + k] += off > 0
        return out

    def named(self, a: np.ndarray) -> tuple[tuple[str, float], ...]:
        """Row 0 of `a` by name: the names that were added, with their bytes."""
        n = len(self.names)
        return tuple((name, float(a[0, k])) for name, k in self.names.items() if a[0, n + k] > 0)


def _unit_columns(units: Sequence[UnitActivations], cols: _Columns, rows: np.ndarray) -> SimpleNamespace:
    """The units' fields as (rows, columns) arrays, named as `UnitActivations` names them (for `chunk_bytes`)."""
    return SimpleNamespace(**{field: np.array([cols.of(getattr(x, terms), getattr(x, field)) for x in units])[rows]
                              for field, terms in _UNIT_FIELDS.items()})


@dataclass(frozen=True, slots=True)
class _Activations:
    """What a stage's activations are made of, per row: the activation units (`memory._lookups`) as columns
    (`units`: its fields as (rows, columns) arrays; `transients`: (unit group, (has_output, has_moe), columns)),
    the BF16 layers' units, and which rows recompute a block of layers (`full`, with a unit of each kind in
    `split_units` for `_layer_split`)."""

    cols: _Columns
    unit_rows: np.ndarray
    units: SimpleNamespace
    unit_list: list[UnitActivations]
    bf16_units: list[Any] | None
    transients: np.ndarray
    full: np.ndarray
    split_units: dict[bool, UnitActivations | None]


def _activations(job: Job, t: Rows, assumptions: MemoryAssumptions, by_name: bool) -> _Activations:
    table = t.table
    unit = group(table.tp, table.sp, table.cp, table.mbs, t.etp, table.recompute, table.cuda_graphs)
    units = unit.values(lambda i: _lookups(job, t.layout(i), assumptions)[1])
    # BF16 layers of a low-precision run: their units (`memory._bf16_unit`) per unit group
    bf16_units = unit.values(lambda i: _bf16_unit(job, t.layout(i), assumptions)) if job.has_bf16_layers else None
    cols = _Columns([*units, *(bf16_units or ())], by_name)
    return _Activations(
        cols=cols, unit_rows=unit.inverse, units=_unit_columns(units, cols, unit.inverse), unit_list=units,
        bf16_units=bf16_units,
        transients=np.array([[cols.of(x.transient_terms[c], x.transient(has_output=c[0], has_moe=c[1]))
                              for c in _COMBOS] for x in units]),
        full=np.array([x.full_layers is not None for x in units])[unit.inverse],
        split_units={False: next((x for x in units if x.full_layers is None), None),
                     True: next((x for x in units if x.full_layers is not None), None)})


@dataclass(frozen=True, slots=True)
class _Stages:
    """The stages that can be the peak (or every stage) of each pipeline structure (`structure` groups the rows by
    PP, VPP and split; `candidates[g]` lists (stage, chunks)), and per row and candidate: the stage's weights,
    gradients, optimizer state and optimizer-step transient (`state`, by the group `state_of[row]`), its in-flight
    micro-batches per chunk (`flight`, by `flight_of[row]`) and its parameters per GPU (`params`, by placement)."""

    structure: Any
    candidates: list[tuple[tuple[int, tuple[tuple[int, int, int], ...]], ...]]
    mtp: list[tuple[int, ...] | None]
    stage_lists: list[tuple[Any, ...]]
    state: np.ndarray
    state_of: np.ndarray
    flight: np.ndarray
    flight_of: np.ndarray
    params: np.ndarray


def _stages(job: Job, t: Rows, assumptions: MemoryAssumptions, m: np.ndarray, every_stage: bool) -> _Stages:
    table, model = t.table, job.model
    first_dense = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    stage_lists = t.placement.values(lambda i: _lookups(job, t.layout(i), assumptions)[0])
    structure = group(table.pp, t.vpp, table.first_stage_layers, table.last_stage_layers, table.embedding_loss_split,
                      table.pipeline_layout)
    if every_stage and len(structure) > 1:
        raise ValueError(f"every_stage needs one pipeline structure, but the table has {len(structure)}.")
    mtp_of = structure.values(lambda i: _mtp_counts(model, t.layout(i)))
    cands = [_every_stage(model.num_layers, int(table.pp[i]), int(t.vpp[i]), _split_of(table, i)) if every_stage
             else _candidate_stages(model.num_layers, first_dense, int(table.pp[i]), int(t.vpp[i]), _split_of(table, i),
                                    mtp_of[g], model.hybrid_pattern, job.training.bf16_edges)
             for g, i in enumerate(structure.first)]
    width = max(len(c) for c in cands)
    s_rows = structure.inverse
    params = np.zeros((len(t.placement), width), dtype=np.int64)
    for g, i in enumerate(t.placement.first):
        for c, (p, _) in enumerate(cands[s_rows[i]]):
            params[g, c] = stage_lists[g][p].params_per_gpu
    state = group(t.placement.inverse, table.dist_opt, table.dp, table.cp, table.fsdp)
    state_values = np.zeros((len(state), width, 4))
    for g, i in enumerate(state.first):
        layout, stages = t.layout(int(i)), stage_lists[t.placement.inverse[i]]
        for c, (p, _) in enumerate(cands[s_rows[i]]):
            state_values[g, c, :3] = _state_bytes(job, stages[p], layout)
            state_values[g, c, 3] = _optimizer_step_bytes(job, stages[p], layout)
    extra = table.ep_overlap & (model.moe is not None) & (t.vpp > 1)
    flight = group(table.pp, t.vpp, m, extra)
    flight_values = np.zeros((len(flight), width, int(t.vpp.max())), dtype=np.int64)
    for g, i in enumerate(flight.first):
        for c, (p, _) in enumerate(cands[s_rows[i]]):
            counts = inflight_microbatches_per_chunk(int(table.pp[i]), int(t.vpp[i]), int(m[i]), p,
                                                     extra_warmup=int(extra[i]))
            flight_values[g, c, :len(counts)] = counts
    return _Stages(structure=structure, candidates=cands, mtp=mtp_of, stage_lists=stage_lists,
                   state=state_values, state_of=state.inverse, flight=flight_values, flight_of=flight.inverse,
                   params=params)


def _stage_activations(job: Job, a: _Activations, idx: np.ndarray, chunks: tuple[tuple[int, int, int], ...],
                       flight: np.ndarray, mtp: tuple[int, ...] | None, last: int, transient: int,
                       offload: np.ndarray) -> np.ndarray:
    """One stage's activations on rows `idx` (by column): one micro-batch's transients plus, per chunk, its
    in-flight micro-batches (`flight`, rows x chunks) times what one leaves saved (`activation_units.chunk_bytes`), less
    what activation offload takes to the host, plus the BF16 layers' difference."""
    model, training = job.model, job.training
    first_dense = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    uu = SimpleNamespace(**{k: v[idx] for k, v in vars(a.units).items()})
    full = a.full[idx]
    act = a.transients[a.unit_rows[idx], transient]
    for j, (k, start, count) in enumerate(chunks):
        dense, moe, mamba, attention = chunk_kinds(model.hybrid_pattern, first_dense, start, count)
        mtp_k = mtp[k] if mtp else 0
        value = chunk_bytes(uu, _layer_split(a.split_units, full, dense, moe), mamba=mamba, attention=attention,
                            mtp=mtp_k, has_embedding=k == 0, has_output=k == last)
        if start == 0 and offload.any():  # the first k layers (`memory.offloaded_kinds`)
            value = a.cols.offloaded(value, _offloaded(offload, count, model, a.split_units, full, uu, a.cols))
        if a.bf16_units is not None:
            kinds = bf16_chunk_kinds(model.hybrid_pattern, first_dense, model.num_layers, training.bf16_edges, start,
                                     count)
            b_mtp = mtp_k if job.mtp_in_bf16 else 0
            deltas = [bf16_chunk_terms(x, b, kinds, b_mtp) for x, b in zip(a.unit_list, a.bf16_units, strict=True)]
            value = value + np.array([a.cols.of(d, sum(d.values())) for d in deltas])[a.unit_rows[idx]]
        act = act + flight[:, j, None] * value
    return act


def peak_memory(job: Job, t: Rows, assumptions: MemoryAssumptions, *, by_name: bool = False,
                every_stage: bool = False) -> dict[str, Any]:
    """The peak memory of every row's most loaded GPU, by term, its stage and phase (module docstring): each
    candidate stage's state, activations (or the optimizer step's transient, when larger), workspace and device
    overhead, the largest total kept.

    `by_name`: also the peak stage's activations by tensor name (`activation_columns`, rows x the `columns`' names;
    `columns.named` reads a row). `every_stage` (a table of one pipeline structure, as one layout is): also
    every stage's figures in stage order (`stages`), not only the peak's."""
    table, n = t.table, t.n
    m = np.maximum(table.num_microbatches(job.training.global_batch_size), 1)
    a = _activations(job, t, assumptions, by_name)
    s = _stages(job, t, assumptions, m, every_stage)
    work = group(table.tp, table.sp, table.cp, table.mbs, table.dp, table.cuda_graphs)
    work_values = np.array(work.values(lambda i: [sum(workspace_terms(job, t.layout(i), has_output=o).values())
                                                  for o in (False, True)]))
    allow = group(table.tp, table.cp, table.dp, table.ep, t.etp, table.pp, table.sp, table.mbs)
    allow_terms = allow.values(lambda i: device_terms(job, t.layout(i), assumptions.allowance))
    overhead_terms = {name: gather([d[name] for d in allow_terms], allow) for name in OVERHEAD_TERMS[:-1]}
    overhead = gather([sum(d.values()) for d in allow_terms], allow)
    full_graphs = table.cuda_graphs == CUDA_GRAPH_CHOICES.index("full_iteration")

    result = {name: np.zeros(n) for name in ("weights", "gradients", "optimizer", "activations", "workspace",
                                             "held")}
    stage_out, phase_out, params_out = np.zeros(n, np.int64), np.zeros(n, bool), np.zeros(n, np.int64)
    named: list[tuple[np.ndarray, np.ndarray]] = []
    per_stage: list[dict[str, Any]] = []
    s_rows = s.structure.inverse
    order = np.argsort(s_rows, kind="stable")
    bounds = np.searchsorted(s_rows[order], np.arange(len(s.structure) + 1))
    for g in range(len(s.structure)):
        idx = order[bounds[g]:bounds[g + 1]]
        last = int(table.pp[idx[0]]) * int(t.vpp[idx[0]]) - 1
        st = s.state[s.state_of[idx]]
        fl = s.flight[s.flight_of[idx]]
        totals, parts = [], []
        for c, (p, chunks) in enumerate(s.candidates[g]):
            sp0 = s.stage_lists[t.placement.inverse[idx[0]]][p]
            has_out = sp0.has_output
            act = _stage_activations(job, a, idx, chunks, fl[:, c], s.mtp[g], last,
                                     _COMBOS.index((has_out, sp0.moe_layers > 0)), table.offload_layers[idx])
            total_act = a.cols.total(act)
            step = st[:, c, 3]
            held = graph_pool_held_bytes(full_graphs[idx], total_act, step)
            optimizer_phase = step > total_act
            total_act = np.where(optimizer_phase, step, total_act)
            ws = work_values[work.inverse[idx], int(has_out)]
            allocated = st[:, c, 0] + st[:, c, 1] + st[:, c, 2] + total_act + ws
            totals.append(allocated + overhead[idx] + held)
            parts.append({"weights": st[:, c, 0], "gradients": st[:, c, 1], "optimizer": st[:, c, 2],
                          "activations": total_act, "workspace": ws, "held": held, "phase": optimizer_phase,
                          "stage": p, "named": act, "params": s.params[t.placement.inverse[idx], c]})
        if every_stage:
            per_stage = [{**part, "overhead": overhead[idx] + part["held"]} for part in parts]
        best = np.argmax(np.stack(totals, axis=1), axis=1)
        for c, part in enumerate(parts):
            sel = best == c
            rows = idx[sel]
            for name in result:
                result[name][rows] = part[name][sel]
            phase_out[rows] = part["phase"][sel]
            stage_out[rows] = part["stage"]
            params_out[rows] = part["params"][sel]
            if by_name:
                named.append((rows, part["named"][sel]))
    allocated = result["weights"] + result["gradients"] + result["optimizer"] + result["activations"] \
        + result["workspace"]
    overhead = overhead + result["held"]
    overhead_terms["graph_pool_held"] = result["held"]
    memory = {**{name: result[name] for name in TERMS[:-1]}, "overhead": overhead}
    dominant = np.argmax(np.stack([memory[name] for name in TERMS], axis=1), axis=1)
    out = {"memory": memory, "overhead_terms": overhead_terms, "allocated_bytes": allocated,
           "total_bytes": allocated + overhead, "host_bytes": _host_bytes(job, t, m, assumptions),
           "memory_stage": stage_out, "optimizer_phase": phase_out, "params_per_gpu": params_out,
           "dominant_memory_index": dominant}
    if by_name:
        terms = np.zeros((n, a.cols.width))
        for rows, values in named:
            terms[rows] = values
        out["columns"], out["activation_columns"] = a.cols, terms
    if every_stage:
        out["stages"] = per_stage
    return out


def _host_bytes(job: Job, t: Rows, m: np.ndarray, assumptions: MemoryAssumptions) -> np.ndarray:
    """Host memory per GPU of each row's offloaded activations (`memory.offload_host_bytes`; 0 without offload)."""
    table = t.table
    out = np.zeros(t.n)
    rows = np.flatnonzero(table.offload_layers > 0)
    if len(rows):
        sub = Rows(table.take(rows))
        off = group(sub.table.tp, sub.table.sp, sub.table.cp, sub.table.mbs, sub.etp, sub.table.recompute,
                    sub.table.cuda_graphs, sub.table.offload_layers, sub.table.pp, sub.vpp, m[rows])
        out[rows] = gather(off.values(lambda i: offload_host_bytes(job, sub.layout(i), assumptions)), off)
    return out


def _offloaded(k: np.ndarray, count: int, model: Any, units: Mapping[bool, Any], full: np.ndarray,
               u: SimpleNamespace, cols: _Columns) -> np.ndarray:
    """What the first min(k, count) layers of a stage's first chunk save per micro-batch, per row (0 where k is 0),
    in total: what `memory.offload_host_bytes` counts, over arrays."""
    out = np.zeros(len(k))
    for value in np.unique(k[k > 0]):
        rows = k == value
        dense, moe, mamba, attention = offloaded_kinds(model, int(value), count)
        saved = cols.total(chunk_bytes(u, _layer_split(units, full, dense, moe), mamba=mamba, attention=attention,
                                       mtp=0, has_embedding=False, has_output=False))
        out = np.where(rows, saved, out)
    return out


def _layer_split(units: Mapping[bool, Any], full: np.ndarray, dense: int, moe: int,
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`UnitActivations._split` of a chunk's layers per row, as a column: (recomputed dense, recomputed MoE, kept
    dense, kept MoE), from a unit without block recompute (`full_layers` None) and one with it, where the rows have
    such."""
    plain = units[False]._split(dense, moe) if units[False] is not None else (0, 0, 0, 0)
    block = units[True]._split(dense, moe) if units[True] is not None else plain
    rd, rm, kd, km = (np.where(full, float(b), float(a))[:, None] for a, b in zip(plain, block, strict=True))
    return rd, rm, kd, km


def _split_of(table: LayoutTable, i: int) -> tuple[int | None, int | None, bool, str | None]:
    """`placement.pipeline_split` of row i."""
    return (int(table.first_stage_layers[i]) or None, int(table.last_stage_layers[i]) or None,
            bool(table.embedding_loss_split[i]), table.layout_strings[int(table.pipeline_layout[i])])

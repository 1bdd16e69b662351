"""Score many layouts of one job at once, with exactly the figures of the scalar cost models.

    scores = score_layouts(job, LayoutTable.from_space(feasible_space(job)), headroom_bytes=0.0)
    scores.tokens_per_s_per_gpu[i], scores.total_bytes[i], scores.fits[i], scores.measurement(i)

Row i gets what `estimate_time(job, layout, cal)` (autotune/cost/throughput.py) and
`estimate_memory(job, layout, assumptions)` (autotune/cost/memory.py) give for `table.layout(i)`: the step time
and every breakdown term, tokens/s per GPU with its band, TFLOP/s, MFU; the allocated and device peaks, their six
terms, the peak stage and phase; and `AnalyticBackend`'s verdict (ok, or oom above capacity minus headroom).
The rows are assumed valid (the feasible space builds only valid layouts); rules are not checked here.

How, without a Python object per layout on the hot path: the terms the scalar models compute from a few layout
fields are computed once per distinct value of those fields, by the scalar models' own functions:
- per layer key (tp, cp, ep, etp, mbs, sp, recompute): `throughput.layer_times` (and `memory._lookups`' activation
  units per (tp, sp, cp, mbs, etp, recompute));
- per placement key (tp, pp, vpp, ep, etp, pipeline split): `placement.stage_params` and `heaviest_stage`, the
  memory model's candidate peak stages (`memory._candidate_stages`);
- per group key: the pipeline p2p time, the DP communication and optimizer step (`throughput.pipeline_p2p_s`,
  `dp_comm_s`, `optimizer_step_s`), each stage's weights / gradients / optimizer bytes and optimizer-step transient
  (`memory._state_bytes`, `_optimizer_step_bytes`), in-flight micro-batches
  (`activations.inflight_microbatches_per_chunk`), workspaces and the device allowance (`allowance.*_terms`).
What is left is the assembly the scalar `estimate_time` / `_stage_estimate` / `estimate_memory` do (the heaviest
stage, the bubble, exposed DP time, the sums, the peak stage), restated here in numpy in the same order of
operations, so that the figures agree to rounding (`tests/test_score.py` holds them to 1e-9 relative).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from autotune.cost.activations import chunk_kinds, inflight_microbatches_per_chunk
from autotune.cost.allowance import device_terms, workspace_terms
from autotune.cost.efficiency import DEFAULT_CALIBRATION, Calibration
from autotune.cost.flops import model_flops_per_step
from autotune.cost.layout_table import LayoutTable
from autotune.cost.memory import (
    DEFAULT_ASSUMPTIONS,
    TERMS,
    MemoryAssumptions,
    _bf16_unit,
    _candidate_stages,
    _lookups,
    _mtp_counts,
    _optimizer_step_bytes,
    _state_bytes,
    bf16_chunk_terms,
    offload_host_bytes,
)
from autotune.cost.placement import bf16_chunk_kinds, bf16_stage_layers, heaviest_stage, stage_params
from autotune.cost.throughput import (
    BF16_KINDS,
    LAYER_KEYS,
    TIME_KEYS,
    bf16_job,
    dp_comm_s,
    ep_unpaired_share,
    fsdp_comm_s,
    fsdp_units,
    host_link_bytes_per_s,
    layer_times,
    optimizer_step_s,
    pipeline_p2p_s,
)
from search_spaces.job import Job
from search_spaces.layout import CUDA_GRAPH_CHOICES, RECOMPUTE_CHOICES, Layout
from search_spaces.measurement import Measurement

__all__ = ["Scores", "score_layouts", "OVERHEAD_TERMS"]

GIB = 1024**3
FULL = RECOMPUTE_CHOICES.index("full")
OVERHEAD_TERMS = ("cuda_context", "nccl_buffers", "tp_userbuffers", "deepep_buffers", "hybridep_buffers",
                  "allocator_reserve", "graph_pool_held")


# --- grouping rows by the fields a term reads ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Groups:
    """Rows grouped by equal keys: `first[g]` is a row of group g, `inverse[i]` the group of row i."""

    first: np.ndarray
    inverse: np.ndarray

    def __len__(self) -> int:
        return len(self.first)

    def values(self, f: Callable[[int], Any]) -> list[Any]:
        """f(row) for the first row of each group."""
        return [f(int(i)) for i in self.first]


def _group(*columns: np.ndarray) -> _Groups:
    """Group rows by the tuple of `columns` (non-negative integers or booleans)."""
    n = len(columns[0])
    code = np.zeros(n, dtype=np.int64)
    span = 1
    for column in columns:
        column = column.astype(np.int64)
        radix = int(column.max()) + 1 if n else 1
        if span * radix >= 2**62:  # keep the mixed-radix code inside int64: renumber what is combined so far
            _, code = np.unique(code, return_inverse=True)
            span = int(code.max()) + 1
        code = code * radix + column
        span *= radix
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return _Groups(first=first, inverse=inverse.reshape(-1))


def _gather(values: Sequence[Any], groups: _Groups) -> np.ndarray:
    """Per-group scalars spread to the rows."""
    return np.asarray(values, dtype=np.float64)[groups.inverse]


# --- the result ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False, slots=True)
class Scores:
    """Per-row figures of `score_layouts` (arrays aligned with `table`); names as in TimeEstimate / MemoryEstimate."""

    job: Job
    table: LayoutTable
    capacity_bytes: float
    step_time_s: np.ndarray
    breakdown: Mapping[str, np.ndarray]  # TIME_KEYS -> seconds per step
    tokens_per_s_per_gpu: np.ndarray
    tokens_per_s_per_gpu_low: np.ndarray
    tokens_per_s_per_gpu_high: np.ndarray
    tflops_per_gpu: np.ndarray
    mfu: np.ndarray
    model_flops_per_step: float
    memory: Mapping[str, np.ndarray]  # TERMS -> bytes on the peak GPU
    overhead_terms: Mapping[str, np.ndarray]  # OVERHEAD_TERMS -> bytes
    allocated_bytes: np.ndarray
    total_bytes: np.ndarray  # device memory at the peak: what must fit
    memory_stage: np.ndarray
    optimizer_phase: np.ndarray  # True where the optimizer step is the memory peak
    params_per_gpu: np.ndarray
    dominant_time_index: np.ndarray  # into TIME_KEYS (0, "compute", when every other term is 0)
    dominant_memory_index: np.ndarray  # into TERMS

    def __len__(self) -> int:
        return len(self.table)

    @property
    def fits(self) -> np.ndarray:
        """AnalyticBackend's verdict: ok where the device peak is at most capacity (GPU memory minus headroom)."""
        return self.total_bytes <= self.capacity_bytes

    def status(self, i: int) -> str:
        return "ok" if self.fits[i] else "oom"

    def dominant_time(self, i: int) -> str:
        return TIME_KEYS[int(self.dominant_time_index[i])]

    def dominant_memory(self, i: int) -> str:
        return TERMS[int(self.dominant_memory_index[i])]

    def measurement(self, i: int, layout: Layout | None = None) -> Measurement:
        """Row i as the Measurement `AnalyticBackend(headroom_bytes=...).evaluate(job, layout)` returns."""
        layout = self.table.layout(i) if layout is None else layout
        peak = float(self.total_bytes[i])
        status, reason = self.status(i), ""
        if status == "oom":
            reason = (f"peak memory {peak / GIB:.1f} GiB exceeds {self.capacity_bytes / GIB:.1f} GiB per GPU "
                      f"(largest term: {self.dominant_memory(i)})")
        return Measurement(
            layout=layout, status=status, source="analytic", reason=reason,  # type: ignore[arg-type]
            memory_bytes=peak, allocated_bytes=float(self.allocated_bytes[i]),
            memory={t: float(self.memory[t][i]) for t in TERMS},
            step_time_s=float(self.step_time_s[i]), time={k: float(self.breakdown[k][i]) for k in TIME_KEYS},
            tokens_per_s_per_gpu=float(self.tokens_per_s_per_gpu[i]), tflops_per_gpu=float(self.tflops_per_gpu[i]),
            mfu=float(self.mfu[i]),
            extra={"dominant_time": self.dominant_time(i), "dominant_memory": self.dominant_memory(i),
                   "tokens_per_s_per_gpu_low": float(self.tokens_per_s_per_gpu_low[i]),
                   "tokens_per_s_per_gpu_high": float(self.tokens_per_s_per_gpu_high[i]),
                   "model_flops_per_step": self.model_flops_per_step, "memory_stage": int(self.memory_stage[i]),
                   "memory_phase": "optimizer step" if self.optimizer_phase[i] else "activations",
                   "memory_overhead": {t: float(self.overhead_terms[t][i]) for t in OVERHEAD_TERMS}},
        )


def score_layouts(job: Job, table: LayoutTable, *, cal: Calibration = DEFAULT_CALIBRATION,
                  assumptions: MemoryAssumptions = DEFAULT_ASSUMPTIONS, headroom_bytes: float = 0.0,
                  time_for: str = "all") -> Scores:
    """Every row of `table` scored as the scalar models score it (see the module docstring).

    `time_for="fits"` computes the step time only for the rows that fit (memory first; the others' time figures
    are NaN): most of a large space does not fit, and the per-layer terms are the costly part."""
    if time_for not in ("all", "fits"):
        raise ValueError(f"time_for must be 'all' or 'fits', but got {time_for!r}.")
    capacity = job.cluster.gpu.memory_bytes - float(headroom_bytes)
    if len(table) == 0:
        return _empty(job, table, capacity)
    t = _Rows(table)
    memory = _memory(job, t, assumptions)
    if time_for == "all" or len(table) == 0:
        time = _time(job, t, cal)
    else:
        rows = np.flatnonzero(memory["total_bytes"] <= capacity)
        time = _spread(_time(job, _Rows(table.take(rows)), cal) if len(rows) else None, rows, len(table))
    return Scores(job=job, table=table, capacity_bytes=capacity, **time, **memory)


def _empty(job: Job, table: LayoutTable, capacity: float) -> Scores:
    """The scores of a table without rows (a job no layout divides)."""
    def none(dtype: type = np.float64) -> np.ndarray:
        return np.zeros(0, dtype=dtype)

    return Scores(job=job, table=table, capacity_bytes=capacity, step_time_s=none(),
                  breakdown={k: none() for k in TIME_KEYS}, tokens_per_s_per_gpu=none(),
                  tokens_per_s_per_gpu_low=none(), tokens_per_s_per_gpu_high=none(), tflops_per_gpu=none(), mfu=none(),
                  model_flops_per_step=model_flops_per_step(job.model, job.training), memory={k: none() for k in TERMS},
                  overhead_terms={k: none() for k in OVERHEAD_TERMS}, allocated_bytes=none(), total_bytes=none(),
                  memory_stage=none(np.int64), optimizer_phase=none(bool), params_per_gpu=none(np.int64),
                  dominant_time_index=none(np.int64), dominant_memory_index=none(np.int64))


def _spread(part: dict[str, Any] | None, rows: np.ndarray, n: int) -> dict[str, Any]:
    """Time figures of `rows` placed into full-length arrays (NaN elsewhere; dominant term 0)."""
    def full(values: np.ndarray | None, fill: float = np.nan, dtype: type = np.float64) -> np.ndarray:
        out: np.ndarray = np.full(n, fill, dtype=dtype)
        if values is not None:
            out[rows] = values
        return out

    get = (lambda k: part[k]) if part is not None else (lambda k: None)
    breakdown = {k: full(None if part is None else part["breakdown"][k]) for k in TIME_KEYS}
    flops = part["model_flops_per_step"] if part is not None else float("nan")
    return {**{k: full(get(k)) for k in ("step_time_s", "tokens_per_s_per_gpu", "tokens_per_s_per_gpu_low",
                                          "tokens_per_s_per_gpu_high", "tflops_per_gpu", "mfu")},
            "breakdown": breakdown, "model_flops_per_step": flops,
            "dominant_time_index": full(get("dominant_time_index"), 0, np.int64)}


class _Rows:
    """The table plus the derived columns and the placement groups both models use."""

    def __init__(self, table: LayoutTable) -> None:
        self.table = table
        self.n = len(table)
        self.vpp = table.vpp_size
        self.etp = table.expert_tp
        self.placement = _group(table.tp, table.pp, self.vpp, table.ep, self.etp, table.first_stage_layers,
                                table.last_stage_layers, table.embedding_loss_split, table.pipeline_layout)

        self._layouts: dict[int, Layout] = {}

    def layout(self, i: int) -> Layout:
        """Row i as a Layout (made once: the groups' first rows often coincide)."""
        hit = self._layouts.get(i)
        if hit is None:
            hit = self._layouts[i] = self.table.layout(i)
        return hit


# --- step time ---------------------------------------------------------------------------------------------------
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


def _exposed(comm: np.ndarray, window: np.ndarray, overlap: bool | np.ndarray, params: np.ndarray,
             cal: Calibration) -> np.ndarray:
    """`throughput._exposed_dp_s` over arrays: all of it without overlap, else max(last bucket, comm - window)."""
    last_bucket = comm * np.minimum(1.0, cal.dp_bucket_params / np.maximum(params, 1.0))
    hidden = np.maximum(last_bucket, comm - window)
    return np.where(comm <= 0, 0.0, np.where(overlap, hidden, comm))


def _time(job: Job, t: _Rows, cal: Calibration) -> dict[str, Any]:
    table, training, n = t.table, job.training, t.n
    cal = cal.for_release(training.release)
    rows = np.arange(n)
    m = np.maximum(table.num_microbatches(training.global_batch_size), 1)
    full = table.recompute == FULL
    chunks = np.where(full, table.pp * t.vpp, 0) if training.recompute_num_layers else np.zeros(n, np.int64)
    layer = _group(table.tp, table.cp, table.ep, t.etp, table.mbs, table.sp & (table.tp > 1), table.recompute, chunks,
                   table.cuda_graphs, table.ep_overlap)
    lts = layer.values(lambda i: layer_times(job, t.layout(i), cal))
    # the EP overlap's unpaired warm-up and cool-down chunk steps (`throughput.ep_unpaired_share`, `mixed`)
    overlap = table.ep_overlap & (job.model.moe is not None)
    # a layout without the overlap is its own (the memo returns the same layer times; its share is 0 below)
    alone_lts = layer.values(lambda i: layer_times(job, replace(t.layout(i), ep_overlap=False), cal))
    share = np.zeros(n)
    for i in np.flatnonzero(overlap):
        share[i] = ep_unpaired_share(t.layout(int(i)), int(m[i]))

    def per_layer(f: Callable[[Any], float]) -> np.ndarray:
        paired = _gather([f(lt) for lt in lts], layer)
        if not overlap.any():
            return paired
        alone = _gather([f(a) for a in alone_lts], layer)
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
    # BF16 layers of a low-precision run: per part, their layer times less the run's (`throughput.bf16_delta`)
    twin = bf16_job(job, cal)
    delta: dict[str, dict[str, np.ndarray]] = {}
    if twin is not None:
        b_lts = layer.values(lambda i: layer_times(twin, t.layout(i), cal))
        b_alone = layer.values(lambda i: layer_times(twin, replace(t.layout(i), ep_overlap=False), cal))

        def per_layer_bf16(f: Callable[[Any], float]) -> np.ndarray:
            paired = _gather([f(lt) for lt in b_lts], layer)
            if not overlap.any():
                return paired
            return (1 - share) * paired + share * _gather([f(a) for a in b_alone], layer)

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
    bubble = ((kind["count"] * stage_s).sum(axis=1) - stage_s[rows, slow]) / t.vpp

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
    p2p = _group(table.pp, table.tp, table.cp, table.dp, table.mbs, t.vpp, table.sp, table.cuda_graphs)
    breakdown["pp_bubble"] = bubble
    breakdown["pp_p2p"] = m * _gather(p2p.values(lambda i: pipeline_p2p_s(job, t.layout(i), cal)), p2p)

    heavy = [heaviest_stage(s) for s in stage_lists]
    heavy_ids: dict[tuple[int, int], int] = {}
    heavy_of = np.array([heavy_ids.setdefault((h.dense_params_per_gpu, h.expert_params_per_gpu), len(heavy_ids))
                         for h in heavy])[t.placement.inverse]
    dp = _group(heavy_of, table.tp, table.ep, t.etp, table.dp, table.cp, table.dist_opt, table.fsdp)

    def dp_and_optimizer(i: int) -> tuple[float, ...]:
        layout, stage = t.layout(i), heavy[t.placement.inverse[i]]
        fsdp = fsdp_comm_s(job, layout, cal, stage) if layout.fsdp else (0.0, 0.0, 0.0)
        return (*dp_comm_s(job, layout, cal, stage), optimizer_step_s(job, layout, cal, stage), *fsdp,
                float(fsdp_units(stage)))

    dp_terms = dp.values(dp_and_optimizer)
    grads, gather, params, optimizer, ag_fwd, ag_bwd, rs, units = (_gather([v[j] for v in dp_terms], dp)
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
    zero1 = (_exposed(grads, bwd_window, training.overlap_grad_reduce, params, cal)
             + _exposed(gather, fwd_window, training.overlap_param_gather & table.dist_opt & (not training.muon)
                        & training.overlap_grad_reduce, params, cal))
    # Megatron-FSDP (`throughput.fsdp_exposed_s`): one unit's traffic plus what each pass's compute cannot cover
    hidden = np.minimum(ag_fwd, fwd_window) + np.minimum(ag_bwd + rs, bwd_window)
    zero3 = m * ((ag_fwd + ag_bwd + rs) / units + np.maximum(0.0, ag_fwd - fwd_window)
                 + np.maximum(0.0, ag_bwd + rs - bwd_window) + cal.fsdp_offload_exposed * hidden)
    breakdown["dp_comm"] = np.where(table.fsdp, zero3, zero1)
    breakdown["offload"] = np.zeros(n)
    offloading = table.offload_layers > 0
    if offloading.any():  # `throughput.offload_exposed_s` of each offloading row
        off = _group(table.tp, table.sp, table.cp, table.mbs, t.etp, table.recompute, table.cuda_graphs,
                     table.offload_layers, table.pp, t.vpp, m)
        host = _gather(off.values(lambda i: offload_host_bytes(job, t.layout(i))), off)
        copy_s = host / host_link_bytes_per_s(job)
        share = table.offload_layers / max(job.model.num_layers, 1)
        fwd, bwd = fwd_window * share, bwd_window * share
        hidden_copy = np.minimum(copy_s, fwd) + np.minimum(copy_s, bwd)
        exposed = (np.maximum(0.0, copy_s - fwd) + np.maximum(0.0, copy_s - bwd)
                   + cal.fsdp_offload_exposed * hidden_copy)
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


# --- memory ------------------------------------------------------------------------------------------------------
def _chunk_shape(chunks: tuple[tuple[int, int, int], ...], first_dense: int, last: int, pattern: str | None = None,
                 ) -> list[tuple[int, int, bool, bool, int, int]]:
    """(dense layers, MoE layers, embedding, output, Mamba layers, attention-only layers) of each chunk of a
    stage, as `memory._stage_estimate` reads them (`activations.chunk_kinds`)."""
    out = []
    for k, start, count in chunks:
        dense, moe, mamba, attention = chunk_kinds(pattern, first_dense, start, count)
        out.append((dense, moe, k == 0, k == last, mamba, attention))
    return out


def _memory(job: Job, t: _Rows, assumptions: MemoryAssumptions) -> dict[str, Any]:
    table, model, training, n = t.table, job.model, job.training, t.n
    first_dense = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    m = np.maximum(table.num_microbatches(training.global_batch_size), 1)

    stage_lists = t.placement.values(lambda i: _lookups(job, t.layout(i), assumptions)[0])
    unit = _group(table.tp, table.sp, table.cp, table.mbs, t.etp, table.recompute, table.cuda_graphs)
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
    structure = _group(table.pp, t.vpp, table.first_stage_layers, table.last_stage_layers, table.embedding_loss_split,
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
    state = _group(t.placement.inverse, table.dist_opt, table.dp, table.cp, table.fsdp)
    state_values = np.zeros((len(state), width, 4))
    for g, i in enumerate(state.first):
        layout, stages = t.layout(int(i)), stage_lists[t.placement.inverse[i]]
        for c, (p, _) in enumerate(cands[s_rows[i]]):
            state_values[g, c, :3] = _state_bytes(job, stages[p], layout)
            state_values[g, c, 3] = _optimizer_step_bytes(job, stages[p], layout)
    extra = table.ep_overlap & (model.moe is not None) & (t.vpp > 1)
    flight = _group(table.pp, t.vpp, m, extra)
    flight_values = np.zeros((len(flight), width, depth), dtype=np.int64)
    for g, i in enumerate(flight.first):
        for c, (p, _) in enumerate(cands[s_rows[i]]):
            counts = inflight_microbatches_per_chunk(int(table.pp[i]), int(t.vpp[i]), int(m[i]), p,
                                                     extra_warmup=int(extra[i]))
            flight_values[g, c, :len(counts)] = counts
    work = _group(table.tp, table.sp, table.cp, table.mbs, table.dp, table.cuda_graphs)
    work_values = np.array(work.values(lambda i: [sum(workspace_terms(job, t.layout(i), has_output=o).values())
                                                  for o in (False, True)]))
    allow = _group(table.tp, table.cp, table.dp, table.ep, t.etp, table.pp, table.sp, table.mbs)
    allow_terms = allow.values(lambda i: device_terms(job, t.layout(i), assumptions.allowance))
    overhead_terms = {name: _gather([d[name] for d in allow_terms], allow) for name in OVERHEAD_TERMS[:-1]}
    overhead = _gather([sum(d.values()) for d in allow_terms], allow)
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

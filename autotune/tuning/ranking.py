"""The pick, the ties, equivalent layouts, and how sure the pick is (docs/search.md, "Ties and confidence").

- **Equivalent layouts are one.** `equivalent_to_simpler(table)` marks rows whose figures a simpler row of the
  same space repeats exactly: the distributed optimizer with DP * CP = 1 and expert-DP = 1 shards over a group of
  one (megatron-core `optimizer/__init__.py`: dense state over the DP x CP group, expert state over expert-DP), so
  `dist_opt=true` there is `dist_opt=false`; the simpler form is kept.
- **Never dominated.** A layout that another beats on tokens/s at no more memory is never picked, memory being
  compared at the memory model's resolution (`MEMORY_RESOLUTION`, its mean error on measured runs): B is dominated
  when some A is faster and needs at most B's peak x (1 + resolution).
- **Tied**: layouts within `tolerance` (default 2%) of the fastest. The model does not resolve such differences (its
  calibration band is 10-40% wide and pairs of published layouts of one job differ from it by 10-20%,
  docs/throughput-model.md). Among the tied layouts that are not dominated the pick is the first by: free memory
  outside the memory model's error (`free + headroom kept >= resolution x peak`), then the simplest (`complexity`:
  fewer switches, less recompute, fewer model-parallel dimensions), then the fastest.
- **Within the band**: layouts whose tokens/s lie inside the pick's uncertainty band (`Calibration.band`: the 10th to
  90th percentile of held-out residuals). The model cannot rule them out; they are counted, and the confidence says
  so: "clear" when no other layout lies in the band, else "within the model's uncertainty" with the count and the
  advice to measure the top ones (`--backend megatron`).
- **Memory margin**: a pick whose free memory is inside the memory model's error is flagged (`memory_margin`) with
  the `--headroom-gib` that keeps the error free and what the same rule picks then.
With measurements, the same rules apply to the measured figures, with the measurement's own spread (the relative
spread of its timed steps, at least 1%) as the tolerance and no band.

Pure numpy on arrays aligned with a `LayoutTable` (or with a list of records): no Layout objects on the hot path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autotune.cost.layout_table import LayoutTable
from autotune.tuning.decision import MemoryWarning, RiskierLayout
from search_spaces.layout import Layout
from search_spaces.units import GIB

__all__ = ["pareto_rows", "TIE_TOLERANCE", "MEMORY_RESOLUTION", "Ranking", "decide", "inside_memory_error",
           "riskier_layout", "complexity", "layout_complexity", "equivalent_to_simpler", "canonical", "decide_layouts",
           "measured_tolerance", "MEASURED_TOLERANCE", "dominated", "memory_margin", "switch_count"]

TIE_TOLERANCE = 0.02  # relative tokens/s below which the model's ranking is no reason to prefer a layout
# The memory model's mean |error| of the device peak on 34 public measured runs (docs/memory-model.md section 5,
# `python bench/bench_memory_measured.py`: mean 3.9%, worst 9.4%; tests/test_memory.py ties the two): peaks closer
# than this fraction are not told apart, and free memory below this fraction of the peak is inside the model's error.
MEMORY_RESOLUTION = 0.039


def pareto_rows(tokens: np.ndarray, memory: np.ndarray, eligible: np.ndarray, resolution: float = 0.0) -> np.ndarray:
    """Eligible rows no other eligible row beats on both tokens/s (higher) and memory (lower), by memory: the one
    Pareto rule of the search, the records (`results.pareto_front`), the tables, the report and the plots.
    One sort: fastest first (ties: less memory); a row is on the front when it needs less memory than every
    faster row (equal figures are kept together). With a `resolution` (the memory model's, for predicted peaks), a
    row is on it only when it needs less than every faster row by more than that share: a saving the model cannot
    resolve (8 MB of recompute) is no trade-off (`dominated`)."""
    rows = np.flatnonzero(eligible)
    if len(rows) == 0:
        return rows
    if resolution > 0:
        front = rows[~dominated(tokens, memory, rows, resolution)]
        return front[np.argsort(memory[front], kind="stable")]
    rows = rows[np.lexsort((memory[rows], -tokens[rows]))]
    mem = memory[rows]
    before = np.concatenate(([np.inf], np.minimum.accumulate(mem)[:-1]))
    keep = mem < before
    # equal figures to the previous front row are on the front too
    same = np.concatenate(([False], (mem[1:] == mem[:-1]) & (tokens[rows][1:] == tokens[rows][:-1])))
    keep |= same & np.concatenate(([False], keep[:-1]))
    front = rows[keep]
    return front[np.argsort(memory[front], kind="stable")]


def switch_count(table: LayoutTable) -> np.ndarray:
    """Switches a layout turns on beyond its sizes: recompute, CUDA graphs, the MoE all-to-all overlap, an uneven
    pipeline split (or layout string), Megatron-FSDP, activation offload. SP and the distributed optimizer are the
    standard setting, not counted."""
    split = ((table.first_stage_layers > 0) | (table.last_stage_layers > 0) | table.embedding_loss_split
             | (table.pipeline_layout > 0))
    return ((table.recompute > 0).astype(np.int64) + (table.cuda_graphs > 0) + table.ep_overlap + split
            + table.fsdp + (table.offload_layers > 0))


def complexity(table: LayoutTable) -> np.ndarray:
    """A sortable simplicity rank per row (lower is simpler): the switches turned on (`switch_count`), then the
    recompute level (none, selective, full), then the model-parallel dimensions in use (TP, PP, VPP, CP, EP,
    expert TP above 1), then the model-parallel size TP * PP * CP * EP * ETP."""
    etp = table.expert_tp
    dims = ((table.tp > 1).astype(np.int64) + (table.pp > 1) + (table.vpp_size > 1) + (table.cp > 1)
            + (table.ep > 1) + (etp > 1))
    size = np.minimum(table.tp * table.pp * table.cp * table.ep * etp, 10**9 - 1)
    return (((switch_count(table) * 3 + table.recompute) * 10 + dims) * 10**9 + size).astype(np.int64)


def layout_complexity(layout: Layout) -> int:
    return int(complexity(LayoutTable.from_layouts([layout]))[0])


def equivalent_to_simpler(table: LayoutTable, dist_opt_choices: Sequence[bool] = (False, True)) -> np.ndarray:
    """Rows that repeat a simpler row of the same space exactly: dist_opt=true with DP * CP = 1 and expert-DP = 1
    (when the space also offers dist_opt=false)."""
    if False not in dist_opt_choices:
        return np.zeros(len(table), dtype=bool)
    return table.dist_opt & (table.dp * table.cp == 1) & (table.expert_dp == 1)


def canonical(layout: Layout) -> Layout:
    """The simpler form of an equivalent layout (see `equivalent_to_simpler`)."""
    from dataclasses import replace

    if layout.dist_opt and layout.dp * layout.cp == 1 and layout.expert_dp == 1:
        return replace(layout, dist_opt=False)
    return layout


def dominated(tokens: np.ndarray, memory: np.ndarray, rows: np.ndarray, resolution: float) -> np.ndarray:
    """For each of `rows`: is some other of `rows` faster (strictly) with a peak at most this row's x
    (1 + resolution)? One sort, fastest first: the least memory among the strictly faster rows, against this one."""
    if len(rows) == 0:
        return np.zeros(0, dtype=bool)
    order = np.argsort(-tokens[rows], kind="stable")
    neg = -tokens[rows][order]
    mem = memory[rows][order]
    before = np.concatenate(([np.inf], np.minimum.accumulate(mem)[:-1]))  # least memory of the rows before
    first = np.searchsorted(neg, neg, side="left")  # the first row of each run of equal tokens/s
    out = np.empty(len(rows), dtype=bool)
    out[order] = before[first] <= mem * (1.0 + resolution)
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Ranking:
    """Which row wins and why, by row: indices are into the arrays given to `decide` (the search names the rows and
    adds what else it knows to make its one typed decision, `autotune.tuning.decision.Decision`).

    `order`: the pick first, then the rest by tokens/s (fastest first). `tied`: the rows within `tolerance` of
    the fastest (the pick among them). `candidates`: the tied rows no other row dominates. `in_band`: rows
    (besides the pick) whose tokens/s lie inside the pick's band. `fastest`: the row with the highest tokens/s.
    `resolution`: the relative memory difference below which two peaks count as equal."""

    pick: int | None
    fastest: int | None
    order: np.ndarray
    tied: np.ndarray
    in_band: int
    tolerance: float
    band: tuple[float, float] | None
    reason: str
    confidence: str  # "clear", "within the model's uncertainty", "measured", "measured, tied", "none"
    candidates: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    resolution: float = MEMORY_RESOLUTION
    details: dict[str, Any] = field(default_factory=dict)  # figures named as `Decision` fields (pick_free_gib, ...)
    riskier: int | None = None  # with keep_error_free: the fastest row, faster than the pick, inside the memory error
    error_free: bool = False  # picked among the rows that leave the memory model's error free (`keep_error_free`)


def inside_memory_error(free_bytes: Any, memory_bytes: Any, resolution: float = MEMORY_RESOLUTION,
                        kept_bytes: float = 0.0) -> Any:
    """Is a layout's free memory (plus the headroom the search keeps) inside the memory model's error, its
    `resolution` x the peak? The one rule for "the prediction cannot promise it fits"."""
    return np.asarray(free_bytes) + kept_bytes < resolution * np.asarray(memory_bytes)


def decide(tokens: np.ndarray, free_bytes: np.ndarray, simplicity: np.ndarray, *, eligible: np.ndarray | None = None,
           tolerance: float = TIE_TOLERANCE, band: tuple[float, float] | None = None, measured: bool = False,
           labels: Sequence[str] | None = None, memory_bytes: np.ndarray | None = None,
           resolution: float = MEMORY_RESOLUTION, kept_bytes: float = 0.0, band_note: str | None = None,
           keep_error_free: bool = False) -> Ranking:
    """Rank the eligible rows (fitting, not an equivalent of a simpler one) and pick one (module docstring).

    `keep_error_free`: pick only among the rows that leave the memory model's error free (when any does; the
    fastest of the others is the ranking's `riskier`); else that margin only breaks ties.

    `memory_bytes`: each row's peak (for the resolution and the error margin; without it memory is compared exactly,
    by free memory). `kept_bytes`: the headroom the search keeps beyond `free_bytes`, which counts toward the margin
    against the memory model's error (a row is inside the error when free + kept < resolution x peak). `band` is
    the (low, high) log-ratio band of a prediction (None for measurements), `band_note` why it is wider than the
    fitted one (`Calibration.unfitted`); `labels` name rows in the reason (layout texts), by index."""
    tokens = np.asarray(tokens, dtype=np.float64)
    free_bytes = np.asarray(free_bytes, dtype=np.float64)
    simplicity = np.asarray(simplicity)
    ok = np.isfinite(tokens) if eligible is None else (np.asarray(eligible, dtype=bool) & np.isfinite(tokens))
    rows = np.flatnonzero(ok)
    if len(rows) == 0:
        return Ranking(pick=None, fastest=None, order=rows, tied=rows, in_band=0, tolerance=tolerance, band=band,
                       reason="no layout fits", confidence="none", resolution=resolution)
    if memory_bytes is None:  # compare by free memory, exactly; no error margin
        memory, res = -free_bytes, 0.0
        unsafe = np.zeros(len(tokens), dtype=bool)
    else:
        memory, res = np.asarray(memory_bytes, dtype=np.float64), resolution
        unsafe = inside_memory_error(free_bytes, memory, resolution, kept_bytes)
    everything = rows[np.lexsort((simplicity[rows], -tokens[rows]))]  # fastest first, ties: simpler
    restricted = keep_error_free and bool(unsafe[rows].any()) and not unsafe[rows].all()
    if restricted:
        # inside the error is a peak above a threshold (free = capacity - peak), so no row outside it is dominated
        # by one inside it: the pick among the rows outside the error is the pick of their own space
        rows = rows[~unsafe[rows]]
    by_speed = everything[np.isin(everything, rows)]
    fastest = int(by_speed[0])
    best = tokens[fastest]
    tied = by_speed[tokens[by_speed] >= best * (1.0 - tolerance)]
    beaten = dominated(tokens, memory, tied, res) if len(tied) > 1 else np.zeros(1, dtype=bool)
    # every row faster than a tied row is tied too, so dominance among the tied rows is dominance in the whole space
    candidates = tied[~beaten]
    pick = int(candidates[np.lexsort((-tokens[candidates], simplicity[candidates], unsafe[candidates]))[0]])
    risky = everything[unsafe[everything]] if restricted else everything[:0]
    order = np.concatenate(([pick], by_speed[by_speed != pick], risky))  # inside the error last, when it is kept
    riskier = int(risky[0]) if len(risky) and tokens[risky[0]] > tokens[pick] * (1.0 + 1e-12) else None
    in_band = 0
    if band is not None:
        low = tokens[pick] * math.exp(band[0])
        in_band = int(np.count_nonzero(tokens[everything] >= low)) - 1
    name = (lambda i: labels[i]) if labels is not None else (lambda i: f"row {i}")
    details: dict[str, Any] = {"fastest_tokens_per_s_per_gpu": float(best),
                                  "pick_tokens_per_s_per_gpu": float(tokens[pick]),
                                  "pick_free_gib": float(free_bytes[pick] / GIB),
                                  "dominated_ties": int(len(tied) - len(candidates))}
    if len(by_speed) > 1:
        runner = int(by_speed[by_speed != pick][0])
        details["runner_up_margin"] = float(1.0 - tokens[runner] / tokens[pick])
    what = "measured" if measured else "predicted"
    kept = (f"{len(rows):,} of the {len(everything):,} layouts that fit leave the memory model's error free; among "
            f"them, " if restricted else "")
    reason = kept + _reason(tokens, free_bytes, simplicity, unsafe, fastest=fastest, pick=pick, tied=tied,
                     candidates=candidates, by_speed=by_speed, what=what, tolerance=tolerance, resolution=res,
                     name=name, details=details)
    if measured:
        confidence = "measured, tied" if len(tied) > 1 else "measured"
    elif in_band > 0:
        confidence = "within the model's uncertainty"
        low, high = band  # type: ignore[misc]
        reason += (f"; {in_band:,} other layouts lie within the model's band ({math.exp(low) - 1:+.0%} / "
                   f"{math.exp(high) - 1:+.0%} of tokens/s, held-out residuals"
                   f"{'; ' + band_note if band_note else ''}): measure the top ones to settle it (--backend megatron)")
    else:
        confidence = "clear"
        reason += "; no other layout lies within the model's band" + (f" ({band_note})" if band_note else "")
    return Ranking(pick=pick, fastest=fastest, order=order, tied=tied, in_band=in_band, tolerance=tolerance,
                   band=band, reason=reason, confidence=confidence, candidates=candidates, resolution=resolution,
                   details=details, riskier=riskier, error_free=restricted)


def _reason(tokens: np.ndarray, free: np.ndarray, simplicity: np.ndarray, unsafe: np.ndarray, *, fastest: int,
            pick: int, tied: np.ndarray, candidates: np.ndarray, by_speed: np.ndarray, what: str, tolerance: float,
            resolution: float, name, details: dict[str, object]) -> str:
    """Why the pick: alone at the top, or which rule chose it among the tied layouts."""
    if len(tied) == 1:
        reason = f"the fastest {what} layout"
        if len(by_speed) > 1:
            reason += f", {details['runner_up_margin']:.1%} ahead of the next"
        return reason
    reason = f"{len(tied):,} layouts are within {tolerance:.0%} of the fastest {what} one"
    beaten = len(tied) - len(candidates)
    if beaten:
        at = f" (memory compared at the memory model's {resolution:.1%} resolution)" if resolution else ""
        reason += f"; {beaten:,} of them another beats on speed at no more memory{at}"
    if len(candidates) == 1:
        return reason + "; the fastest is the only one left"
    reason += f"; of the {len(candidates):,} left, picked "
    if pick == fastest:
        return reason + "the fastest (no other is simpler or leaves memory beyond the model's error)"
    if unsafe[fastest] and not unsafe[pick]:
        why = (f"one whose free memory ({free[pick] / GIB:.1f} GiB) is outside the memory model's error, "
               f"vs {free[fastest] / GIB:.1f} GiB for {name(fastest)}")
    elif simplicity[pick] < simplicity[fastest]:
        why = f"the simplest (fewer switches and model-parallel dimensions than {name(fastest)})"
    else:
        why = f"the fastest of those outside the memory model's error, ahead of {name(fastest)}"
    return reason + why + f", at {tokens[pick] / tokens[fastest] - 1:+.1%} tokens/s"


def memory_margin(tokens: np.ndarray, memory_bytes: np.ndarray, capacity_bytes: float, simplicity: np.ndarray, *,
                  eligible: np.ndarray, pick: int | None, tolerance: float = TIE_TOLERANCE,
                  resolution: float = MEMORY_RESOLUTION, labels: Any = None,
                  kept_bytes: float = 0.0) -> MemoryWarning | None:
    """None when the pick's free memory is outside the memory model's error; else the warning: its free memory, the
    error (resolution x its peak), the `--headroom-gib` that keeps that much free, and what the same rule picks
    with that headroom (the layout, its tokens/s and the change). `capacity_bytes` is what the search let a layout
    use: the GPU's memory minus the `kept_bytes` of headroom it already keeps, which counts toward the margin (free
    + kept against the error). With the headroom named, every layout that fits leaves the error free (a layout with
    a larger peak than the pick's no longer fits), so a search with that `--headroom-gib` gives the pick named and
    no warning."""
    if pick is None:
        return None
    memory = np.asarray(memory_bytes, dtype=np.float64)
    free = capacity_bytes - memory
    error = resolution * memory[pick]
    if not inside_memory_error(free[pick], memory[pick], resolution, kept_bytes):
        return None
    # the error, rounded up to the tenth of a GiB --headroom-gib is given in (above what is kept, as free + kept < it)
    headroom_gib = math.ceil(round(error / GIB * 10, 6)) / 10
    headroom = headroom_gib * GIB - kept_bytes  # beyond what the search already keeps
    safe = np.asarray(eligible, dtype=bool) & (free >= headroom)
    then = decide(tokens, free - headroom, simplicity, eligible=safe, tolerance=tolerance, memory_bytes=memory,
                  resolution=resolution, kept_bytes=headroom_gib * GIB)
    beyond = f" beyond the {kept_bytes / GIB:.1f} GiB headroom kept" if kept_bytes > 0 else ""
    text = (f"the pick leaves {free[pick] / GIB:.1f} GiB free{beyond}, inside the memory model's error "
            f"({resolution:.1%} of its {memory[pick] / GIB:.1f} GiB peak = {error / GIB:.1f} GiB); to keep that "
            f"margin, search with --headroom-gib {headroom_gib:.1f}")
    figures = {"free_gib": float(free[pick] / GIB), "error_gib": float(error / GIB), "memory_resolution": resolution,
               "headroom_gib": headroom_gib}
    if then.pick is None:
        return MemoryWarning(**figures, text=text + ": then no layout fits")
    layout = labels[then.pick] if labels is not None else str(then.pick)
    change = float(tokens[then.pick] / tokens[pick] - 1.0)
    text += (f": it picks {layout} ({tokens[then.pick]:,.0f} tokens/s/GPU, {change:+.1%}, "
             f"{free[then.pick] / GIB:.1f} GiB free)")
    return MemoryWarning(**figures, text=text, layout=layout, tokens_per_s_per_gpu=float(tokens[then.pick]),
                         change=change, free_then_gib=float(free[then.pick] / GIB))


def riskier_layout(tokens: np.ndarray, memory_bytes: np.ndarray, capacity_bytes: float, *, pick: int | None,
                   riskier: int | None, resolution: float = MEMORY_RESOLUTION, labels: Any = None,
                   kept_bytes: float = 0.0) -> RiskierLayout | None:
    """The ranking's `riskier` row (faster than the pick, inside the memory model's error) as the note shown beside
    the pick; None without one."""
    if pick is None or riskier is None:
        return None
    peak = float(memory_bytes[riskier])
    free, error = capacity_bytes - peak, resolution * peak
    layout = labels[riskier] if labels is not None else str(riskier)
    change = float(tokens[riskier] / tokens[pick] - 1.0)
    beyond = f" beyond the {kept_bytes / GIB:.1f} GiB headroom kept" if kept_bytes > 0 else ""
    text = (f"a faster layout by the model, {layout} ({tokens[riskier]:,.0f} tokens/s/GPU, {change:+.1%}), leaves "
            f"{free / GIB:.1f} GiB free{beyond}, inside the memory model's error ({resolution:.1%} of its "
            f"{peak / GIB:.1f} GiB peak = {error / GIB:.1f} GiB), so it is not the pick; to accept that risk, search "
            f"with --headroom-gib 0, or measure its peak: --backend megatron --layout '{layout}'")
    return RiskierLayout(layout=layout, tokens_per_s_per_gpu=float(tokens[riskier]), change=change,
                         free_gib=free / GIB, error_gib=error / GIB, text=text)


MEASURED_TOLERANCE = 0.01  # the least spread a measured tokens/s is taken to have


def measured_tolerance(step_times: Sequence[float], stdevs: Sequence[float]) -> float:
    """The relative spread of the timed steps (the median over the measurements that report one), at least 1%."""
    spreads = sorted(s / t for t, s in zip(step_times, stdevs, strict=True) if t and t > 0 and s is not None and s >= 0)
    return max(MEASURED_TOLERANCE, spreads[len(spreads) // 2] if spreads else 0.0)


def decide_layouts(layouts: Sequence[Layout], tokens: Sequence[float], free_bytes: Sequence[float], *,
                   tolerance: float, measured: bool, memory_bytes: Sequence[float] | None = None,
                   kept_bytes: float = 0.0) -> Ranking:
    """`decide` over a list of layouts (one entry per distinct layout), e.g. the measured ones."""
    table = LayoutTable.from_layouts(layouts)
    dist_opt = sorted({lay.dist_opt for lay in layouts})
    eligible = ~equivalent_to_simpler(table, dist_opt) if len(dist_opt) > 1 else np.ones(len(layouts), dtype=bool)
    return decide(np.asarray(tokens, dtype=np.float64), np.asarray(free_bytes, dtype=np.float64), complexity(table),
                  eligible=eligible, tolerance=tolerance, measured=measured, labels=[str(lay) for lay in layouts],
                  memory_bytes=None if memory_bytes is None else np.asarray(memory_bytes, dtype=np.float64),
                  kept_bytes=kept_bytes)

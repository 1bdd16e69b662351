"""The pick, the ties, equivalent layouts, and how sure the pick is (docs/search.md, "Ties and confidence").

- **Equivalent layouts are one.** `equivalent_to_simpler(table)` marks rows whose figures a simpler row of the
  same space repeats exactly: the distributed optimizer with DP * CP = 1 and expert-DP = 1 shards over a group of
  one (megatron-core `optimizer/__init__.py`: dense state over the DP x CP group, expert state over expert-DP), so
  `dist_opt=true` there is `dist_opt=false`; the simpler form is kept.
- **Tied**: layouts within `tolerance` (default 2%) of the fastest. The model does not resolve such differences (its
  calibration band is 10-40% wide and pairs of published layouts of one job differ from it by 10-20%,
  docs/throughput-model.md), so among them the pick is the one with the most free memory (the furthest from an OOM
  the memory model did not foresee), then the simplest (fewest model-parallel dimensions, `complexity`), then the
  fastest.
- **Within the band**: layouts whose tokens/s lie inside the pick's uncertainty band (`Calibration.band`: the 10th to
  90th percentile of held-out residuals). The model cannot rule them out; they are counted, and the confidence says
  so: "clear" when no other layout lies in the band, else "within the model's uncertainty" with the count and the
  advice to measure the top ones (`--backend megatron`).
With measurements, the same rules apply to the measured figures, with the measurement's own spread (the relative
spread of its timed steps, at least 1%) as the tolerance and no band.

Pure numpy on arrays aligned with a `LayoutTable` (or with a list of records): no Layout objects on the hot path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autotune.cost.layout_table import LayoutTable
from search_spaces.layout import Layout

__all__ = ["TIE_TOLERANCE", "Decision", "decide", "complexity", "layout_complexity", "equivalent_to_simpler",
           "canonical", "decide_layouts", "measured_tolerance", "MEASURED_TOLERANCE"]

TIE_TOLERANCE = 0.02  # relative tokens/s below which the model's ranking is no reason to prefer a layout
GIB = 1024**3


def complexity(table: LayoutTable) -> np.ndarray:
    """A sortable simplicity rank per row (lower is simpler): model-parallel dimensions in use (TP, PP, VPP, CP,
    EP, expert TP above 1), then the model-parallel size TP * PP * CP * EP * ETP, then the recompute level."""
    etp = table.expert_tp
    dims = ((table.tp > 1).astype(np.int64) + (table.pp > 1) + (table.vpp_size > 1) + (table.cp > 1)
            + (table.ep > 1) + (etp > 1))
    size = table.tp * table.pp * table.cp * table.ep * etp
    return (dims * 10**9 + np.minimum(size, 10**8 - 1) * 10 + table.recompute).astype(np.int64)


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


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """Which row wins and why. Indices are into the arrays given to `decide`.

    `order`: the pick first, then the rest by tokens/s (fastest first). `tied`: the rows within `tolerance` of
    the fastest (the pick among them). `in_band`: rows (besides the pick) whose tokens/s lie inside the pick's
    band. `fastest`: the row with the highest tokens/s."""

    pick: int | None
    fastest: int | None
    order: np.ndarray
    tied: np.ndarray
    in_band: int
    tolerance: float
    band: tuple[float, float] | None
    reason: str
    confidence: str  # "clear", "within the model's uncertainty", "measured", "measured, tied", "none"
    details: dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"confidence": self.confidence, "reason": self.reason, "tied": int(len(self.tied)),
                "tolerance": self.tolerance, "within_band": self.in_band,
                "band": None if self.band is None else list(self.band), **self.details}


def decide(tokens: np.ndarray, free_bytes: np.ndarray, simplicity: np.ndarray, *, eligible: np.ndarray | None = None,
           tolerance: float = TIE_TOLERANCE, band: tuple[float, float] | None = None, measured: bool = False,
           labels: Sequence[str] | None = None) -> Decision:
    """Rank the eligible rows (fitting, not an equivalent of a simpler one) and pick one (module docstring).

    `band` is the (low, high) log-ratio band of a prediction (None for measurements); `labels` name rows in the
    reason (layout texts), by index."""
    tokens = np.asarray(tokens, dtype=np.float64)
    ok = np.isfinite(tokens) if eligible is None else (np.asarray(eligible, dtype=bool) & np.isfinite(tokens))
    rows = np.flatnonzero(ok)
    if len(rows) == 0:
        return Decision(pick=None, fastest=None, order=rows, tied=rows, in_band=0, tolerance=tolerance, band=band,
                        reason="no layout fits", confidence="none")
    by_speed = rows[np.lexsort((simplicity[rows], -tokens[rows]))]  # fastest first, ties: simpler
    fastest = int(by_speed[0])
    best = tokens[fastest]
    tied = by_speed[tokens[by_speed] >= best * (1.0 - tolerance)]
    pick = int(tied[np.lexsort((-tokens[tied], simplicity[tied], -free_bytes[tied]))[0]])
    order = np.concatenate(([pick], by_speed[by_speed != pick]))
    in_band = 0
    if band is not None:
        low = tokens[pick] * math.exp(band[0])
        in_band = int(np.count_nonzero(tokens[rows] >= low)) - 1
    name = (lambda i: labels[i]) if labels is not None else (lambda i: f"row {i}")
    details: dict[str, object] = {"fastest_tokens_per_s_per_gpu": float(best),
                                  "pick_tokens_per_s_per_gpu": float(tokens[pick]),
                                  "pick_free_gib": float(free_bytes[pick] / GIB)}
    if len(by_speed) > 1:
        runner = int(order[1])
        details["runner_up_margin"] = float(1.0 - tokens[runner] / tokens[pick])
    what = "measured" if measured else "predicted"
    if len(tied) > 1:
        reason = (f"{len(tied):,} layouts are within {tolerance:.0%} of the fastest {what} one; picked the one "
                  f"with the "
                  f"most free memory ({free_bytes[pick] / GIB:.1f} GiB")
        reason += f", vs {free_bytes[fastest] / GIB:.1f} GiB for {name(fastest)})" if pick != fastest else ")"
        if pick != fastest:
            reason += f" at {tokens[pick] / best - 1:+.1%} tokens/s"
    else:
        reason = f"the fastest {what} layout"
        if len(by_speed) > 1:
            reason += f", {details['runner_up_margin']:.1%} ahead of the next"
    if measured:
        confidence = "measured, tied" if len(tied) > 1 else "measured"
    elif in_band > 0:
        confidence = "within the model's uncertainty"
        low, high = band  # type: ignore[misc]
        reason += (f"; {in_band:,} other layouts lie within the model's band ({math.exp(low) - 1:+.0%} / "
                   f"{math.exp(high) - 1:+.0%} of tokens/s, held-out residuals): measure the top ones to settle it "
                   f"(--backend megatron)")
    else:
        confidence = "clear"
        reason += "; no other layout lies within the model's band"
    return Decision(pick=pick, fastest=fastest, order=order, tied=tied, in_band=in_band, tolerance=tolerance,
                    band=band, reason=reason, confidence=confidence, details=details)


MEASURED_TOLERANCE = 0.01  # the least spread a measured tokens/s is taken to have


def measured_tolerance(step_times: Sequence[float], stdevs: Sequence[float]) -> float:
    """The relative spread of the timed steps (the median over the measurements that report one), at least 1%."""
    spreads = sorted(s / t for t, s in zip(step_times, stdevs, strict=True) if t and t > 0 and s is not None and s >= 0)
    return max(MEASURED_TOLERANCE, spreads[len(spreads) // 2] if spreads else 0.0)


def decide_layouts(layouts: Sequence[Layout], tokens: Sequence[float], free_bytes: Sequence[float], *,
                   tolerance: float, measured: bool) -> Decision:
    """`decide` over a list of layouts (one entry per distinct layout), e.g. the measured ones."""
    table = LayoutTable.from_layouts(layouts)
    dist_opt = sorted({lay.dist_opt for lay in layouts})
    eligible = ~equivalent_to_simpler(table, dist_opt) if len(dist_opt) > 1 else np.ones(len(layouts), dtype=bool)
    return decide(np.asarray(tokens, dtype=np.float64), np.asarray(free_bytes, dtype=np.float64), complexity(table),
                  eligible=eligible, tolerance=tolerance, measured=measured, labels=[str(lay) for lay in layouts])

"""Rows of a layout table grouped by the fields a term reads, so each term is computed once per distinct value.

    rows = Rows(table); g = group(table.tp, table.cp); per_row = gather(g.values(lambda i: f(rows.layout(i))), g)

The cost assembly (`autotune/cost/step_time.py`, `peak_memory.py`) computes a term that depends on a few layout
fields once per group of rows with equal fields, by the term's own function on one row's `Layout`, and spreads the
results to the rows with `gather`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.cost.layout_table import LayoutTable
from search_spaces.layout import Layout

__all__ = ["Groups", "group", "gather", "Rows"]


@dataclass(frozen=True, slots=True)
class Groups:
    """Rows grouped by equal keys: `first[g]` is a row of group g, `inverse[i]` the group of row i."""

    first: np.ndarray
    inverse: np.ndarray

    def __len__(self) -> int:
        return len(self.first)

    def values(self, f: Callable[[int], Any]) -> list[Any]:
        """f(row) for the first row of each group."""
        return [f(int(i)) for i in self.first]


def group(*columns: np.ndarray) -> Groups:
    """Group rows by the tuple of `columns` (non-negative integers or booleans)."""
    n = len(columns[0])
    if n <= 1:  # one layout (an estimate): one group, or none
        return Groups(first=np.zeros(n, dtype=np.int64), inverse=np.zeros(n, dtype=np.int64))
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
    return Groups(first=first, inverse=inverse.reshape(-1))


def gather(values: Sequence[Any], groups: Groups) -> np.ndarray:
    """Per-group scalars spread to the rows."""
    return np.asarray(values, dtype=np.float64)[groups.inverse]


class Rows:
    """The table plus the derived columns and the placement groups both the time and the memory assembly use."""

    def __init__(self, table: LayoutTable) -> None:
        self.table = table
        self.n = len(table)
        self.vpp = table.vpp_size
        self.etp = table.expert_tp
        self.placement = group(table.tp, table.pp, self.vpp, table.ep, self.etp, table.first_stage_layers,
                               table.last_stage_layers, table.embedding_loss_split, table.pipeline_layout)
        self._layouts: dict[int, Layout] = {}

    def layout(self, i: int) -> Layout:
        """Row i as a Layout (made once: the groups' first rows often coincide)."""
        hit = self._layouts.get(i)
        if hit is None:
            hit = self._layouts[i] = self.table.layout(i)
        return hit

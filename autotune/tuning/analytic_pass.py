"""The analytic pass: score the whole feasible space with the cost models and rank it (the default answer).

    answer = analytic_pass(job, space, capacity_bytes=...)
    answer.ranking.pick         # row of the pick (the exact optimum of the model, up to ties)
    answer.records(top=64)      # TrialRecords of the ranked rows, the Pareto front and the closest misses

Every layout of `space` is scored by `autotune.cost.score.score_layouts` (the memory and throughput models, vectorised;
figures equal to `AnalyticBackend.evaluate` per layout; the step time only where the layout fits), then
`autotune.tuning.ranking.decide` picks among the
layouts that fit: the fastest, up to ties (never one another beats on speed at no more memory; then free memory
outside the memory model's error, then the simplest), equivalent layouts merged; by default only among the layouts
that leave the memory model's error free, when any does. No Ray,
no Optuna, no Layout object per row.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autotune.cost.efficiency import DEFAULT_CALIBRATION, Calibration
from autotune.cost.layout_table import LayoutTable
from autotune.cost.score import Scores, score_layouts
from autotune.tuning.ranking import TIE_TOLERANCE, Ranking, complexity, decide, equivalent_to_simpler, pareto_rows
from search_spaces.job import Job
from search_spaces.layout import CUDA_GRAPH_CHOICES, Layout
from search_spaces.measurement import Measurement
from search_spaces.space import FeasibleSpace

__all__ = ["AnalyticAnswer", "analytic_pass", "closest_rows"]



def closest_rows(memory: np.ndarray, k: int) -> np.ndarray:
    """The k rows with the least of `memory` (what came nearest to fitting: `Scores.overflow`)."""
    k = min(k, len(memory))
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    part = np.argpartition(memory, k - 1)[:k]
    return part[np.argsort(memory[part], kind="stable")]


@dataclass(frozen=True, kw_only=True, eq=False)
class AnalyticAnswer:
    """The whole space scored and ranked. `eligible`: fits and is not an equivalent of a simpler layout."""

    job: Job
    space: FeasibleSpace
    table: LayoutTable
    scores: Scores
    eligible: np.ndarray
    ranking: Ranking
    seconds: dict[str, float] = field(default_factory=dict)
    cal: Calibration = DEFAULT_CALIBRATION  # what the space was scored with

    @property
    def size(self) -> int:
        return len(self.table)

    @property
    def free_bytes(self) -> np.ndarray:
        return self.scores.capacity_bytes - self.scores.total_bytes

    def layout(self, i: int) -> Layout:
        return self.table.layout(int(i))

    def measurement(self, i: int) -> Measurement:
        """Row i as `AnalyticBackend.evaluate` gives it (rows that do not fit were scored for memory only: their
        time is computed now)."""
        if np.isnan(self.scores.step_time_s[i]):
            from autotune.cost.analytic import AnalyticBackend

            headroom = self.job.cluster.gpu.memory_bytes - self.scores.capacity_bytes
            return AnalyticBackend(headroom_bytes=headroom, calibration=self.cal).evaluate(self.job, self.layout(i))
        return self.scores.measurement(int(i))

    def index_of(self, layout: Layout) -> int | None:
        """The row of `layout` in the table (None when the space does not hold it)."""
        t = self.table
        v = layout.vpp or 0
        e = layout.etp or 0
        hit = np.flatnonzero((t.tp == layout.tp) & (t.pp == layout.pp) & (t.vpp == v) & (t.cp == layout.cp)
                             & (t.ep == layout.ep) & (t.etp == e) & (t.dp == layout.dp) & (t.mbs == layout.mbs)
                             & (t.sp == layout.sp) & (t.dist_opt == layout.dist_opt))
        for i in hit:
            if t.layout(int(i)) == layout:
                return int(i)
        return None

    def ranked_rows(self, top: int) -> np.ndarray:
        return self.ranking.order[:top]

    def pareto(self) -> np.ndarray:
        return pareto_rows(self.scores.tokens_per_s_per_gpu, self.scores.total_bytes, self.eligible)

    def rows_to_keep(self, top: int, misses: int = 5) -> list[int]:
        """The rows worth a record: the ranked top, the Pareto front, and, when nothing fits, the closest misses."""
        keep = list(dict.fromkeys([*map(int, self.ranked_rows(top)), *map(int, self.pareto())]))
        if self.ranking.pick is None:
            keep += [int(i) for i in closest_rows(self.scores.overflow, misses) if int(i) not in keep]
        return keep


def analytic_pass(job: Job, space: FeasibleSpace, *, capacity_bytes: float | None = None,
                  headroom_bytes: float = 0.0, cal: Calibration = DEFAULT_CALIBRATION,
                  tolerance: float = TIE_TOLERANCE, keep_error_free: bool = True) -> AnalyticAnswer:
    """Score and rank every layout of `space` (module docstring). `capacity_bytes` defaults to the GPU's memory
    minus `headroom_bytes`. `keep_error_free`: the pick leaves the memory model's error free when some layout
    does (the default; a search given `--headroom-gib` trusts that headroom instead)."""
    t0 = time.perf_counter()
    table = LayoutTable.from_space(space)
    t1 = time.perf_counter()
    headroom = headroom_bytes if capacity_bytes is None else job.cluster.gpu.memory_bytes - capacity_bytes
    scores = score_layouts(job, table, cal=cal, headroom_bytes=headroom, time_for="fits")
    t2 = time.perf_counter()
    eligible = scores.fits & ~equivalent_to_simpler(table, space.options.dist_opt)
    ranking = decide(scores.tokens_per_s_per_gpu, scores.capacity_bytes - scores.total_bytes, complexity(table),
                      eligible=eligible, tolerance=tolerance,
                      band=cal.band_for(job.cluster.gpu, job.training.precision, job.model.is_moe),
                      band_note=_band_note(job, table, cal),
                      labels=_Labels(table), memory_bytes=scores.total_bytes,
                      kept_bytes=job.cluster.gpu.memory_bytes - float(scores.capacity_bytes),
                      keep_error_free=keep_error_free)
    t3 = time.perf_counter()
    return AnalyticAnswer(job=job, space=space, table=table, scores=scores, eligible=eligible, ranking=ranking,
                          cal=cal,
                          seconds={"table_s": t1 - t0, "score_s": t2 - t1, "rank_s": t3 - t2})


def _band_note(job: Job, table: LayoutTable, cal: Calibration) -> str | None:
    """Why the band is wider than the fitted one, and which of the space's CUDA-graph settings are timed as
    another (`Calibration.unfitted`, `uncredited_graph_settings`), or None."""
    codes = np.unique(2 * table.cuda_graphs.astype(np.int64) + (table.offload_layers > 0))  # (graphs, offload)
    settings = [(CUDA_GRAPH_CHOICES[int(c) // 2], bool(c % 2)) for c in codes]
    notes = (cal.unfitted(job.cluster.gpu, job.training.precision, job.model.is_moe),
             cal.uncredited_graph_settings(job.cluster.gpu, settings))
    return "; ".join(n for n in notes if n) or None


class _Labels(Sequence[str]):
    """Layout texts of a table's rows, made when asked (the ranking names two or three)."""

    def __init__(self, table: LayoutTable) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i):
        return str(self.table.layout(int(i)))

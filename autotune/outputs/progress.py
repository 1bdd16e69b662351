"""The progress bar of a search: trials done out of the budget, feasible count, best so far (stderr), the best
layout written short (`tp2 pp2 vpp2 ep8 dp8 mbs1 sp dopt`) so that the bar fits its line.

`make_progress(spec, ...)` gives None (no progress), a rich bar (`"on"`, or `"auto"` when stderr is a
terminal), or a wrapper around the caller's own `callable(record, done, total)`. The object is a
context manager with `update(record, done, total)`; rich is imported only when a bar is drawn.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from autotune.tuning.results import TrialRecord

__all__ = ["make_progress", "progress_factory", "RichProgress", "CallbackProgress", "StatusLine"]


class CallbackProgress:
    def __init__(self, fn: Callable[[TrialRecord, int, int], None]) -> None:
        self.fn = fn

    def update(self, record: TrialRecord, done: int, total: int) -> None:
        self.fn(record, done, total)

    def __enter__(self) -> CallbackProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _compact(layout: Any) -> str:
    """`tp2 pp2 vpp2 ep8 dp8 mbs1 sp dopt`: the layout short enough for the bar's line."""
    from autotune.outputs.tables import layout_cells

    cells = layout_cells(layout)
    sizes = [f"{k}{cells[k]}" for k in ("tp", "pp", "vpp", "cp", "ep", "dp", "mbs") if cells[k] not in ("-", "1")
             or k in ("tp", "pp", "dp", "mbs")]
    return " ".join(sizes + ([] if cells["flags"] == "-" else [cells["flags"]]))


class RichProgress:
    """A transient rich bar: `trials 12/64  feasible 9  best 3,120 tok/s/GPU tp2 pp4 dp4 mbs1 sp`."""

    def __init__(self, *, total: int, done: int, records: Sequence[TrialRecord]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("[bold]search"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                  TextColumn("{task.description}"), console=Console(stderr=True), transient=True)
        self._task = self._progress.add_task("", total=total, completed=done)
        self._feasible = sum(r.feasible for r in records)
        best = [r for r in records if r.feasible]
        self._best = max(best, key=lambda r: r.measurement.tokens_per_s_per_gpu or 0.0) if best else None

    def update(self, record: TrialRecord, done: int, total: int) -> None:
        if record.feasible:
            self._feasible += 1
            if self._best is None or (record.measurement.tokens_per_s_per_gpu or 0.0) > \
                    (self._best.measurement.tokens_per_s_per_gpu or 0.0):
                self._best = record
        best = "" if self._best is None else \
            f"  best {self._best.measurement.tokens_per_s_per_gpu or 0:,.0f} tok/s/GPU {_compact(self._best.layout)}"
        self._progress.update(self._task, completed=done, total=total,
                              description=f"feasible {self._feasible}{best}")

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()


def make_progress(spec: Any, *, total: int, done: int, capacity_bytes: float,
                  records: Sequence[TrialRecord]) -> RichProgress | CallbackProgress | None:
    if spec is None:
        return None
    if callable(spec):
        return CallbackProgress(spec)
    if spec == "auto" and not sys.stderr.isatty():
        return None
    return RichProgress(total=total, done=done, records=records)


def progress_factory(spec: Any) -> Callable[..., RichProgress | CallbackProgress | None] | None:
    """What `run_search(progress=...)` takes, from what a person asks for: None (a bar when stderr is a terminal),
    True (a bar), False (nothing), or a callable(record, done, total) of their own."""
    if spec is False:
        return None
    resolved = "auto" if spec is None else "on" if spec is True else spec

    def factory(*, total: int, done: int, capacity_bytes: float, records: Sequence[TrialRecord]):
        return make_progress(resolved, total=total, done=done, capacity_bytes=capacity_bytes, records=records)

    return factory


class StatusLine:
    """A transient rich status line on stderr (`autotune: scoring 33,768 layouts ...`) from the search's first
    second until its first trial's bar or its tables; nothing when stderr is not a terminal (rich's `is_terminal`)
    or `enabled` is False.
    `update(text)` changes the line; `stop()` ends it (a progress bar cannot share the terminal with it)."""

    def __init__(self, enabled: bool = True) -> None:
        self._status: Any = None
        if enabled:
            from rich.console import Console

            console = Console(stderr=True)
            if console.is_terminal:  # a terminal, or FORCE_COLOR set (bench/bench_search_e2e.py)
                self._status = console.status("autotune: starting ...")

    def update(self, text: str) -> None:
        if self._status is not None:
            self._status.update(f"autotune: {text} ...")

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __enter__(self) -> StatusLine:
        if self._status is not None:
            self._status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

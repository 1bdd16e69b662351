"""The terminal tables: ranked layouts, the Pareto front, and one layout's memory and time breakdowns.

A layout is shown as short columns (`tp pp vpp cp ep etp dp mbs`, then its flags) so that a row reads at 80
columns and two rows never look alike; the table keeps the columns that fit the width, most important first
(80: the layout, tokens/s per GPU, MFU, memory, free memory; 120: also what bounds the step time, where the
layout came from and the megatron backend's predictions). `wide=True` shows every column and the layout text.
The width is the terminal's, `COLUMNS` when set (also when piped), else 120 when piped. rich is imported inside
the functions.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from search_spaces.layout import Layout
from search_spaces.units import GIB

__all__ = ["terminal_width", "make_console", "print_nearest", "layout_cells", "layout_flags", "ranked_table",
           "pareto_table", "breakdown_table", "verdict_text", "paragraph", "FLAGS_LEGEND", "MARKS_LEGEND",
           "PIPED_WIDTH", "WIDE_WIDTH"]

PIPED_WIDTH = 120  # piped without COLUMNS: complete rows
WIDE_WIDTH = 100_000  # --wide: no column is dropped, no cell is wrapped
FLAGS_TEXT = ("sp sequence parallel, dopt distributed optimizer, rc recompute (sel/full), cg CUDA graphs (te: "
              "Transformer Engine's per layer, full: full-iteration, local: megatron-core's per layer), a2a MoE "
              "all-to-all overlap, split uneven pipeline stages (first|..|last layers; emb+loss: embedding and loss "
              "count as layers), fsdp Megatron-FSDP (ZeRO-3), off=N activations of N layers offloaded to the host")
FLAGS_LEGEND = "flags: " + FLAGS_TEXT
MARKS_LEGEND = ("* the pick, = tied with the pick (the model cannot tell them apart), ! free memory inside the memory "
                "model's error (may not fit; without --headroom-gib never the pick while another layout leaves it "
                "free)")
_GRAPH_FLAGS = {"transformer_engine": "te", "full_iteration": "full", "local": "local"}
_GAP = 1  # columns are separated by one space (box.SIMPLE_HEAD without padding)
_FLAGS_NARROW = 16  # the flags column wraps onto a second line beyond this, unless wide ("sp dopt rc=full" is 15)


def terminal_width(stream: Any = None) -> int:
    """`COLUMNS` when set (a shell exports it; set it when piping), the terminal's width, else PIPED_WIDTH."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    stream = stream or sys.stdout
    if hasattr(stream, "isatty") and stream.isatty():
        return shutil.get_terminal_size((PIPED_WIDTH, 24)).columns
    return PIPED_WIDTH


def make_console(*, wide: bool = False, width: int | None = None, stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(width=WIDE_WIDTH if wide else (width or terminal_width()), stderr=stderr, highlight=False)


def layout_flags(layout: Layout) -> str:
    """`sp dopt rc=sel cg=te a2a split=3|..|2`: the layout's switches in a few characters (FLAGS_LEGEND says them in
    words)."""
    flags = [name for name, on in (("sp", layout.sp), ("dopt", layout.dist_opt)) if on]
    if layout.recompute != "none":
        flags.append("rc=" + {"selective": "sel"}.get(layout.recompute, layout.recompute))
    if layout.cuda_graphs != "none":
        flags.append("cg=" + _GRAPH_FLAGS[layout.cuda_graphs])
    if layout.ep_overlap:
        flags.append("a2a")
    if layout.fsdp:
        flags.append("fsdp")
    if layout.offload_layers:
        flags.append(f"off={layout.offload_layers}")
    if layout.embedding_loss_split:
        flags.append("split=emb+loss")
    elif layout.first_stage_layers is not None or layout.last_stage_layers is not None:
        first, last = layout.first_stage_layers, layout.last_stage_layers
        flags.append(f"split={'' if first is None else first}|..|{'' if last is None else last}")
    pipeline_layout = getattr(layout, "pipeline_layout", None)
    if pipeline_layout:
        flags.append(f"layout={pipeline_layout}")
    return " ".join(flags) or "-"


def layout_cells(layout: Layout) -> dict[str, str]:
    """The layout's short columns: tp pp vpp cp ep etp dp mbs flags (vpp '-' when not interleaved)."""
    return {"tp": str(layout.tp), "pp": str(layout.pp), "vpp": str(layout.vpp or "-"), "cp": str(layout.cp),
            "ep": str(layout.ep), "etp": str(layout.expert_tp), "dp": str(layout.dp), "mbs": str(layout.mbs),
            "flags": layout_flags(layout)}


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _bytes(value: float | None) -> str:
    """GiB, or MiB / KiB for the small figures of CPU-proxy jobs (which would all read 0.0 GiB)."""
    if value is None:
        return "-"
    for unit, size in (("", GIB), (" MiB", 1024**2)):
        if value >= 0.1 * size:
            return f"{value / size:.1f}{unit}"
    return f"{value / 1024:.1f} KiB"


def _bound(r: Any) -> str:
    from autotune.outputs.terms import bound_cell

    return bound_cell(r.measurement)


def _proxy_cell(r: Any) -> str:
    """What the CPU proxy found for a layout (`ok 1,430 tok/s`, `failed`), '-' when it did not run it."""
    proxy = r.measurement.extra.get("proxy")
    if not isinstance(proxy, dict):
        return "-"
    tps = proxy.get("tokens_per_s_per_gpu")
    return f"{proxy.get('status')} {tps:,.0f} tok/s" if proxy.get("status") == "ok" and tps else str(proxy["status"])


@dataclass(frozen=True, slots=True)
class _Column:
    header: str
    cell: Callable[[Any], str]  # a TrialRecord -> text
    priority: int  # 0 always; higher ones go first when the width is short
    justify: str = "right"
    wide_only: bool = False


def _columns(records: Sequence[Any], *, moe: bool, ranks: bool) -> list[_Column]:
    from autotune.outputs.terms import BOUND_HEADER

    def m(r: Any) -> Any:
        return r.measurement

    predicted = any("analytic_prediction" in r.measurement.extra for r in records)
    proxy = any("proxy" in r.measurement.extra for r in records)
    if ranks:
        cols = [_Column("#", lambda r: f"{r._rank}{'*' if r._pick else '=' if r._tied else '!' if r._risky else ''}",
                        0)]
    else:
        cols = [_Column("", lambda r: "*" if r._pick else "", 0)]
    for key in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "mbs"):
        if key in ("ep", "etp") and not moe:
            continue
        cols.append(_Column(key, _layout_cell(key), 0))
    cols += [
        _Column("flags", lambda r: layout_flags(r.layout), 0, "left"),
        _Column("tok/s/GPU", lambda r: _fmt(m(r).tokens_per_s_per_gpu, ",.0f"), 0),
        _Column("MFU", lambda r: _fmt(m(r).mfu, ".1%"), 1),
        _Column("GiB", lambda r: _bytes(m(r).memory_bytes), 1),
        _Column("free", lambda r: _fmt(r.headroom_gib, ".1f"), 2),
    ]
    if predicted:
        def pred(r: Any) -> dict[str, Any]:
            return r.measurement.extra.get("analytic_prediction") or {}

        cols += [_Column("pred. tok/s", lambda r: _fmt(pred(r).get("tokens_per_s_per_gpu"), ",.0f"), 3),
                 _Column("pred. GiB", lambda r: _bytes(pred(r).get("memory_bytes")), 3)]
    if proxy:
        cols.append(_Column("CPU proxy", _proxy_cell, 1))
    cols += [
        _Column(BOUND_HEADER, _bound, 4, "left"),
        _Column("from", lambda r: str(r.origin), 5, "left"),
        _Column("step s", lambda r: _fmt(m(r).step_time_s, ".3f"), 6, wide_only=True),
        _Column("TFLOP/s", lambda r: _fmt(m(r).tflops_per_gpu, ".0f"), 6, wide_only=True),
        _Column("layout", lambda r: str(r.layout), 6, "left", wide_only=True),
    ]
    return cols


def _layout_cell(key: str) -> Callable[[Any], str]:
    return lambda r: layout_cells(r.layout)[key]


class _Ranked:
    """A record with its rank and marks, for the '#' column."""

    def __init__(self, record: Any, rank: int, tied: bool = False, pick: bool = False, risky: bool = False) -> None:
        self._record, self._rank, self._tied, self._pick, self._risky = record, rank, tied, pick, risky

    def __getattr__(self, name: str) -> Any:
        return getattr(self._record, name)


def _fit(columns: list[_Column], rows: list[Any], width: int, wide: bool) -> list[_Column]:
    """The columns to show: all with `wide`, else by priority while the row still fits in `width`."""
    if wide:
        return columns
    columns = [c for c in columns if not c.wide_only]
    sizes = {id(c): max([len(c.header)] + [len(c.cell(r)) for r in rows]) for c in columns}
    sizes = {k: (min(v, _FLAGS_NARROW) if k == id(_flags(columns)) else v) for k, v in sizes.items()}
    keep, used = [], -_GAP
    for c in sorted(columns, key=lambda c: c.priority):  # stable: table order inside a priority
        need = sizes[id(c)] + _GAP
        if c.priority > 0 and used + need > width:
            break  # the columns after it matter less: leave them out too
        keep.append(c)
        used += need
    return [c for c in columns if c in keep]


def _flags(columns: list[_Column]) -> _Column | None:
    return next((c for c in columns if c.header == "flags"), None)


def _table(title: str, records: Sequence[Any], *, moe: bool, ranks: bool, width: int, wide: bool,
           tied: Collection[str] = (), pick: str | None = None, risky: Collection[str] = ()) -> Any:
    from rich import box
    from rich.table import Table

    rows = [_Ranked(r, i, str(r.layout) in tied, str(r.layout) == pick, str(r.layout) in risky)
            for i, r in enumerate(records, 1)]
    shown = _fit(_columns(records, moe=moe, ranks=ranks), rows, width, wide)
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False,
                  show_edge=False)
    for c in shown:  # only the flags wrap (at spaces), and only when the width is short
        table.add_column(c.header, justify=c.justify, no_wrap=wide or c.header != "flags",  # type: ignore[arg-type]
                         overflow="fold")
    for r in rows:
        table.add_row(*(c.cell(r) for c in shown))
    return table


def ranked_table(records: Sequence[Any], *, moe: bool, width: int, wide: bool = False, title: str = "",
                 tied: Collection[str] = (), pick: str | None = None, risky: Collection[str] = ()) -> Any:
    """The ranked layouts (TrialRecords, in the answer's order: the pick first) as a rich Table that fits `width`;
    the pick's rank carries a '*', those of the layouts in `tied` (layout texts: tied with the pick) an '=', those
    in `risky` (inside the memory model's error) a '!'."""
    return _table(title or "Best layouts", records, moe=moe, ranks=True, width=width, wide=wide, tied=tied,
                  pick=pick, risky=risky)


def pareto_table(records: Sequence[Any], *, moe: bool, width: int, wide: bool = False, pick: str | None = None) -> Any:
    """The Pareto front (in the answer's order: the pick first, marked '*', then fastest first) as a rich Table
    that fits `width`."""
    return _table("Pareto front (tokens/s per GPU vs memory per GPU)", records, moe=moe, ranks=False, width=width,
                  wide=wide, pick=pick)


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def paragraph(console: Any, text: str, *, style: str | None = None) -> None:
    """Print `text` wrapped at spaces only, never inside a word: a layout string stays whole for copy-paste (one
    wider than the terminal gets a line of its own). Plain text: no markup, no highlighting."""
    import textwrap

    for line in textwrap.wrap(text, width=max(20, console.width), break_long_words=False,
                              break_on_hyphens=False) or [""]:
        console.print(line, style=style, markup=False, highlight=False, soft_wrap=True)


def verdict_text(v: Any) -> str:
    """One of the user's layouts (an `autotune.tuning.answer.Verdict`) in one or two sentences."""
    from autotune.outputs.terms import share, time_label

    if v.status == "invalid":
        text = "invalid: " + "; ".join(v.violations or ("breaks a validity rule",))
    elif not v.fits and v.host_memory:
        text = f"does not fit: {v.host_memory}"
    elif not v.fits:
        over = f", {v.over_gib:.1f} GiB over" if v.over_gib is not None else ""
        memory = f"{v.memory_gib:.1f} GiB{over}" if v.memory_gib is not None else v.status
        term = f" (largest term: {v.largest_memory_term})" if v.largest_memory_term else ""
        text = f"does not fit: {memory}{term}"
    else:
        where = "the pick" if v.is_pick else f"rank {v.rank:,} of {v.of:,} that fit" if v.rank else "fits"
        change = "" if v.is_pick or v.change_vs_pick is None else f" ({_pct(v.change_vs_pick)} vs the pick)"
        tied = ", tied with the pick" if v.tied and not v.is_pick else ""
        text = (f"fits, {v.free_gib:.1f} GiB free; {v.tokens_per_s_per_gpu:,.0f} tokens/s/GPU{change}, {where}{tied}")
        if v.largest_time_term:
            text += (f"; largest non-compute term {time_label(v.largest_time_term)} "
                     f"{share(v.largest_time_share)} of the step, largest memory term {v.largest_memory_term}")
        if v.better:
            text += f"; in no more memory {v.better} is {_pct(v.better_change)} faster"
        if v.gain_terms and v.pick_gain is not None and v.pick_gain > 0:
            terms = ", ".join(f"{time_label(t)} {a:.2f} s vs {b:.2f} s" for t, a, b in v.gain_terms[:3])
            text += f"; where the pick gains (per step, yours vs the pick): {terms}"
        if v.no_measurable_gain is not None and v.pick_gain is not None:
            text += (f"; no measurable gain: the pick's predicted +{v.pick_gain:.1%} lies inside the model's error "
                     f"on two layouts of one job (+/-{v.no_measurable_gain:.0%}, NVIDIA's published same-job "
                     f"sweeps); measure both (--backend megatron) to tell them apart")
        if v.unverified and v.pick_gain is not None:
            share_text = f", {v.unverified_share:.0%} of what it saves" if v.unverified_share is not None else ""
            text += (f"; UNVERIFIED: the pick's predicted +{v.pick_gain:.0%} rests mostly on "
                     f"{time_label(v.unverified)}{share_text}, the model's assumption; measure both layouts on "
                     f"your cluster (--backend megatron measures yours first) before trusting it")
    if v.nearest:
        changes = ", ".join(v.nearest_changes) or "no change"
        text += (f"; nearest that fits ({changes}): {v.nearest}, {v.nearest_tokens_per_s_per_gpu:,.0f} "
                 f"tokens/s/GPU, {v.nearest_free_gib:.1f} GiB free")
    elif not v.fits:
        text += "; no layout of the space fits"
    if v.recipe:
        published = (f"; NVIDIA measured {v.published_tokens_per_s_per_gpu:,.0f} tokens/s/GPU with it"
                     if v.published_tokens_per_s_per_gpu else "")
        text = f"{v.recipe}{published}. {text[0].upper()}{text[1:]}"
    if v.measured:
        got = v.measured
        figure = f" {got['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU" if got.get("tokens_per_s_per_gpu") else ""
        source = "CPU proxy" if got.get("source") == "megatron-cpu-proxy" else "measured"
        text += f"; {source}: {got.get('status')}{figure}"
    return text


def breakdown_table(unit: str, terms: dict[str, float], total: float, value_spec: str, share_spec: str) -> Any:
    """Named terms with their share of the total (estimate's memory and time tables); terms at 0 are left out."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False)
    table.add_column("term")
    table.add_column(unit, justify="right")
    table.add_column("share", justify="right")
    for name, value in terms.items():
        if value:
            table.add_row(name, format(value, value_spec), format(value / total, share_spec) if total else "-")
    table.add_row("total", format(total, value_spec), format(1.0, share_spec), style="bold")
    return table


def print_nearest(nearest: dict[str, object] | None) -> None:
    """The nearest variant that fits, for a layout that breaks a rule or does not fit (check, estimate)."""
    console = make_console()
    if nearest is None:
        console.print("nearest that fits: none; no layout of the search space fits this job (see `python -m "
                      "autotune` for the closest misses and what to try)", markup=False, highlight=False)
        return
    changes = ", ".join(nearest["changes"]) or "none"  # type: ignore[arg-type]
    console.print(f"nearest that fits ({changes}): {nearest['layout']}: {nearest['tokens_per_s_per_gpu']:,.0f} "
                  f"tokens/s per GPU, {nearest['memory_gib']:.1f} GiB, {nearest['free_gib']:.1f} GiB free",
                  markup=False, highlight=False)

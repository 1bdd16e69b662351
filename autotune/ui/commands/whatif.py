"""`python -m autotune --model mixtral --nodes 4,8,16 [--gpu h100,h200] [--tokens 1T]`: one table, one row per
cluster.

Each row is the search's own answer for that cluster (`autotune.tuning.whatif`: the model's whole space, the same
pick rule): the best layout, tokens/s per GPU and per cluster, MFU, free memory, and with `--tokens` the training time
and GPU-hours of the budget. When nothing fits any cluster asked for, a last row names the smallest node count that
fits. `--json` prints `{"job", "tokens", "rows": [...]}`. Writes no folder (a single cluster's search writes its
files). Exit code 0 when a layout fits some cluster asked for, 1 when none does.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from typing import Any

from search_spaces.units import GIB

__all__ = ["run_what_if", "what_if_jobs", "what_if_table"]



def what_if_jobs(args: argparse.Namespace) -> list[Any]:
    """One Job per (GPU, node count) the flags list, GPUs in the order given, then node counts."""
    from autotune.ui.commands import job_from_args

    nodes = args.nodes if isinstance(args.nodes, tuple) else (args.nodes,)
    gpus = [g.strip() for g in args.gpu.split(",")] if isinstance(args.gpu, str) else [args.gpu]
    if any(g == "" for g in gpus):
        raise ValueError(f"--gpu takes GPU names separated by commas, but got {args.gpu!r}.")
    jobs = []
    for gpu in dict.fromkeys(gpus):
        for n in nodes:
            one = copy.copy(args)
            one.nodes, one.gpu = n, gpu
            jobs.append(job_from_args(one))
    return jobs


def run_what_if(args: argparse.Namespace, status: Any) -> int:
    from autotune.tuning.whatif import parse_tokens, what_if
    from autotune.ui.commands.space import options_from_args

    jobs = what_if_jobs(args)
    tokens = None if args.tokens is None else parse_tokens(args.tokens)
    headroom = 0.0 if args.headroom_gib is None else args.headroom_gib * GIB
    from autotune.ui.commands import calibration_from_args, calibration_line

    calibration = calibration_from_args(args)
    rows = what_if(jobs, headroom_bytes=headroom, tokens=tokens, options=options_from_args(args),
                   calibration=calibration)
    status.stop()
    if args.json:
        j = jobs[0]
        print(json.dumps({"job": {"model": j.model.name, "seq_length": j.training.seq_length,
                                  "global_batch_size": j.training.global_batch_size,
                                  "precision": j.training.precision}, "tokens": tokens,
                          "headroom_gib": headroom / GIB, "rows": [r.as_dict() for r in rows],
                          "calibration": None if calibration is None else calibration.summary()}, default=str))
    else:
        from autotune.outputs.tables import make_console

        console = make_console(wide=args.wide)
        console.print(what_if_table(rows, width=console.width, wide=args.wide))
        if calibration is not None:
            console.print(calibration_line(calibration), markup=False, highlight=False)
        _notes(console, rows, tokens)
    asked = [r for r in rows if not r.found]
    return 0 if any(r.pick is not None for r in asked) else 1


def _notes(console: Any, rows: list[Any], tokens: float | None) -> None:
    say = lambda text: console.print(text, markup=False, highlight=False)  # noqa: E731
    say("Each row: the pick of that cluster's whole space by the model (as `python -m autotune --model ... --nodes N` "
        "picks it); per cluster = per GPU x GPUs" + ("; time = tokens / tokens per second, GPU-hours = GPUs x time."
                                                   if tokens else "."))
    for r in rows:
        if r.pick is None and not r.found:
            c = r.job.cluster
            closest = f" (the least a layout needs: {r.closest_gib:.1f} GiB per GPU)" if r.closest_gib else ""
            say(f"{c.nodes} x {c.gpus_per_node} {c.gpu.name}: no layout fits{closest}.")
    found = [r for r in rows if r.found]
    for r in found:
        c = r.job.cluster
        say(f"No cluster asked for fits; the smallest that does: {c.nodes} nodes of {c.gpus_per_node} {c.gpu.name} "
            f"(found by doubling the largest asked for, then bisecting), picking {r.pick}.")
    if all(r.pick is None for r in rows):
        print("autotune search: no layout fits any of these clusters, nor up to 256 times the largest.",
              file=sys.stderr)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    days = seconds / 86400
    return f"{days:,.1f} d" if days >= 1 else f"{seconds / 3600:,.1f} h"


def what_if_table(rows: list[Any], *, width: int, wide: bool = False) -> Any:
    """The what-if rows as a rich Table: cluster, GPUs, the pick (short columns), tokens/s per GPU and per cluster
    ("all"), MFU, free memory, and the budget's time and GPU-hours when a budget was given; below 100 columns
    without `wide` MFU is left out, below 90 also tokens/s per cluster (`--json` has every figure)."""
    from rich import box
    from rich.table import Table

    from autotune.outputs.progress import _compact
    from search_spaces.layout import parse_layout

    budget = rows[0].tokens if rows else None
    title = "What-if: the best layout per cluster" + (f", {_tokens_text(budget)} tokens" if budget else "")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False,
                  show_edge=False)  # one space between columns, as the ranked table
    columns = ["cluster", "GPUs", "best layout", "tok/s/GPU", "tok/s all", "MFU", "free GiB"]
    if budget:
        columns += ["time", "GPU-hours"]
    if not wide:  # a narrow terminal keeps the layout, tokens/s per GPU, memory and the budget's figures
        for name, below in (("MFU", 100), ("tok/s all", 90)):
            if width < below:
                columns.remove(name)
    base = {id(r): f"{r.job.cluster.nodes} x {r.job.cluster.gpus_per_node} {r.job.cluster.gpu.name}" for r in rows}
    for name in columns:  # the figures stay on one line; the layout (and "smallest that fits") wrap when they must
        table.add_column(name, justify="left" if name in ("cluster", "best layout") else "right", overflow="fold",
                         no_wrap=wide or name not in ("cluster", "best layout"),
                         min_width=max(map(len, base.values()), default=0) if name == "cluster" else
                         14 if name == "best layout" else None)
    for r in rows:
        cells = {"cluster": base[id(r)] + (" (smallest that fits)" if r.found else ""), "GPUs": f"{r.gpus:,}"}
        if r.pick is None:
            cells["best layout"] = "nothing fits"
        else:
            cells.update({"best layout": _compact(parse_layout(r.pick)), "tok/s/GPU": f"{r.tokens_per_s_per_gpu:,.0f}",
                          "tok/s all": f"{r.tokens_per_s:,.0f}", "MFU": f"{r.mfu:.1%}", "free GiB": f"{r.free_gib:.1f}",
                          "time": _duration(r.seconds), "GPU-hours": f"{r.gpu_hours or 0:,.0f}"})
        table.add_row(*(cells.get(name, "-") for name in columns))
    return table


def _tokens_text(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n:g}"

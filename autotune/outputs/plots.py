"""The search's four plots, drawn with matplotlib on a pandas DataFrame of trials.

Every function takes the trials table (one row per trial, see `trials_frame`) and returns a
`matplotlib.figure.Figure` built without pyplot, so it is safe in scripts, threads and notebooks
(Jupyter displays a returned Figure). matplotlib and pandas are imported inside the functions:
importing this module costs nothing.

Columns the plots read (missing ones are tolerated where they can be):
`trial`, `status`, `layout`, `tokens_per_s_per_gpu`, `memory_gib`, and the breakdowns as
`time.<term>` (seconds) and `memory.<term>` (bytes) columns.

    >>> from autotune import plots
    >>> fig = plots.pareto(result.trials, capacity_gib=80)   # doctest: +SKIP
    >>> fig.savefig("pareto.png")                             # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, cast

from autotune.outputs import terms as _TERMS
from search_spaces.layout import Layout
from search_spaces.units import GIB

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from autotune.tuning.results import TrialRecord
    from search_spaces.measurement import Measurement

__all__ = [
    "trials_frame",
    "feasible_mask",
    "pareto_mask",
    "top_feasible",
    "pareto",
    "time_breakdown",
    "memory_breakdown",
    "progress",
    "save_all",
    "TIME_TERMS",
    "PLOT_FILES",
]


# The cost model's time terms, labelled, in its order (autotune/outputs/terms.py); a backend's other timings (a
# measurement's step statistics) are never stacked as terms.
TIME_TERMS = _TERMS.TIME_TERMS
PLOT_FILES: dict[str, str] = {
    "pareto": "pareto.png",
    "time_breakdown": "time_breakdown.png",
    "memory_breakdown": "memory_breakdown.png",
    "progress": "progress.png",
}


_FRAME_COLUMNS = ("trial", "origin", "layout", "status", "ok", "feasible", "tokens_per_s_per_gpu", "memory_gib",
                  "step_time_s", "tflops_per_gpu", "mfu", "reason", "rules", "dominant_time", "dominant_memory",
                  "source", "proxy")


def trials_frame(trials: Iterable[Measurement | TrialRecord]) -> pd.DataFrame:
    """One row per trial, in trial order: number, layout fields, status, feasibility, totals and breakdowns.

    Takes `Measurement`s or the search's `TrialRecord`s (which add the trial number, its origin and
    feasibility against the GPU's memory minus the headroom). Breakdown terms become `time.<term>`
    (seconds) and `memory.<term>` (bytes) columns.
    """
    import pandas as pd

    rows = []
    for i, item in enumerate(trials):
        m = cast("Measurement", getattr(item, "measurement", item))
        row: dict[str, object] = {
            "trial": getattr(item, "number", i), "origin": getattr(item, "origin", ""), "layout": str(m.layout),
            "status": m.status, "ok": m.ok, "feasible": bool(getattr(item, "feasible", m.ok)),
        }
        row.update(m.layout.short_dict())  # every Layout field, as the CSV has them
        row.update(
            tokens_per_s_per_gpu=m.tokens_per_s_per_gpu,
            memory_gib=m.memory_gib,
            step_time_s=m.step_time_s,
            tflops_per_gpu=m.tflops_per_gpu,
            mfu=m.mfu,
            reason=m.reason,
            rules=",".join(v.split(":", 1)[0] for v in m.violations),  # the broken rules' names
            dominant_time=m.extra.get("dominant_time"),
            dominant_memory=m.extra.get("dominant_memory"),
            source=m.source,
            proxy=_proxy_text(m.extra.get("proxy")),
        )
        row.update({f"time.{k}": v for k, v in m.time.items()})
        row.update({f"memory.{k}": v for k, v in m.memory.items()})
        rows.append(row)
    # no trials (a search where nothing was kept): the columns every reader indexes, with no rows
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=[*_FRAME_COLUMNS, *(f.name for f in fields(Layout))])


def _proxy_text(proxy: object) -> str | None:
    """What the CPU proxy found for a layout the model ranks (`ok, 1,430 tok/s`), None when it did not run it."""
    if not isinstance(proxy, dict) or "status" not in proxy:  # a CPU-proxy run's own extra["proxy"] is its plan
        return None
    tps = proxy.get("tokens_per_s_per_gpu")
    return f"{proxy.get('status')}, {tps:,.0f} tok/s" if proxy.get("status") == "ok" and tps else str(proxy["status"])


def feasible_mask(df: pd.DataFrame) -> pd.Series:
    """Feasible rows: the search's `feasible` (fits with headroom) where known, else status ok."""
    for column in ("feasible", "ok"):
        if column in df:
            return df[column].astype(bool)
    return df["status"] == "ok"


def pareto_mask(df: pd.DataFrame) -> pd.Series:
    """True for the rows of `autotune.tuning.results.pareto_front`: feasible layouts no other feasible one beats
    on both tokens/s per GPU (higher) and memory per GPU (lower), one row per layout (its first), equal figures
    kept together. The one Pareto rule of the search, the CLI, the notebook and these plots."""
    import pandas as pd

    from autotune.tuning.results import pareto_front

    feasible = df[feasible_mask(df)].dropna(subset=["tokens_per_s_per_gpu", "memory_gib"])
    rows = [_FrontRow(idx, layout, tps, mem * GIB) for idx, layout, tps, mem in
            zip(feasible.index, feasible["layout"], feasible["tokens_per_s_per_gpu"], feasible["memory_gib"],
                strict=True)]
    mask = pd.Series(False, index=df.index)
    front = cast("list[_FrontRow]", pareto_front(cast("list[TrialRecord]", rows)))  # duck-typed TrialRecords
    for row in front:
        mask[row.index] = True
    return mask


class _FrontRow:
    """A trials-table row as `pareto_front` reads a TrialRecord: feasible, layout, measurement figures."""

    feasible = True

    def __init__(self, index: object, layout: str, tokens_per_s_per_gpu: float, memory_bytes: float) -> None:
        self.index, self.layout = index, layout
        self.measurement = self  # tokens_per_s_per_gpu and memory_bytes live here too
        self.tokens_per_s_per_gpu, self.memory_bytes = float(tokens_per_s_per_gpu), float(memory_bytes)


def top_feasible(df: pd.DataFrame, k: int = 5, order: Sequence[str] | None = None) -> pd.DataFrame:
    """The first k feasible trials, one row per distinct layout: in `order` (layout texts, the answer's ranking)
    when given, else by tokens/s per GPU (a plain table of trials)."""
    feasible = df[feasible_mask(df)].dropna(subset=["tokens_per_s_per_gpu"])
    if order is not None:
        first = feasible.drop_duplicates(subset="layout").set_index("layout", drop=False)
        wanted = [lay for lay in order if lay in first.index][:k]
        return first.loc[wanted].reset_index(drop=True)
    # The search's ranking (autotune/tuning/results.py distinct_feasible): fastest, then least memory, then by name.
    feasible = feasible.sort_values(["tokens_per_s_per_gpu", "memory_gib", "layout"], ascending=[False, True, True],
                                    kind="stable")
    return feasible.drop_duplicates(subset="layout").head(k)


def _figure(width_in: float = 7.0, height_in: float = 4.2) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), dpi=100, layout="constrained")


def pareto(df: pd.DataFrame, *, capacity_gib: float | None = None, usable_gib: float | None = None,
           title: str = "", pick: str | None = None, front: Sequence[str] | None = None) -> Figure:
    """Tokens/s per GPU against memory per GPU: feasible dots, infeasible crosses, the front, the pick (a star), and
    two lines: the usable memory (capacity minus the search's headroom: what "feasible" means) and the GPU's
    capacity. `pick` and `front` (layout texts) are the answer's; without them the front is computed here and the
    star marks the fastest of it."""
    fig = _figure()
    ax = fig.add_subplot()
    measured = df.dropna(subset=["memory_gib"]) if "memory_gib" in df else df.iloc[0:0]
    ok = feasible_mask(measured)
    feasible, infeasible = measured[ok], measured[~ok]
    y_col = "tokens_per_s_per_gpu"
    ax.scatter(feasible["memory_gib"], feasible[y_col], s=18, color="tab:blue", alpha=0.7,
               label=f"feasible ({len(feasible)})")
    if len(infeasible):
        # An OOM layout may carry no throughput; draw it on the x axis so its memory still shows.
        y = infeasible[y_col].fillna(0.0) if y_col in infeasible else [0.0] * len(infeasible)
        ax.scatter(infeasible["memory_gib"], y, s=22, marker="x", color="tab:red", alpha=0.7,
                   label=f"infeasible ({len(infeasible)})")
    on_front = (measured["layout"].isin(list(front)) & ok) if front is not None else pareto_mask(measured)
    line = measured[on_front].drop_duplicates(subset="layout").sort_values("memory_gib")
    if len(line):
        ax.step(line["memory_gib"], line[y_col], where="post", color="tab:green", linewidth=1.5,
                label=f"Pareto front ({len(line)})")
    chosen = feasible[feasible["layout"] == pick].head(1) if pick is not None else \
        line.loc[[line[y_col].idxmax()]] if len(line) else line
    if len(chosen):
        ax.scatter(chosen["memory_gib"], chosen[y_col], s=160, marker="*", color="gold", edgecolor="black",
                   zorder=5, label="the pick")
    if usable_gib is not None and usable_gib != capacity_gib:
        ax.axvline(usable_gib, color="tab:orange", linestyle="-", linewidth=1.5,
                   label=f"usable ({usable_gib:.1f} GiB: GPU minus headroom)")
    if capacity_gib is not None:
        ax.axvline(capacity_gib, color="black", linestyle="--", linewidth=1,
                   label=f"GPU memory ({capacity_gib:.0f} GiB)")
    _clip_memory_axis(ax, measured, feasible, capacity_gib)
    ax.set_xlabel("memory per GPU (GiB)")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_title(title or "Throughput against memory")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncols=3, fontsize="small")  # below the axes: no point hidden
    return fig


def _clip_memory_axis(ax, measured: pd.DataFrame, feasible: pd.DataFrame, capacity_gib: float | None) -> None:
    """Stop the x axis at 1.5x the capacity (or the largest feasible memory) so far-off OOM layouts do not
    squash the front; how many lie beyond is said on the axis."""
    reference = capacity_gib if capacity_gib is not None else (feasible["memory_gib"].max() if len(feasible) else None)
    if reference is None or reference != reference:
        return
    right = 1.5 * float(reference)
    beyond = int((measured["memory_gib"] > right).sum())
    if beyond:
        ax.set_xlim(left=0, right=right)
        ax.annotate(f"{beyond} infeasible beyond {right:.0f} GiB \u2192", xy=(1, 0), xycoords="axes fraction",
                    xytext=(-4, 4), textcoords="offset points", ha="right", va="bottom", fontsize="small",
                    color="tab:red")


def _ordered_terms(columns: Iterable[str], prefix: str, known: Mapping[str, str]) -> list[str]:
    """The cost model's terms present among the columns, in its order; anything else (a measurement's step
    statistics) is not a term and is left out."""
    terms = {c[len(prefix):] for c in columns if c.startswith(prefix)}
    return [t for t in known if t in terms]


def _stacked_bars(ax, rows: pd.DataFrame, prefix: str, scale: float, labels: Mapping[str, str],
                  pick: str | None = None) -> None:
    import numpy as np

    if rows.empty:  # nothing fits: an empty chart that says so
        ax.text(0.5, 0.5, "no layout fits", ha="center", va="center", transform=ax.transAxes)
        ax.set_yticks([])
        return
    terms = _ordered_terms(rows.columns, prefix, labels)
    y = np.arange(len(rows))
    left = np.zeros(len(rows))
    colors = _colors(len(terms))
    for term, color in zip(terms, colors, strict=True):
        values = rows[prefix + term].fillna(0.0).to_numpy(dtype=float) * scale
        if not values.any():
            continue
        ax.barh(y, values, left=left, color=color, label=labels.get(term, term))
        left += values
    marks = ["* " if s == pick else "" for s in rows["layout"]]
    ax.set_yticks(y, [f"{m}#{i}  {_short(s)}" for i, (m, s) in enumerate(zip(marks, rows["layout"], strict=True), 1)],
                  fontsize="small")
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)


def _legend_below(ax) -> None:
    handles, names = ax.get_legend_handles_labels()
    if handles:
        ax.figure.legend(handles, names, loc="outside lower center", ncols=min(len(handles), 6), fontsize="x-small")


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _short(layout: str) -> str:
    """A tick label on two short lines: the sizes, then the flags (`tp2 pp4 vpp2 ep8 dp4 mbs1` / `sp dopt rc=sel`),
    so that the label does not squeeze the bars."""
    from autotune.outputs.tables import layout_flags
    from search_spaces.layout import parse_layout

    lay = parse_layout(layout)
    sizes = [f"tp{lay.tp}", f"pp{lay.pp}"] + ([f"vpp{lay.vpp}"] if lay.vpp else []) + \
        ([f"cp{lay.cp}"] if lay.cp > 1 else []) + ([f"ep{lay.ep}"] if lay.ep > 1 else []) + \
        ([f"etp{lay.etp}"] if lay.etp is not None else []) + [f"dp{lay.dp}", f"mbs{lay.mbs}"]
    flags = layout_flags(lay)
    return " ".join(sizes) + ("" if flags == "-" else "\n" + flags)


def time_breakdown(df: pd.DataFrame, *, k: int = 5, order: Sequence[str] | None = None, pick: str | None = None,
                   title: str = "") -> Figure:
    """Stacked step time of the first k feasible layouts (in `order`, the answer's ranking: the pick first, marked
    '*'), by the cost model's terms: compute, recompute, TP, CP, EP, host, PP, DP, optimizer, overhead."""
    rows = top_feasible(df, k, order)
    fig = _figure(9.0, 1.8 + 0.65 * max(len(rows), 1))
    ax = fig.add_subplot()
    _stacked_bars(ax, rows, "time.", 1.0, TIME_TERMS, pick)
    _legend_below(ax)
    ax.set_xlabel("time per step (s)")
    ax.set_title(title or f"Where the step time goes (top {len(rows)} layouts)")
    return fig


def memory_breakdown(df: pd.DataFrame, *, k: int = 5, capacity_gib: float | None = None,
                     usable_gib: float | None = None, order: Sequence[str] | None = None, pick: str | None = None,
                     title: str = "") -> Figure:
    """Stacked memory per GPU of the first k feasible layouts (in `order`, the pick first, marked '*'), by the
    memory model's terms, with the usable memory and the capacity as lines."""
    rows = top_feasible(df, k, order)
    fig = _figure(9.0, 1.8 + 0.65 * max(len(rows), 1))
    ax = fig.add_subplot()
    _stacked_bars(ax, rows, "memory.", 1.0 / GIB, _TERMS.MEMORY_TERMS, pick)
    if usable_gib is not None and usable_gib != capacity_gib:
        ax.axvline(usable_gib, color="tab:orange", linewidth=1.5, label=f"usable ({usable_gib:.1f} GiB)")
    if capacity_gib is not None:
        ax.axvline(capacity_gib, color="black", linestyle="--", linewidth=1, label=f"GPU ({capacity_gib:.0f} GiB)")
    _legend_below(ax)
    ax.set_xlabel("memory per GPU (GiB)")
    ax.set_title(title or f"Memory per GPU (top {len(rows)} layouts)")
    return fig


def progress(df: pd.DataFrame) -> Figure:
    """Best feasible tokens/s per GPU found so far, by trial number; each feasible trial as a dot."""
    fig = _figure(7.0, 3.6)
    ax = fig.add_subplot()
    ordered = df.sort_values("trial") if "trial" in df else df.reset_index(drop=True).rename_axis("trial").reset_index()
    tps = ordered["tokens_per_s_per_gpu"].where(feasible_mask(ordered))
    ax.scatter(ordered["trial"], tps, s=10, color="tab:blue", alpha=0.5, label="feasible trial")
    ax.step(ordered["trial"], tps.cummax().ffill(), where="post", color="tab:green", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_title("Search progress")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    return fig


def figures(df: pd.DataFrame, *, capacity_gib: float | None = None, usable_gib: float | None = None,
            k: int = 5, pick: str | None = None, order: Sequence[str] | None = None, front: Sequence[str] | None = None,
            breakdowns: pd.DataFrame | None = None, progress_plot: bool = True,
            breakdown_title: str = "") -> dict[str, Figure]:
    """The plots, by name (the keys of PLOT_FILES): `pick`, `order` and `front` are the answer's (layout texts);
    `breakdowns` the trials table the breakdown plots stack (default `df`); no progress plot without
    `progress_plot` (an analytic run has no trial order)."""
    stacked = df if breakdowns is None else breakdowns
    out = {
        "pareto": pareto(df, capacity_gib=capacity_gib, usable_gib=usable_gib, pick=pick, front=front),
        "time_breakdown": time_breakdown(stacked, k=k, order=order, pick=pick,
                                         title=breakdown_title and f"Where the step time goes ({breakdown_title})"),
        "memory_breakdown": memory_breakdown(stacked, k=k, capacity_gib=capacity_gib, usable_gib=usable_gib,
                                             order=order, pick=pick,
                                             title=breakdown_title and f"Memory per GPU ({breakdown_title})"),
    }
    if progress_plot:
        out["progress"] = progress(df)
    return out


def save_all(df: pd.DataFrame, folder, *, capacity_gib: float | None = None, usable_gib: float | None = None,
             k: int = 5, **answer: object) -> dict[str, str]:
    """Write the plots as PNG files into `folder`; returns plot name -> file path (`answer`: `figures`' keywords)."""
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, fig in figures(df, capacity_gib=capacity_gib, usable_gib=usable_gib, k=k, **answer).items():  # type: ignore[arg-type]
        path = folder / PLOT_FILES[name]
        fig.savefig(path)
        paths[name] = str(path)
    return paths

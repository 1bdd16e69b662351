"""A self-contained HTML report of one search: opens in a browser from disk, no server, no network.

The plots are PNGs embedded as base64 `data:` URIs, the styles are inline, and there is no script,
so the file can be mailed or attached to a ticket as is. What it holds: the job, the winner's layout
(in an element with id `winner`) and its launch forms, the four plots, the top layouts, the Pareto
front, why layouts were rejected, and every trial.

    >>> from autotune.outputs.report import write_report
    >>> write_report(result, "runs/mixtral")          # doctest: +SKIP
    'runs/mixtral/report.html'

`write_report` also writes the plots as PNG files next to the report (see `autotune.outputs.plots.PLOT_FILES`).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.outputs import plots

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

__all__ = ["ReportInput", "render_report", "summary_html", "write_report", "report_input", "REPORT_FILE"]

REPORT_FILE = "report.html"
MAX_TRIAL_ROWS = 5000  # beyond this the all-trials table is cut (the CSV/JSON outputs keep everything)

_TABLE_COLUMNS = ("trial", "layout", "status", "tokens_per_s_per_gpu", "memory_gib", "step_time_s", "mfu", "reason")

_STYLE = """
body { font-family: system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1100px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td.text, th.text { text-align: left; }
pre { background: #f6f8fa; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
#winner { background: #eef7ee; border: 1px solid #9c9; padding: 0.5em 1em; border-radius: 4px; }
#winner .layout { font-family: monospace; font-size: 1.1em; font-weight: bold; }
.plots img { max-width: 100%; display: block; margin: 1em 0; }
.muted { color: #777; }
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportInput:
    """Everything the report shows, as plain values: the trials table plus a few facts about the job."""

    trials: pd.DataFrame
    title: str = "autotune search"
    job: Mapping[str, object] = field(default_factory=dict)  # model, cluster, training, backend, seed ...
    best_layout: str | None = None  # None: the top feasible trial of `trials`
    launch: Mapping[str, str] = field(default_factory=dict)  # form name -> text (Bridge overrides, Megatron-LM args)
    capacity_gib: float | None = None  # the GPU's memory, drawn as a line


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _figure_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _png_img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{_esc(alt)}" src="data:image/png;base64,{data}">'


def _fmt(value: object) -> str:
    if value is None or (isinstance(value, float) and value != value):  # None or NaN
        return ""
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _table(df: pd.DataFrame, columns: tuple[str, ...] | list[str], *, table_id: str = "") -> str:
    cols = [c for c in columns if c in df.columns]
    text_cols = {"layout", "status", "reason", "term"}
    head = "".join(f'<th class="{"text" if c in text_cols else ""}">{_esc(c)}</th>' for c in cols)
    body = []
    for _, row in df.iterrows():
        cells = "".join(
            f'<td class="{"text" if c in text_cols else ""}">{_esc(_fmt(row[c]))}</td>' for c in cols
        )
        body.append(f"<tr>{cells}</tr>")
    ident = f' id="{_esc(table_id)}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _kv_table(items: Mapping[str, object], *, table_id: str = "") -> str:
    rows = "".join(f'<tr><th class="text">{_esc(k)}</th><td class="text">{_esc(_fmt(v))}</td></tr>'
                   for k, v in items.items())
    ident = f' id="{_esc(table_id)}"' if table_id else ""
    return f"<table{ident}>{rows}</table>"


def _winner_section(data: ReportInput, top: pd.DataFrame) -> str:
    if data.best_layout is None and top.empty:
        return '<div id="winner"><p>No feasible layout was found. See the rejections below.</p></div>'
    layout = data.best_layout if data.best_layout is not None else top.iloc[0]["layout"]
    match = data.trials[data.trials["layout"] == layout] if "layout" in data.trials else data.trials.iloc[0:0]
    facts: dict[str, object] = {}
    if len(match):
        row = match.iloc[0]
        for col, label in (("tokens_per_s_per_gpu", "tokens/s per GPU"), ("memory_gib", "memory per GPU (GiB)"),
                           ("step_time_s", "step time (s)"), ("tflops_per_gpu", "TFLOP/s per GPU"), ("mfu", "MFU")):
            if col in row.index:
                facts[label] = row[col]
    parts = [f'<div id="winner"><p>Best layout: <span class="layout">{_esc(layout)}</span></p>', _kv_table(facts)]
    for name, text in data.launch.items():
        parts.append(f"<h3>{_esc(name)}</h3><pre>{_esc(text)}</pre>")
    parts.append("</div>")
    return "".join(parts)


def _rejections(df: pd.DataFrame) -> str:
    if "status" not in df:
        return ""
    bad = df[~plots.feasible_mask(df)]
    if bad.empty:
        return "<p>Every trial was feasible.</p>"
    over = (bad["status"] == "ok")  # ran fine but leaves less than the requested headroom
    bad = bad.assign(status=bad["status"].where(~over, "ok, over the headroom"))
    counts = bad.groupby("status").size().rename("trials").reset_index()
    out = _table(counts, ["status", "trials"])
    if "reason" in bad:
        reasons = (bad.assign(reason=bad["reason"].fillna("").astype(str).str.slice(0, 160))
                   .groupby("reason").size().rename("trials").sort_values(ascending=False).head(15).reset_index())
        out += _table(reasons, ["reason", "trials"])
    return out


_PLOT_ALTS = {
    "pareto": "Pareto front: tokens/s per GPU against memory per GPU",
    "time_breakdown": "Time breakdown of the top layouts",
    "memory_breakdown": "Memory breakdown of the top layouts",
    "progress": "Search progress: best so far by trial",
}


def render_report(data: ReportInput, pngs: Mapping[str, bytes] | None = None) -> str:
    """The report as one HTML string (plots embedded, no external resource).

    `pngs`: the four plots already drawn (plot name -> PNG bytes, as `write_report` has them); else drawn here.
    """
    df = data.trials
    top = plots.top_feasible(df, 10)
    front = df[plots.pareto_mask(df)].sort_values("memory_gib") if len(df) else df
    if pngs is None:
        pngs = {name: _figure_png(fig) for name, fig in plots.figures(df, capacity_gib=data.capacity_gib).items()}
    figures = [(pngs[name], alt) for name, alt in _PLOT_ALTS.items()]
    n_ok = int(plots.feasible_mask(df).sum()) if len(df) else 0
    summary = dict(data.job)
    summary.update({"trials": len(df), "feasible trials": n_ok})
    shown = df.head(MAX_TRIAL_ROWS)
    cut = "" if len(df) <= MAX_TRIAL_ROWS else f'<p class="muted">First {MAX_TRIAL_ROWS} of {len(df)} trials.</p>'
    created = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = [
        f"<h1>{_esc(data.title)}</h1><p class='muted'>Written {created} by autotune.</p>",
        "<h2>Job</h2>", _kv_table(summary, table_id="job"),
        "<h2>Winner</h2>", _winner_section(data, top),
        "<h2>Plots</h2><div class='plots'>", *(_png_img(png, alt) for png, alt in figures), "</div>",
        "<h2>Top layouts</h2>", _table(top, _TABLE_COLUMNS, table_id="top"),
        "<h2>Pareto front</h2>", _table(front, _TABLE_COLUMNS, table_id="pareto"),
        "<h2>Rejected layouts</h2>", _rejections(df),
        "<h2>All trials</h2><details><summary>show every trial</summary>", cut,
        _table(shown, _TABLE_COLUMNS, table_id="trials"), "</details>",
    ]
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{_esc(data.title)}</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>\n")


def summary_html(result) -> str:
    """A short HTML view of a result (job, winner, top 5) without plots, for notebooks."""
    data = report_input(result)
    top = plots.top_feasible(data.trials, 5)
    return "".join([f"<h4>{_esc(data.title)}</h4>", _kv_table(data.job), _winner_section(data, top),
                    _table(top, _TABLE_COLUMNS)])


_LAUNCH_TITLES = {"megatron_bridge": "Megatron-Bridge overrides", "megatron_lm": "Megatron-LM arguments"}


def report_input(result) -> ReportInput:
    """Adapt a search result (`autotune.tuning.results.SearchResult` or `autotune.outputs.view.Result`) to `ReportInput`."""
    from autotune.outputs.view import Result

    res = result if isinstance(result, Result) else Result(result)
    return ReportInput(
        trials=res.trials,
        title=res.title,
        job=res.job_summary(),
        best_layout=None if res.best is None else str(res.best),
        launch={_LAUNCH_TITLES.get(k, k): v for k, v in res.launch_forms().items()},
        capacity_gib=res.capacity_gib,
    )


def write_report(result, folder: str | Path) -> str:
    """Write `report.html` and the four plot PNGs into `folder`; returns the report's path.

    `result` is a search result or an already built `ReportInput`.
    """
    data = result if isinstance(result, ReportInput) else report_input(result)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    saved = plots.save_all(data.trials, folder, capacity_gib=data.capacity_gib)
    pngs = {name: Path(p).read_bytes() for name, p in saved.items()}  # each plot drawn once, embedded as saved
    path = folder / REPORT_FILE
    path.write_text(render_report(data, pngs), encoding="utf-8")
    return str(path)

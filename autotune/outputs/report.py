"""A self-contained HTML report of one search: opens in a browser from disk, no server, no network.

The plots are PNGs embedded as base64 `data:` URIs, the styles are inline, and the one inline script is the
copy buttons' (it copies a launch line to the clipboard), so the file can be mailed or attached to a ticket as is.
What it holds: the job, the winner's layout (in an element with id `winner`) with both launch forms (wrapped,
each with a Copy button that copies the one-line form), the four plots, the top layouts, the Pareto front, the
rejected layouts grouped by reason with counts, and every trial. Columns are named for people (tokens/s per GPU,
MFU in percent) and a layout is its short columns (`tp pp vpp cp ep etp dp mbs flags`), so the page fits a
1280-pixel window without scrolling sideways (checked in headless Chromium, tests/test_report.py).

    >>> from autotune.outputs.report import write_report
    >>> write_report(result, "runs/mixtral")          # doctest: +SKIP
    'runs/mixtral/report.html'

`write_report` also writes the plots as PNG files next to the report (see `autotune.outputs.plots.PLOT_FILES`).
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.outputs import plots

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

__all__ = ["ReportInput", "render_report", "summary_html", "write_report", "report_input", "rejection_groups",
           "wrap_shell", "REPORT_FILE"]

REPORT_FILE = "report.html"
MAX_TRIAL_ROWS = 5000  # beyond this the all-trials table is cut (the CSV/JSON outputs keep everything)
LAUNCH_WIDTH = 110  # characters per displayed line of a launch form

_STYLE = """
body { font-family: system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1180px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; max-width: 100%; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: right; }
th { background: #f4f4f4; font-weight: 600; } td.text, th.text { text-align: left; }
td.wrap, th.wrap { text-align: left; } td.wrap { overflow-wrap: anywhere; min-width: 12em; }
.launch { position: relative; margin: 0.6em 0 1em; }
.launch pre { background: #f6f8fa; padding: 0.8em 5.5em 0.8em 0.8em; margin: 0; font-size: 0.82em;
              white-space: pre-wrap; overflow-wrap: anywhere; }
.launch button { position: absolute; top: 0.4em; right: 0.4em; font-size: 0.8em; padding: 2px 10px; cursor: pointer; }
.launch .for { color: #555; font-size: 0.9em; margin: 0.2em 0; }
#winner { background: #eef7ee; border: 1px solid #9c9; padding: 0.5em 1em; border-radius: 4px; }
#winner .layout { font-family: monospace; font-size: 1.05em; font-weight: bold; overflow-wrap: anywhere; }
.plots img { max-width: 100%; display: block; margin: 1em 0; }
.muted { color: #777; }
"""

# Copies the line in the button's data-line; the Clipboard API where the page may use it, else a selection copy.
_SCRIPT = """
function copyLine(button) {
  const text = button.dataset.line;
  const done = () => { button.textContent = "Copied"; setTimeout(() => { button.textContent = "Copy"; }, 1500); };
  const fallback = () => {
    const area = document.createElement("textarea");
    area.value = text; document.body.appendChild(area); area.select(); document.execCommand("copy"); area.remove();
    done();
  };
  if (navigator.clipboard && window.isSecureContext) { navigator.clipboard.writeText(text).then(done, fallback); }
  else { fallback(); }
}
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportInput:
    """Everything the report shows, as plain values: the trials table plus a few facts about the job."""

    trials: pd.DataFrame
    title: str = "autotune search"
    job: Mapping[str, object] = field(default_factory=dict)  # model, cluster, training, backend, seed ...
    best_layout: str | None = None  # None: the top feasible trial of `trials`
    launch: Mapping[str, str] = field(default_factory=dict)  # form title -> one shell line
    launch_notes: Mapping[str, str] = field(default_factory=dict)  # form title -> what to run it with
    capacity_gib: float | None = None  # the GPU's memory, drawn as a line
    usable_gib: float | None = None  # capacity minus the headroom: what feasible means, drawn as a line


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _figure_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _png_img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{_esc(alt)}" src="data:image/png;base64,{data}">'


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and value != value)  # None or NaN


def _num(spec: str) -> Callable[[object], str]:
    return lambda v: "" if _missing(v) else format(v, spec)


def _text(v: object) -> str:
    return "" if _missing(v) or v == "" else str(v)


def _flags(layout: object) -> str:
    from autotune.outputs.tables import layout_flags
    from search_spaces.layout import parse_layout

    return layout_flags(parse_layout(str(layout)))


def _vpp(v: object) -> str:
    return "-" if _missing(v) or v in ("", 0) else str(int(v))  # type: ignore[call-overload]


# column key (a trials-table column) -> header for people, formatter, css class
_COLUMNS: dict[str, tuple[str, Callable[[Any], str], str]] = {
    "rank": ("#", str, ""),
    "trial": ("trial", _num("d"), ""),
    **{k: (k, _num("d"), "") for k in ("tp", "pp", "cp", "ep", "dp", "mbs")},
    "vpp": ("vpp", _vpp, ""),
    "etp": ("etp", _vpp, ""),
    "flags": ("flags", str, "text"),
    "status": ("status", _text, "text"),
    "tokens_per_s_per_gpu": ("tokens/s per GPU", _num(",.0f"), ""),
    "mfu": ("MFU", _num(".1%"), ""),
    "memory_gib": ("memory per GPU (GiB)", _num(".1f"), ""),
    "free_gib": ("free (GiB)", _num(".1f"), ""),
    "step_time_s": ("step time (s)", _num(".2f"), ""),
    "bound": ("step time bound by", _text, "text"),
    "origin": ("from", _text, "text"),
    "reason": ("why not", _text, "wrap"),
    "group": ("reason", _text, "wrap"),
    "trials": ("trials", _num("d"), ""),
    "example": ("example layout", _text, "text"),
    "closest_gib": ("least memory (GiB)", _num(".1f"), ""),
}
_LAYOUT_KEYS = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "mbs", "flags")
_RANKED = ("rank", *_LAYOUT_KEYS, "tokens_per_s_per_gpu", "mfu", "memory_gib", "free_gib", "step_time_s", "bound",
           "origin")
_FRONT = (*_LAYOUT_KEYS, "tokens_per_s_per_gpu", "mfu", "memory_gib", "free_gib", "bound")
_ALL = ("trial", *_LAYOUT_KEYS, "status", "tokens_per_s_per_gpu", "mfu", "memory_gib", "reason")


def _display(df: pd.DataFrame, usable_gib: float | None) -> pd.DataFrame:
    """The trials with the report's derived columns: rank, flags, etp (ETP = TP when unset), free memory, bound."""
    from autotune.outputs.plots import TIME_TERMS

    out = df.assign(rank=range(1, len(df) + 1))
    if "layout" in out:
        out = out.assign(flags=[_flags(v) for v in out["layout"]])
    if "etp" in out and "tp" in out:
        out = out.assign(etp=out["etp"].where(out["etp"].notna(), out["tp"]))
    if usable_gib is not None and "memory_gib" in out:
        out = out.assign(free_gib=usable_gib - out["memory_gib"])
    if "dominant_time" in out:
        out = out.assign(bound=["" if _missing(v) else TIME_TERMS.get(str(v), str(v)) for v in out["dominant_time"]])
    return out


def _table(df: pd.DataFrame, columns: tuple[str, ...], *, table_id: str = "", moe: bool = True) -> str:
    cols = [c for c in columns if c in df.columns and (moe or c not in ("ep", "etp"))]
    head = "".join(f'<th class="{_COLUMNS[c][2]}">{_esc(_COLUMNS[c][0])}</th>' for c in cols)
    body = []
    for row in df[cols].itertuples(index=False):
        cells = "".join(f'<td class="{_COLUMNS[c][2]}">{_esc(_COLUMNS[c][1](v))}</td>'
                        for c, v in zip(cols, row, strict=True))
        body.append(f"<tr>{cells}</tr>")
    ident = f' id="{_esc(table_id)}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _kv_table(items: Mapping[str, object], *, table_id: str = "") -> str:
    rows = "".join(f'<tr><th class="text">{_esc(k)}</th><td class="text">{_esc(v)}</td></tr>' for k, v in items.items())
    ident = f' id="{_esc(table_id)}"' if table_id else ""
    return f"<table{ident}>{rows}</table>"


def wrap_shell(line: str, width: int = LAUNCH_WIDTH) -> str:
    """A one-line shell command shown on several lines (` \\` continuations, items kept whole): still a valid
    command when pasted, the Copy button gives the one-line form."""
    import shlex

    items = [shlex.quote(item) for item in shlex.split(line)]
    lines, current = [], ""
    for item in items:
        # a flag and its value stay together (`--tensor-model-parallel-size 2`)
        glue = current and not (item.startswith("-") or "=" in item) and current.split(" ")[-1].startswith("--")
        if current and not glue and len(current) + 1 + len(item) > width:
            lines.append(current)
            current = item
        else:
            current = f"{current} {item}" if current else item
    lines.append(current)
    return " \\\n  ".join(lines)


def _launch_block(index: int, title: str, line: str, note: str) -> str:
    return (f'<div class="launch"><h3>{_esc(title)}</h3>'
            + (f'<p class="for">{_esc(note)}</p>' if note else "")
            + f'<pre id="launch-{index}">{_esc(wrap_shell(line))}</pre>'
            f'<button type="button" data-line="{_esc(line)}" onclick="copyLine(this)">Copy</button></div>')


def _winner_section(data: ReportInput, top: pd.DataFrame) -> str:
    if data.best_layout is None and top.empty:
        return '<div id="winner"><p>No feasible layout was found. See the rejections below.</p></div>'
    layout = data.best_layout if data.best_layout is not None else top.iloc[0]["layout"]
    match = data.trials[data.trials["layout"] == layout] if "layout" in data.trials else data.trials.iloc[0:0]
    facts: dict[str, object] = {}
    if len(match):
        row = match.iloc[0]
        for key in ("tokens_per_s_per_gpu", "mfu", "memory_gib", "step_time_s", "tflops_per_gpu"):
            if key in row.index and not _missing(row[key]):
                label, fmt = _COLUMNS[key][:2] if key in _COLUMNS else ("TFLOP/s per GPU", _num(",.0f"))
                facts[label] = fmt(row[key])
        if data.usable_gib is not None and not _missing(row.get("memory_gib")):
            facts["free memory per GPU (GiB)"] = f"{data.usable_gib - row['memory_gib']:.1f} of {data.usable_gib:.1f}"
    parts = [f'<div id="winner"><p>Best layout: <span class="layout">{_esc(layout)}</span></p>', _kv_table(facts)]
    for i, (name, text) in enumerate(data.launch.items()):
        parts.append(_launch_block(i, name, text, data.launch_notes.get(name, "")))
    parts.append("</div>")
    return "".join(parts)


_LARGEST = re.compile(r"largest term: (\w+)")


def rejection_groups(df: pd.DataFrame, usable_gib: float | None = None) -> pd.DataFrame:
    """Rejected trials by reason, most common first: one group per broken rule, per largest memory term of the
    out-of-memory layouts (not per figure), 'over the headroom' for layouts that run but leave too little free,
    and failed / timed-out jobs by their message. Columns: group, trials, example (layout), closest_gib."""
    import pandas as pd

    columns = ["group", "trials", "example", "closest_gib"]
    bad = df[~plots.feasible_mask(df)] if "status" in df and len(df) else df.iloc[0:0]
    if bad.empty:
        return pd.DataFrame(columns=columns)
    keys: list[tuple[str, int]] = []
    for pos, row in enumerate(bad.itertuples(index=False)):
        r = row._asdict()
        status, reason = r.get("status"), _text(r.get("reason"))
        if status == "ok":
            keys.append(("runs, but above the usable memory (GPU memory minus headroom)", pos))
        elif status == "oom":
            term = r.get("dominant_memory") or (m.group(1) if (m := _LARGEST.search(reason)) else None)
            keys.append((f"out of memory, largest term {term}" if term else "out of memory", pos))
        elif status == "invalid":
            rules = [x for x in _text(r.get("rules")).split(",") if x] or \
                [part.split(":", 1)[0].strip() for part in reason.split("; ") if part]
            keys += [(f"breaks {rule}", pos) for rule in rules or ["a validity rule"]]
        else:
            keys.append((f"{status}: {reason[:120]}" if reason else str(status), pos))
    groups: dict[str, list[int]] = {}
    for key, pos in keys:
        groups.setdefault(key, []).append(pos)
    out = []
    for key, positions in groups.items():
        rows = bad.iloc[positions]
        memory = rows["memory_gib"].dropna() if "memory_gib" in rows else pd.Series(dtype=float)
        example = rows.loc[memory.idxmin(), "layout"] if len(memory) else rows.iloc[0].get("layout", "")
        out.append({"group": key, "trials": len(positions), "example": example,
                    "closest_gib": float(memory.min()) if len(memory) else None})
    return pd.DataFrame(out).sort_values(["trials", "group"], ascending=[False, True], kind="stable")


def _rejections(df: pd.DataFrame, usable_gib: float | None) -> str:
    if "status" not in df:
        return ""
    groups = rejection_groups(df, usable_gib)
    if groups.empty:
        return "<p>Every trial was feasible.</p>"
    n_bad = int((~plots.feasible_mask(df)).sum())
    note = ('<p class="muted">A layout that breaks several rules is counted under each; '
            f'{n_bad} trials were rejected in all.</p>')
    return _table(groups, ("group", "trials", "closest_gib", "example"), table_id="rejections") + note


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
    moe = bool(len(df)) and "ep" in df and bool((df["ep"].fillna(1) > 1).any())
    top = plots.top_feasible(df, 10)
    front = df[plots.pareto_mask(df)].sort_values("memory_gib") if len(df) else df
    if pngs is None:
        drawn = plots.figures(df, capacity_gib=data.capacity_gib, usable_gib=data.usable_gib)
        pngs = {name: _figure_png(fig) for name, fig in drawn.items()}
    figures = [(pngs[name], alt) for name, alt in _PLOT_ALTS.items()]
    n_ok = int(plots.feasible_mask(df).sum()) if len(df) else 0
    summary = dict(data.job)
    summary.update({"trials": len(df), "feasible trials": n_ok})
    shown = df.head(MAX_TRIAL_ROWS)
    cut = "" if len(df) <= MAX_TRIAL_ROWS else f'<p class="muted">First {MAX_TRIAL_ROWS} of {len(df)} trials.</p>'
    created = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    from autotune.outputs.tables import FLAGS_TEXT

    legend = (f'<p class="muted">flags: {_esc(FLAGS_TEXT)}. '
              "free: usable memory (GPU memory minus headroom) left per GPU.</p>")
    u = data.usable_gib
    body = [
        f"<h1>{_esc(data.title)}</h1><p class='muted'>Written {created} by autotune.</p>",
        "<h2>Job</h2>", _kv_table(summary, table_id="job"),
        "<h2>Winner</h2>", _winner_section(data, top),
        "<h2>Plots</h2><div class='plots'>", *(_png_img(png, alt) for png, alt in figures), "</div>",
        "<h2>Top layouts</h2>", _table(_display(top, u), _RANKED, table_id="top", moe=moe), legend,
        "<h2>Pareto front</h2>", _table(_display(front, u), _FRONT, table_id="pareto", moe=moe),
        "<h2>Rejected layouts, by reason</h2>", _rejections(df, u),
        "<h2>All trials</h2><details><summary>show every trial</summary>", cut,
        _table(_display(shown, u), _ALL, table_id="trials", moe=moe), "</details>",
    ]
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{_esc(data.title)}</title>"
            f"<style>{_STYLE}</style><script>{_SCRIPT}</script></head><body>{''.join(body)}</body></html>\n")


def summary_html(result) -> str:
    """A short HTML view of a result (job, winner with its launch forms, top 5) without plots, for notebooks."""
    data = report_input(result)
    top = plots.top_feasible(data.trials, 5)
    return "".join([f"<style>{_STYLE}</style><script>{_SCRIPT}</script><h4>{_esc(data.title)}</h4>",
                    _kv_table(data.job), _winner_section(data, top),
                    _table(_display(top, data.usable_gib), _RANKED)])


_LAUNCH_TITLES = {"megatron_bridge": "Megatron-Bridge overrides", "megatron_lm": "Megatron-LM arguments"}


def report_input(result) -> ReportInput:
    """Adapt a search result (`autotune.tuning.results.SearchResult` or `autotune.outputs.view.Result`) to
    `ReportInput`."""
    from autotune.outputs.launch import launch_header
    from autotune.outputs.view import Result

    res = result if isinstance(result, Result) else Result(result)
    forms = res.launch_forms()
    return ReportInput(
        trials=res.trials,
        title=res.title,
        job=res.job_summary(),
        best_layout=None if res.best is None else str(res.best),
        launch={_LAUNCH_TITLES.get(k, k): v for k, v in forms.items()},
        launch_notes={_LAUNCH_TITLES.get(k, k): launch_header(res.job, k, res.best) for k in forms},
        capacity_gib=res.capacity_gib,
        usable_gib=res.usable_gib,
    )


def write_report(result, folder: str | Path) -> str:
    """Write `report.html` and the four plot PNGs into `folder`; returns the report's path.

    `result` is a search result or an already built `ReportInput`.
    """
    data = result if isinstance(result, ReportInput) else report_input(result)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    saved = plots.save_all(data.trials, folder, capacity_gib=data.capacity_gib, usable_gib=data.usable_gib)
    pngs = {name: Path(p).read_bytes() for name, p in saved.items()}  # each plot drawn once, embedded as saved
    path = folder / REPORT_FILE
    path.write_text(render_report(data, pngs), encoding="utf-8")
    return str(path)

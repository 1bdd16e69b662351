"""A self-contained HTML report of one search: opens in a browser from disk, no server, no network.

The plots are PNGs embedded as base64 `data:` URIs, the styles are inline, and the one inline script is the
copy buttons' (it copies a launch line to the clipboard), so the file can be mailed or attached to a ticket as is.
What it holds, all read from the search's one answer (`autotune.tuning.answer.Answer`; nothing here re-ranks): the
job, the winner (in an element with id `winner`: its layout, figures, the confidence sentence, the memory and
pipeline warnings, both launch forms wrapped, each with a Copy button that copies the one-line form), the plots (the
pick starred on the Pareto plot and first, marked '*', in both breakdowns; a progress plot only for a measured
search), the top layouts (the pick first, marked), the verdicts on the user's layouts (`yours`), the Pareto front
(the pick first), the whole space's counts (valid, fit, out of memory by term, candidates ruled out by rule), the
rejected trials grouped by reason with counts, and every trial. Columns are named for people (tokens/s per GPU,
MFU in percent) and a layout is its short columns (`tp pp vpp cp ep etp dp mbs flags`), so the page fits a
1280-pixel window without scrolling sideways (checked in headless Chromium, tests/test_report.py).

    >>> from autotune.outputs.report import write_report
    >>> write_report(Result(search_result), "runs/mixtral")          # doctest: +SKIP
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
tr.pick td { background: #fff6d5; font-weight: 600; }
.warning { color: #8a5300; }
.sentence { margin: 0.4em 0; }
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
    """Everything the report shows, as plain values: the trials table, the answer's order and marks, a few facts.

    Built from a search by `report_input`; a test may give only `trials` (then the order is by tokens/s)."""

    trials: pd.DataFrame
    title: str = "autotune search"
    job: Mapping[str, object] = field(default_factory=dict)  # model, cluster, training, backend, seed ...
    best_layout: str | None = None  # the pick (None: the first of `order`, else the top feasible trial)
    launch: Mapping[str, str] = field(default_factory=dict)  # form title -> one shell line
    launch_notes: Mapping[str, str] = field(default_factory=dict)  # form title -> what to run it with
    capacity_gib: float | None = None  # the GPU's memory, drawn as a line
    usable_gib: float | None = None  # capacity minus the headroom: what feasible means, drawn as a line
    ranked: pd.DataFrame | None = None  # the answer's ranking as a trials table, in order (the pick first)
    front: tuple[str, ...] | None = None  # the answer's Pareto front (layout texts, the pick first)
    tied: tuple[str, ...] = ()  # layouts tied with the pick
    inside_error: tuple[str, ...] = ()  # layouts whose predicted free memory is inside the memory model's error
    sentence: str = ""  # the confidence sentence
    warnings: tuple[str, ...] = ()  # memory margin, pipeline batch
    basis: str = ""  # what the figures are (the model, GPU measurements, the model checked by the CPU proxy)
    yours: tuple[tuple[str, str, bool], ...] = ()  # (layout, verdict, fits) per --layout
    space: Mapping[str, Any] = field(default_factory=dict)  # the whole space's counts
    progress_plot: bool = True  # False for an analytic run (no trial order to plot)
    breakdowns: pd.DataFrame | None = None  # what the breakdown plots stack (the model's terms), in order
    breakdown_title: str = ""

    @property
    def order(self) -> tuple[str, ...] | None:
        return None if self.ranked is None else tuple(self.ranked["layout"]) if len(self.ranked) else ()

    @property
    def pick(self) -> str | None:
        if self.best_layout is not None:
            return self.best_layout
        order = self.order
        return order[0] if order else None


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
    "mark": ("", _text, "text"),
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
    "bound": ("largest non-compute term", _text, "text"),
    "proxy": ("CPU proxy", _text, "text"),
    "verdict": ("verdict", _text, "wrap"),
    "layout": ("layout", _text, "wrap"),
    "count": ("layouts", _num(",d"), ""),
    "origin": ("from", _text, "text"),
    "why_not": ("why not", _text, "wrap"),
    "group": ("reason", _text, "wrap"),
    "trials": ("trials", _num("d"), ""),
    "example": ("example layout", _text, "wrap"),  # a layout with its switches runs past 120 characters
    "closest_gib": ("least memory (GiB)", _num(".1f"), ""),
}
_LAYOUT_KEYS = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "mbs", "flags")
_RANKED = ("rank", *_LAYOUT_KEYS, "tokens_per_s_per_gpu", "mfu", "memory_gib", "free_gib", "step_time_s", "bound",
           "proxy", "origin")
_FRONT = ("mark", *_LAYOUT_KEYS, "tokens_per_s_per_gpu", "mfu", "memory_gib", "free_gib", "bound", "proxy")
_ALL = ("mark", "trial", *_LAYOUT_KEYS, "status", "tokens_per_s_per_gpu", "mfu", "memory_gib", "why_not")


def _display(df: pd.DataFrame, usable_gib: float | None, *, pick: str | None = None,
             tied: tuple[str, ...] = ()) -> pd.DataFrame:
    """The trials with the report's derived columns: rank (the pick's marked '*', its ties' '='), mark, flags, etp
    (ETP = TP when unset), free memory, the largest non-compute term."""
    from autotune.outputs.terms import time_label

    layouts = list(df["layout"]) if "layout" in df else [""] * len(df)
    marks = ["*" if lay == pick else "=" if lay in tied else "" for lay in layouts]
    out = df.assign(rank=[f"{i} {m}".strip() for i, m in enumerate(marks, 1)],
                    mark=["pick" if m == "*" else "" for m in marks])
    if "layout" in out:
        out = out.assign(flags=[_flags(v) for v in out["layout"]])
    if "etp" in out and "tp" in out:
        out = out.assign(etp=out["etp"].where(out["etp"].notna(), out["tp"]))
    if usable_gib is not None and "memory_gib" in out:
        out = out.assign(free_gib=usable_gib - out["memory_gib"])
    if "step_time_s" in out:
        out = out.assign(bound=[_bound_text(row, time_label) for row in out.to_dict("records")])
    if "proxy" in out and not out["proxy"].map(_missing).all():
        out = out.assign(proxy=out["proxy"].map(lambda v: "" if _missing(v) else v))
    elif "proxy" in out:
        out = out.drop(columns=["proxy"])
    return out


def _why_not(df: pd.DataFrame, *, pick: str | None, tied: tuple[str, ...], inside_error: tuple[str, ...],
             usable_gib: float | None) -> pd.DataFrame:
    """`df` with a `why_not` column: why each trial is not the pick. Not run or out of memory: its status and reason
    (the rule it breaks, the largest memory term); above the usable memory; free memory inside the memory model's
    error (`inside_error`: the answer's `Answer.inside_error`); tied with the pick (the tie rules chose); else its
    tokens/s against the pick's."""
    from autotune.tuning.ranking import TIE_TOLERANCE

    rows = df.to_dict("records")
    best = next((r.get("tokens_per_s_per_gpu") for r in rows if r.get("layout") == pick), None)
    out = []
    for r in rows:
        tokens, memory = r.get("tokens_per_s_per_gpu"), r.get("memory_gib")
        if r.get("layout") == pick:
            out.append("the pick")
        elif r.get("status") != "ok":
            out.append(f"{r.get('status')}: {_text(r.get('reason'))}".rstrip(": "))
        elif usable_gib is not None and not _missing(memory) and memory > usable_gib:
            out.append(f"{memory - usable_gib:.1f} GiB above the usable memory")
        elif r.get("layout") in inside_error and usable_gib is not None:
            out.append(f"{usable_gib - memory:.1f} GiB free, inside the memory model's error: may not fit")
        elif r.get("layout") in tied:
            out.append(f"tied with the pick (within {TIE_TOLERANCE:.0%}): the pick is simpler or leaves more memory")
        elif best and not _missing(tokens):
            out.append(f"{tokens / best - 1:+.1%} tokens/s against the pick")
        else:
            out.append(_text(r.get("reason")))
    return df.assign(why_not=out)


def _bound_text(row: Mapping[str, Any], label: Callable[[object], str]) -> str:
    """`EP all-to-all 18%` from a trials-table row's `time.*` columns (the cost model's terms only)."""
    from autotune.tuning.answer import largest_time_term

    time = {k[5:]: v for k, v in row.items() if k.startswith("time.") and not _missing(v)}
    step = row.get("step_time_s")
    term = largest_time_term(time, None if _missing(step) else step)
    from autotune.outputs.terms import share

    return "" if term is None else f"{label(term[0])} {share(term[1])}"


def _table(df: pd.DataFrame, columns: tuple[str, ...], *, table_id: str = "", moe: bool = True) -> str:
    cols = [c for c in columns if c in df.columns and (moe or c not in ("ep", "etp"))]
    head = "".join(f'<th class="{_COLUMNS[c][2]}">{_esc(_COLUMNS[c][0])}</th>' for c in cols)
    body = []
    picked = list(df["mark"] == "pick") if "mark" in df else [False] * len(df)
    # each layout row names its layout in full (a tooltip; the columns show its sizes and flags)
    names = [f' title="{_esc(v)}"' if isinstance(v, str) and v else "" for v in df["layout"]] if "layout" in df \
        else [""] * len(df)
    for row, is_pick, name in zip(df[cols].itertuples(index=False), picked, names, strict=True):
        cells = "".join(f'<td class="{_COLUMNS[c][2]}">{_esc(_COLUMNS[c][1](v))}</td>'
                        for c, v in zip(cols, row, strict=True))
        body.append(f'<tr class="pick"{name}>{cells}</tr>' if is_pick else f"<tr{name}>{cells}</tr>")
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
    layout = data.pick
    if layout is None and len(top):
        layout = top.iloc[0]["layout"]
    if layout is None:
        return ('<div id="winner"><p>No feasible layout was found. See the whole space and the rejections '
                'below.</p></div>')
    source = data.ranked if data.ranked is not None and len(data.ranked) else data.trials
    match = source[source["layout"] == layout] if "layout" in source else source.iloc[0:0]
    facts: dict[str, object] = {}
    if len(match):
        row = match.iloc[0]
        for key in ("tokens_per_s_per_gpu", "mfu", "memory_gib", "step_time_s", "tflops_per_gpu"):
            if key in row.index and not _missing(row[key]):
                label, fmt = _COLUMNS[key][:2] if key in _COLUMNS else ("TFLOP/s per GPU", _num(",.0f"))
                facts[label] = fmt(row[key])
        if data.usable_gib is not None and not _missing(row.get("memory_gib")):
            facts["free memory per GPU (GiB)"] = f"{data.usable_gib - row['memory_gib']:.1f} of {data.usable_gib:.1f}"
        bound = _bound_text(row.to_dict(), _label())
        if bound:
            facts["largest non-compute term"] = bound
    if data.basis:
        facts["figures"] = data.basis
    parts = [f'<div id="winner"><p>Best layout: <span class="layout">{_esc(layout)}</span></p>', _kv_table(facts)]
    if data.sentence:
        parts.append(f'<p class="sentence" id="confidence">{_esc(data.sentence)}</p>')
    parts += [f'<p class="warning">Warning: {_esc(w)}</p>' for w in data.warnings]
    for i, (name, text) in enumerate(data.launch.items()):
        parts.append(_launch_block(i, name, text, data.launch_notes.get(name, "")))
    parts.append("</div>")
    return "".join(parts)


def _label() -> Callable[[object], str]:
    from autotune.outputs.terms import time_label

    return time_label


def _yours(data: ReportInput) -> str:
    """The user's layouts, each with its verdict."""
    import pandas as pd

    if not data.yours:
        return ""
    df = pd.DataFrame([{"layout": lay, "verdict": text} for lay, text, _fits in data.yours])
    return "<h2>Your layouts</h2>" + _table(df, ("layout", "verdict"), table_id="yours")


def _space(data: ReportInput) -> str:
    """The whole space: valid layouts, how many fit, the others by their largest memory term, and the candidates
    the validity rules ruled out (by rule)."""
    import pandas as pd

    s = data.space
    if not s:
        return ""
    lines = [{"group": "valid layouts (all scored)", "count": s.get("valid")},
             {"group": "fit in memory", "count": s.get("fit")}]
    lines += [{"group": f"out of memory, largest term {term}", "count": n}
              for term, n in sorted((s.get("out_of_memory_by_term") or {}).items(), key=lambda kv: -kv[1])]
    if s.get("equivalent_merged"):
        lines.append({"group": "fit, but the same as a simpler layout (dist_opt over one rank): merged",
                      "count": s["equivalent_merged"]})
    rules = s.get("rejected_by") or {}
    if rules:
        lines.append({"group": f"candidates ruled out by the validity rules (of {s.get('candidates', 0):,})",
                      "count": sum(rules.values())})
        lines += [{"group": f"breaks {rule}", "count": n} for rule, n in rules.items()]
    note = ("A candidate is counted under the first rule it breaks." if rules else
            "The candidates the validity rules rule out, rule by rule: `python -m autotune space` with the same job.")
    return ("<h2>The whole space</h2>" + _table(pd.DataFrame(lines), ("group", "count"), table_id="space")
            + f'<p class="muted">{_esc(note)}</p>')


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
        elif status == "oom" and "host memory" in reason:  # `memory.memory_status`: the offload overflows the host
            keys.append(("out of host memory: offloaded activations", pos))
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


def _plot_kwargs(data: ReportInput) -> dict[str, Any]:
    return {"capacity_gib": data.capacity_gib, "usable_gib": data.usable_gib, "pick": data.pick, "order": data.order,
            "front": data.front, "breakdowns": data.breakdowns, "progress_plot": data.progress_plot,
            "breakdown_title": data.breakdown_title}


def render_report(data: ReportInput, pngs: Mapping[str, bytes] | None = None) -> str:
    """The report as one HTML string (plots embedded, no external resource).

    `pngs`: the plots already drawn (plot name -> PNG bytes, as `write_report` has them); else drawn here.
    """
    df = data.trials
    moe = bool(len(df)) and "ep" in df and bool((df["ep"].fillna(1) > 1).any())
    ranked = data.ranked if data.ranked is not None else df
    top = plots.top_feasible(ranked, 10, data.order)
    if data.front is not None:
        rows = ranked.drop_duplicates(subset="layout").set_index("layout", drop=False) if len(ranked) else ranked
        front = rows.loc[[lay for lay in data.front if lay in rows.index]].reset_index(drop=True) if len(rows) \
            else ranked
    else:
        front = df[plots.pareto_mask(df)].sort_values("memory_gib") if len(df) else df
    if pngs is None:
        drawn = plots.figures(df, **_plot_kwargs(data))
        pngs = {name: _figure_png(fig) for name, fig in drawn.items()}
    figures = [(pngs[name], alt) for name, alt in _PLOT_ALTS.items() if name in pngs]
    n_ok = int(plots.feasible_mask(df).sum()) if len(df) else 0
    summary = dict(data.job)
    summary.update({"trials": len(df), "feasible trials": n_ok})
    pick = data.pick
    shown = df.head(MAX_TRIAL_ROWS)
    if pick is not None and "layout" in shown:  # the pick first here too, then in trial order
        shown = shown.iloc[sorted(range(len(shown)), key=lambda i: shown["layout"].iloc[i] != pick)]
    cut = "" if len(df) <= MAX_TRIAL_ROWS else f'<p class="muted">First {MAX_TRIAL_ROWS} of {len(df)} trials.</p>'
    created = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    from autotune.outputs.tables import FLAGS_TEXT, MARKS_LEGEND
    from autotune.outputs.terms import BOUND_NOTE

    legend = (f'<p class="muted">flags: {_esc(FLAGS_TEXT)}. {_esc(MARKS_LEGEND)}. {_esc(BOUND_NOTE)}. '
              "free: usable memory (GPU memory minus headroom) left per GPU.</p>")
    u, tied = data.usable_gib, data.tied
    body = [
        f"<h1>{_esc(data.title)}</h1><p class='muted'>Written {created} by autotune.</p>",
        "<h2>Job</h2>", _kv_table(summary, table_id="job"),
        "<h2>Winner</h2>", _winner_section(data, top),
        "<h2>Plots</h2><div class='plots'>", *(_png_img(png, alt) for png, alt in figures), "</div>",
        "<h2>Top layouts</h2>", _table(_display(top, u, pick=pick, tied=tied), _RANKED, table_id="top", moe=moe),
        legend, _yours(data),
        "<h2>Pareto front</h2>", _table(_display(front, u, pick=pick), _FRONT, table_id="pareto", moe=moe),
        _space(data),
        "<h2>Rejected trials, by reason</h2>", _rejections(df, u),
        "<h2>All trials</h2><details><summary>show every trial</summary>", cut,
        _table(_why_not(_display(shown, u, pick=pick), pick=pick, tied=tied, inside_error=data.inside_error,
                        usable_gib=u), _ALL, table_id="trials", moe=moe), "</details>",
    ]
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{_esc(data.title)}</title>"
            f"<style>{_STYLE}</style><script>{_SCRIPT}</script></head><body>{''.join(body)}</body></html>\n")


def summary_html(result) -> str:
    """A short HTML view of a search's `Result` (job, winner with its confidence and launch forms, top 5, the user's
    layouts) without plots, for notebooks."""
    data = report_input(result)
    ranked = data.ranked if data.ranked is not None else data.trials
    top = plots.top_feasible(ranked, 5, data.order)
    return "".join([f"<style>{_STYLE}</style><script>{_SCRIPT}</script><h4>{_esc(data.title)}</h4>",
                    _kv_table(data.job), _winner_section(data, top),
                    _table(_display(top, data.usable_gib, pick=data.pick, tied=data.tied), _RANKED), _yours(data)])


_LAUNCH_TITLES = {"megatron_bridge": "Megatron-Bridge overrides", "megatron_lm": "Megatron-LM arguments"}


def report_input(result, *, space_rules: bool = False) -> ReportInput:
    """Adapt a search's `autotune.outputs.view.Result` (`Result(search_result)`) to `ReportInput`, from its one
    answer. `space_rules`: also count the candidates each validity rule rules out over
    the whole space (`search_spaces.space.rejections`: 2 to 6 s for the README job on this 2-core machine, more than
    the search itself, so off by default; the `space` verb prints them)."""
    from autotune.outputs.launch import launch_header
    from autotune.outputs.tables import verdict_text
    res = result
    answer = res.answer
    d = answer.decision
    forms = res.launch_forms()
    ranked = plots.trials_frame(answer.ranked)
    model = plots.trials_frame(answer.model_records(5))
    measured = any(r.measurement.source != "analytic" for r in answer.records)
    return ReportInput(
        trials=res.trials,
        title=res.title,
        job=res.job_summary(),
        best_layout=d.pick,
        launch={_LAUNCH_TITLES.get(k, k): v for k, v in forms.items()},
        launch_notes={_LAUNCH_TITLES.get(k, k): launch_header(res.job, k, res.best) for k in forms},
        capacity_gib=res.capacity_gib,
        usable_gib=res.usable_gib,
        ranked=ranked,
        front=tuple(str(r.layout) for r in answer.pareto),
        tied=d.tied_layouts,
        inside_error=tuple(str(r.layout) for r in answer.records if answer.inside_error(r)),
        sentence=d.sentence,
        warnings=d.warnings,
        basis=_basis_text(answer),
        yours=tuple((v.layout, verdict_text(v), v.fits) for v in answer.yours),
        space=_space_counts(res, answer.space) if space_rules else dict(answer.space),
        progress_plot=res.raw.mode != "analytic",
        breakdowns=model,
        breakdown_title="the model's terms" if measured else "",
    )


def _basis_text(answer) -> str:
    from autotune.tuning.decision import GPU, PROXY

    if answer.basis == PROXY:
        p = answer.decision.proxy or {}
        return (f"the analytic model's, for the real job on this cluster; the CPU proxy (a scaled-down model on gloo) "
                f"built and trained {p.get('ran', 0)} of {p.get('measured', 0)} layouts, which shows they run, not "
                f"how fast they run on GPUs")
    if answer.basis == GPU:
        return "measured on the GPUs (megatron-core jobs)"
    return "the analytic model's"


def _space_counts(res, space: Mapping[str, Any]) -> dict[str, Any]:
    """The answer's space counts plus the candidates each rule rules out (`rejections` over the same options)."""
    out = dict(space)
    options = space.get("options")
    if not isinstance(options, dict):
        return out
    from search_spaces.space import SpaceOptions
    from search_spaces.space_report import rejections

    try:
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
        opts = SpaceOptions(**values)
        report = rejections(res.job, opts)
    except (TypeError, ValueError):
        return out
    out["candidates"] = report.candidates
    out["rejected_by"] = {k: v for k, v in sorted(report.rejected_by.items(), key=lambda kv: -kv[1]) if v}
    return out


def write_report(result, folder: str | Path) -> str:
    """Write `report.html` and the plot PNGs into `folder`; returns the report's path.

    `result` is a search's `autotune.outputs.view.Result` or an already built `ReportInput`.
    """
    data = result if isinstance(result, ReportInput) else report_input(result)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    saved = plots.save_all(data.trials, folder, **_plot_kwargs(data))
    pngs = {name: Path(p).read_bytes() for name, p in saved.items()}  # each plot drawn once, embedded as saved
    path = folder / REPORT_FILE
    path.write_text(render_report(data, pngs), encoding="utf-8")
    return str(path)

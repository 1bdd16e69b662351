"""The plots and the self-contained HTML report, including a real headless Chromium that opens it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_answer import readme_search

from autotune.outputs import plots
from autotune.outputs.report import REPORT_FILE, ReportInput, rejection_groups, render_report, wrap_shell, write_report
from autotune.outputs.view import Result
from autotune.tuning.results import TrialRecord, pareto_front
from search_spaces.layout import Layout
from search_spaces.measurement import Measurement
from search_spaces.units import GIB

CHROMIUM_INSTALL = "apt-get install -y chromium"


def _ok(layout: Layout, tps: float, mem_gib: float) -> Measurement:
    return Measurement(
        layout=layout, status="ok", source="analytic", memory_bytes=mem_gib * GIB,
        memory={"weights": 0.3 * mem_gib * GIB, "optimizer": 0.3 * mem_gib * GIB, "activations": 0.4 * mem_gib * GIB},
        step_time_s=1000.0 / tps, time={"compute": 700.0 / tps, "tp_comm": 100.0 / tps, "pp_bubble": 150.0 / tps,
                                         "dp_comm": 50.0 / tps},
        tokens_per_s_per_gpu=tps, mfu=0.4,
    )


def _measurements() -> list[Measurement]:
    """Five feasible layouts, one OOM, one invalid; the best is tp=2,pp=2,dp=8 at 3000 tokens/s."""
    return [
        _ok(Layout(tp=1, pp=1, dp=32), 1000.0, 70.0),
        _ok(Layout(tp=2, pp=2, dp=8), 3000.0, 40.0),
        _ok(Layout(tp=4, pp=2, dp=4), 2500.0, 30.0),  # on the front: less memory than the best
        _ok(Layout(tp=8, pp=4, dp=1), 2000.0, 35.0),  # dominated by tp=4,pp=2 (more memory, slower)
        _ok(Layout(tp=8, pp=1, dp=4), 1500.0, 20.0),
        _oom(Layout(tp=1, pp=2, dp=16), 95.0),
        Measurement(layout=Layout(tp=3, dp=10), status="invalid", source="analytic",
                    reason="heads_divisible_by_tp: num_attention_heads (32) must be a multiple of "
                           "tensor_model_parallel_size (3).",
                    violations=("heads_divisible_by_tp: num_attention_heads (32) must be a multiple of "
                                "tensor_model_parallel_size (3).",)),
    ]


def _oom(layout: Layout, mem_gib: float) -> Measurement:
    return Measurement(layout=layout, status="oom", source="analytic", memory_bytes=mem_gib * GIB,
                       memory={"weights": 0.1 * mem_gib * GIB, "activations": 0.9 * mem_gib * GIB},
                       reason=f"peak memory {mem_gib:.1f} GiB exceeds 76.0 GiB per GPU (largest term: activations)",
                       extra={"dominant_memory": "activations"})


@pytest.fixture
def trials():
    return plots.trials_frame(_measurements())


def test_trials_frame_has_breakdown_columns(trials):
    assert {"time.compute", "time.pp_bubble", "memory.weights", "memory.activations"} <= set(trials.columns)
    assert list(trials["trial"]) == list(range(7))


def test_pareto_mask_keeps_only_undominated_feasible_trials(trials):
    # front by memory: 20 GiB/1500, 30/2500, 40/3000; 35/2000 and 70/1000 are beaten by 30/2500 and 40/3000.
    front = set(trials[plots.pareto_mask(trials)]["layout"])
    assert front == {str(Layout(tp=8, pp=1, dp=4)), str(Layout(tp=4, pp=2, dp=4)), str(Layout(tp=2, pp=2, dp=8))}


def test_top_feasible_orders_by_throughput(trials):
    assert list(plots.top_feasible(trials, 2)["tokens_per_s_per_gpu"]) == [3000.0, 2500.0]


def test_save_all_writes_four_pngs(trials, tmp_path):
    paths = plots.save_all(trials, tmp_path, capacity_gib=80.0)
    assert set(paths) == set(plots.PLOT_FILES)
    for path in paths.values():
        assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_is_self_contained(trials):
    text = render_report(ReportInput(trials=trials, capacity_gib=80.0, usable_gib=76.0))
    assert text.count('src="data:image/png;base64,') == 4
    for outside in ("http://", "https://", "<script src", "<link", "@import"):
        assert outside not in text


def test_report_names_columns_for_people_and_shows_percentages(trials):
    text = render_report(ReportInput(trials=trials, capacity_gib=80.0, usable_gib=76.0))
    assert "tokens/s per GPU" in text and "memory per GPU (GiB)" in text
    assert "tokens_per_s_per_gpu" not in text and "memory_gib" not in text
    assert ">40.0%<" in text and "0.4<" not in text  # MFU 0.4 as a percentage


def test_rejections_are_grouped_by_reason_with_counts():
    # three OOM layouts with different figures are one reason; the broken rule is another
    df = plots.trials_frame([*_measurements(), _oom(Layout(tp=1, pp=1, dp=32), 120.0),
                             _oom(Layout(tp=2, pp=1, dp=16), 88.5)])
    groups = rejection_groups(df, 76.0).set_index("group")
    assert groups.loc["out of memory, largest term activations", "trials"] == 3
    assert groups.loc["out of memory, largest term activations", "closest_gib"] == pytest.approx(88.5)
    assert groups.loc["breaks heads_divisible_by_tp", "trials"] == 1
    assert len(groups) == 2


def test_report_of_only_feasible_trials_says_none_was_rejected(trials):
    feasible = trials[trials["status"] == "ok"]
    assert rejection_groups(feasible).empty
    assert "Every trial was feasible." in render_report(ReportInput(trials=feasible))


def test_launch_lines_are_wrapped_and_copy_the_one_line(trials):
    import html
    import shlex

    line = "model.tensor_model_parallel_size=2 " * 12 + "'mixed_precision={_target_:x.Y,bf16:true}'"
    shown = wrap_shell(line, width=60)
    assert " \\\n  " in shown and max(len(x) for x in shown.splitlines()) <= 62
    assert shlex.split(shown.replace("\\\n", " ")) == shlex.split(line)  # pasted as shown, the same command
    text = render_report(ReportInput(trials=trials, launch={"Megatron-LM arguments": line}))
    assert f'data-line="{html.escape(line, quote=True)}"' in text and ">Copy</button>" in text


def test_pareto_plot_draws_the_usable_memory(trials):
    fig = plots.pareto(trials, capacity_gib=80.0, usable_gib=76.0)
    xs = [list(line.get_xdata()) for line in fig.axes[0].lines]  # type: ignore[arg-type]
    vertical = {x[0] for x in xs if len(set(x)) == 1}
    assert {76.0, 80.0} <= vertical


def test_plots_use_the_searchs_pareto_front():
    # equal figures are kept together (neither dominates); a layout seen twice counts once
    ms = [_ok(Layout(tp=2, dp=16), 3000.0, 40.0), _ok(Layout(tp=4, dp=8), 3000.0, 40.0),
          _ok(Layout(tp=2, dp=16), 3000.0, 40.0), _ok(Layout(tp=8, dp=4), 2000.0, 50.0)]
    records = [TrialRecord(number=i, origin="search", measurement=m, feasible=True, capacity_bytes=76 * GIB)
               for i, m in enumerate(ms)]
    df = plots.trials_frame(records)
    assert sorted(df[plots.pareto_mask(df)]["layout"]) == sorted(str(r.layout) for r in pareto_front(records))
    assert int(plots.pareto_mask(df).sum()) == 2


def test_report_without_feasible_layout_says_so(trials):
    text = render_report(ReportInput(trials=trials[trials["status"] != "ok"]))
    assert "No feasible layout was found" in text


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail(f"Chromium is needed to check the HTML report; install it with `{CHROMIUM_INSTALL}`.")
    return path


def _run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    command = [
        _chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium-profile'}", *args,
    ]
    env = {**os.environ, "HOME": str(tmp_path)}
    return subprocess.run(command, capture_output=True, text=True, timeout=90, env=env, check=True)


@pytest.mark.slow
def test_headless_chromium_shows_the_winner(trials, tmp_path):
    report = write_report(ReportInput(trials=trials, capacity_gib=80.0, usable_gib=76.0,
                                      launch={"Megatron-LM arguments": "--tensor-model-parallel-size 2"}),
                          tmp_path / "out")
    dom = _run_chromium(tmp_path, "--dump-dom", Path(report).as_uri()).stdout
    winner = dom[dom.index('id="winner"'):]
    winner = winner[: winner.index("</div>")]
    assert str(Layout(tp=2, pp=2, dp=8)) in winner
    assert "--tensor-model-parallel-size 2" in winner
    assert dom.count("<img") == 4


@pytest.mark.slow
def test_headless_chromium_draws_the_plots(trials, tmp_path):
    import matplotlib.image

    report = write_report(ReportInput(trials=trials, capacity_gib=80.0), tmp_path / "out")
    shot = tmp_path / "shot.png"
    _run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,3000", Path(report).as_uri())
    pixels = matplotlib.image.imread(shot)
    # A page that drew its tables and plots has many distinct colours; a blank or broken page has a few.
    distinct = len({tuple(p) for p in (pixels[::7, ::7, :3] * 255).astype(int).reshape(-1, 3)})
    assert distinct > 50
    assert (Path(report).parent / plots.PLOT_FILES["pareto"]).exists() and Path(report).name == REPORT_FILE


# Appended to a copy of the report: after load, the page's own width and every element sticking out of a
# 1280-pixel window are written into the DOM that --dump-dom prints.
_MEASURE = """<script>window.addEventListener("load", () => {
  const wide = [...document.querySelectorAll("body *")].filter(e => e.getBoundingClientRect().right > innerWidth + 1
      || e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !== "visible");
  const out = document.createElement("pre"); out.id = "measure";
  out.textContent = JSON.stringify({page: document.documentElement.scrollWidth, window: innerWidth,
                                    wide: wide.map(e => e.tagName + (e.id ? "#" + e.id : ""))});
  document.body.appendChild(out);
});</script>"""


@pytest.mark.slow
@pytest.mark.parametrize("model, nodes", [("mixtral", 4), ("deepseek-v3", 128)])
def test_headless_chromium_at_1280_px_has_no_horizontal_overflow(model, nodes, tmp_path):
    from sample_results import sampled_result  # a search's records from a sample of the real space, without Ray

    report = Path(write_report(Result(sampled_result(model, nodes)), tmp_path / "out"))
    result = _measure_in_chromium(tmp_path, report.read_text())
    assert result["window"] == 1280
    assert result["page"] <= result["window"] and result["wide"] == [], result


def _measure_in_chromium(tmp_path: Path, page: str) -> dict:
    import json

    probe = tmp_path / "measure.html"
    probe.write_text(page.replace("</body>", _MEASURE + "</body>"))
    dom = _run_chromium(tmp_path, "--window-size=1280,900", "--virtual-time-budget=5000", "--dump-dom",
                        probe.as_uri()).stdout
    start = dom.index('<pre id="measure">') + len('<pre id="measure">')
    return json.loads(dom[start:dom.index("</pre>", start)].replace("&quot;", '"'))


@pytest.mark.slow
def test_the_overflow_probe_sees_a_wide_element(trials, tmp_path):
    # the probe above is not blind: a 2000-pixel table cell pushes the page past the window
    page = render_report(ReportInput(trials=trials)).replace("<h1>", '<table><tr><td id="w" style="min-width:2000px">'
                                                             "x</td></tr></table><h1>", 1)
    result = _measure_in_chromium(tmp_path, page)
    assert result["page"] > 1280 and "TD#w" in result["wide"]


@pytest.fixture
def analytic_report(tmp_path_factory):
    """The report of a real analytic search (the whole space scored), with one user layout that fits and one that
    does not: test_answer's README search, run once per session."""
    result = readme_search(tmp_path_factory)
    return result, Path(str(result.output_dir)) / REPORT_FILE


def _first_body_row(html: str, table_id: str) -> str:
    body = html[html.index(f'id="{table_id}"'):]
    body = body[body.index("<tbody>"):]
    return body[:body.index("</tr>")]


def test_the_report_reads_the_answer(analytic_report):
    result, path = analytic_report
    html = path.read_text()
    pick = result.answer.decision.pick
    assert pick in _first_body_row(html, "top") and 'class="pick"' in _first_body_row(html, "top")
    assert 'class="pick"' in _first_body_row(html, "pareto")  # the pick first on the front too
    winner = html[html.index('id="winner"'):html.index("<h2>Plots</h2>")]
    assert pick in winner and result.answer.decision.sentence.split(":")[0] in winner  # the confidence sentence
    assert html.count('src="data:image/png;base64,') == 3  # no progress plot for an analytic run
    assert not (path.parent / plots.PLOT_FILES["progress"]).exists()
    assert 'id="yours"' in html and "does not fit" in html and "nearest that fits" in html
    space = html[html.index('id="space"'):]
    assert f"{result.space_size:,}" in space[:space.index("</table>")]
    for stat in ("step_median", "step_stdev"):
        assert stat not in html


def test_every_trial_says_why_it_is_not_the_pick(analytic_report):
    # issue 46: the report's "why not" column was empty for every layout that fits
    import re

    _, path = analytic_report
    html = path.read_text()
    table = html[html.index('id="trials"'):]
    table = table[table.index("<tbody>"):table.index("</tbody>")]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)
    last = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[-1].strip() for row in rows]
    assert len(last) > 10 and all(last), [i for i, text in enumerate(last) if not text][:5]
    assert last.count("the pick") == 1
    assert any("tokens/s against the pick" in text for text in last)
    assert any("inside the memory model&#x27;s error" in text or "inside the memory model's error" in text
               for text in last)


@pytest.mark.slow
def test_headless_chromium_shows_the_pick_marked_and_the_confidence(analytic_report, tmp_path):
    result, path = analytic_report
    dom = _run_chromium(tmp_path, "--dump-dom", path.as_uri()).stdout
    pick = result.answer.decision.pick
    assert pick in _first_body_row(dom, "top") and 'class="pick"' in _first_body_row(dom, "top")
    winner = dom[dom.index('id="winner"'):]
    winner = winner[:winner.index('id="launch-0"')]
    assert 'id="confidence"' in winner and "Pick: " in winner
    assert dom.count("<img") == 3 and 'id="yours"' in dom and 'id="space"' in dom
    measured = _measure_in_chromium(tmp_path, path.read_text())
    assert measured["page"] <= measured["window"] and measured["wide"] == [], measured

"""The plots and the self-contained HTML report, including a real headless Chromium that opens it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from autotune.outputs import plots
from search_spaces.measurement import Measurement
from autotune.outputs.report import REPORT_FILE, ReportInput, render_report, write_report
from search_spaces.layout import Layout

GIB = 1024**3
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
        Measurement(layout=Layout(tp=1, pp=2, dp=16), status="oom", source="analytic", memory_bytes=95 * GIB,
                    reason="needs 95.0 GiB, GPU has 80.0 GiB"),
        Measurement(layout=Layout(tp=3, dp=10), status="invalid", source="analytic",
                    reason="num_attention_heads (32) must be a multiple of tensor_model_parallel_size (3)."),
    ]


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
    text = render_report(ReportInput(trials=trials, capacity_gib=80.0))
    assert text.count('src="data:image/png;base64,') == 4
    for outside in ("http://", "https://", "<script", "<link"):
        assert outside not in text


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
    report = write_report(ReportInput(trials=trials, capacity_gib=80.0,
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

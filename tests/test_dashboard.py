"""A search on a local Ray shows up in the Ray dashboard's REST API while it runs; the dashboard stays on 127.0.0.1."""

from __future__ import annotations

import argparse
import io
import json
import socket
import sys
import tempfile
import threading
import time
import urllib.request

import pytest

from autotune.ui import dashboard


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as reply:  # noqa: S310 - local dashboard
        return json.load(reply)


def _actors(url: str) -> list[dict]:
    return _get(f"{url}/api/v0/actors?detail=1&limit=1000")["data"]["result"]["result"]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_all_interfaces_are_refused_by_default(host):
    with pytest.raises(ValueError, match="CVE-2023-48022"):
        dashboard.start_local(host=host)


def test_dashboard_flag_defaults_to_localhost():
    parser = argparse.ArgumentParser()
    dashboard.add_arguments(parser)
    args = parser.parse_args(["--dashboard"])
    assert (args.dashboard, args.dashboard_host, args.dashboard_port) == (True, "127.0.0.1", 8265)


def test_wait_for_enter_returns_on_enter_and_prints_the_url():
    out = io.StringIO()
    dash = dashboard.Dashboard(url="http://127.0.0.1:8265", host="127.0.0.1", port=8265, started_here=False)
    dashboard.wait_for_enter(dash, stream=io.StringIO("\n"), out=out)
    assert "http://127.0.0.1:8265" in out.getvalue()


@pytest.mark.slow
def test_dashboard_lists_the_search_while_it_runs(monkeypatch, tmp_path):
    import ray

    import autotune.ui.api as api

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    # Ray's unix sockets must fit in 107 characters, so its temp dir is short, under /tmp, removed at the end.
    temp_dir = tempfile.mkdtemp(prefix="rt-", dir="/tmp")
    dash = dashboard.start_local(port=_free_port(), num_cpus=2, temp_dir=temp_dir)
    try:
        assert dash.url.startswith("http://127.0.0.1:")
        outcome: dict = {}
        search = threading.Thread(target=lambda: outcome.update(
            result=api.search("mixtral", nodes=4, trials=24, seed=0, dashboard=dash, output_dir=tmp_path / "out",
                              measured_stage=True)))
        search.start()
        seen_while_running: list[dict] = []
        while search.is_alive() and not seen_while_running:
            seen_while_running = [a for a in _actors(dash.url)
                                  if (a.get("name") or "").startswith("autotune-search:") and a["state"] == "ALIVE"]
            time.sleep(0.2)
        search.join(timeout=180)
        assert seen_while_running, "no autotune-search actor was listed by /api/v0/actors while the search ran"
        assert seen_while_running[0]["repr_name"].startswith("autotune mixtral")
        # Each evaluated layout is a task named after it (task events reach the dashboard within seconds).
        deadline = time.monotonic() + 20
        trial_tasks: list[dict] = []
        while not trial_tasks and time.monotonic() < deadline:
            tasks = _get(f"{dash.url}/api/v0/tasks?detail=1&limit=1000")["data"]["result"]["result"]
            trial_tasks = [t for t in tasks if (t.get("name") or "").startswith("trial tp=")]
            time.sleep(0.5)
        assert trial_tasks, "no task named 'trial <layout> [<status>]' in /api/v0/tasks"
        jobs = _get(f"{dash.url}/api/jobs/")
        assert any((j.get("metadata") or {}).get("tool") == "autotune" for j in jobs)
        assert outcome["result"].best is not None
    finally:
        ray.shutdown()
        import shutil

        shutil.rmtree(temp_dir, ignore_errors=True)


def test_the_dashboard_leaves_the_analytic_search_as_it_is(monkeypatch):
    # with Ray connected (the --dashboard case), the analytic backend is handed back unchanged, so run_search stays
    # the analytic whole-space answer; only a measured stage (or a cluster) gets a tracked backend
    import types

    from autotune.ui.api import make_job

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: True))
    job = make_job("mixtral", nodes=4)
    assert dashboard.track_search(job, "auto", None, 64) == "auto"
    assert dashboard.track_search(job, "analytic", None, 64) == "analytic"

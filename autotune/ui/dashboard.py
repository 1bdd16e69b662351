"""Watch a search in the Ray dashboard: a local Ray with its dashboard on 127.0.0.1, and named progress.

`python -m autotune ... --dashboard` starts a local Ray whose dashboard listens on 127.0.0.1 only,
prints its URL, runs the search, then keeps Ray up until you press Enter. The search is visible there
as a job (named by its metadata), a named progress actor `autotune-search:<name>` whose description
reads `12/64 trials, 9 feasible, best 3,120 tokens/s/GPU (tp=2,...)`, and the trials' own actors.

The dashboard is never bound to all interfaces by default: exposed Ray dashboards have been taken over
(ShadowRay, CVE-2023-48022). Every other port of that Ray is on 127.0.0.1 and Ray's token authentication is on
(`search_spaces/ray_session.py`), so the browser asks for the token (`ray get-auth-token`). To watch a remote
cluster, forward its port over SSH (`ssh -L 8265:127.0.0.1:8265 head-node`) instead of opening it.

    >>> from autotune import dashboard
    >>> dash = dashboard.start_local(port=8265)             # doctest: +SKIP
    >>> print(dash.url)                                      # doctest: +SKIP
    http://127.0.0.1:8265

Ray is imported inside the functions: importing this module is free.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from search_spaces.job import Job
    from search_spaces.layout import Layout
    from search_spaces.measurement import Backend, Measurement

__all__ = [
    "Dashboard",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "NAMESPACE",
    "start_local",
    "stop",
    "wait_for_enter",
    "open_progress",
    "progress_actor_name",
    "ReportingBackend",
    "track",
    "track_search",
    "report_result",
    "add_arguments",
    "session",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8265
NAMESPACE = "autotune"
_ALL_INTERFACES = ("0.0.0.0", "::", "")
_READY_TIMEOUT_S = 60.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Dashboard:
    """A running Ray dashboard: where to open it and whether this process started the Ray it belongs to."""

    url: str  # http://host:port
    host: str
    port: int
    started_here: bool
    token_required: bool = False  # Ray's token authentication is on: `ray get-auth-token` prints the token


def _check_host(host: str, allow_remote: bool) -> None:
    if host.strip() in _ALL_INTERFACES and not allow_remote:
        raise ValueError(
            f"refusing to bind the Ray dashboard to all interfaces ({host!r}): it has no authentication "
            "(ShadowRay, CVE-2023-48022). Keep 127.0.0.1 and use `ssh -L 8265:127.0.0.1:8265 <host>`, "
            "or pass allow_remote=True (--dashboard-host with --dashboard-allow-remote) on a trusted network."
        )


def _wait_until_serving(url: str, timeout_s: float = _READY_TIMEOUT_S) -> bool:
    """Poll the dashboard's version endpoint until it answers (it starts a little after ray.init returns).

    Returns True when it answers 401/403: Ray's token authentication is on (Ray 2.5x's default for a
    local cluster), and the browser will ask for the token.
    """
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/api/version", timeout=2) as reply:  # noqa: S310 - local URL
                if reply.status == 200:
                    return False
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):
                return True
            last_error = e
        except OSError as e:
            last_error = e
        time.sleep(0.5)
    raise RuntimeError(f"the Ray dashboard at {url} did not answer within {timeout_s:.0f} s: {last_error}")


def start_local(
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    num_cpus: int | None = None,
    temp_dir: str | None = None,
    job_name: str = "autotune search",
    allow_remote: bool = False,
) -> Dashboard:
    """Start a local Ray with its dashboard on `host:port` (127.0.0.1 by default) and wait until it answers.

    If this process is already connected to Ray, that Ray is kept and its dashboard URL returned.
    Raises ValueError for an all-interfaces host unless `allow_remote=True`.
    """
    _check_host(host, allow_remote)
    from search_spaces import ray_session

    ray_session.check_port(port, "--dashboard-port")
    import ray

    if ray.is_initialized():
        url = _http(_current_dashboard_url())
        return Dashboard(url=url, host=host, port=port, started_here=False)
    # every other Ray port stays on 127.0.0.1 whatever the dashboard's host (search_spaces/ray_session.py)
    context = ray_session.start_local(include_dashboard=True, dashboard_host=host, dashboard_port=port,
                                      num_cpus=num_cpus, temp_dir=temp_dir, namespace=NAMESPACE,
                                      job_config=_job_config(job_name))
    url = _http(context.dashboard_url or f"{host}:{port}")
    token_required = _wait_until_serving(url)
    bound_port = int(url.rsplit(":", 1)[1])
    return Dashboard(url=url, host=host, port=bound_port, started_here=True, token_required=token_required)


def _job_config(job_name: str):
    """The Ray job's metadata, shown on the dashboard's Jobs page."""
    from ray.job_config import JobConfig

    return JobConfig(metadata={"name": job_name, "tool": "autotune"})


def _current_dashboard_url() -> str:
    from ray._private.worker import get_dashboard_url

    return get_dashboard_url() or ""


def _http(address: str) -> str:
    return address if address.startswith(("http://", "https://")) else f"http://{address}"


def stop(dash: Dashboard) -> None:
    """Shut down the Ray this process started (a Ray it only joined is left running)."""
    if dash.started_here:
        import ray

        ray.shutdown()


def wait_for_enter(dash: Dashboard, *, stream: TextIO | None = None, out: TextIO | None = None) -> None:
    """Print the URL (on stderr by default) and block until the user presses Enter (or stdin closes)."""
    stream = stream or sys.stdin
    out = out or sys.stderr
    print(f"Ray dashboard: {dash.url} (search finished). Press Enter to stop Ray and exit.", file=out, flush=True)
    with contextlib.suppress(EOFError, KeyboardInterrupt):
        stream.readline() if stream is not sys.stdin else input()


# --- naming the search in the dashboard ---------------------------------------------------------
def progress_actor_name(search_name: str) -> str:
    return f"autotune-search:{search_name}"


def _progress_class():
    import ray

    class SearchProgress:
        """One per search: counts trials and keeps the best; its repr is what the dashboard shows."""

        def __init__(self, search_name: str, total_trials: int | None) -> None:
            self.search_name, self.total = search_name, total_trials
            self.done, self.feasible = 0, 0
            self.best_tps: float | None = None
            self.best_layout = ""

        def record(self, layout: str, status: str, tokens_per_s_per_gpu: float | None) -> None:
            self.done += 1
            if status == "ok":
                self.feasible += 1
                if tokens_per_s_per_gpu is not None and (self.best_tps is None or tokens_per_s_per_gpu > self.best_tps):
                    self.best_tps, self.best_layout = tokens_per_s_per_gpu, layout

        def snapshot(self) -> dict[str, Any]:
            return {"search": self.search_name, "done": self.done, "total": self.total, "feasible": self.feasible,
                    "best_tokens_per_s_per_gpu": self.best_tps, "best_layout": self.best_layout}

        def __repr__(self) -> str:
            total = "?" if self.total is None else self.total
            best = "none yet" if self.best_tps is None else f"{self.best_tps:,.0f} tokens/s/GPU ({self.best_layout})"
            return f"autotune {self.search_name}: {self.done}/{total} trials, {self.feasible} feasible, best {best}"

    SearchProgress.__qualname__ = "SearchProgress"  # the dashboard's class column, not `_progress_class.<locals>...`
    return ray.remote(num_cpus=0, max_restarts=0)(SearchProgress)


def open_progress(actor_key: str, total_trials: int | None = None, *, display_name: str | None = None):
    """The progress actor `autotune-search:<actor_key>` (created if absent); needs a connected Ray."""
    cls = _progress_class()
    return cls.options(name=progress_actor_name(actor_key), namespace=NAMESPACE, get_if_exists=True).remote(
        display_name or actor_key, total_trials
    )


class ReportingBackend:
    """Wraps a backend so each evaluation is counted by the search's progress actor (fire and forget).

    Picklable (an actor handle travels to Ray workers), so it works when trials run in remote processes.
    """

    def __init__(self, inner: Backend, progress) -> None:
        self.inner = inner
        self.progress = progress
        self.name = inner.name

    def evaluate(self, job: Job, layout: Layout) -> Measurement:
        measurement = self.inner.evaluate(job, layout)
        # Each record is a named actor task: the dashboard lists every trial by its layout and outcome.
        task_name = f"trial {layout} [{measurement.status}]"
        self.progress.record.options(name=task_name).remote(
            str(layout), measurement.status, measurement.tokens_per_s_per_gpu
        )
        return measurement

    def __getattr__(self, attribute: str):  # other backend facts (options, caches) pass through
        if attribute in ("inner", "progress", "name"):
            raise AttributeError(attribute)
        return getattr(self.inner, attribute)


def track(backend: Backend, search_name: str, total_trials: int | None = None) -> Backend:
    """`backend` wrapped in a `ReportingBackend` when this process is connected to Ray, else unchanged.

    The one call a search driver makes to be visible in the dashboard: each evaluation becomes a
    named task `trial <layout> [<status>]` and the progress actor `autotune-search:<name>` counts them.
    """
    import sys
    import uuid

    ray = sys.modules.get("ray")  # never import ray just to find out it is not running
    if ray is None or not ray.is_initialized():
        return backend
    progress = open_progress(f"{search_name}-{uuid.uuid4().hex[:6]}", total_trials, display_name=search_name)
    return ReportingBackend(backend, progress)


def track_search(job: Job, backend: str | Backend | None, headroom_bytes: float | None, trials: int, *,
                 address: str | None = None, measured_stage: bool = False):
    """The backend `run_search` would build for these arguments, tracked (see `track`) when Ray is connected.

    With `address` (an existing cluster, `"auto"` or `ray://...`) this process connects to it first, so
    the search is visible in that cluster's dashboard (`run_search` then uses the connection as is).
    Returns `backend` unchanged when no Ray runs (then `run_search` resolves it itself, as usual), and when the
    search is the analytic one (the analytic backend, no `address`, no `measured_stage`): `--dashboard` changes
    where the progress shows, never what the search does (its records go to the dashboard after, `report_result`):

        backend=dashboard.track_search(job, args.backend, headroom_bytes, args.trials, address=args.address)
    """
    import sys

    if not address and not measured_stage and isinstance(backend, str | None):
        from autotune.tuning.backends import resolve_backend_name

        if resolve_backend_name(backend) == "analytic":
            return backend

    if address:
        import ray as ray_module

        if not ray_module.is_initialized():
            from search_spaces.ray_session import connect

            connect(address, namespace=NAMESPACE, job_config=_job_config("autotune search"))
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return backend
    import importlib

    driver = importlib.import_module("autotune.tuning.driver")
    headroom = driver.default_headroom_bytes(job) if headroom_bytes is None else headroom_bytes
    inner, _ = driver._resolve_backend(backend, headroom)
    c = job.cluster
    return track(inner, f"{job.model.name} on {c.nodes}x{c.gpus_per_node} {c.gpu.name}", trials)


def report_result(result: Any) -> None:
    """An analytic search's kept records, told to a progress actor when Ray is connected (`--dashboard`): the
    dashboard shows the same search as the terminal, though no trial ran on Ray."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized() or getattr(result, "mode", "") != "analytic":
        return
    import uuid

    c = result.job.cluster
    name = f"{result.job.model.name} on {c.nodes}x{c.gpus_per_node} {c.gpu.name} (analytic)"
    progress = open_progress(f"{name}-{uuid.uuid4().hex[:6]}", len(result.records), display_name=name)
    for r in result.answer.ranked[:1] + tuple(result.records):
        m = r.measurement
        progress.record.options(name=f"trial {r.layout} [{m.status}]").remote(str(r.layout), m.status,
                                                                             m.tokens_per_s_per_gpu)


# --- CLI hook -----------------------------------------------------------------------------------
def _port(text: str) -> int:
    """argparse type: a TCP port 1..65535."""
    body = text.strip()
    if not body.isascii() or not body.isdigit() or not 1 <= int(body) <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, but got {text!r}")
    return int(body)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--dashboard` and its options, for the search verb."""
    g = parser.add_argument_group("Ray dashboard")
    g.add_argument("--dashboard", action="store_true",
                   help=f"start a local Ray with its dashboard on {DEFAULT_HOST}, print its URL, "
                        "and keep it up after the search until Enter is pressed")
    g.add_argument("--dashboard-port", type=_port, default=DEFAULT_PORT,
                   help=f"dashboard port, 1-65535 (default {DEFAULT_PORT})")
    g.add_argument("--dashboard-host", default=DEFAULT_HOST,
                   help=f"interface to bind (default {DEFAULT_HOST}; all interfaces needs --dashboard-allow-remote)")
    g.add_argument("--dashboard-allow-remote", action="store_true",
                   help="allow --dashboard-host 0.0.0.0 (the dashboard has no authentication: trusted networks only)")


@contextlib.contextmanager
def session(args: argparse.Namespace, *, out: TextIO | None = None) -> Iterator[Dashboard | None]:
    """Around a search: with `--dashboard`, start Ray + dashboard, print the URL, and on a clean exit wait for Enter.

        with dashboard.session(args):
            result = run_search(...)
    """
    if not getattr(args, "dashboard", False):
        yield None
        return
    out = out or sys.stderr  # stdout stays clean for --json
    dash = start_local(host=args.dashboard_host, port=args.dashboard_port,
                       allow_remote=getattr(args, "dashboard_allow_remote", False))
    print(f"Ray dashboard: {dash.url} (watch the search under Jobs, Actors and Tasks)", file=out, flush=True)
    if dash.token_required:
        print("It asks for Ray's token: `ray get-auth-token` prints it (~/.ray/auth_token).", file=out, flush=True)
    try:
        yield dash
        wait_for_enter(dash, out=out)
    finally:
        stop(dash)

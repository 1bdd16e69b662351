"""Ray closed to the network: during a local search every socket the run listens on is on loopback, Ray's token
authentication is on, and the token file is 0600 (issue 14; ShadowRay, CVE-2023-48022)."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from search_spaces.ray_session import check_address, ensure_token_file, is_loopback

ROOT = Path(__file__).resolve().parents[1]


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(home)}
    for key in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(key, None)  # Ray's defaults, as a user has them
    return env


def _listening(root: psutil.Process) -> list[tuple[str, str, int]]:
    """(process, ip, port) of every TCP socket listening, and every UDP socket bound, in `root`'s process tree."""
    found = []
    for p in [root, *root.children(recursive=True)]:
        try:
            name = p.name()
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and not c.raddr):
                    found.append((name, c.laddr.ip, c.laddr.port))
        except psutil.Error:
            continue
    return found


def _watch(proc: subprocess.Popen, until: Callable[[], bool], timeout_s: float) -> list[tuple[str, str, int]]:
    """Sample the sockets of the run every 0.5 s until `until()` or the run ends; every sample, together."""
    seen: set[tuple[str, str, int]] = set()
    root = psutil.Process(proc.pid)
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= set(_listening(root))
        if until():
            break
        time.sleep(0.5)
    return sorted(seen)


def _reap(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the process group this test started, nothing else
    except ProcessLookupError:
        pass


@pytest.mark.slow
def test_a_local_search_listens_on_loopback_only_with_token_auth(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    args = ["--model", "tiny-gpt", "--nodes", "1", "--gpus-per-node", "2", "--seq-length", "1024",
            "--global-batch-size", "16", "--trials", "40", "--exhaustive-threshold", "0", "--measured-stage",
            "--no-progress",
            "--output", "run"]
    proc = subprocess.Popen([sys.executable, "-m", "autotune", *args], cwd=tmp_path, env=_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    csv_path = tmp_path / "run" / "trials.csv"
    try:
        sockets = _watch(proc, lambda: csv_path.exists() and len(csv_path.read_text().splitlines()) > 20, 240)
        out, err = proc.communicate(timeout=240)
    finally:
        _reap(proc)
    assert proc.returncode == 0, err[-2000:]
    assert len(sockets) >= 5, sockets  # GCS, raylet, object manager, workers, agents were all seen
    exposed = [s for s in sockets if not is_loopback(s[1])]
    assert not exposed, f"listening beyond loopback: {exposed}"
    token = home / ".ray" / "auth_token"
    assert token.exists() and stat.S_IMODE(token.stat().st_mode) == 0o600  # Ray's token auth was on


@pytest.mark.slow
def test_a_megatron_job_rendezvous_listens_on_loopback_only(tmp_path):
    # two CPU-proxy ranks on gloo: torch's TCPStore and gloo's pair sockets join Ray's on loopback
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "smoke", "--layout", "tp=2", "--iterations", "2"],
                            cwd=tmp_path, env=_env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        sockets = _watch(proc, lambda: False, 400)
        out, err = proc.communicate(timeout=400)
    finally:
        _reap(proc)
    assert proc.returncode == 0, (out + err)[-2000:]
    assert any("MegatronWorker" in name for name, _, _ in sockets), sockets  # the ranks' own sockets were seen
    exposed = [s for s in sockets if not is_loopback(s[1])]
    assert not exposed, f"listening beyond loopback: {exposed}"


@pytest.mark.parametrize("ip,loop", [("127.0.0.1", True), ("127.3.2.1", True), ("::1", True),
                                     ("::ffff:127.0.0.1", True), ("0.0.0.0", False), ("::", False),
                                     ("192.0.2.2", False), ("not-an-ip", False)])
def test_is_loopback(ip, loop):
    assert is_loopback(ip) is loop


@pytest.mark.parametrize("address,parsed", [("auto", ("auto", "", None)), ("10.0.0.5:6379", ("gcs", "10.0.0.5", 6379)),
                                            ("ray://head:10001", ("ray", "head", 10001)),
                                            ("[::1]:6379", ("gcs", "::1", 6379))])
def test_addresses_are_read(address, parsed):
    assert check_address(address) == parsed


@pytest.mark.parametrize("address", ["ray://nohost:xx", "head", "http://head:1", "head:0", "head:70000", "head:\uff11"])
def test_bad_addresses_are_refused(address):
    with pytest.raises(ValueError, match="address"):
        check_address(address)


def test_the_token_file_is_made_0600_and_an_open_one_tightened(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)
    path = ensure_token_file()
    assert path is not None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_text()) == 64
    path.chmod(0o644)
    token = path.read_text()
    ensure_token_file()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == token  # tightened, not replaced

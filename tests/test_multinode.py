"""A real multi-node Ray run: two raylets (separate `ray start` processes on loopback, 2 CPUs and 2 fake GPUs
each), a megatron-backend trial whose 4 workers a placement group spreads over both nodes, and analytic trials
on both nodes too. Only the processes this test started are stopped (never `ray stop`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # this interpreter's Ray CLI
# `ray start --address 127.0.0.1:P` for a worker node: Ray's CLI rewrites a loopback address to the machine's
# routable IP (`services.resolve_ip_for_localhost`) and refuses worker nodes in its single-host mode, so this
# launcher keeps loopback addresses as they are; the node then takes 127.0.0.1 from the head's address and
# listens on loopback only. Test scaffolding for a two-raylet cluster on one machine, nothing more.
RAY_WORKER_NODE = [sys.executable, "-c", (
    "import sys, ray._private.services as s\n"
    "from search_spaces.ray_session import is_loopback\n"
    "resolve = s.resolve_ip_for_localhost\n"
    "s.resolve_ip_for_localhost = lambda host: host if is_loopback(host) else resolve(host)\n"
    "from ray.scripts.scripts import main\n"
    "sys.argv = ['ray', *sys.argv[1:]]\n"
    "main()\n")]
NODE = ["--num-cpus", "2", "--resources", '{"fake_gpu": 2}', "--disable-usage-stats", "--block"]

DRIVER = """
import json, sys
from autotune.tuning.driver import run_search
from autotune.tuning.measured import Predicted
from autotune.ui.api import make_job
from trainers.backend import MegatronBackend

address, out = sys.argv[1], sys.argv[2]
import time, ray
from search_spaces.ray_session import connect
connect(address)
deadline = time.monotonic() + 120
while sum(n["Alive"] for n in ray.nodes()) < 2 and time.monotonic() < deadline:
    time.sleep(1)
assert sum(n["Alive"] for n in ray.nodes()) == 2, ray.nodes()
ray.shutdown()
job = make_job("tiny-gpt", nodes=2, gpus_per_node=2, seq_length=64, global_batch_size=8)
backend = Predicted(MegatronBackend(worker_resources=(("fake_gpu", 1.0),), precision="fp32", timed_steps=1,
                                    timeout_s=240))
megatron = run_search(job, trials=1, backend=backend, compare=["tp=2,pp=2"], use_seeds=False, exhaustive_threshold=0,
                      address=address, output_dir=out + "/megatron", progress=False)
analytic = run_search(job, trials=24, backend="analytic", exhaustive_threshold=0, address=address,
                      output_dir=out + "/analytic", progress=False)
m = megatron.records[0].measurement
print(json.dumps({"status": m.status, "reason": m.reason, "layout": str(m.layout),
                  "worker_nodes": m.extra.get("worker_nodes"), "analytic_nodes": [r.node for r in analytic.records],
                  "analytic_concurrent": analytic.stats.get("max_concurrent")}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_env(tmp_path: Path) -> dict[str, str]:
    token = tmp_path / "auth_token"
    if not token.exists():
        fd = os.open(token, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, os.urandom(32).hex().encode())
        os.close(fd)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
           "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    return env


def _start(command: list[str], args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen([*command, "start", *args], env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each `ray start --block` (it stops the node it started), then kill whatever of their trees is left."""
    trees = []
    for proc in procs:
        try:
            trees.append([proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)])
        except psutil.Error:
            trees.append([proc.pid])
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    for pid in (pid for tree in trees for pid in tree):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    pytest.fail(f"the Ray head did not come up: {log.read_text()[-2000:]}")


def test_two_raylets_share_the_trials_and_one_megatron_job(tmp_path):
    temp_dir = tempfile.mkdtemp(prefix="rt-", dir="/tmp")  # Ray's socket paths must stay under 107 bytes
    env = _ray_env(tmp_path)
    port = _free_port()
    address = f"127.0.0.1:{port}"
    head_env = {**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # Ray keeps the head on 127.0.0.1
    procs = [_start(RAY, ["--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                          "--include-dashboard=false", "--temp-dir", temp_dir, *NODE], head_env, tmp_path / "head.log")]
    try:
        _wait_for_port(port, procs[0], tmp_path / "head.log")
        procs.append(_start(RAY_WORKER_NODE, ["--address", address, *NODE], env, tmp_path / "worker.log"))
        run = subprocess.run([sys.executable, "-c", DRIVER, address, str(tmp_path)], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=600)
    finally:
        _stop(procs)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["status"] == "ok", got
    assert len(got["worker_nodes"]) == 4 and len(set(got["worker_nodes"])) == 2, got  # 2 + 2 ranks: both nodes
    assert got["analytic_concurrent"] == 4  # one trial per CPU of the cluster
    assert len(got["analytic_nodes"]) == 24 and len(set(got["analytic_nodes"]) - {""}) == 2, got

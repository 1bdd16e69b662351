"""`python -m autotune [search]` end to end: the README command, --json, an impossible request,
SIGKILL then --resume, Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.ui.cli import main
from search_spaces.gpus import get_gpu

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SMALL_ARGS = ["--model", "tiny-gpt", "--nodes", "1", "--gpus-per-node", "2", "--seq-length", "1024",
              "--global-batch-size", "16"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    return env


def _cli(args: list[str], tmp_path: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "autotune", *args], cwd=tmp_path, env=_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs)


def _reap(proc: subprocess.Popen) -> None:
    """Kill what is left of the process group this test started (a SIGKILLed driver leaves Ray behind)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_readme_command_end_to_end(tmp_path):
    proc = _cli(["--model", "mixtral", "--nodes", "4", "--output", "run"], tmp_path)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        _reap(proc)
    assert proc.returncode == 0, err[-2000:]
    assert "Best layouts" in out and "Pareto front" in out, out[-2000:]
    assert "model.tensor_model_parallel_size=" in out and "--tensor-model-parallel-size" in out
    bridge_line = next(line for line in out.splitlines() if line.startswith("model.tensor_model_parallel_size="))
    assert "mixed_precision=" in bridge_line  # the overrides stay on one line, ready to paste
    # Ray's own logs stay out without --verbose
    assert "(pid=" not in out + err and "INFO" not in err, err[-2000:]
    best = json.loads((tmp_path / "run" / "best.json").read_text())
    assert best["launch"]["megatron_lm"].startswith("--tensor-model-parallel-size")


def test_json_output_is_one_object_with_best_pareto_and_trials(tmp_path, capsys, ray_session):
    rc = main([*SMALL_ARGS, "--trials", "12", "--exhaustive-threshold", "0", "--json", "--output", str(tmp_path / "r")])
    payload = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert payload["best"]["layout"]["tensor_model_parallel_size"] >= 1
    assert set(payload["best"]["launch"]) == {"megatron_bridge", "megatron_lm"}
    # kept: the ranked top 12 and the exact Pareto front of the space (docs/search.md), each once; the front
    # shown compares predicted peaks at the memory model's resolution, so it is a part of that
    fit = [t for t in payload["trials"] if t["feasible"]]
    exact = [t for t in fit if not any(o["tokens_per_s_per_gpu"] > t["tokens_per_s_per_gpu"]
                                       and o["memory_gib"] <= t["memory_gib"] for o in fit)]
    assert payload["pareto"] and 12 <= len(payload["trials"]) <= 12 + len(exact)
    assert len(payload["pareto"]) <= len(exact)
    texts = {t["layout_text"] for t in payload["trials"]}
    assert len(texts) == len(payload["trials"]) and {p["layout_text"] for p in payload["pareto"]} <= texts
    assert payload["decision"]["pick"] == payload["best"]["layout_text"]


def test_resume_alone_reads_the_job_from_the_folder(tmp_path, capsys, ray_session):
    folder = str(tmp_path / "r")
    assert main([*SMALL_ARGS, "--trials", "6", "--exhaustive-threshold", "0", "--json", "--output", folder]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(["--resume", folder, "--json"]) == 0  # no --model: the job comes from search.json
    again = json.loads(capsys.readouterr().out)
    assert again["best"]["layout"] == first["best"]["layout"] and len(again["trials"]) == len(first["trials"]) >= 6


def test_search_without_model_or_resume_is_exit_2(capsys):
    assert main(["--nodes", "4"]) == 2
    assert "--model is required" in capsys.readouterr().err


def test_impossible_request_exits_1_and_names_the_closest_layouts(tmp_path, capsys, ray_session):
    # leave 1 MiB usable on each GPU: nothing fits
    headroom_gib = get_gpu("h100").memory_gib - 1 / 1024
    rc = main([*SMALL_ARGS, "--trials", "6", "--exhaustive-threshold", "0", "--headroom-gib", str(headroom_gib),
               "--output", str(tmp_path / "r"), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "No layout fits" in out and "GiB over" in out and "Try:" in out


def test_bad_trial_budget_is_exit_2(tmp_path, capsys):
    assert main([*SMALL_ARGS, "--trials", "0", "--output", str(tmp_path / "r")]) == 2
    assert "--trials must be at least 1" in capsys.readouterr().err


def _wait_for_rows(csv_path: Path, rows: int, proc: subprocess.Popen[str], timeout_s: float = 180) -> None:
    assert proc.stderr is not None  # started with stderr=PIPE
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if csv_path.exists() and len(csv_path.read_text().splitlines()) > rows:
            return
        if proc.poll() is not None:
            pytest.fail(f"the search ended before {rows} trials: {proc.stderr.read()[-2000:]}")
        time.sleep(0.2)
    pytest.fail(f"no {rows} trials within {timeout_s} s")


def test_sigkill_then_resume_finishes_without_rerunning(tmp_path):
    args = [*SMALL_ARGS, "--trials", "40", "--exhaustive-threshold", "0", "--measured-stage", "--output", "run"]
    proc = _cli(args, tmp_path)
    csv_path = tmp_path / "run" / "trials.csv"
    try:
        _wait_for_rows(csv_path, 5, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        _reap(proc)
    before = csv_path.read_text().splitlines()
    assert 5 < len(before) <= 41
    again = _cli([*SMALL_ARGS, "--resume", "run", "--json"], tmp_path)
    try:
        out, err = again.communicate(timeout=240)
    finally:
        _reap(again)
    assert again.returncode == 0, err[-2000:]
    after = csv_path.read_text().splitlines()
    assert after[:len(before)] == before  # finished trials kept, not rerun
    layouts = [json.dumps(t["layout"], sort_keys=True) for t in json.loads(out)["trials"]]
    assert len(layouts) == 40 and len(set(layouts)) == 40


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_keeps_what_finished_and_prints_the_resume_command(tmp_path, sig, code):
    proc = _cli([*SMALL_ARGS, "--trials", "150", "--exhaustive-threshold", "0", "--measured-stage", "--output", "run"],
                tmp_path)
    csv_path = tmp_path / "run" / "trials.csv"
    try:
        _wait_for_rows(csv_path, 5, proc)
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
    finally:
        _reap(proc)
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err and "--resume run" in err
    meta = json.loads((tmp_path / "run" / "search.json").read_text())
    assert meta["completed"] is False
    assert len(csv_path.read_text().splitlines()) - 1 == meta["finished_trials"] >= 5


def test_megatron_backend_ranks_real_cpu_proxy_trials_beside_the_prediction(tmp_path):
    # the command, with a smaller budget: real megatron-core jobs on gloo workers
    args = ["--model", "tiny-gpt", "--nodes", "1", "--gpus-per-node", "4", "--backend", "megatron", "--trials", "2",
            "--exhaustive-threshold", "0", "--json", "--output", "run"]
    proc = _cli(args, tmp_path)
    try:
        out, err = proc.communicate(timeout=400)
    finally:
        _reap(proc)
    assert proc.returncode == 0, err[-2000:]
    trials = json.loads(out)["trials"]
    assert len(trials) == 2
    for t in trials:
        assert t["source"] == "megatron-cpu-proxy" and t["status"] == "ok", t
        assert t["tokens_per_s_per_gpu"] > 0 and t["memory_gib"] > 0  # measured on the proxy
        assert t["predicted"]["tokens_per_s_per_gpu"] > 0  # the analytic model's figure for the real model
    # proxy timings are not GPU times: no calibration.yaml, and the search says why
    learned = json.loads((tmp_path / "run" / "search.json").read_text())["stats"]["measured_calibration"]
    assert learned["file"] is None and "CPU proxy" in learned["reason"]
    assert not (tmp_path / "run" / "calibration.yaml").exists()




def test_a_second_search_on_the_same_folder_is_refused_and_mixes_nothing(tmp_path):
    first = _cli([*SMALL_ARGS, "--trials", "60", "--exhaustive-threshold", "0", "--measured-stage", "--output", "run"],
                 tmp_path)
    csv_path = tmp_path / "run" / "trials.csv"
    try:
        _wait_for_rows(csv_path, 2, first)
        second = subprocess.run([sys.executable, "-m", "autotune", "--model", "llama3-8b", "--trials", "4",
                                 "--output", "run"], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                                timeout=120)
        resumed = subprocess.run([sys.executable, "-m", "autotune", "--resume", "run"], cwd=tmp_path,
                                 env=_env(tmp_path), capture_output=True, text=True, timeout=120)
        out, err = first.communicate(timeout=240)
    finally:
        _reap(first)
    assert second.returncode == 2 and len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert "not empty" in second.stderr or "in use by another search" in second.stderr
    assert resumed.returncode == 2 and "in use by another search" in resumed.stderr, resumed.stderr
    assert first.returncode == 0, err[-2000:]
    rows = csv_path.read_text().splitlines()[1:]
    assert len(rows) == 60 and len({r.split(",")[1] for r in rows}) == 1  # 60 rows, all of one job
    assert [int(r.split(",")[0]) for r in rows] == list(range(60))


def test_force_moves_the_old_folder_aside(tmp_path, capsys):
    """The folder checks come before any search: the analytic search (no Ray) shows them as a measured one would."""
    folder = str(tmp_path / "r")
    assert main([*SMALL_ARGS, "--trials", "4", "--json", "--output", folder]) == 0
    assert main([*SMALL_ARGS, "--trials", "4", "--json", "--output", folder]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert main([*SMALL_ARGS, "--trials", "4", "--json", "--output", folder, "--force"]) == 0
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("r.old-")]
    assert len(aside) == 1 and (aside[0] / "best.json").exists() and (tmp_path / "r" / "best.json").exists()

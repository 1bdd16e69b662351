"""Bad input at the command line: one line on stderr, a non-zero exit (2 unless said), never a traceback or a hang,
and an earlier result folder left byte for byte as it was (issue 14's cases, one row each)."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--model", "tiny-gpt", "--nodes", "1", "--gpus-per-node", "2", "--seq-length", "1024",
         "--global-batch-size", "16"]
EARLIER = "earlier"  # a finished-looking result folder every case may name; it must not change


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    env.pop("AUTOTUNE_DEBUG", None)
    return env


def _earlier_folder(root: Path) -> Path:
    """search.json, trials.csv and best.json as an earlier search left them (contents need not be real)."""
    folder = root / EARLIER
    folder.mkdir()
    (folder / "search.json").write_text('{"fingerprint": "0123456789abcdef", "mode": "search"}\n')  # no `job`
    (folder / "trials.csv").write_text("number,job,origin\n0,0123456789abcdef,seed\n")
    (folder / "best.json").write_text("null\n")
    return folder


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _write(root: Path, name: str, text: str) -> str:
    (root / name).write_text(text)
    return name


YAML_BAD = {
    "inf_memory": "gpu: {name: g, memory_bytes: .inf, bf16_flops: 1.0e15, fp8_flops: null, hbm_bytes_per_s: 3.0e12, "
                  "arch: hopper}\nintra_node: nvlink4\n",
    "zero_flops": "gpu: {name: g, memory_bytes: 85899345920, bf16_flops: 0, fp8_flops: null, hbm_bytes_per_s: 3.0e12}"
                  "\nintra_node: nvlink4\n",
    "zero_bandwidth": "inter_node: {name: slow, bandwidth_bytes_per_s: 0, latency_s: 1.0e-5}\n",
    "nan_latency": "inter_node: {name: slow, bandwidth_bytes_per_s: 1.0e9, latency_s: .nan}\n",
    "string_nodes": "nodes: '4'\n",
    "list_gpu": "gpu: [h100]\n",
    "not_mapping": "- 1\n- 2\n",
    "bad_yaml": "nodes: [1,\n",
    "bool_flops": "gpu: {name: g, memory_bytes: 85899345920, bf16_flops: true, fp8_flops: null, hbm_bytes_per_s: 3e12}"
                  "\nintra_node: nvlink4\n",
    "fraction_memory": "gpu: {name: g, memory_bytes: 1.5, bf16_flops: 1e15, fp8_flops: null, hbm_bytes_per_s: 3e12}"
                       "\nintra_node: nvlink4\n",
}

# (id, argv, expected exit code); "{yaml:NAME}" is a cluster file, "{file}" an ordinary file
CASES = [
    *[(f"yaml-{name}", ["space", "--model", "tiny-gpt", "--cluster", f"{{yaml:{name}}}"], 2) for name in YAML_BAD],
    ("layout-fullwidth-digit", ["check", *SMALL, "--layout", "tp=\uff12"], 2),  # tp=２
    ("layout-underscore-digit", ["check", *SMALL, "--layout", "tp=0_2"], 2),
    ("layout-plus", ["estimate", *SMALL, "--layout", "tp=+2"], 2),
    ("layout-empty", ["check", *SMALL, "--layout", ""], 2),
    ("layout-empty-search", [*SMALL, "--layout", "", "--output", "new"], 2),
    ("layout-comma-only", ["estimate", *SMALL, "--layout", ","], 2),
    ("layout-huge", ["check", *SMALL, "--layout", "tp=99999999999999999999"], 2),
    ("layout-zero", ["check", *SMALL, "--layout", "tp=0"], 2),
    ("layout-unknown-field", ["check", *SMALL, "--layout", "zz=2"], 2),
    ("space-huge-nodes", ["space", "--model", "mixtral", "--nodes", "100000000000"], 2),
    ("search-huge-nodes", ["--model", "mixtral", "--nodes", "100000000000", "--output", "new"], 2),
    ("nodes-zero", ["space", "--model", "mixtral", "--nodes", "0"], 2),
    ("nodes-fullwidth", ["space", "--model", "mixtral", "--nodes", "\uff14"], 2),
    ("gpus-per-node-huge", ["space", "--model", "mixtral", "--gpus-per-node", "100000"], 2),
    ("seq-length-negative", ["space", "--model", "mixtral", "--seq-length", "-5"], 2),
    ("output-under-a-file", [*SMALL, "--output", "{file}/sub"], 2),
    ("output-is-a-file", [*SMALL, "--output", "{file}"], 2),
    ("output-not-empty", [*SMALL, "--output", EARLIER], 2),
    ("resume-without-job", ["--resume", EARLIER], 2),
    ("resume-missing", ["--resume", "nowhere"], 2),
    ("resume-and-output", [*SMALL, "--resume", EARLIER, "--output", "x"], 2),
    ("address-bad-port", [*SMALL, "--address", "ray://nohost:xx", "--output", "new"], 2),
    ("address-unreachable", [*SMALL, "--address", "127.0.0.1:1", "--output", "new"], 2),
    ("address-unknown-scheme", [*SMALL, "--address", "http://x:1", "--output", "new"], 2),
    ("dashboard-port", [*SMALL, "--dashboard", "--dashboard-port", "70000", "--output", "new"], 2),
    ("exhaustive-threshold-negative", [*SMALL, "--exhaustive-threshold", "-1", "--output", "new"], 2),
    ("trials-zero", [*SMALL, "--trials", "0", "--output", "new"], 2),
    ("seed-negative", [*SMALL, "--seed", "-1", "--output", "new"], 2),
    ("seed-over-2**32", [*SMALL, "--seed", str(2**32), "--output", "new"], 2),  # numpy's seeds end at 2**32 - 1
    ("headroom-nan", [*SMALL, "--headroom-gib", "nan", "--output", "new"], 2),
    ("headroom-negative", ["estimate", *SMALL, "--layout", "tp=1", "--headroom-gib", "-1"], 2),
    ("unknown-model", ["space", "--model", "no-such-model"], 2),
    ("unknown-gpu", ["space", "--model", "mixtral", "--gpu", "z80"], 2),
    ("unknown-flag", ["space", "--model", "mixtral", "--frobnicate"], 2),
    ("config-not-json", ["space", "--model", "{file}"], 2),
    ("space-negative-sample", ["space", "--model", "mixtral", "--sample", "-1"], 2),
    # issue 46: accepted silently before
    ("fp8-recipe-at-bf16", [*SMALL, "--precision", "bf16", "--fp8-recipe", "mxfp8", "--output", "new"], 2),
    ("fp8-recipe-default-bf16", ["estimate", *SMALL, "--layout", "tp=1", "--fp8-recipe", "tensorwise"], 2),
    ("what-if-with-output", ["--model", "mixtral", "--nodes", "4,8", "--output", "new"], 2),
    ("flag-prefix", ["estimate", *SMALL, "--layout", "tp=1", "--gpus", "8"], 2),  # not --gpus-per-node
]


def _expand(argv: list[str], root: Path) -> list[str]:
    out = []
    for arg in argv:
        for name, text in YAML_BAD.items():
            arg = arg.replace(f"{{yaml:{name}}}", _write(root, f"{name}.yaml", text))
        out.append(arg.replace("{file}", "plain.txt"))
    return out


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "plain.txt").write_text("not a folder, not JSON\n")
    _earlier_folder(tmp_path)
    return tmp_path


@pytest.mark.parametrize("argv,code", [pytest.param(a, c, id=i) for i, a, c in CASES])
def test_bad_input_is_one_line_and_a_non_zero_exit(workdir: Path, argv: list[str], code: int) -> None:
    before = _snapshot(workdir / EARLIER)
    proc = subprocess.run([sys.executable, "-m", "autotune", *_expand(argv, workdir)], cwd=workdir, env=_env(),
                          capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1 and "error" in lines[0], proc.stderr[-2000:]
    assert _snapshot(workdir / EARLIER) == before  # the earlier folder is untouched
    assert not (workdir / "new").exists()  # nothing was created for a refused search


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    # `space --json | head -1`: the reader leaves after one line
    proc = subprocess.run(f"{sys.executable} -m autotune space --model mixtral --nodes 4 --json | head -1",
                          shell=True, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.stdout.count("\n") == 1 and proc.stdout.startswith("{")
    assert proc.stderr == ""


def test_no_valid_layout_at_all_is_exit_1_with_the_rules_that_ruled_them_out(tmp_path: Path) -> None:
    # deepseek-v3 on 1250 nodes x 8 = 10,000 GPUs: no layout divides it (used to be KeyError: 'status')
    proc = subprocess.run([sys.executable, "-m", "autotune", "--model", "deepseek-v3", "--nodes", "1250",
                           "--output", "run", "--no-progress"], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "no valid layout exists" in proc.stdout.lower()
    assert (tmp_path / "run" / "best.json").read_text() == "null\n"


@pytest.mark.parametrize("err", [errno.EROFS, errno.EACCES])
def test_a_folder_that_cannot_be_created_is_one_line(tmp_path: Path, monkeypatch, err: int) -> None:
    # a read-only mount or a folder without write permission (chmod does not stop root, so the error is injected)
    from autotune.tuning.run_folder import make_folder

    def refuse(self, *args, **kwargs):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(ValueError, match=f"cannot create .*run: {os.strerror(err)}"):
        make_folder(tmp_path / "run")


def test_the_gpu_help_and_the_blackwell_messages_name_every_catalog_gpu(capsys) -> None:
    # issue 46: `--gpu` help and the mxfp8 message left out B300 and GB300
    from autotune.ui.cli import main
    from search_spaces.gpus import list_gpus

    assert main(["search", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert all(g.name in text for g in list_gpus()), text
    code = main(["estimate", *SMALL, "--layout", "tp=1", "--precision", "fp8", "--fp8-recipe", "mxfp8"])
    err = capsys.readouterr().err
    blackwell = [g.name.upper() for g in list_gpus() if g.arch == "blackwell"]
    assert code == 2 and all(name in err for name in blackwell) and "GB300" in blackwell, err

"""The whole repository passes `ruff check` and `mypy` as pyproject.toml configures them ([tool.ruff],
[tool.mypy]). Both run from the test environment's own bin folder (the test extras install them), so the
versions are the ones pyproject.toml asks for; a failure prints what the tool printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(tool: str, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / tool
    assert exe.exists(), f"{exe} is missing; install the test extras (bash scripts/bootstrap --test)"
    return subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def test_ruff_check_is_clean() -> None:
    out = _run("ruff", "check", "--no-fix", "--output-format", "concise", ".", timeout_s=120)
    assert out.returncode == 0, f"ruff check found problems:\n{out.stdout}{out.stderr}"


@pytest.mark.slow  # about a minute: mypy checks every module of pyproject's [tool.mypy] files
def test_mypy_is_clean() -> None:
    out = _run("mypy", timeout_s=900)
    assert out.returncode == 0, f"mypy found problems:\n{out.stdout}{out.stderr}"

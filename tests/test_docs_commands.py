"""Every `python -m autotune ...` command in README.md and docs/*.md runs as written and exits as documented.

Collected: each line of a fenced ```bash block that contains `python -m autotune`, and each inline code span of
a whole command (`python -m autotune ... --option ...`, no placeholder such as `M`, `N` or `...`). A command
exits 0 unless its line documents another code (`# exits 1`). Each runs in a fresh folder, as `bash -c`, with
this interpreter for `python`. `check`, `estimate` and `space` are fast and run in the normal suite; a search or
a smoke job starts Ray or megatron-core and is marked slow. A command that needs something this machine cannot
give (an existing Ray cluster) is listed in NOT_RUN with the reason.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FAST_VERBS = {"check", "estimate", "space", "help"}
NOT_RUN = {"--address auto": "joins an existing Ray cluster (run on its head node)"}
_EXIT = re.compile(r"#\s*exits?\s+(\d+)")
_PLACEHOLDER = re.compile(r"\.\.\.|\[|\b[A-Z]{1,4}\b")  # `...`, `[options]`, `M`, `N`, `VERB`


def _commands() -> list[tuple[str, str, int]]:
    """(where, command, documented exit code) for every command in the docs."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for block in re.findall(r"```bash\n(.*?)```", text, re.S):
            for line in block.splitlines():
                if "python -m autotune" in line:
                    found.append((path.name, line))
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for line in prose.splitlines():
            for span in re.findall(r"`([^`]*python -m autotune[^`]*)`", line):
                if "--" in span and not _PLACEHOLDER.search(span.split("python -m autotune", 1)[1]):
                    found.append((path.name, span + (f"  # exits {m.group(1)}" if (m := _EXIT.search(line)) else "")))
    out, seen = [], set()
    for where, line in found:
        code = int(m.group(1)) if (m := _EXIT.search(line)) else 0
        command = "python -m autotune" + line.split("python -m autotune", 1)[1].split("#", 1)[0].rstrip()
        if command not in seen:  # the same command in two places runs once
            seen.add(command)
            out.append((where, command, code))
    return out


COMMANDS = _commands()


def _verb(command: str) -> str:
    words = command.split()[3:]
    if "--help" in words or "-h" in words:
        return "help"
    return words[0] if words and not words[0].startswith("-") else "search"


def _params(fast: bool) -> list:
    chosen = [c for c in COMMANDS if (_verb(c[1]) in FAST_VERBS) is fast and not _excluded(c[1])]
    return [pytest.param(*c, id=f"{c[0]}: {c[1][len('python -m autotune '):]}"[:90]) for c in chosen]


def _excluded(command: str) -> str | None:
    return next((why for key, why in NOT_RUN.items() if key in command), None)


def _run(command: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    shell = command.replace("python -m autotune", f"{sys.executable} -m autotune", 1)
    return subprocess.run(["bash", "-c", shell], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900, stdin=subprocess.DEVNULL)


def test_the_docs_have_commands_of_every_verb():
    verbs = {_verb(c) for _, c, _ in COMMANDS}
    assert {"search", "space", "check", "estimate", "smoke"} <= verbs
    assert all(_excluded(c) for _, c, _ in COMMANDS if _excluded(c))  # each left out with its reason


@pytest.mark.parametrize("where, command, code", _params(fast=True))
def test_fast_command_exits_as_documented(where, command, code, tmp_path):
    done = _run(command, tmp_path)
    assert done.returncode == code, f"{where}: {command}\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}"


@pytest.mark.slow
@pytest.mark.parametrize("where, command, code", _params(fast=False))
def test_slow_command_exits_as_documented(where, command, code, tmp_path):
    done = _run(command, tmp_path)
    assert done.returncode == code, f"{where}: {command}\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}"

"""Run a function of `tests/megatron_build.py` in the Python interpreter of a given megatron-core release.

    result = megatron_runner.run("megatron_decisions", cases, version="0.16.1")
    pending = megatron_runner.start("megatron_decisions", cases, version="0.19.2")  # several at once
    result = pending.result()

The arguments are pickled into a file, a child process of the interpreter (`python_for(version)`: this one when
its megatron-core is that release, else the project's `.venv-mcore-<version>` or `.venv`) runs this file as a
script, which imports `megatron_build`, checks that its megatron-core is the release asked for, calls the function
and pickles the result back (protocol 4, readable by Python 3.11 and 3.12). The child imports only
search_spaces, trainers.cpu_patches, megatron and torch (no pytest), so the megatron-core 0.16.1 interpreter
(Python 3.11, no test extras) runs it. A child that fails, or runs past `timeout`, raises `MegatronRunError`
with the tail of its stderr; megatron's CPU patches never enter the caller's process.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# the interpreters the project's bootstrap creates (scripts/bootstrap), by rule set
INTERPRETERS = {"0.16.1": ROOT / ".venv-mcore-0.16.1" / "bin" / "python", "0.19.2": ROOT / ".venv" / "bin" / "python"}
_PROTOCOL = 4
_STDERR_TAIL = 4000

__all__ = ["MegatronRunError", "Pending", "python_for", "start", "run", "INTERPRETERS"]


class MegatronRunError(RuntimeError):
    """The child failed, timed out or returned a different megatron-core than asked for."""


def python_for(version: str) -> Path | None:
    """The interpreter whose megatron-core is release `version` ("0.16.1" or "0.19.2"): this one when its installed
    megatron-core falls under that rule set, else the bootstrap's; None when there is none."""
    from search_spaces.megatron_version import installed_version, rule_set_for

    installed = installed_version()
    if installed is not None and rule_set_for(installed) == rule_set_for(version):
        return Path(sys.executable)
    path = INTERPRETERS.get(rule_set_for(version))
    return path if path is not None and path.exists() else None


@dataclass
class Pending:
    """A running child; `result()` waits for it (up to the timeout given to `start`)."""

    function: str
    version: str | None
    python: Path
    process: subprocess.Popen[bytes]
    folder: tempfile.TemporaryDirectory[str]
    deadline: float

    def _path(self, name: str) -> Path:
        return Path(self.folder.name) / name

    def _stderr_tail(self) -> str:
        path = self._path("stderr")
        text = path.read_text(errors="replace") if path.exists() else ""
        return text[-_STDERR_TAIL:]

    def cancel(self) -> None:
        """Kill the child if it still runs and drop its files (after `result`, a no-op)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.folder.cleanup()

    def result(self) -> Any:
        try:
            try:
                code = self.process.wait(timeout=max(0.0, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise MegatronRunError(f"megatron_build.{self.function} in {self.python} (megatron-core "
                                       f"{self.version}) ran past its timeout; its stderr ends:\n"
                                       f"{self._stderr_tail()}") from None
            if code != 0 or not self._path("result").exists():
                raise MegatronRunError(f"megatron_build.{self.function} in {self.python} (megatron-core "
                                       f"{self.version}) exited with {code}; its stderr ends:\n{self._stderr_tail()}")
            with self._path("result").open("rb") as f:
                return pickle.load(f)
        finally:
            self.folder.cleanup()


def start(function: str, *args: Any, version: str | None = None, python: str | Path | None = None,
          timeout: float = 600, **kwargs: Any) -> Pending:
    """Start `megatron_build.<function>(*args, **kwargs)` in a child of `python` (default `python_for(version)`,
    or this interpreter without a version). With `version`, the child refuses to run on another megatron-core."""
    if python is None:
        python = python_for(version) if version is not None else Path(sys.executable)
        if python is None:
            raise MegatronRunError(f"no Python interpreter with megatron-core {version} (expected "
                                   f"{INTERPRETERS.get(version or '', 'one')}; scripts/bootstrap creates it)")
    folder = tempfile.TemporaryDirectory(prefix="megatron-run-")
    call = Path(folder.name) / "call"
    with call.open("wb") as f:
        pickle.dump((function, args, kwargs, version), f, protocol=_PROTOCOL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]), "PYTHONDONTWRITEBYTECODE": "1"}
    with (Path(folder.name) / "stdout").open("wb") as out, (Path(folder.name) / "stderr").open("wb") as err:
        process = subprocess.Popen([str(python), str(Path(__file__)), folder.name], stdout=out, stderr=err,
                                   stdin=subprocess.DEVNULL, cwd=ROOT, env=env)
    return Pending(function=function, version=version, python=Path(python), process=process, folder=folder,
                   deadline=time.monotonic() + timeout)


def run(function: str, *args: Any, version: str | None = None, python: str | Path | None = None,
        timeout: float = 600, **kwargs: Any) -> Any:
    """`start(...).result()`."""
    return start(function, *args, version=version, python=python, timeout=timeout, **kwargs).result()


def _child(folder: Path) -> None:
    """In the child: call the function named in `folder/call`, write its pickled result to `folder/result`."""
    with (folder / "call").open("rb") as f:
        function, args, kwargs, version = pickle.load(f)
    from search_spaces.megatron_version import rule_set_for

    import megatron_build

    found = megatron_build.megatron_version()
    if version is not None and rule_set_for(found) != rule_set_for(version):
        raise SystemExit(f"megatron-core {found} in {sys.executable}, but {version} was asked for")
    result = getattr(megatron_build, function)(*args, **kwargs)
    partial = folder / "result.partial"
    with partial.open("wb") as f:
        pickle.dump(result, f, protocol=_PROTOCOL)
    partial.replace(folder / "result")


def exit_without_teardown() -> None:
    """End a megatron-core child whose answer is out, skipping the interpreter's teardown, where a live gloo
    group's threads can abort the process ("terminate called without an active exception", exit -6, seen once
    in CI)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
    exit_without_teardown()

"""One call run in a forked child process while this one goes on: the second core of a laptop or CI machine.

    child = start_forked(lambda: work(a, b))  # None where forking is unsafe: run it here instead
    ...                                       # this process's own share (on failure: child.cancel())
    result = child.result()                   # the child's return value, or its exception raised here

The child shares this process's memory as it was at the fork (nothing is pickled on the way in) and sends its
result back pickled through a pipe. Forking is used only where it is safe (`can_fork`): POSIX, Ray not started,
and no thread but daemons (a terminal status line's refresher); the child prints nothing (fresh streams on
/dev/null, logging off), so no lock another thread held at the fork is ever taken there, and it leaves with
`os._exit`, running none of the parent's exit handlers. Ctrl-C while waiting stops the child too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Forked", "can_fork", "start_forked"]

T = TypeVar("T")


def can_fork() -> bool:
    """Whether a forked child may run Python code safely: POSIX, Ray not started, no other thread but daemons."""
    ray = sys.modules.get("ray")
    if not hasattr(os, "fork") or (ray is not None and getattr(ray, "is_initialized", lambda: False)()):
        return False
    return all(t.daemon for t in threading.enumerate() if t is not threading.current_thread())


class Forked(Generic[T]):
    """A call running in a forked child: `result()` waits for it (and re-raises its exception), `cancel()` stops
    it (what a caller does when its own share fails, so no child outlives the work)."""

    def __init__(self, pid: int, read_end: int) -> None:
        self._pid, self._read_end = pid, read_end

    def result(self) -> T:
        try:
            with os.fdopen(self._read_end, "rb") as pipe:
                payload = pipe.read()
            _, status = os.waitpid(self._pid, 0)
        except BaseException:
            self._kill()
            raise
        if not payload:
            raise RuntimeError(f"the forked worker ended with status {os.waitstatus_to_exitcode(status)} and no "
                               f"result")
        ok, value = pickle.loads(payload)
        if not ok:
            raise value
        return value

    def cancel(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._read_end)
        self._kill()

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(self._pid, signal.SIGTERM)
            os.waitpid(self._pid, 0)


def start_forked(fn: Callable[[], T]) -> Forked[T] | None:
    """Run `fn()` in a forked child and return it as `Forked`, or None without forking where `can_fork` says no."""
    if not can_fork():
        return None
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():  # native library threads (BLAS) are idle; the child runs Python alone
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        _child(fn, read_end, write_end)
    os.close(write_end)
    return Forked(pid, read_end)


def _child(fn: Callable[[], Any], read_end: int, write_end: int) -> None:
    """The forked child: run `fn`, send (True, result) or (False, exception) back, leave without cleanup."""
    code = 0
    try:
        os.close(read_end)
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the child ends with os._exit
        logging.disable(logging.CRITICAL)
        try:
            payload = pickle.dumps((True, fn()), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
            code = 1
            try:
                payload = pickle.dumps((False, e), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # an exception that does not pickle: its type and text
                payload = pickle.dumps((False, RuntimeError(f"{type(e).__name__}: {e}")))
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(payload)
    finally:
        os._exit(code)

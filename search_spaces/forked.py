"""One call run in a forked child process while this one goes on: the second core of a laptop or CI machine.

    child = start_forked(lambda: work(a, b))  # None where forking is unsafe: run it here instead
    ...                                       # this process's own share (on failure: child.cancel())
    result = child.result()                   # the child's return value, or its exception raised here

The child shares this process's memory as it was at the fork (nothing is pickled on the way in) and sends its
result back pickled through a pipe. Forking is used only where it is safe (`can_fork`): Linux (macOS frameworks
are not fork-safe, which is why Python's own multiprocessing spawns there), at least two usable CPUs, Ray never
imported (its native threads are invisible to `threading`), and no Python thread but daemons (a terminal status
line's refresher). The child's `sys.stdout` and `sys.stderr` go to /dev/null and logging is off, so it prints
nothing; Ctrl-C and SIGTERM end it at once (their default actions); it leaves with `os._exit`, running none of the
parent's exit handlers. A failed pipe or fork is no error (no child: the caller does the work itself), nor is a
child that dies without an answer (killed, out of memory): `result()` then runs the call here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Forked", "can_fork", "start_forked"]

T = TypeVar("T")


def can_fork() -> bool:
    """Whether a forked child may run Python code safely (module docstring): Linux, two CPUs or more, Ray never
    imported, no other thread but daemons."""
    if not sys.platform.startswith("linux") or "ray" in sys.modules or len(os.sched_getaffinity(0)) < 2:
        return False
    return all(t.daemon for t in threading.enumerate() if t is not threading.current_thread())


class Forked(Generic[T]):
    """A call running in a forked child: `result()` waits for it and re-raises its exception (and runs the call
    here when the child left no answer), `cancel()` stops it (what a caller does when its own share fails, so no
    child outlives the work)."""

    def __init__(self, fn: Callable[[], T], pid: int, read_end: int) -> None:
        self._fn, self._pid, self._read_end = fn, pid, read_end

    def result(self) -> T:
        try:
            with os.fdopen(self._read_end, "rb") as pipe:
                payload = pipe.read()
            self._reap()
        except BaseException:
            self._kill()
            raise
        try:
            ok, value = pickle.loads(payload)
        except Exception:  # nothing came (the child was killed), or only part of it
            return self._fn()
        if not ok:
            raise value
        return value

    def cancel(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._read_end)
        self._kill()

    def _reap(self) -> None:
        with contextlib.suppress(ChildProcessError):  # already reaped (SIGCHLD ignored)
            os.waitpid(self._pid, 0)

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._pid, signal.SIGKILL)
        self._reap()


def start_forked(fn: Callable[[], T]) -> Forked[T] | None:
    """Run `fn()` in a forked child and return it as `Forked`; None, without a child, where `can_fork` says no or
    the pipe or the fork fails (too many processes or open files, no memory to copy the page tables)."""
    if not can_fork():
        return None
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing to flush
            stream.flush()
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return None
    try:
        with warnings.catch_warnings():  # native library threads (BLAS) are idle; the child runs Python alone
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    if pid == 0:
        _child(fn, read_end, write_end)
    os.close(write_end)
    return Forked(fn, pid, read_end)


def _child(fn: Callable[[], Any], read_end: int, write_end: int) -> None:
    """The forked child: run `fn`, send (True, result) or (False, exception) back, leave without cleanup."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # the parent's handlers (SIGTERM as Ctrl-C) are not ours
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.close(read_end)
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the child ends with os._exit
        logging.disable(logging.CRITICAL)
        try:
            payload = pickle.dumps((True, fn()), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
            code = 1
            e.add_note("in the forked worker:\n" + traceback.format_exc())
            try:
                payload = pickle.dumps((False, e), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # an exception that does not pickle: its type and text
                payload = pickle.dumps((False, RuntimeError(f"{type(e).__name__}: {e}")))
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(payload)
    finally:
        os._exit(code)

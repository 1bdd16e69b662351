"""`search_spaces.forked`: a call in a forked child returns its value or raises its exception here."""

from __future__ import annotations

import threading

import pytest

from search_spaces.forked import can_fork, start_forked


def _forked(fn):
    child = start_forked(fn)
    if child is None:
        pytest.skip("this test process cannot fork safely (another test left a thread running)")
    return child.result


def test_the_childs_value_and_exception_come_back() -> None:
    big = list(range(200_000))  # shared at the fork, not pickled on the way in; the result crosses the pipe
    assert _forked(lambda: sum(big) + len(big))() == sum(big) + len(big)

    def fails() -> None:
        raise ValueError("bad layout: tp=3")

    with pytest.raises(ValueError, match="bad layout: tp=3"):
        _forked(fails)()

    class Unpicklable(Exception):  # a local class: pickle cannot find it again
        pass

    def fails_oddly() -> None:
        raise Unpicklable("no way back")

    with pytest.raises(RuntimeError, match="Unpicklable: no way back"):
        _forked(fails_oddly)()


def test_a_cancelled_child_is_gone() -> None:
    import os
    import time

    child = start_forked(lambda: time.sleep(60))
    if child is None:
        pytest.skip("this test process cannot fork safely (another test left a thread running)")
    pid = child._pid
    child.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, 0)  # reaped: no such child any more


def test_a_thread_that_is_no_daemon_keeps_the_work_here() -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=False)
    other.start()
    try:
        assert not can_fork() and start_forked(lambda: 1) is None
    finally:
        stop.set()
        other.join()

"""`search_spaces.forked`: a call in a forked child returns its value or raises its exception here.

Each check runs in a fresh interpreter: this test process may have imported Ray (an earlier test), and then
`can_fork` rightly refuses."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> None:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr


def test_the_childs_value_and_exception_come_back() -> None:
    _run("""
        import os
        from search_spaces.forked import can_fork, start_forked

        assert can_fork()
        big = list(range(200_000))  # shared at the fork, not pickled on the way in; the result crosses the pipe
        assert start_forked(lambda: sum(big) + len(big)).result() == sum(big) + len(big)

        def fails():
            raise ValueError("bad layout: tp=3")

        try:
            start_forked(fails).result()
            raise SystemExit("no error")
        except ValueError as e:
            assert "bad layout: tp=3" in str(e) and "in the forked worker" in e.__notes__[0]

        def fails_oddly():
            class Unpicklable(Exception):  # a class local to a function: pickle cannot name it
                pass

            raise Unpicklable("no way back")

        try:
            start_forked(fails_oddly).result()
            raise SystemExit("no error")
        except RuntimeError as e:
            assert "Unpicklable: no way back" in str(e)

        parent = os.getpid()

        def killed_in_the_child():  # a child killed (out of memory ...) leaves no answer: the call runs here
            if os.getpid() != parent:
                os.kill(os.getpid(), 9)
            return "here"

        child = start_forked(killed_in_the_child)
        assert child.result() == "here"
        try:
            os.waitpid(child._pid, 0)
            raise SystemExit("the killed child was not reaped")
        except ChildProcessError:
            pass
        print("ok")
    """)


def test_a_cancelled_child_is_gone_and_threads_keep_the_work_here() -> None:
    _run("""
        import os, threading, time
        from search_spaces.forked import can_fork, start_forked

        child = start_forked(lambda: time.sleep(60))
        pid = child._pid
        t0 = time.perf_counter()
        child.cancel()
        assert time.perf_counter() - t0 < 10
        try:
            os.waitpid(pid, 0)
            raise SystemExit("the child is still there")
        except ChildProcessError:  # reaped: no such child any more
            pass
        stop = threading.Event()
        other = threading.Thread(target=stop.wait, daemon=False)
        other.start()
        assert not can_fork() and start_forked(lambda: 1) is None
        stop.set()
        other.join()
        import ray  # noqa: F401  - imported, never started: its native threads could be, so no fork either
        assert not can_fork()
        print("ok")
    """)


@pytest.mark.parametrize("rows", ["half", "all"])
def test_a_large_table_scored_in_two_processes_equals_one(rows: str) -> None:
    # a table of PARALLEL_ROWS or more is scored half in a forked child (`score._halves`): every figure of every
    # row is the one the single pass gives, bit for bit, with the time left out of the rows that do not fit
    _run(f"""
        import numpy as np
        from autotune.cost import score
        from autotune.cost.layout_table import LayoutTable
        from autotune.ui.api import make_job
        from search_spaces import forked
        from search_spaces.space import feasible_space

        job = make_job(model="mixtral", nodes=2)
        table = LayoutTable.from_space(feasible_space(job))
        forks = []
        start = forked.start_forked
        score.start_forked = lambda fn: forks.append(1) or start(fn)
        score.PARALLEL_ROWS = len(table) // 2
        split = score.score_layouts(job, table, time_for="{'fits' if rows == 'half' else 'all'}")
        assert forks == [1]
        score.PARALLEL_ROWS = len(table) + 1
        whole = score.score_layouts(job, table, time_for="{'fits' if rows == 'half' else 'all'}")
        assert forks == [1]
        halves = score._halves(table)
        assert len(halves[0]) and len(halves[1]) and len(halves[0]) + len(halves[1]) == len(table)
        for name in whole.__slots__:
            a, b = getattr(split, name), getattr(whole, name)
            pairs = [(a, b)] if isinstance(a, np.ndarray) else [(a[k], b[k]) for k in b] if isinstance(a, dict) else []
            for x, y in pairs:
                np.testing.assert_array_equal(x, y, err_msg=name)
                assert x.dtype == y.dtype and x.flags.writeable == y.flags.writeable, name
        assert split.model_flops_per_step == whole.model_flops_per_step
        if "{rows}" == "half":
            assert np.isnan(whole.step_time_s[~whole.fits]).all()
        print("ok")
    """)

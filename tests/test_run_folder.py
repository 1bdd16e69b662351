"""The result folder: refused when not empty (unless resumed or --force), one search at a time, unique default
names, atomic writes that fail loudly."""

import errno
import multiprocessing
import os
from pathlib import Path

import pytest

from autotune.tuning.run_folder import OutputError, atomic_write, claim, default_output_dir, folder_lock


def test_a_non_empty_folder_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "trials.csv").write_text("x\n")
    with pytest.raises(ValueError, match="is not empty.*--resume.*--force"):
        with claim(tmp_path / "run", resume=False):
            pass
    assert (tmp_path / "run" / "trials.csv").read_text() == "x\n"


def test_force_moves_the_old_folder_aside_and_keeps_it(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "trials.csv").write_text("x\n")
    with claim(tmp_path / "run", resume=False, force=True) as folder:
        assert list(folder.iterdir()) == []
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert len(aside) == 1 and (aside[0] / "trials.csv").read_text() == "x\n"


def test_resume_of_a_missing_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no such folder"):
        with claim(tmp_path / "nowhere", resume=True):
            pass
    assert not (tmp_path / "nowhere").exists()


def _try_lock(path: str, queue) -> None:
    try:
        with folder_lock(path):
            queue.put("locked")
    except ValueError as e:
        queue.put(str(e))


def test_a_second_search_on_a_locked_folder_is_refused_at_once(tmp_path):
    queue = multiprocessing.get_context("fork").Queue()
    with folder_lock(tmp_path):
        other = multiprocessing.get_context("fork").Process(target=_try_lock, args=(str(tmp_path), queue))
        other.start()
        other.join(30)
        assert "in use by another search" in queue.get(timeout=5)
    other = multiprocessing.get_context("fork").Process(target=_try_lock, args=(str(tmp_path), queue))
    other.start()
    other.join(30)
    assert queue.get(timeout=5) == "locked"  # released with the block


def test_the_lock_is_re_entrant_in_one_process(tmp_path):
    with folder_lock(tmp_path), folder_lock(tmp_path):
        pass
    with folder_lock(tmp_path):
        pass


def test_default_names_never_collide():
    names = {default_output_dir("llama3-8b", 1).name for _ in range(2000)}
    assert len(names) == 2000  # microseconds and a random suffix: same-second runs differ


def test_atomic_write_replaces_the_file_whole(tmp_path):
    atomic_write(tmp_path / "best.json", "old\n")
    atomic_write(tmp_path / "best.json", "new\n")
    assert (tmp_path / "best.json").read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["best.json"]  # no temp file left


def test_a_failed_atomic_write_keeps_the_old_file_and_raises(tmp_path, monkeypatch):
    atomic_write(tmp_path / "best.json", "old\n")

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OutputError, match="cannot write .*best.json: No space left on device"):
        atomic_write(tmp_path / "best.json", "new\n")
    monkeypatch.undo()
    assert (tmp_path / "best.json").read_text() == "old\n"
    assert [p.name for p in Path(tmp_path).iterdir()] == ["best.json"]


def test_resume_sweeps_what_a_killed_run_left_half_written(tmp_path):
    (tmp_path / "trials.csv").write_text("x\n")
    (tmp_path / ".best.json.tmp-123-abcdef").write_text("half")
    (tmp_path / ".study.db.tmp-123").write_text("half")
    (tmp_path / ".report-xyz").mkdir()
    with claim(tmp_path, resume=True):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trials.csv"]

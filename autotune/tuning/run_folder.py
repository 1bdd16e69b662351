"""The result folder of one search: its name, its lock, and writes that never leave half a file.

Rules (docs/output-files.md, issue 14):
- A new search needs an empty or missing folder. A non-empty one is refused unless the search resumes it
  (`--resume`) or `--force` moves it aside first (to `<folder>.old-<time>`, never deleted).
- One search per folder: `folder_lock` holds an exclusive `fcntl.flock` on the folder itself for the whole run
  (trials, study, outputs); a second search on the folder is refused at once.
- Default names are unique: `<model>-<nodes>n-<YYYYmmdd-HHMMSS>-<microseconds>-<6 hex>`, created exclusively.
- `atomic_write`: temp file in the same folder, fsync, rename over the target, fsync the folder. A failed
  write raises `OutputError` (an OSError naming the file) and leaves the old file as it was.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

__all__ = ["OutputError", "atomic_write", "folder_lock", "claim", "prepare_folder", "make_folder", "move_aside",
           "default_output_dir"]

_HELD: dict[str, tuple[int, int]] = {}  # "pid:folder" -> (fd, depth): the lock is re-entrant in one process


class OutputError(OSError):
    """A result file could not be written (full disk, read-only folder ...): the search cannot be trusted."""


def default_output_dir(model_name: str, nodes: int, root: str | Path = "autotune_runs") -> Path:
    """A fresh folder name under `root`: second, microsecond and a random suffix (two runs never share one)."""
    now = _dt.datetime.now()
    return Path(root) / f"{model_name}-{nodes}n-{now:%Y%m%d-%H%M%S}-{now:%f}-{secrets.token_hex(3)}"


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot fsync a directory; the rename still happened
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: str | Path, data: str | bytes) -> None:
    """Replace `path` with `data` all at once (temp file + fsync + rename); OutputError when it cannot."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OutputError(e.errno or errno.EIO, f"cannot write {path}: {e.strerror or e}") from None
    _fsync_dir(path.parent)


@contextlib.contextmanager
def folder_lock(folder: str | Path) -> Iterator[Path]:
    """Hold an exclusive `flock` on the folder itself for the block (no lock file: a refused search leaves an
    earlier folder byte for byte as it was); ValueError at once when another process holds it."""
    folder = Path(folder)
    key = f"{os.getpid()}:{folder.resolve()}"  # a forked child holds nothing of its parent's
    if key in _HELD:  # this process holds it already
        fd, depth = _HELD[key]
        _HELD[key] = (fd, depth + 1)
        try:
            yield folder
        finally:
            fd, depth = _HELD[key]
            _HELD[key] = (fd, depth - 1)
        return
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise ValueError(f"cannot use {folder} as the result folder: {e.strerror or e}.") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise ValueError(f"{folder} is in use by another search; wait for it to finish or give another "
                             f"--output.") from None
        raise ValueError(f"cannot lock {folder}: {e.strerror or e}.") from None
    _HELD[key] = (fd, 1)
    try:
        yield folder
    finally:
        _HELD.pop(key, None)
        os.close(fd)  # closing the descriptor releases the flock


@contextlib.contextmanager
def claim(folder: str | Path, *, resume: bool, force: bool = False) -> Iterator[Path]:
    """The result folder, checked, created when new, and locked for the block (see the module docstring)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a folder; give --output a folder path.")
    if resume and not folder.is_dir():
        raise ValueError(f"--resume {folder}: no such folder; give the folder of an earlier search.")
    if force and not resume and folder.is_dir() and _contents(folder):
        with folder_lock(folder):
            move_aside(folder)
    make_folder(folder)
    with folder_lock(folder):
        if not resume:
            prepare_folder(folder, resume=False)  # checked again under the lock: nobody filled it in between
        else:
            _sweep_temporaries(folder)
        yield folder


def _sweep_temporaries(folder: Path) -> None:
    """Half-written temporaries a killed run left (`.best.json.tmp-...`, `.report-...`): the lock is ours, so no
    other search is writing them."""
    import shutil

    for path in folder.glob(".*"):
        if ".tmp-" in path.name and path.is_file():
            with contextlib.suppress(OSError):
                path.unlink()
        elif path.name.startswith(".report-") and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def _contents(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def prepare_folder(folder: str | Path, *, resume: bool, force: bool = False) -> Path:
    """Check (and create) the result folder before anything is written; ValueError with one line when it will not do.

    Call it with the folder's lock held (`folder_lock`), so no other search changes it in between.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a folder; give --output a folder path.")
    if resume:
        if not folder.is_dir():
            raise ValueError(f"--resume {folder}: no such folder; give the folder of an earlier search.")
        return folder
    if folder.is_dir() and _contents(folder):
        if not force:
            raise ValueError(f"--output {folder} is not empty ({', '.join(_contents(folder)[:4])}...); give "
                             f"--resume {folder} to continue that search, --force to move it aside, or another "
                             f"--output.")
    return folder


def make_folder(folder: str | Path) -> Path:
    """mkdir -p with a one-line ValueError (a parent that is a file, a read-only mount, no permission)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"{folder} is a file, not a folder; give --output a folder path.") from None
    except NotADirectoryError:
        raise ValueError(f"cannot create {folder}: a parent of it is a file, not a folder.") from None
    except OSError as e:
        raise ValueError(f"cannot create {folder}: {e.strerror or e}.") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write in {folder}: permission denied (or a read-only file system).")
    return folder


def move_aside(folder: Path) -> Path:
    """`--force`: rename the old folder to `<folder>.old-<time>` (kept, never deleted); returns the new name."""
    now = _dt.datetime.now()
    target = folder.with_name(f"{folder.name}.old-{now:%Y%m%d-%H%M%S}-{now:%f}")
    try:
        folder.rename(target)
    except OSError as e:
        raise ValueError(f"--force: cannot move {folder} aside to {target}: {e.strerror or e}.") from None
    return target

"""Ray's cluster messages on the driver: into the result folder, off the terminal (unless `--verbose`).

Ray prints the cluster's error messages on the driver's stdout whatever `log_to_driver` says
(`ray._private.worker.listen_error_messages` hands them to `print_to_stdstream` labelled `(raylet)`; Ray 2.60):
a node marked dead, a killed raylet's last 20 log lines, "A worker died or was killed while executing a task",
a detached actor in an anonymous namespace. When a node leaves mid-search that is thirty lines on the terminal for
one event the search already handles: the trial's lost attempt is recorded as an infrastructure failure, retried,
and said in one line. So while a search runs those messages are appended to `ray_messages.log` in its folder
(written only when there is one) and the terminal keeps the one line. Everything else Ray prints is untouched.

`print_to_stdstream` is Ray's private function; where it is missing (another Ray release) nothing is diverted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["divert_cluster_messages", "MESSAGES_LOG", "CLUSTER_LABEL"]

MESSAGES_LOG = "ray_messages.log"
CLUSTER_LABEL = "raylet"  # the `pid` Ray gives the cluster's error messages (listen_error_messages)


@contextlib.contextmanager
def divert_cluster_messages(folder: str | Path) -> Iterator[Path]:
    """While the block runs, Ray's cluster messages go to `folder/ray_messages.log` instead of stdout."""
    import ray._private.worker as worker

    path = Path(folder) / MESSAGES_LOG
    original = getattr(worker, "print_to_stdstream", None)
    if original is None:
        yield path
        return

    def divert(data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        if data.get("pid") != CLUSTER_LABEL:
            original(data, *args, **kwargs)
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.writelines(f"{stamp} {line}\n" for line in data.get("lines", ()))
        except OSError:  # the folder went away: the message is Ray's, not a result
            pass

    worker.print_to_stdstream = divert
    try:
        yield path
    finally:
        worker.print_to_stdstream = original

"""Units every layer shares: one home, so a figure in GiB means the same everywhere."""

from __future__ import annotations

__all__ = ["GIB"]

GIB = 1024**3  # bytes in a GiB (memory is counted in bytes and shown in GiB)

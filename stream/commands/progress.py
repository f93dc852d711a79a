"""A minimal progress bar on stderr for long work (shown only when stderr is a terminal)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

__all__ = ["progress"]


def progress(items: Iterable[T], total: int, label: str, *, enabled: bool | None = None) -> Iterator[T]:
    """Yield ``items`` and draw ``label [#####     ] k/total`` on stderr as they go."""
    show = sys.stderr.isatty() if enabled is None else enabled
    start = time.monotonic()
    for k, item in enumerate(items, 1):
        yield item
        if show:
            width = 30
            filled = int(width * k / max(total, 1))
            rate = k / max(time.monotonic() - start, 1e-9)
            eta = (total - k) / rate if rate else 0.0
            sys.stderr.write(
                f"\r{label} [{'#' * filled}{' ' * (width - filled)}] {k}/{total} eta {eta:5.0f}s"
            )
            sys.stderr.flush()
    if show:
        sys.stderr.write("\n")

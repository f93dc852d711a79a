"""Where the real streams of ../shared/data are: beside the repository (override with TOPS_SHARED_DATA)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

DATA_DIR = Path(
    os.environ.get("TOPS_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data")
)


def path(name: str) -> Path:
    p = DATA_DIR / name
    if not p.is_file():
        msg = f"{p} is missing: the shared data sets live in ../shared/data (or set TOPS_SHARED_DATA)"
        raise FileNotFoundError(msg)
    return p


def extended(name: str, n: int) -> np.ndarray:
    """The stream extended to n ticks as the reference code does: append the reversed array (without its first
    element) until it is long enough."""
    x = np.load(path(name)).astype(np.float64)
    while x.size < n:
        x = np.concatenate([x, x[::-1][1:]])
    return x[:n]

"""The paper's utility metric (Wang et al., CCS 2021, Eq. 9): squared error of random range queries over released ticks.

``MSE(Q) = 1/|Q| sum_{(i,j) in Q} (V~(i,j) - V(i,j))^2`` where ``V(i,j)`` is the sum of ticks i..j. A query has a
length drawn uniformly from [1, min(r, n)] and a start drawn uniformly among the positions where it fits.

>>> import numpy as np
>>> truth = np.arange(10.0)
>>> e = range_query_errors(truth, truth + 1.0, max_length=4, queries=50, rng=np.random.default_rng(0))
>>> bool((e > 0).all()), float(np.abs(e).max()) <= 4
(True, True)
"""

from __future__ import annotations

import numpy as np

__all__ = ["interval_means", "range_query_errors", "summarize"]


def range_query_errors(
    truth: np.ndarray, released: np.ndarray, *, max_length: int, queries: int, rng: np.random.Generator
) -> np.ndarray:
    """Signed errors ``V~(i,j) - V(i,j)`` of ``queries`` random range queries (prefix sums, O(n + queries))."""
    truth = np.asarray(truth, dtype=np.float64)
    released = np.asarray(released, dtype=np.float64)
    n = truth.size
    if n == 0 or released.size != n:
        msg = "truth and releases must be non-empty and of the same length"
        raise ValueError(msg)
    ct = np.concatenate([[0.0], np.cumsum(truth)])
    cr = np.concatenate([[0.0], np.cumsum(released)])
    length = rng.integers(1, min(max_length, n) + 1, size=queries)
    start = (rng.random(queries) * (n - length + 1)).astype(np.int64)
    return (cr[start + length] - cr[start]) - (ct[start + length] - ct[start])


def summarize(errors: np.ndarray) -> tuple[float, float]:
    """(MSE, MAE) of a set of errors."""
    return float(np.mean(errors**2)), float(np.mean(np.abs(errors)))


def interval_means(x: np.ndarray, intervals: int) -> np.ndarray:
    """Mean of each of ``intervals`` equal parts of ``x`` (the moving average of Figure 2)."""
    parts = np.array_split(np.asarray(x, dtype=np.float64), intervals)
    return np.array([p.mean() if p.size else np.nan for p in parts])

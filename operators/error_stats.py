"""The holdout's statistics for error bars: what truncation takes (:mod:`operators.truncation`) and how short sums
vary (:mod:`operators.spread`), measured when a ToPS stream's holdout ends and kept with the stream.

Both are DP outputs of the holdout, paid from the threshold budget ``eps_T`` (:func:`budgets`): the choice of theta,
s and the smoother's start runs on ``(1 - TRUNCATION_SHARE - SPREAD_SHARE) eps_T``, the truncation statistic on
``TRUNCATION_SHARE eps_T`` and the spread on ``SPREAD_SHARE eps_T``, so the holdout's outputs together are
``eps_T``-DP by sequential composition (and the released ticks, disjoint from the holdout, compose in parallel).

A stream keeps them as one small byte string (float64 numbers: ``[n, the spread's n numbers, excess sum,
counts...]``), about 300 bytes; :func:`status` states them in value units.

>>> from operators.noise import KeyedGenerator
>>> hist = np.zeros(11, dtype=np.int64); hist[[2, 9]] = [90, 10]         # values 3 and 10 (candidates 1..10)
>>> blob = measure(hist, np.arange(1, 11), theta_units=5, bound_units=10, blocks=None, leaf_ticks=1,
...                gen=KeyedGenerator(bytes(32)), threshold_epsilon=1.0)
>>> trunc, spread = status(blob, theta_units=5, bound_units=10, resolution=1.0, threshold_epsilon=1.0, holdout=100)
>>> trunc["edges"], trunc["counts"], sorted(spread)[:3]       # 100 readings: too few for the excess histogram
([], [], ['abs_variance', 'holdout', 'mean_abs'])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from operators.noise import KeyedGenerator
from operators.spread import SPREAD_SHARE, noisy_spread, noisy_spread_table, spread_status, truncated_moments
from operators.truncation import (
    TRUNCATION_SHARE,
    excess_counts,
    excess_edges,
    noisy_statistic,
    noisy_statistics_table,
    truncation_status,
)

__all__ = ["budgets", "measure", "measure_rows", "status"]


STATISTIC_EPSILON_MAX = 2.0**10  # every statistic's noise scale (sensitivity >= 1 unit) stays >= 2^-10 units


def budgets(threshold_epsilon: float) -> tuple[float, float, float]:
    """``(eps_choice, eps_truncation, eps_spread)``: the threshold budget's three parts. The statistics take their
    shares up to :data:`STATISTIC_EPSILON_MAX` each (a larger budget would ask the exact sampler for a scale below its
    range, and would tell nothing more at a resolution of one unit), so the parts add up to at most the budget."""
    eps_t, eps_s = TRUNCATION_SHARE * threshold_epsilon, SPREAD_SHARE * threshold_epsilon
    return (threshold_epsilon - eps_t - eps_s, min(eps_t, STATISTIC_EPSILON_MAX), min(eps_s, STATISTIC_EPSILON_MAX))


def measure(hist: np.ndarray, candidates: np.ndarray, *, theta_units: int, bound_units: int, blocks: Any,
            leaf_ticks: int, gen: KeyedGenerator, threshold_epsilon: float) -> bytes:
    """Both statistics of one holdout (its histogram over the candidates, its block statistics or None) at the
    chosen theta and leaf width, as the stream keeps them."""
    _, eps_t, eps_s = budgets(threshold_epsilon)
    counts, total = excess_counts(hist, candidates, theta_units=theta_units, bound_units=bound_units)
    trunc = noisy_statistic(counts, total, gen, eps_t, bound_units - theta_units, int(np.sum(hist)))
    spread = noisy_spread(truncated_moments(hist, candidates, theta_units), blocks, theta_units=theta_units,
                          leaf_ticks=leaf_ticks, gen=gen, epsilon=eps_s)
    return _pack(spread, trunc)


def measure_rows(values: np.ndarray, keys: np.ndarray, *, thetas: list[int], bound_units: int,
                 threshold_epsilon: float) -> list[bytes]:
    """:func:`measure` for many short holdouts (the rows of a columnar holdout that end in rows: row ``i`` of
    ``values`` holds stream ``i``'s readings in units, each at its cell's value; ``keys[i]`` its key; ``thetas[i]``
    its theta; no block width fits such a holdout): the same bytes, each draw made for all streams at once (a call
    per bin and statistic, not per stream), every stream's numbers written into one table and cut from it."""
    _, eps_t, eps_s = budgets(threshold_epsilon)
    values = np.asarray(values, dtype=np.int64)
    thetas_arr = np.asarray(thetas, dtype=np.int64)
    tops = bound_units - thetas_arr
    counts, nbins, totals = _excess_rows(values, thetas_arr, tops)
    trunc, sizes = noisy_statistics_table(counts, nbins, totals, keys, eps_t, tops, values.shape[1])
    t = np.minimum(values, thetas_arr[:, None])
    spread, measured = noisy_spread_table(t.sum(axis=1), (t * t).sum(axis=1), keys, theta_units=thetas_arr,
                                          epsilon=eps_s)
    # the layout of _pack: [w, the spread's w numbers] or [0], then the truncation statistic
    w = spread.shape[1]
    table = np.zeros((len(thetas_arr), 1 + w + trunc.shape[1]), dtype="<f8")
    table[:, 0] = w
    table[:, 1:1 + w] = spread  # zeros where not measured: such a row starts at its column w, [0]
    table[:, 1 + w:] = trunc
    starts = np.where(measured, 0, w).tolist()
    ends = (1 + w + sizes).tolist()
    return [table[i, a:b].tobytes() for i, (a, b) in enumerate(zip(starts, ends, strict=True))]


def _excess_rows(v: np.ndarray, thetas: np.ndarray, tops: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`operators.truncation.excess_counts` of many streams at once (row ``k`` of ``v``: a stream's readings in
    units; ``thetas[k]``, ``tops[k]``: its theta and ``B - theta``): ``(counts, nbins, totals)``, stream ``k``'s
    counts in ``counts[k, :nbins[k]]``. Every stream's bins are the first bins of one sequence of edges
    (:func:`operators.truncation.excess_edges`: the edges up to ``top`` do not depend on ``top``, only the last,
    ``top + 1``, does), so one histogram over the largest ``top``'s edges, cut at each stream's number of bins,
    counts them all."""
    n = len(v)
    top_max = int(tops.max(initial=0))
    if top_max < 1:
        return np.zeros((n, 0), np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    edges = excess_edges(top_max)
    nbins = np.searchsorted(edges[:-1], tops, side="right")  # the edges at or below a stream's top
    excess = np.minimum(v - thetas[:, None], tops[:, None])
    totals = np.where(excess > 0, excess, 0).sum(axis=1)
    counts = np.zeros((n, edges.size - 1), dtype=np.int64)
    r, c = np.nonzero(excess >= 1)
    np.add.at(counts, (r, np.searchsorted(edges, excess[r, c], side="right") - 1), 1)
    return counts, nbins, totals


def _pack(spread: list[float] | None, trunc: bytes) -> bytes:
    head = [0.0] if spread is None else [float(len(spread)), *spread]
    return np.asarray(head, dtype="<f8").tobytes() + trunc


def status(blob: bytes, *, theta_units: int, bound_units: int, resolution: float, threshold_epsilon: float,
           holdout: int) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(truncation, spread)`` as a stream's status states them (value units; None where not measured)."""
    values = np.frombuffer(blob, dtype="<f8")
    n = int(values[0]) if values.size else 0
    spread = values[1:1 + n].tolist() if n else None
    rest = blob[8 * (1 + n):]
    _, eps_t, _ = budgets(threshold_epsilon)
    trunc = truncation_status(rest, theta_units=theta_units, bound_units=bound_units, resolution=resolution,
                              epsilon=eps_t, holdout=holdout)
    return trunc, spread_status(spread, resolution=resolution, holdout=holdout)  # type: ignore[arg-type]

"""Threshold optimizer NM-E (Wang et al., CCS 2021, Section 3.3, Eq. 5-6) and the choice of smoother layers (Eq. 7).

The holdout values are summarised by a histogram over the candidate thresholds (a sufficient statistic for
``m_theta``), so a stream in its holdout keeps one small integer array, not its raw values.

Eq. 5 (with the erratum of Algorithm 1 fixed: values *above* theta)::

    m_theta = |{ i <= m : v_i > theta }|

Eq. 6, c = 60::

    q_theta = -(3 m theta / (c r eps)) * sqrt(2 (b - 1) log_b(r)^3) - m_theta

Only ``m_theta`` depends on the data; it has sensitivity 1 and moves all candidates in the same direction
(monotone), so report-noisy-max with exponential noise Exp(1/eps) (= permute-and-flip) is eps-DP.

>>> cands = candidate_grid(bound=10, resolution=1.0)
>>> cands.tolist()
[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
>>> hist = holdout_histogram(np.array([0, 1, 2, 2, 9, 10]), cands)
>>> m_theta(hist).tolist()          # values > 1, > 2, ..., > 10
[4, 2, 2, 2, 2, 2, 2, 2, 1, 0]
>>> smoother_layers(epsilon=0.05, query_range=2**20, fanout=16)   # 3 on POS at eps = 0.05 (x* rounded)
3
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = [
    "C_SCORE",
    "candidate_grid",
    "eq7_error",
    "holdout_histogram",
    "integer_run",
    "m_theta",
    "report_noisy_max",
    "scores",
    "smoother_layers",
]

C_SCORE = 60.0  # the constant c of Eq. 6
_ALL_INTEGERS_UP_TO = 4096  # every grid point as a candidate while there are at most this many
_GEOMETRIC_STEP = 1.001  # beyond that, candidates 0.1% apart
# the compact grid (``holdout_grid = "compact"``): a holdout's histogram in O(log B) cells
COMPACT_INTEGERS = 32  # every grid point up to the 32nd
COMPACT_STEP = 1.03  # beyond that, candidates 3% apart (the calibrated choice's thetas are 5% apart)


@functools.lru_cache(maxsize=64)
def candidate_grid(bound: float, resolution: float, compact: bool = False) -> np.ndarray:
    """Candidate thresholds in quantized units (multiples of ``resolution``) over [1, B].

    Every grid point while there are at most 4096 of them; otherwise the first 4096 grid points and then a
    geometric grid with steps of 0.1% up to B. ``compact``: the first 32 grid points and then steps of 3%, so that a
    holdout's histogram has ``O(log B)`` cells (204 at B = 5,000 against 4,297). Read-only and shared by every
    stream of the same bound (computed once: a daemon creates many streams).

    >>> len(candidate_grid(5000.0, 1.0)), len(candidate_grid(5000.0, 1.0, compact=True))
    (4296, 203)
    >>> candidate_grid(5000.0, 1.0, compact=True)[30:36].tolist()   # integers, then 3% apart
    [31, 32, 33, 34, 35, 36]
    """
    if compact:
        grid = _candidate_grid(bound, resolution, COMPACT_INTEGERS, COMPACT_STEP)
    else:
        grid = _candidate_grid(bound, resolution, _ALL_INTEGERS_UP_TO, _GEOMETRIC_STEP)
    grid.flags.writeable = False
    return grid


def _candidate_grid(bound: float, resolution: float, integers: int, step: float) -> np.ndarray:
    top = math.floor(bound / resolution + 1e-9)
    low = max(1, math.ceil(1.0 / resolution - 1e-9))
    low = min(low, top)
    if top - low + 1 <= integers:
        return np.arange(low, top + 1, dtype=np.int64)
    dense = np.arange(low, low + integers, dtype=np.int64)
    n_geo = math.ceil(math.log(top / dense[-1]) / math.log(step)) + 1
    geo = np.unique(np.round(np.geomspace(dense[-1], top, n_geo)).astype(np.int64))
    return np.unique(np.concatenate([dense, geo, [top]]))


_RUNS: dict[int, tuple[np.ndarray, int, int]] = {}


def integer_run(candidates: np.ndarray) -> tuple[int, int]:
    """``(low, top)``: the grid's first candidate and the last of its integer run (``candidates[k] = low + k`` up to
    ``top``), so that a holdout reading's bin (``np.searchsorted(candidates, v)``) there is ``v - low`` (``0`` at or
    below ``low``). Once per grid (kept while the grid lives: the grids are cached)."""
    got = _RUNS.get(id(candidates))
    if got is None or got[0] is not candidates:
        low = int(candidates[0])
        run = int(np.count_nonzero(candidates[: _ALL_INTEGERS_UP_TO] == np.arange(low, low + min(
            _ALL_INTEGERS_UP_TO, candidates.size))))
        got = (candidates, low, low + run - 1)
        if len(_RUNS) < 64:
            _RUNS[id(candidates)] = got
    return got[1], got[2]


def holdout_histogram(
    units: np.ndarray, candidates: np.ndarray, hist: np.ndarray | None = None
) -> np.ndarray:
    """Add quantized holdout values to ``hist[k]`` = #values with ``candidates[k-1] < v <= candidates[k]``.

    ``hist`` has ``len(candidates) + 1`` bins; the last counts values above every candidate.
    """
    if hist is None:
        hist = np.zeros(len(candidates) + 1, dtype=np.int64)
    idx = np.searchsorted(candidates, units, side="left")
    hist += np.bincount(idx, minlength=len(hist)).astype(hist.dtype)
    return hist


def m_theta(hist: np.ndarray) -> np.ndarray:
    """Eq. 5: for every candidate, the number of holdout values strictly above it."""
    above = np.cumsum(hist[::-1])[::-1]  # above[k] = sum(hist[k:])
    return above[1:].astype(np.int64)


def scores(
    m_theta_values: np.ndarray,
    thetas: np.ndarray,
    *,
    m: int,
    epsilon: float,
    query_range: int,
    fanout: int,
    c: float = C_SCORE,
) -> np.ndarray:
    """Eq. 6 for every candidate ``theta`` (in value units)."""
    levels = math.log(query_range, fanout)
    slope = 3.0 * m / (c * query_range * epsilon) * math.sqrt(2.0 * (fanout - 1) * levels**3)
    return -slope * np.asarray(thetas, dtype=np.float64) - np.asarray(m_theta_values, dtype=np.float64)


def report_noisy_max(score: np.ndarray, uniforms: np.ndarray, epsilon: float) -> int:
    """Index of ``max(score + Exp(1/epsilon))``: report-noisy-max with exponential noise (sensitivity 1, monotone).

    ``uniforms`` are in (0, 1) and come from the keyed generator; ties go to the smallest index.
    """
    noisy = score - np.log(uniforms) / epsilon
    return int(np.argmax(noisy))


def eq7_error(s: float | np.ndarray, *, epsilon: float, theta: float, query_range: int, fanout: int):
    """Eq. 7: ``(b-1)(log_b r - s)^3 2 theta^2/eps^2 + b^(2s)/4 * theta^2/9``."""
    levels = math.log(query_range, fanout)
    s = np.asarray(s, dtype=np.float64)
    noise = (fanout - 1) * (levels - s) ** 3 * 2.0 * theta**2 / epsilon**2
    bias = np.power(float(fanout), 2.0 * s) / 4.0 * theta**2 / 9.0
    return noise + bias


@functools.lru_cache(maxsize=256)
def smoother_layers(epsilon: float, query_range: int, fanout: int, theta: float = 1.0) -> int:
    """s by Eq. 7: minimise over real ``x = b^s`` in [1, r], then round ``log_b x*`` (as the reference code does).

    Eq. 7 is convex in ``s`` (a decreasing cubic plus an increasing exponential), so a golden-section search
    finds the continuous minimiser; theta scales both terms and does not move it. The result is capped at
    ``h - 1`` so that at least one tree layer remains. Cached: a pure function of its public arguments.
    """
    levels = math.log(query_range, fanout)
    lo, hi = 0.0, levels
    g = (math.sqrt(5.0) - 1.0) / 2.0

    def f(s: float) -> float:
        return float(eq7_error(s, epsilon=epsilon, theta=theta, query_range=query_range, fanout=fanout))

    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = f(a), f(b)
    for _ in range(200):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = f(b)
    s_star = (lo + hi) / 2.0
    h = math.ceil(levels - 1e-12)
    return int(min(max(round(s_star), 0), max(h - 1, 0)))

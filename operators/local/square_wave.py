"""Square Wave (SW; Li et al., SIGMOD 2020), eps-LDP density estimation, as ToPL's threshold step (Wang et al., CCS
2021, Eq. 16).

Device side: a reading is clamped to ``[0, B]`` and mapped to ``x = v / B`` in ``[0, 1]``; the report ``y`` lies in
``[-b, 1 + b]`` with density ``p`` within ``b`` of ``x`` and ``q`` elsewhere (Eq. 16)::

    b = (eps e^eps - e^eps + 1) / (2 e^eps (e^eps - 1 - eps)),   p = e^eps / (2 b e^eps + 1),   q = 1 / (2 b e^eps + 1)

so ``p / q = e^eps`` and ``2 b p + q = 1``; any ``b > 0`` keeps both identities (the control message carries ``b``).
A report is the inverse CDF at one uniform, rounded to the report grid (:mod:`operators.local._units`).

Server side: the reports are counted in ``report_buckets`` equal buckets of ``[-b, 1 + b]`` and the density of the
readings over ``buckets`` equal buckets of ``[0, 1]`` is estimated by Expectation Maximization, **without** the
smoothing step of EMS (Section 4.1: smoothing pushes mass to the ends of the range). The transition matrix is
exact for a reading uniform within its bucket. EM stops like the reference code: after 10,000 iterations, when the
log-likelihood improves by less than 1e-3, or when the estimate moves by at most 1/N in L1. SW-W (Section 4.1)
then zeroes the density after the first bucket whose next 5 estimates are all below 0.01% and renormalizes.

Examples
--------
>>> b, p, q = square_wave_parameters(1.0)
>>> round(b, 4), round(p / q, 4), round(2 * b * p + q, 12)
(0.2561, 2.7183, 1.0)
>>> from operators.noise import Domain, KeyedGenerator
>>> gen = KeyedGenerator(bytes(32))
>>> x = np.linspace(0.0, 0.3, 20_000) ** 2                      # a skewed sample in [0, 0.09]
>>> y = square_wave_perturb(x, 2.0, gen.uniforms(Domain.LOCAL, 0, 0, x.size))
>>> bool(y.min() >= -square_wave_parameters(2.0)[0] and y.max() <= 1 + square_wave_parameters(2.0)[0])
True
>>> est = estimate_density(y, 2.0, buckets=64)
>>> est.density.shape, round(float(est.density.sum()), 9)
((64,), 1.0)
>>> float(est.density[:8].sum()) > 0.8                           # almost all mass below 8/64 = 0.125
True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from operators.local._units import REPORT_GRID_INVERSE, as_float_array, check_epsilon, to_unit

__all__ = [
    "PRUNE_LEVEL",
    "PRUNE_RUN",
    "DensityEstimate",
    "estimate_density",
    "square_wave_density",
    "square_wave_em",
    "square_wave_histogram",
    "square_wave_parameters",
    "square_wave_perturb",
    "square_wave_report",
    "square_wave_transition_matrix",
    "sw_unit",
    "sww_cut_points",
    "sww_prune",
    "tail_moment_from_counts",
]

PRUNE_RUN = 5  # SW-W: this many consecutive small estimates ...
PRUNE_LEVEL = 1e-4  # ... each below 0.01% of the mass
EM_MAX_ITERATIONS = 10_000
EM_LOGLIKELIHOOD_TOLERANCE = 1e-3


def square_wave_parameters(epsilon: float, b: float | None = None) -> tuple[float, float, float]:
    """``(b, p, q)`` of Eq. 16 (``b`` from the formula unless given: any ``b > 0`` keeps eps-LDP)."""
    eps = check_epsilon(epsilon)
    if b is None:
        em1 = math.expm1(eps)
        b = (eps * math.exp(eps) - em1) / (2.0 * math.exp(eps) * (em1 - eps))
    elif isinstance(b, bool) or not isinstance(b, int | float) or not 0 < b < 1e6 or not math.isfinite(b):
        msg = f"sw_b must be a positive number (got {b!r})"
        raise ValueError(msg)
    b = float(b)
    denominator = 2.0 * b * math.exp(eps) + 1.0
    return b, math.exp(eps) / denominator, 1.0 / denominator


def square_wave_density(y: Any, x: float, epsilon: float, b: float | None = None) -> np.ndarray:
    """The density of a report ``y`` given the unit-scale input ``x`` (Eq. 16); 0 outside ``[-b, 1 + b]``."""
    b, p, q = square_wave_parameters(epsilon, b)
    ys = np.asarray(y, dtype=np.float64)
    out = np.where(np.abs(ys - x) <= b, p, q)
    return np.where((ys >= -b) & (ys <= 1.0 + b), out, 0.0)


def sw_unit(x: np.ndarray, u: np.ndarray, b: float, p: float, q: float) -> np.ndarray:
    """SW reports for unit-scale inputs (clipped to ``[0, 1]``): the inverse CDF of Eq. 16's density at ``u``,
    rounded to the report grid."""
    xs = np.clip(x, 0.0, 1.0)
    mass_left = q * xs
    mass_window = 2.0 * b * p
    y = np.where(
        u < mass_left,
        -b + u / q,
        np.where(u < mass_left + mass_window, xs - b + (u - mass_left) / p, xs + b + (u - mass_left - mass_window) / q),
    )
    return np.floor(np.clip(y, -b, 1.0 + b) * REPORT_GRID_INVERSE + 0.5) / REPORT_GRID_INVERSE


def square_wave_perturb(x: Any, epsilon: float, u: Any, b: float | None = None) -> np.ndarray:
    """SW on the unit scale: ``x`` in ``[0, 1]`` (clipped), one uniform per value; reports in ``[-b, 1 + b]``."""
    b, p, q = square_wave_parameters(epsilon, b)
    xs = as_float_array(x, "x")
    us = as_float_array(u, "u")
    if us.shape != xs.shape:
        msg = "x and u must have the same length"
        raise ValueError(msg)
    return sw_unit(xs, us, b, p, q)


def square_wave_report(values: Any, bound: float, epsilon: float, u: Any, b: float | None = None) -> np.ndarray:
    """Clamp readings to ``[0, bound]``, run SW, and scale the report back to reading units (``y * bound``)."""
    return square_wave_perturb(to_unit(values, bound), epsilon, u, b) * bound


def _ramp_integral(t: np.ndarray, b: float) -> np.ndarray:
    """``H(t) = int_0^t clip(s, -b, b) ds``: ``t^2/2`` for ``|t| <= b``, ``b |t| - b^2/2`` beyond."""
    a = np.abs(t)
    return np.where(a <= b, 0.5 * t * t, b * a - 0.5 * b * b)


def square_wave_transition_matrix(
    epsilon: float, buckets: int = 1024, report_buckets: int = 1024, b: float | None = None
) -> np.ndarray:
    """``M[j, i] = P(report in bucket j | reading uniform in bucket i)``, exact; each column sums to 1.

    With reading bucket ``[a0, a1]`` (width ``D``) and report bucket ``[c, d]``, the window overlap integrates to
    ``int_{a0}^{a1} |[c, d] n [v - b, v + b]| dv = H(d - a0) - H(d - a1) - H(c - a0) + H(c - a1)``, so
    ``M[j, i] = q (d - c) + (p - q) / D * (that integral)``.
    """
    b, p, q = square_wave_parameters(epsilon, b)
    a = np.linspace(0.0, 1.0, buckets + 1)
    c = np.linspace(-b, 1.0 + b, report_buckets + 1)
    a0, a1 = a[None, :-1], a[None, 1:]
    lo, hi = c[:-1, None], c[1:, None]
    overlap = (
        _ramp_integral(hi - a0, b)
        - _ramp_integral(hi - a1, b)
        - _ramp_integral(lo - a0, b)
        + _ramp_integral(lo - a1, b)
    )
    return q * (hi - lo) + (p - q) * overlap / (a1 - a0)


def square_wave_histogram(y: Any, b: float, report_buckets: int = 1024) -> np.ndarray:
    """Counts of unit-scale reports in ``report_buckets`` equal buckets of ``[-b, 1 + b]`` (ends included)."""
    ys = as_float_array(y, "reports")
    width = (1.0 + 2.0 * b) / report_buckets
    idx = np.clip(np.floor((ys + b) / width), 0, report_buckets - 1).astype(np.int64)
    return np.bincount(idx, minlength=report_buckets).astype(np.int64)


@dataclass(frozen=True, slots=True)
class DensityEstimate:
    """An SW density estimate: ``density`` over the reading buckets of ``[0, 1]`` (sums to 1), EM iterations
    run, and ``cut``: the SW-W point ``w`` after which the density was zeroed (``None`` when nothing was pruned)."""

    density: np.ndarray
    iterations: int
    cut: int | None


def square_wave_em(
    counts: Any,
    epsilon: float,
    buckets: int = 1024,
    b: float | None = None,
    max_iterations: int = EM_MAX_ITERATIONS,
    tolerance: float = EM_LOGLIKELIHOOD_TOLERANCE,
) -> tuple[np.ndarray, int]:
    """EM for the reading density from report counts (no smoothing step); returns ``(density, iterations)``.

    Each step is ``f_i <- f_i * sum_j M[j, i] n_j / (M f)_j / N`` with ``M`` the exact transition matrix
    (:func:`square_wave_transition_matrix`), which keeps ``f`` a probability vector and never lowers the
    log-likelihood ``sum_j n_j log (M f)_j``. ``M f`` and ``M^T r`` are computed in O(buckets + report buckets)
    from prefix sums instead of the dense product (same numbers up to rounding); ``len(counts)`` is the number of
    report buckets.
    """
    b, p, q = square_wave_parameters(epsilon, b)
    n = np.ascontiguousarray(np.asarray(counts, dtype=np.float64))
    if n.ndim != 1 or n.size < 2 or not np.isfinite(n).all() or (n < 0).any():
        msg = "counts must be a 1-D array of non-negative report counts"
        raise ValueError(msg)
    if not isinstance(buckets, int) or buckets < 2:
        msg = "buckets must be an integer >= 2"
        raise ValueError(msg)
    if n.sum() <= 0:
        return np.full(buckets, 1.0 / buckets), 0
    a = np.linspace(0.0, 1.0, buckets + 1)
    e = np.linspace(-b, 1.0 + b, n.size + 1)
    lo_e = np.searchsorted(a, e - b, side="left")
    hi_e = np.searchsorted(a, e + b, side="right")
    lo_a = np.searchsorted(e, a - b, side="left")
    hi_a = np.searchsorted(e, a + b, side="right")
    from operators.local._em import em_kernel  # numba, compiled on first use: devices never import it

    f, it = em_kernel(n, a, e, lo_e, hi_e, lo_a, hi_a, b, p, q, int(max_iterations), float(tolerance))
    return f, int(it)


def sww_cut_points(density: Any, run: int = PRUNE_RUN, level: float = PRUNE_LEVEL) -> np.ndarray:
    """SW-W's candidate cut points in increasing order: every bucket ``w`` after the median whose next ``run``
    estimates are all below ``level`` (a fraction of the total). :func:`sww_prune` cuts at the first one it may."""
    f = np.asarray(density, dtype=np.float64)
    total = f.sum()
    if f.ndim != 1 or not total > 0:
        msg = "density must be a 1-D array with positive mass"
        raise ValueError(msg)
    f = f / total
    if f.size <= run:
        return np.zeros(0, dtype=np.int64)
    small = (f < level).astype(np.int64)
    window = np.convolve(small, np.ones(run, dtype=np.int64), mode="valid")  # window[k] = #small in f[k:k+run]
    starts = np.flatnonzero(window[1:] == run) + 1  # a run starting at k >= 1 follows the point w = k - 1
    # never inside the bulk: at high eps the unsmoothed EM estimate is spiky and a run of empty buckets can come
    # before half of the mass; the tail SW-W is meant to cut starts after the median
    median = int(np.searchsorted(np.cumsum(f), 0.5))
    return (starts[starts > median] - 1).astype(np.int64)


def sww_prune(
    density: Any,
    run: int = PRUNE_RUN,
    level: float = PRUNE_LEVEL,
    keep: Callable[[int], bool] | None = None,
) -> tuple[np.ndarray, int | None]:
    """SW-W (Section 4.1): find the first bucket ``w`` at or after the median whose next ``run`` estimates are all
    below ``level`` (a fraction of the total), zero the density after ``w`` and renormalize. Returns
    ``(density, w)``, ``w = None`` (and the density only normalized) when no bucket qualifies. ``keep(w)`` True
    means the reports show the tail after ``w``: that point is skipped and the next one tried.

    >>> f = np.array([0.5, 0.3, 0.1, 0.00005, 0, 0, 0, 0.00001, 0.09, 0.00994])
    >>> pruned, w = sww_prune(f)
    >>> w, pruned.round(4).tolist()
    (2, [0.5556, 0.3333, 0.1111, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    >>> spiky = np.array([0.3, 0, 0, 0, 0, 0, 0.3, 0.4, 0, 0, 0, 0, 0, 1e-5])    # empty buckets inside the bulk
    >>> sww_prune(spiky)[1]                                                      # cut after the median only
    7
    >>> sww_prune(f, keep=lambda w: True)[1] is None                             # every tail is shown: no cut
    True
    """
    f = np.asarray(density, dtype=np.float64)
    points = sww_cut_points(f, run, level)
    f = f / f.sum()
    for w in points.tolist():
        if keep is not None and keep(w):
            continue
        kept = f[: w + 1].sum()
        if not kept > 0:
            return f, None
        out = np.zeros_like(f)
        out[: w + 1] = f[: w + 1] / kept
        return out, w
    return f, None


def tail_moment_from_counts(counts: Any, epsilon: float, t: float, b: float | None = None) -> tuple[float, float]:
    """An unbiased estimate of ``E[min((x - t)+, 2b)]`` (unit scale) from SW report counts over equal buckets of
    ``[-b, 1 + b]``, and its standard error: how much of the readings' mass lies above ``t``, weighted by how far.

    For ``y >= t + b`` a window ``[x - b, x + b]`` reaches ``y`` only when ``x > t``, so the reports in the band
    ``[t + b, 1 + b]`` (width ``d = 1 - t``) number ``N (q d + (p - q) E[min((x - t)+, 2b)])`` in expectation
    (Eq. 16: density ``q`` everywhere, ``p`` inside the window): the estimate is
    ``(n_band / N - q d) / (p - q)``, with standard error ``sqrt(n_band) / (N (p - q))`` (Poisson counts; the report
    bucket that straddles ``t + b`` counts by the share of it inside the band).

    >>> b, p, q = square_wave_parameters(1.0)
    >>> x = np.full(200_000, 0.8)                                   # every reading at 0.8 (unit scale)
    >>> from operators.noise import Domain, KeyedGenerator
    >>> y = square_wave_perturb(x, 1.0, KeyedGenerator(bytes(32)).uniforms(Domain.LOCAL, 0, 0, x.size))
    >>> est, se = tail_moment_from_counts(square_wave_histogram(y, b), 1.0, 0.5)
    >>> bool(abs(est - 0.3) < 3 * se) and se < 0.01                  # min(0.8 - 0.5, 2b) = 0.3
    True
    """
    b, p, q = square_wave_parameters(epsilon, b)
    n = np.asarray(counts, dtype=np.float64)
    total = float(n.sum())
    if n.ndim != 1 or n.size < 2 or not total > 0 or not 0.0 <= t <= 1.0:
        msg = "counts must be non-empty report counts and t in [0, 1]"
        raise ValueError(msg)
    width = (1.0 + 2.0 * b) / n.size
    left = -b + np.arange(n.size) * width
    inside = np.clip((left + width - (t + b)) / width, 0.0, 1.0)  # share of each report bucket in [t + b, 1 + b]
    in_band = float((n * inside).sum())
    return (in_band / total - q * (1.0 - t)) / (p - q), math.sqrt(max(in_band, 1.0)) / (total * (p - q))


def estimate_density(
    y: Any,
    epsilon: float,
    buckets: int = 1024,
    report_buckets: int | None = None,
    b: float | None = None,
    prune: bool = True,
    counts: Any = None,
    prune_level: float = PRUNE_LEVEL,
    keep: Callable[[int], bool] | None = None,
) -> DensityEstimate:
    """The SW(-W) density over ``buckets`` buckets of ``[0, 1]`` from unit-scale reports ``y`` (or their
    ``counts`` over ``report_buckets`` report buckets, default ``buckets``): histogram, EM, SW-W pruning (``keep``:
    the cut points SW-W skips, :func:`sww_prune`)."""
    b, _, _ = square_wave_parameters(epsilon, b)
    report_buckets = buckets if report_buckets is None else report_buckets
    hist = square_wave_histogram(y, b, report_buckets) if counts is None else np.asarray(counts)
    density, iterations = square_wave_em(hist, epsilon, buckets, b)
    cut = None
    if prune:
        density, cut = sww_prune(density, level=prune_level, keep=keep)
    return DensityEstimate(density=density, iterations=iterations, cut=cut)

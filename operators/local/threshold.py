"""The ToPL threshold: minimize the range-query error of Eq. 8 over 1024 candidates (Wang et al., CCS 2021, Section
4.1).

With ``f`` the SW-W density estimate over ``K`` equal buckets of ``[0, B]`` (bucket ``i`` represented by its
centre ``t_i = (i + 1/2) B / K``) and the candidates ``theta_k = (k + 1) B / K``, the estimated mean squared error
of a random range query over ``r`` ticks when readings are truncated to ``theta`` and reported with the Hybrid
mechanism at the stream budget ``eps`` is (Eq. 8)::

    E(theta) = r/3 * Var(theta) + r^2/6 * ( sum_{t_i > theta} f_i (t_i - theta) )^2,
    Var(theta) = theta^2 / 4 * V_HM(eps)                         (Eq. 22 on [-1, 1], mapped to [0, theta])

``r/3`` is the average number of ticks in a random range and ``r^2/6`` the average squared range length (an
erratum: the paper's text also says ``r^2/24``, a typo; the average of ``j^2`` over random ranges is about
``r^2/6``). The noise term uses the variance of an estimate of a reading in ``[0, theta]``: the unit-scale
variance of Eq. 22 times ``(theta/2)^2`` (the reference code multiplies by ``theta^2``, which overstates noise
fourfold and pushes theta down).

Examples
--------
>>> density = np.zeros(1024); density[[10, 100, 600]] = [0.9, 0.0999, 0.0001]
>>> round(optimal_threshold(density, bound=1024.0, epsilon=1.0, query_range=2**20), 1)
101.0
>>> round(optimal_threshold(density, bound=1024.0, epsilon=1.0, query_range=16), 1)   # short ranges: less noise
11.0
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from operators.local._units import as_float_array, check_epsilon
from operators.local.hybrid import hybrid_worst_case_variance
from operators.local.square_wave import (
    PRUNE_LEVEL,
    DensityEstimate,
    estimate_density,
    square_wave_histogram,
    square_wave_parameters,
    tail_moment_from_counts,
)

__all__ = [
    "TAIL_SIGNIFICANCE",
    "ThresholdEstimate",
    "optimal_threshold",
    "shown_tail",
    "threshold_candidates",
    "threshold_from_reports",
    "threshold_objective",
]


TAIL_SIGNIFICANCE = 2.0  # SW-W never cuts a tail the holdout's reports show at this many standard errors


def threshold_candidates(bound: float, buckets: int = 1024) -> np.ndarray:
    """The candidates ``theta_k = (k + 1) B / K``, ``k = 0 .. K - 1``: the upper edges of the density buckets."""
    return np.arange(1, buckets + 1, dtype=np.float64) * (float(bound) / buckets)


def threshold_objective(density: Any, bound: float, epsilon: float, query_range: int) -> np.ndarray:
    """Eq. 8 at every candidate of :func:`threshold_candidates` (``len(density)`` buckets over ``[0, bound]``)."""
    eps = check_epsilon(epsilon)
    f = as_float_array(density, "density")
    if f.size < 1 or (f < 0).any() or not f.sum() > 0:
        msg = "density must be non-negative with positive mass"
        raise ValueError(msg)
    if not bound > 0 or not query_range >= 1:
        msg = "bound and query_range must be positive"
        raise ValueError(msg)
    f = f / f.sum()
    k = f.size
    width = float(bound) / k
    centres = (np.arange(k) + 0.5) * width
    thetas = threshold_candidates(bound, k)
    # suffix sums over buckets strictly above candidate k: sum_{i > k} f_i and sum_{i > k} f_i t_i
    tail_mass = np.concatenate([np.cumsum(f[::-1])[::-1][1:], [0.0]])
    tail_moment = np.concatenate([np.cumsum((f * centres)[::-1])[::-1][1:], [0.0]])
    bias = np.maximum(tail_moment - thetas * tail_mass, 0.0)
    r = float(query_range)
    variance = thetas**2 / 4.0 * hybrid_worst_case_variance(eps)
    return r / 3.0 * variance + r * r / 6.0 * bias**2


def optimal_threshold(density: Any, bound: float, epsilon: float, query_range: int) -> float:
    """The candidate theta with the smallest Eq. 8 error (the smallest one on ties)."""
    scores = threshold_objective(density, bound, epsilon, query_range)
    return float(threshold_candidates(bound, scores.size)[int(np.argmin(scores))])


@dataclass(frozen=True, slots=True)
class ThresholdEstimate:
    """The result of the ToPL threshold step: ``theta`` and the SW-W density estimate it came from."""

    theta: float
    estimate: DensityEstimate


def shown_tail(
    counts: Any, epsilon: float, buckets: int, b: float | None = None, z: float = TAIL_SIGNIFICANCE
) -> Callable[[int], bool]:
    """``keep(w)``: do the SW report ``counts`` show mass above density bucket ``w`` (of ``buckets``)? True when the
    band estimate of the tail above it (:func:`operators.local.square_wave.tail_moment_from_counts`) exceeds ``z``
    standard errors.

    Why SW-W needs it: unsmoothed EM fits the reports' noise with small spikes scattered over the domain (about
    1 % of the mass in all), so SW-W must cut after the data; but the estimate of a real, thin tail is just as
    spiky, with runs of empty buckets inside it, and a cut there drops readings the reports plainly show (a meter's
    2 % of spikes at eps 2, retail's tail at eps 2 to 4). The guard keeps those and still cuts the noise: its band
    estimate is within a standard error or two of zero.
    """
    n = np.asarray(counts, dtype=np.float64)

    def keep(w: int) -> bool:
        est, se = tail_moment_from_counts(n, epsilon, (w + 1) / buckets, b)
        return est > z * se

    return keep


def threshold_from_reports(
    reports: Any,
    bound: float,
    threshold_epsilon: float,
    epsilon: float,
    query_range: int = 1 << 20,
    buckets: int = 1024,
    report_buckets: int = 1024,
    b: float | None = None,
    prune: bool = True,
    counts: Any = None,
    prune_level: float = PRUNE_LEVEL,
    guard: float | None = TAIL_SIGNIFICANCE,
    cut_within: float = 1.0,
) -> ThresholdEstimate:
    """Server side of ToPL's first phase: SW reports in reading units (``[-b B, (1 + b) B]``, as devices publish
    them) -> histogram over ``report_buckets`` buckets -> SW-W density over ``buckets`` buckets of ``[0, bound]``
    -> theta minimizing Eq. 8 for the stream budget ``epsilon``. ``counts`` (report counts over equal buckets of
    ``[-b, 1 + b]``, unit scale) may replace ``reports``. SW-W skips a cut point whose tail the reports show at
    ``guard`` standard errors (:func:`shown_tail`; ``None``: the paper's SW-W, which cuts at the first point).

    >>> from operators.local.square_wave import square_wave_report
    >>> from operators.noise import Domain, KeyedGenerator
    >>> readings = 50.0 * ((np.arange(20_000) % 1000) / 1000.0) ** 3      # skewed, in [0, 50]; B = 200
    >>> u = KeyedGenerator(bytes(32)).uniforms(Domain.LOCAL, 0, 0, readings.size)
    >>> reports = square_wave_report(readings, 200.0, 2.0, u)
    >>> est = threshold_from_reports(reports, 200.0, threshold_epsilon=2.0, epsilon=1.0)
    >>> est.estimate.cut is not None and 0.0 < est.theta <= 50.0        # SW-W cut the tail of the estimate
    True
    """
    if not bound > 0:
        msg = "bound must be positive"
        raise ValueError(msg)
    b, _, _ = square_wave_parameters(threshold_epsilon, b)
    if counts is None:
        counts = square_wave_histogram(as_float_array(reports, "reports") / float(bound), b, report_buckets)
    counts = np.asarray(counts)
    shown = None if guard is None else shown_tail(counts, threshold_epsilon, buckets, b, guard)

    def keep(w: int) -> bool:
        return (w + 1) > cut_within * buckets or (shown is not None and shown(w))

    est = estimate_density(None, threshold_epsilon, buckets=buckets, b=b, prune=prune, counts=counts,
                           prune_level=prune_level, keep=keep)
    theta = optimal_threshold(est.density, bound, epsilon, query_range)
    return ThresholdEstimate(theta=theta, estimate=est)

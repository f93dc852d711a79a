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

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from operators.local._units import as_float_array, check_epsilon
from operators.local.hybrid import hybrid_worst_case_variance
from operators.local.square_wave import PRUNE_LEVEL, DensityEstimate, estimate_density, square_wave_parameters

__all__ = [
    "COARSE_QUANTILE",
    "COARSE_SHARE",
    "ThresholdEstimate",
    "coarse_domain",
    "optimal_threshold",
    "threshold_candidates",
    "threshold_from_reports",
    "threshold_objective",
]


COARSE_SHARE = 0.25  # the coarse round: the first quarter of the holdout's reports
COARSE_QUANTILE = 0.95  # its estimate's 95 % point ...
_COARSE_MULTIPLE = 8.0  # ... times 8 is the fine round's domain U
_WINDOW_MULTIPLE = 2.0  # refine only where SW's window on [0, B] (b B) is wider than 2 U


def coarse_domain(
    density: Any, bound: float, threshold_epsilon: float, resolution: float | None = 1.0, floor: float = 0.0
) -> float:
    """The fine round's domain from the coarse round's density over ``[0, B]``, or ``B`` (no second round).

    Square Wave's window is ``b B`` wide on each side (b from Eq. 16: 0.26 at eps 1, 0.45 at eps 0.2), whatever the
    data; when the public bound dwarfs the data (retail: B = 16,470, readings up to 76) every report is mostly
    noise and EM puts mass far from the data, which Eq. 8 then chases. So the first quarter of the holdout finds the
    data's scale, ``U = 8 x`` its estimate's 95 % point (the far tail of a coarse estimate is mostly EM's
    invention, its 95 % point is not), and the rest of the holdout reports over ``[0, U]`` (the
    device clamps to U: a smaller domain, the same epsilon). Only worth it where the window is wider than ``2 U``;
    elsewhere ``B`` is returned and the two rounds are one (their counts add up).

    >>> f = np.zeros(1024); f[:5] = 0.2                          # data in the first 5 of 1,024 buckets of B
    >>> coarse_domain(f, 16470.0, 1.0)                           # 8 x 80.4, rounded up to the resolution
    644.0
    >>> coarse_domain(f, 16470.0, 6.0)                           # a narrow window at eps 6: no second round
    16470.0
    """
    f = as_float_array(density, "density")
    f = f / f.sum()
    k = f.size
    q = (int(np.searchsorted(np.cumsum(f), COARSE_QUANTILE)) + 1) * float(bound) / k
    u = max(_COARSE_MULTIPLE * q, floor)  # ``floor``: a lower limit the caller trusts more (see rounds)
    if resolution is not None:
        u = max(2.0 * resolution, math.ceil(u / resolution - 1e-9) * resolution)
    b = square_wave_parameters(threshold_epsilon)[0]
    if u >= bound or b * bound <= _WINDOW_MULTIPLE * u:
        return float(bound)
    return float(u)


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
) -> ThresholdEstimate:
    """Server side of ToPL's first phase: SW reports in reading units (``[-b B, (1 + b) B]``, as devices publish
    them) -> histogram over ``report_buckets`` buckets -> SW-W density over ``buckets`` buckets of ``[0, bound]``
    -> theta minimizing Eq. 8 for the stream budget ``epsilon``. ``counts`` (report counts over equal buckets of
    ``[-b, 1 + b]``, unit scale) may replace ``reports``.

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
        y = as_float_array(reports, "reports") / float(bound)
        est = estimate_density(y, threshold_epsilon, buckets=buckets, report_buckets=report_buckets, b=b, prune=prune,
                               prune_level=prune_level)
    else:
        est = estimate_density(None, threshold_epsilon, buckets=buckets, b=b, prune=prune, counts=counts,
                               prune_level=prune_level)
    theta = optimal_threshold(est.density, bound, epsilon, query_range)
    return ThresholdEstimate(theta=theta, estimate=est)

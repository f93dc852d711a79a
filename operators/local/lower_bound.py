"""How close to the best theta any eps-LDP threshold phase can be: Le Cam's two-point bound.

Eq. 8 scores a threshold on a stream whose readings have distribution ``P`` (Wang et al., CCS 2021, Section 4.1)::

    E_P(theta) = r/3 * theta^2/4 * V(eps) + r^2/6 * bias_P(theta)^2,    bias_P(theta) = E_P[(x - theta)+]

and the thresholds within a factor ``c`` of the best one form ``I_P = {theta : E_P(theta) <= c min E_P}``. Take the
alternative ``P' = (1 - delta) P + delta * [a point at y]``: a stream that differs from ``P`` in a share ``delta`` of
its readings, so ``TV(P, P') <= delta``. For any eps-LDP protocol over ``n`` reports, sequentially interactive ones
included (rounds that zoom, any estimator), Duchi, Jordan & Wainwright (JASA 2018, Theorem 1) bound the divergence
of what the server sees::

    KL(M^n || M'^n) <= 4 (e^eps - 1)^2 n delta^2

and Bretagnolle-Huber gives ``P(A) + P'(A^c) >= exp(-KL) / 2`` for any event ``A``. When ``I_P`` and ``I_P'`` are
disjoint, ``A = {theta not in I_P}`` contains ``{theta not in I_P'}``'s complement, so *every* threshold phase misses
the factor ``c`` on ``P`` or on ``P'`` with probability at least ``exp(-KL) / 4``. :func:`two_point_bound` finds the
alternative with the smallest ``KL`` whose interval is disjoint from ``P``'s.

>>> x = np.minimum(np.arange(10_000) % 50, 30).astype(float)          # readings 0..30, B = 500
>>> tb = two_point_bound(x, bound=500.0, epsilon=0.5, reports=65_536, query_range=1 << 20)
>>> tb.interval[0] <= tb.best <= tb.interval[1] < tb.alt_theta
True
>>> 0.0 < tb.share < 0.01 and tb.miss_probability > 0.1                # 0.x % of readings the reports cannot see
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from operators.local._units import as_float_array, check_epsilon
from operators.local.hybrid import hybrid_worst_case_variance

__all__ = ["TwoPointBound", "tail_bias", "two_point_bound"]

_SHARES = np.geomspace(1e-6, 0.1, 241)  # delta, scanned upwards (the first disjoint one is the smallest)
_PLACES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)  # y, as fractions of B


@dataclass(frozen=True, slots=True)
class TwoPointBound:
    """``interval``: the thetas within ``factor`` of the best (``best``) on the readings; the alternative moves a
    ``share`` of them to ``value`` (its best theta ``alt_theta``, its interval disjoint); ``kl`` bounds what the
    reports can tell them apart by, and ``miss_probability = exp(-kl) / 4`` is the least probability with which
    any eps-LDP threshold phase misses the factor on one of the two streams."""

    best: float
    interval: tuple[float, float]
    share: float
    value: float
    alt_theta: float
    kl: float
    miss_probability: float


def tail_bias(values: Any, thetas: Any) -> np.ndarray:
    """``bias(theta) = mean((x - theta)+)`` at every theta (exact, O((n + k) log n))."""
    x = np.sort(as_float_array(values, "values"))
    t = np.asarray(thetas, dtype=np.float64)
    top = np.concatenate([[0.0], np.cumsum(x[::-1])])  # top[k]: the sum of the k largest readings
    k = x.size - np.searchsorted(x, t, side="right")
    return (top[k] - k * t) / x.size


def two_point_bound(
    values: Any,
    bound: float,
    epsilon: float,
    reports: int,
    query_range: int = 1 << 20,
    factor: float = 1.5,
    step: float | None = None,
) -> TwoPointBound:
    """The two-point bound for the readings ``values`` (clamped to ``[0, bound]``, as devices do), ``reports`` threshold
    reports at ``epsilon`` and Eq. 8 with ``query_range``; thetas on a grid of ``step`` (default ``B / 8192``, at
    most 0.5)."""
    eps = check_epsilon(epsilon)
    if not bound > 0 or not reports >= 1 or not factor > 1:
        msg = "bound and reports must be positive and factor above 1"
        raise ValueError(msg)
    x = np.clip(as_float_array(values, "values"), 0.0, float(bound))
    step = min(0.5, bound / 8192) if step is None else float(step)
    grid = np.arange(step, float(bound) + step / 2, step)
    r = float(query_range)
    variance = r / 3.0 * grid**2 / 4.0 * hybrid_worst_case_variance(eps)
    bias = tail_bias(x, grid)
    score = variance + r * r / 6.0 * bias**2
    inside = score <= factor * score.min()
    kl_per_share2 = 4.0 * math.expm1(eps) ** 2 * reports
    found: tuple[float, float, float, float] | None = None
    for place in _PLACES:
        y = place * float(bound)
        above = np.maximum(y - grid, 0.0)
        for d in _SHARES:
            if found is not None and kl_per_share2 * d * d >= found[0]:
                break
            alt = variance + r * r / 6.0 * ((1.0 - d) * bias + d * above) ** 2
            if not (inside & (alt <= factor * alt.min())).any():
                found = (float(kl_per_share2 * d * d), float(d), y, float(grid[int(np.argmin(alt))]))
                break
    if found is None:
        msg = "no alternative within a 10 % share of the readings moves the best theta out of the interval"
        raise ValueError(msg)
    kl, share, value, alt_theta = found
    return TwoPointBound(
        best=float(grid[int(np.argmin(score))]),
        interval=(float(grid[inside].min()), float(grid[inside].max())),
        share=share,
        value=value,
        alt_theta=alt_theta,
        kl=kl,
        miss_probability=math.exp(-kl) / 4.0,
    )

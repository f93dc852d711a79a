"""The compiled EM iteration of Square Wave (server side only; numba is imported when the first EM runs).

The transition matrix ``M`` of :func:`operators.local.square_wave.square_wave_transition_matrix` is never formed:
``M f`` and ``M^T r`` are sums of the ramp integral ``H`` at the bucket edges (see :func:`ramp_sums`), so an
iteration costs O(buckets + report buckets) instead of O(buckets * report buckets).
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["em_kernel", "ramp_sums"]


@numba.njit(cache=True, nogil=True)
def ramp_sums(
    points: np.ndarray, weights: np.ndarray, queries: np.ndarray, lo: np.ndarray, hi: np.ndarray, b: float
) -> np.ndarray:  # pragma: no cover - compiled
    """``out[k] = sum_i weights[i] H(queries[k] - points[i])`` for sorted ``points`` in O(points + queries).

    ``lo[k]`` counts the points below ``queries[k] - b`` and ``hi[k]`` those up to ``queries[k] + b``: H is linear
    outside ``[-b, b]`` and quadratic inside, so prefix sums of ``w``, ``w a`` and ``w a^2`` give each term."""
    n = points.size
    s0 = np.zeros(n + 1)
    s1 = np.zeros(n + 1)
    s2 = np.zeros(n + 1)
    for i in range(n):
        w = weights[i]
        s0[i + 1] = s0[i] + w
        s1[i + 1] = s1[i] + w * points[i]
        s2[i + 1] = s2[i] + w * points[i] * points[i]
    out = np.empty(queries.size)
    half_b2 = 0.5 * b * b
    for k in range(queries.size):
        e = queries[k]
        i, j = lo[k], hi[k]
        left = b * (e * s0[i] - s1[i]) - half_b2 * s0[i]
        d0, d1, d2 = s0[j] - s0[i], s1[j] - s1[i], s2[j] - s2[i]
        middle = 0.5 * (e * e * d0 - 2.0 * e * d1 + d2)
        r0, r1 = s0[n] - s0[j], s1[n] - s1[j]
        right = b * (r1 - e * r0) - half_b2 * r0
        out[k] = left + middle + right
    return out


@numba.njit(cache=True, nogil=True)
def em_kernel(
    counts: np.ndarray,
    a: np.ndarray,
    e: np.ndarray,
    lo_e: np.ndarray,
    hi_e: np.ndarray,
    lo_a: np.ndarray,
    hi_a: np.ndarray,
    b: float,
    p: float,
    q: float,
    max_iterations: int,
    tolerance: float,
) -> tuple[np.ndarray, int]:  # pragma: no cover - compiled
    d = a.size - 1
    dr = e.size - 1
    width = e[1] - e[0]
    scale = (p - q) / (a[1] - a[0])
    total = counts.sum()
    f = np.full(d, 1.0 / d)
    delta = np.empty(d + 1)
    rho = np.empty(dr + 1)
    ratio = np.empty(dr)
    predicted = np.empty(dr)

    def forward(f: np.ndarray) -> None:  # predicted = M f
        delta[0] = f[0]
        for i in range(1, d):
            delta[i] = f[i] - f[i - 1]
        delta[d] = -f[d - 1]
        psi = ramp_sums(a, delta, e, lo_e, hi_e, b)
        mass = f.sum()
        for j in range(dr):
            predicted[j] = q * width * mass + scale * (psi[j + 1] - psi[j])

    forward(f)
    loglik = 0.0
    for j in range(dr):
        if counts[j] > 0:
            loglik += counts[j] * math.log(predicted[j])
    it = 0
    while it < max_iterations:
        it += 1
        rsum = 0.0
        for j in range(dr):
            ratio[j] = counts[j] / predicted[j] if counts[j] > 0 else 0.0
            rsum += ratio[j]
        rho[0] = -ratio[0]
        for k in range(1, dr):
            rho[k] = ratio[k - 1] - ratio[k]
        rho[dr] = ratio[dr - 1]
        omega = ramp_sums(e, rho, a, lo_a, hi_a, b)
        new = np.empty(d)
        norm = 0.0
        for i in range(d):
            new[i] = f[i] * (q * width * rsum + scale * (omega[i] - omega[i + 1]))
            if new[i] < 0.0:  # rounding only; the exact update is non-negative
                new[i] = 0.0
            norm += new[i]
        moved = 0.0
        for i in range(d):
            new[i] /= norm
            moved += abs(new[i] - f[i])
        f = new
        forward(f)
        new_loglik = 0.0
        for j in range(dr):
            if counts[j] > 0:
                new_loglik += counts[j] * math.log(predicted[j])
        if moved <= 1.0 / total or (it > 1 and abs(new_loglik - loglik) < tolerance):
            break
        loglik = new_loglik
    return f, it

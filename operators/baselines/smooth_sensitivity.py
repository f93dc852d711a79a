"""Smooth-sensitivity percentile thresholds S-P and S-PAK of PAK (Perrier et al.; Wang et al., CCS 2021, Appendices
A-B).

Smooth sensitivity of the empirical p-quantile (Appendix B; Nissim et al.'s median formula at rank P)::

    SS_b = max_{k=0..m+1} e^(-b k) max_{t=0..k+1} [V(P + t) - V(P + t - k - 1)]

with ``V`` the sorted holdout, ``V(i) = 0`` for ``i < 1`` and ``B`` for ``i > m``. With Laplace noise (Appendix A)
``a = eps / 2`` and ``b = eps / (2 ln(2 / delta))`` (Nissim et al.'s admissible pair; it meets the paper's
``b <= eps / (-2 log delta)``), and ``delta = 1 / n^2``.

* S-P (Nissim et al.):  ``theta = x_p + SS/a * Z``;
* S-PAK (PAK's shifted version): ``theta = x_p + kappa SS/a (Z + G^-1(1 - beta))``,
  ``kappa = (1 - (e^b - 1) G^-1(1 - beta) / a)^-1``, ``beta = 0.3 * 0.02``, G the Laplace CDF.

The percentile is p = 99.5 for both (Section 5.4: "We use p = 99.5, as used by PAK"; Appendix B mentions
99.575 for PAK's own evaluation, and the reference code uses it for S-PAK; pass ``percentile`` to change it).

**Noise.** Z is drawn as integer discrete Laplace on the resolution grid (``a_dl = exp(-1 / scale)`` with
``scale = kappa SS / a`` in quantized units), never as a float Laplace; theta is rounded and clamped to ``[1, B]``.
The smooth-sensitivity proof is for continuous Laplace noise, so with discrete noise S-P/S-PAK are (eps, delta)-DP
only up to this discretization: they are baselines, not offered for production.

**Speed.** ``SS`` is computed exactly in O(D_lo * D_hi) over the distinct values below and above the rank (a pair
(lo, hi) first counts at ``k = max(first(hi), P) - min(last(lo), P) - 1``), not in O(m^2).

>>> v = np.array([1, 2, 2, 3, 5, 8, 9, 9, 10, 12])
>>> round(smooth_sensitivity(v, rank=5, b=0.5, upper=20), 4)      # the brute force gives the same
3.0
>>> round(smooth_sensitivity(v, rank=5, b=0.01, upper=20), 4)     # tiny b: almost the global sensitivity B
18.0967
"""

from __future__ import annotations

import math

import numpy as np

from operators.noise import DiscreteLaplace, KeyedGenerator

__all__ = [
    "BETA",
    "PERCENTILE",
    "laplace_inverse_cdf",
    "percentile_rank",
    "smooth_percentile_threshold",
    "smooth_sensitivity",
    "smoothing_parameters",
]

PERCENTILE = 99.5
BETA = 0.3 * 0.02
_PAIR_BLOCK = 1 << 22  # pairs evaluated per numpy block


def percentile_rank(m: int, percentile: float) -> int:
    """P, the 1-based rank of the empirical p-quantile in a sorted sample of ``m`` (the reference's
    ``sorted[int(m p)]``, 0-based), clamped to ``[1, m]``."""
    return min(max(int(m * percentile / 100.0) + 1, 1), m)


def smoothing_parameters(epsilon: float, delta: float) -> tuple[float, float]:
    """``(a, b)`` for Laplace noise: ``a = eps / 2``, ``b = eps / (2 ln(2 / delta))`` (Appendix A)."""
    return epsilon / 2.0, epsilon / (2.0 * math.log(2.0 / delta))


def laplace_inverse_cdf(q: float) -> float:
    """``G^-1(q)`` of the standard Laplace distribution."""
    return math.log(2.0 * q) if q < 0.5 else -math.log(2.0 * (1.0 - q))


def smooth_sensitivity(sorted_values: np.ndarray, *, rank: int, b: float, upper: float) -> float:
    """Appendix B's ``SS_b`` of the rank-``rank`` order statistic (1-based) of ``sorted_values`` in ``[0, upper]``."""
    x = np.clip(np.asarray(sorted_values, dtype=np.float64), 0.0, upper)
    m = x.size
    if m == 0 or not 1 <= rank <= m:
        msg = "rank must be in [1, m] of a non-empty sample"
        raise ValueError(msg)
    v = np.concatenate([[0.0], x, [float(upper)]])  # v[0]: every i < 1; v[m + 1]: every i > m
    P = rank
    hi = np.unique(v[P:])
    first = np.searchsorted(v, hi, side="left")  # first index with V >= hi
    lo = np.unique(v[: P + 1])
    last = np.searchsorted(v, lo, side="right") - 1  # last index with V <= lo
    big_i = np.maximum(first, P).astype(np.float64)
    big_j = np.minimum(last, P).astype(np.float64)
    best = 0.0
    step = max(1, _PAIR_BLOCK // max(lo.size, 1))
    for s in range(0, hi.size, step):
        gap = hi[s : s + step, None] - lo[None, :]
        k = big_i[s : s + step, None] - big_j[None, :] - 1.0
        val = np.where(gap > 0, gap * np.exp(-b * np.maximum(k, 0.0)), 0.0)
        best = max(best, float(val.max()))
    return best


def smooth_percentile_threshold(
    sorted_units: np.ndarray,
    *,
    epsilon: float,
    delta: float,
    upper: int,
    shifted: bool,
    gen: KeyedGenerator,
    domain: int,
    address: int = 0,
    percentile: float = PERCENTILE,
    beta: float = BETA,
) -> int:
    """theta in quantized units by S-P (``shifted=False``) or S-PAK (``shifted=True``), clamped to ``[1, upper]``."""
    m = int(np.asarray(sorted_units).size)
    if m == 0:
        return int(upper)
    a, b = smoothing_parameters(epsilon, delta)
    rank = percentile_rank(m, percentile)
    ss = smooth_sensitivity(sorted_units, rank=rank, b=b, upper=upper)
    x_p = float(np.asarray(sorted_units)[rank - 1])
    kappa, shift = 1.0, 0.0
    if shifted:
        g = laplace_inverse_cdf(1.0 - beta)
        kappa = 1.0 / (1.0 - (math.exp(b) - 1.0) * g / a)
        shift = g
    scale = kappa * ss / a
    noise = 0
    if scale > 0:
        # the exact sampler takes scales in [2^-10, 2^36]; a smaller scale gets more noise (never less), and a
        # larger one (smooth sensitivity beyond 2^36 units) is already far beyond any clamped theta range
        dl = DiscreteLaplace(epsilon=1.0, sensitivity=min(max(scale, 2.0**-10), 2.0**36))
        noise = int(gen.discrete_laplace(domain, address, 0, 1, dl)[0])
    theta = x_p + round(scale * shift) + noise
    return int(min(max(theta, 1), upper))

"""How much single readings vary, measured privately on the holdout: what the releases cannot show.

Inside a leaf of ``w = b^s`` ticks every release but the last is the same prediction, so the releases say nothing
about how the readings vary at scales below a leaf. A range that cuts a leaf misses the bridge of the ticks it holds
(:mod:`operators.error_bar`, Eq. 2), whose spread is the readings' own at short scales. It is measured where theta is
chosen, from the holdout's histogram (exact counts of readings per candidate cell): with ``t = min(v, theta)``
(quantized units), the sum ``sum t`` and the sum of squares ``sum t^2``, each with exact discrete Laplace noise from
the stream's keyed generator (domain ``TRUNCATION``, address 2: sample 0 the sum at ``theta / eps_1``, sample 1 the
squares at ``theta^2 / eps_2``; a changed reading moves them by at most ``theta`` and ``theta^2``), ``eps_1 =
SPREAD_SHARE eps_T / 4`` and ``eps_2 = 3 SPREAD_SHARE eps_T / 4``, carved out of the threshold budget with the
truncation statistic's share (:func:`operators.error_stats.budgets`).

A consumer reads the per-reading variance ``sigma^2 = sum t^2 / m - (sum t / m)^2`` (:class:`Spread`). The
holdout's variance holds the slow changes of the readings' level within the holdout too, so it is at least the
short-scale variance; on the shipped DNS, retail and simulated meter streams the two agree within 10 %. With the
leaves' own ``D(w) = E[(S_k - S_{k-1})^2]`` measured on the releases, the structure function at ``j`` ticks is taken
as white noise plus a smooth drift::

    D(j) = 2 j sigma^2 + max(0, D(w) - 2 w sigma^2) (j / w)^2                                            (S1)

>>> sp = Spread(holdout=100, total=500.0, total_variance=0.0, squares=2900.0, squares_variance=0.0)
>>> sp.variance                   # 29 - 5^2
4.0
>>> sp.structure(10, leaf_ticks=100, leaf_d=1800.0)      # 2 * 10 * 4 + (1800 - 800) * (10 / 100)^2
90.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from operators.noise import Domain, KeyedGenerator, shared_laplace

__all__ = ["SPREAD_SHARE", "Spread", "noisy_moments", "spread_status", "truncated_moments"]

SPREAD_SHARE = 0.08  # of the threshold budget eps_T
_ADDRESS = 2
_SCALE_MAX = 2.0**36  # the exact sampler's largest scale


def truncated_moments(hist: np.ndarray, candidates: np.ndarray, theta_units: int) -> tuple[int, int]:
    """``(sum t, sum t^2)`` of the holdout's readings truncated at theta (exact: private), from its histogram over the
    candidates (a cell's readings taken at its value, as :func:`operators.truncation.excess_counts` does)."""
    hist = np.asarray(hist, dtype=np.int64)[: len(candidates)]
    cells = np.flatnonzero(hist)
    t = np.minimum(np.asarray(candidates, dtype=np.int64)[cells], theta_units).tolist()
    n = hist[cells].tolist()
    return sum(a * b for a, b in zip(n, t, strict=True)), sum(a * b * b for a, b in zip(n, t, strict=True))


def _noises(epsilon: float, theta_units: int):
    e1, e2 = epsilon / 4.0, 3.0 * epsilon / 4.0
    if theta_units * theta_units / e2 > _SCALE_MAX:
        return None
    return shared_laplace(e1, theta_units), shared_laplace(e2, theta_units * theta_units)


def noisy_moments(moments: tuple[int, int], *, theta_units: int, gen: KeyedGenerator, epsilon: float
                  ) -> tuple[float, float, float, float] | None:
    """``(sum t + noise, its noise variance, sum t^2 + noise, its noise variance)`` (units), ``epsilon``-DP
    together; None when the squares' noise would be beyond the sampler's range (theta^2 / eps_2 > 2^36)."""
    noises = _noises(epsilon, theta_units)
    if noises is None:
        return None
    domain = int(Domain.TRUNCATION) << 16
    z1 = gen.discrete_laplace_one(domain, _ADDRESS, 0, noises[0])
    z2 = gen.discrete_laplace_one(domain, _ADDRESS, 1, noises[1])
    return float(moments[0] + z1), noises[0].variance, float(moments[1] + z2), noises[1].variance


def spread_status(noisy: tuple[float, float, float, float] | None, *, resolution: float,
                  holdout: int) -> dict[str, Any] | None:
    """The statistic as a stream's status states it (value units), None when it was not measured."""
    if noisy is None:
        return None
    total, v1, squares, v2 = noisy
    return {"holdout": holdout, "sum": total * resolution, "sum_variance": v1 * resolution**2,
            "squares": squares * resolution**2, "squares_variance": v2 * resolution**4}


def _real(x: Any) -> bool:
    return type(x) in (int, float) and math.isfinite(x)


@dataclass(frozen=True)
class Spread:
    """The spread statistic as a consumer reads it (value units): the noisy sum and sum of squares of the holdout's
    ``holdout`` readings truncated at theta, with their noise's variances."""

    holdout: int
    total: float
    total_variance: float
    squares: float
    squares_variance: float

    @classmethod
    def from_status(cls, d: Any) -> Spread:
        """From a status's ``spread`` (any JSON: ``ValueError`` naming what is wrong, never a value)."""
        if not isinstance(d, dict):
            raise ValueError("spread must be an object")
        m = d.get("holdout")
        if not (type(m) is int and 1 <= m < 1 << 53):
            raise ValueError("spread holdout must be a positive integer")
        for name in ("sum", "squares"):
            if not _real(d.get(name)):
                raise ValueError(f"spread {name} must be a number")
        for name in ("sum_variance", "squares_variance"):
            if not (_real(d.get(name)) and d[name] >= 0):
                raise ValueError(f"spread {name} must be a number >= 0")
        return cls(m, float(d["sum"]), float(d["sum_variance"]), float(d["squares"]), float(d["squares_variance"]))

    @property
    def variance(self) -> float:
        """``sigma^2``: the holdout's per-reading variance (the noisy moments as they are; at least 0)."""
        mean = self.total / self.holdout
        return max(0.0, self.squares / self.holdout - mean * mean)

    @property
    def variance_noise(self) -> float:
        """The variance of ``sigma^2``'s noise (delta method: the squares' noise, and the mean's through 2 mean)."""
        mean = self.total / self.holdout
        return (self.squares_variance + 4.0 * mean * mean * self.total_variance) / self.holdout**2

    def structure(self, j: float, *, leaf_ticks: int, leaf_d: float) -> float:
        """(S1): ``D(j)`` for ``1 <= j <= leaf_ticks`` from ``sigma^2`` and the leaf's own ``D(w)``."""
        white = 2.0 * self.variance
        drift = max(0.0, leaf_d - white * leaf_ticks)
        return white * j + drift * (j / leaf_ticks) ** 2

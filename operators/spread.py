"""How much readings vary at scales below a leaf, measured privately on the holdout: what the releases cannot show.

Inside a leaf of ``w = b^s`` ticks every release but the last is the same prediction, so the releases say nothing
about how the readings vary at scales below a leaf. A range that cuts a leaf misses the bridge of the ticks it holds
(:mod:`operators.error_bar`, Eq. 2), whose spread is the readings' own at the scale of the cut. Two statistics are
measured where theta is chosen, with exact discrete Laplace noise from the stream's keyed generator (domain
``TRUNCATION``, address 2), together ``SPREAD_SHARE eps_T``, carved out of the threshold budget with the truncation
statistic's share (:func:`operators.error_stats.budgets`):

* from the holdout's histogram, with ``t = min(v, theta)`` (quantized units): ``sum t`` (sample 0, at ``theta /
  eps_1``) and ``sum t^2`` (sample 1, at ``theta^2 / eps_2``), a changed reading moving them by at most ``theta``
  and ``theta^2``; ``eps_1 = SPREAD_SHARE eps_T / 8``, ``eps_2 = 3 SPREAD_SHARE eps_T / 8``. They give the
  per-reading variance ``sigma^2 = sum t^2 / m - (sum t / m)^2``, heavy tails included;
* from the holdout's block statistics (:class:`operators.selection.BlockStats`, calibrated selection only), for up
  to ``MAX_WIDTHS`` block widths ``v = b, b^2, ...`` below a leaf, the mean ``|S_v,k - S_v,k-1|`` of consecutive
  block sums of readings truncated at the largest cap ``2^k <= theta`` (sample ``2 + i``, rounded to 1/1024, at
  ``(2 cap / pairs) / eps_v``: a changed reading moves one block sum by at most ``cap``, which enters two
  differences), ``eps_v = SPREAD_SHARE eps_T / (2 widths)``. They give ``D(v) = (pi / 2) E|dS_v|^2`` (a normal
  ``dS``): the correlated variation at that scale (a daily cycle inside a leaf), which ``sigma^2`` treats as white.

A consumer takes the structure function ``D(j) = E[(S_j,k - S_j,k-1)^2]`` at ``j`` ticks as the larger of the white
part and the blocks' curve (:meth:`Spread.structure`)::

    D(j) = max(2 j sigma^2, log-log interpolation of (v, D(v)) and the leaves' own (w, D(w)))              (S1)

with ``D(w)`` measured on the releases; without block widths the curve is ``2 j sigma^2 + max(0, D(w) - 2 w
sigma^2) (j / w)^2`` (white noise and a smooth drift).

>>> sp = Spread(holdout=100, total=500.0, total_variance=0.0, squares=2900.0, squares_variance=0.0)
>>> sp.variance                   # 29 - 5^2
4.0
>>> sp.structure(10, leaf_ticks=100, leaf_d=1800.0)      # 2 * 10 * 4 + (1800 - 800) * (10 / 100)^2
90.0
>>> sp = Spread(100, 500.0, 0.0, 2900.0, 0.0, widths=(4,), mean_abs=(40.0,), abs_variance=(0.0,))
>>> round(sp.structure(4, leaf_ticks=100, leaf_d=1e5))   # the block at 4 ticks: (pi / 2) 40^2, above 2 * 4 * 4
2513
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from operators.noise import Domain, KeyedGenerator, shared_laplace

__all__ = ["MAX_WIDTHS", "SPREAD_SHARE", "Spread", "measured_widths", "noisy_spread",
           "noisy_spread_table", "spread_status", "truncated_moments"]

SPREAD_SHARE = 0.12  # of the threshold budget eps_T
MAX_WIDTHS = 3  # block widths b, b^2, b^3 below a leaf
_ADDRESS = 2
_STEPS = 1024.0
_SCALE_MAX = 2.0**36  # the exact sampler's largest scale


def truncated_moments(hist: np.ndarray, candidates: np.ndarray, theta_units: int) -> tuple[int, int]:
    """``(sum t, sum t^2)`` of the holdout's readings truncated at theta (exact: private), from its histogram over the
    candidates (a cell's readings taken at its value, as :func:`operators.truncation.excess_counts` does)."""
    hist = np.asarray(hist, dtype=np.int64)[: len(candidates)]
    cells = np.flatnonzero(hist)
    t = np.minimum(np.asarray(candidates, dtype=np.int64)[cells], theta_units).tolist()
    n = hist[cells].tolist()
    return sum(a * b for a, b in zip(n, t, strict=True)), sum(a * b * b for a, b in zip(n, t, strict=True))


def measured_widths(widths: tuple[int, ...], pairs: np.ndarray, leaf_ticks: int) -> list[int]:
    """The indexes of the block widths below a leaf that the holdout measured (at least one pair), at most
    ``MAX_WIDTHS`` of the finest."""
    return [i for i, v in enumerate(widths) if v < leaf_ticks and int(pairs[i]) >= 1][:MAX_WIDTHS]


def noisy_spread(moments: tuple[int, int], blocks: Any, *, theta_units: int, leaf_ticks: int, gen: KeyedGenerator,
                 epsilon: float) -> list[float] | None:
    """The statistic's numbers (units): ``[sum t, its noise variance, sum t^2, its noise variance, then width, mean
    |dS|, its noise variance for each block width]``, ``epsilon``-DP together; None when the squares' noise would be
    beyond the sampler's range (``theta^2 / eps_2 > 2^36``)."""
    e1, e2 = epsilon / 8.0, 3.0 * epsilon / 8.0
    if theta_units * theta_units / e2 > _SCALE_MAX:
        return None
    domain = int(Domain.TRUNCATION) << 16
    n1, n2 = shared_laplace(e1, theta_units), shared_laplace(e2, theta_units * theta_units)
    out = [float(moments[0] + gen.discrete_laplace_one(domain, _ADDRESS, 0, n1)), n1.variance,
           float(moments[1] + gen.discrete_laplace_one(domain, _ADDRESS, 1, n2)), n2.variance]
    which = measured_widths(blocks.widths, blocks.pairs, leaf_ticks) if blocks is not None else []
    if not which:
        return out
    caps = np.asarray(blocks.caps)
    k = max(0, int(np.searchsorted(caps, theta_units, side="right")) - 1)  # the largest cap <= theta
    cap = int(caps[k])
    eps_each = epsilon / 2.0 / len(which)
    for i in which:
        pairs = int(blocks.pairs[i])
        sens = math.ceil(2.0 * cap / pairs * _STEPS + 1.0)
        if sens / eps_each > _SCALE_MAX:
            continue
        dl = shared_laplace(eps_each, sens)
        z = gen.discrete_laplace_one(domain, _ADDRESS, 2 + i, dl)
        out += [float(blocks.widths[i]), (round(float(blocks.acc[i, k]) / pairs * _STEPS) + z) / _STEPS,
                dl.variance / _STEPS**2]
    return out


def noisy_spread_table(sums: np.ndarray, squares: np.ndarray, keys: np.ndarray, *, theta_units: list[int] | np.ndarray,
                       epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`noisy_spread` without block widths for many streams (their exact sums and sums of squares, their key
    rows, their thetas), each draw made for all at once: one float64 table, a row ``[sum, its variance, squares,
    their variance]`` per stream (the same numbers), and the mask of the streams measured (the others' rows are
    zeros)."""
    from operators.noise import KeyRows, discrete_laplace_one_many

    e1, e2 = epsilon / 8.0, 3.0 * epsilon / 8.0
    thetas = np.asarray(theta_units, dtype=np.int64)
    measured = thetas.astype(np.float64) ** 2 / e2 <= _SCALE_MAX
    table = np.zeros((len(thetas), 4), dtype=np.float64)
    ok = np.flatnonzero(measured)
    if not ok.size:
        return table, measured
    distinct, which = np.unique(thetas[ok], return_inverse=True)
    n1 = [shared_laplace(e1, t) for t in distinct.tolist()]
    n2 = [shared_laplace(e2, t * t) for t in distinct.tolist()]
    domain = int(Domain.TRUNCATION) << 16
    gens = KeyRows(np.asarray(keys)[ok])
    z1 = np.asarray(discrete_laplace_one_many(gens, domain, _ADDRESS, 0, n1, which), dtype=np.int64)
    z2 = np.asarray(discrete_laplace_one_many(gens, domain, _ADDRESS, 1, n2, which), dtype=np.int64)
    table[ok, 0] = (np.asarray(sums, dtype=np.int64)[ok] + z1).astype(np.float64)
    table[ok, 1] = np.array([dl.variance for dl in n1])[which]
    table[ok, 2] = (np.asarray(squares, dtype=np.int64)[ok] + z2).astype(np.float64)
    table[ok, 3] = np.array([dl.variance for dl in n2])[which]
    return table, measured


def spread_status(noisy: list[float] | None, *, resolution: float, holdout: int) -> dict[str, Any] | None:
    """The statistic as a stream's status states it (value units), None when it was not measured."""
    if noisy is None:
        return None
    total, v1, squares, v2 = noisy[:4]
    blocks = noisy[4:]
    return {"holdout": holdout, "sum": total * resolution, "sum_variance": v1 * resolution**2,
            "squares": squares * resolution**2, "squares_variance": v2 * resolution**4,
            "widths": [int(w) for w in blocks[0::3]], "mean_abs": [a * resolution for a in blocks[1::3]],
            "abs_variance": [n * resolution**2 for n in blocks[2::3]]}


def _real(x: Any) -> bool:
    return type(x) in (int, float) and math.isfinite(x)


@dataclass(frozen=True)
class Spread:
    """The spread statistic as a consumer reads it (value units): the noisy sum and sum of squares of the holdout's
    ``holdout`` readings truncated at theta, with their noise's variances; and for each block width (ticks), the
    noisy mean ``|dS|`` of consecutive block sums, with its noise's variance."""

    holdout: int
    total: float
    total_variance: float
    squares: float
    squares_variance: float
    widths: tuple[int, ...] = ()
    mean_abs: tuple[float, ...] = ()
    abs_variance: tuple[float, ...] = ()

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
        w, a, n = d.get("widths", []), d.get("mean_abs", []), d.get("abs_variance", [])
        if not (isinstance(w, list) and isinstance(a, list) and isinstance(n, list) and len(w) == len(a) == len(n)
                and len(w) <= 64):
            raise ValueError("spread widths, mean_abs and abs_variance must be lists of one length")
        if not all(type(x) is int and 2 <= x < 1 << 62 for x in w) or any(y <= x for x, y in pairwise(w)):
            raise ValueError("spread widths must be increasing integers >= 2")
        if not all(_real(x) for x in a) or not all(_real(x) and x >= 0 for x in n):
            raise ValueError("spread mean_abs must be numbers, abs_variance numbers >= 0")
        return cls(m, float(d["sum"]), float(d["sum_variance"]), float(d["squares"]), float(d["squares_variance"]),
                   tuple(w), tuple(float(x) for x in a), tuple(float(x) for x in n))

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

    def points(self, leaf_ticks: int) -> list[tuple[int, float]]:
        """``(v, D(v))`` for the block widths below a leaf measured above their noise: ``D(v) = (pi / 2) (E|dS_v|^2 -
        its noise variance)``."""
        out = []
        for v, a, n in zip(self.widths, self.mean_abs, self.abs_variance, strict=True):
            d = math.pi / 2.0 * (a * a - n)
            if v < leaf_ticks and d > 0:
                out.append((v, d))
        return out

    def structure(self, j: float, *, leaf_ticks: int, leaf_d: float) -> float:
        """(S1): ``D(j)`` for ``1 <= j <= leaf_ticks`` from ``sigma^2``, the block widths and the leaf's own
        ``D(w)``."""
        white = 2.0 * self.variance
        pts = self.points(leaf_ticks)
        if not pts:
            return white * j + max(0.0, leaf_d - white * leaf_ticks) * (j / leaf_ticks) ** 2
        if leaf_d > 0:
            pts.append((leaf_ticks, leaf_d))
        x = np.log([p[0] for p in pts])
        y = np.log([p[1] for p in pts])
        lj = math.log(max(j, 1.0))
        curve = math.exp(y[0] + (lj - x[0])) if lj <= x[0] else math.exp(float(np.interp(lj, x, y)))
        return max(white * j, curve)

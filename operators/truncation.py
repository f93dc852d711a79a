"""What truncation at theta takes from a range sum, measured privately on the holdout.

ToPS releases estimate the sum of the readings truncated at theta (Wang et al., Continuous Release of Data Streams
under both Centralized and Local Differential Privacy, CCS 2021, Algorithm 1, "Truncate"): a range of
``L`` ticks loses ``E = sum_t (v_t - theta)+``, one-sided and growing with ``L``, and nothing in the releases says
how much. This module measures it where theta is chosen, on the holdout, as a DP output of its own. With ``x = v -
theta`` a holdout reading's excess (quantized units, at most ``top = B - theta``):

* the excess sum ``sum_i x_i+`` with exact discrete Laplace noise at ``top / eps_s`` (a changed reading moves it by
  at most ``top``);
* the readings above theta counted by excess in bins ``[e_j, e_{j+1})``: one unit wide up to 8 units, then about
  sqrt(2) apart, the last one ending at ``top`` (:func:`excess_edges`; ``O(log B)`` bins), each count with exact
  discrete Laplace noise at ``2 / eps_h`` (a changed reading leaves at most one bin and enters at most one: an L1
  sensitivity of 2 under the stream's neighbouring relation);
* all from the stream's keyed generator (domain ``TRUNCATION``: address 0 the counts, address 1 the sum), at
  ``eps_s = eps_h = TRUNCATION_SHARE * eps_T / 2``, carved out of the threshold budget
  (:func:`operators.error_stats.budgets`: the holdout's outputs together stay ``eps_T``-DP).

What a consumer derives (post-processing, :class:`Truncation`), with ``m`` the holdout's length::

    tau = (sum x_i+ + noise) / m                               expected excess per tick (unbiased)      (T1)
    Var[tau_hat] = Var[noise] / m^2 + var_e / m                 the sum's noise, the holdout's sample    (T2)
    per-tick excess: x_j with probability c_j / m               its shape, for short ranges              (T3)

``x_j`` is the mean of bin j's excesses; the counts ``c_j`` of (T3) are pooled from the top bin down until a pool's
noisy count is 3 standard deviations of its noise (a bin that is on its own is kept alone, and the pool above it,
and any left at the end, dropped: noise alone), and ``var_e`` is the
variance of (T3). A range of ``L`` ticks then loses ``L tau`` on average, with variance ``L var_e + L^2
Var[tau_hat]`` (:mod:`operators.error_bar` makes it the upper part of an interval). The holdout stands for the ticks
after it: a stream whose share of readings above theta changes after its holdout gets a term for the holdout's rate,
not its own. The sum's noise is about ``1.4 (B - theta) / (eps_s m)`` per tick: a loose bound B or a short holdout
make the upper end of a long range's interval wide.

>>> edges = excess_edges(40)
>>> edges.tolist()
[1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 18, 25, 35, 41]
>>> hist = np.zeros(51, dtype=np.int64); hist[[9, 11, 29]] = [90, 7, 3]   # values 10, 12, 30 (candidates 1..50)
>>> counts, total = excess_counts(hist, np.arange(1, 51), theta_units=11, bound_units=50)
>>> counts.tolist(), total                                                 # excesses 1 (7 readings) and 19 (3)
([7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0], 64)
>>> t = Truncation(edges=(1.0, 2.0, 20.0), counts=(70, 30), count_variance=1.0, excess_sum=390.0,
...                sum_variance=0.0, holdout=1000, step=1.0)
>>> t.tau                                                                  # 390 / 1000
0.39
>>> t.shape()[1].tolist()                                                  # both bins well above their noise
[0.07, 0.03]
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise
from typing import Any

import numpy as np

from operators.noise import DiscreteLaplace, Domain, KeyedGenerator, shared_laplace

__all__ = [
    "TRUNCATION_SHARE",
    "Truncation",
    "excess_counts",
    "excess_edges",
    "noisy_statistic",
    "noisy_statistics_table",
    "public_frame",
    "truncation_status",
]

TRUNCATION_SHARE = 0.12  # of the threshold budget eps_T
UNIT_BINS = 8  # excesses 1..8 units each have a bin of their own
_RATIO = math.sqrt(2.0)
COUNT_SENSITIVITY = 2  # a changed reading: one count down, one up
POOL_SIGNIFICANCE = 3.0  # a pool of bins counts in the shape once its noisy count is this many noise sds
_COUNTS, _SUM = 0, 1  # the addresses of the two draws
_MAX_BINS = 4096
_NO_EDGES = np.zeros(0, dtype=np.int64)
_NO_EDGES.flags.writeable = False


@functools.lru_cache(maxsize=4096)
def excess_edges(top: int) -> np.ndarray:
    """The bins' edges in units: ``e_0 = 1 < ... < e_n = top + 1``, bin ``j`` holding the excesses
    ``e_j <= x < e_{j+1}`` (one unit wide up to 8, then about sqrt(2) apart). ``top = B - theta`` in units, the largest
    excess a reading clamped to B can have; no bin when ``top < 1`` (theta = B truncates nothing)."""
    if top < 1:
        return _NO_EDGES
    edges = list(range(1, min(top, UNIT_BINS) + 2))
    while edges[-1] <= top:
        edges.append(max(edges[-1] + 1, round(edges[-1] * _RATIO)))
    edges[-1] = top + 1
    out = np.asarray(edges, dtype=np.int64)
    out.flags.writeable = False  # shared by every stream of this theta
    return out


def excess_counts(hist: np.ndarray, candidates: np.ndarray, *, theta_units: int, bound_units: int
                  ) -> tuple[np.ndarray, int]:
    """The holdout's readings above theta by excess bin, and their excess sum (exact: private), from the holdout
    histogram over the candidate thresholds (cell ``k`` holds the readings in ``(candidates[k-1], candidates[k]]``,
    taken as ``candidates[k]``: exact on the grid's integer run, at most a cell's width (0.1 %, or 3 % on the compact
    grid) above the reading beyond it)."""
    edges = excess_edges(bound_units - theta_units)
    out = np.zeros(max(0, edges.size - 1), dtype=np.int64)
    if not out.size:
        return out, 0
    hist = np.asarray(hist, dtype=np.int64)[: len(candidates)]
    cells = np.flatnonzero(hist)
    excess = np.minimum(np.asarray(candidates, dtype=np.int64)[cells] - theta_units, edges[-1] - 1)
    above = excess >= 1
    n = hist[cells[above]]
    np.add.at(out, np.searchsorted(edges, excess[above], side="right") - 1, n)
    return out, int(sum(int(a) * int(b) for a, b in zip(n.tolist(), excess[above].tolist(), strict=True)))


def count_noise(epsilon: float) -> DiscreteLaplace:
    """The noise of each count: exact discrete Laplace at ``2 / eps_h``."""
    return shared_laplace(epsilon / 2.0, COUNT_SENSITIVITY)


def histogram_measured(epsilon: float, holdout: int) -> bool:
    """Whether a holdout is long enough for its excess histogram: a bin is kept once its count is
    ``POOL_SIGNIFICANCE`` noise sds, so a holdout of fewer readings would measure noise alone. Without it the sum takes
    the whole budget ``eps_x`` (public: from the budget and the holdout's length only)."""
    return holdout >= POOL_SIGNIFICANCE * math.sqrt(count_noise(epsilon).variance)


def sum_noise(epsilon: float, top: int, histogram: bool = True) -> DiscreteLaplace:
    """The noise of the excess sum: exact discrete Laplace at ``top / eps_s`` (``eps_s = eps_x / 2`` beside the
    histogram, ``eps_x`` alone)."""
    return shared_laplace(epsilon / 2.0 if histogram else epsilon, top)


def sum_drawable(epsilon: float, top: int) -> bool:
    """Whether the excess sum's noise is within the exact sampler's range (scale ``top / eps_s <= 2^36``); beyond it
    the statistic is not measured (a bound B that large over its resolution leaves nothing to learn)."""
    return top / (epsilon / 2.0) <= 2.0**36


def noisy_statistic(counts: np.ndarray, total: int, gen: KeyedGenerator, epsilon: float, top: int,
                    holdout: int) -> bytes:
    """The excess sum and counts plus their noise (``epsilon``-DP together), as float64 bytes ``[sum, counts...]``
    (what a stream keeps: a few dozen numbers; the sum alone for a holdout too short for the histogram,
    :func:`histogram_measured`). Empty when nothing can be truncated (``top < 1``)."""
    n = len(counts)
    if not n or not sum_drawable(epsilon, top):
        return b""
    domain = int(Domain.TRUNCATION) << 16
    histogram = histogram_measured(epsilon, holdout)
    z = gen.discrete_laplace_one(domain, _SUM, 0, sum_noise(epsilon, top, histogram))
    if not histogram:
        return pack_statistic(total + z, np.zeros(0, dtype=np.int64))
    noise = gen.discrete_laplace(domain, _COUNTS, 0, n, count_noise(epsilon))
    return pack_statistic(total + z, np.asarray(counts, dtype=np.int64) + noise)


def noisy_statistics_table(counts: np.ndarray, nbins: np.ndarray, totals: Any, keys: np.ndarray, epsilon: float,
                           tops: Any, holdout: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`noisy_statistic` of many streams (stream ``i``'s exact counts ``counts[i, :nbins[i]]`` and excess sum
    ``totals[i]``, its key row ``keys[i]``, its ``tops[i]``), each draw made for all streams at once (many holdouts
    ending in one processing step): one float64 table whose row ``i`` starts with stream ``i``'s ``sizes[i]`` numbers
    as :func:`pack_statistic` keeps them (the noisy sum, then its noisy counts; 0 numbers when nothing is
    measured)."""
    from operators.noise import KeyRows, discrete_laplace_one_many

    domain = int(Domain.TRUNCATION) << 16
    histogram = histogram_measured(epsilon, holdout)
    tops_arr = np.asarray(tops, dtype=np.int64)
    nbins = np.asarray(nbins, dtype=np.int64)
    drawable = np.array([sum_drawable(epsilon, t) for t in tops_arr.tolist()], dtype=bool)
    measured = (nbins > 0) & drawable
    sizes = np.where(measured, 1 + (nbins if histogram else 0), 0)
    table = np.zeros((len(nbins), 1 + (counts.shape[1] if histogram else 0)), dtype=np.float64)
    if histogram:
        noisy = np.array(counts, dtype=np.int64)
        drawn_bins = np.where(drawable, nbins, 0)
        dl = count_noise(epsilon)
        for j in range(int(drawn_bins.max(initial=0))):
            who = np.flatnonzero(drawn_bins > j)
            noisy[who, j] += np.asarray(discrete_laplace_one_many(KeyRows(keys[who]), domain, _COUNTS, j, [dl],
                                                                  np.zeros(who.size, np.int64)), dtype=np.int64)
        table[:, 1:] = noisy
    who = np.flatnonzero(measured)
    if who.size:
        distinct, which = np.unique(tops_arr[who], return_inverse=True)
        sums = discrete_laplace_one_many(KeyRows(keys[who]), domain, _SUM, 0,
                                         [sum_noise(epsilon, t, histogram) for t in distinct.tolist()], which)
        table[who, 0] = np.asarray(totals, dtype=np.int64)[who] + np.asarray(sums, dtype=np.int64)
    return table, sizes


def pack_statistic(total: int, counts: np.ndarray) -> bytes:
    """The noisy excess sum and counts as a stream keeps them (float64 bytes ``[sum, counts...]``)."""
    return np.concatenate([[float(total)], counts.astype(np.float64)]).astype("<f8").tobytes()


def truncation_status(noisy: bytes, *, theta_units: int, bound_units: int, resolution: float, epsilon: float,
                      holdout: int) -> dict[str, Any] | None:
    """The statistic as a stream's status states it (value units): the noisy ``excess_sum`` and the variance of its
    noise, the bins' ``edges`` with their noisy ``counts`` and the variance of each count's noise, the holdout's
    length and the budget the statistic took. None when nothing can be truncated (theta = B)."""
    if not noisy:
        return None
    values = np.frombuffer(noisy, dtype="<f8")
    histogram = values.size > 1
    sum_variance, edges, count_variance = public_frame(bound_units - theta_units, histogram, resolution, epsilon)
    return {"epsilon": epsilon, "holdout": holdout, "step": resolution,
            "excess_sum": float(values[0]) * resolution, "sum_variance": sum_variance, "edges": list(edges),
            "counts": [int(c) for c in values[1:].tolist()], "count_variance": count_variance}


@functools.lru_cache(maxsize=1 << 14)
def public_frame(top: int, histogram: bool, resolution: float, epsilon: float) -> tuple[float, tuple[float, ...],
                                                                                         float]:
    """What a status states besides the noisy numbers, the same for every stream of one ``top``: the sum's noise
    variance, the bins' edges (value units) and each count's noise variance."""
    edges = excess_edges(top) if histogram else _NO_EDGES
    return (sum_noise(epsilon, top, histogram).variance * resolution**2,
            tuple(float(e * resolution) for e in edges.tolist()), count_noise(epsilon).variance)


def _real(x: Any) -> bool:
    return type(x) in (int, float) and math.isfinite(x)


@dataclass(frozen=True)
class Truncation:
    """The truncation statistic as a consumer reads it (value units): the noisy ``excess_sum`` of the holdout's
    ``holdout`` readings (its noise of variance ``sum_variance``), and bins ``[edges[j], edges[j+1])`` of the excess
    with their noisy ``counts`` (each with noise of variance ``count_variance``), readings quantized to ``step``."""

    edges: tuple[float, ...]
    counts: tuple[int, ...]
    count_variance: float
    excess_sum: float
    sum_variance: float
    holdout: int
    step: float = 1.0

    @classmethod
    def from_status(cls, d: Any) -> Truncation:
        """From a status's ``truncation`` (any JSON: ``ValueError`` naming what is wrong, never a value)."""
        if not isinstance(d, dict):
            raise ValueError("truncation must be an object")
        edges, counts = d.get("edges"), d.get("counts")
        m, step = d.get("holdout"), d.get("step", 1.0)
        if not (isinstance(edges, list) and isinstance(counts, list) and len(counts) <= _MAX_BINS
                and (len(edges) == len(counts) + 1 or len(edges) == len(counts) == 0)):
            raise ValueError("truncation edges and counts must be lists, one more edge than counts (or none)")
        if not all(_real(e) and e > 0 for e in edges) or any(b <= a for a, b in pairwise(edges)):
            raise ValueError("truncation edges must be positive, finite and increasing")
        if not all(type(c) is int and abs(c) < 1 << 53 for c in counts):
            raise ValueError("truncation counts must be integers")
        if not (type(m) is int and 1 <= m < 1 << 53):
            raise ValueError("truncation holdout must be a positive integer")
        for name in ("count_variance", "sum_variance"):
            if not (_real(d.get(name)) and d[name] >= 0):
                raise ValueError(f"truncation {name} must be a number >= 0")
        if not _real(d.get("excess_sum")):
            raise ValueError("truncation excess_sum must be a number")
        if not (_real(step) and step > 0):
            raise ValueError("truncation step must be a positive number")
        return cls(tuple(float(e) for e in edges), tuple(counts), float(d["count_variance"]), float(d["excess_sum"]),
                   float(d["sum_variance"]), m, float(step))

    @cached_property
    def values(self) -> np.ndarray:
        """``x_j``: the mean of the bin's excesses (value units; the bin holds the steps ``e_j .. e_{j+1} - step``)."""
        e = np.asarray(self.edges, dtype=np.float64)
        return (e[:-1] + e[1:] - self.step) / 2.0 if e.size else np.zeros(0)

    @property
    def tau(self) -> float:
        """(T1): the expected excess per tick (the noisy sum as it is: unbiased)."""
        return self.excess_sum / self.holdout

    @cached_property
    def _shape(self) -> tuple[np.ndarray, np.ndarray]:
        return self._pooled()

    def shape(self) -> tuple[np.ndarray, np.ndarray]:
        """(T3): the per-tick excess's values and probabilities (:meth:`_pooled`; computed once)."""
        return self._shape

    def _pooled(self) -> tuple[np.ndarray, np.ndarray]:
        """(T3): the per-tick excess's values and probabilities: a bin whose noisy count reaches
        ``POOL_SIGNIFICANCE`` standard deviations of its noise is kept alone; the others are pooled from the top bin
        down, a pool kept once its noisy count reaches that many standard deviations of its noise (spread over its
        bins by their counts above 0); a pool that never does (above a bin kept alone, or at the end) is dropped. The
        rest of the mass is at 0."""
        c = np.asarray(self.counts, dtype=np.float64)
        p = np.zeros(c.size)
        sd = math.sqrt(self.count_variance)
        pool: list[int] = []
        for j in range(c.size - 1, -1, -1):
            if c[j] >= POOL_SIGNIFICANCE * sd:  # a bin above its noise on its own: the pool above it was noise
                p[j], pool = c[j], []
                continue
            pool.append(j)
            total = float(c[pool].sum())
            if total > 0 and total >= POOL_SIGNIFICANCE * sd * math.sqrt(len(pool)):
                weights = np.maximum(c[pool], 0.0)
                p[pool] = total * weights / weights.sum()
                pool = []
        p /= self.holdout
        if p.sum() > 1.0:
            p /= p.sum()
        return self.values, p

    @cached_property
    def per_tick_variance(self) -> float:
        """``var_e``: the variance of one tick's excess under (T3)."""
        x, p = self.shape()
        mean = float(p @ x)
        return max(0.0, float(p @ (x * x)) - mean * mean)

    @property
    def tau_noise_variance(self) -> float:
        """The part of (T2) from the sum's noise (a discrete Laplace): ``Var[noise] / m^2``."""
        return self.sum_variance / self.holdout**2

    @property
    def tau_variance(self) -> float:
        """(T2): the variance of ``tau_hat`` as an estimate of a tick's expected excess."""
        return self.tau_noise_variance + self.per_tick_variance / self.holdout

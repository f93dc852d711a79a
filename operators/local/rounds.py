"""The threshold phase of local mode in rounds that zoom in on the data, and out again when they clamp it.

Square Wave's window is ``b U`` wide on each side of a reading (b from Eq. 16: 0.26 at eps 1, 0.44 at eps 0.2)
whatever the data, so when the domain ``[0, U]`` dwarfs the readings every report is mostly noise, and unsmoothed EM
fits that noise with small spikes scattered over the domain (about 1 % of the mass in all, at every eps). Eq. 8
weighs mass by its distance above theta, so that 1 % placed up to ``U`` pulls theta towards ``U``: the overshoot of
the one-round threshold phase (DNS at eps 0.4: theta up to 69 where the true density's is 9).

So the holdout is reported in rounds. At the end of each of the first three eighths, the density estimated (EM,
without SW-W) from the current round's reports decides the domain of the next reports:

* **zoom in** (after the first two eighths only): to the data's scale ``S = min(8 m, m + 16 (q75 - q25))`` (``m``
  the estimate's median, ``q`` its quartiles; never below a domain the rounds had to grow to) when ``S`` is below
  half the domain and Square Wave's window ``b U`` is wider than ``S`` (or the domain was already zoomed). The
  median and quartiles of an estimate from a few thousand reports are stable where its upper quantiles are not:
  over ``[0, 500]`` at eps 0.2 DNS's estimated median lies in 4-21 (true 2) on 20 keys, its 95 % point in 23-474;
* **grow** (after any of the three, when zoomed): by 4, and at least back to the domain before the last zoom (at
  most to ``B``), when the reports show significantly more
  than 5 % of the readings clamped at the top (the band estimate of
  :func:`operators.local.square_wave.tail_moment_from_counts` above the middle of the domain exceeds
  ``0.05 min(1/2, 2b)`` by two standard errors): a stream whose median is 0 (mostly idle) zooms to a few
  resolution steps and must come back out.

Devices clamp to the domain named by the control message: a smaller or larger domain, the same epsilon, one report
per reading as before. Reports made over an older domain are not counted any more; where the domain does not change
the rounds are one and the counts add up (the result is then exactly the one-round result). theta comes from the
last round's reports over its domain (:func:`estimate_over`): in a zoomed domain from EM without SW-W (the domain,
a few times the data's scale, is what bounds theta: SW-W's cut there also drops real thin tails, a meter's spikes
at eps 0.4, and costs more than it saves), over ``[0, B]`` with SW-W guarded by the reports
(:func:`operators.local.threshold.shown_tail`).

Replay (:class:`operators.topl.ToPL`) and the daemon's server half (:class:`operators.topl_server.LocalServer`)
both keep one :class:`HoldoutRounds`, so they change domain at the same reports to the same domains.

>>> from operators.topl import ToPLConfig
>>> r = HoldoutRounds(ToPLConfig(epsilon=1.0, bound=100.0, holdout=800))
>>> r.boundaries, r.room(), r.domain
([100, 200, 300], 100, 100.0)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from operators.local.square_wave import (
    square_wave_em,
    square_wave_histogram,
    square_wave_parameters,
    tail_moment_from_counts,
)
from operators.local.threshold import ThresholdEstimate, threshold_from_reports

if TYPE_CHECKING:
    from operators.topl import ToPLConfig

__all__ = [
    "CLAMPED_SHARE",
    "GROW_FACTOR",
    "ROUND_ENDS",
    "ZOOM_MEDIANS",
    "ZOOM_ROUNDS",
    "ZOOM_SPREADS",
    "HoldoutRounds",
    "clamped_share_shown",
    "data_scale",
    "estimate_over",
]

ROUND_ENDS = (0.125, 0.25, 0.375)  # fractions of the holdout after which the domain may change
ZOOM_ROUNDS = 2  # the domain may shrink after the first two of them, and grow after any
ZOOM_MEDIANS = 8.0  # the data's scale: at most this many medians ...
ZOOM_SPREADS = 16.0  # ... and at most the median plus this many interquartile ranges
CLAMPED_SHARE = 0.05  # grow when significantly more than this share of the readings sits at the top
GROW_FACTOR = 4.0
ZOOMED_CUT_WITHIN = 0.25  # in a zoomed domain SW-W cuts only in its lowest quarter
_SIGNIFICANCE = 2.0
_MIN_HOLDOUT = 64  # below this the holdout is one round


def _buckets_over(config: ToPLConfig, domain: float) -> int:
    """Density buckets over ``[0, domain]``: as over ``[0, B]``, or one per resolution step in a zoomed domain."""
    if domain < config.bound and config.resolution is not None:
        return max(2, min(config.buckets, math.ceil(domain / config.resolution - 1e-9)))
    return config.density_buckets if domain >= config.bound else config.buckets


def estimate_over(config: ToPLConfig, counts: Any, domain: float) -> ThresholdEstimate:
    """Density and theta from SW report counts made over ``[0, domain]`` (``config``'s buckets and budgets): EM,
    then SW-W guarded by the reports over ``[0, B]`` and nothing in a zoomed domain (see the module text)."""
    return threshold_from_reports(
        None,
        domain,
        threshold_epsilon=config.threshold_budget,
        epsilon=config.epsilon,
        query_range=config.query_range,
        buckets=_buckets_over(config, domain),
        report_buckets=config.buckets,
        b=square_wave_parameters(config.threshold_budget)[0],
        prune=config.prune,
        counts=counts,
        cut_within=1.0 if domain >= config.bound else ZOOMED_CUT_WITHIN,
    )


def data_scale(density: Any, domain: float) -> float:
    """``min(8 m, m + 16 (q75 - q25))`` of a density over equal buckets of ``[0, domain]``: a domain holding the bulk
    and a tail several times its width. Each quantile is interpolated linearly inside the bucket holding it (the
    density taken as uniform within a bucket), so that the scale moves with the estimate instead of jumping by eight
    buckets when the median crosses a bucket's edge (on integer readings in unit buckets the median sits on an edge).

    >>> f = np.zeros(100); f[[1, 2, 3, 4]] = [0.4, 0.35, 0.15, 0.1]      # DNS-like, buckets of 1
    >>> round(data_scale(f, 100.0), 2)                                   # m = 2 + 0.1/0.35; 8 m
    18.29
    >>> g = np.zeros(100); g[[54, 55, 56]] = [0.3, 0.4, 0.3]             # narrow, far from 0
    >>> round(data_scale(g, 100.0), 2)                                   # 55.5 + 16 x (56.17 - 54.83)
    76.83
    """
    f = np.asarray(density, dtype=np.float64)
    f = f / f.sum()
    cdf = np.cumsum(f)
    width = float(domain) / f.size

    def quantile(level: float) -> float:
        i = min(int(np.searchsorted(cdf, level)), f.size - 1)
        inside = float((level - (cdf[i] - f[i])) / f[i]) if f[i] > 0 else 1.0
        return (i + min(max(inside, 0.0), 1.0)) * width

    median = quantile(0.5)
    return min(ZOOM_MEDIANS * median, median + ZOOM_SPREADS * (quantile(0.75) - quantile(0.25)))


def clamped_share_shown(counts: Any, epsilon: float, b: float | None = None) -> bool:
    """Do the SW report ``counts`` (over a domain ``[0, U]``) show significantly more than 5 % of the readings at
    its top? The band estimate of ``E[min((x - 1/2)+, 2b)]`` exceeds ``0.05 min(1/2, 2b)``, what 5 % of the
    readings at ``x = 1`` would give, by two standard errors."""
    b = square_wave_parameters(epsilon, b)[0]
    est, se = tail_moment_from_counts(counts, epsilon, 0.5, b)
    return est - _SIGNIFICANCE * se > CLAMPED_SHARE * min(0.5, 2.0 * b)


class HoldoutRounds:
    """Counts of the holdout's Square Wave reports (unit scale) for the current domain, and when it changes.

    ``zooms_done`` counts the round ends passed (each may or may not have changed the domain); ``floor`` is the
    smallest domain the rounds may zoom to (a domain they had to grow to); ``zoomed_from`` the domain before the
    last zoom (growing goes back at least to it)."""

    def __init__(self, config: ToPLConfig) -> None:
        self.config = config
        self.domain = float(config.bound)
        self.received = 0
        self.zooms_done = 0
        self.floor = 0.0
        self.zoomed_from = 0.0
        self.counts = np.zeros(config.buckets, dtype=np.int64)
        m = config.holdout_ticks
        self.boundaries = [math.ceil(f * m) for f in ROUND_ENDS] if config.refine and m >= _MIN_HOLDOUT else []
        self._b = square_wave_parameters(config.threshold_budget)[0]

    def room(self) -> int:
        """Reports that still belong to the current round (up to the next round end or the holdout's end)."""
        end = (self.boundaries[self.zooms_done] if self.zooms_done < len(self.boundaries)
               else self.config.holdout_ticks)
        return max(0, end - self.received)

    def add_unit(self, y: np.ndarray) -> bool:
        """Count unit-scale reports (at most :meth:`room` of them); True when the domain just changed."""
        y = np.asarray(y, dtype=np.float64)
        if y.size:
            self.counts += square_wave_histogram(y, self._b, self.config.buckets)
            self.received += int(y.size)
        changed = False
        while self.zooms_done < len(self.boundaries) and self.received >= self.boundaries[self.zooms_done]:
            self.zooms_done += 1
            new = self.next_domain()
            if new != self.domain:
                self.domain = new
                self.counts = np.zeros_like(self.counts)
                changed = True
        return changed

    def next_domain(self) -> float:
        """The domain of the next round, from the reports counted over the current one (see the module text)."""
        cfg, u = self.config, self.domain
        eps = cfg.threshold_budget
        if not self.counts.sum():
            return u
        if u < cfg.bound and clamped_share_shown(self.counts, eps, self._b):
            self.floor = min(float(cfg.bound), GROW_FACTOR * u)
            return self.floor
        if self.zooms_done > ZOOM_ROUNDS:
            return u
        density, _ = square_wave_em(self.counts, eps, _buckets_over(cfg, u), self._b)
        target = max(data_scale(density, u), self.floor)
        if cfg.resolution is not None:
            target = max(2.0 * cfg.resolution, math.ceil(target / cfg.resolution - 1e-9) * cfg.resolution)
        if target < u / 2 and (self._b * u > target or u < cfg.bound):
            self.zoomed_from = u
            return float(target)
        return u

    def estimate(self) -> ThresholdEstimate:
        return estimate_over(self.config, self.counts, self.domain)

    def to_dict(self) -> dict[str, Any]:
        return {"domain": self.domain, "received": self.received, "zooms_done": self.zooms_done,
                "floor": self.floor, "zoomed_from": self.zoomed_from, "counts": self.counts.tolist()}

    @classmethod
    def from_dict(cls, config: ToPLConfig, d: dict[str, Any]) -> HoldoutRounds:
        r = cls(config)
        counts = np.asarray(d["counts"], dtype=np.int64)
        domain, zooms = float(d["domain"]), int(d["zooms_done"])
        floor, zoomed_from = float(d.get("floor", 0.0)), float(d.get("zoomed_from", 0.0))
        if (counts.shape != (config.buckets,) or (counts < 0).any() or not 0 < domain <= config.bound
                or not 0.0 <= floor <= config.bound or not 0.0 <= zoomed_from <= config.bound):
            msg = "snapshot does not match the configuration (holdout rounds)"
            raise ValueError(msg)
        r.counts, r.domain, r.received = counts, domain, int(d["received"])
        r.zooms_done, r.floor, r.zoomed_from = min(zooms, len(r.boundaries)), floor, zoomed_from
        return r

    @classmethod
    def single(cls, config: ToPLConfig, counts: Any, received: int) -> HoldoutRounds:
        """Rounds continuing a snapshot made before rounds existed: one round over [0, B], no zoom any more."""
        r = cls(config)
        r.counts = np.asarray(counts, dtype=np.int64)
        r.received = received
        r.zooms_done = len(r.boundaries)
        return r

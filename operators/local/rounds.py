"""The threshold phase of local mode in rounds that zoom in on the data.

Square Wave's window is ``b B`` wide on each side of a reading (b from Eq. 16: 0.26 at eps 1, 0.45 at eps 0.2)
whatever the data, so when the public bound B dwarfs the readings every report is mostly noise and EM puts mass far
from the data, which Eq. 8 then chases (retail: B = 16,470, readings up to 76, theta 2-5x too high). So the holdout
is reported in rounds: after an eighth and after a quarter of it, the density estimated from the reports of the
current round gives the data's scale (:func:`operators.local.threshold.coarse_domain`: 8 x its 95 % point), and if
the window is wider than twice that scale, the following reports are Square Wave over ``[0, U]`` instead (the device
clamps to U: a smaller domain, the same epsilon, one report per reading as before). Reports made over an older
domain are then not counted any more; where no zoom happens the rounds are one and the counts simply add up (the
result is then exactly the one-round result). theta comes from the last round's reports over its domain, with
SW-W's level kept per reading unit as it was over ``[0, B]`` (a share of the mass per bucket would otherwise cut, in
the zoom's narrower buckets, a real tail that one round keeps).

Replay (:class:`operators.topl.ToPL`) and the daemon's server half (:class:`operators.topl_server.LocalServer`)
both keep one :class:`HoldoutRounds`, so they zoom at the same reports to the same domains.

>>> from operators.topl import ToPLConfig
>>> r = HoldoutRounds(ToPLConfig(epsilon=1.0, bound=100.0, holdout=800))
>>> r.boundaries, r.room(), r.domain
([100, 200], 100, 100.0)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from operators.local.square_wave import PRUNE_LEVEL, square_wave_histogram, square_wave_parameters
from operators.local.threshold import ThresholdEstimate, coarse_domain, threshold_from_reports

if TYPE_CHECKING:
    from operators.topl import ToPLConfig

__all__ = ["ZOOM_AT", "HoldoutRounds", "estimate_over"]

ZOOM_AT = (0.125, 0.25)  # fractions of the holdout after which the domain may shrink
_MIN_HOLDOUT = 64  # below this the holdout is one round


def estimate_over(config: ToPLConfig, counts: Any, domain: float) -> ThresholdEstimate:
    """Density and theta from SW report counts made over ``[0, domain]`` (``config``'s buckets and budgets)."""
    buckets, level = config.density_buckets, PRUNE_LEVEL
    if domain < config.bound:
        if config.resolution is not None:
            buckets = max(2, min(config.buckets, math.ceil(domain / config.resolution - 1e-9)))
        # SW-W's level is a share of the mass per bucket; keep it per reading unit as over [0, B], else a zoom to
        # narrower buckets cuts a real tail that one round keeps
        level = PRUNE_LEVEL * (domain / buckets) / (config.bound / config.density_buckets)
    return threshold_from_reports(
        None,
        domain,
        threshold_epsilon=config.threshold_budget,
        epsilon=config.epsilon,
        query_range=config.query_range,
        buckets=buckets,
        report_buckets=config.buckets,
        b=square_wave_parameters(config.threshold_budget)[0],
        prune=config.prune,
        counts=counts,
        prune_level=level,
    )


class HoldoutRounds:
    """Counts of the holdout's Square Wave reports (unit scale) for the current domain, and when to zoom."""

    def __init__(self, config: ToPLConfig) -> None:
        self.config = config
        self.domain = float(config.bound)
        self.received = 0
        self.zooms_done = 0
        self.counts = np.zeros(config.buckets, dtype=np.int64)
        m = config.holdout_ticks
        self.boundaries = [math.ceil(f * m) for f in ZOOM_AT] if config.refine and m >= _MIN_HOLDOUT else []
        self._b = square_wave_parameters(config.threshold_budget)[0]

    def room(self) -> int:
        """Reports that still belong to the current round (up to the next possible zoom or the holdout's end)."""
        end = (self.boundaries[self.zooms_done] if self.zooms_done < len(self.boundaries)
               else self.config.holdout_ticks)
        return max(0, end - self.received)

    def add_unit(self, y: np.ndarray) -> bool:
        """Count unit-scale reports (at most :meth:`room` of them); True when the domain just shrank."""
        y = np.asarray(y, dtype=np.float64)
        if y.size:
            self.counts += square_wave_histogram(y, self._b, self.config.buckets)
            self.received += int(y.size)
        changed = False
        while self.zooms_done < len(self.boundaries) and self.received >= self.boundaries[self.zooms_done]:
            self.zooms_done += 1
            est = estimate_over(self.config, self.counts, self.domain)
            # at high eps the unsmoothed estimate is spiky and SW-W can cut inside the bulk (a 95 % point below the
            # data): never zoom below 8x the median of the estimate without SW-W (robust to both)
            raw = estimate_over(self.config.replace(prune=False), self.counts, self.domain).estimate.density
            median = (int(np.searchsorted(np.cumsum(raw / raw.sum()), 0.5)) + 1) * self.domain / raw.size
            new = coarse_domain(est.estimate.density, self.domain, self.config.threshold_budget,
                                self.config.resolution, floor=8.0 * median)
            if new < self.domain:
                self.domain = new
                self.counts = np.zeros_like(self.counts)
                changed = True
        return changed

    def estimate(self) -> ThresholdEstimate:
        return estimate_over(self.config, self.counts, self.domain)

    def to_dict(self) -> dict[str, Any]:
        return {"domain": self.domain, "received": self.received, "zooms_done": self.zooms_done,
                "counts": self.counts.tolist()}

    @classmethod
    def from_dict(cls, config: ToPLConfig, d: dict[str, Any]) -> HoldoutRounds:
        r = cls(config)
        counts = np.asarray(d["counts"], dtype=np.int64)
        domain, zooms = float(d["domain"]), int(d["zooms_done"])
        if counts.shape != (config.buckets,) or (counts < 0).any() or not 0 < domain <= config.bound:
            msg = "snapshot does not match the configuration (holdout rounds)"
            raise ValueError(msg)
        r.counts, r.domain, r.received, r.zooms_done = counts, domain, int(d["received"]), min(zooms, 2)
        return r

    @classmethod
    def single(cls, config: ToPLConfig, counts: Any, received: int) -> HoldoutRounds:
        """Rounds continuing a snapshot made before rounds existed: one round over [0, B], no zoom any more."""
        r = cls(config)
        r.counts = np.asarray(counts, dtype=np.int64)
        r.received = received
        r.zooms_done = len(r.boundaries)
        return r

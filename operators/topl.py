"""ToPL (Wang et al., CCS 2021, Section 4): a whole local-DP stream simulated in one place, for ``tops replay --mode
local``.

Every tick is one device report. For the first ``m`` ticks (the holdout) the "device" clamps its reading to
``[0, B]`` and reports it with Square Wave at ``threshold_epsilon``; the server counts the reports, estimates the
density by EM with SW-W pruning and picks theta by Eq. 8 (:mod:`operators.local.threshold`). From then on the device
truncates its reading to ``[0, theta]`` and reports it with the Hybrid mechanism at ``epsilon``; the release of a
tick is that unbiased report (no smoother: Section 4.2). The daemon's local mode runs the same two halves apart: the
randomizers on the devices (:mod:`stream.device.client`), the estimation on the server.

Each tick's report is eps-LDP for the reading of that tick (``threshold_epsilon`` during the holdout, ``epsilon``
after). The simulated devices draw their uniforms from the stream key under ``Domain.LOCAL`` (address 1: SW, one
uniform per tick at position ``tick``; address 2: HM, two per tick at ``2 tick``), so a replay is reproducible and
independent of how the ticks are split into calls; real devices use their own random keys.

Examples
--------
>>> import numpy as np
>>> cfg = ToPLConfig(epsilon=1.0, bound=64.0, holdout=4096)
>>> topl = ToPL(cfg, key=bytes(32))
>>> values = np.arange(10_000) % 7.0                      # readings 0..6
>>> out = topl.process(values)
>>> topl.phase, topl.ticks, bool(np.isnan(out[:4096]).all())
('releasing', 10000, True)
>>> 4.0 <= topl.theta <= 64.0
True
>>> abs(float(out[4096:].mean()) - float(np.minimum(values[4096:], topl.theta).mean())) < 0.5
True
>>> again = ToPL.restore(cfg, bytes(32), topl.snapshot())
>>> again.theta == topl.theta and again.ticks == topl.ticks
True
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from operators.config import ConfigError, check_holdout, check_int_at_least, check_positive
from operators.local.hybrid import hybrid_report
from operators.local.rounds import HoldoutRounds
from operators.local.square_wave import (
    DensityEstimate,
    square_wave_parameters,
    square_wave_perturb,
)
from operators.local.threshold import ThresholdEstimate, threshold_from_reports
from operators.noise import Domain, KeyedGenerator

__all__ = [
    "LOCAL_ADDRESS_HYBRID",
    "LOCAL_ADDRESS_SQUARE_WAVE",
    "ToPL",
    "ToPLConfig",
    "choose_threshold",
]

LOCAL_ADDRESS_SQUARE_WAVE = 1  # Domain.LOCAL address of the SW uniforms (one per tick)
LOCAL_ADDRESS_HYBRID = 2  # Domain.LOCAL address of the HM uniforms (two per tick: select, mechanism)
_SNAPSHOT_VERSION = 2


@dataclass(frozen=True, slots=True)
class ToPLConfig:
    """Parameters of one ToPL stream (Wang et al., CCS 2021, Section 4).

    Parameters
    ----------
    epsilon
        LDP budget of each released tick's Hybrid report.
    bound
        Public upper bound B of a reading; larger readings are clamped to B (and counted).
    threshold_epsilon
        LDP budget of each holdout tick's Square Wave report (default: ``epsilon``). Holdout and released ticks
        are different readings, so each reading is protected at its own budget.
    holdout
        m, the number of first ticks whose SW reports choose theta; they are never released.
    query_range
        r of Eq. 8: the longest range query the stream is tuned for.
    buckets
        Report buckets of the SW histogram and at most this many density buckets / theta candidates (1024).
    resolution
        Readings are meaningful to multiples of this (1 for counts): the density and the theta candidates use
        ``min(buckets, ceil(B / resolution))`` buckets, so empty buckets between possible readings cannot look
        like the end of the distribution to SW-W. ``None``: always ``buckets``.
    theta
        A fixed public threshold: no holdout, every tick is released.
    prune
        Apply SW-W pruning to the density (Section 4.1). Off only for comparisons.
    refine
        Report the holdout in rounds that zoom in on the data when the bound dwarfs it
        (:mod:`operators.local.rounds`). Off: one round over ``[0, B]``.
    """

    epsilon: float
    bound: float
    threshold_epsilon: float | None = None
    holdout: int = 65536
    query_range: int = 1 << 20
    buckets: int = 1024
    resolution: float | None = 1.0
    theta: float | None = None
    prune: bool = True
    refine: bool = True

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        if self.epsilon >= 700:
            msg = f"epsilon must be below 700 (got {self.epsilon!r})"
            raise ConfigError(msg)
        check_positive("bound", self.bound)
        if self.threshold_epsilon is not None:
            check_positive("threshold_epsilon", self.threshold_epsilon)
            if self.threshold_epsilon >= 700:
                msg = f"threshold_epsilon must be below 700 (got {self.threshold_epsilon!r})"
                raise ConfigError(msg)
        check_holdout(self.holdout, self.theta)
        check_int_at_least("query_range", self.query_range, 1)
        check_int_at_least("buckets", self.buckets, 2)
        if self.buckets > 1 << 16:
            msg = f"buckets must be at most 65536 (got {self.buckets})"
            raise ConfigError(msg)
        if self.resolution is not None:
            check_positive("resolution", self.resolution)
            if self.bound / self.resolution < 2:
                msg = f"bound must be at least two resolution steps ({2 * self.resolution})"
                raise ConfigError(msg)
        if self.theta is not None:
            check_positive("theta", self.theta)
            if self.theta > self.bound:
                msg = f"theta must be at most bound ({self.bound}); got {self.theta}"
                raise ConfigError(msg)
        if not isinstance(self.prune, bool):
            msg = "prune must be true or false"
            raise ConfigError(msg)
        if not isinstance(self.refine, bool):
            msg = "refine must be true or false"
            raise ConfigError(msg)

    @property
    def threshold_budget(self) -> float:
        """The budget of the holdout's SW reports: ``threshold_epsilon``, else ``epsilon``."""
        return self.epsilon if self.threshold_epsilon is None else self.threshold_epsilon

    @property
    def density_buckets(self) -> int:
        """Buckets of the density estimate (= theta candidates): ``min(buckets, ceil(B / resolution))``."""
        if self.resolution is None:
            return self.buckets
        return max(2, min(self.buckets, math.ceil(self.bound / self.resolution - 1e-9)))

    @property
    def holdout_ticks(self) -> int:
        """Ticks held out for the threshold: m, or 0 when theta is fixed."""
        return 0 if self.theta is not None else self.holdout

    def replace(self, **changes: Any) -> ToPLConfig:
        """A copy with some parameters changed (checked again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The parameters as a plain dict (JSON-serialisable)."""
        return dataclasses.asdict(self)


def choose_threshold(config: ToPLConfig, reports: Any = None, counts: Any = None) -> ThresholdEstimate:
    """The server side of the holdout, as ToPL runs it: SW reports in reading units (or their ``counts`` over
    ``config.buckets`` report buckets) -> SW-W density over ``config.density_buckets`` buckets -> theta (Eq. 8).

    The daemon's local mode calls this with the holdout reports it received, so it picks theta exactly as
    ``tops replay --mode local`` does.
    """
    return threshold_from_reports(
        reports,
        config.bound,
        threshold_epsilon=config.threshold_budget,
        epsilon=config.epsilon,
        query_range=config.query_range,
        buckets=config.density_buckets,
        report_buckets=config.buckets,
        b=square_wave_parameters(config.threshold_budget)[0],
        prune=config.prune,
        counts=counts,
    )


class ToPL:
    """One stream's local-DP continual release, devices simulated from the stream key.

    ``process(values)`` takes a 1-D array of finite, non-negative readings (one per tick) and returns a float64
    array of the same length: NaN for holdout ticks, the unbiased Hybrid estimate of ``min(value, theta)`` for
    every other tick. ``snapshot()`` returns a JSON-serialisable dict without any secret (the holdout's state is
    a histogram of perturbed reports); ``ToPL.restore(config, key, snapshot)`` continues exactly where it left off.
    """

    def __init__(self, config: ToPLConfig, key: bytes) -> None:
        self.config = config
        self._gen = KeyedGenerator(key)
        self.theta: float | None = config.theta
        self.ticks = 0
        self.clamped = 0
        self.estimate: DensityEstimate | None = None
        self._sw_b = square_wave_parameters(config.threshold_budget)[0]
        self._rounds = HoldoutRounds(config)

    @property
    def domain(self) -> float:
        """The domain holdout reports are made over now: ``B``, or smaller once a round zoomed in."""
        return self._rounds.domain

    def __repr__(self) -> str:
        return f"ToPL(phase={self.phase!r}, ticks={self.ticks}, theta={self.theta!r})"

    @property
    def phase(self) -> str:
        """``holdout`` while SW reports are collected, then ``releasing``."""
        return "holdout" if self.theta is None else "releasing"

    @property
    def holdout_left(self) -> int:
        """Holdout ticks still to come before theta is known."""
        return max(0, self.config.holdout_ticks - self.ticks)

    @property
    def privacy(self) -> dict[str, Any]:
        """The guarantee, as data: each report is eps-LDP for the one reading it carries."""
        return {
            "model": "local",
            "unit": "one reading (one tick of one device)",
            "epsilon_holdout": self.config.threshold_budget if self.config.holdout_ticks else None,
            "epsilon_release": self.config.epsilon,
        }

    def process(self, values: Any) -> np.ndarray:
        """Report (and release) the next ticks; NaN for holdout ticks."""
        v = np.asarray(values, dtype=np.float64)
        if v.ndim != 1:
            msg = "values must be a 1-D array"
            raise ValueError(msg)
        if v.size and not np.isfinite(v).all():
            msg = "values must be finite"
            raise ValueError(msg)
        cfg = self.config
        self.clamped += int(((v > cfg.bound) | (v < 0)).sum())  # clamped to [0, B] as the device does, never dropped
        v = np.clip(v, 0.0, cfg.bound)
        out = np.full(v.size, np.nan)
        done = 0
        rounds = self._rounds
        while self.theta is None and done < v.size:
            k = min(v.size - done, rounds.room())
            if k:
                dom = rounds.domain
                u = self._gen.uniforms(Domain.LOCAL, LOCAL_ADDRESS_SQUARE_WAVE, self.ticks, k)
                rounds.add_unit(square_wave_perturb(np.minimum(v[done : done + k], dom) / dom,
                                                    cfg.threshold_budget, u, self._sw_b))
                self.ticks += k
                done += k
            if self.holdout_left == 0:
                self._choose_threshold()
            elif not k:
                break
        rest = v.size - done
        if rest:
            assert self.theta is not None
            u = self._gen.uniforms(Domain.LOCAL, LOCAL_ADDRESS_HYBRID, 2 * self.ticks, 2 * rest)
            out[done:] = hybrid_report(v[done:], self.theta, cfg.epsilon, u[0::2], u[1::2])
            self.ticks += rest
        return out

    def _choose_threshold(self) -> None:
        est = self._rounds.estimate()
        self.theta = est.theta
        self.estimate = est.estimate

    def snapshot(self) -> dict[str, Any]:
        """The state as a JSON-serialisable dict (no key, no reading: only counts of perturbed reports)."""
        return {
            "version": _SNAPSHOT_VERSION,
            "operator": "topl",
            "ticks": self.ticks,
            "clamped": self.clamped,
            "theta": self.theta,
            "rounds": self._rounds.to_dict(),
        }

    @classmethod
    def restore(cls, config: ToPLConfig, key: bytes, snapshot: dict[str, Any]) -> ToPL:
        """A ToPL continuing from ``snapshot`` (taken under the same config and key; a version-1 snapshot, from
        before the holdout had rounds, continues in one round over ``[0, B]``)."""
        if snapshot.get("version") not in (1, _SNAPSHOT_VERSION) or snapshot.get("operator") != "topl":
            msg = "not a ToPL snapshot of a supported version"
            raise ValueError(msg)
        ticks, theta = int(snapshot["ticks"]), snapshot["theta"]
        if config.theta is not None and theta != config.theta:
            msg = "snapshot does not match the configuration (theta)"
            raise ValueError(msg)
        if ticks < 0 or (theta is None) != (ticks < config.holdout_ticks):
            msg = "snapshot does not match the configuration (ticks)"
            raise ValueError(msg)
        if "rounds" in snapshot:
            rounds = HoldoutRounds.from_dict(config, snapshot["rounds"])
        else:
            counts = np.asarray(snapshot["sw_counts"], dtype=np.int64)
            if counts.shape != (config.buckets,) or (counts < 0).any():
                msg = "snapshot does not match the configuration (sw_counts)"
                raise ValueError(msg)
            rounds = HoldoutRounds.single(config, counts, min(ticks, config.holdout_ticks))
        topl = cls(config, key)
        topl.ticks = ticks
        topl.clamped = int(snapshot["clamped"])
        topl.theta = None if theta is None else float(theta)
        topl._rounds = rounds
        return topl

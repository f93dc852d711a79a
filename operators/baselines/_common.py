"""Shared parts of the baselines: noise addresses, quantization, the threshold phase and the two-phase operator.

Every baseline that truncates is a :class:`TwoPhase` operator: the first ``m`` ticks (the holdout) are never released
and choose theta privately (NM-E, Eq. 5-6; S-P or S-PAK, Appendices A-B; or a fixed public theta), then a *stream
phase* operator releases every later tick with that theta. The two phases see disjoint ticks, so their budgets
compose in parallel, as in ToPS.

Noise addresses: ``domain = (Domain.BASELINE << 16) | (method << 8) | purpose`` (``purpose`` is the tree layer, or
255 for a threshold draw); the address is the tree index (with the fan-out in bits 40 and up for the hierarchies).

>>> from operators.config import ToPSConfig
>>> op = TwoPhase(ToPSConfig(epsilon=1.0, bound=10, holdout=50, query_range=64), bytes(32), threshold="nm-e",
...               stream=lambda cfg, key: _Echo(cfg), stream_fanout=2)
>>> rel = op.process(np.full(80, 4.0))
>>> bool(np.isnan(rel[:50]).all()), op.theta >= 4, rel[50:53].tolist()  # _Echo releases the truncated value
(True, True, [4.0, 4.0, 4.0])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from operators.config import ToPSConfig
from operators.noise import Domain, KeyedGenerator
from operators.permute_and_flip import keyed_permute_and_flip
from operators.threshold import candidate_grid, holdout_histogram, m_theta, score_bound, scores

__all__ = [
    "METHOD_CODES",
    "THRESHOLDS",
    "StreamOperator",
    "TwoPhase",
    "baseline_domain",
    "quantize",
]

THRESHOLDS = ("nm-e", "s-p", "s-pak")

# one code per noise consumer, so that no two baselines ever share a keystream
METHOD_CODES = {
    "nm-e": 1,
    "s-p": 2,
    "s-pak": 3,
    "hierarchy": 4,
    "flat": 5,
    "counter": 6,
    "audit": 7,
}
THRESHOLD_PURPOSE = 255


def baseline_domain(method: str, purpose: int = 0) -> int:
    """The 32-bit noise domain of ``method`` (a key of :data:`METHOD_CODES`) for ``purpose`` (layer, or 255)."""
    if not 0 <= purpose < 256:
        msg = "purpose must be in [0, 256)"
        raise ValueError(msg)
    return (int(Domain.BASELINE) << 16) | (METHOD_CODES[method] << 8) | purpose


def quantize(values: np.ndarray, config: ToPSConfig) -> tuple[np.ndarray, int]:
    """Values clamped to [0, B] and rounded to the resolution grid, as ToPS does; also the number clamped (a
    negative reading is clamped to 0, never dropped: the baselines take no ``lower``, the daemon refuses one)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    bound_units = math.floor(config.bound / config.resolution + 1e-9)
    out = (values > config.bound) | (values < 0)
    n_out = int(np.count_nonzero(out))
    if n_out:
        values = np.clip(values, 0.0, config.bound)
    units = np.rint(values / config.resolution).astype(np.int64)
    return np.clip(units, 0, bound_units), n_out


class StreamOperator(Protocol):
    """What a stream phase offers: one release per tick (in value units)."""

    def process(self, values: Any) -> np.ndarray: ...


class _Echo:
    """A stream phase that releases the truncated value itself (no noise): for doctests and unit tests only."""

    def __init__(self, config: ToPSConfig) -> None:
        self.config = config

    def process(self, values: Any) -> np.ndarray:
        v = np.asarray(values, dtype=np.float64)
        return np.minimum(np.rint(v / self.config.resolution), round(self.config.theta / self.config.resolution))


class TwoPhase:
    """A holdout-then-release operator: a private threshold on the first ``m`` ticks, then ``stream`` on the rest.

    Parameters
    ----------
    config
        The stream's parameters; ``config.theta`` set means a fixed public theta (no holdout).
    key
        The stream's 256-bit secret.
    threshold
        ``"nm-e"`` (Eq. 5-6 by permute-and-flip, the law of report-noisy-max with exponential noise, as ToPS),
        ``"s-p"`` or ``"s-pak"`` (smooth-sensitivity percentile, Appendices A-B; see
        :mod:`operators.baselines.smooth_sensitivity`).
    stream
        ``stream(config_with_theta, key) -> operator``: the stream phase, built when theta is known.
    stream_fanout
        The fan-out the NM-E scores assume (Eq. 6 predicts the noise of that hierarchy).
    answers_from_nodes
        True when the stream phase answers a range query from tree nodes (``range_queries``) rather than by
        summing per-tick releases.
    stream_length
        n of S-P/S-PAK's ``delta = 1/n^2``; default ``m + r`` (the length PAK assumes known in advance).
    """

    def __init__(
        self,
        config: ToPSConfig,
        key: bytes,
        *,
        threshold: str,
        stream: Callable[[ToPSConfig, bytes], Any],
        stream_fanout: int,
        answers_from_nodes: bool = False,
        stream_length: int | None = None,
    ) -> None:
        if threshold not in THRESHOLDS:
            msg = f"threshold must be one of {', '.join(THRESHOLDS)} (got {threshold!r})"
            raise ValueError(msg)
        self.config = config
        self.threshold_method = threshold
        self.answers_from_nodes = answers_from_nodes
        self.stream_length = stream_length or (config.holdout + config.query_range)
        self._key = bytes(key)
        self._gen = KeyedGenerator(key)
        self._stream_factory = stream
        self._stream_fanout = stream_fanout
        self._holdout: list[np.ndarray] = []
        self.ticks = 0
        self.clamped = 0
        self.theta_units: int | None = None
        self.stream: Any = None
        if config.theta is not None:
            self._start(max(1, round(config.theta / config.resolution)))

    def __repr__(self) -> str:
        return f"TwoPhase({self.threshold_method!r}, {self.config!r}, key=<secret>)"

    @property
    def theta(self) -> float | None:
        """The truncation threshold in value units (``None`` while in the holdout)."""
        return None if self.theta_units is None else self.theta_units * self.config.resolution

    @property
    def holdout_left(self) -> int:
        return max(0, self.config.holdout_ticks - self.ticks)

    @property
    def phase(self) -> str:
        """``holdout`` until theta is chosen, then ``releasing`` (as the ToPS operator)."""
        return "holdout" if self.theta_units is None else "releasing"

    def process_one(self, value: float) -> float:
        """One tick (the daemon's single-reading path)."""
        return float(self.process(np.array([value], dtype=np.float64))[0])

    @property
    def guarantee(self) -> dict[str, Any]:
        """The privacy guarantee as data: event-level; pure eps-DP unless the threshold is S-P/S-PAK."""
        cfg = self.config
        thr_eps = cfg.threshold_epsilon or cfg.epsilon
        delta = 0.0
        if cfg.theta is None and self.threshold_method != "nm-e":
            delta = 1.0 / self.stream_length**2
        return {
            "neighbours": "event-level (one tick changed)",
            "epsilon": max(cfg.epsilon, thr_eps) if cfg.theta is None else cfg.epsilon,
            "delta": delta,
            "composition": "parallel (holdout and released ticks are disjoint)",
        }

    def _start(self, theta_units: int) -> None:
        cfg = self.config
        self.theta_units = theta_units
        stream_cfg = cfg.replace(theta=theta_units * cfg.resolution)
        self.stream = self._stream_factory(stream_cfg, self._key)
        self._holdout = []

    def _choose(self) -> int:
        cfg = self.config
        units = np.concatenate(self._holdout) if self._holdout else np.zeros(0, dtype=np.int64)
        bound_units = math.floor(cfg.bound / cfg.resolution + 1e-9)
        thr_eps = cfg.threshold_epsilon or cfg.epsilon
        if self.threshold_method == "nm-e":
            cands = candidate_grid(cfg.bound, cfg.resolution, cfg.holdout_grid == "compact")
            hist = holdout_histogram(units, cands)
            params = {"m": cfg.holdout, "epsilon": cfg.epsilon, "query_range": cfg.query_range,
                      "fanout": self._stream_fanout}
            thetas = cands * cfg.resolution
            score = scores(m_theta(hist), thetas, **params)
            k = keyed_permute_and_flip(score, thr_eps, score_bound(thetas, **params), self._gen,
                                       baseline_domain("nm-e", THRESHOLD_PURPOSE), 0)
            return int(cands[k])
        from operators.baselines.smooth_sensitivity import smooth_percentile_threshold

        return smooth_percentile_threshold(
            np.sort(units),
            epsilon=thr_eps,
            delta=1.0 / self.stream_length**2,
            upper=bound_units,
            shifted=self.threshold_method == "s-pak",
            gen=self._gen,
            domain=baseline_domain(self.threshold_method, THRESHOLD_PURPOSE),
        )

    def process(self, values: Any) -> np.ndarray:
        """Release one value per input tick (NaN for holdout ticks)."""
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        out = np.full(values.size, np.nan)
        start = 0
        if self.theta_units is None:
            take = min(values.size, self.holdout_left)
            units, n_over = quantize(values[:take], self.config)
            self.clamped += n_over
            self._holdout.append(units)
            self.ticks += take
            start = take
            if self.holdout_left == 0 and take > 0:
                self._start(self._choose())
        if start < values.size:
            out[start:] = self.stream.process(values[start:])
            self.ticks += values.size - start
        return out

    def range_queries(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Range sums over the *released* ticks (index 0 = first released tick), answered by the stream phase."""
        if self.stream is None or not hasattr(self.stream, "range_queries"):
            msg = "this method answers range queries by summing its per-tick releases"
            raise AttributeError(msg)
        return self.stream.range_queries(starts, lengths)

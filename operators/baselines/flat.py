"""Flat Laplace on truncated values (Section 2, "flat" of Appendix F): each tick gets its own noise at eps.

Every released tick is ``min(v, theta) + DLap(a)`` with ``a = exp(-eps / theta)`` in quantized units; a range sum
of ``l`` ticks has noise variance ``l * 2a / (1 - a)^2``. One tick is in one release: eps-DP (event level).

>>> from operators.config import ToPSConfig
>>> op = Flat(ToPSConfig(epsilon=1.0, bound=10, theta=4), bytes(32))
>>> rel = op.process([1, 2, 3, 9])
>>> rel.dtype, bool(np.all(rel == np.rint(rel)))              # integer noise on the integer grid
(dtype('float64'), True)
>>> flat(ToPSConfig(epsilon=1.0, bound=10, holdout=3), bytes(32)).process([1, 2, 3, 4]).tolist()[:3]
[nan, nan, nan]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from operators.baselines._common import TwoPhase, baseline_domain, quantize
from operators.config import ConfigError, ToPSConfig
from operators.noise import DiscreteLaplace, KeyedGenerator

__all__ = ["Flat", "flat"]

_TICKS_PER_ADDRESS = 1 << 32


class Flat:
    """Per-tick discrete Laplace at the full eps, on values truncated to the fixed theta (``config.theta``)."""

    def __init__(self, config: ToPSConfig, key: bytes) -> None:
        if config.theta is None:
            msg = "Flat needs a fixed theta (use flat() for the version with a holdout)"
            raise ConfigError(msg)
        self.config = config
        self.theta_units = max(1, round(config.theta / config.resolution))
        self.noise = DiscreteLaplace(epsilon=config.epsilon, sensitivity=self.theta_units)
        self._gen = KeyedGenerator(key)
        self.ticks = 0
        self.clamped = 0

    def __repr__(self) -> str:
        return f"Flat({self.config!r}, key=<secret>)"

    @property
    def tick_variance(self) -> float:
        """Noise variance of one release in quantized units squared."""
        return self.noise.variance

    def process(self, values: Any) -> np.ndarray:
        """One release per tick: truncated value + its own noise (value units)."""
        units, n_over = quantize(values, self.config)
        self.clamped += n_over
        trunc = np.minimum(units, self.theta_units)
        noise = np.empty(trunc.size, dtype=np.int64)
        pos = 0
        while pos < trunc.size:
            address, start = divmod(self.ticks + pos, _TICKS_PER_ADDRESS)
            take = min(trunc.size - pos, _TICKS_PER_ADDRESS - start)
            noise[pos : pos + take] = self._gen.discrete_laplace(
                baseline_domain("flat"), address, start, take, self.noise
            )
            pos += take
        self.ticks += trunc.size
        return (trunc + noise).astype(np.float64) * self.config.resolution


def flat(config: ToPSConfig, key: bytes, **kwargs: Any) -> TwoPhase:
    """NM-E threshold (or the fixed theta), then flat Laplace."""
    return TwoPhase(config, key, threshold="nm-e", stream=Flat, stream_fanout=2, **kwargs)

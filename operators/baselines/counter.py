"""The binary-tree continual counter (Dwork et al. 2010, Chan et al. 2011) for prefix sums, correctly noised.

Trees of ``T = 2^k >= r`` ticks (``k = ceil(log2 r)``); node ``(level l, index i)`` of a tree covers ticks
``[i 2^l, (i + 1) 2^l)``, levels ``0..k`` (the root included), so every tick is in exactly ``L = k + 1`` nodes and
each node gets integer discrete Laplace noise at ``eps / L`` (sensitivity theta): eps-DP at event level. This is the
scale Friis's thesis (2021) describes but does not implement.

After ``c`` ticks of a tree the counter's noisy prefix is the sum of the ``popcount(c)`` nodes of the dyadic
decomposition of ``[0, c)`` (node ``(l, (c >> l) - 1)`` for every bit ``l`` of ``c``), so its noise variance is
``popcount(c) * 2a / (1 - a)^2``. A tick releases the *difference* of consecutive noisy prefixes (a tree starts
again from 0, and a whole tree's prefix is its root), so the sum of the releases of ticks ``i..j`` is exactly the
counter's range answer ``S(j) - S(i - 1)``.

>>> from operators.config import ToPSConfig
>>> op = Counter(ToPSConfig(epsilon=1.0, bound=10, theta=3, query_range=8), bytes(32))
>>> rel = op.process(np.ones(20))
>>> op.levels, [op.prefix_variance(c) / op.node_variance for c in (1, 3, 7, 8)]
(4, [1.0, 2.0, 3.0, 1.0])
>>> op2 = Counter(ToPSConfig(epsilon=1.0, bound=10, theta=3, query_range=8), bytes(32))
>>> bool(np.array_equal(np.concatenate([op2.process(np.ones(7)), op2.process(np.ones(13))]), rel))
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from operators.baselines._common import TwoPhase, baseline_domain, quantize
from operators.config import ConfigError, ToPSConfig
from operators.noise import DiscreteLaplace, KeyedGenerator

__all__ = ["Counter", "counter"]


class Counter:
    """The binary-tree counter over trees of ``T = 2^ceil(log2 r)`` ticks at a fixed theta (``config.theta``)."""

    def __init__(self, config: ToPSConfig, key: bytes) -> None:
        if config.theta is None:
            msg = "Counter needs a fixed theta (use counter() for the version with a holdout)"
            raise ConfigError(msg)
        self.config = config
        self.k = max(1, (config.query_range - 1).bit_length())
        self.tree_ticks = 1 << self.k
        self.levels = self.k + 1
        self.theta_units = max(1, round(config.theta / config.resolution))
        self.noise = DiscreteLaplace(epsilon=config.epsilon / self.levels, sensitivity=self.theta_units)
        self._gen = KeyedGenerator(key)
        self.ticks = 0
        self.clamped = 0

    def __repr__(self) -> str:
        return f"Counter({self.config!r}, key=<secret>)"

    @property
    def node_variance(self) -> float:
        """Noise variance of one node, quantized units squared."""
        return self.noise.variance

    def prefix_variance(self, count: int) -> float:
        """Closed form: noise variance of the noisy prefix after ``count`` ticks of a tree, ``popcount * Var``."""
        return bin(count).count("1") * self.node_variance

    def _prefix_noise(self, tree: int, c0: int, c1: int) -> np.ndarray:
        """Noise of the noisy prefixes after ``c`` ticks of ``tree``, for ``c`` in ``[c0, c1]`` (0 gives 0)."""
        c = np.arange(c0, c1 + 1, dtype=np.int64)
        out = np.zeros(c.size, dtype=np.int64)
        for level in range(self.levels):
            idx = (c >> level) - 1
            first = max(int(idx[0]), 0)
            last = int(idx[-1])
            if last < 0:
                continue
            noise = self._gen.discrete_laplace(
                baseline_domain("counter", level), tree, first, last - first + 1, self.noise
            )
            bit = ((c >> level) & 1).astype(bool)
            out[bit] += noise[idx[bit] - first]
        return out

    def process(self, values: Any) -> np.ndarray:
        """One release per tick: the increase of the noisy prefix (value units)."""
        units, n_over = quantize(values, self.config)
        self.clamped += n_over
        trunc = np.minimum(units, self.theta_units)
        out = np.empty(trunc.size, dtype=np.int64)
        pos = 0
        while pos < trunc.size:
            tree, done = divmod(self.ticks + pos, self.tree_ticks)
            take = min(trunc.size - pos, self.tree_ticks - done)
            prefix = self._prefix_noise(tree, done, done + take)
            out[pos : pos + take] = trunc[pos : pos + take] + np.diff(prefix)
            pos += take
        self.ticks += trunc.size
        return out.astype(np.float64) * self.config.resolution


def counter(config: ToPSConfig, key: bytes, **kwargs: Any) -> TwoPhase:
    """NM-E threshold (or the fixed theta), then the binary-tree counter."""
    return TwoPhase(config, key, threshold="nm-e", stream=Counter, stream_fanout=2, **kwargs)

"""Hierarchies without smoother: H2 (PAK's binary tree), H16, and H16c (Section 5.3, Figure 5).

:class:`Hierarchy` is the plain b-ary hierarchy of Section 3.1 (Chan et al., Dwork et al.) cut into trees of ``r``
ticks like ToPS's perturber (Section 3.4): ``h = ceil(log_b r)`` layers of nodes of ``b^j`` ticks, each node the
truncated sum of its ticks plus integer discrete Laplace noise at ``eps / h`` (sensitivity theta), no consistency.
A tick's own release is its noisy leaf; a range query is answered, as in the paper, from the nodes of its canonical
decomposition (at most ``2 (b - 1)`` nodes per layer), via :meth:`Hierarchy.range_queries`.

H16c is ToPS's consistent 16-ary perturber with no smoother (s = 0): every tick is a leaf, so the per-tick release
is the consistent leaf, and summing leaves equals answering from consistent nodes.

Privacy: one tick changes one node per layer by at most theta; ``h`` layers at ``eps / h`` each: eps-DP (event level).

>>> from operators.config import ToPSConfig
>>> cfg = ToPSConfig(epsilon=1.0, bound=10, theta=5, query_range=16)
>>> op = Hierarchy(cfg, bytes(32), fanout=2)
>>> rel = op.process(np.arange(40) % 7)
>>> op.layers, rel.shape
(4, (40,))
>>> float(op.range_queries(np.array([3]), np.array([1]))[0]) == float(rel[3])   # one tick: its noisy leaf
True
>>> h2(cfg.replace(theta=None, holdout=20), bytes(32)).answers_from_nodes
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from operators.baselines._common import TwoPhase, baseline_domain, quantize
from operators.config import ConfigError, ToPSConfig, tree_height
from operators.noise import DiscreteLaplace, KeyedGenerator

__all__ = ["Hierarchy", "h2", "h16", "h16c", "h16c_stream"]


class Hierarchy:
    """The b-ary hierarchy without consistency, trees of ``r`` ticks, at a fixed theta (``config.theta``).

    ``process(values)`` releases each tick's noisy leaf; ``range_queries(starts, lengths)`` answers sums over the
    ticks seen so far from tree nodes (vectorized over queries; O(h) numpy passes). Node noise is addressed by
    (layer, tree, node), so computing the nodes lazily gives exactly what an online release would; to do so the
    operator keeps the truncated value of every tick (O(n) memory): a comparison baseline, not a daemon operator.
    """

    def __init__(self, config: ToPSConfig, key: bytes, *, fanout: int) -> None:
        if config.theta is None:
            msg = "Hierarchy needs a fixed theta (use h2/h16 for the version with a holdout)"
            raise ConfigError(msg)
        r = config.query_range
        self.b = fanout
        self.layers = tree_height(r, fanout)
        if r % fanout ** (self.layers - 1):
            msg = f"query_range must be a multiple of fanout^(h-1) = {fanout ** (self.layers - 1)} (fan-out {fanout})"
            raise ConfigError(msg)
        self.config = config
        self.theta_units = max(1, round(config.theta / config.resolution))
        self.noise = DiscreteLaplace(epsilon=config.epsilon / self.layers, sensitivity=self.theta_units)
        self._gen = KeyedGenerator(key)
        self._chunks: list[np.ndarray] = []
        self.ticks = 0
        self.clamped = 0
        self._nodes: tuple[int, list[np.ndarray]] | None = None

    def __repr__(self) -> str:
        return f"Hierarchy(fanout={self.b}, {self.config!r}, key=<secret>)"

    @property
    def node_variance(self) -> float:
        """Noise variance of every node, in quantized units squared: ``2a / (1 - a)^2``."""
        return self.noise.variance

    def _noise(self, layer: int, i0: int, n: int) -> np.ndarray:
        """Raw noise of nodes ``[i0, i0 + n)`` of ``layer`` (global indices; trees of ``r / b^layer`` nodes)."""
        out = np.empty(n, dtype=np.int64)
        per_tree = self.config.query_range // self.b**layer
        pos = 0
        while pos < n:
            tree, local = divmod(i0 + pos, per_tree)
            take = min(n - pos, per_tree - local)
            out[pos : pos + take] = self._gen.discrete_laplace(
                baseline_domain("hierarchy", layer), (self.b << 40) | tree, local, take, self.noise
            )
            pos += take
        return out

    def process(self, values: Any) -> np.ndarray:
        """One release per tick: truncated value + its leaf noise (value units)."""
        units, n_over = quantize(values, self.config)
        self.clamped += n_over
        trunc = np.minimum(units, self.theta_units)
        self._chunks.append(trunc)
        leaf = trunc + self._noise(0, self.ticks, trunc.size)
        self.ticks += trunc.size
        return leaf.astype(np.float64) * self.config.resolution

    def node_values(self) -> list[np.ndarray]:
        """Noisy values (quantized units) of every complete node, layer 0 (leaves) first."""
        if self._nodes is not None and self._nodes[0] == self.ticks:
            return self._nodes[1]
        units = np.concatenate(self._chunks) if self._chunks else np.zeros(0, dtype=np.int64)
        self._chunks = [units]
        sums = units
        out = []
        for j in range(self.layers):
            if j:
                cnt = sums.size // self.b
                sums = sums[: cnt * self.b].reshape(cnt, self.b).sum(axis=1)
            out.append((sums + self._noise(j, 0, sums.size)).astype(np.float64))
        self._nodes = (self.ticks, out)
        return out

    def range_queries(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Sums of ticks ``[start, start + length)`` from the nodes of the canonical b-adic decomposition."""
        lo = np.asarray(starts, dtype=np.int64).copy()
        hi = lo + np.asarray(lengths, dtype=np.int64)
        if lo.size and (lo.min() < 0 or hi.max() > self.ticks or (hi < lo).any()):
            msg = "range query outside the released ticks"
            raise ValueError(msg)
        b = self.b
        ans = np.zeros(lo.size)
        for j, nodes in enumerate(self.node_values()):
            cum = np.concatenate([[0.0], np.cumsum(nodes)])
            if j == self.layers - 1:
                ans += cum[hi] - cum[lo]
                break
            up_lo, up_hi = -(-lo // b), hi // b
            whole = up_lo >= up_hi  # no complete parent inside: the rest is on this layer
            left, right = np.minimum(up_lo * b, hi), np.maximum(up_hi * b, lo)  # clipped: both branches are indexed
            ans += np.where(whole, cum[hi] - cum[lo], (cum[left] - cum[lo]) + (cum[hi] - cum[right]))
            lo = np.where(whole, 0, up_lo)
            hi = np.where(whole, 0, up_hi)
        return ans * self.config.resolution

    def range_query(self, i: int, j: int) -> float:
        """The sum of ticks ``i..j`` (inclusive) from tree nodes."""
        return float(self.range_queries(np.array([i]), np.array([j - i + 1]))[0])


def h16c_stream(config: ToPSConfig, key: bytes):
    """ToPS's consistent 16-ary perturber with no smoother (s = 0), at the config's (fixed) theta."""
    from operators.tops import ToPS

    return ToPS(config.replace(fanout=16, smoother_layers=0), key)


def h2(config: ToPSConfig, key: bytes, **kwargs: Any) -> TwoPhase:
    """NM-E threshold (or the fixed theta), then H2 answering from nodes (the "NM-E" method of Figure 3)."""
    return TwoPhase(
        config,
        key,
        threshold="nm-e",
        stream=lambda c, k: Hierarchy(c, k, fanout=2),
        stream_fanout=2,
        answers_from_nodes=True,
        **kwargs,
    )


def h16(config: ToPSConfig, key: bytes, **kwargs: Any) -> TwoPhase:
    """NM-E threshold (or the fixed theta), then H16 without consistency, answering from nodes.

    >>> from operators.config import ToPSConfig
    >>> op = h16(ToPSConfig(epsilon=1.0, bound=10, theta=5, query_range=256), bytes(32))
    >>> op.stream.layers, op.holdout_left
    (2, 0)
    """
    return TwoPhase(
        config,
        key,
        threshold="nm-e",
        stream=lambda c, k: Hierarchy(c, k, fanout=16),
        stream_fanout=16,
        answers_from_nodes=True,
        **kwargs,
    )


def h16c(config: ToPSConfig, key: bytes, **kwargs: Any) -> TwoPhase:
    """NM-E threshold (or the fixed theta), then H16c: consistent 16-ary tree, no smoother.

    >>> from operators.config import ToPSConfig
    >>> op = h16c(ToPSConfig(epsilon=1.0, bound=10, theta=5, query_range=256), bytes(32))
    >>> op.stream.smoother_layers, op.answers_from_nodes
    (0, False)
    """
    return TwoPhase(config, key, threshold="nm-e", stream=h16c_stream, stream_fanout=16, **kwargs)

"""The hindsight-best fixed (theta, s): a grid search on the truth, NOT private, a reference for `tops compare`.

For a fixed theta and s the error of a range splits into a deterministic part (truncation and the recent smoother
on the true values, no noise) and the noise, independent of it with mean 0, whose variance is ``G_s theta^2 / eps^2``
(:func:`operators.selection.noise_constant`). So for every (theta, s) of a grid the expected MSE over a set of
ranges is ``mean(det^2) + G_s theta^2 / eps^2``, computed without drawing any noise, and the best pair is kept. The
deterministic part does not depend on eps: one table serves every eps. The smoother starts from the holdout's exact
truncated mean (the calibrated selection's start without its noise). Only the recent smoother is modelled.

>>> import numpy as np
>>> x = np.tile([1.0, 2.0, 3.0, 30.0], 4096)
>>> table = DeterministicErrors(x[:4096], x[4096:], query_range=1024, fanout=4, queries=500, seed=0)
>>> theta, s, start = table.best(epsilon=1.0)
>>> 3 <= theta <= 30, 0 <= s <= 4
(True, True)
"""

from __future__ import annotations

import numpy as np

from operators.config import tree_height
from operators.selection import noise_constant

__all__ = ["DeterministicErrors", "deterministic_release"]

_GRID = 1024.0
_MAX_DENSE = 256
_GEOMETRIC = 160


def deterministic_release(units: np.ndarray, start: float, leaf_ticks: int) -> np.ndarray:
    """The recent smoother's per-tick release of already truncated ``units`` with no noise (App. D)."""
    w = leaf_ticks
    n = units.size
    k = n // w
    sums = units[: k * w].reshape(k, w).sum(axis=1).astype(np.float64)
    pred = np.empty(k + 1)
    pred[0] = np.rint(start * _GRID) / _GRID
    pred[1:] = np.rint(sums / w * _GRID) / _GRID
    out = np.repeat(pred, [w] * k + [n - k * w])
    out[w - 1 : k * w : w] = sums - (w - 1) * pred[:-1]
    return out


class DeterministicErrors:
    """``mean(det^2)`` over random ranges for every (theta, s) of a grid, from the holdout and the released part."""

    def __init__(
        self,
        holdout: np.ndarray,
        stream: np.ndarray,
        *,
        query_range: int,
        fanout: int,
        queries: int = 4000,
        seed: int = 0,
        truth: np.ndarray | None = None,
    ) -> None:
        holdout = np.asarray(holdout, dtype=np.float64)
        stream = np.asarray(stream, dtype=np.float64)
        truth = stream if truth is None else np.asarray(truth, dtype=np.float64)
        self.query_range, self.fanout = query_range, fanout
        n = stream.size
        rng = np.random.default_rng([seed, 20211115])
        length = rng.integers(1, min(query_range, n) + 1, size=queries)
        begin = (rng.random(queries) * (n - length + 1)).astype(np.int64)
        cum_true = np.concatenate([[0.0], np.cumsum(truth)])
        exact = cum_true[begin + length] - cum_true[begin]
        top = max(1, int(np.ceil(stream.max())))
        if top <= _MAX_DENSE:
            thetas = np.arange(1, top + 1, dtype=np.float64)
        else:
            thetas = np.unique(np.round(np.geomspace(1, top, _GEOMETRIC)))
        self.thetas = thetas
        self.layers = list(range(tree_height(query_range, fanout)))
        self.starts = np.array([np.minimum(holdout, t).mean() if holdout.size else t / 2.0 for t in thetas])
        self.det = np.empty((thetas.size, len(self.layers)))
        for i, t in enumerate(thetas):
            units = np.minimum(stream, t)
            for s in self.layers:
                rel = deterministic_release(units, self.starts[i], fanout**s)
                cum = np.concatenate([[0.0], np.cumsum(rel)])
                err = cum[begin + length] - cum[begin] - exact
                self.det[i, s] = float(np.mean(err**2))

    def expected(self, epsilon: float) -> np.ndarray:
        """Expected MSE of every (theta, s) at ``epsilon``."""
        g = np.array([noise_constant(self.fanout, self.query_range, s) for s in self.layers])
        return self.det + g[None, :] * self.thetas[:, None] ** 2 / epsilon**2

    def best(self, epsilon: float) -> tuple[float, int, float]:
        """(theta, s, start) with the lowest expected MSE at ``epsilon``."""
        mse = self.expected(epsilon)
        i, s = np.unravel_index(int(np.argmin(mse)), mse.shape)
        return float(self.thetas[i]), int(self.layers[s]), float(self.starts[i])

"""The noise variance of a sum of ToPS releases, from the public parameters only (no data, no key).

A release is linear in the leaves' noisy sums ``u_k = S_k + Z_k`` (``S_k``: the true truncated sum of leaf ``k``,
``Z_k``: its consistent noise, Appendix C): inside leaf ``k`` every tick but the last releases the prediction ``p_k``
and the last tick releases ``u_k - (w - 1) p_k`` (Algorithm 1, Appendix D), ``w = b^s``. The recent, EMA, mean and
moving-average smoothers make ``p_k`` a fixed linear combination of earlier ``u_i`` (plus the public prior
``w theta / 2``). So the sum ``V~`` of the releases of any set of ticks is ``sum_k c_k u_k`` + constant, and

    V~ - E[V~] = sum_k c_k Z_k,        Var[V~] = sum over trees  sigma^2 * || M^T c_tree ||^2          (1)

where ``M`` is the linear map from the independent node noises of one tree to its consistent leaf noises (Hay et
al.'s two passes, seed 001 Appendix C: bottom-up ``z = a_l N + (1 - a_l) sum z(children)``, top-down
``c = z + (c(parent) - sum z(siblings)) / b``), ``sigma^2 = 2a / (1 - a)^2`` the variance of a node's discrete
Laplace noise with ``a = exp(-(eps / L) / theta)`` in quantized units (:mod:`operators.noise`), ``L = h - s``, and trees
are independent (fresh noise per tree). ``M^T c`` is computed by running the two passes backwards (their adjoint), in
O(leaves of a tree). The error of a range sum is this noise plus a data-dependent bias (truncation to theta, and the
smoother's prediction error on partly covered leaves), which no public parameter can bound: the error bar is the
standard deviation of the noise, the part that is the same for every data set.

The median smoother's prediction is not linear in the ``u_k``: no error bar for it (``None``).

>>> m = NoiseModel(epsilon=1.0, theta=10.0, fanout=4, query_range=64, smoother_layers=1)
>>> m.layers, m.leaf_ticks, m.leaves_per_tree
(2, 4, 16)
>>> one_leaf = m.variance(np.arange(4, 8))              # the 4 ticks of leaf 1: exactly its consistent noise
>>> bool(one_leaf < m.node_variance)                     # consistency lowers the variance of a leaf
True
>>> whole_tree = m.variance(np.arange(64))               # the sum of a whole tree: the sum of its top nodes
>>> bool(abs(whole_tree - m.variance(np.arange(64, 128))) < 1e-9 * whole_tree)   # every tree alike
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from operators.config import ConfigError, check_hierarchy, check_positive, check_smoother, tree_height
from operators.hierarchy import exact_range_problem, layer_weight
from operators.noise import DiscreteLaplace

__all__ = ["LINEAR_SMOOTHERS", "NoiseModel", "consistent_leaf_variance_weights", "prediction_coefficients"]

LINEAR_SMOOTHERS = ("recent", "ema", "mean", "moving")


def _sum_groups(x: np.ndarray, b: int) -> np.ndarray:
    return x.reshape(-1, b).sum(axis=1)


def consistent_leaf_variance_weights(g: np.ndarray, *, fanout: int, layers: int) -> float:
    """``|| M^T g ||^2`` of Eq. (1) for the leaf coefficients ``g`` of one tree (length ``R b^(L-1)``).

    The adjoint of the two passes: top-down backwards (leaves to the top layer), then bottom-up backwards (top layer to
    the leaves), giving the coefficient of every node's own noise ``N(x)``.
    """
    b, L = fanout, layers
    g = np.asarray(g, dtype=np.float64)
    # top-down pass c_j = z_j + E(c_{j+1} - S z_j) / b  (E: repeat to children, S: sum of children; S = E^T)
    gz = [np.zeros(0)] * L
    gc = g
    for j in range(L - 1):
        up = _sum_groups(gc, b) / b  # the gradient that flows to c_{j+1}
        gz[j] = gc - np.repeat(up, b)
        gc = up
    gz[L - 1] = gc  # c = z on the top layer
    # bottom-up pass z_j = a_j N_j + (1 - a_j) S z_{j-1}, from the top layer down
    total = 0.0
    carry = None
    for j in range(L - 1, -1, -1):
        gzj = gz[j] if carry is None else gz[j] + carry
        a = layer_weight(j + 1, b)  # a_1 = 1 on the leaves
        gn = a * gzj
        total += float(gn @ gn)
        carry = (1.0 - a) * np.repeat(gzj, b) if j > 0 else None
    return total


def prediction_coefficients(
    smoother: str, k: np.ndarray, *, alpha: float, window: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``p_k = sum_i weight * u_i / w`` (+ prior terms) as triples (row, leaf i, weight) for each ``k`` in ``k``.

    Row ``r`` refers to ``k[r]``; terms on the prior are left out (they are public constants).
    """
    rows, cols, ws = [], [], []
    for r, kk in enumerate(np.asarray(k, dtype=np.int64).tolist()):
        if kk <= 0:
            continue
        if smoother == "recent":
            i = np.array([kk - 1])
            w = np.ones(1)
        elif smoother == "ema":
            i = np.arange(kk)
            w = alpha * (1.0 - alpha) ** (kk - 1 - i)
        elif smoother == "mean":  # (u_prior + u_0 + ... + u_{k-1}) / (k + 1)
            i = np.arange(kk)
            w = np.full(kk, 1.0 / (kk + 1))
        elif smoother == "moving":  # the last `window` of [u_prior, u_0, ..., u_{k-1}]
            n = min(window, kk + 1)
            i = np.arange(kk - n + 1, kk)
            i = i[i >= 0]
            w = np.full(i.size, 1.0 / n)
        else:
            msg = f"no linear error model for the {smoother!r} smoother"
            raise ValueError(msg)
        rows.append(np.full(i.size, r))
        cols.append(i)
        ws.append(w)
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    return np.concatenate(rows), np.concatenate(cols), np.concatenate(ws)


@dataclass(frozen=True)
class NoiseModel:
    """The public parameters of a ToPS stream that fix the noise of its releases.

    ``theta`` and ``resolution`` in value units; ``smoother_layers`` is s as the stream reports it (Eq. 7 if
    ``None``, as the operator chooses it). Every parameter is checked by the ranges of ``operators.config`` (the ones
    a stream's configuration is held to), and the node noise must be one the exact sampler draws: a model is never
    built from parameters no stream could have released with (they may come from a status message).
    """

    epsilon: float
    theta: float
    fanout: int = 16
    query_range: int = 1 << 20
    smoother_layers: int | None = None
    smoother: str = "recent"
    alpha: float = 0.6
    window: int = 8
    resolution: float = 1.0

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        check_positive("theta", self.theta)
        check_positive("resolution", self.resolution)
        h = check_hierarchy(self.query_range, self.fanout, self.smoother_layers)
        check_smoother(self.smoother, self.alpha, self.window)
        problem = exact_range_problem(self.theta / self.resolution, self.epsilon, self.fanout, h)
        if problem:
            raise ConfigError(problem)

    @property
    def height(self) -> int:
        return tree_height(self.query_range, self.fanout)

    @property
    def s(self) -> int:
        if self.smoother_layers is not None:
            return int(self.smoother_layers)
        from operators.threshold import smoother_layers

        return min(smoother_layers(self.epsilon, self.query_range, self.fanout), self.height - 1)

    @property
    def layers(self) -> int:
        return self.height - self.s

    @property
    def leaf_ticks(self) -> int:
        return self.fanout**self.s

    @property
    def leaves_per_tree(self) -> int:
        return self.query_range // self.leaf_ticks

    @property
    def theta_units(self) -> int:
        return max(1, round(self.theta / self.resolution))

    @property
    def node_variance(self) -> float:
        """``sigma^2 = 2a / (1 - a)^2``, ``a = exp(-(eps / L) / theta)``, in quantized units squared."""
        return DiscreteLaplace(self.epsilon / self.layers, self.theta_units).variance

    def leaf_coefficients(self, released: np.ndarray) -> dict[int, float]:
        """``c_k`` of Eq. (1) for the sum of the releases at ``released`` (indices counted from the first released
        tick, each at most once)."""
        j = np.unique(np.asarray(released, dtype=np.int64))
        if j.size and j[0] < 0:
            msg = "a released index is negative (a holdout tick has no release)"
            raise ValueError(msg)
        w = self.leaf_ticks
        leaf = j // w
        last = (j % w) == w - 1
        keys = np.unique(leaf)
        e = np.zeros(keys.size)
        n = np.zeros(keys.size)
        np.add.at(e, np.searchsorted(keys, leaf[last]), 1.0)
        np.add.at(n, np.searchsorted(keys, leaf[~last]), 1.0)
        coef: dict[int, float] = {}
        for kk, ek in zip(keys.tolist(), e.tolist(), strict=True):
            if ek:
                coef[kk] = coef.get(kk, 0.0) + ek
        # the weight of p_k is n_k - (w - 1) e_k; p_k = sum_i weight_i u_i / w
        pw = n - (w - 1) * e
        if self.smoother not in LINEAR_SMOOTHERS:
            msg = f"no linear error model for the {self.smoother!r} smoother"
            raise ValueError(msg)
        rows, cols, ws = prediction_coefficients(self.smoother, keys, alpha=self.alpha, window=self.window)
        if rows.size:
            contrib = pw[rows] * ws / w
            uniq, inv = np.unique(cols, return_inverse=True)
            summed = np.zeros(uniq.size)
            np.add.at(summed, inv, contrib)
            for i, c in zip(uniq.tolist(), summed.tolist(), strict=True):
                coef[i] = coef.get(i, 0.0) + c
        return coef

    def variance(self, released: np.ndarray) -> float | None:
        """Eq. (1): the noise variance (value units squared) of the sum of the releases at ``released``; ``None`` for
        the median smoother."""
        if self.smoother not in LINEAR_SMOOTHERS:
            return None
        coef = self.leaf_coefficients(released)
        per_tree: dict[int, dict[int, float]] = {}
        lpt = self.leaves_per_tree
        for k, c in coef.items():
            if c:
                per_tree.setdefault(k // lpt, {})[k % lpt] = c
        total = 0.0
        for leaves in per_tree.values():
            g = np.zeros(lpt)
            g[list(leaves)] = list(leaves.values())
            total += consistent_leaf_variance_weights(g, fanout=self.fanout, layers=self.layers)
        return total * self.node_variance * self.resolution**2

    def stderr(self, released: np.ndarray) -> float | None:
        v = self.variance(released)
        return None if v is None else math.sqrt(v)

"""Central range counting over a value domain, one period at a time (Friis, thesis 2021, sections 7.1-7.2; errata
fixed).

The server holds the period's readings, bucketed into ``d`` cells; neighbours add or remove one reading.

* **Flat** (section 7.1): every cell gets exact discrete Laplace noise of scale ``1 / eps`` (one reading changes one
  cell by 1); a range of ``r`` cells is the sum of its noisy cells, ``Var = r V_1`` with ``V_1 = 2a / (1 - a)^2``,
  ``a = e^-eps`` (the thesis's ``2 r / eps^2`` for continuous Laplace).
* **Tree** (section 7.2, Dwork-Roth's counter over values): a b-ary tree of ``h + 1`` levels (leaves to root) over
  the domain padded to ``b^h``; every node gets *independent* noise of scale ``(h + 1) / eps`` (a reading is in one
  node per level). The thesis's code draws the noise at scale ``log2(h + 1) / eps`` and sums it along root-to-node
  paths, up to 6.8x less noise than eps needs: not copied.
* **Consistency** (Hay et al. 2010, the two passes of :mod:`operators.hierarchy` over a whole tree): the least-squares
  tree whose children sum to their parent; post-processing. A range is then the sum of its consistent leaves, which
  equals the sum over its decomposition nodes (:mod:`operators.ranges.decomposition`).

Closed forms: :func:`range_variance` gives the exact variance of any range for each mechanism (for the consistent
tree: ``V_node ||P c||^2`` with ``P`` the consistency projection and ``c`` the range's leaves, computed by running the
two passes on ``c``). :func:`mean_variance` averages it over ranges and :func:`prefer_tree` is the rule for when the
tree beats flat (central: only with consistency and long ranges; the thesis's ``r > 2 b log_b^2 d`` is a local-model
rule).

>>> from operators.noise import KeyedGenerator
>>> gen = KeyedGenerator(bytes(32))
>>> tree = RangeTree(d=8, fanout=2, epsilon=1.0)
>>> noisy = tree.release(np.array([5, 0, 3, 0, 0, 1, 0, 2]), gen, address=0)
>>> bool(np.isclose(noisy.answer(0, 7), noisy.levels[-1][0]))     # consistent: the leaves add up to the root
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from operators.noise import DiscreteLaplace, Domain, KeyedGenerator
from operators.ranges.decomposition import decompose, tree_height

__all__ = ["FlatHistogram", "RangeTree", "ReleasedTree", "mean_variance", "prefer_tree", "range_variance"]

_FLAT = 0xFFFF  # noise purpose of the flat histogram (tree levels use their level number)


def _domain(purpose: int) -> int:
    return (int(Domain.RANGES) << 16) | purpose


def _check(epsilon: float, d: int) -> None:
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or not 0 < epsilon <= 30:
        msg = f"epsilon must be a number in (0, 30] (got {epsilon!r})"
        raise ValueError(msg)
    if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= 1 << 24:
        msg = f"d must be an integer in [1, 2^24] (got {d!r})"
        raise ValueError(msg)


@dataclass(frozen=True)
class FlatHistogram:
    """Discrete Laplace on every cell (section 7.1)."""

    d: int
    epsilon: float

    def __post_init__(self) -> None:
        _check(self.epsilon, self.d)

    @property
    def cell_variance(self) -> float:
        return DiscreteLaplace(self.epsilon, 1).variance

    def release(self, counts: Any, gen: KeyedGenerator, *, address: int) -> np.ndarray:
        """The noisy cells of one period (int64); ``address`` is the period's index."""
        c = np.asarray(counts, dtype=np.int64).reshape(-1)
        if c.size != self.d:
            msg = "counts must have one cell per value"
            raise ValueError(msg)
        return c + gen.discrete_laplace(_domain(_FLAT), address, 0, self.d, DiscreteLaplace(self.epsilon, 1))

    @staticmethod
    def answer(noisy: np.ndarray, lo: int, hi: int) -> float:
        return float(np.sum(noisy[lo : hi + 1]))


def _consistent(levels: list[np.ndarray], fanout: int) -> list[np.ndarray]:
    """Hay et al.'s two passes over a whole tree with equal node variances; ``levels[0]`` the leaves."""
    b = fanout
    z = [levels[0].astype(np.float64)]
    for j in range(1, len(levels)):
        a = (b ** (j + 1) - b**j) / (b ** (j + 1) - 1)  # a_l with l = j + 1 levels up to and including this one
        child = z[-1].reshape(-1, b).sum(axis=1)
        z.append(a * levels[j].astype(np.float64) + (1.0 - a) * child)
    out = [np.empty(0)] * len(levels)
    out[-1] = z[-1].copy()
    for j in range(len(levels) - 2, -1, -1):
        parent = out[j + 1]
        sums = z[j].reshape(-1, b).sum(axis=1)
        out[j] = z[j] + np.repeat((parent - sums) / b, b)
    return out


@dataclass(frozen=True)
class ReleasedTree:
    """One period's released tree: ``levels[j]`` the (consistent, unless asked otherwise) noisy nodes of level j."""

    d: int
    fanout: int
    levels: list[np.ndarray]

    def answer(self, lo: int, hi: int) -> float:
        """The range ``[lo, hi]`` as the sum of its decomposition's nodes."""
        return float(sum(self.levels[j][i] for j, i in decompose(lo, hi, fanout=self.fanout)))

    def leaves(self) -> np.ndarray:
        return self.levels[0][: self.d]


@dataclass(frozen=True)
class RangeTree:
    """The b-ary tree of section 7.2 with independent noise per node of scale ``(h + 1) / eps``."""

    d: int
    fanout: int
    epsilon: float
    consistent: bool = True

    def __post_init__(self) -> None:
        _check(self.epsilon, self.d)
        if isinstance(self.fanout, bool) or not isinstance(self.fanout, int) or not 2 <= self.fanout <= 1024:
            msg = f"fanout must be an integer in [2, 1024] (got {self.fanout!r})"
            raise ValueError(msg)

    @property
    def height(self) -> int:
        return tree_height(self.d, self.fanout)

    @property
    def node_noise(self) -> DiscreteLaplace:
        """Every node's noise: sensitivity ``h + 1`` (one node per level changes by 1) at ``eps``."""
        return DiscreteLaplace(self.epsilon, self.height + 1)

    def release(self, counts: Any, gen: KeyedGenerator, *, address: int) -> ReleasedTree:
        """The released tree of one period; node noise addressed by (level, period)."""
        c = np.asarray(counts, dtype=np.int64).reshape(-1)
        if c.size != self.d:
            msg = "counts must have one cell per value"
            raise ValueError(msg)
        b, h = self.fanout, self.height
        true = [np.zeros(b**h, dtype=np.int64)]
        true[0][: self.d] = c
        for _ in range(h):
            true.append(true[-1].reshape(-1, b).sum(axis=1))
        dl = self.node_noise
        noisy = [t + gen.discrete_laplace(_domain(j), address, 0, t.size, dl) for j, t in enumerate(true)]
        levels = _consistent(noisy, b) if self.consistent else [x.astype(np.float64) for x in noisy]
        return ReleasedTree(self.d, b, levels)


def range_variance(mechanism: FlatHistogram | RangeTree, lo: int, hi: int) -> float:
    """The exact variance of the answer to ``[lo, hi]``."""
    if isinstance(mechanism, FlatHistogram):
        return (hi - lo + 1) * mechanism.cell_variance
    v = mechanism.node_noise.variance
    if not mechanism.consistent:
        return len(decompose(lo, hi, fanout=mechanism.fanout)) * v
    b, h = mechanism.fanout, mechanism.height
    c = np.zeros(b**h)
    c[lo : hi + 1] = 1.0
    zero = [np.zeros(b ** (h - j)) for j in range(h + 1)]
    zero[0] = c
    pc = _consistent(zero, b)  # P c: the projection is symmetric, so Var = v c.(P c) over all nodes = v ||P c||^2
    return v * float(sum(np.dot(x, x) for x in pc))


def mean_variance(mechanism: FlatHistogram | RangeTree, lengths: Any, *, positions: int = 64,
                  seed: int = 0) -> float:
    """Mean variance over ranges of the given lengths, each at up to ``positions`` evenly spread starts."""
    d = mechanism.d
    total, n = 0.0, 0
    for r in np.asarray(lengths, dtype=np.int64).reshape(-1):
        r = int(min(max(r, 1), d))
        starts = np.unique(np.linspace(0, d - r, num=min(positions, d - r + 1)).round().astype(np.int64))
        for lo in starts.tolist():
            total += range_variance(mechanism, lo, lo + r - 1)
            n += 1
    return total / n if n else math.nan


def prefer_tree(d: int, fanout: int, epsilon: float, lengths: Any) -> bool:
    """The rule: the consistent tree when its mean variance over ranges of ``lengths`` is below flat's."""
    return mean_variance(RangeTree(d, fanout, epsilon), lengths) < mean_variance(FlatHistogram(d, epsilon), lengths)

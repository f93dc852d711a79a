"""Hierarchical count-of-counts histograms (Kuo, Chiu, Kifer, Hay and Machanavajjhala, PVLDB 2018
poster; errata fixed).

For every node ``tau`` of a public region hierarchy, how many groups (households) of ``j`` people it holds:
``H[j]``, ``j = 1 .. J``. The groups and the hierarchy are public, persons are private: neighbours differ by one
person, which moves one group from size ``j`` to ``j +- 1``.

* **Representations.** ``H`` (count of counts; sensitivity 2: two entries change by 1), the cumulative
  ``H_c[j] = #groups of size <= j`` (sensitivity 1: one entry changes) and the unattributed ``H_q`` (the sorted group
  sizes, one per group). ``H_c[J]`` is the public number of groups ``G``.
* **Geometric mechanism** (Ghosh et al.): integer noise ``P(k) = (1 - a) / (1 + a) a^|k|``, ``a = e^(-eps / Delta)``:
  exactly :class:`operators.noise.DiscreteLaplace` (the poster prints the normaliser with ``e^-eps``, which sums to
  1.887 at eps = 1, Delta = 2). Added to ``H_c`` with ``Delta = 1``, exact and keyed.
* **Least squares** (the poster's naive strategy, per node): the closest non-decreasing ``H_c`` in ``[0, G]`` with
  ``H_c[J] = G``: pool-adjacent-violators, then clipping (for L2 isotonic regression a box is applied after PAV),
  then rounding; its differences give a non-negative integer ``H`` summing to ``G``.
* **Top-down matching** (section "proposed method"): pairing two sorted lists of sizes in order is a least-cost
  one-to-one matching for ``|x - y|`` and ``(x - y)^2`` costs (:func:`match`). The poster "merges" each matched
  pair without a formula; here the merge is Hay et al.'s two passes with that matching in place of sums
  (:meth:`CountOfCounts.release`): bottom-up a node's sizes become a weighted average of its own estimate and its
  children's union, top-down every child group takes its parent's final matched size, so every node's groups are
  exactly its children's (consistent at every level) and the root uses every estimate below it.

Budget: a person is in one node per level, so with ``L`` levels each level's noise is at ``eps / L`` and the release
is eps-DP (sequential composition over levels, parallel within one).

>>> cumulative([2, 1, 0, 1]).tolist(), unattributed([2, 1, 0, 1]).tolist()      # the poster's root
([2, 3, 3, 4], [1, 1, 2, 4])
>>> pav([1, 3, 2, 4]).tolist(), pav([5, 1, 1, 1, 5]).tolist()
([1.0, 2.5, 2.5, 4.0], [2.0, 2.0, 2.0, 2.0, 5.0])
>>> match([1, 1, 2, 4], [[1, 4], [1, 2]])
[[1, 4], [1, 2]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from operators.noise import DiscreteLaplace, Domain, KeyedGenerator

__all__ = [
    "CountOfCounts",
    "counts_of",
    "cumulative",
    "estimate_node",
    "match",
    "pav",
    "unattributed",
]


def counts_of(sizes: Any, max_size: int) -> np.ndarray:
    """``H``: how many of the groups have size ``j``, ``j = 1 .. J`` (sizes above ``J`` count as ``J``)."""
    s = np.clip(np.asarray(sizes, dtype=np.int64).reshape(-1), 1, max_size)
    return np.bincount(s - 1, minlength=max_size).astype(np.int64)


def cumulative(h: Any) -> np.ndarray:
    """``H_c[j] = H[1] + ... + H[j]``."""
    return np.cumsum(np.asarray(h, dtype=np.int64))


def unattributed(h: Any) -> np.ndarray:
    """``H_q``: the sorted group sizes (size ``j`` repeated ``H[j]`` times)."""
    h = np.asarray(h, dtype=np.int64)
    return np.repeat(np.arange(1, h.size + 1), np.maximum(h, 0))


def pav(y: Any) -> np.ndarray:
    """The non-decreasing least-squares fit (pool adjacent violators, equal weights)."""
    values: list[float] = []
    weights: list[int] = []
    for v in np.asarray(y, dtype=np.float64).reshape(-1).tolist():
        values.append(v)
        weights.append(1)
        while len(values) > 1 and values[-2] > values[-1]:
            w = weights[-2] + weights[-1]
            values[-2] = (values[-2] * weights[-2] + values[-1] * weights[-1]) / w
            weights[-2] = w
            values.pop()
            weights.pop()
    return np.repeat(np.array(values), weights)


def estimate_node(noisy_cumulative: Any, groups: int) -> np.ndarray:
    """``H`` (non-negative integers summing to ``groups``) from a noisy ``H_c``: PAV, clip to ``[0, G]``,
    ``H_c[J] = G``, round, differences."""
    hc = np.asarray(noisy_cumulative, dtype=np.float64).reshape(-1).copy()
    hc[-1] = groups
    fit = np.clip(pav(hc), 0.0, groups)
    fit[-1] = groups
    hc_int = np.maximum.accumulate(np.rint(fit).astype(np.int64))
    return np.diff(np.concatenate([[0], hc_int]))


def match(parent_sizes: Sequence[int], children_sizes: Sequence[Sequence[int]]) -> list[list[int]]:
    """Each child's final group sizes: its estimated sizes, sorted, replaced by the parent's sizes they pair with
    when both sides are sorted (``len(parent) = sum of len(children)``)."""
    parent = sorted(int(x) for x in parent_sizes)
    tagged = sorted((int(s), k, i) for k, child in enumerate(children_sizes) for i, s in enumerate(sorted(child)))
    if len(tagged) != len(parent):
        msg = "a parent's groups are its children's groups: the counts must agree"
        raise ValueError(msg)
    out = [[0] * len(c) for c in children_sizes]
    for p, (_, k, i) in zip(parent, tagged, strict=True):
        out[k][i] = p
    return [sorted(c) for c in out]


class CountOfCounts:
    """One release of the count-of-counts histograms of a region hierarchy (eps-DP at the person level).

    ``children`` maps a node to its children (the root is the node no one lists); ``groups`` maps every *leaf* to the
    sizes of its groups (public count, private sizes). ``max_size`` is the public ``J``.
    """

    def __init__(self, epsilon: float, max_size: int) -> None:
        if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or not 0 < epsilon <= 30:
            msg = f"epsilon must be a number in (0, 30] (got {epsilon!r})"
            raise ValueError(msg)
        if isinstance(max_size, bool) or not isinstance(max_size, int) or not 1 <= max_size <= 1 << 20:
            msg = f"max_size must be an integer in [1, 2^20] (got {max_size!r})"
            raise ValueError(msg)
        self.epsilon = float(epsilon)
        self.max_size = max_size

    @staticmethod
    def _levels(children: Mapping[str, Sequence[str]]) -> tuple[str, list[list[str]]]:
        listed = {c for cs in children.values() for c in cs}
        roots = [n for n in children if n not in listed]
        if len(roots) != 1:
            msg = "the hierarchy needs exactly one root"
            raise ValueError(msg)
        levels, frontier = [], [roots[0]]
        while frontier:
            levels.append(frontier)
            frontier = [c for n in frontier for c in children.get(n, ())]
        return roots[0], levels

    def release(self, children: Mapping[str, Sequence[str]], groups: Mapping[str, Sequence[int]],
                gen: KeyedGenerator, *, address: int = 0, top_down: bool = True) -> dict[str, np.ndarray]:
        """``H`` of every node: per node least squares (``top_down=False``), then the two passes with matching."""
        _, levels = self._levels(children)
        sizes: dict[str, list[int]] = {}
        for level in reversed(levels):
            for n in level:
                kids = children.get(n, ())
                sizes[n] = [s for c in kids for s in sizes[c]] if kids else [int(x) for x in groups[n]]
        dl = DiscreteLaplace(self.epsilon / len(levels), 1)  # Delta(H_c) = 1; eps / L per level
        domain = (int(Domain.RANGES) << 16) | 0x8000
        est: dict[str, np.ndarray] = {}
        pos = 0
        for level in levels:
            for n in level:
                hc = cumulative(counts_of(sizes[n], self.max_size))
                noise = gen.discrete_laplace(domain, address, pos, self.max_size, dl)
                pos += self.max_size
                est[n] = estimate_node(hc + noise, len(sizes[n]))
        if not top_down:
            return est
        return self._consistent(children, est, levels)

    def _consistent(self, children: Mapping[str, Sequence[str]], est: dict[str, np.ndarray],
                    levels: list[list[str]]) -> dict[str, np.ndarray]:
        """Hay et al.'s two passes with sorted matching in place of sums: bottom-up, a node's sizes become
        ``a z_own + (1 - a) z_children`` (its own sorted estimate and the sorted union of its children's, paired in
        order; ``a = (b^l - b^(l-1)) / (b^l - 1)`` for ``b`` children at height ``l``); top-down, the root's
        rounded sizes are final and every child group takes its parent's matched size."""
        z: dict[str, np.ndarray] = {}
        height: dict[str, int] = {}
        for level in reversed(levels):
            for n in level:
                kids = list(children.get(n, ()))
                own = unattributed(est[n]).astype(np.float64)
                if not kids:
                    z[n], height[n] = own, 1
                    continue
                height[n] = 1 + max(height[c] for c in kids)
                b, lv = len(kids), height[n]
                a = 1.0 if b == 1 else (b**lv - b ** (lv - 1)) / (b**lv - 1)
                union = np.sort(np.concatenate([z[c] for c in kids]))
                z[n] = a * own + (1.0 - a) * union
        root = levels[0][0]
        final = {root: np.sort(np.clip(np.rint(z[root]), 1, self.max_size).astype(np.int64))}
        for level in levels:
            for n in level:
                kids = list(children.get(n, ()))
                if not kids:
                    continue
                tagged = sorted((float(v), k, i) for k, c in enumerate(kids) for i, v in enumerate(z[c]))
                out = [np.zeros(len(z[c]), dtype=np.int64) for c in kids]
                for size, (_, k, i) in zip(final[n].tolist(), tagged, strict=True):
                    out[k][i] = size
                for c, o in zip(kids, out, strict=True):
                    final[c] = np.sort(o)
        return {n: counts_of(v, self.max_size) if v.size else np.zeros(self.max_size, dtype=np.int64)
                for n, v in final.items()}

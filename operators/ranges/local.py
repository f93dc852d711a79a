"""Local range counting over a value domain (Friis, thesis 2021, sections 8.2-8.3; its oracle replaced by proper ones).

Every device holds one bucket ``v`` of ``0 .. d - 1`` and reports once, eps-LDP; the server never sees ``v``.

* **Local flat** (section 8.2): the device reports ``v`` through a frequency oracle over the ``d`` buckets (GRR or OUE
  from :mod:`operators.categorical`, whichever has the smaller variance: GRR while ``d <= 3 e^eps + 2``); the server's
  unbiased bucket counts are summed over the range. The thesis's "OLH without hashing" is randomized response at a
  larger eps than it states (``ln(1 + g e^eps / (g - 1))``): not copied.
* **Local hierarchical** (section 8.3): a b-ary tree over the buckets; every device picks *one* level of the ``h``
  below the root uniformly at random (user splitting, independent of its value, so the level is not secret) and
  reports its node at that level through the oracle best for that level's ``b^(h - j)`` nodes, at the full eps. The
  server estimates a node's count Horvitz-Thompson style, ``h`` times the oracle's estimate over the devices of that
  level, which is unbiased, and answers a range from its decomposition (at most ``2 (b - 1)`` nodes per level).

Exact variances (:func:`flat_range_variance`, :meth:`LocalTree.range_variance`), for a range holding ``n_S`` of
``N`` devices: one oracle report lands in a set ``S`` of ``r`` cells with probability ``a = p + (r - 1) q`` (GRR) if
its value is in ``S`` and ``b = r q`` otherwise; OUE's ``r`` bits are independent. Flat:
``Var = [n_S a(1-a) + (N - n_S) b(1-b)] / (p - q)^2``. Hierarchical: with ``S_j`` the decomposition's nodes at level
``j``, the per-level terms add up (the levels' value sets are disjoint):
``Var = sum_j h [n_j a_j(1-a_j) + (N - n_j) b_j(1-b_j)] / (p_j - q_j)^2 + (h - 1) n_j`` (the last term is the level
sampling's own variance).

>>> import numpy as np
>>> from operators.noise import KeyedGenerator
>>> tree = LocalTree(d=16, fanout=4, epsilon=2.0)
>>> values = np.repeat(np.arange(16), 50)
>>> levels, reports = tree.perturb(values, KeyedGenerator(bytes(32)))
>>> est = tree.estimate(levels, reports)
>>> len(est), [e.size for e in est]
(2, [16, 4])
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from operators.categorical.grr import grr_estimate, grr_parameters, grr_perturb
from operators.categorical.hadamard import hr_estimate
from operators.categorical.release import choose_local_mechanism, local_perturb, report_outputs
from operators.categorical.unary import unary_parameters, unary_perturb_many
from operators.noise import Domain, KeyedGenerator
from operators.ranges.decomposition import decompose, tree_height

__all__ = [
    "LocalTree",
    "ReportLayout",
    "answer_from_levels",
    "best_oracle",
    "flat_estimate",
    "flat_perturb",
    "flat_range_variance",
    "prefer_local_tree",
]

_LEVEL = 0x4000  # noise purposes (Domain.RANGES): the level choice, and each level's reports
_REPORT = 0x4100


def best_oracle(d: int, epsilon: float) -> str:
    """GRR while its variance per device, ``(d - 2 + e^eps) / (e^eps - 1)^2``, is at most OUE's ``4 e^eps /
    (e^eps - 1)^2``, i.e. ``d <= 3 e^eps + 2``; OUE beyond."""
    return "grr" if d - 2 + math.exp(epsilon) <= 4 * math.exp(epsilon) else "oue"


def _pq(oracle: str, d: int, epsilon: float) -> tuple[float, float]:
    return grr_parameters(epsilon, max(d, 2)) if oracle == "grr" else unary_parameters(epsilon, "oue")


def _report(oracle: str, values: np.ndarray, d: int, epsilon: float, u: np.ndarray) -> np.ndarray:
    """GRR: the reported cell per device; OUE: an ``n x d`` boolean matrix of reported bits."""
    if oracle == "grr":
        return grr_perturb(values, max(d, 2), epsilon, u[: 2 * values.size])
    return unary_perturb_many(values, d, epsilon, u[: values.size * d])


def _support(oracle: str, reports: np.ndarray, d: int) -> np.ndarray:
    if oracle == "grr":
        return np.bincount(reports, minlength=max(d, 2))[:d]
    return reports.sum(axis=0)


def _uniforms(gen: KeyedGenerator, purpose: int, count: int) -> np.ndarray:
    return gen.uniforms((int(Domain.RANGES) << 16) | purpose, 0, 0, count)


def flat_perturb(buckets: Any, d: int, epsilon: float, gen: KeyedGenerator, oracle: str | None = None) -> np.ndarray:
    """Devices' reports (simulated here; a device runs the same randomizer on its own keyed generator)."""
    v = np.asarray(buckets, dtype=np.int64).reshape(-1)
    oracle = oracle or best_oracle(d, epsilon)
    per = 2 if oracle == "grr" else d
    return _report(oracle, v, d, epsilon, _uniforms(gen, _REPORT, per * v.size))


def flat_estimate(reports: np.ndarray, n: int, d: int, epsilon: float, oracle: str | None = None) -> np.ndarray:
    """Unbiased bucket counts ``(C_i - n q) / (p - q)``."""
    oracle = oracle or best_oracle(d, epsilon)
    p, q = _pq(oracle, d, epsilon)
    return (_support(oracle, reports, d).astype(np.float64) - n * q) / (p - q)


def _set_variance(oracle: str, d: int, epsilon: float, r: int, n_in: int, n_all: int) -> float:
    """Variance of the unbiased estimate of how many of ``n_all`` devices hold a value in a set of ``r`` cells."""
    p, q = _pq(oracle, d, epsilon)
    if oracle == "grr":
        a, b = p + (r - 1) * q, r * q
        return (n_in * a * (1 - a) + (n_all - n_in) * b * (1 - b)) / (p - q) ** 2
    return (n_in * (p * (1 - p) + (r - 1) * q * (1 - q)) + (n_all - n_in) * r * q * (1 - q)) / (p - q) ** 2


def flat_range_variance(counts: Any, lo: int, hi: int, epsilon: float, oracle: str | None = None) -> float:
    """The exact variance of the local flat answer to ``[lo, hi]`` given the true bucket counts."""
    c = np.asarray(counts, dtype=np.int64)
    d = c.size
    oracle = oracle or best_oracle(d, epsilon)
    return _set_variance(oracle, d, epsilon, hi - lo + 1, int(c[lo : hi + 1].sum()), int(c.sum()))


class LocalTree:
    """The local hierarchical histogram with user splitting over the ``h`` levels below the root."""

    def __init__(self, d: int, fanout: int, epsilon: float) -> None:
        if d < 2 or fanout < 2 or not 0 < epsilon <= 30:
            msg = "a local tree needs d >= 2, fanout >= 2 and epsilon in (0, 30]"
            raise ValueError(msg)
        self.d, self.fanout, self.epsilon = d, fanout, float(epsilon)
        self.height = tree_height(d, fanout)
        self.sizes = [fanout ** (self.height - j) for j in range(self.height)]  # nodes per level, leaves first
        self.oracles = [best_oracle(s, self.epsilon) for s in self.sizes]

    def perturb(self, buckets: Any, gen: KeyedGenerator) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each device's level (uniform, independent of its value) and, per level, its devices' reports."""
        v = np.asarray(buckets, dtype=np.int64).reshape(-1)
        u = _uniforms(gen, _LEVEL, v.size)
        levels = np.minimum((u * self.height).astype(np.int64), self.height - 1)
        reports = []
        for j, size in enumerate(self.sizes):
            node = v[levels == j] // self.fanout**j
            per = 2 if self.oracles[j] == "grr" else size
            reports.append(_report(self.oracles[j], node, size, self.epsilon,
                                   _uniforms(gen, _REPORT + 1 + j, per * node.size)))
        return levels, reports

    def estimate(self, levels: np.ndarray, reports: list[np.ndarray]) -> list[np.ndarray]:
        """Per level (leaves first), ``h`` times the oracle's unbiased node counts over that level's devices."""
        out = []
        for j, size in enumerate(self.sizes):
            n = int(np.count_nonzero(levels == j))
            p, q = _pq(self.oracles[j], size, self.epsilon)
            sup = _support(self.oracles[j], reports[j], size).astype(np.float64)
            out.append(self.height * (sup - n * q) / (p - q))
        return out

    def answer(self, est: list[np.ndarray], lo: int, hi: int) -> float:
        """The range from its decomposition (the root, if the range is everything, from the level below)."""
        return answer_from_levels(est, self.fanout, lo, hi)

    def range_variance(self, counts: Any, lo: int, hi: int) -> float:
        """The exact variance of :meth:`answer` given the true bucket counts (module docstring)."""
        c = np.zeros(self.fanout**self.height, dtype=np.int64)
        c[: len(counts)] = np.asarray(counts, dtype=np.int64)
        n_all = int(c.sum())
        nodes: dict[int, list[int]] = {}
        for j, i in decompose(lo, hi, fanout=self.fanout):
            if j >= self.height:
                j, i = self.height - 1, -1
                nodes.setdefault(j, []).extend(range(self.sizes[j]))
            else:
                nodes.setdefault(j, []).append(i)
        var = 0.0
        for j, idx in nodes.items():
            w = self.fanout**j
            n_in = int(sum(c[i * w : (i + 1) * w].sum() for i in set(idx)))
            h = self.height
            var += h * _set_variance(self.oracles[j], self.sizes[j], self.epsilon, len(set(idx)), n_in, n_all)
            var += (h - 1) * n_in
        return var


def prefer_local_tree(d: int, fanout: int, epsilon: float, devices: int, lengths: Any) -> bool:
    """The local rule: the hierarchy when its mean variance over ranges of ``lengths`` (uniform data, ``devices``
    devices, up to 16 positions each) is below the flat histogram's. The thesis's rule of thumb ``r > 2 b log_b^2 d``
    (its Table 2) is the node-count argument behind it."""
    counts = np.full(d, devices // d, dtype=np.int64)
    counts[: devices % d] += 1
    tree = LocalTree(d, fanout, epsilon)
    flat_total = tree_total = 0.0
    for r in np.asarray(lengths, dtype=np.int64).reshape(-1):
        r = int(min(max(r, 1), d))
        for lo in np.unique(np.linspace(0, d - r, num=min(16, d - r + 1)).round().astype(np.int64)).tolist():
            flat_total += flat_range_variance(counts, lo, lo + r - 1, epsilon)
            tree_total += tree.range_variance(counts, lo, lo + r - 1)
    return tree_total < flat_total


def answer_from_levels(levels: list[Any], fanout: int, lo: int, hi: int) -> float:
    """A range ``[lo, hi]`` of buckets from per-level node estimates (leaves first, the root not included): the sum
    over its decomposition (at most ``2 (b - 1)`` nodes per level); the root, when the range is everything, is the
    sum of the level below it. With one level (the flat histogram) it is the sum of the range's buckets."""
    if len(levels) == 1:
        return float(np.sum(np.asarray(levels[0], dtype=np.float64)[lo : hi + 1]))
    height, total = len(levels), 0.0
    for j, i in decompose(lo, hi, fanout=fanout):
        total += float(np.sum(levels[height - 1])) if j >= height else float(levels[j][i])
    return total


class ReportLayout:
    """The one-number reports of a local range stream in the daemon (a device's report is one integer).

    Flat (``tree=False``): one level of ``d`` buckets. Tree: the ``h`` levels below the root of the b-ary tree, leaves
    first (``sizes[j] = b^(h - j)`` nodes). Every device picks its level uniformly from its own first uniform
    (independent of its value), reports its node there through that level's one-number oracle (GRR or Hadamard
    Response, :func:`operators.categorical.release.choose_local_mechanism`; OUE's bit vector does not fit the
    daemon's one-number journal) at the full eps, and sends ``offsets[j] + report``. The server splits the period's
    tally by level and estimates each level ``h`` times the oracle's unbiased counts (Horvitz-Thompson, as
    :class:`LocalTree`).

    >>> lay = ReportLayout(16, 4, 1.0, tree=True)
    >>> lay.sizes, lay.oracles, lay.offsets, lay.total
    ([16, 4], ['hr', 'grr'], [0, 32], 36)
    >>> ReportLayout(8, 4, 1.0, tree=False).sizes
    [8]
    """

    uniforms_per_report = 3  # the level, then the oracle's two

    def __init__(self, d: int, fanout: int, epsilon: float, *, tree: bool) -> None:
        if d < 2 or fanout < 2 or not 0 < epsilon <= 30:
            msg = "a local range stream needs buckets >= 2, fanout >= 2 and epsilon in (0, 30]"
            raise ValueError(msg)
        self.d, self.fanout, self.epsilon, self.tree = d, fanout, float(epsilon), tree
        self.height = tree_height(d, fanout) if tree else 1
        self.sizes = [fanout ** (self.height - j) for j in range(self.height)] if tree else [d]
        self.oracles = [choose_local_mechanism(self.epsilon, s) for s in self.sizes]
        self.outputs = [report_outputs(o, self.epsilon, s) for o, s in zip(self.oracles, self.sizes, strict=True)]
        self.offsets = [int(x) for x in np.concatenate([[0], np.cumsum(self.outputs)[:-1]])]
        self.total = int(sum(self.outputs))

    def report(self, buckets: Any, u: Any) -> np.ndarray:
        """The device side: the reports of ``buckets`` (integers in ``[0, d)``) from 3 uniforms each."""
        v = np.asarray(buckets, dtype=np.int64).reshape(-1)
        u = np.asarray(u, dtype=np.float64).reshape(-1)
        if u.size < 3 * v.size:
            msg = "three uniforms per report"
            raise ValueError(msg)
        levels = np.minimum((u[: v.size] * self.height).astype(np.int64), self.height - 1)
        out = np.empty(v.size, dtype=np.int64)
        rest = u[v.size : 3 * v.size]
        for j, size in enumerate(self.sizes):
            sel = np.flatnonzero(levels == j)
            if sel.size:
                node = v[sel] // self.fanout**j
                uu = np.stack([rest[2 * sel], rest[2 * sel + 1]], axis=1).reshape(-1)
                out[sel] = self.offsets[j] + local_perturb(self.oracles[j], node, size, self.epsilon, uu)
        return out

    def estimate(self, tally: dict[int, int]) -> tuple[list[np.ndarray], int]:
        """(per-level node estimates, leaves first; the number of reports) of one period's tally of report values."""
        cells = np.fromiter((int(k) for k in tally), dtype=np.int64, count=len(tally))
        counts = np.fromiter((int(c) for c in tally.values()), dtype=np.int64, count=len(tally))
        out = []
        for j, size in enumerate(self.sizes):
            lo, width = self.offsets[j], self.outputs[j]
            sel = (cells >= lo) & (cells < lo + width)
            rel, cnt = cells[sel] - lo, counts[sel]
            n = int(cnt.sum())
            if self.oracles[j] == "grr":
                support = np.zeros(size, dtype=np.int64)
                np.add.at(support, rel, cnt)
                est = grr_estimate(support, n, size, self.epsilon)
            else:
                est = hr_estimate(np.repeat(rel, cnt), size, self.epsilon)
            out.append(self.height * np.asarray(est, dtype=np.float64))
        return out, int(counts.sum())

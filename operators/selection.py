"""Calibrated, private choice of the threshold theta, the smoothed layers s and the smoother's start.

The paper picks theta by Eq. 6 (a score with a guessed constant c = 60 and log_b r levels) and s by Eq. 7 (a bias
term ``b^(2s) theta^2 / 36`` that does not look at the data). This module replaces both with one error model whose
data-dependent parts are measured on the holdout, privately.

**The error model.** For a range of uniform length l in [1, r] over the released ticks, with truncation at theta
and a hierarchy of ``L = h - s`` layers at ``eps / L`` each, noise, truncation and smoothing add up (the noise is
independent of the rest and has mean 0)::

    MSE(theta, s) = G_s theta^2 / eps^2  +  E[l^2] (S_theta / m)^2  +  SM_s                         (model)

* ``G_s theta^2 / eps^2`` is the noise. Node noise has variance ``2 (theta L / eps)^2``; ``G_s = 2 L^2 g_s`` where
  ``g_s`` is the variance of a random range's answer when every node has unit-variance noise, after consistency
  (App. C) and the recent smoother (App. D). This *is* the level constant of Eq. 6 derived from the hierarchy
  actually used: Eq. 6 writes ``(b - 1) log_b(r)^3`` with 5 (paper) or 6 (reference code) levels whatever s is;
  the hierarchy after smoothing has L = h - s levels and consistency lowers the node count. ``g_s`` is computed once
  per (b, r, s) by propagating unit noise through the same two passes and the same smoother (a public computation
  with a fixed seed, :func:`noise_gain`); for b = 16, r = 2^20 it gives G = 1,384 / 755 / 336 / 111 / 19 for
  s = 0..4, where Eq. 6's constant ``2 (b-1) L^3`` would say 3,750 / 1,920 / 810 / 240 / 30 (and the reference
  code's 6 levels 6,480 whatever s).
* ``E[l^2] (S_theta / m)^2`` is the truncation bias: ``S_theta`` the sum of the holdout's excess over theta, so a
  range of length l loses about ``l S_theta / m``; ``E[l^2] = (r + 1)(2r + 1) / 6``. It is written
  ``S_theta = e m_theta``: Eq. 5's count of values above theta times their mean excess ``e`` (Eq. 6 guesses
  ``e = c = 60``; here it is measured).
* ``SM_s`` is the smoother's error at the two ends of a range: inside a leaf of ``w = b^s`` ticks the recent
  smoother predicts ``j`` ticks by ``j/w`` times the previous leaf's sum. Writing the partial sum as its share of
  the leaf sum plus a bridge, the squared error averaged over j is ``E[dS^2] / 3`` plus the bridge's
  ``E[dS^2] / 12`` (exact for locally stationary data), with ``dS`` the difference of consecutive leaf sums; two
  ends give ``SM_s = (5/6) E[dS_w^2]``, and ``E[dS^2] = (pi/2) E|dS|^2`` for a normal dS. It is measured on the
  holdout for every s whose leaf fits at least twice in it; larger s are extrapolated by the growth of a stationary
  series (x b per level); a level is never taken below b times the level under it (noise can not make a coarser
  leaf look more predictable).
* The first leaf starts from a prediction (below); its noise ``v`` per tick costs ranges cut in that leaf
  ``(w / r) (w^2 / 3) Var(v)``.

**Privately, from the holdout only** (``eps_T`` = the threshold budget, split by sequential composition; the
shares are :data:`BUDGET_SPLIT`):

1. 10% (more, up to 30%, taken from step 3 when m eps_T is small): ``q_k``, the candidate with about ``k`` holdout
   values above it, ``k`` = twice the rank error of this step (as high in the tail as the budget can see), by the
   exponential mechanism on 48 geometric points (utility ``-|m_t - k|``, sensitivity 1, not monotone: noise
   ``Exp(2 / eps)``). When even 30% cannot get ``k <= m / 4``, theta comes from counts alone (``e = 1``) with the
   shares of steps 1 and 2: report-noisy-max over every candidate, its noise drawn from the largest down
   (:mod:`operators.noisy_max`, the same distribution for a few draws).
2. 10%: ``e``, the mean excess of the values above ``q_k`` clipped at ``q_k``: the clipped sum (sensitivity q_k)
   and the count (sensitivity 1), half each, exact discrete Laplace. The estimate's own variance is added to its
   square (the expected squared bias under its noise), so a noisy e errs towards a larger theta.
3. 15%: ``E|dS_w|`` for each measurable s at the values truncated at ``2^j <= 2 q_k`` (sensitivity ``2 cap / pairs``:
   one value moves one leaf sum by at most cap, which enters two differences), more budget to coarser leaves
   (shares 1 : 2 : 4 ...), rounded to 1/1024 and exact discrete Laplace. A result below 3 noise scales is not used.
4. 55%: theta by report-noisy-max of ``u(theta) = -sqrt(m^2 min_s MSE_noise+smooth(theta, s) / (E[l^2] e^2) +
   m_theta^2)`` (= -m RMSE / (sqrt(E[l^2]) e) of the model) over 72 candidates 5% apart in [q_k / 4, 8 q_k].
   Only ``m_theta`` depends on the holdout once e and SM are released, ``sqrt(a^2 + x^2)`` is 1-Lipschitz in x and
   every u moves the same way when a value grows (monotone): sensitivity 1, noise ``Exp(1 / eps)``.
5. s = argmin of the model at the chosen theta (post-processing).
6. 10%: the smoother's start. The paper starts every stream predicting ``theta / 2`` per tick for the first leaf,
   which at s = 3 or 4 costs more than all the noise on some data. Here the start is the holdout's mean truncated at
   theta: ``(sum min(v, theta) + DLap(theta / eps)) / m``, clipped to [0, theta].

All noise comes from the keyed generator (domain THRESHOLD, addresses 1-5; Eq. 6's choice keeps address 0).

>>> g = noise_gain(4, 256, 1)
>>> 0 < g < 4 * 3          # below (b - 1) L nodes of unit variance
True
>>> noise_gain(4, 256, 1) == g     # computed once per configuration, deterministic
True
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import numpy as np

from operators.config import tree_height
from operators.hierarchy import layer_weight
from operators.noise import (
    DiscreteLaplace,
    Domain,
    KeyedGenerator,
    KeyRows,
    _stacked_key_words,
    compiled_loaded,
    discrete_laplace_one_many,
    expect_draws,
    shared_laplace,
)
from operators.noisy_max import WordStream, report_noisy_max_drawn
from operators.threshold import m_theta, report_noisy_max, smoother_layers

__all__ = [
    "BUDGET_SPLIT",
    "BlockStats",
    "Cells",
    "Selection",
    "choose",
    "noise_constant",
    "noise_gain",
    "prepare",
    "range_length_moment",
    "simulate_noise_gain",
]

BUDGET_SPLIT = {"quantile": 0.10, "excess": 0.10, "smoothing": 0.15, "threshold": 0.55, "start": 0.10}
_MAX_QUANTILE_SHARE = 0.3
_FEW = 8  # BlockStats.add takes at most this many readings one at a time in Python (numpy's set-up costs more)
_THETA_POINTS = 72  # theta candidates between q_k / 4 and 8 q_k, 5% apart
_STEPS = 1024.0  # statistics are rounded to 1/1024 before their integer noise
_QUANTILE_GRID = 48  # the percentile is searched on at most this many geometric points
_SIM_QUERIES = 500
_SIM_WORK = 1 << 21  # leaves + ranges simulated per (b, r, s) ...
_SIM_MAX_REPS = 2048  # ... in at least 4 and at most 2,048 trees
_SIM_MIN_REPS = 4
_SIM_MAX_TICKS = 1 << 22


def range_length_moment(query_range: int) -> float:
    """``E[l^2]`` for a length uniform in [1, r]: ``(r + 1)(2r + 1) / 6``."""
    r = float(query_range)
    return (r + 1.0) * (2.0 * r + 1.0) / 6.0


# noise_gain(16, 2^20, s) for s = 0..4, as simulate_noise_gain computes it (a test checks they agree): the default
# hierarchy needs no simulation at start
_DEFAULT_GAINS = {(16, 1 << 20): (27.672276286731705, 23.591737454449103, 18.676415056290914, 13.871178481940579,
                                  9.667469783397872)}


@lru_cache(maxsize=64)
def noise_gain(fanout: int, query_range: int, s: int) -> float:
    """``g_s`` of :func:`simulate_noise_gain`, from a table for the default hierarchy (b = 16, r = 2^20)."""
    known = _DEFAULT_GAINS.get((fanout, query_range))
    if known is not None and 0 <= s < len(known):
        return known[s]
    return simulate_noise_gain(fanout, query_range, s)


def simulate_noise_gain(fanout: int, query_range: int, s: int) -> float:
    """``g_s``: variance of a uniform random range's answer when every node has unit-variance noise.

    Propagates Gaussian unit noise (public simulation, fixed seed: a constant of the mechanism, not privacy noise)
    through Hay's two passes over a whole tree and the recent smoother, exactly as the perturber does, and averages
    the squared error of 500 random ranges per tree over 4 to 2,048 trees (2^21 leaves and ranges in all; well
    under a second per configuration, once per process; the default one is a table). Trees longer than 2^22 ticks
    fall back to the count of Eq. 6, ``(b - 1) L``.
    """
    b, r = fanout, query_range
    h = tree_height(r, b)
    layers = h - s
    w = b**s
    if r > _SIM_MAX_TICKS:
        return float((b - 1) * layers)
    rng = np.random.Generator(np.random.PCG64(20211115))
    n_leaves = r // w
    reps = min(_SIM_MAX_REPS, max(_SIM_MIN_REPS, _SIM_WORK // (n_leaves + _SIM_QUERIES)))
    chunk = max(1, min(reps, (1 << 18) // (n_leaves + _SIM_QUERIES)))  # trees simulated together, a row each
    total, done_reps = 0.0, 0
    while done_reps < reps:
        k = min(chunk, reps - done_reps)
        zs = []
        n = n_leaves
        for j in range(layers):
            x = rng.standard_normal((k, n))
            if j == 0:
                z = x
            else:
                a = layer_weight(j + 1, b)
                z = a * x + (1.0 - a) * zs[-1].reshape(k, -1, b).sum(axis=2)
            zs.append(z)
            n //= b
        c = zs[-1]
        for j in range(layers - 2, -1, -1):
            z = zs[j]
            c = z + np.repeat((c - z.reshape(k, -1, b).sum(axis=2)) / b, b, axis=1)
        # cumulative release noise up to tick t = k w + j: the leaves before k, plus j ticks at leaf k's prediction
        done = np.concatenate([np.zeros((k, 1)), np.cumsum(c, axis=1)], axis=1)
        pred = np.concatenate([np.zeros((k, 1)), c / w], axis=1)
        length = rng.integers(1, r + 1, size=(k, _SIM_QUERIES))
        start = (rng.random((k, _SIM_QUERIES)) * (r - length + 1)).astype(np.int64)
        end = start + length
        rows = np.arange(k)[:, None]
        err = (done[rows, end // w] + (end % w) * pred[rows, end // w]) - (
            done[rows, start // w] + (start % w) * pred[rows, start // w]
        )
        total += float(np.sum(np.mean(err**2, axis=1)))
        done_reps += k
    return total / reps


def prepare(fanout: int, query_range: int) -> None:
    """Compute every ``g_s`` of a hierarchy now (the daemon calls it at start, so that no stream's end of holdout
    waits for the simulation)."""
    for s in range(tree_height(query_range, fanout)):
        noise_gain(fanout, query_range, s)


def noise_constant(fanout: int, query_range: int, s: int) -> float:
    """``G_s = 2 L^2 g_s``: the noise of a random range is ``G_s theta^2 / eps^2`` (theta in quantized units)."""
    layers = tree_height(query_range, fanout) - s
    return 2.0 * layers**2 * noise_gain(fanout, query_range, s)


@functools.lru_cache(maxsize=64)
def _noise_constants(fanout: int, query_range: int) -> dict[int, float]:
    """``G_s`` for every ``s`` of the hierarchy (shared and never modified: the choice reads it for every stream)."""
    return {s: noise_constant(fanout, query_range, s) for s in range(tree_height(query_range, fanout))}


@functools.cache
def _caps(top: int) -> np.ndarray:
    """The caps ``2^0 .. 2^top`` (one read-only array shared by every stream with this bound)."""
    caps = np.array([2**k for k in range(top + 1)], dtype=np.int64)
    caps.flags.writeable = False
    return caps


@functools.cache
def _no_blocks(n_caps: int) -> tuple[np.ndarray, np.ndarray]:
    """Empty, read-only block statistics (no width fits the holdout), shared."""
    out = (np.zeros((3, 0, n_caps), dtype=np.int64), np.zeros(0, dtype=np.int64))
    for a in out:
        a.flags.writeable = False
    return out


@functools.cache
def _widths(fanout: int, holdout: int, query_range: int) -> tuple[int, ...]:
    """The leaf widths ``b^s`` (s >= 1) whose leaf fits at least twice in the holdout (one tuple per configuration)."""
    h = tree_height(query_range, fanout)
    return tuple(fanout**s for s in range(1, h) if 2 * fanout**s <= holdout)


class BlockStats:
    """Sufficient statistics of the holdout for ``E|dS_w|``: per leaf width and per cap ``2^k``, the partial sum
    of the current block, the previous block's sum and the sum of absolute differences (O(widths * caps) numbers).

    The three tables live in one int64 buffer (``partial``, ``prev`` and ``acc`` are views of it; ``acc`` holds
    float64 values in its third plane), so that a holdout keeps two arrays here, not four (about 250 bytes of array
    headers less a stream)."""

    __slots__ = ("_buf", "caps", "pairs", "pos", "widths")

    def __init__(self, fanout: int, holdout: int, bound_units: int, query_range: int) -> None:
        self.widths = _widths(fanout, holdout, query_range)
        top = max(0, math.floor(math.log2(max(bound_units, 1))))
        self.caps = _caps(top)
        self.pos = 0
        if not self.widths:  # a holdout too short for any block: nothing to keep (shared, read-only empties)
            self._buf, self.pairs = _no_blocks(len(self.caps))
            return
        self._buf = np.zeros((3, len(self.widths), len(self.caps)), dtype=np.int64)
        self._buf[1] = -1  # no previous block yet (acc's plane: zero bits are 0.0)
        self.pairs = np.zeros(len(self.widths), dtype=np.int64)

    @property
    def partial(self) -> np.ndarray:
        """Per width and cap: the sum of the current (incomplete) block, each value truncated at the cap."""
        return self._buf[0]

    @property
    def prev(self) -> np.ndarray:
        """Per width and cap: the sum of the last completed block (-1: none yet)."""
        return self._buf[1]

    @property
    def acc(self) -> np.ndarray:
        """Per width and cap: the sum of ``|dS|`` over consecutive completed blocks (float64)."""
        return self._buf[2].view(np.float64)

    def add(self, units: np.ndarray) -> None:
        units = np.asarray(units, dtype=np.int64)
        if units.size == 0 or not self.widths:
            self.pos += units.size
            return
        if units.size <= _FEW:
            self._add_few(units.tolist())
            return
        tr = np.minimum(units[None, :], self.caps[:, None])  # caps x n
        cum = np.concatenate([np.zeros((len(self.caps), 1), dtype=np.int64), np.cumsum(tr, axis=1)], axis=1)
        n = units.size
        partial, prev, acc = self.partial, self.prev, self.acc
        for i, w in enumerate(self.widths):
            ends = np.arange(w - self.pos % w, n + 1, w)  # positions (in this batch) where a block completes
            if ends.size == 0:
                partial[i] += cum[:, n] - cum[:, 0]
                continue
            starts = np.concatenate([[0], ends[:-1]])
            sums = cum[:, ends] - cum[:, starts]  # caps x completed blocks
            sums[:, 0] += partial[i]
            seq = sums if prev[i, 0] < 0 else np.concatenate([prev[i][:, None], sums], axis=1)
            if seq.shape[1] > 1:
                acc[i] += np.abs(np.diff(seq, axis=1)).sum(axis=1)
                self.pairs[i] += seq.shape[1] - 1
            prev[i] = sums[:, -1]
            partial[i] = cum[:, n] - cum[:, ends[-1]]
        self.pos += n

    def _add_few(self, units: list[int]) -> None:
        """:meth:`add` of a few readings, one at a time in Python integers: the same sums (integers; ``acc`` holds
        integer-valued floats below 2^53, so the order of its additions does not matter). A checkpoint folds in the
        one or two readings a holdout took since the last one, where numpy's set-up per call is most of the cost."""
        caps = self.caps.tolist()
        views = self.partial, self.prev, self.acc
        partial, prev, acc, pairs = views[0].tolist(), views[1].tolist(), views[2].tolist(), self.pairs.tolist()
        pos = self.pos
        for u in units:
            pos += 1
            tr = [u if u < c else c for c in caps]
            for i, w in enumerate(self.widths):
                part = partial[i] = [p + t for p, t in zip(partial[i], tr, strict=True)]
                if pos % w:
                    continue
                if prev[i][0] >= 0:  # a block completed after another: one more difference
                    acc[i] = [a + abs(p - q) for a, p, q in zip(acc[i], part, prev[i], strict=True)]
                    pairs[i] += 1
                prev[i], partial[i] = part, [0] * len(caps)
        self.pos = pos
        views[0][:] = partial
        views[1][:] = prev
        views[2][:] = acc
        self.pairs[:] = pairs

    def copy(self) -> BlockStats:
        """An independent copy (the widths and caps are shared: read-only)."""
        out = BlockStats.__new__(BlockStats)
        out.widths, out.caps, out.pos = self.widths, self.caps, self.pos
        if not self.widths:  # the shared, read-only empties
            out._buf, out.pairs = self._buf, self.pairs
        else:
            out._buf, out.pairs = self._buf.copy(), self.pairs.copy()
        return out

    def to_dict(self) -> dict:
        return {
            "pos": self.pos,
            "partial": self.partial.tolist(),
            "prev": self.prev.tolist(),
            "acc": self.acc.tolist(),
            "pairs": self.pairs.tolist(),
        }

    def load(self, d: dict) -> None:
        self.pos = int(d["pos"])
        shape = self._buf.shape[1:]
        buf = np.empty(self._buf.shape, dtype=np.int64)
        buf[0] = np.array(d["partial"], dtype=np.int64).reshape(shape)
        buf[1] = np.array(d["prev"], dtype=np.int64).reshape(shape)
        buf[2].view(np.float64)[:] = np.array(d["acc"], dtype=np.float64).reshape(shape)
        self._buf = buf
        self.pairs = np.array(d["pairs"], dtype=np.int64).reshape(self.pairs.shape)

    def nbytes(self) -> int:
        return int(self._buf.nbytes + self.pairs.nbytes)


@dataclass(frozen=True)
class Cells:
    """A holdout histogram by its occupied bins: ``count[j]`` values in bin ``index[j]`` (sorted, distinct), none in
    the others of its ``size`` bins (a small holdout's histogram as ``operators.tops`` keeps it)."""

    index: np.ndarray
    count: np.ndarray
    size: int
    total: int  # the values in all (the holdout's readings)

    @classmethod
    def of(cls, hist: dict[int, int], size: int) -> Cells:
        """The cells of a sparse histogram kept as ``{bin: count}``."""
        index = sorted(hist)
        counts = [hist[c] for c in index]
        return cls(np.array(index, dtype=np.int64), np.array(counts, dtype=np.int64), size, sum(counts))

    def dense(self) -> np.ndarray:
        out = np.zeros(self.size, dtype=np.int64)
        out[self.index] = self.count
        return out


@dataclass(frozen=True)
class Selection:
    """What the calibrated choice decided (quantized units), and whether Eq. 6 chose theta (small budgets). Eq. 6's
    choice alone (``selection = "paper"``) leaves ``smoother_layers`` and ``start_units`` None: the configured or Eq.
    7's s, and the prior theta / 2."""

    theta_units: int
    smoother_layers: int | None
    start_units: float | None
    fallback: bool


def _dlap_noise(epsilon: float, sensitivity: float) -> DiscreteLaplace | None:
    """The exact discrete Laplace at ``sensitivity / epsilon`` that :func:`_dlap` draws; None when that scale is above
    the sampler's range (2^36: the statistic would be noise only, so it is not used at all). Below 2^-10 the scale is
    raised to it (more noise than needed, never less)."""
    sens = max(1, math.ceil(sensitivity))
    if sens / epsilon > 2.0**36:
        return None
    return shared_laplace(min(epsilon, sens * 1024.0), sens)


def _dlap(gen: KeyedGenerator, address: int, index: int, epsilon: float, sensitivity: float) -> int | None:
    """One exact discrete Laplace draw at ``sensitivity / epsilon`` (:func:`_dlap_noise`; None: not drawn)."""
    noise = _dlap_noise(epsilon, sensitivity)
    return None if noise is None else gen.discrete_laplace_one(Domain.THRESHOLD, address, index, noise)


class _Grids:
    """What the calibrated choice computes from a candidate grid alone (public), once per grid."""

    __slots__ = ("_around", "_noise_terms", "candidates", "geo", "squares", "values")

    def __init__(self, candidates: np.ndarray) -> None:
        n_cand = len(candidates)
        self.candidates = candidates
        self.values = np.concatenate([candidates, [candidates[-1]]]).astype(np.float64)
        geo = np.unique(np.searchsorted(candidates, np.geomspace(candidates[0], candidates[-1], _QUANTILE_GRID)))
        self.geo = geo[geo < n_cand]
        self.squares = candidates.astype(np.float64) ** 2
        self._around: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._noise_terms: dict[tuple[float, float, float], np.ndarray] = {}

    def noise_term(self, a: float, eps2: float, moment: float) -> np.ndarray:
        """``a theta^2 / eps2 / moment`` at every candidate (read-only; the same operations as written out)."""
        got = self._noise_terms.get((a, eps2, moment))
        if got is None:
            got = a * self.squares / eps2 / moment
            got.flags.writeable = False
            if len(self._noise_terms) < 64:
                self._noise_terms[(a, eps2, moment)] = got
        return got

    def around(self, q_k: int) -> tuple[np.ndarray, np.ndarray]:
        """The thetas of step 3 around the quantile ``q_k`` (and their indexes in the grid)."""
        got = self._around.get(q_k)
        if got is None:
            candidates = self.candidates
            grid = np.geomspace(max(q_k / 4.0, float(candidates[0])), 8.0 * q_k, _THETA_POINTS)
            idx = np.unique(np.minimum(np.searchsorted(candidates, grid), len(candidates) - 1))
            thetas = candidates[idx].astype(np.float64)
            got = (thetas, np.searchsorted(candidates, thetas))
            if len(self._around) < 4096:
                self._around[q_k] = got
        return got


_GRIDS: dict[int, _Grids] = {}  # id(candidates) -> its grids (the candidate grids are cached and live forever)


def _grids(candidates: np.ndarray) -> _Grids:
    g = _GRIDS.get(id(candidates))
    if g is None or g.candidates is not candidates:
        g = _Grids(candidates)
        if len(_GRIDS) < 64:
            _GRIDS[id(candidates)] = g
    return g


def _best_model(thetas: np.ndarray, s_options: list[int], G: dict[int, float], sm: dict[int, float], *,
                epsilon: float, eps_s: float, m: int, fanout: int, query_range: int) -> np.ndarray:
    """``min over s`` of the calibrated RMSE model at every theta: ``model`` of :func:`choose`, the same floating-point
    operations in the same order, on a whole array (``np.power(x, 2.0)`` is Python's ``x ** 2``)."""
    best: np.ndarray | None = None
    for s in s_options:
        w = fanout**s
        start_var = 2.0 * np.power(thetas / (eps_s * m), 2.0)
        first_leaf = min(1.0, w / query_range) * w * w / 3.0 * start_var
        val = G[s] * thetas * thetas / (epsilon * epsilon) + sm[s] + first_leaf
        best = val if best is None else np.minimum(best, val)
    assert best is not None
    return best


def _counts_kernel():
    """The compiled :func:`operators._selection_kernel.counts_drawn_max` and ``cells_drawn_max`` once the process
    loaded the compiled noise kernels (it draws often: a daemon), else None (numpy: the same index)."""
    if not compiled_loaded():
        return None
    got = _KERNELS.get("counts")
    if got is None:
        from operators._selection_kernel import cells_drawn_max, counts_drawn_max

        got = _KERNELS["counts"] = (counts_drawn_max, cells_drawn_max)
    return got


_KERNELS: dict[str, tuple] = {}


_KERNEL_WORDS = (16, 1024)  # the words the compiled report-noisy-max gets: two blocks, then 128 (then Python's)


def _drawn_pick(hist: np.ndarray | Cells, base: np.ndarray, gen: KeyedGenerator, epsilon: float,
                kernels: tuple | None, budgets: tuple[int, ...] = _KERNEL_WORDS) -> int:
    """The fallback's report-noisy-max of ``u_k = -sqrt(base_k + m_theta_k^2)``, its noise drawn where it can matter
    (:mod:`operators.noisy_max`) from the words at address 4: compiled (``kernels``) while the first words suffice
    (``budgets``: a few words nearly always do), else in Python; the same index either way (tested)."""
    if kernels is not None:
        for count in budgets:
            words = gen.words(int(Domain.THRESHOLD), 4, 0, count)
            if isinstance(hist, Cells):  # from the occupied cells (base grows with theta: monotone)
                k = kernels[1](hist.index, hist.count, base, words, epsilon)
            else:
                k = kernels[0](np.asarray(hist).astype(np.int64), base, words, epsilon)
            if k >= 0:
                return int(k)
    dense = hist.dense() if isinstance(hist, Cells) else np.asarray(hist).astype(np.int64)
    util = -np.sqrt(base + m_theta(dense).astype(np.float64) ** 2)
    return report_noisy_max_drawn(util, epsilon, WordStream(partial(gen.words, int(Domain.THRESHOLD), 4)))


def default_layers(fixed_s: int | None, epsilon: float, query_range: int, fanout: int) -> int:
    """s when nothing measured it: ``fixed_s`` (the configured one), else Eq. 7's, at most ``h - 1``."""
    if fixed_s is not None:
        return fixed_s
    return min(smoother_layers(epsilon, query_range, fanout), tree_height(query_range, fanout) - 1)


def _threshold_budgets(m: int, threshold_epsilon: float, geo_size: int) -> tuple[bool, float, float]:
    """(fallback, eps_q, eps_t): whether the percentile's step is skipped for too little budget, its budget, and the
    budget of theta's report-noisy-max (with the shares of steps 1 and 2 when they are skipped)."""
    # the percentile's share: at least 10%, more (up to 30%, taken from theta's) so that top_k <= m / 4
    share_q = max(BUDGET_SPLIT["quantile"], 8.0 * math.log(max(geo_size, 2)) / (0.25 * m * threshold_epsilon))
    fallback = share_q > _MAX_QUANTILE_SHARE
    share_q = min(share_q, _MAX_QUANTILE_SHARE)
    eps_q = share_q * threshold_epsilon
    eps_t = (BUDGET_SPLIT["threshold"] - (share_q - BUDGET_SPLIT["quantile"])) * threshold_epsilon
    if fallback:  # theta from counts alone takes the shares of steps 1 and 2
        eps_t += eps_q + BUDGET_SPLIT["excess"] * threshold_epsilon
    return fallback, eps_q, eps_t


def _counts_base(grid: _Grids, s_options: list[int], G: dict[int, float], m: int, epsilon: float,
                 moment: float) -> np.ndarray:
    """The public part ``a theta_k^2 / eps^2 / E[l^2]`` of the fallback's score (once per configuration)."""
    s_pre = min(s_options, key=lambda s: G[s])
    return grid.noise_term(m * m * G[s_pre], epsilon**2, moment)


def choose(
    hist: np.ndarray | Cells,
    candidates: np.ndarray,
    blocks: BlockStats,
    *,
    gen: KeyedGenerator,
    epsilon: float,
    threshold_epsilon: float,
    holdout: int,
    query_range: int,
    fanout: int,
    fixed_s: int | None = None,
) -> Selection:
    """The calibrated (theta, s, start) from the holdout histogram and block statistics; ``threshold_epsilon``-DP.

    ``hist`` has ``len(candidates) + 1`` bins (``operators.threshold.holdout_histogram``), or is given by its
    occupied bins (:class:`Cells`: the same choice, bit for bit; the small-holdout branch then never makes the dense
    histogram); a value in bin k is taken as ``candidates[k]`` (exact while the grid holds every integer; on the
    geometric part of a huge grid, its upper edge).
    """
    m = holdout
    h = tree_height(query_range, fanout)
    grid = _grids(candidates)
    values = grid.values
    cells = hist if isinstance(hist, Cells) else None
    s_options = [fixed_s] if fixed_s is not None else list(range(h))
    G = _noise_constants(fanout, query_range)
    moment = range_length_moment(query_range)
    geo = grid.geo
    fallback, eps_q, eps_t = _threshold_budgets(m, threshold_epsilon, geo.size)
    rank_error = 4.0 * math.log(max(geo.size, 2)) / eps_q  # of the exponential mechanism at eps_q / 2
    kernels = _counts_kernel() if fallback else None
    if cells is not None and (kernels is None or cells.total * float(values[-1]) >= 2.0**53):
        hist, cells = cells.dense(), None  # the sums below are exact integers either way while under 2^53
    if cells is None:
        hist = np.asarray(hist, dtype=np.float64)
    top_k = 2.0 * rank_error
    if not fallback:  # 1. the value with top_k holdout values above it (as high as this budget can see)
        counts_above = m_theta(hist.astype(np.int64))  # Eq. 5
        util = -np.abs(counts_above[geo] - top_k)
        pick = report_noisy_max(util, gen.uniforms(int(Domain.THRESHOLD), 1, 0, geo.size), eps_q / 2)
        q_k = int(candidates[geo[pick]])
        q = 2 * q_k  # where the model compares the s (a typical threshold)
        scale_ref = q
        # 1b. the mean excess of the values above q_k (the paper's constant c, measured): sum and count, halves
        eps_e = BUDGET_SPLIT["excess"] * threshold_epsilon / 2.0
        far = float(max(q_k, 1))
        excess_sum = float(np.dot(hist, np.clip(values - q_k, 0.0, far)))
        n_sum, n_count = _dlap(gen, 5, 0, eps_e, far), _dlap(gen, 5, 1, eps_e, 1.0)
        if n_sum is None or n_count is None:
            mean_excess = 1.0
        else:
            at = int(np.searchsorted(candidates, q_k))
            noisy_count = max(float(counts_above[at] + n_count), 1.0)
            mean_excess = min(max((round(excess_sum) + n_sum) / noisy_count, 1.0), far)
            # the expected squared bias counts the estimate's own noise: E[e^2] = e^2 + Var(e) (both halves' noise)
            var = 2.0 * (far / (eps_e * noisy_count)) ** 2 + 2.0 * (mean_excess / (eps_e * noisy_count)) ** 2
            mean_excess = math.sqrt(mean_excess**2 + var)
    else:  # too little budget for a useful quantile: theta now, from counts (C = 1), with the two shares
        base = _counts_base(grid, s_options, G, m, epsilon, moment)
        k = _drawn_pick(cells if cells is not None else hist, base, gen, eps_t, kernels)
        q = int(candidates[k])
        scale_ref = q
    # 2. smoothing error per measurable s
    cap_k = int(max(scale_ref, 1)).bit_length() - 1  # the largest cap 2^k <= scale_ref (caps: 2^0 .. 2^top)
    cap_k = max(0, min(cap_k, len(blocks.caps) - 1))
    cap = float(blocks.caps[cap_k])
    sm = {0: 0.0}
    weights = [2.0**i for i in range(len(blocks.widths))]  # coarser leaves have fewer pairs: more budget
    last = 0.0
    for i, _w in enumerate(blocks.widths):
        s = i + 1
        pairs = int(blocks.pairs[i])
        if pairs < 1:
            break
        eps_each = BUDGET_SPLIT["smoothing"] * threshold_epsilon * weights[i] / sum(weights)
        stat = blocks.acc[i, cap_k] / pairs  # mean |dS|, released in 1/1024 steps
        sens = 2.0 * cap / pairs
        noise = _dlap(gen, 2, i, eps_each, sens * _STEPS + 1.0)
        scale = math.ceil(sens * _STEPS + 1.0) / eps_each / _STEPS
        noisy = None if noise is None else (round(stat * _STEPS) + noise) / _STEPS
        # below 3 noise scales a measurement says little (Laplace noise passes it with probability e^-3 / 2 = 2.5%):
        # take the level below's growth instead
        trusted = noisy is not None and noisy > 3.0 * scale
        square = math.pi / 2.0 * noisy * noisy if trusted else 0.0  # E[dS^2] = pi/2 E|dS|^2 (Gaussian dS)
        last = max(square, fanout * last)
        sm[s] = 5.0 / 6.0 * last
    top_measured = max(sm)
    for s in range(top_measured + 1, h):
        sm[s] = sm[s - 1] * fanout
    if top_measured == 0 and fixed_s is None:  # nothing measurable: noise alone would always pick s = h - 1
        s_options = [default_layers(None, epsilon, query_range, fanout)]

    eps_s = BUDGET_SPLIT["start"] * threshold_epsilon

    def model(theta: float, s: int) -> float:
        w = fanout**s
        start_var = 2.0 * (theta / (eps_s * m)) ** 2  # the start's noise, per tick
        first_leaf = min(1.0, w / query_range) * w * w / 3.0 * start_var  # ranges cut in the first leaf
        return G[s] * theta * theta / (epsilon * epsilon) + sm[s] + first_leaf

    if not fallback:  # 3. theta by report-noisy-max of the calibrated RMSE
        thetas, at_theta = grid.around(q_k)  # at most 72 points, 5% apart (fewer candidates, less noise)
        above = counts_above[at_theta].astype(np.float64)
        best_s = _best_model(thetas, s_options, G, sm, epsilon=epsilon, eps_s=eps_s, m=m, fanout=fanout,
                             query_range=query_range)  # public given sm
        util = -np.sqrt(m * m * best_s / (moment * mean_excess**2) + above**2)
        k = report_noisy_max(util, gen.uniforms(int(Domain.THRESHOLD), 4, 0, thetas.size), eps_t)
        theta = int(thetas[k])
    else:
        theta = q
    s = min(s_options, key=lambda s: model(theta, s))  # 4. post-processing
    # 5. the smoother's start
    if cells is None:
        total = float(np.dot(hist, np.minimum(values, theta)))
    else:  # the same sum of integers (exact: under 2^53)
        total = float(sum(n * min(int(values[c]), theta) for c, n in zip(cells.index.tolist(), cells.count.tolist(),
                                                                             strict=True)))
    noise = _dlap(gen, 3, 0, eps_s, theta)
    start = theta / 2.0 if noise is None else min(max((round(total) + noise) / m, 0.0), float(theta))
    return Selection(theta, s, start, fallback)


def choose_small_many(
    cells: list[Cells],
    blocks: list[BlockStats],
    gens: Sequence[KeyedGenerator] | KeyRows,
    candidates: np.ndarray,
    *,
    epsilon: float,
    threshold_epsilon: float,
    holdout: int,
    query_range: int,
    fanout: int,
    fixed_s: int | None = None,
) -> list[Selection] | None:
    """:func:`choose` for many holdouts of one configuration at once: the same selections, bit for bit, in a few
    compiled calls instead of a few dozen Python steps each (a daemon whose streams end their holdout by the thousand
    in one processing step).

    Only for the small holdout's branch: too little budget for the percentile (theta from counts alone, step 1's
    fallback) and no leaf width measured (none fits twice in the holdout: step 3 draws nothing and s is
    ``fixed_s`` or Eq. 7's), every histogram given by its occupied cells. There the choice reads the words of its
    report-noisy-max and the one draw of the smoother's start; both are drawn here for all streams together. None when
    a holdout is not of that kind, or the compiled kernels are not loaded: the caller chooses stream by stream."""
    if any(b.widths and b.pairs[0] >= 1 for b in blocks):
        return None
    offsets = np.zeros(len(cells) + 1, dtype=np.int64)
    np.cumsum([c.index.size for c in cells], out=offsets[1:])
    index = np.concatenate([c.index for c in cells]) if cells else np.zeros(0, dtype=np.int64)
    count = np.concatenate([c.count for c in cells]) if cells else np.zeros(0, dtype=np.int64)
    got = _choose_small(index, count, offsets, max((c.total for c in cells), default=0), gens, candidates,
                        epsilon=epsilon, threshold_epsilon=threshold_epsilon, holdout=holdout, query_range=query_range,
                        fanout=fanout, fixed_s=fixed_s)
    if got is None:
        return None
    thetas, s, starts = got
    return [Selection(theta, s, start, True) for theta, start in zip(thetas, starts, strict=True)]


def chooses_small(candidates: np.ndarray, *, holdout: int, threshold_epsilon: float) -> bool:
    """Whether a holdout of ``holdout`` readings over ``candidates`` that measures no leaf width is chosen by the small
    branch (:func:`choose_small_many`): too little budget for the percentile."""
    return _threshold_budgets(holdout, threshold_epsilon, _grids(candidates).geo.size)[0]


def choose_small_dense(
    hists: np.ndarray,
    pairs: np.ndarray,
    gens: Sequence[KeyedGenerator] | KeyRows,
    candidates: np.ndarray,
    **params: Any,
) -> tuple[list[int], int, list[float]] | None:
    """:func:`choose_small_many` for holdouts given as rows of dense arrays (a columnar holdout's: row ``i`` of
    ``hists`` is stream ``i``'s histogram over the candidates, row ``i`` of ``pairs`` its block pairs per leaf width)
    and the keys as :class:`~operators.noise.KeyRows`: the same choices, as ``(thetas, s, starts)`` (every stream's
    theta and smoother start, the one s of the branch), without an object per stream. None where
    :func:`choose_small_many` gives None."""
    if pairs.size and (pairs[:, 0] >= 1).any():
        return None
    streams, index = np.nonzero(hists)
    offsets = np.zeros(len(hists) + 1, dtype=np.int64)
    np.cumsum(np.bincount(streams, minlength=len(hists)), out=offsets[1:])
    count = hists[streams, index].astype(np.int64)
    top = int(hists.sum(axis=1, dtype=np.int64).max(initial=0))
    return _choose_small(index.astype(np.int64), count, offsets, top, gens, candidates, **params)


def choose_small_cells(index: np.ndarray, count: np.ndarray, offsets: np.ndarray, top_total: int,
                       gens: Sequence[KeyedGenerator] | KeyRows, candidates: np.ndarray,
                       **params: Any) -> tuple[list[int], int, list[float]] | None:
    """:func:`choose_small_dense` for holdouts given by their occupied cells (stream ``i``'s cells
    ``index[offsets[i]:offsets[i + 1]]``, sorted, with their counts; ``top_total``: the most readings of one): the
    same ``(thetas, s, starts)``, or None."""
    return _choose_small(index, count, offsets, top_total, gens, candidates, **params)


def _choose_small(
    index: np.ndarray,
    count: np.ndarray,
    offsets: np.ndarray,
    top_total: int,
    gens: Sequence[KeyedGenerator] | KeyRows,
    candidates: np.ndarray,
    *,
    epsilon: float,
    threshold_epsilon: float,
    holdout: int,
    query_range: int,
    fanout: int,
    fixed_s: int | None = None,
) -> tuple[list[int], int, list[float]] | None:
    """The small branch's choices of ``len(offsets) - 1`` holdouts (stream ``i``'s occupied cells ``index[offsets[i]:
    offsets[i + 1]]`` with their counts; ``top_total``: the most readings of one): ``(thetas, s, starts)``, or None
    (another branch, too large a sum, or no compiled kernels)."""
    n = len(offsets) - 1
    expect_draws(n)
    kernels = _counts_kernel()
    m = holdout
    grid = _grids(candidates)
    values = grid.values
    if kernels is None or n <= 0:
        return None
    fallback, _eps_q, eps_t = _threshold_budgets(m, threshold_epsilon, grid.geo.size)
    if not fallback or top_total * float(values[-1]) >= 2.0**53:
        return None
    h = tree_height(query_range, fanout)
    s_options = [fixed_s] if fixed_s is not None else list(range(h))
    base = _counts_base(grid, s_options, _noise_constants(fanout, query_range), m, epsilon,
                        range_length_moment(query_range))
    s = default_layers(fixed_s, epsilon, query_range, fanout)
    eps_s = BUDGET_SPLIT["start"] * threshold_epsilon
    points = values.astype(np.int64)  # integers (exact: the check above)
    if not _SMALL_MANY_READY:
        _warm_small_many(base, points)
    from operators._chacha_kernel import keystream_many
    from operators._selection_kernel import cells_drawn_max_many

    keys = np.ascontiguousarray(_stacked_key_words(gens))
    words = keystream_many(keys, 0, int(Domain.THRESHOLD), 4, 0, _KERNEL_WORDS[0] // 8)
    picks, totals = cells_drawn_max_many(words, index, count, offsets, base, eps_t, points)
    for i in np.flatnonzero(picks < 0).tolist():  # the few whose first words were not enough: one by one
        lo, hi = offsets[i], offsets[i + 1]
        cells = Cells(index[lo:hi], count[lo:hi], len(candidates) + 1, int(count[lo:hi].sum()))
        picks[i] = _drawn_pick(cells, base, gens[i], eps_t, kernels, _KERNEL_WORDS[1:])
        totals[i] = int(np.dot(cells.count, np.minimum(points[cells.index], points[picks[i]])))
    chosen = candidates[picks]
    thetas = chosen.tolist()
    # step 6: the start's draw (address 3), at a noise per theta (a handful of distinct thetas)
    distinct, which = np.unique(picks, return_inverse=True)
    noise_at = [_dlap_noise(eps_s, theta) for theta in candidates[distinct].tolist()]
    if all(dl is not None for dl in noise_at):  # the start of each: clip((total + noise) / m, 0, theta)
        got = np.array(discrete_laplace_one_many(gens, int(Domain.THRESHOLD), 3, 0, noise_at,  # type: ignore[arg-type]
                                                 which.reshape(-1)), dtype=np.int64)
        sums = totals.astype(np.int64) + got
        if np.abs(sums).max(initial=0) < 2**53:  # exact as floats: the division is Python's, correctly rounded
            starts = np.minimum(np.maximum(sums / m, 0.0), chosen.astype(np.float64))
            return thetas, s, starts.tolist()
    noises = [noise_at[w] for w in which.reshape(-1).tolist()]
    drawn = [i for i, dl in enumerate(noises) if dl is not None]
    got_of = discrete_laplace_one_many([gens[i] for i in drawn], int(Domain.THRESHOLD), 3, 0,
                                       [noises[i] for i in drawn])  # type: ignore[misc]
    noise_of: dict[int, int] = dict(zip(drawn, got_of, strict=True))
    out = []
    for i, (theta, total) in enumerate(zip(thetas, totals.tolist(), strict=True)):
        noise = noise_of.get(i)
        out.append(theta / 2.0 if noise is None else min(max((round(total) + noise) / m, 0.0), float(theta)))
    return thetas, s, out


_SMALL_MANY_READY = False


def _warm_small_many(base: np.ndarray, points: np.ndarray) -> None:
    """Compile (or load) :func:`choose_small_many`'s kernels for its argument types on made-up arrays, in a thread
    of its own.

    numba's first compile of a kernel leaves reference cycles that hold the frames of the stack it was called from
    (exceptions raised and caught while it infers types): a kernel first called from a daemon's processing step would
    keep that step's streams alive until the cyclic collector runs, and once the daemon froze them (``gc.freeze``),
    until its next sweep. Compiled from a fresh thread, the cycles hold that thread's frames and these arrays only (a
    test evicts the streams of a step that compiled the kernels, with the collector off, and finds none of their
    objects left)."""
    global _SMALL_MANY_READY
    _SMALL_MANY_READY = True

    def compile_all() -> None:
        from operators._chacha_kernel import keystream_many
        from operators._dlap_kernel import sample_one_many
        from operators._selection_kernel import cells_drawn_max_many

        keys = np.zeros((2, 8), dtype=np.uint64)
        words = keystream_many(keys, 0, 1, 4, 0, _KERNEL_WORDS[0] // 8)
        ones = np.ones(2, dtype=np.int64)
        offsets = np.arange(3, dtype=np.int64)
        cells_drawn_max_many(words, ones * 0, ones, offsets[:3], base, 1.0, points)
        dl = shared_laplace(1.0, 1)
        params = np.array([(dl.log2_t, dl.s, dl.q, dl.r)] * 2, dtype=np.int64)
        sample_one_many(keys, 0, 1, 3, 0, params[:, 0], params[:, 1], params[:, 2], params[:, 3])

    thread = threading.Thread(target=compile_all, name="tops-compile")
    thread.start()
    thread.join()

"""Permute-and-flip compiled: the threshold's choice over a whole candidate grid at the end of a small holdout.

When the holdout is too small for the calibrated choice's quantile (:func:`operators.selection.choose`, "too little
budget"), theta is chosen from counts alone over *every* candidate of the grid (4,296 for B = 5,000)::

    u(theta_k) = -sqrt(base_k + m_theta_k^2),    base_k = a theta_k^2 / eps^2 / E[l^2]         (selection, fallback)

by permute-and-flip (:mod:`operators.permute_and_flip`: the scores on an integer grid, a Fisher-Yates order drawn as
far as the walk goes, each candidate accepted by Canonne, Kamath and Steinke's exact Bernoulli(exp(-x))). Here the
same index, bit for bit, compiled: the same IEEE operations (numba neither reorders nor fuses floating-point
operations without ``fastmath``; ``sqrt`` is correctly rounded in both), the Bernoulli draws of the discrete Laplace
kernel itself (``operators._dlap_kernel``), from the same words: the keystream's first ones, given by the caller,
which draws again with more in the rare case they are not enough (the kernel returns -1; it never calls ChaCha20
itself, whose compilation would be paid again by every kernel that did). Tests compare it with the Python walk.

A small holdout touches few cells (holdout 3: at most three of 5,001), and its histogram is kept sparse
(``operators.tops``). :func:`cells_permute_and_flip` takes those cells as they are: ``m_theta`` is constant between
two occupied cells, where ``u`` can only fall (``base`` grows with theta and every IEEE operation on the way is
monotone, the floor too), so the largest quantized score is at a run's first candidate, and a score is computed only
for the candidates the walk visits (a few where the scores are close for the noise, as at holdout 3).

Constants a compiled function passes to another are typed values (``np.int64(0)``, ``np.bool_(True)``), not bare
literals: numba compiles the callee once more for each literal value, and a fresh install's first compile (a
daemon's first holdout end) would take that much longer (a test counts the specializations).
"""

from __future__ import annotations

import numba
import numpy as np

from operators._dlap_kernel import _take

_FEW_MOVED = 32  # the shuffle's moved positions searched through; past that the whole order is kept
_LARGEST = float(2**62)  # operators.permute_and_flip._LARGEST


@numba.njit(cache=True, nogil=True)
def _padded(words):
    """The words and one zero word after them (``_take`` reads a word past the one it ends in)."""
    out = np.zeros(words.size + 1, dtype=np.uint64)
    out[: words.size] = words
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _bernoulli(words, nbits, cur, n, d):
    """Bernoulli(n / d) as ``operators._dlap_kernel._bernoulli`` draws it (8 random bits at a time against the binary
    expansion; the first chunk that differs decides), as one integer: ``2 cursor + result``, or -1 when the bits ran
    out (one value, not a pair: inlined, the comparison costs a few nanoseconds instead of a call's tens)."""
    r = np.uint64(n)
    while True:
        rand, cur = _take(words, np.int64(0), nbits, cur, np.int64(8))
        if cur < 0:
            return np.int64(-1)
        num = r << np.uint64(8)
        p = num // d
        r = num - p * d
        if rand != p:
            return (cur << 1) | np.int64(rand < p)


@numba.njit(cache=True, nogil=True)
def _accepts(words, nbits, cur, gap, shift):
    """:meth:`operators.permute_and_flip.KeyBits.accepts`: (Bernoulli(exp(-gap / 2^shift)), cursor or -1).

    ``floor(gap / 2^shift)`` stages of Bernoulli(exp(-1)), then one of Bernoulli(exp(-frac / 2^shift)), each
    ``operators._dlap_kernel._bernoulli_exp`` (Canonne, Kamath and Steinke, Algorithm 1: ``K = 1, 2, ...`` while
    Bernoulli(gamma / K), that is Bernoulli(1 / K) then Bernoulli(u / 2^shift), succeeds; the stage succeeds when the
    last ``K`` is odd): the same bits in the same order (tested)."""
    if gap == 0:
        return True, cur
    whole = gap >> shift
    frac = gap & ((np.int64(1) << shift) - 1)
    one = np.uint64(1) << np.uint64(shift)
    for _ in range(whole):  # Bernoulli(exp(-1)): K = 2, 3, ... while Bernoulli(1 / K)
        k = 2
        while True:
            c = _bernoulli(words, nbits, cur, np.int64(1), np.uint64(k))
            if c < 0:
                return False, -1
            cur = c >> 1
            if not c & 1:
                break
            k += 1
        if k % 2 == 0:
            return False, cur
    if not frac:
        return True, cur
    k = 1  # Bernoulli(exp(-frac / 2^shift)): K = 1, 2, ... while Bernoulli(1 / K) and Bernoulli(frac / 2^shift)
    while True:
        if k > 1:
            c = _bernoulli(words, nbits, cur, np.int64(1), np.uint64(k))
            if c < 0:
                return False, -1
            cur = c >> 1
            if not c & 1:
                break
        c = _bernoulli(words, nbits, cur, frac, one)
        if c < 0:
            return False, -1
        cur = c >> 1
        if not c & 1:
            break
        k += 1
    return k % 2 == 1, cur


@numba.njit(cache=True, nogil=True, inline="always")
def _quantized(score, scale):
    """``floor(E q)`` clipped to ``[-2^62, 2^62]`` (:func:`operators.permute_and_flip.quantized_scores`)."""
    return np.int64(min(max(np.floor(scale * score), -_LARGEST), _LARGEST))


@numba.njit(cache=True, nogil=True)
def _walk(words, n, shift, gaps, cells, suffix, base, scale, top):
    """:func:`operators.permute_and_flip.flip_walk` over ``n`` candidates whose gaps are ``gaps`` (when it has ``n``
    entries) or ``top - floor(scale (-sqrt(base_k + m_k^2)))`` with ``m_k`` the values in ``cells`` above ``k``
    (``suffix``: the values in cell j and up): the index, or -1 when ``words`` were not enough."""
    padded = _padded(words)
    nbits = 64 * words.size
    cur = np.int64(0)
    moved_at = np.empty(_FEW_MOVED, dtype=np.int64)  # the shuffle's positions that do not hold their own candidate
    moved_to = np.empty(_FEW_MOVED, dtype=np.int64)  # and the candidate each holds (a few, searched through)
    moved = 0  # how many; -1 once the whole order is kept in ``order``
    order = moved_at
    dense = gaps.size == n
    bits = 1
    while (1 << bits) < n:
        bits += 1
    for step in range(n):
        left = n - step  # a position uniform among the left ones: bit_length(left - 1) bits, values past it rejected
        while bits > 1 and (1 << (bits - 1)) >= left:
            bits -= 1
        r = 0
        if left > 1:
            while True:
                v, cur = _take(padded, np.int64(0), nbits, cur, bits)
                if cur < 0:
                    return -1
                if v < np.uint64(left):
                    r = np.int64(v)
                    break
        p = step + r
        if moved == _FEW_MOVED:  # a long walk (scores far apart for the noise): the whole order
            order = np.arange(n)
            for e in range(moved):
                order[moved_at[e]] = moved_to[e]
            moved = -1
        if moved < 0:
            k = order[p]
            order[p] = order[step]
        else:
            k = p  # the candidate at position p; position p then takes the one at position step
            at_step = step
            slot = -1
            for e in range(moved):
                if moved_at[e] == p:
                    k = moved_to[e]
                    slot = e
                if moved_at[e] == step:
                    at_step = moved_to[e]
            if slot < 0:
                slot = moved
                moved += 1
                moved_at[slot] = p
            moved_to[slot] = at_step
        if dense:
            gap = gaps[k]
        else:
            c = float(suffix[np.searchsorted(cells, k, side="right")])
            gap = top - _quantized(-np.sqrt(base[k] + c * c), scale)
        ok, cur = _accepts(padded, nbits, cur, gap, shift)
        if cur < 0:
            return -1
        if ok:
            return k
    return -1  # unreachable: the best candidate's gap is 0


@numba.njit(cache=True, nogil=True)
def gaps_permute_and_flip(words, gaps, shift):
    """:func:`operators.permute_and_flip.flip_walk` on the gaps ``Q* - Q_r``: the index, or -1 when ``words`` (the
    keystream's first words) were not enough."""
    none = np.zeros(0, dtype=np.int64)
    return _walk(words, gaps.size, shift, gaps, none, none, np.zeros(0), np.float64(0.0), np.int64(0))


@numba.njit(cache=True, nogil=True)
def gaps_permute_and_flip_many(words, gaps, shift):
    """:func:`gaps_permute_and_flip` under many keys (row ``i`` of ``words`` is key ``i``'s first words)."""
    out = np.empty(words.shape[0], dtype=np.int64)
    for i in range(words.shape[0]):
        out[i] = gaps_permute_and_flip(words[i], gaps, shift)
    return out


@numba.njit(cache=True, nogil=True)
def cells_permute_and_flip(cells, counts, base, words, scale, shift):
    """Permute-and-flip of ``u(theta_k) = -sqrt(base_k + m_theta_k^2)`` on the grid ``(scale, shift)``
    (:func:`operators.permute_and_flip.flip_grid`) for the histogram with ``counts[j]`` values in bin ``cells[j]``
    (sorted, distinct) and none elsewhere: the index :func:`operators.permute_and_flip.permute_and_flip` reports from
    the same ``words`` (the keystream's first words), or -1 when it needs more than ``words`` holds.

    ``m_theta_k`` (Eq. 5) = the values in bins ``k + 1`` and up = the counts of the cells ``> k``: a suffix sum,
    constant on each run of k between two occupied cells, where the quantized score can only fall (``base`` never
    decreases): the best is at a run's first candidate.
    """
    n = base.size
    ncell = cells.size
    suffix = np.zeros(ncell + 1, dtype=np.int64)  # suffix[j]: the values in cells j and up
    for j in range(ncell - 1, -1, -1):
        suffix[j] = suffix[j + 1] + counts[j]
    sc = float(scale)
    top = np.int64(-(2**62))
    j = 0
    while j < ncell and cells[j] <= 0:
        j += 1
    first = 0
    while True:  # each run's first candidate: m_theta = the values in the cells from j on
        c = float(suffix[j])
        top = max(top, _quantized(-np.sqrt(base[first] + c * c), sc))
        if j >= ncell or cells[j] > n - 1:
            break
        first = cells[j]
        j += 1
    return _walk(words, n, shift, np.zeros(0, dtype=np.int64), cells, suffix, base, sc, top)


@numba.njit(cache=True, nogil=True)
def counts_permute_and_flip(hist, base, words, scale, shift):
    """:func:`cells_permute_and_flip` of a dense holdout histogram (``len(base) + 1`` integer bins; the values above
    candidate k are in bins k + 1 and up)."""
    cells = np.flatnonzero(hist).astype(np.int64)
    counts = np.empty(cells.size, dtype=np.int64)
    for j in range(cells.size):
        counts[j] = hist[cells[j]]
    return cells_permute_and_flip(cells, counts, base, words, scale, shift)


@numba.njit(cache=True, nogil=True)
def cells_permute_and_flip_many(words, cell_index, cell_count, offsets, base, scale, shift, points):
    """:func:`cells_permute_and_flip` for many small holdouts at once, with each one's sum of its values truncated at
    the chosen candidate (the smoother's start, step 6 of ``operators.selection``).

    Stream ``i`` has the cells ``cell_index[offsets[i]:offsets[i + 1]]`` (counts alike) and the words ``words[i]``;
    ``points``: the value each bin stands for as an integer (the candidates, then the last one again). Returns the
    chosen index and ``sum count * min(points[cell], points[index])`` per stream (-1 and 0 where the stream's words
    were not enough)."""
    n = offsets.size - 1
    picks = np.empty(n, dtype=np.int64)
    totals = np.empty(n, dtype=np.int64)
    for i in range(n):
        lo, hi = offsets[i], offsets[i + 1]
        k = cells_permute_and_flip(cell_index[lo:hi], cell_count[lo:hi], base, words[i], scale, shift)
        picks[i] = k
        if k < 0:  # more words needed: the caller chooses this one again
            totals[i] = 0
            continue
        theta = points[k]
        total = 0
        for j in range(lo, hi):
            total += cell_count[j] * min(points[cell_index[j]], theta)
        totals[i] = total
    return picks, totals

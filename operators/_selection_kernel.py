"""Report-noisy-max over a whole candidate grid, compiled: the end of a holdout's largest step.

When the holdout is too small for the calibrated choice's quantile (:func:`operators.selection.choose`, "too little
budget"), theta is chosen from counts alone over *every* candidate of the grid (4,296 for B = 5,000)::

    u(theta_k) = -sqrt(a theta_k^2 / eps^2 / E[l^2] + m_theta_k^2),    a = m^2 G_s            (selection, fallback)

by report-noisy-max with exponential noise, drawn where it can matter
(:func:`operators.noisy_max.report_noisy_max_drawn`: a noise for each of the few candidates near the top, the others'
from the largest down; a few draws, not one a candidate). Here the same index, bit for
bit, compiled: the same IEEE operations in the same order (numba neither reorders nor fuses floating-point operations
without ``fastmath``; ``log``, ``expm1`` and ``sqrt`` are the C library's, as Python's ``math`` calls them), from the
same words: the keystream's first ones, given by the caller, which draws again with more in the rare case they are
not enough (the kernel returns -1; it never calls ChaCha20 itself, whose compilation would be paid again by every
kernel that did). A test compares it with the Python path on thousands of random holdouts.

A small holdout touches few cells (holdout 3: at most three of 5,001), and its histogram is kept sparse
(``operators.tops``). :func:`cells_drawn_max` takes those cells as they are: ``m_theta`` is constant between two
occupied cells, where ``u`` can only fall (``base`` grows with theta and every IEEE operation on the way is
monotone), so the largest score is at a run's first candidate, and a score is computed only for the candidates that
draw a noise. It used to read a word for every candidate (34 KB of keystream a holdout on the exact grid, about
30 us); it now reads a block or two.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from operators.noisy_max import NEAR_MOST, NEAR_SPAN

_U53 = 2.0**-53
_FEW_MOVED = 32  # the shuffle's moved positions searched through; past that the whole order is kept
_NEAR_SPAN = NEAR_SPAN
_NEAR_MOST = NEAR_MOST


@numba.njit(cache=True, nogil=True, inline="always")
def _uniform(word):
    """``operators.noise._words_to_uniform`` of one word: 53 random bits, in (0, 1)."""
    return (float(word >> np.uint64(11)) + 0.5) * _U53


@numba.njit(cache=True, nogil=True)
def cells_drawn_max(cells, counts, base, words, epsilon):
    """:func:`operators.noisy_max.report_noisy_max_drawn` of ``u(theta_k) = -sqrt(base_k + m_theta_k^2)`` for the
    histogram with ``counts[j]`` values in bin ``cells[j]`` (sorted, distinct) and none elsewhere: the same index
    from the same ``words`` (the keystream's first words), or -1 when it needs more than ``words`` holds (the caller
    draws again with more: a few words are nearly always enough).

    ``m_theta_k`` (Eq. 5) = the values in bins ``k + 1`` and up = the counts of the cells ``> k``: a suffix sum,
    constant on each run of k between two occupied cells, where the score can only fall (``base`` never decreases):
    the largest score is at a run's first candidate, the candidates near the top are a run's first ones.
    """
    n = base.size
    ncell = cells.size
    suffix = np.zeros(ncell + 1, dtype=np.int64)  # suffix[j]: the values in cells j and up
    for j in range(ncell - 1, -1, -1):
        suffix[j] = suffix[j + 1] + counts[j]
    run_first = np.empty(ncell + 1, dtype=np.int64)  # the runs of candidates with one m_theta: [first, last], c
    run_last = np.empty(ncell + 1, dtype=np.int64)
    run_c = np.empty(ncell + 1, dtype=np.float64)
    runs = 0
    top = -math.inf
    j = 0
    while j < ncell and cells[j] <= 0:
        j += 1
    first = 0
    while True:
        c = float(suffix[j])
        last = cells[j] - 1 if j < ncell and cells[j] <= n - 1 else n - 1
        run_first[runs] = first
        run_last[runs] = last
        run_c[runs] = c
        runs += 1
        top = max(top, -math.sqrt(base[first] + c * c))
        if last == n - 1:
            break
        first = last + 1
        j += 1
    # near the top: each run's first candidates down to the reach (at most _NEAR_MOST in all, else none)
    reach = top - (math.log(n) + _NEAR_SPAN) / epsilon
    near = np.empty(_NEAR_MOST, dtype=np.int64)
    n_near = 0
    top_rest = -math.inf
    for r in range(runs):
        c = run_c[r]
        k = run_first[r]
        while k <= run_last[r] and -math.sqrt(base[k] + c * c) >= reach:
            if n_near == _NEAR_MOST:
                n_near = _NEAR_MOST + 1
                break
            near[n_near] = k
            n_near += 1
            k += 1
        if n_near > _NEAR_MOST:
            break
        if k <= run_last[r]:
            top_rest = max(top_rest, -math.sqrt(base[k] + c * c))
    if n_near > _NEAR_MOST:
        n_near = 0
        top_rest = top
    at = 0  # the next word
    nw = words.size
    best = -math.inf
    pick = 0
    for e in range(n_near):
        k = near[e]
        if at == nw:
            return -1
        c = float(suffix[np.searchsorted(cells, k, side="right")])
        noisy = -math.sqrt(base[k] + c * c) - math.log(_uniform(words[at])) / epsilon
        at += 1
        if noisy > best:
            best = noisy
            pick = k
    rest = n - n_near
    moved_at = np.empty(_FEW_MOVED, dtype=np.int64)  # the shuffle's positions that do not hold their own candidate
    moved_to = np.empty(_FEW_MOVED, dtype=np.int64)  # and the candidate each holds (a few, searched through)
    moved = 0  # how many; -1 once the whole order is kept in ``order``
    order = moved_at
    log_left = 0.0
    for step in range(rest):
        if at == nw:
            return -1
        v = _uniform(words[at])
        at += 1
        log_left += math.log(v) / (rest - step)
        noise = -math.log(-math.expm1(log_left)) / epsilon
        if top_rest + noise < best:
            break
        left = rest - step
        bits = 1
        while (1 << bits) < left:
            bits += 1
        shift = np.uint64(64 - bits)
        while True:
            if at == nw:
                return -1
            r = int(words[at] >> shift)
            at += 1
            if r < left:
                break
        p = step + r
        if moved >= 0 and moved == _FEW_MOVED:  # many steps (scores far apart for the noise): the whole order
            order = np.arange(rest)
            for e in range(moved):
                order[moved_at[e]] = moved_to[e]
            moved = -1
        if moved < 0:
            q = order[p]
            order[p] = order[step]
        else:
            q = p  # the candidate at position p; position p then takes the one at position step
            at_step = step
            slot = -1
            for e in range(moved):
                if moved_at[e] == p:
                    q = moved_to[e]
                    slot = e
                if moved_at[e] == step:
                    at_step = moved_to[e]
            if slot < 0:
                slot = moved
                moved += 1
                moved_at[slot] = p
            moved_to[slot] = at_step
        k = q  # the q-th candidate that is not near the top
        for e in range(n_near):
            if near[e] > k:
                break
            k += 1
        c = float(suffix[np.searchsorted(cells, k, side="right")])
        noisy = -math.sqrt(base[k] + c * c) + noise
        if noisy > best or (noisy == best and k < pick):
            best = noisy
            pick = k
    return pick


@numba.njit(cache=True, nogil=True)
def counts_drawn_max(hist, base, words, epsilon):
    """:func:`cells_drawn_max` of a dense holdout histogram (``len(base) + 1`` integer bins; the values above
    candidate k are in bins k + 1 and up)."""
    cells = np.flatnonzero(hist).astype(np.int64)
    counts = np.empty(cells.size, dtype=np.int64)
    for j in range(cells.size):
        counts[j] = hist[cells[j]]
    return cells_drawn_max(cells, counts, base, words, epsilon)


@numba.njit(cache=True, nogil=True)
def cells_drawn_max_many(words, cell_index, cell_count, offsets, base, epsilon, points):
    """:func:`cells_drawn_max` for many small holdouts at once, with each one's sum of its values truncated at the
    chosen candidate (the smoother's start, step 6 of ``operators.selection``).

    Stream ``i`` has the cells ``cell_index[offsets[i]:offsets[i + 1]]`` (counts alike) and the words ``words[i]``;
    ``points``: the value each bin stands for as an integer (the candidates, then the last one again). Returns the
    chosen index and ``sum count * min(points[cell], points[index])`` per stream (-1 and 0 where the stream's words
    were not enough)."""
    n = offsets.size - 1
    picks = np.empty(n, dtype=np.int64)
    totals = np.empty(n, dtype=np.int64)
    for i in range(n):
        lo, hi = offsets[i], offsets[i + 1]
        k = cells_drawn_max(cell_index[lo:hi], cell_count[lo:hi], base, words[i], epsilon)
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

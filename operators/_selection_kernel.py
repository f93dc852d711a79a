"""Report-noisy-max over a whole candidate grid, compiled: the end of a holdout's largest step.

When the holdout is too small for the calibrated choice's quantile (:func:`operators.selection.choose`, "too little
budget"), theta is chosen from counts alone over *every* candidate of the grid (4,296 for B = 5,000)::

    u(theta_k) = -sqrt(a theta_k^2 / eps^2 / E[l^2] + m_theta_k^2),    a = m^2 G_s            (selection, fallback)

and report-noisy-max adds exponential noise ``E_k = -log(U_k) / eps_t`` to each and returns the first index of the
largest (:func:`operators.threshold.report_noisy_max`). In numpy that is a dozen passes over the grid with as many
temporary arrays (the reverse cumulative sum of Eq. 5, the score, the uniforms, 4,296 logarithms), about 150 us a
stream; a daemon whose streams end their holdout by the hundred thousand pays it for each.

Here the answer is the same index, bit for bit, for less work:

1. One pass computes every ``u(theta_k)`` (the same IEEE operations in the same order as numpy: numba neither
   reorders nor fuses floating-point operations without ``fastmath``), their largest value ``u*`` and the candidate
   ``k0`` with the smallest uniform (the largest noise). ``best`` = its noisy score, a lower bound of the maximum.
2. A candidate can reach ``best`` only if ``E_k >= best - u*``, that is ``U_k <= exp(-eps (best - u*))``. Candidates
   above that bound (raised by a margin of ``1e-9 (1 + |best| + |u_min|)`` in noisy units, thousands of times the
   rounding error of a noisy score) are strictly below the maximum and skipped; for the others the noisy score is
   computed exactly as numpy does, in index order, keeping the first largest. For holdout 3 at B = 5,000 and a
   threshold budget of 0.75, about one candidate in 3,000 needs its logarithm (200 random holdouts: 0.03 % on
   average, 0.09 % at most).

``log``, ``exp`` and ``sqrt`` are the C library's, as numpy's are on x86-64 without AVX-512; a test compares this
kernel with the numpy path on thousands of random holdouts and on ties. It is used once the process has loaded the
compiled noise kernels (``operators.noise.compiled_loaded``), so a short command (a replay) never pays numba's
import.

A small holdout touches few cells (holdout 3: at most three of 5,001), and its histogram is kept sparse
(``operators.tops``). :func:`cells_noisy_max` takes those cells as they are, without the dense histogram: ``m_theta``
is constant between two occupied cells, where ``u`` can only fall (``base`` grows with theta and every IEEE operation
on the way is monotone), so the largest and smallest ``u`` are at the ends of those runs, and a score is computed
only for those ends and for the candidates that pass the bound. The uniforms are still read for every candidate (the
mechanism draws them all): about a word a nanosecond, against a square root per candidate in the dense kernel.
"""

from __future__ import annotations

import math

import numba
import numpy as np

_U53 = 2.0**-53


@numba.njit(cache=True, nogil=True, inline="always")
def _uniform(word):
    """``operators.noise._words_to_uniform`` of one word: 53 random bits, in (0, 1)."""
    return (float(word >> np.uint64(11)) + 0.5) * _U53


@numba.njit(cache=True, nogil=True)
def noisy_argmax(util, words, epsilon):
    """First index of ``max_k util[k] - log(U_k) / epsilon``, ``U_k`` the uniform of ``words[k]`` (module docstring:
    candidates that cannot reach the maximum are skipped without their logarithm)."""
    n = util.size
    top = -math.inf
    low = math.inf
    k0 = 0
    w0 = words[0]
    for k in range(n):
        top = max(top, util[k])
        low = min(low, util[k])
        if words[k] < w0:
            w0 = words[k]
            k0 = k
    best = util[k0] - math.log(_uniform(words[k0])) / epsilon
    tol = 1e-9 * (1.0 + abs(best) + abs(low))
    bound = math.exp(-epsilon * (best - top - tol))  # U_k above it: E_k < best - u* - tol
    pick = 0
    most = -math.inf
    for k in range(n):
        u = _uniform(words[k])
        if u > bound:
            continue
        noisy = util[k] - math.log(u) / epsilon
        if noisy > most:
            most = noisy
            pick = k
    return pick


@numba.njit(cache=True, nogil=True)
def counts_noisy_max(hist, base, words, epsilon):
    """:func:`noisy_argmax` of ``u(theta_k) = -sqrt(base_k + m_theta_k^2)``.

    ``hist``: the holdout histogram (``len(base) + 1`` integer bins; the values above candidate k are in bins k + 1
    and up), ``base``: the public part ``a theta_k^2 / eps^2 / E[l^2]``, computed once per configuration.
    """
    n = base.size
    util = np.empty(n, dtype=np.float64)
    above = 0
    for k in range(n + 1, hist.size):  # beyond the histogram's bins of the candidates (none in practice)
        above += hist[k]
    for k in range(n - 1, -1, -1):  # Eq. 5 from the top down: m_theta_k, a running sum
        above += hist[k + 1]
        c = float(above)
        util[k] = -math.sqrt(base[k] + c * c)
    return noisy_argmax(util, words, epsilon)


@numba.njit(cache=True, nogil=True)
def _last_word_within(bound):
    """The largest ``x = word >> 11`` whose uniform is at most ``bound`` (-1: none). The uniform never decreases
    with x, so ``U <= bound`` is ``word >> 11 <= x``: an integer comparison per candidate instead of a conversion."""
    top = 2**53 - 1
    if bound >= _uniform(np.uint64(top) << np.uint64(11)):
        return top
    x = min(max(int(bound * 2.0**53), 0), top)
    while x < top and _uniform(np.uint64(x + 1) << np.uint64(11)) <= bound:
        x += 1
    while x >= 0 and _uniform(np.uint64(x) << np.uint64(11)) > bound:
        x -= 1
    return x


@numba.njit(cache=True, nogil=True)
def cells_noisy_max(cells, counts, base, words, epsilon):
    """:func:`counts_noisy_max` of the histogram with ``counts[j]`` values in bin ``cells[j]`` (sorted, distinct)
    and none elsewhere: the same index, bit for bit, for a ``base`` that never decreases (module docstring).

    ``m_theta_k`` (Eq. 5) = the values in bins ``k + 1`` and up = the counts of the cells ``> k``: a suffix sum,
    constant on each run of k between two occupied cells.
    """
    n = base.size
    ncell = cells.size
    suffix = np.zeros(ncell + 1, dtype=np.int64)  # suffix[j]: the values in cells j and up
    for j in range(ncell - 1, -1, -1):
        suffix[j] = suffix[j + 1] + counts[j]
    top = -math.inf  # the largest and smallest score: at a run's first and last candidate
    low = math.inf
    j = 0
    while j < ncell and cells[j] <= 0:
        j += 1
    first = 0
    while True:
        c = float(suffix[j])
        last = cells[j] - 1 if j < ncell and cells[j] <= n - 1 else n - 1
        top = max(top, -math.sqrt(base[first] + c * c))
        low = min(low, -math.sqrt(base[last] + c * c))
        if last == n - 1:
            break
        first = last + 1
        j += 1
    k0 = 0  # the first smallest word: the largest noise
    w0 = words[0]
    for k in range(1, n):
        if words[k] < w0:
            w0 = words[k]
            k0 = k
    c = float(suffix[np.searchsorted(cells, k0, side="right")])
    best = -math.sqrt(base[k0] + c * c) - math.log(_uniform(w0)) / epsilon
    tol = 1e-9 * (1.0 + abs(best) + abs(low))
    within = _last_word_within(math.exp(-epsilon * (best - top - tol)))
    if within < 0:
        return k0
    limit = np.uint64(within)
    shift = np.uint64(11)
    pick = 0
    most = -math.inf
    for k in range(n):
        if (words[k] >> shift) > limit:
            continue
        c = float(suffix[np.searchsorted(cells, k, side="right")])
        noisy = -math.sqrt(base[k] + c * c) - math.log(_uniform(words[k])) / epsilon
        if noisy > most:
            most = noisy
            pick = k
    return pick


@numba.njit(cache=True, nogil=True)
def cells_noisy_max_many(words, cell_index, cell_count, offsets, base, epsilon, points):
    """:func:`cells_noisy_max` for many small holdouts at once, with each one's sum of its values truncated at the
    chosen candidate (the smoother's start, step 6 of ``operators.selection``).

    Stream ``i`` has the cells ``cell_index[offsets[i]:offsets[i + 1]]`` (counts alike) and the words ``words[i]``;
    ``points``: the value each bin stands for as an integer (the candidates, then the last one again). Returns the
    chosen index and ``sum count * min(points[cell], points[index])`` per stream."""
    n = offsets.size - 1
    picks = np.empty(n, dtype=np.int64)
    totals = np.empty(n, dtype=np.int64)
    for i in range(n):
        lo, hi = offsets[i], offsets[i + 1]
        k = cells_noisy_max(cell_index[lo:hi], cell_count[lo:hi], base, words[i], epsilon)
        picks[i] = k
        theta = points[k]
        total = 0
        for j in range(lo, hi):
            total += cell_count[j] * min(points[cell_index[j]], theta)
        totals[i] = total
    return picks, totals

"""The compiled per-reading step of :mod:`operators.columnar_holdout` (numba, ``cache=True``, no GIL).

One loop over a batch of (row, value) pairs of many streams in their holdout: clamp and quantize the value, count it in
its row's histogram over the candidate thresholds (the input of Eq. 5: cell ``k`` holds the values in
``(candidates[k-1], candidates[k]]``), and fold it into the row's block statistics (per leaf width and per cap ``2^k``,
the current block's truncated sum, the previous block's and the sum of ``|dS|`` between consecutive blocks: what
:class:`operators.selection.BlockStats` keeps). The arithmetic is :meth:`operators.tops.ToPS.process_one`'s and
``BlockStats``'s: integer sums, and ``|dS|`` sums of integers in float64 (exact below 2^53, in any order), so a row
ends with the very numbers the stream's own operator would hold.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def holdout_batch(rows, values, candidates, bound, resolution, bound_units, has_blocks, widths, caps, hist, partial,
                  prev, acc, pairs, pos, ticks, clamped):  # pragma: no cover - compiled
    n_w = widths.shape[0]
    n_c = caps.shape[0]
    for i in range(rows.shape[0]):
        r = rows[i]
        v = values[i]
        if v > bound:
            clamped[r] += 1
            v = bound
        elif v < 0.0:
            clamped[r] += 1
            v = 0.0
        u = np.int64(np.rint(v / resolution))
        if u > bound_units:
            u = bound_units
        hist[r, np.searchsorted(candidates, u)] += 1
        ticks[r] += 1
        if not has_blocks:
            continue
        p = pos[r] + 1
        pos[r] = p
        for k in range(n_w):
            for c in range(n_c):
                cap = caps[c]
                partial[r, k, c] += u if u < cap else cap
            if p % widths[k]:
                continue
            if prev[r, k, 0] >= 0:  # a block completed after another: one more difference
                for c in range(n_c):
                    acc[r, k, c] += abs(partial[r, k, c] - prev[r, k, c])
                pairs[r, k] += 1
            for c in range(n_c):
                prev[r, k, c] = partial[r, k, c]
                partial[r, k, c] = 0

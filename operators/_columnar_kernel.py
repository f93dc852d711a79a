"""The compiled per-reading step of :mod:`operators.columnar` (numba, ``cache=True``, no GIL).

One loop over a batch of (row, value) pairs from many streams: clamp and quantize the value, add it to its row's
open leaf, and either release the leaf's prediction or, when the leaf completes, its noisy sum from the row's
noise drawn ahead, minus what the leaf's earlier ticks released (Wang et al., Alg. 1, with the Recent smoother,
Appendix D). The arithmetic is the same as :func:`operators.smoother.release_ticks` in the same order, so every
release is the same float64 as ToPS's. It stops at the first reading whose row has no noise left and returns its
index; the caller refills that row and every other row that runs out in the rest of the batch
(:mod:`operators._refill_kernel`) and calls again from there.
"""

from __future__ import annotations

import numba
import numpy as np

_GRID = 1024.0


@numba.njit(cache=True, nogil=True)
def release_batch(rows, values, start, out, theta, width, pos, leaf_sum, pred, ticks, clamped, bound, bound_units,
                  resolution, noise, head, avail):  # pragma: no cover - compiled
    n = rows.shape[0]
    for i in range(start, n):
        r = rows[i]
        v = values[i]
        if v > bound[r]:
            clamped[r] += 1
            v = bound[r]
        elif v < 0.0:
            clamped[r] += 1
            v = 0.0
        u = np.int64(np.rint(v / resolution[r]))
        if u > bound_units[r]:
            u = bound_units[r]
        if u > theta[r]:
            u = theta[r]
        p = pos[r] + 1
        w = width[r]
        if p < w:
            pos[r] = p
            leaf_sum[r] += u
            x = pred[r]
        else:
            if avail[r] == 0:
                # undo nothing: the state of row r is untouched for reading i
                if v != values[i]:
                    clamped[r] -= 1
                return i
            k = head[r]
            total = np.float64(leaf_sum[r] + u) + noise[r, k]
            head[r] = k + 1
            avail[r] -= 1
            x = total - (w - 1) * pred[r]
            pred[r] = np.rint(total / w * _GRID) / _GRID
            pos[r] = 0
            leaf_sum[r] = 0
        ticks[r] += 1
        out[i] = x * resolution[r] if resolution[r] != 1.0 else x
    return n

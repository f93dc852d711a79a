"""Compiled loops of the frequency oracles (numba, ``cache=True``): OLH exact decoding, the Walsh-Hadamard transform,
the scatter of the Fourier OLH decoder. Each one has a plain-numpy twin in the tests (brute force on small inputs).
"""

from __future__ import annotations

import numba
import numpy as np

OLH_PRIME = (1 << 61) - 1
_P = np.uint64(OLH_PRIME)
_LANES = 8  # users decoded together: independent dependency chains, one vector of lanes per category


@numba.njit(cache=True, nogil=True, parallel=True)
def olh_support(a, b, r, g, d, nchunks):
    """``C_x = #{u : bucket((a_u x + b_u) mod P) = r_u}`` for every ``x < d``: every report hashed against every
    category (exact decoding), ``(a_u x + b_u) mod P`` stepped by ``+ a_u`` from ``x`` to ``x + 1``."""
    n = a.size
    counts = np.zeros((nchunks, d), dtype=np.int64)
    step = ((n + nchunks - 1) // nchunks + _LANES - 1) // _LANES * _LANES
    gg = np.uint64(g)
    for c in numba.prange(nchunks):
        lo = c * step
        hi = min(n, lo + step)
        row = counts[c]
        v = np.empty(_LANES, np.uint64)
        av = np.empty(_LANES, np.uint64)
        rv = np.empty(_LANES, np.uint64)
        for u0 in range(lo, hi, _LANES):
            m = min(_LANES, hi - u0)
            for j in range(_LANES):
                if j < m:
                    v[j] = b[u0 + j]
                    av[j] = a[u0 + j]
                    rv[j] = r[u0 + j]
                else:  # an idle lane never matches (its report is out of [0, g))
                    v[j] = 0
                    av[j] = 0
                    rv[j] = np.uint64(1) << np.uint64(40)
            for x in range(d):
                s = 0
                for j in range(_LANES):
                    vj = v[j]
                    s += (((vj >> np.uint64(29)) * gg) >> np.uint64(32)) == rv[j]
                    vj += av[j]
                    v[j] = vj - _P if vj >= _P else vj
                row[x] += s
    return counts.sum(axis=0)


@numba.njit(cache=True, nogil=True)
def fwht(x):
    """In-place unnormalised fast Walsh-Hadamard transform of a float64 vector of length ``2^m``: ``x <- H x``
    with the Sylvester ``H`` (``H[i, j] = (-1)^popcount(i & j)``), ``O(k log k)``."""
    k = x.size
    h = 1
    while h < k:
        for i in range(0, k, 2 * h):
            for j in range(i, i + h):
                s = x[j]
                t = x[j + h]
                x[j] = s + t
                x[j + h] = s - t
        h *= 2
    return x


@numba.njit(cache=True, nogil=True)
def fourier_scatter(a_digits, r, g, out, roots):
    """``F[w] += roots[t r_u mod g]`` at ``w = t a_u`` (digit-wise mod ``g``, flat index ``sum_i w_i g^i``) for every
    user ``u`` and every ``t < g``; ``a_digits[u]`` holds the ``k`` base-``g`` digits of ``a_u``."""
    n, k = a_digits.shape
    strides = np.empty(k, np.int64)
    s = 1
    for i in range(k):
        strides[i] = s
        s *= g
    digits = np.zeros(k, np.int64)
    for u in range(n):
        ru = r[u]
        out[0] += 1.0
        for i in range(k):
            digits[i] = 0
        ph = 0
        for _t in range(1, g):
            w = 0
            for i in range(k):
                dgt = digits[i] + a_digits[u, i]
                if dgt >= g:
                    dgt -= g
                digits[i] = dgt
                w += dgt * strides[i]
            ph += ru
            if ph >= g:
                ph -= g
            out[w] += roots[ph]


@numba.njit(cache=True, nogil=True, parallel=True)
def fwht_rows(x):
    """:func:`fwht` of every row of a 2-D float64 array, in place (rows in parallel)."""
    for i in numba.prange(x.shape[0]):
        fwht(x[i])
    return x

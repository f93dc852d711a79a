"""The exact discrete Laplace sampler of :mod:`operators.noise`, compiled: one sample at a time, the same bits.

Canonne, Kamath, Steinke 2020, Algorithms 1-2, exactly as the vectorized numpy version in ``operators/noise.py``
(``_sample``, ``_geometric``, ``_geometric_slow``, ``_bernoulli_exp``, ``_bernoulli``) runs them: every sample
reads its own bit sequence MSB first, in the same order, so both give the same samples bit for bit (a test checks
it). The numpy version pays a fixed set-up per array operation, whatever the array's size; this kernel
pays nothing per operation, which matters for the many small draws of the hierarchy's walk. It is
compiled (``cache=True``) when a process first draws noise often; importing numba takes a noticeable part of a second.

Constants a compiled function passes to another are typed values (``np.int64(0)``, ``np.bool_(True)``), not bare
literals: numba compiles the callee once more for each literal value, and a fresh install's first compile (a
daemon's first holdout end) would take that much longer (a test counts the specializations).
"""

from __future__ import annotations

import numba
import numpy as np

from operators._chacha_kernel import keystream

_CHUNK = 8
_MAX_V = 1 << 20


@numba.njit(cache=True, nogil=True)
def _take(words, base, nbits, cur, k):
    """The next ``k`` (1..64) bits at ``cur`` of the sequence at ``words[base:]``; -1 as cursor when past the end."""
    c = cur
    end = c + k
    if end > nbits:
        return np.uint64(0), -1
    i = base + (c >> 6)
    off = np.uint64(c & 63)
    window = (words[i] << off) | ((words[i + 1] >> np.uint64(1)) >> (np.uint64(63) - off))
    return window >> np.uint64(64 - k), end


@numba.njit(cache=True, nogil=True)
def _bernoulli(words, base, nbits, cur, n, d):
    """Bernoulli(n / d) by long division against 8 random bits at a time: (result, cursor or -1)."""
    r = np.uint64(n)
    dd = np.uint64(d)
    while True:
        rand, cur = _take(words, base, nbits, cur, np.int64(_CHUNK))
        if cur < 0:
            return False, -1
        num = r << np.uint64(_CHUNK)
        p = num // dd
        r = num - p * dd
        if rand < p:
            return True, cur
        if rand != p:
            return False, cur


@numba.njit(cache=True, nogil=True)
def _bernoulli_exp(words, base, nbits, cur, u, has_u, m):
    """Bernoulli(exp(-u / 2^m)) (or exp(-1) without ``u``): CKS Algorithm 1."""
    k = 1
    if not has_u:
        k = 2
    one = np.uint64(1) << np.uint64(m)
    while True:
        if not has_u:
            a, cur = _bernoulli(words, base, nbits, cur, np.uint64(1), np.uint64(k))
        elif k == 1:
            a, cur = _bernoulli(words, base, nbits, cur, u, one)
        else:
            a, cur = _bernoulli(words, base, nbits, cur, np.uint64(1), np.uint64(k))
            if a and cur >= 0:
                a, cur = _bernoulli(words, base, nbits, cur, u, one)
        if cur < 0:
            return False, -1
        if not a:
            return k % 2 == 1, cur
        k += 1


@numba.njit(cache=True, nogil=True)
def _geometric(words, base, nbits, cur, m, s, q, r):
    """``Y`` with ``P(Y >= y) = exp(-y s / 2^m)`` (see ``operators.noise._geometric``): (y, cursor or -1)."""
    one = np.uint64(1) << np.uint64(m)
    if np.uint64(s) >= one:  # _geometric_slow
        whole = np.int64(np.uint64(s) // one)
        frac = np.uint64(s) - np.uint64(whole) * one
        y = 0
        while True:
            ok = True
            for _ in range(whole):
                ok, cur = _bernoulli_exp(words, base, nbits, cur, np.uint64(0), np.bool_(False), m)
                if cur < 0:
                    return 0, -1
                if not ok:
                    break
            if ok and frac:
                ok, cur = _bernoulli_exp(words, base, nbits, cur, frac, np.bool_(True), m)
                if cur < 0:
                    return 0, -1
            if not ok:
                return y, cur
            y += 1
            if y > _MAX_V:
                return -1, -2
    u_acc = np.uint64(0)
    while True:
        u, cur = _take(words, base, nbits, cur, m)
        if cur < 0:
            return 0, -1
        d, cur = _bernoulli_exp(words, base, nbits, cur, u, np.bool_(True), m)
        if cur < 0:
            return 0, -1
        if d:
            u_acc = u
            break
    v = 0
    while True:
        b, cur = _bernoulli_exp(words, base, nbits, cur, np.uint64(0), np.bool_(False), m)
        if cur < 0:
            return 0, -1
        if not b:
            break
        v += 1
        if v > _MAX_V:
            return -1, -2
    vu = np.uint64(v)
    y = np.uint64(q) * vu + (u_acc + np.uint64(r) * vu) // np.uint64(s)
    return np.int64(y), cur


@numba.njit(cache=True, nogil=True)
def sample(words, per, m, s, q, r, out, ovf):
    """Fill ``out[i]`` from the bit sequence ``words[i*(per+1) : i*(per+1) + per]`` (padded with one zero word);
    ``ovf[i]`` when the sequence ran out (``out[i]`` is then meaningless). Returns False if a sample was beyond
    the int64 range (probability exp(-2^20))."""
    nbits = 64 * per
    for i in range(out.size):
        base = i * (per + 1)
        cur = np.int64(0)
        while True:
            sign, cur = _take(words, base, nbits, cur, np.int64(1))
            if cur < 0:
                ovf[i] = True
                break
            y, cur = _geometric(words, base, nbits, cur, m, s, q, r)
            if cur == -2:
                return False
            if cur < 0:
                ovf[i] = True
                break
            if sign == 1 and y == 0:
                continue
            out[i] = -y if sign == 1 else y
            break
    return True


@numba.njit(cache=True, nogil=True)
def sample_one(key_words, block, n0, n1, n2, m, s, q, r):
    """Sample ``block`` of an address's discrete Laplace draws (its own 64-byte block of the keystream of key
    ``key_words`` and nonce ``n0 n1 n2``), keystream and sampler in one call: ``(value, True)``, or ``(0, False)``
    when its 512 bits ran out (or the value left the int64 range) and the general path must draw it. A holdout's
    choice and a stream's first draws make such single draws: one call instead of three."""
    padded = np.zeros(9, dtype=np.uint64)  # the block, then one zero word, as operators.noise._Bits pads
    padded[:8] = keystream(key_words, block, n0, n1, n2, np.int64(1))
    out = np.zeros(1, dtype=np.int64)
    ovf = np.zeros(1, dtype=np.bool_)
    if sample(padded, np.int64(8), m, s, q, r, out, ovf) and not ovf[0]:
        return out[0], True
    return 0, False


@numba.njit(cache=True, nogil=True)
def sample_one_many(key_words, block, n0, n1, n2, m, s, q, r):
    """:func:`sample_one` for many keys (``key_words[i]``) at one address, each with its own noise (``m[i]``, ``s[i]``,
    ``q[i]``, ``r[i]``): the values, and False where the general path must draw it."""
    n = key_words.shape[0]
    out = np.zeros(n, dtype=np.int64)
    ok = np.zeros(n, dtype=np.bool_)
    for i in range(n):
        out[i], ok[i] = sample_one(key_words[i], block, n0, n1, n2, m[i], s[i], q[i], r[i])
    return out, ok

"""The ChaCha20 keystream of :mod:`operators.noise`, compiled: the same bytes as the ``cryptography`` package's
ChaCha20 (OpenSSL), without its per-call cost.

RFC 8439, section 2.3 (the block function) and 2.4 (the keystream): the state is the four constants, the 256-bit
key as eight little-endian words, the 32-bit block counter and the 96-bit nonce; 20 rounds (10 column and 10
diagonal double rounds) of quarter rounds (``a += b; d ^= a; d <<<= 16; c += d; b ^= c; b <<<= 12; a += b;
d ^= a; d <<<= 8; c += d; b ^= c; b <<<= 7``), then the input state is added word by word. ``cryptography``'s
16-byte nonce is that counter followed by the 12 nonce bytes, which is how :func:`operators.noise._keystream`
fills it (block counter, domain, address). Every word is computed in 64-bit integers and masked to 32 bits (numba
widens 32-bit arithmetic). A test compares this kernel with ``cryptography`` on thousands of random keys, counters
and addresses, and with the RFC's own test vector. It is loaded as the discrete Laplace kernel is (after a process
drew noise a few times): calling OpenSSL through ``cryptography`` costs many times this kernel's call, which is
most of a small draw (a hierarchy's refill makes a few of them per leaf group, the holdout's choice five).
"""

from __future__ import annotations

import numba
import numpy as np

_M = np.uint64(0xFFFFFFFF)


@numba.njit(cache=True, nogil=True, inline="always")
def _rotl(x, n):
    return ((x << np.uint64(n)) | (x >> np.uint64(32 - n))) & _M


@numba.njit(cache=True, nogil=True, inline="always")
def _quarter(s, a, b, c, d):
    s[a] = (s[a] + s[b]) & _M
    s[d] = _rotl(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & _M
    s[b] = _rotl(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b]) & _M
    s[d] = _rotl(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & _M
    s[b] = _rotl(s[b] ^ s[c], 7)


@numba.njit(cache=True, nogil=True)
def keystream(key_words, counter, n0, n1, n2, nblocks):
    """``nblocks`` 64-byte blocks from block ``counter`` of the keystream of (key, nonce ``n0 n1 n2``), as 64-bit
    little-endian words (8 per block). ``key_words``: the key as 8 little-endian 32-bit words (uint64 array)."""
    out = np.empty(nblocks * 8, dtype=np.uint64)
    init = np.empty(16, dtype=np.uint64)
    s = np.empty(16, dtype=np.uint64)
    init[0] = np.uint64(0x61707865)
    init[1] = np.uint64(0x3320646E)
    init[2] = np.uint64(0x79622D32)
    init[3] = np.uint64(0x6B206574)
    for i in range(8):
        init[4 + i] = key_words[i] & _M
    init[13] = np.uint64(n0) & _M
    init[14] = np.uint64(n1) & _M
    init[15] = np.uint64(n2) & _M
    for b in range(nblocks):
        init[12] = np.uint64(counter + b) & _M
        for i in range(16):
            s[i] = init[i]
        for _ in range(10):
            _quarter(s, 0, 4, 8, 12)
            _quarter(s, 1, 5, 9, 13)
            _quarter(s, 2, 6, 10, 14)
            _quarter(s, 3, 7, 11, 15)
            _quarter(s, 0, 5, 10, 15)
            _quarter(s, 1, 6, 11, 12)
            _quarter(s, 2, 7, 8, 13)
            _quarter(s, 3, 4, 9, 14)
        for i in range(8):
            lo = (s[2 * i] + init[2 * i]) & _M
            hi = (s[2 * i + 1] + init[2 * i + 1]) & _M
            out[b * 8 + i] = lo | (hi << np.uint64(32))
    return out


@numba.njit(cache=True, nogil=True)
def keystream_many(key_words, counter, n0, n1, n2, nblocks):
    """:func:`keystream` for many keys (``key_words[i]``, one row each) at one nonce: row ``i`` of the result is key
    ``i``'s ``nblocks`` blocks (the words a holdout's choice reads, for many streams ending their holdout at once)."""
    n = key_words.shape[0]
    out = np.empty((n, nblocks * 8), dtype=np.uint64)
    for i in range(n):
        out[i] = keystream(key_words[i], counter, n0, n1, n2, nblocks)
    return out

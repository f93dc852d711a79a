"""The noise drawn ahead of many rows of :mod:`operators.columnar` in one compiled call (numba, cache, no GIL).

For each row, the consistent noise of its next leaves, bit for bit what its stream's own
:class:`operators.hierarchy.ConsistentNoise` walk produces (Wang et al., "Continuous Release of Data Streams under both
Centralized and Local Differential Privacy", CCS 2021, Appendix C; Hay et al., "Boosting the accuracy of
differentially private histograms through consistency", VLDB 2010), from the row's key and position alone:

* every node's noise ``N(x)`` is sample ``i`` of ``(domain HIERARCHY << 16 | layer, address tree)`` of the stream's
  keyed generator: ChaCha20 block ``i`` of that keystream read by the exact discrete Laplace sampler
  (:func:`operators._dlap_kernel.sample`), and a sample that runs past its 512 bits goes on with its overflow
  keystream (:mod:`operators.noise`, "Keystream layout"), as :meth:`operators.noise.KeyedGenerator.discrete_laplace`
  reads them;
* bottom-up, ``z(x) = a_l N(x) + (1 - a_l) S(x)`` with ``S(x)`` the sum of its children's ``z`` added left to right
  (leaves: ``z = N``);
* top-down, a child ``y`` of ``x`` has ``c(y) = z(y) + (c(x) - S(x)) / b``; a top node has ``c = z``.

The walk keeps, for each layer ``j >= 1``, one number: ``(c(A_j) - S(A_j)) / b`` of the ancestor ``A_j`` of the next
leaf (the row's ``shift`` column), valid when ``known``. Entering a node (its first leaf) regenerates its subtree to get
``S``, then ``z`` and ``c`` from its parent's shift, then its own shift; a leaf is then ``z(leaf)`` plus its parent's
shift, rounded to the release grid (multiples of 2^-10). Every number is the same float64 operation on the same
operands as the walk's numpy arithmetic, in the same order, so the noise is the walk's bit for bit. A row whose
shifts are not known (new, restored, made from an operator) enters every ancestor of its next leaf from the top.
Only the top node over the next leaf is regenerated, not the whole tree: each top node's ``z`` depends on its own
subtree only. Consecutive nodes of a layer (a subtree's leaves) are drawn in runs: 16 ChaCha20 blocks computed side by
side, then the sampler over the run.

Constants a compiled function passes to another are typed values (``np.int64(0)``, ``np.bool_(True)``), not bare
literals: numba compiles the callee once more for each literal value, and a fresh install's first compile (a
daemon's first holdout end) would take that much longer (a test counts the specializations).
"""

from __future__ import annotations

import numba
import numpy as np

from operators._dlap_kernel import sample
from operators.domains import Domain

_M = np.uint64(0xFFFFFFFF)
_GRID = 1024.0
_HIERARCHY = int(Domain.HIERARCHY) << 16  # the domain of a node's noise, the layer in its low 16 bits
_OVERFLOW_DOMAIN = 0xFFFFFFFF
OK, BEYOND_INT64 = 0, 2


@numba.njit(cache=True, nogil=True, inline="always")
def _rotl(x, n):
    return ((x << np.uint64(n)) | (x >> np.uint64(32 - n))) & _M


@numba.njit(cache=True, nogil=True, inline="always")
def _quarter(a, b, c, d):
    """RFC 8439, 2.1: one quarter round on 32-bit words held in 64-bit integers."""
    a = (a + b) & _M
    d = _rotl(d ^ a, 16)
    c = (c + d) & _M
    b = _rotl(b ^ c, 12)
    a = (a + b) & _M
    d = _rotl(d ^ a, 8)
    c = (c + d) & _M
    b = _rotl(b ^ c, 7)
    return a, b, c, d


@numba.njit(cache=True, nogil=True)
def chacha_block(kw, counter, n0, n1, n2, out, at):  # pragma: no cover - compiled
    """ChaCha20 block ``counter`` of the keystream of key ``kw`` (8 little-endian 32-bit words, as uint64) and nonce
    ``n0 n1 n2`` (RFC 8439, 2.3), as 8 little-endian 64-bit words in ``out[at : at + 8]``: the words of
    :func:`operators._chacha_kernel.keystream`, with the state in registers instead of arrays."""
    c0, c1, c2, c3 = np.uint64(0x61707865), np.uint64(0x3320646E), np.uint64(0x79622D32), np.uint64(0x6B206574)
    k0, k1, k2, k3 = kw[0] & _M, kw[1] & _M, kw[2] & _M, kw[3] & _M
    k4, k5, k6, k7 = kw[4] & _M, kw[5] & _M, kw[6] & _M, kw[7] & _M
    t = np.uint64(counter) & _M
    u0, u1, u2 = np.uint64(n0) & _M, np.uint64(n1) & _M, np.uint64(n2) & _M
    x0, x1, x2, x3 = c0, c1, c2, c3
    x4, x5, x6, x7 = k0, k1, k2, k3
    x8, x9, x10, x11 = k4, k5, k6, k7
    x12, x13, x14, x15 = t, u0, u1, u2
    for _ in range(10):
        x0, x4, x8, x12 = _quarter(x0, x4, x8, x12)
        x1, x5, x9, x13 = _quarter(x1, x5, x9, x13)
        x2, x6, x10, x14 = _quarter(x2, x6, x10, x14)
        x3, x7, x11, x15 = _quarter(x3, x7, x11, x15)
        x0, x5, x10, x15 = _quarter(x0, x5, x10, x15)
        x1, x6, x11, x12 = _quarter(x1, x6, x11, x12)
        x2, x7, x8, x13 = _quarter(x2, x7, x8, x13)
        x3, x4, x9, x14 = _quarter(x3, x4, x9, x14)
    s32 = np.uint64(32)
    out[at] = ((x0 + c0) & _M) | (((x1 + c1) & _M) << s32)
    out[at + 1] = ((x2 + c2) & _M) | (((x3 + c3) & _M) << s32)
    out[at + 2] = ((x4 + k0) & _M) | (((x5 + k1) & _M) << s32)
    out[at + 3] = ((x6 + k2) & _M) | (((x7 + k3) & _M) << s32)
    out[at + 4] = ((x8 + k4) & _M) | (((x9 + k5) & _M) << s32)
    out[at + 5] = ((x10 + k6) & _M) | (((x11 + k7) & _M) << s32)
    out[at + 6] = ((x12 + t) & _M) | (((x13 + u0) & _M) << s32)
    out[at + 7] = ((x14 + u1) & _M) | (((x15 + u2) & _M) << s32)


_LANES = 16  # blocks computed side by side (the compiler turns the loops over lanes into vector instructions)
_RUN = 64  # samples a run draws at a time (a multiple of the lanes)


@numba.njit(cache=True, nogil=True, inline="always")
def _quarter_lanes(x, a, b, c, d):
    """:func:`_quarter` on every lane of ``x`` (16 words x lanes, uint32: a sum or shift wraps as it is stored)."""
    for lane in range(_LANES):
        x[a, lane] = x[a, lane] + x[b, lane]
        t = x[d, lane] ^ x[a, lane]
        x[d, lane] = (t << np.uint32(16)) | (t >> np.uint32(16))
        x[c, lane] = x[c, lane] + x[d, lane]
        t = x[b, lane] ^ x[c, lane]
        x[b, lane] = (t << np.uint32(12)) | (t >> np.uint32(20))
        x[a, lane] = x[a, lane] + x[b, lane]
        t = x[d, lane] ^ x[a, lane]
        x[d, lane] = (t << np.uint32(8)) | (t >> np.uint32(24))
        x[c, lane] = x[c, lane] + x[d, lane]
        t = x[b, lane] ^ x[c, lane]
        x[b, lane] = (t << np.uint32(7)) | (t >> np.uint32(25))


@numba.njit(cache=True, nogil=True)
def chacha_blocks(kw, counter, n0, n1, n2, count, out, x, init):  # pragma: no cover - compiled
    """Blocks ``counter .. counter + count - 1`` of the keystream of (``kw``, ``n0 n1 n2``), block ``k`` as the 8 words
    of :func:`chacha_block` at ``out[9 k : 9 k + 8]`` and a zero word at ``out[9 k + 8]`` (the layout the sampler
    reads, one zero word after each sample's bits as ``operators.noise._Bits`` pads them), 16 blocks side by side.
    ``x`` (16 x 16) and ``init`` (16) are uint32 scratch."""
    init[0], init[1], init[2], init[3] = 0x61707865, 0x3320646E, 0x79622D32, 0x6B206574
    for i in range(8):
        init[4 + i] = np.uint32(kw[i] & _M)
    init[13], init[14], init[15] = np.uint32(n0 & 0xFFFFFFFF), np.uint32(n1 & 0xFFFFFFFF), np.uint32(n2 & 0xFFFFFFFF)
    s32 = np.uint64(32)
    for g in range(0, count, _LANES):
        for i in range(16):
            for lane in range(_LANES):
                x[i, lane] = init[i]
        for lane in range(_LANES):
            x[12, lane] = np.uint32((counter + g + lane) & 0xFFFFFFFF)
        for _ in range(10):
            _quarter_lanes(x, 0, 4, 8, 12)
            _quarter_lanes(x, 1, 5, 9, 13)
            _quarter_lanes(x, 2, 6, 10, 14)
            _quarter_lanes(x, 3, 7, 11, 15)
            _quarter_lanes(x, 0, 5, 10, 15)
            _quarter_lanes(x, 1, 6, 11, 12)
            _quarter_lanes(x, 2, 7, 8, 13)
            _quarter_lanes(x, 3, 4, 9, 14)
        for lane in range(min(_LANES, count - g)):
            at = 9 * (g + lane)
            c12 = np.uint32((counter + g + lane) & 0xFFFFFFFF)
            for i in range(8):
                lo = np.uint32(x[2 * i, lane] + (c12 if 2 * i == 12 else init[2 * i]))
                hi = np.uint32(x[2 * i + 1, lane] + init[2 * i + 1])
                out[at + i] = np.uint64(lo) | (np.uint64(hi) << s32)
            out[at + 8] = 0


@numba.njit(cache=True, nogil=True)
def _derived_key(kw, n0, n1, n2):  # pragma: no cover - compiled
    """The first 32 bytes of block 0 of the keystream of (``kw``, ``n0 n1 n2``), as 8 key words: how
    :meth:`operators.noise.KeyedGenerator._overflow_samples` derives its overflow keys."""
    block = np.empty(8, dtype=np.uint64)
    chacha_block(kw, np.int64(0), n0, n1, n2, block, np.int64(0))
    out = np.empty(8, dtype=np.uint64)
    for i in range(4):
        out[2 * i] = block[i] & _M
        out[2 * i + 1] = block[i] >> np.uint64(32)
    return out


@numba.njit(cache=True, nogil=True)
def _overflowed(kw, domain, address, index, main, m, s, q, r):  # pragma: no cover - compiled
    """Sample ``index`` of ``(domain, address)`` whose 512 main bits (``main``) ran out, drawn again on the main bits
    followed by its own overflow keystream (``k_o = ChaCha20(k, 0xFFFFFFFF, 0)[:32]``, ``k_da = ChaCha20(k_o, domain,
    address)[:32]``, blocks ``0 ..`` of ``(k_da, domain 0, address index)``), 8 blocks, then 32, 128, ... until it
    fits: ``(value, status)``."""
    k_o = _derived_key(kw, np.int64(_OVERFLOW_DOMAIN), np.int64(0), np.int64(0))
    k_da = _derived_key(k_o, domain, address & 0xFFFFFFFF, address >> 32)
    res = np.zeros(1, dtype=np.int64)
    ovf = np.zeros(1, dtype=np.bool_)
    blocks = 8
    while True:
        per = 8 + 8 * blocks
        seq = np.zeros(per + 1, dtype=np.uint64)  # the words, then one zero word (operators.noise._Bits pads so)
        seq[:8] = main
        for k in range(blocks):
            chacha_block(k_da, k, np.int64(0), index & 0xFFFFFFFF, index >> 32, seq, 8 + 8 * k)
        ovf[0] = False
        if not sample(seq, per, m, s, q, r, res, ovf):
            return 0, BEYOND_INT64
        if not ovf[0]:
            return res[0], OK
        blocks *= 4


@numba.njit(cache=True, nogil=True)
def node_noise(kw, layer, tree, index, m, s, q, r, buf, res, ovf):  # pragma: no cover - compiled
    """``N(x)`` of node ``index`` of ``layer`` in tree ``tree``: sample ``index`` of ``(HIERARCHY << 16 | layer,
    tree)`` of the discrete Laplace ``(m, s, q, r)``, as :meth:`operators.noise.KeyedGenerator.discrete_laplace` draws
    it: ``(value, status)``. ``buf`` (9 words), ``res`` and ``ovf`` (1 each) are scratch."""
    domain = _HIERARCHY | layer
    chacha_block(kw, index, domain, tree & 0xFFFFFFFF, tree >> 32, buf, np.int64(0))
    buf[8] = 0
    ovf[0] = False
    if not sample(buf, np.int64(8), m, s, q, r, res, ovf):
        return 0, BEYOND_INT64
    if not ovf[0]:
        return res[0], OK
    return _overflowed(kw, domain, tree, index, buf[:8].copy(), m, s, q, r)


@numba.njit(cache=True, nogil=True)
def node_noise_run(kw, layer, tree, first, count, m, s, q, r, vals, ws):  # pragma: no cover - compiled
    """:func:`node_noise` of nodes ``first .. first + count - 1`` of ``layer`` (``count`` at most ``_RUN``) into
    ``vals[:count]``: their blocks made side by side, then the sampler over all of them: the status."""
    words, ovf, x, init = ws[3], ws[4], ws[5], ws[6]
    domain = _HIERARCHY | layer
    chacha_blocks(kw, first, domain, tree & 0xFFFFFFFF, tree >> 32, count, words, x, init)
    for k in range(count):
        ovf[k] = False
    if not sample(words, np.int64(8), m, s, q, r, vals[:count], ovf[:count]):
        return BEYOND_INT64
    for k in range(count):
        if ovf[k]:
            v, st = _overflowed(kw, domain, tree, first + k, words[9 * k : 9 * k + 8].copy(), m, s, q, r)
            if st != OK:
                return st
            vals[k] = v
    return OK


@numba.njit(cache=True, nogil=True)
def samples(kw, domain, address, first, count, m, s, q, r):  # pragma: no cover - compiled
    """Samples ``first .. first + count - 1`` of ``(domain, address)`` of the discrete Laplace ``(m, s, q, r)``, as
    :meth:`operators.noise.KeyedGenerator.discrete_laplace` draws them, in runs of blocks made side by side:
    ``(values, status)``. A walk's many small draws (a few nodes of a layer at a time) each cost one call."""
    out = np.zeros(count, dtype=np.int64)
    ws = scratch(np.int64(1))
    words, ovf, x, init, vals = ws[3], ws[4], ws[5], ws[6], ws[7]
    for c0 in range(0, count, _RUN):
        c = min(_RUN, count - c0)
        chacha_blocks(kw, first + c0, domain, address & 0xFFFFFFFF, address >> 32, c, words, x, init)
        for k in range(c):
            ovf[k] = False
        if not sample(words, np.int64(8), m, s, q, r, vals[:c], ovf[:c]):
            return out, BEYOND_INT64
        for k in range(c):
            if ovf[k]:
                v, st = _overflowed(kw, domain, address, first + c0 + k, words[9 * k : 9 * k + 8].copy(), m, s, q, r)
                if st != OK:
                    return out, st
                vals[k] = v
        out[c0 : c0 + c] = vals[:c]
    return out, OK


@numba.njit(cache=True, nogil=True)
def scratch(fanout):  # pragma: no cover - compiled
    """The work arrays of a refill: one sample's block, its value and overflow mark (:func:`node_noise`), a run's
    blocks, marks, lanes and values (:func:`node_noise_run`), and ``fanout`` leaves' ``z``."""
    return (np.empty(9, dtype=np.uint64), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.bool_),
            np.zeros(9 * _RUN, dtype=np.uint64), np.zeros(_RUN, dtype=np.bool_), np.empty((16, _LANES), np.uint32),
            np.empty(16, np.uint32), np.empty(_RUN, dtype=np.int64), np.empty(fanout, dtype=np.float64))


@numba.njit(cache=True, nogil=True)
def children_sum(kw, tree, j, i, b, pw, weights, m, s, q, r, acc, cnt, ws):  # pragma: no cover - compiled
    """``S(x)`` of node ``i`` of layer ``j >= 1``: the sum, left to right, of its ``b`` children's ``z``, from its
    whole subtree (leaves left to right, drawn in runs; a node's ``z = a N + (1 - a) S`` as soon as its last child is
    in). When ``j == 1`` the ``b`` leaves' ``z`` are left in the scratch's leaves. ``(sum, status)``; ``acc`` and
    ``cnt`` are scratch of at least ``j + 1`` entries, ``pw[k] = b^k``, ``ws`` the :func:`scratch`."""
    buf, res, ovf, vals, leaves = ws[0], ws[1], ws[2], ws[7], ws[8]
    for k in range(j + 1):
        cnt[k] = 0
    lo = i * pw[j]
    for c0 in range(0, pw[j], _RUN):
        count = min(_RUN, pw[j] - c0)
        st = node_noise_run(kw, np.int64(0), tree, lo + c0, count, m, s, q, r, vals, ws)
        if st != OK:
            return 0.0, st
        for e in range(count):
            x = lo + c0 + e
            z = np.float64(vals[e])
            if j == 1:
                leaves[x - lo] = z
            k = np.int64(1)
            while True:
                if cnt[k] == 0:
                    acc[k] = z
                else:
                    acc[k] = acc[k] + z
                cnt[k] += 1
                if cnt[k] < b:
                    break
                cnt[k] = 0
                if k == j:
                    return acc[k], OK
                v, st = node_noise(kw, k, tree, x // pw[k], m, s, q, r, buf, res, ovf)
                if st != OK:
                    return 0.0, st
                a = weights[k]
                z = a * np.float64(v) + (1.0 - a) * acc[k]
                k += 1
    return acc[j], OK  # not reached: the last leaf completes node i


@numba.njit(cache=True, nogil=True)
def enter_node(kw, tree, j, i, top, b, pw, weights, shift, m, s, q, r, acc, cnt, ws):  # pragma: no cover - compiled
    """Enter node ``i`` of layer ``j >= 1`` (the first leaf under it comes next): ``S`` from its subtree,
    ``z = a_j N + (1 - a_j) S``, ``c = z`` for a node of the top layer ``top`` else ``z`` plus its parent's shift
    ``shift[j]``, and its own shift ``shift[j - 1] = (c - S) / b``: the status."""
    ssum, st = children_sum(kw, tree, j, i, b, pw, weights, m, s, q, r, acc, cnt, ws)
    if st != OK:
        return st
    v, st = node_noise(kw, j, tree, i, m, s, q, r, ws[0], ws[1], ws[2])
    if st != OK:
        return st
    a = weights[j]
    z = a * np.float64(v) + (1.0 - a) * ssum
    c = z if j == top else z + shift[j]
    shift[j - 1] = (c - ssum) / b
    return OK


@numba.njit(cache=True, nogil=True)
def fill_row(kw, noise, have, g, known, b, L, per_tree, pw, weights, shift, m, s, q, r, acc, cnt,
             ws):  # pragma: no cover - compiled
    """One row's buffer ``noise`` filled from ``noise[have]`` on with the consistent noise of leaves ``g, g + 1, ...``
    (global leaf indices: tree ``g // per_tree``), entering the ancestors that start at each leaf (every ancestor,
    from the top, at the first leaf when the row's shifts are not ``known``): ``(the next leaf, status)``."""
    buf, res, ovf, vals, leaves = ws[0], ws[1], ws[2], ws[7], ws[8]
    leaves_of = -1  # the layer-1 node whose leaves' z are in the scratch (from this slot on)
    for slot in range(have, noise.size):
        tree, leaf = g // per_tree, g % per_tree
        if L == 1:  # the leaves are the top nodes: c = z = N
            v, st = node_noise(kw, np.int64(0), tree, leaf, m, s, q, r, buf, res, ovf)
            if st != OK:
                return g, st
            c = np.float64(v)
        else:
            top = L - 1
            if known:  # enter the ancestors that start at this leaf
                top = 0
                for j in range(L - 1, 0, -1):
                    if leaf % pw[j] == 0:
                        top = j
                        break
            for j in range(top, 0, -1):
                st = enter_node(kw, tree, j, leaf // pw[j], L - 1, b, pw, weights, shift, m, s, q, r, acc, cnt, ws)
                if st != OK:
                    return g, st
            if top >= 1:  # the layer-1 node was entered: its leaves' z are in the scratch
                leaves_of = g // b
            known = True
            if leaves_of != g // b:  # a layer-1 node entered before this call: draw the leaves wanted of it
                first = leaf % b
                want = min(b - first, noise.size - slot)
                for c0 in range(0, want, _RUN):
                    count = min(_RUN, want - c0)
                    st = node_noise_run(kw, np.int64(0), tree, leaf + c0, count, m, s, q, r, vals, ws)
                    if st != OK:
                        return g, st
                    for e in range(count):
                        leaves[first + c0 + e] = np.float64(vals[e])
                leaves_of = g // b
            c = leaves[leaf % b] + shift[0]
        noise[slot] = np.rint(c * _GRID) / _GRID
        g += 1
    return g, OK


@numba.njit(cache=True, nogil=True)
def _key_words(key, row, kw):  # pragma: no cover - compiled
    """Row ``row`` of the key column (32 bytes) as 8 little-endian 32-bit words in ``kw`` (uint64), the words
    :meth:`operators.noise.KeyedGenerator.key_words` gives."""
    for k in range(8):
        word = np.uint64(0)
        for byte in range(4):
            word |= np.uint64(key[row, 4 * k + byte]) << np.uint64(8 * byte)
        kw[k] = word


@numba.njit(cache=True, nogil=True)
def refill_rows(due, key, drawn, head, avail, noise, shift, known, shape, fanout, layers, top_nodes, weights,
                m, s, q, r):  # pragma: no cover - compiled
    """Fill the noise drawn ahead of every row in ``due`` (distinct rows) to the brim: the unused leaves moved to the
    front, then the consistent noise of the row's next leaves (:func:`fill_row`), its walk's shifts kept.

    Per due row ``t``: ``shape[t]`` indexes ``fanout``, ``layers`` (L), ``top_nodes`` (R) and ``weights`` (the
    ``a_l`` of :func:`operators.hierarchy.layer_weight`, row by shape, index = layer); ``m[t] .. r[t]`` its discrete
    Laplace. Returns -1, or the index in ``due`` of a row whose draw left the int64 range (probability exp(-2^20)):
    that row keeps the leaves it had (moved to the front), its shifts forgotten; the rows after it are untouched."""
    ahead = noise.shape[1]
    kw = np.empty(8, dtype=np.uint64)
    depth = 2
    for t in range(due.size):
        depth = max(depth, layers[shape[t]] + 1)
    pw = np.empty(depth, dtype=np.int64)
    acc = np.empty(depth, dtype=np.float64)
    cnt = np.zeros(depth, dtype=np.int64)
    ws = scratch(int(fanout.max()) if fanout.size else 1)
    for t in range(due.size):
        row, sh = due[t], shape[t]
        b, L = fanout[sh], layers[sh]
        pw[0] = 1
        for k in range(1, L + 1):
            pw[k] = pw[k - 1] * b
        _key_words(key, row, kw)
        have, h = avail[row], head[row]
        if h:
            for k in range(have):
                noise[row, k] = noise[row, h + k]
            head[row] = 0
        g, st = fill_row(kw, noise[row], have, drawn[row], known[row] != 0, b, L, top_nodes[sh] * pw[L - 1], pw,
                         weights[sh], shift[row], m[t], s[t], q[t], r[t], acc, cnt, ws)
        if st != OK:
            known[row] = 0
            return t
        drawn[row] = g
        avail[row] = ahead
        known[row] = 1
    return -1

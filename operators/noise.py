"""Keyed, addressable noise: ChaCha20 keystreams turned into integer (discrete Laplace) noise.

Every random number that protects privacy comes from here. A stream owns a 256-bit secret key; a draw is
addressed by a *domain* (what the noise is for, e.g. hierarchy layer ``j``) and an *address* (e.g. the tree
index), and by the position of the sample inside that keystream. The same key and address always give the same
noise, so re-running the same ticks reproduces the same releases bit for bit and a restart never spends privacy
budget twice (docs/privacy.md).

Samples are drawn in bulk (one cipher call per contiguous range) and turned into integers by vectorized numpy.

Discrete Laplace (two-sided geometric) of scale ``sensitivity / epsilon``, sensitivity in quantized units::

    P(X = k) = (1 - a) / (1 + a) * a^|k|,   a = exp(-epsilon / sensitivity),   Var[X] = 2a / (1 - a)^2.

**Exact sampling** (Canonne, Kamath, Steinke 2020, "The Discrete Gaussian for Differential Privacy", Algorithms 1
and 2, as OpenDP does): only integer arithmetic and random bits, no floating point, no ``log``.

* The scale is a rational ``t / s`` with ``t = 2^m``: ``m = 20 + max(0, ceil(log2 scale))`` and
  ``s = floor(2^m / scale)`` computed exactly (``fractions.Fraction`` of the float epsilon and sensitivity). So
  ``t / s >= scale``: the noise is never smaller than asked, and the *effective* epsilon
  ``sensitivity * s / 2^m`` is at most the configured one and at least ``epsilon * (1 - 2^-20)``
  (:attr:`DiscreteLaplace.effective_epsilon`). Scales outside ``[2^-10, 2^36]`` are refused.
* ``Bernoulli(p)`` for rational ``p = n / d``: compare the random bits, 8 at a time, with the binary expansion of
  ``p`` (long division); the first differing chunk decides (``U < p``), so it is exact with probability 1.
* ``Bernoulli(exp(-gamma))`` for ``gamma = u / 2^m`` in ``[0, 1)`` (Algorithm 1): ``K = 1, 2, ...`` while
  ``Bernoulli(gamma / K)`` succeeds, where ``Bernoulli(gamma / K) = Bernoulli(1 / K) and Bernoulli(gamma)`` for
  ``K >= 2``; return whether the final ``K`` is odd. ``Bernoulli(exp(-1))`` is the same with ``gamma = 1``.
* Magnitude (Algorithm 2): ``u`` uniform in ``[0, 2^m)`` (``m`` raw bits, no rejection needed) until
  ``Bernoulli(exp(-u / 2^m))`` accepts; ``V`` = the number of successes of ``Bernoulli(exp(-1))`` before the first
  failure; ``Y = floor((u + 2^m V) / s)``, which is geometric with ``P(Y >= y) = exp(-y s / 2^m)``.
* Sign: one bit ``b``; ``(b = 1, Y = 0)`` is rejected and the sample starts again; else ``X = (1 - 2b) Y``.

**Keystream layout (addressable).** Sample ``i`` of ``(domain, address)`` reads its random bits, most significant
first, from the 8 little-endian 64-bit words ``[8 i, 8 i + 8)`` (one 64-byte ChaCha20 block) of the keystream of
``(domain, address)``, then, if it needs more than those 512 bits (a few in a million samples), continues with
the keystream of an *overflow key*: ``k_o = ChaCha20(k, domain 0xFFFFFFFF, address 0)[:32]`` (a domain no draw
uses), ``k_{d,a} = ChaCha20(k_o, domain d, address a)[:32]``, whose keystream at nonce address ``i`` belongs to
sample ``i`` alone. A sample is thus a deterministic function of ``(key, domain, address, i)`` whatever range a
call asks for, and its bits are an infinite sequence of independent fair bits, so the output is exactly the
discrete Laplace (the samples that run past the 512 bits are recomputed from the start on the longer sequence,
which reads the same bits in the same order). The kernel is vectorized numpy (no compile or load cost).

Examples
--------
>>> gen = KeyedGenerator(bytes(range(32)))
>>> dl = DiscreteLaplace(epsilon=0.5, sensitivity=1)
>>> x = gen.discrete_laplace(Domain.HIERARCHY, address=0, start=0, count=5, noise=dl)
>>> x.dtype, len(x)
(dtype('int64'), 5)
>>> bool((x == gen.discrete_laplace(Domain.HIERARCHY, 0, 0, 5, dl)).all())   # addressable: same draw again
True
>>> bool((x[2:] == gen.discrete_laplace(Domain.HIERARCHY, 0, 2, 3, dl)).all())  # any sub-range
True
>>> dl.effective_epsilon <= 0.5 < dl.effective_epsilon * (1 + 2**-20)
True
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from fractions import Fraction
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from operators.domains import Domain

__all__ = [
    "KEY_BYTES",
    "DiscreteLaplace",
    "Domain",
    "KeyedGenerator",
    "discrete_laplace_variance",
    "new_key",
    "no_kernel_load",
]

KEY_BYTES = 32
_WORDS_PER_BLOCK = 8  # a ChaCha20 block is 64 bytes
_MAX_BLOCKS = 1 << 32  # 32-bit block counter in the nonce
_U53 = 2.0**-53


def new_key() -> bytes:
    """A fresh 256-bit stream key from the operating system's CSPRNG."""
    return os.urandom(KEY_BYTES)


class DiscreteLaplace:
    """The discrete Laplace of scale ``sensitivity / epsilon`` (``epsilon``-DP for that sensitivity), as the exact
    sampler draws it: scale rounded up to ``2^m / s`` (module docstring).

    >>> DiscreteLaplace(epsilon=1.0, sensitivity=3).scale_fraction
    Fraction(4194304, 1398101)
    """

    __slots__ = ("a", "effective_epsilon", "epsilon", "log2_t", "q", "r", "s", "scale", "scale_fraction", "sensitivity")

    def __init__(self, epsilon: float, sensitivity: float) -> None:
        # the exact rational work once per (epsilon, sensitivity): a pair in the cache was checked when it was made
        # (plain ints and floats only: True == 1 and 1 == 1.0 are equal keys, and a bool must still be refused)
        done = (_DL_PARAMETERS.get((epsilon, sensitivity))
                if type(epsilon) in _PLAIN and type(sensitivity) in _PLAIN else None)
        if done is not None:  # in the order of __slots__
            (self.a, self.effective_epsilon, self.epsilon, self.log2_t, self.q, self.r, self.s, self.scale,
             self.scale_fraction, self.sensitivity) = done
            return
        if not _positive_finite(epsilon) or not _positive_finite(sensitivity):
            msg = "epsilon and sensitivity must be positive finite numbers"
            raise ValueError(msg)
        self._compute(epsilon, sensitivity)
        if len(_DL_PARAMETERS) < _DL_CACHED:
            _DL_PARAMETERS[(epsilon, sensitivity)] = tuple(getattr(self, n) for n in self.__slots__)

    def _compute(self, epsilon: float, sensitivity: float) -> None:
        # the scale sensitivity / epsilon = n / d exactly (floats are dyadic rationals), in integers: the same
        # values as with Fraction, about ten times faster (a stream's end of holdout draws a few of these)
        ns, ds = float(sensitivity).as_integer_ratio()
        ne, de = float(epsilon).as_integer_ratio()
        n, d = ns * de, ds * ne
        if not (n << 10 >= d and n <= d << 36):  # scale in [2^-10, 2^36]
            msg = "discrete Laplace scale sensitivity / epsilon must be in [2^-10, 2^36]"
            raise ValueError(msg)
        k = max(0, n.bit_length() - d.bit_length())  # the least k >= 0 with 2^k >= scale
        while (d << k) < n:
            k += 1
        while k > 0 and (d << (k - 1)) >= n:
            k -= 1
        m = _PRECISION_BITS + k
        s = ((1 << m) * d) // n  # floor(2^m / scale)
        self.epsilon = float(epsilon)
        self.sensitivity = float(sensitivity)
        self.log2_t = m
        self.s = s
        self.q, self.r = divmod(1 << m, s)
        self.scale_fraction = Fraction(1 << m, s)
        self.scale = (1 << m) / s  # correctly rounded, as float(Fraction)
        self.effective_epsilon = (ns * s) / (ds << m)  # float(sensitivity / scale_fraction), correctly rounded
        self.a = math.exp(-s / (1 << m))

    def __repr__(self) -> str:
        return f"DiscreteLaplace(epsilon={self.epsilon!r}, sensitivity={self.sensitivity!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DiscreteLaplace) and (self.log2_t, self.s) == (other.log2_t, other.s)

    def __hash__(self) -> int:
        return hash((self.log2_t, self.s))

    @property
    def variance(self) -> float:
        """``2a / (1 - a)^2`` of the distribution actually sampled (``a = exp(-s / 2^m)``)."""
        return discrete_laplace_variance(self.a)

    def pmf(self, k: np.ndarray | int) -> np.ndarray:
        """``(1 - a) / (1 + a) a^|k|`` of the distribution actually sampled (float, for tests)."""
        k = np.abs(np.asarray(k, dtype=np.float64))
        x = self.s / (1 << self.log2_t)
        return -np.expm1(-x) / (1.0 + math.exp(-x)) * np.exp(-x * k)


def _positive_finite(x: object) -> bool:
    return (
        not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x) and x > 0
    )


def _ceil_log2(x: Fraction) -> int:
    """The least integer ``k`` with ``2^k >= x``, exactly."""
    k = x.numerator.bit_length() - x.denominator.bit_length()
    while Fraction(2) ** k < x:
        k += 1
    while Fraction(2) ** (k - 1) >= x:
        k -= 1
    return k


def discrete_laplace_variance(a: float) -> float:
    """``2a / (1 - a)^2``, the variance of the discrete Laplace with parameter ``a``."""
    return 2.0 * a / (1.0 - a) ** 2


_DL_PARAMETERS: dict[tuple[float, float], tuple] = {}  # (epsilon, sensitivity) -> the slots' values
# every sensitivity a threshold can take (4,296 candidates for B = 5,000) at each of a few budgets: a daemon's streams
# end their holdouts with thetas all over the grid (about 250 bytes an entry: 8 MB at most)
_DL_CACHED = 1 << 15
_PLAIN = (int, float)
_PRECISION_BITS = 20  # t / s carries >= 20 significant bits: effective epsilon >= epsilon (1 - 2^-20)
_MIN_SCALE = Fraction(1, 1 << 10)
_MAX_SCALE = Fraction(1 << 36)  # so that m <= 56 and the long division r << 8 stays below 2^64
_BUDGET_WORDS = 8  # one ChaCha20 block of random bits per sample in the main keystream
_CHUNK = 8  # bits compared at a time in a Bernoulli
_OVERFLOW_DOMAIN = 0xFFFFFFFF
_MAX_V = 1 << 20  # beyond this, Y could overflow int64; probability exp(-2^20)
_U64 = np.uint64


class _Bits:
    """Per-sample random bit sequences read MSB first, each with its own cursor; reading past a sequence's end
    marks the sample as overflowed (its result is discarded and recomputed on a longer sequence)."""

    __slots__ = ("cur", "nbits", "ovf", "stride", "words")

    def __init__(self, words: np.ndarray, per_sample: int) -> None:
        n = words.size // per_sample
        padded = np.zeros((n, per_sample + 1), dtype=np.uint64)
        padded[:, :per_sample] = words.reshape(n, per_sample)
        self.words = padded.reshape(-1)
        self.stride = per_sample + 1
        self.nbits = 64 * per_sample
        self.cur = np.zeros(n, dtype=np.int64)
        self.ovf = np.zeros(n, dtype=bool)

    def take(self, idx: np.ndarray, k: int) -> np.ndarray:
        """The next ``k`` (1..64) bits of each sample in ``idx`` as unsigned integers."""
        c = self.cur[idx]
        end = c + k
        over = end > self.nbits
        if over.any():
            self.ovf[idx[over]] = True
            c = np.where(over, 0, c)
        self.cur[idx] = end
        flat = idx * self.stride + (c >> 6)
        off = (c & 63).astype(np.uint64)
        window = (self.words[flat] << off) | ((self.words[flat + 1] >> _U64(1)) >> (_U64(63) - off))
        return window >> _U64(64 - k)

    def live(self, idx: np.ndarray) -> np.ndarray:
        return ~self.ovf[idx]


def _bernoulli(bits: _Bits, idx: np.ndarray, n, d: int) -> np.ndarray:
    """Bernoulli(n / d) for ``0 <= n < d < 2^56`` (``n`` an array or a scalar), exact: compare ``_CHUNK`` random
    bits at a time with the binary expansion of ``n / d`` (long division) until they differ."""
    res = np.zeros(idx.size, dtype=bool)
    pos = np.arange(idx.size)
    r = np.broadcast_to(np.asarray(n, dtype=np.uint64), idx.shape).copy()
    dd = _U64(d)
    while pos.size:
        rand = bits.take(idx[pos], _CHUNK)
        num = r << _U64(_CHUNK)
        p = num // dd
        r = num - p * dd
        lt = rand < p
        res[pos[lt]] = True
        cont = (rand == p) & bits.live(idx[pos])
        pos, r = pos[cont], r[cont]
    return res


def _bernoulli_exp(bits: _Bits, idx: np.ndarray, u: np.ndarray | None, m: int) -> np.ndarray:
    """Bernoulli(exp(-gamma)), gamma = u / 2^m in [0, 1) (or gamma = 1 when ``u`` is None): CKS Algorithm 1."""
    res = np.zeros(idx.size, dtype=bool)
    pos = np.arange(idx.size)
    k = 1
    if u is None:  # gamma = 1: Bernoulli(1 / 1) always succeeds
        k = 2
    while pos.size:
        sub = idx[pos]
        if u is None:
            a = _bernoulli(bits, sub, 1, k)
        elif k == 1:
            a = _bernoulli(bits, sub, u[pos], 1 << m)
        else:
            a = _bernoulli(bits, sub, 1, k)
            more = np.flatnonzero(a & bits.live(sub))
            if more.size:
                a[more] = _bernoulli(bits, sub[more], u[pos[more]], 1 << m)
        res[pos[~a]] = k % 2 == 1
        pos = pos[a & bits.live(sub)]
        k += 1
    return res


def _geometric(bits: _Bits, idx: np.ndarray, dl: DiscreteLaplace) -> np.ndarray:
    """``Y`` with ``P(Y >= y) = exp(-y s / 2^m)``: ``Y = floor(X / s)`` with ``X`` geometric of parameter
    ``exp(-1 / 2^m)`` (CKS Algorithm 2) when ``s < 2^m``, else the number of successes of
    ``Bernoulli(exp(-s / 2^m))`` before the first failure (cheaper when most samples are 0)."""
    m = dl.log2_t
    if dl.s >= 1 << m:
        return _geometric_slow(bits, idx, dl)
    u_acc = np.zeros(idx.size, dtype=np.uint64)
    pos = np.arange(idx.size)
    while pos.size:
        sub = idx[pos]
        u = bits.take(sub, m)
        live = bits.live(sub)
        pos, u, sub = pos[live], u[live], sub[live]
        d = _bernoulli_exp(bits, sub, u, m)
        ok = d & bits.live(sub)
        u_acc[pos[ok]] = u[ok]
        pos = pos[~d & bits.live(sub)]
    v = np.zeros(idx.size, dtype=np.int64)
    pos = np.flatnonzero(bits.live(idx))
    while pos.size:
        sub = idx[pos]
        b = _bernoulli_exp(bits, sub, None, m) & bits.live(sub)
        v[pos[b]] += 1
        pos = pos[b]
        if pos.size and int(v[pos].max()) > _MAX_V:  # probability exp(-2^20): never, but never wrong either
            msg = "discrete Laplace sample beyond the int64 range"
            raise OverflowError(msg)
    vu = v.astype(np.uint64)
    y = _U64(dl.q) * vu + (u_acc + _U64(dl.r) * vu) // _U64(dl.s)
    return y.astype(np.int64)


def _geometric_slow(bits: _Bits, idx: np.ndarray, dl: DiscreteLaplace) -> np.ndarray:
    """Successes of ``Bernoulli(exp(-x))``, ``x = s / 2^m >= 1``, before the first failure; ``Bernoulli(exp(-x))``
    is ``floor(x)`` successes of ``Bernoulli(exp(-1))`` then ``Bernoulli(exp(-frac(x)))`` (CKS Algorithm 1)."""
    m = dl.log2_t
    whole, frac = divmod(dl.s, 1 << m)
    y = np.zeros(idx.size, dtype=np.int64)
    pos = np.flatnonzero(bits.live(idx))
    while pos.size:
        ok = np.ones(pos.size, dtype=bool)
        for _ in range(whole):
            at = np.flatnonzero(ok)
            if not at.size:
                break
            ok[at] = _bernoulli_exp(bits, idx[pos[at]], None, m)
        at = np.flatnonzero(ok)
        if at.size and frac:
            ok[at] = _bernoulli_exp(bits, idx[pos[at]], np.full(at.size, frac, dtype=np.uint64), m)
        ok &= bits.live(idx[pos])
        y[pos[ok]] += 1
        pos = pos[ok]
        if pos.size and int(y[pos].max()) > _MAX_V:
            msg = "discrete Laplace sample beyond the int64 range"
            raise OverflowError(msg)
    return y


@functools.lru_cache(maxsize=1 << 14, typed=True)
def shared_laplace(epsilon: float, sensitivity: float) -> DiscreteLaplace:
    """``DiscreteLaplace(epsilon, sensitivity)``, one shared instance per pair (never modified): a stream's end of
    holdout asks for a few (typed: ``True`` and ``1`` are different keys, and a refused pair raises, uncached).
    Room for two per candidate of the exact grid at B = 5,000 (the start's noise and the hierarchy's, at each theta:
    with 4,096 pairs, streams ending their holdouts at thousands of thetas kept evicting each other's, 5% of a run
    of 200,000 short holdouts); about 800 bytes a pair."""
    return DiscreteLaplace(epsilon=epsilon, sensitivity=sensitivity)


def _sample(bits: _Bits, n: int, dl: DiscreteLaplace) -> np.ndarray:
    """Discrete Laplace samples (CKS Algorithm 2) for the ``n`` bit sequences of ``bits``; see ``bits.ovf``."""
    out = np.zeros(n, dtype=np.int64)
    pos = np.arange(n)
    while pos.size:
        sign = bits.take(pos, 1)
        y = _geometric(bits, pos, dl)
        live = bits.live(pos)
        reject = (sign == 1) & (y == 0)
        done = live & ~reject
        out[pos[done]] = np.where(sign[done] == 1, -y[done], y[done])
        pos = pos[live & reject]
    return out


# The compiled twin of _sample (operators/_dlap_kernel.py: the same algorithm on the same bits, so the same samples)
# is loaded once a process has made _COMPILE_AFTER draws: numba's import (0.2-0.6 s) would dominate a short command
# such as a replay of a million ticks (about 20 draws), while the numpy version costs about a millisecond per draw,
# too much for the many small draws of a daemon's or an audit's hierarchy walks. TOPS_NOISE_KERNEL=numpy|numba
# forces one of them (tests compare both).
_COMPILE_AFTER = 32
_COMPILE_AT_ONCE = 1 << 16  # one draw this large pays for loading the compiled kernel
_kernel_state: dict[str, object] = {"calls": 0, "sample": None, "chacha": None, "one": None, "run": None}
_COMPILED_RUN_AT_MOST = 1 << 12  # draws up to this size go through one compiled call (keystream and sampler)


_loading_allowed: ContextVar[bool] = ContextVar("tops_kernel_loading_allowed", default=True)


@contextlib.contextmanager
def no_kernel_load() -> Iterator[None]:
    """Draws made in this block never load the compiled kernels (they use them if this process already has): a short
    check, such as the configuration's release probe, takes the numpy path, which gives the same samples, and never
    pays numba's load (or, on a fresh install, its compile). TOPS_NOISE_KERNEL=numba still forces them."""
    token = _loading_allowed.set(False)
    try:
        yield
    finally:
        _loading_allowed.reset(token)


def _kernel(n: int = 0):
    """The compiled sampler once it is worth its load (after a few calls, or at once for a large draw), else None
    (the numpy path: the same samples, bit for bit)."""
    forced = os.environ.get("TOPS_NOISE_KERNEL", "")
    if forced == "numpy":
        return None
    st = _kernel_state
    if st["sample"] is None:
        if forced != "numba" and not _loading_allowed.get():
            return None
        st["calls"] = int(st["calls"]) + 1
        if forced == "numba" or int(st["calls"]) > _COMPILE_AFTER or n >= _COMPILE_AT_ONCE:
            from operators._chacha_kernel import keystream
            from operators._dlap_kernel import sample, sample_one
            from operators._refill_kernel import samples

            st["sample"], st["chacha"], st["one"], st["run"] = sample, keystream, sample_one, samples
    return st["sample"]


def expect_draws(draws: int) -> None:
    """A caller about to make ``draws`` small draws at once (many streams ending their holdout in one step): the
    compiled kernels are loaded now when that many single draws would load them."""
    if draws > _COMPILE_AFTER:
        _kernel(_COMPILE_AT_ONCE)


def compiled_loaded() -> bool:
    """Whether this process uses the compiled kernels (loaded after a few draws, or forced by TOPS_NOISE_KERNEL);
    other modules' compiled twins follow the same choice, so a short command never pays numba's import."""
    if _kernel_state["sample"] is None and os.environ.get("TOPS_NOISE_KERNEL", "") == "numba":
        _kernel()
    return _kernel_state["sample"] is not None  # never loaded while TOPS_NOISE_KERNEL=numpy


def _sample_fast(bits: _Bits, n: int, dl: DiscreteLaplace) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_sample` (and its overflow marks), by the compiled kernel once it is loaded."""
    kernel = _kernel(n)
    if kernel is None:
        return _sample(bits, n, dl), bits.ovf
    out = np.zeros(n, dtype=np.int64)
    ovf = np.zeros(n, dtype=bool)
    if not kernel(bits.words, bits.stride - 1, dl.log2_t, dl.s, dl.q, dl.r, out, ovf):
        msg = "discrete Laplace sample beyond the int64 range"
        raise OverflowError(msg)
    return out, ovf


def _words_to_uniform(words: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1) with 53 random bits, never 0 or 1."""
    return ((words >> np.uint64(11)).astype(np.float64) + 0.5) * _U53


_SAMPLES_PER_CALL = 1 << 16  # bound the memory of one vectorized pass (8 words per sample)


# up to this many blocks the compiled ChaCha20 is faster than OpenSSL's, whose set-up dominates a short call
# (bench/bench_kernel.py compares the two)
_SMALL_BLOCKS = 64


def _keystream(key: bytes, block0: int, domain: int, address: int, nblocks: int) -> bytes:
    """``nblocks`` ChaCha20 blocks from ``block0`` of the keystream of ``(key, domain, address)``."""
    nonce = block0.to_bytes(4, "little") + int(domain).to_bytes(4, "little") + int(address).to_bytes(8, "little")
    return _encryptor(key, nonce).update(bytes(nblocks * 64))


def _public_encryptor(key: bytes, nonce: bytes) -> Any:
    return Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()


def _direct_encryptor() -> Any:
    """OpenSSL's ChaCha20 context made as ``Cipher(...).encryptor()`` makes it, without the checks it repeats each
    call (most of its cost: abstract-class checks of the key, nonce and mode, which our own key and nonce pass
    by construction), or None where this ``cryptography`` does not build it that way: it must give the public path's
    bytes on RFC 8439's keystream vector and on a key of our own, else the public path is used."""
    try:
        from cryptography.hazmat.bindings._rust import openssl as rust_openssl

        create = rust_openssl.ciphers.create_encryption_ctx

        def direct(key: bytes, nonce: bytes) -> Any:
            alg = object.__new__(algorithms.ChaCha20)
            alg.key, alg._nonce = key, nonce  # what ChaCha20.__init__ keeps, after checking what we checked
            return create(alg, None)

        for key, nonce in ((bytes(range(32)), bytes([1, 0, 0, 0, 0, 0, 0, 0x09, 0, 0, 0, 0x4A, 0, 0, 0, 0])),
                           (bytes(32), bytes(16))):
            if direct(key, nonce).update(bytes(192)) != _public_encryptor(key, nonce).update(bytes(192)):
                return None
        return direct
    except Exception:  # another cryptography: its public path
        return None


_encryptor = _direct_encryptor() or _public_encryptor


class KeyedGenerator:
    """ChaCha20 keyed by a 256-bit stream secret; draws are addressed, never sequential state.

    The 16-byte ChaCha20 nonce of the ``cryptography`` package is a 4-byte little-endian block counter followed
    by 12 bytes that we fill with the domain (4 bytes) and the address (8 bytes). Word ``i`` of an address is
    the 64-bit word ``i`` of that keystream; discrete Laplace sample ``i`` owns words ``[8 i, 8 i + 8)``.
    """

    __slots__ = ("_key", "_key_words")

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
            msg = f"a stream key is {KEY_BYTES} bytes"
            raise ValueError(msg)
        self._key = bytes(key)
        self._key_words: np.ndarray | None = None  # the key as 8 little-endian words, for the compiled ChaCha20

    def __repr__(self) -> str:  # never print the key
        return "KeyedGenerator(<secret>)"

    def __reduce__(self):  # a generator must not be pickled into a checkpoint by accident
        msg = "KeyedGenerator holds a secret and is not picklable"
        raise TypeError(msg)

    def words(self, domain: int, address: int, start: int, count: int) -> np.ndarray:
        """The 64-bit words ``[start, start + count)`` of the keystream of ``(domain, address)``."""
        if count <= 0:
            return np.empty(0, dtype=np.uint64)
        if start < 0 or not 0 <= domain < _OVERFLOW_DOMAIN or not 0 <= address < 1 << 64:
            msg = "noise address out of range"
            raise ValueError(msg)
        block0, skip = divmod(start, _WORDS_PER_BLOCK)
        nblocks = -(-(skip + count) // _WORDS_PER_BLOCK)
        if block0 + nblocks > _MAX_BLOCKS:
            msg = "noise address out of range"
            raise ValueError(msg)
        chacha = _kernel_state["chacha"] if nblocks <= _SMALL_BLOCKS else None
        if chacha is not None:  # the same words (operators/_chacha_kernel.py), without OpenSSL's cost per call
            kw = self.key_words()
            # plain ints: numba's dispatcher types an IntEnum (a Domain) slowly, on every call
            out = chacha(kw, block0, int(domain), int(address) & 0xFFFFFFFF, int(address) >> 32,  # type: ignore[operator]
                         nblocks)
            return out[skip : skip + count] if skip or count != len(out) else out
        stream = _keystream(self._key, block0, domain, address, nblocks)
        return np.frombuffer(stream, dtype="<u8")[skip : skip + count].astype(np.uint64, copy=False)

    def uniforms(self, domain: int, address: int, start: int, count: int) -> np.ndarray:
        """Uniform floats in (0, 1) with 53 random bits each (never exactly 0 or 1)."""
        return _words_to_uniform(self.words(domain, address, start, count))

    def discrete_laplace(
        self, domain: int, address: int, start: int, count: int, noise: DiscreteLaplace, *, _budget: int = 0
    ) -> np.ndarray:
        """Samples ``[start, start + count)`` of the exact discrete Laplace ``noise`` at ``(domain, address)``
        (layout and algorithm in the module docstring). ``_budget`` (tests only) shrinks the per-sample budget of
        main-stream words to force the overflow path; the samples are then other draws of the same distribution.
        """
        if not isinstance(noise, DiscreteLaplace):
            msg = "noise must be a DiscreteLaplace(epsilon=..., sensitivity=...)"
            raise TypeError(msg)
        if count <= 0:
            return np.empty(0, dtype=np.int64)
        run = _kernel_state["run"]
        if run is not None and not _budget and count <= _COMPILED_RUN_AT_MOST:
            if (0 <= start and start + count <= _MAX_BLOCKS and 0 <= domain < _OVERFLOW_DOMAIN
                    and 0 <= address < 1 << 63):  # the compiled call takes the address as an int64
                # one compiled call: sample i's keystream block i, the sampler, its overflow keystream if needed
                values, status = run(self.key_words(), int(domain), int(address), int(start), int(count),  # type: ignore[operator]
                                     noise.log2_t, noise.s, noise.q, noise.r)
                if status != 0:
                    msg = "discrete Laplace sample beyond the int64 range"
                    raise OverflowError(msg)
                return values
        per = _budget or _BUDGET_WORDS
        out = np.empty(count, dtype=np.int64)
        for c0 in range(0, count, _SAMPLES_PER_CALL):
            c = min(_SAMPLES_PER_CALL, count - c0)
            words = self.words(domain, address, per * (start + c0), per * c)
            bits = _Bits(words, per)
            part, ovf = _sample_fast(bits, c, noise)
            over = np.flatnonzero(ovf)
            if over.size:
                main = words.reshape(c, per)[over]
                part[over] = self._overflow_samples(domain, address, start + c0 + over, main, noise)
            out[c0 : c0 + c] = part
        return out

    def key_words(self) -> np.ndarray:
        """The key as 8 little-endian 32-bit words (uint64), what the compiled kernels take (secret: a caller passes it
        to a kernel and drops it, never stores or prints it)."""
        kw = self._key_words
        if kw is None:
            kw = self._key_words = np.frombuffer(self._key, dtype="<u4").astype(np.uint64)
        return kw

    def discrete_laplace_one(self, domain: int, address: int, index: int, noise: DiscreteLaplace) -> int:
        """Sample ``index`` of :meth:`discrete_laplace` (the same value): once the compiled kernels are loaded, its
        block of the keystream goes straight to the compiled sampler, without the general path's set-up for many
        samples (a single draw, as the holdout's choice makes); a sample that needs more than
        its 512 bits goes on through the general path."""
        one = _kernel_state["one"]
        if (one is not None and isinstance(noise, DiscreteLaplace) and 0 <= index < _MAX_BLOCKS
                and 0 <= domain < _OVERFLOW_DOMAIN and 0 <= address < 1 << 64):
            kw = self.key_words()
            # sample i owns words [8 i, 8 i + 8): keystream block i (_BUDGET_WORDS = one block)
            value, ok = one(kw, int(index), int(domain), int(address) & 0xFFFFFFFF, int(address) >> 32,  # type: ignore[operator]
                            noise.log2_t, noise.s, noise.q, noise.r)
            if ok:
                return int(value)
        return int(self.discrete_laplace(domain, address, index, 1, noise)[0])

    def _overflow_samples(
        self, domain: int, address: int, index: np.ndarray, main: np.ndarray, noise: DiscreteLaplace
    ) -> np.ndarray:
        """Samples ``index`` recomputed from the start on their main words followed by their own overflow
        keystreams (module docstring), with ever longer sequences until none runs out."""
        k_o = _keystream(self._key, 0, _OVERFLOW_DOMAIN, 0, 1)[:KEY_BYTES]
        k_da = _keystream(k_o, 0, domain, address, 1)[:KEY_BYTES]
        out = np.empty(index.size, dtype=np.int64)
        todo = np.arange(index.size)
        blocks = 8
        while todo.size:
            extra = [
                np.frombuffer(_keystream(k_da, 0, 0, int(i), blocks), dtype="<u8") for i in index[todo].tolist()
            ]
            seq = np.concatenate([main[todo], np.array(extra, dtype=np.uint64)], axis=1)
            bits = _Bits(seq.reshape(-1), seq.shape[1])
            out[todo] = _sample(bits, todo.size, noise)
            todo = todo[bits.ovf]
            blocks *= 4
        return out


class KeyRows:
    """The keys of many streams as rows of a ``(n, 32)`` uint8 array (a columnar store's key column), seen as the list
    of their generators that :func:`discrete_laplace_one_many` and the holdouts' choice take: their compiled paths read
    the rows' words at once, without a :class:`KeyedGenerator` per stream; ``rows[i]`` is stream ``i``'s generator (a
    slice, the keys of a slice). Holds secrets: never printed, never pickled."""

    __slots__ = ("_keys",)

    def __init__(self, keys: np.ndarray) -> None:
        if keys.dtype != np.uint8 or keys.ndim != 2 or keys.shape[1] != KEY_BYTES:
            msg = f"key rows are an (n, {KEY_BYTES}) uint8 array"
            raise ValueError(msg)
        self._keys = keys

    def __repr__(self) -> str:  # never print a key
        return f"KeyRows(n={len(self._keys)}, <secret>)"

    def __reduce__(self):
        msg = "KeyRows holds secrets and is not picklable"
        raise TypeError(msg)

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return KeyRows(self._keys[i])
        return KeyedGenerator(self._keys[i].tobytes())

    def __iter__(self) -> Iterator[KeyedGenerator]:
        return (KeyedGenerator(k.tobytes()) for k in self._keys)

    def key_words(self) -> np.ndarray:
        """Row ``i``: key ``i`` as :meth:`KeyedGenerator.key_words` gives it (secret: for a kernel, then dropped)."""
        return np.ascontiguousarray(self._keys).view("<u4").astype(np.uint64)


def _stacked_key_words(gens: Sequence[KeyedGenerator] | KeyRows) -> np.ndarray:
    """The key words of every generator, a row each (what the compiled many-stream kernels take)."""
    if isinstance(gens, KeyRows):
        return gens.key_words()
    return np.stack([g.key_words() for g in gens])


def discrete_laplace_one_many(gens: Sequence[KeyedGenerator] | KeyRows, domain: int, address: int, index: int,
                              noises: list[DiscreteLaplace], which: np.ndarray | None = None) -> list[int]:
    """``gens[i].discrete_laplace_one(domain, address, index, noises[i])`` for every i, the same values: in one
    compiled call once the kernels are loaded (many streams ending their holdout in one step draw one each); a sample
    whose 512 bits run out goes through the general path, as there. With ``which``, ``noises`` are the distinct
    noises and generator ``i`` draws ``noises[which[i]]`` (many streams share a few)."""
    if not len(gens):
        return []
    if which is None:
        which = np.arange(len(noises))
    elif len(which) != len(gens):
        msg = "one noise for each generator"
        raise ValueError(msg)
    if _kernel_state["one"] is None or not (0 <= index < _MAX_BLOCKS and 0 <= domain < _OVERFLOW_DOMAIN
                                            and 0 <= address < 1 << 64):
        return [g.discrete_laplace_one(domain, address, index, noises[w])
                for g, w in zip(gens, which.tolist(), strict=True)]
    from operators._dlap_kernel import sample_one_many

    keys = _stacked_key_words(gens)
    table = np.array([(dl.log2_t, dl.s, dl.q, dl.r) for dl in noises], dtype=np.int64).reshape(-1, 4)
    params = table[which]
    out, ok = sample_one_many(keys, int(index), int(domain), int(address) & 0xFFFFFFFF, int(address) >> 32,
                              params[:, 0], params[:, 1], params[:, 2], params[:, 3])
    values = out.tolist()
    for i in np.flatnonzero(~ok).tolist():
        values[i] = int(gens[i].discrete_laplace(domain, address, index, 1, noises[int(which[i])])[0])
    return values

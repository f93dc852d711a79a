"""Permute-and-flip, exact: the threshold's selection drawn from random bits with integer arithmetic only.

McKenna and Sheldon, "Permute-and-Flip: A new mechanism for differentially private selection", NeurIPS 2020:
with scores ``q_r`` of sensitivity ``Delta`` and ``q* = max_r q_r``, visit the candidates in a uniformly random order
and accept candidate ``r`` with probability ``exp(eps (q_r - q*) / (2 Delta))``; report the first one accepted (the
best has probability 1, so the walk ends). When every score moves the same way between neighbouring inputs
(monotone, as the holdout's counts make Eq. 6's score and the calibrated choice's), the factor 2 goes:
``exp(eps (q_r - q*) / Delta)``. It is eps-DP and never worse than the exponential mechanism in expected score; its
law is report-noisy-max's with exponential noise (Ding, Kifer, Saghaian, Steinke, Wang, Xiao and Zhang, "The
Permute-and-Flip Mechanism is Identical to Report-Noisy-Max with Exponential Noise", arXiv 2105.07260), which it
replaces here: no ``log`` of a 53-bit uniform, whose float noise is capped near ``36.7 / eps`` and rounded.

**The scores on a grid** (:func:`flip_grid`). A score is a real (theta times a float coefficient, a square root);
the acceptance probability must be exactly what the privacy proof says for the score as computed. The scores are
put on an integer grid and the walk works on integers only::

    Q_r = floor(E q_r)                                  (E an integer, "scale")
    P(accept r) = exp(-(Q* - Q_r) / 2^m)                (m an integer, "shift"; Q* = max_r Q_r)

With exact scores of sensitivity 1, ``E q`` moves by at most ``E`` and so does its floor (``floor(a) - floor(b)``
is an integer in ``(a - b - 1, a - b + 1)``), the same way. The scores are floats: each, as computed, is within 7
units in the last place of a public bound ``S >= |q|`` of the exact function (two or three correctly rounded
operations on the data), and the product ``E q`` adds half of one, so a computed ``E q`` is within
``eta = E S 2^-49`` of the exact one. Between neighbours the ``Q_r`` then move by at most ``E + c`` with
``c = ceil(2 eta)``, and where the exact scores all move up, none moves down by more than ``c`` (this happens: a
test pins neighbours whose quantized scores move by ``E + 1``). Adding ``c`` to every score (which changes nothing:
the mechanism only sees differences) makes them move up by at most ``D = E + 2c``, all in one direction. So the walk
is permute-and-flip at ``eps' = D / 2^m`` for scores of sensitivity ``D``, and the grid is chosen with
``D / 2^m <= eps`` (the budget is never exceeded): ``m`` gives ``eps 2^m`` 20 to 21 significant bits, ``E`` is the
largest integer with ``E + 2 ceil(2 E S 2^-49) <= floor(eps 2^m)``. For the scores here (``S`` far below ``2^27``)
``c = 1`` and the effective budget on the exact scores, ``E / 2^m``, is at least ``eps (1 - 2^-18)``. A
non-monotone score (the percentile's ``-|m_t - k|``) moves by at most ``D`` either way and is called with half the
budget (the factor 2). Scores so large that ``E`` cannot reach 1 (never here) are not trusted at all: every gap is
0, a uniform choice (eps' = 0).

**Exact draws.** ``exp(-x)`` for ``x = g / 2^m`` (``g = Q* - Q_r >= 0``) is Canonne, Kamath and Steinke's ("The
Discrete Gaussian for Differential Privacy", NeurIPS 2020) Algorithm 1, the discrete Laplace sampler's own
(:mod:`operators.noise`, ``_bernoulli_exp``): ``floor(x)`` draws of ``Bernoulli(exp(-1))`` then one of
``Bernoulli(exp(-frac(x)))``, each by comparing random bits 8 at a time with a rational's binary expansion (a gap of
0 is accepted without a draw). The order is a Fisher-Yates shuffle drawn as far as the walk goes: at step ``j`` a
position uniform among the ``n - j`` not visited, its ``k = bit_length(n - j - 1)`` bits read and values past
``n - j - 1`` rejected (no modulo bias).

**Random bits** (:class:`KeyBits`): the words ``0, 1, 2, ...`` of one keystream address, each read most significant
bit first, one sequence for the whole walk (the position, then the candidate's Bernoulli draws, step after step).
The compiled twin (``operators._selection_kernel``) reads the same bits from the same words and reports the same
index (tested); it gets the first words of the keystream and says when they were not enough (the caller gives it
more, then this module's walk, which fetches as it goes).

>>> from functools import partial
>>> from operators.noise import KeyedGenerator
>>> gen = KeyedGenerator(bytes(range(32)))
>>> scores = np.array([0.0, -1.0, -40.0])
>>> k = permute_and_flip(scores, 1.0, 40.0, KeyBits(partial(gen.words, 2, 9)))
>>> k == permute_and_flip(scores, 1.0, 40.0, KeyBits(partial(gen.words, 2, 9)))   # same key, same choice
True
>>> flip_grid(1.0, 100.0)
FlipGrid(scale=1048574, shift=20)
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from operators.noise import KeyedGenerator, compiled_loaded

__all__ = [
    "KERNEL_WORDS",
    "FlipGrid",
    "KeyBits",
    "flip_grid",
    "flip_walk",
    "keyed_permute_and_flip",
    "permute_and_flip",
    "quantized_scores",
]

_SIGNIFICANT_BITS = 20  # eps 2^m in [2^20, 2^21): E carries 20 significant bits
_MAX_SHIFT = 56  # Bernoulli(u / 2^m) by long division in 64-bit words needs 2^m <= 2^56
_ERROR_EXPONENT = -49  # a computed E q is within E S 2^-49 of the exact (7 ulps of S in the score, 1/2 in the product)
_LARGEST = float(2**62)  # quantized scores are kept in [-2^62, 2^62] (gaps in int64)
_WORDS_PER_FETCH = 8  # a ChaCha20 block
_CHUNK = 8  # bits compared at a time in a Bernoulli (operators.noise._CHUNK)
# the words the compiled walk gets: two blocks (nearly always enough where the scores are close for the noise), then
# 32, then 512 (a walk through thousands of candidates far below the best), then the Python walk, which fetches more
KERNEL_WORDS = (16, 256, 4096)


@dataclass(frozen=True)
class FlipGrid:
    """Scores quantized to ``floor(scale q)``; a candidate ``g`` grid steps below the best accepted with probability
    ``exp(-g / 2^shift)`` (module docstring). ``scale = 0``: every candidate alike (uniform)."""

    scale: int
    shift: int

    def sensitivity(self, score_bound: float) -> int:
        """``D = E + 2 ceil(2 E S 2^-49)``: how far (in grid steps, one way) neighbours can move the quantized scores
        of sensitivity-1 scores bounded by ``score_bound``."""
        return self.scale + 2 * math.ceil(math.ldexp(2.0 * self.scale * score_bound, _ERROR_EXPONENT))


@functools.lru_cache(maxsize=1024)
def flip_grid(epsilon: float, score_bound: float) -> FlipGrid:
    """The grid for permute-and-flip at ``epsilon`` (``exp(eps (q_r - q*))``: the caller halves it for scores that
    are not monotone) on scores of sensitivity 1 with ``|q| <= score_bound`` (public): ``D / 2^m <= epsilon``
    (module docstring), the largest scale that keeps it."""
    if not (epsilon > 0.0 and math.isfinite(epsilon)) or not math.isfinite(score_bound):
        msg = "permute-and-flip needs a positive finite epsilon and a finite score bound"
        raise ValueError(msg)
    bound = max(float(score_bound), 1.0)
    shift = min(_MAX_SHIFT, max(0, _SIGNIFICANT_BITS + 1 - math.frexp(epsilon)[1]))
    room = math.floor(math.ldexp(epsilon, shift))  # D may be at most this
    lo, hi = 0, min(room, math.floor(_LARGEST / 2.0 / bound))  # E S <= 2^61: E q, E S and gaps fit in int64
    while lo < hi:  # the largest E whose D fits (D grows with E)
        mid = (lo + hi + 1) // 2
        if FlipGrid(mid, shift).sensitivity(bound) <= room:
            lo = mid
        else:
            hi = mid - 1
    return FlipGrid(lo, shift)


def quantized_scores(scores: np.ndarray, grid: FlipGrid) -> np.ndarray:
    """``floor(E q)`` of every score, as int64 (the compiled twin computes the same: ``E`` is exact as a float and
    the product is one correctly rounded multiplication)."""
    q = np.floor(float(grid.scale) * np.asarray(scores, dtype=np.float64))
    return np.clip(q, -_LARGEST, _LARGEST).astype(np.int64)


class KeyBits:
    """The bits of the words ``0, 1, 2, ...`` of one keystream (``fetch(start, count)``), most significant first,
    fetched a block at a time; the draws of permute-and-flip, exactly as the compiled twin makes them."""

    __slots__ = ("_cur", "_fetch", "_words")

    def __init__(self, fetch: Callable[[int, int], np.ndarray]) -> None:
        self._fetch = fetch
        self._words: list[int] = []
        self._cur = 0

    @property
    def position(self) -> int:
        """How many bits were read."""
        return self._cur

    @property
    def read(self) -> int:
        """How many words were read (the last one in part)."""
        return -(-self._cur // 64)

    def take(self, k: int) -> int:
        """The next ``k`` (1..64) bits as an unsigned integer (``operators._dlap_kernel._take``)."""
        c = self._cur
        self._cur = c + k
        i, off = divmod(c, 64)
        while len(self._words) < i + 2:
            self._words.extend(int(w) for w in self._fetch(len(self._words), _WORDS_PER_FETCH))
        window = (self._words[i] << 64) | self._words[i + 1]
        return (window >> (128 - off - k)) & ((1 << k) - 1)

    def below(self, n: int) -> int:
        """Uniform in ``[0, n)``: ``bit_length(n - 1)`` bits, values past ``n - 1`` rejected (none for ``n = 1``)."""
        if n == 1:
            return 0
        k = (n - 1).bit_length()
        while True:
            v = self.take(k)
            if v < n:
                return v

    def bernoulli(self, num: int, den: int) -> bool:
        """Bernoulli(num / den), ``0 <= num < den <= 2^56``: 8 random bits at a time against the binary expansion
        (``operators.noise._bernoulli``)."""
        r = num
        while True:
            rand = self.take(_CHUNK)
            p, r = divmod(r << _CHUNK, den)
            if rand < p:
                return True
            if rand != p:
                return False

    def bernoulli_exp(self, u: int | None, m: int) -> bool:
        """Bernoulli(exp(-u / 2^m)) for ``u < 2^m``, or Bernoulli(exp(-1)) without ``u``: Canonne, Kamath and
        Steinke, Algorithm 1 (``operators.noise._bernoulli_exp``)."""
        k = 2 if u is None else 1
        while True:
            if u is None:
                a = self.bernoulli(1, k)
            elif k == 1:
                a = self.bernoulli(u, 1 << m)
            else:
                a = self.bernoulli(1, k) and self.bernoulli(u, 1 << m)
            if not a:
                return k % 2 == 1
            k += 1

    def accepts(self, gap: int, shift: int) -> bool:
        """Bernoulli(exp(-gap / 2^shift)): ``floor`` draws of Bernoulli(exp(-1)), then the fraction's (Canonne,
        Kamath and Steinke: exp(-x) = exp(-1)^floor(x) exp(-frac(x))); a gap of 0 without a draw."""
        if gap == 0:
            return True
        whole, frac = gap >> shift, gap & ((1 << shift) - 1)
        for _ in range(whole):
            if not self.bernoulli_exp(None, shift):
                return False
        return not frac or self.bernoulli_exp(frac, shift)


def flip_walk(gaps: Sequence[int] | np.ndarray, shift: int, bits: KeyBits) -> int:
    """Permute-and-flip on integer gaps ``g_r = Q* - Q_r`` (one is 0): visit the candidates in a Fisher-Yates order
    drawn as far as needed and report the first accepted with probability ``exp(-g_r / 2^shift)``."""
    n = len(gaps)
    moved: dict[int, int] = {}  # position -> candidate, where the shuffle moved one
    for j in range(n):
        p = j + bits.below(n - j)
        candidate = moved.get(p, p)
        moved[p] = moved.get(j, j)
        if bits.accepts(int(gaps[candidate]), shift):
            return candidate
    msg = "permute-and-flip needs a candidate with gap 0"
    raise ValueError(msg)


def permute_and_flip(scores: np.ndarray, epsilon: float, score_bound: float, bits: KeyBits) -> int:
    """The index permute-and-flip reports for ``scores`` (sensitivity 1, monotone; halve ``epsilon`` otherwise),
    ``|scores| <= score_bound`` (public), on the grid of :func:`flip_grid`, from ``bits``."""
    grid = flip_grid(epsilon, score_bound)
    q = quantized_scores(scores, grid)
    return flip_walk((q.max() - q).tolist(), grid.shift, bits)


def keyed_permute_and_flip(scores: np.ndarray, epsilon: float, score_bound: float, gen: KeyedGenerator, domain: int,
                           address: int, budgets: tuple[int, ...] = KERNEL_WORDS) -> int:
    """:func:`permute_and_flip` from the words of ``(domain, address)`` of ``gen``'s keystream: compiled while its
    first words (``budgets``) suffice once the process loaded the compiled kernels, else the Python walk; the same
    index either way (tested)."""
    grid = flip_grid(epsilon, score_bound)
    q = quantized_scores(scores, grid)
    gaps = q.max() - q
    walk = _compiled_walk() if budgets and compiled_loaded() else None
    if walk is not None:
        for count in budgets:
            words = gen.words(domain, address, 0, count)
            if not words.flags.writeable:  # as the kernel was compiled for (OpenSSL's words are read-only)
                words = words.copy()
            k = walk(words, gaps, grid.shift)
            if k >= 0:
                return int(k)
    return flip_walk(gaps.tolist(), grid.shift, KeyBits(functools.partial(gen.words, domain, address)))


_WALK: list = []  # the compiled walk, once compiled or loaded


def _compiled_walk():
    """:func:`operators._selection_kernel.gaps_permute_and_flip`, compiled (or loaded) at its first use in a thread of
    its own, as ``operators.selection`` does its holdouts' kernels: numba's first compile leaves reference cycles
    that hold the frames of the stack it was called from (a daemon's processing step and its streams)."""
    if not _WALK:
        from operators._selection_kernel import gaps_permute_and_flip

        def compile_walk() -> None:
            gaps_permute_and_flip(np.zeros(2, dtype=np.uint64), np.zeros(2, dtype=np.int64), 20)

        thread = threading.Thread(target=compile_walk, name="tops-compile")
        thread.start()
        thread.join()
        _WALK.append(gaps_permute_and_flip)
    return _WALK[0]

"""Optimized local hashing (OLH; Finnegan, thesis 2024, section 3.3; Wang et al. 2017) with an exactly
pairwise-independent hash.

Device: draw a hash ``H`` from the family, hash the category into ``[g]``, report ``(H, GRR_g(H(x)))`` with
``p = e^eps / (e^eps + g - 1)`` on the true bucket (GRR on ``[g]`` is what makes it eps-LDP: the ratio of any two
inputs is at most ``p / q = e^eps`` for every ``H``; the thesis's ``p*/q* <= e^eps`` is not the argument, erratum 9).

Hash family (no hash library: its output is pinned by tests, so no library version can change it): with the
Mersenne prime ``P = 2^61 - 1`` and ``a, b`` uniform in ``[0, P)``, ``v = (a x + b) mod P`` is uniform and pairwise
independent over categories, and ``H(x) = floor(floor(v / 2^29) g / 2^32)``. Every bucket has ``2^61 / g`` values of
``v`` up to ``2^29``, so ``Pr[H(x) = H(y)] = 1/g`` up to ``g 2^-64`` for **every** pair ``x != y``: the support
probability of a non-holder is ``q* = 1/g`` whatever the data, and the estimator is unbiased even on heavy-tailed
data (a family of a few shared hashes, the "fast" variant of some libraries, is biased there: cells that collide
with a heavy hitter under most of the family inherit its count).

``g``: the variance ``Var*/n = (e^eps + g - 1)^2 / ((e^eps - 1)^2 (g - 1))`` is minimal at the real ``g = e^eps + 1``
(where it equals OUE's ``4 e^eps / (e^eps - 1)^2``); the integer used is ``g = round(e^eps) + 1``. With
``p* = p``, ``q* = 1/g`` (Theorem 2) the f-term coefficient is ``(1 - p - 1/g) / (p - 1/g)`` (``+1`` at the
real optimum).

Server, exact decoding: ``C_x`` = reports whose hash maps ``x`` to the reported bucket, for every report and every
category (``O(n d)``, compiled, 8 reports per vector of lanes, 2 threads).

>>> from operators.noise import KeyedGenerator
>>> gen = KeyedGenerator(bytes(32))
>>> olh_g(1.0), round(olh_g_optimal(1.0), 4)
(4, 3.7183)
>>> x = np.repeat(np.arange(5), [600, 300, 100, 0, 0])
>>> a, b = olh_seeds(gen.words(5, 4, 0, 4 * x.size))
>>> r = olh_perturb(x, 4, 1.0, a, b, gen.uniforms(5, 4, 1 << 30, 2 * x.size))
>>> support = olh_support(a, b, r, 4, 5)
>>> est = olh_estimate(support, x.size, 4, 1.0)
>>> est.shape, bool(abs(est[0] - 600) < 5 * olh_variance(x.size, 4, 1.0, 600) ** 0.5)
((5,), True)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from operators.categorical._common import (
    as_categories,
    check_domain,
    check_epsilon,
    pure_estimate,
    pure_variance,
    uniform_index,
)
from operators.categorical._kernels import OLH_PRIME

__all__ = [
    "OLH_PRIME",
    "olh_estimate",
    "olh_g",
    "olh_g_optimal",
    "olh_hash",
    "olh_parameters",
    "olh_perturb",
    "olh_seeds",
    "olh_support",
    "olh_variance",
]

_U = np.uint64
_P = _U(OLH_PRIME)
_M29 = _U((1 << 29) - 1)


def olh_g_optimal(epsilon: float) -> float:
    """The real ``g = e^eps + 1`` that minimises OLH's variance."""
    return math.exp(check_epsilon(epsilon)) + 1.0


def olh_g(epsilon: float) -> int:
    """The integer hash range used: ``round(e^eps) + 1``."""
    return round(math.exp(check_epsilon(epsilon))) + 1


def olh_parameters(epsilon: float, g: int) -> tuple[float, float]:
    """``(p*, q*) = (e^eps / (e^eps + g - 1), 1 / g)``."""
    eps = check_epsilon(epsilon)
    g = check_domain(g)
    return math.exp(eps) / (math.exp(eps) + g - 1), 1.0 / g


def olh_seeds(words: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)`` uniform in ``[0, P)`` from four 64-bit words per device: the top 61 bits of words 0 and 1, or of
    words 2 and 3 when those equal ``P`` (probability ``2^-61``; both equal ``P`` with probability ``2^-122``, then
    ``P - 1``)."""
    w = np.asarray(words, dtype=np.uint64).reshape(-1, 4) >> _U(3)
    a = np.where(w[:, 0] == _P, w[:, 2], w[:, 0])
    b = np.where(w[:, 1] == _P, w[:, 3], w[:, 1])
    return np.minimum(a, _P - _U(1)), np.minimum(b, _P - _U(1))


def _mulmod(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``a x mod P`` for ``a < P``, ``x < 2^32``, with 64-bit words only (``2^61 = 1 mod P``)."""
    a_hi, a_lo = a >> _U(32), a & _U(0xFFFFFFFF)
    s = a_hi * x  # < 2^61: (s 2^32) mod P = (s mod 2^29) 2^32 + s >> 29
    t = ((s & _M29) << _U(32)) + (s >> _U(29))
    lo = a_lo * x  # < 2^64
    t = t + (lo & _P) + (lo >> _U(61))  # < 2^63
    t = (t & _P) + (t >> _U(61))
    return np.where(t >= _P, t - _P, t)


def olh_hash(a: Any, b: Any, values: Any, g: int) -> np.ndarray:
    """``H(x) = floor(floor(((a x + b) mod P) / 2^29) g / 2^32)`` in ``[0, g)`` (int64), elementwise."""
    a = np.asarray(a, dtype=np.uint64)
    b = np.asarray(b, dtype=np.uint64)
    x = np.asarray(values, dtype=np.int64).astype(np.uint64)
    v = _mulmod(a, x) + b
    v = np.where(v >= _P, v - _P, v)
    return ((v >> _U(29)) * _U(g) >> _U(32)).astype(np.int64)


def olh_perturb(values: Any, g: int, epsilon: float, a: Any, b: Any, u: Any) -> np.ndarray:
    """Reports ``GRR_g(H(x))`` (int64 in ``[0, g)``) from two uniforms per value (``u[0::2]`` truth, ``u[1::2]``
    which other bucket)."""
    p, _ = olh_parameters(epsilon, g)
    x = as_categories(values, MAX_HASH_INPUT)
    h = olh_hash(a, b, x, g)
    us = np.asarray(u, dtype=np.float64).reshape(-1)
    if us.size != 2 * x.size:
        msg = "olh_perturb needs two uniforms per value"
        raise ValueError(msg)
    other = uniform_index(us[1::2], g - 1)
    other += other >= h
    return np.where(us[0::2] < p, h, other)


MAX_HASH_INPUT = 1 << 31


def olh_support(a: Any, b: Any, reports: Any, g: int, d: int, *, threads: int = 2) -> np.ndarray:
    """Exact decoding: ``C_x`` for every category ``x < d`` over all reports (int64)."""
    d = check_domain(d, low=1)
    from operators.categorical._kernels import olh_support as kernel

    a = np.ascontiguousarray(a, dtype=np.uint64)
    b = np.ascontiguousarray(b, dtype=np.uint64)
    r = np.ascontiguousarray(reports, dtype=np.int64).astype(np.uint64)
    if not a.size == b.size == r.size:
        msg = "olh_support needs one (a, b) per report"
        raise ValueError(msg)
    return kernel(a, b, r, int(g), d, max(1, int(threads)))


def olh_estimate(support: Any, n: int, g: int, epsilon: float) -> np.ndarray:
    """Unbiased counts ``(C_x - n / g) / (p - 1 / g)``."""
    p, q = olh_parameters(epsilon, g)
    return pure_estimate(support, n, p, q)


def olh_variance(n: int, g: int, epsilon: float, counts: Any = 0.0) -> Any:
    """Theorem 2 with ``p* = e^eps / (e^eps + g - 1)``, ``q* = 1 / g``; its f-free part is
    ``n (e^eps + g - 1)^2 / ((e^eps - 1)^2 (g - 1))``."""
    p, q = olh_parameters(epsilon, g)
    return pure_variance(n, p, q, counts)

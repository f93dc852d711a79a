"""OLH over a prime field with exact decoding by a Fourier transform: OLH's accuracy on 9.8 M-cell domains.

Hash family: ``g`` prime, a category ``x`` written as its ``k`` base-``g`` digits ``x_vec`` (``g^k >= d``), and
``H_a(x) = <a, x_vec> mod g`` with ``a`` uniform in ``Z_g^k``. For ``x != y`` the difference ``x_vec - y_vec`` is a
nonzero vector, so ``<a, x_vec - y_vec>`` is uniform on ``Z_g`` and ``Pr[H(x) = H(y)] = 1/g`` **exactly**: the
protocol is pure with ``p* = e^eps / (e^eps + g - 1)``, ``q* = 1/g`` (the OLH variance of :mod:`olh`, Theorem 2).
A report is ``(a, GRR_g(H_a(x)))``: GRR on ``[g]`` for every ``a``, so eps-LDP.

Decoding (exact counts, like OLH's ``O(n d)`` brute force, in ``O(n g k + g^k k log g)``)::

    C_y = sum_u 1{<a_u, y_vec> = r_u} = (1/g) sum_u sum_{t < g} w^(t (<a_u, y_vec> - r_u)),   w = exp(2 pi i / g)
        = (1/g) sum_{z in Z_g^k} F(z) w^<z, y_vec>,   F(z) = sum_u sum_t 1{t a_u = z} w^(-t r_u)

i.e. one ``k``-dimensional DFT of size ``g^k`` of ``F``, which is built by one scatter per (report, t). The counts
are integers; the transform's rounding error is far below 1/2 and they are rounded.

``g``: the prime minimising the variance among those whose ``g^k`` fits in ``max_cells`` (the transform's memory is
16 bytes per cell); at the 9.8 M cells of the origin-destination domain and eps = 5 it is ``g = 223`` (``k = 3``,
11.1 M cells), 4% above OUE's variance; at eps = 1, ``g = 3`` (``k = 15``), 2% above.

>>> from operators.noise import KeyedGenerator
>>> gen = KeyedGenerator(bytes(32))
>>> g, k = fourier_g(2.0, 100)
>>> g, k
(7, 3)
>>> x = np.repeat(np.arange(100), 10)
>>> a = fourier_seeds(gen.uniforms(5, 5, 0, k * x.size), g, k)
>>> r = fourier_perturb(x, g, 2.0, a, gen.uniforms(5, 5, 1 << 30, 2 * x.size))
>>> c = fourier_support(a, r, g, 100)
>>> bool((c == fourier_support_brute(a, r, g, 100)).all())
True
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

__all__ = [
    "DEFAULT_MAX_CELLS",
    "fourier_estimate",
    "fourier_g",
    "fourier_hash",
    "fourier_perturb",
    "fourier_seeds",
    "fourier_support",
    "fourier_support_brute",
    "fourier_variance",
]

DEFAULT_MAX_CELLS = 1 << 25  # 512 MiB of complex128 for the transform


def _primes_upto(m: int) -> list[int]:
    sieve = bytearray([1]) * (m + 1)
    sieve[:2] = b"\x00\x00"
    for i in range(2, int(m**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(sieve[i * i :: i]))
    return [i for i in range(m + 1) if sieve[i]]


def _digits_needed(g: int, d: int) -> int:
    k, cells = 1, g
    while cells < d:
        cells *= g
        k += 1
    return k


def _olh_var_per_user(e: float, g: int) -> float:
    return (e + g - 1) ** 2 / ((e - 1) ** 2 * (g - 1))


def fourier_g(epsilon: float, d: int, max_cells: int = DEFAULT_MAX_CELLS) -> tuple[int, int]:
    """``(g, k)``: the prime ``g`` of least OLH variance with ``d <= g^k <= max(max_cells, g)``."""
    eps = check_epsilon(epsilon)
    d = check_domain(d)
    e = math.exp(eps)
    best: tuple[float, int, int, int] | None = None
    for g in _primes_upto(max(3, min(1 << 16, int(4 * e) + 8))):
        k = _digits_needed(g, d)
        cells = g**k
        if cells > max(max_cells, g):
            continue
        key = (_olh_var_per_user(e, g), cells, g, k)
        if best is None or key < best:
            best = key
    if best is None:
        msg = "no prime hash range fits the transform's memory (raise max_cells)"
        raise ValueError(msg)
    return best[2], best[3]


def fourier_seeds(u: Any, g: int, k: int) -> np.ndarray:
    """``a`` for each device: ``k`` digits uniform in ``[0, g)`` from ``k`` uniforms each (shape ``(n, k)``)."""
    us = np.asarray(u, dtype=np.float64).reshape(-1, k)
    return uniform_index(us, g)


def _digits(values: np.ndarray, g: int, k: int) -> np.ndarray:
    out = np.empty((values.size, k), dtype=np.int64)
    v = values.copy()
    for i in range(k):
        v, out[:, i] = np.divmod(v, g)
    return out


def fourier_hash(a: Any, values: Any, g: int) -> np.ndarray:
    """``<a_u, digits(x_u)> mod g`` for each device ``u`` (``a`` of shape ``(n, k)``)."""
    a = np.asarray(a, dtype=np.int64)
    x = np.asarray(values, dtype=np.int64).reshape(-1)
    return (a * _digits(x, g, a.shape[1])).sum(axis=1) % g


def fourier_perturb(values: Any, g: int, epsilon: float, a: Any, u: Any) -> np.ndarray:
    """Reports ``GRR_g(H_a(x))`` from two uniforms per value (``u[0::2]`` truth, ``u[1::2]`` which other)."""
    eps = check_epsilon(epsilon)
    a = np.asarray(a, dtype=np.int64)
    x = as_categories(values, g ** a.shape[1])
    h = fourier_hash(a, x, g)
    p = math.exp(eps) / (math.exp(eps) + g - 1)
    us = np.asarray(u, dtype=np.float64).reshape(-1)
    if us.size != 2 * x.size:
        msg = "fourier_perturb needs two uniforms per value"
        raise ValueError(msg)
    other = uniform_index(us[1::2], g - 1)
    other += other >= h
    return np.where(us[0::2] < p, h, other)


def fourier_support(a: Any, reports: Any, g: int, d: int) -> np.ndarray:
    """Exact decoding by the transform: ``C_y`` for every ``y < d`` (int64)."""
    from operators.categorical._kernels import fourier_scatter

    a = np.ascontiguousarray(a, dtype=np.int64)
    r = np.ascontiguousarray(reports, dtype=np.int64).reshape(-1)
    k = a.shape[1]
    d = check_domain(d, low=1)
    if g**k < d or a.shape[0] != r.size:
        msg = "fourier_support needs g^k >= d and one a per report"
        raise ValueError(msg)
    field = np.zeros(g**k, dtype=np.complex128)
    roots = np.exp(-2j * np.pi * np.arange(g) / g)
    fourier_scatter(a, r, g, field, roots)
    # C_y = (1/g) sum_z F(z) w^<z, y> = g^(k-1) ifftn(F)(y); flat index sum_i z_i g^i: digit i is axis k-1-i
    cube = field.reshape((g,) * k)
    out = np.fft.ifftn(cube, out=cube)
    c = out.reshape(-1)[:d].real * float(g ** (k - 1))
    return np.rint(c).astype(np.int64)


def fourier_support_brute(a: Any, reports: Any, g: int, d: int) -> np.ndarray:
    """``C_y`` by hashing every category for every report (``O(n d)``; the oracle of the tests)."""
    a = np.asarray(a, dtype=np.int64)
    r = np.asarray(reports, dtype=np.int64)
    y = _digits(np.arange(d, dtype=np.int64), g, a.shape[1])  # (d, k)
    return ((a @ y.T) % g == r[:, None]).sum(axis=0).astype(np.int64)


def fourier_estimate(support: Any, n: int, g: int, epsilon: float) -> np.ndarray:
    """Unbiased counts ``(C_y - n / g) / (p - 1 / g)``."""
    eps = check_epsilon(epsilon)
    return pure_estimate(support, n, math.exp(eps) / (math.exp(eps) + g - 1), 1.0 / g)


def fourier_variance(n: int, g: int, epsilon: float, counts: Any = 0.0) -> Any:
    """Theorem 2 with ``p* = e^eps / (e^eps + g - 1)``, ``q* = 1 / g`` (the OLH variance at this ``g``)."""
    eps = check_epsilon(epsilon)
    return pure_variance(n, math.exp(eps) / (math.exp(eps) + g - 1), 1.0 / g, counts)

"""Unary encoding: optimized (OUE) and symmetric (SUE, basic RAPPOR) (Finnegan, thesis 2024, section 3.2; Wang et al.
2017).

Device: one-hot ``B`` of the category, every bit reported independently: a 1 stays 1 with probability ``p``, a 0
becomes 1 with probability ``q``; ``p (1 - q) / (q (1 - p)) = e^eps`` (the only pair of inputs that differ are two
bits, one each way). OUE: ``p = 1/2, q = 1/(e^eps + 1)``; SUE: ``p = e^(eps/2)/(e^(eps/2) + 1)``, ``q = 1 - p``.
Server: ``C_y`` = reports with bit ``y`` set, ``p* = p``, ``q* = q``:

    OUE  Var*/n = 4 e^eps / (e^eps - 1)^2,     f-term coefficient +1
    SUE  Var*/n = e^(eps/2) / (e^(eps/2) - 1)^2,   f-term coefficient 0

A report is ``d`` bits (sent sparsely: the indices of its ones, about ``1/2 + d q`` of them); the server tally is
``O(sum of report sizes)``. :func:`unary_simulate_support` draws the column sums of ``n`` simulated reports directly
(binomials; exactly their distribution, since the estimator only reads the column sums), for experiments only.

>>> from operators.noise import KeyedGenerator
>>> p, q = unary_parameters(1.0, "oue")
>>> p, round(q, 6), round(p * (1 - q) / (q * (1 - p)), 6)
(0.5, 0.268941, 2.718282)
>>> ones = unary_perturb(3, 10, 1.0, KeyedGenerator(bytes(32)).uniforms(5, 2, 0, 10), "oue")
>>> ones.dtype, bool(((ones >= 0) & (ones < 10)).all())
(dtype('int64'), True)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from operators.categorical._common import check_domain, check_epsilon, pure_estimate, pure_variance

__all__ = [
    "UNARY_KINDS",
    "unary_estimate",
    "unary_parameters",
    "unary_perturb",
    "unary_perturb_many",
    "unary_simulate_support",
    "unary_variance",
]

UNARY_KINDS = ("oue", "sue")


def unary_parameters(epsilon: float, kind: str = "oue") -> tuple[float, float]:
    """``(p, q)``: the probability that a 1 stays 1 and that a 0 becomes 1."""
    eps = check_epsilon(epsilon)
    if kind == "oue":
        return 0.5, 1.0 / (math.exp(eps) + 1.0)
    if kind == "sue":
        h = math.exp(eps / 2)
        return h / (h + 1.0), 1.0 / (h + 1.0)
    msg = f"unary kind must be one of {', '.join(UNARY_KINDS)} (got {kind!r})"
    raise ValueError(msg)


def unary_perturb(value: int, d: int, epsilon: float, u: Any, kind: str = "oue") -> np.ndarray:
    """One device's report as the sorted indices of its ones, from ``d`` uniforms (one per bit)."""
    d = check_domain(d)
    p, q = unary_parameters(epsilon, kind)
    us = np.asarray(u, dtype=np.float64).reshape(-1)
    if us.size != d:
        msg = "unary_perturb needs one uniform per category"
        raise ValueError(msg)
    if isinstance(value, bool) or not 0 <= int(value) < d:
        msg = f"category must be in [0, {d})"
        raise ValueError(msg)
    thresholds = np.full(d, q)
    thresholds[int(value)] = p
    return np.flatnonzero(us < thresholds).astype(np.int64)


def unary_perturb_many(values: Any, d: int, epsilon: float, u: Any, kind: str = "oue") -> np.ndarray:
    """Dense reports (``n x d`` booleans) of many devices from ``n d`` uniforms; for tests and small domains."""
    p, q = unary_parameters(epsilon, kind)
    x = np.asarray(values, dtype=np.int64).reshape(-1)
    us = np.asarray(u, dtype=np.float64).reshape(x.size, d)
    thresholds = np.full((x.size, d), q)
    thresholds[np.arange(x.size), x] = p
    return us < thresholds


def unary_simulate_support(counts: Any, epsilon: float, rng: np.random.Generator, kind: str = "oue") -> np.ndarray:
    """Column sums of the reports of ``counts[y]`` devices holding each ``y``: ``Bin(c_y, p) + Bin(n - c_y, q)``.

    Simulation only (a seeded ``numpy`` generator, not the keyed one): nothing it draws protects anyone."""
    p, q = unary_parameters(epsilon, kind)
    c = np.asarray(counts, dtype=np.int64)
    n = int(c.sum())
    return rng.binomial(c, p) + rng.binomial(n - c, q)


def unary_estimate(support: Any, n: int, epsilon: float, kind: str = "oue") -> np.ndarray:
    """Unbiased counts ``(C_y - n q) / (p - q)``."""
    p, q = unary_parameters(epsilon, kind)
    return pure_estimate(support, n, p, q)


def unary_variance(n: int, epsilon: float, kind: str = "oue", counts: Any = 0.0) -> Any:
    """Theorem 2 with the unary ``p``, ``q``."""
    p, q = unary_parameters(epsilon, kind)
    return pure_variance(n, p, q, counts)

"""Shared parts of the frequency oracles: checks, the pure-protocol estimator and its variance (Finnegan, thesis 2024,
Thm 1-2).

A *pure* protocol (Wang, Blocki, Li, Jha 2017) has a support set per report such that a user holding ``y`` supports
``y`` with probability ``p*`` and a user holding any other value supports ``y`` with probability ``q*``. With
``C_y`` the number of reports that support ``y`` among ``n``, the count estimate (Theorem 1, in counts)::

    c_hat_y = (C_y - n q*) / (p* - q*)                                   (unbiased)

    Var[c_hat_y] = n q*(1 - q*) / (p* - q*)^2 + c_y (1 - p* - q*) / (p* - q*)     (Theorem 2, counts)

(the thesis labels the left side ``Var[q(D~, y)]``; it is the variance of the count estimate, erratum 1).

Randomizers take explicit uniforms in (0, 1) drawn by the caller from :class:`operators.noise.KeyedGenerator`
(53 random bits each). A probability ``t`` is realised as ``u < t``: exact up to ``2^-53``; a uniform choice among
``k`` values as ``floor(u k)``: each value has probability ``1/k`` up to a relative ``k 2^-53``. A randomizer's
likelihood ratio is therefore ``e^epsilon`` up to a factor ``1 + 2 k 2^-53`` (``1 + 2.2e-9`` for the 9.8 M cells of
an origin-destination domain); ``operators.local._units`` makes the same argument for its report grid.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from operators.noise import Domain

__all__ = [
    "MAX_DOMAIN",
    "as_categories",
    "categorical_domain",
    "check_domain",
    "check_epsilon",
    "pure_estimate",
    "pure_variance",
    "uniform_index",
]

MAX_DOMAIN = 1 << 31  # categories are int64 indices below this (the OLH hash works on 31-bit inputs)

# Domain.CATEGORICAL purposes: one keystream per consumer (the address is the tick, or the user for a device)
PURPOSES = {
    "grr": 1,
    "oue": 2,
    "sue": 3,
    "olh": 4,
    "olh-fourier": 5,
    "hm": 6,
    "hr": 7,
    "laplace": 8,
    "stability": 9,
    "simulate": 10,
    "counter": 11,  # the key of a category's ToPS counter (operators/categorical/release.py)
}


def categorical_domain(purpose: str) -> int:
    """The 32-bit noise domain of a categorical consumer (``(Domain.CATEGORICAL << 16) | code``)."""
    return (int(Domain.CATEGORICAL) << 16) | PURPOSES[purpose]


def check_epsilon(epsilon: Any, name: str = "epsilon") -> float:
    """``epsilon`` as a float, or ValueError unless it is a real number in (0, 30]."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not 0 < epsilon <= 30:
        msg = f"{name} must be a positive number at most 30 (got {epsilon!r})"
        raise ValueError(msg)
    return float(epsilon)


def check_domain(d: Any, low: int = 2) -> int:
    """The number of categories as an int in ``[low, 2^31)``, or ValueError."""
    if isinstance(d, bool) or not isinstance(d, numbers.Integral) or not low <= d < MAX_DOMAIN:
        msg = f"the number of categories must be an integer in [{low}, 2^31) (got {d!r})"
        raise ValueError(msg)
    return int(d)


def as_categories(values: Any, d: int) -> np.ndarray:
    """A 1-D int64 array of category indices, each in ``[0, d)``, or ValueError (the message holds no value)."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "iu":
        if arr.size == 0:
            return np.empty(0, dtype=np.int64)
        msg = "categories must be integers"
        raise ValueError(msg)
    arr = np.ascontiguousarray(arr.reshape(-1).astype(np.int64, copy=False))
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= d):
        msg = f"categories must be in [0, {d})"
        raise ValueError(msg)
    return arr


def uniform_index(u: np.ndarray, k: int | np.ndarray) -> np.ndarray:
    """``floor(u k)`` as int64 for uniforms in (0, 1): a uniform index in ``[0, k)`` (module docstring)."""
    return np.minimum(np.floor(u * k).astype(np.int64), np.asarray(k, dtype=np.int64) - 1)


def pure_estimate(support: np.ndarray, n: int, p_star: float, q_star: float) -> np.ndarray:
    """Theorem 1 in counts: ``(C_y - n q*) / (p* - q*)`` for every category (float64)."""
    return (np.asarray(support, dtype=np.float64) - n * q_star) / (p_star - q_star)


def pure_variance(n: int, p_star: float, q_star: float, counts: Any = 0.0) -> Any:
    """Theorem 2 in counts: ``n q*(1-q*)/(p*-q*)^2 + c (1-p*-q*)/(p*-q*)`` (``counts`` scalar or array)."""
    gap = p_star - q_star
    return n * q_star * (1.0 - q_star) / gap**2 + np.asarray(counts, dtype=np.float64) * (1.0 - p_star - q_star) / gap

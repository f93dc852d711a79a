"""Generalised randomized response (GRR, "direct encoding"; Finnegan, thesis 2024, section 3.1; Warner 1965).

Device: report the true category with probability ``p = e^eps / (e^eps + d - 1)``, else one of the ``d - 1`` others
uniformly (each with ``q = 1 / (e^eps + d - 1)``), so ``p / q = e^eps``. Server: ``C_y`` = reports equal to ``y``;
``p* = p``, ``q* = q`` (pure protocol), so ``c_hat = (C - n q) / (p - q)`` and
``Var*/n = (d - 2 + e^eps) / (e^eps - 1)^2``, f-term ``(d - 2) / (e^eps - 1)`` (Finnegan, table 12.1). The estimates
sum to ``n`` exactly (``1 - d q = p - q``); they can be negative or above ``n`` (the thesis's "[0, 1]" claim is
false, erratum 7).

>>> from operators.noise import KeyedGenerator
>>> gen = KeyedGenerator(bytes(32))
>>> x = np.repeat(np.arange(4), [700, 200, 100, 0])
>>> y = grr_perturb(x, 4, 2.0, gen.uniforms(5, 0, 0, 2 * x.size))
>>> est = grr_estimate(np.bincount(y, minlength=4), x.size, 4, 2.0)
>>> round(float(est.sum()), 6)
1000.0
>>> grr_parameters(1.0, 1085)
(0.0025013..., 0.0009202...)
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

__all__ = ["grr_estimate", "grr_parameters", "grr_perturb", "grr_variance"]


def grr_parameters(epsilon: float, d: int) -> tuple[float, float]:
    """``(p, q) = (e^eps, 1) / (e^eps + d - 1)``: the probability of the true value and of each other value."""
    eps = check_epsilon(epsilon)
    d = check_domain(d)
    z = math.exp(eps) + d - 1
    return math.exp(eps) / z, 1.0 / z


def grr_perturb(values: Any, d: int, epsilon: float, u: Any) -> np.ndarray:
    """GRR reports of ``values`` (categories in ``[0, d)``) from two uniforms per value: ``u[0::2]`` decides
    whether to tell the truth, ``u[1::2]`` picks one of the other ``d - 1`` categories."""
    p, _ = grr_parameters(epsilon, d)
    x = as_categories(values, d)
    us = np.asarray(u, dtype=np.float64).reshape(-1)
    if us.size != 2 * x.size:
        msg = "grr_perturb needs two uniforms per value"
        raise ValueError(msg)
    other = uniform_index(us[1::2], d - 1)
    other += other >= x  # skip the true value: uniform over the d - 1 others
    return np.where(us[0::2] < p, x, other)


def grr_estimate(support: Any, n: int, d: int, epsilon: float) -> np.ndarray:
    """Unbiased counts ``(C_y - n q) / (p - q)`` from the histogram ``support`` of the ``n`` reports."""
    p, q = grr_parameters(epsilon, d)
    return pure_estimate(support, n, p, q)


def grr_variance(n: int, d: int, epsilon: float, counts: Any = 0.0) -> Any:
    """``Var[c_hat_y] = n (d - 2 + e^eps) / (e^eps - 1)^2 + c_y (d - 2) / (e^eps - 1)`` (Theorem 2)."""
    p, q = grr_parameters(epsilon, d)
    return pure_variance(n, p, q, counts)

"""Stochastic Rounding (SR; Duchi et al.), eps-LDP mean estimation on [-1, 1] (Wang et al., CCS 2021, Appendix E.2).

A unit-scale input ``x`` in ``[-1, 1]`` is rounded to +-1 with ``P(+1) = 1/2 + x/2`` and the bit goes through
binary randomized response with ``p = e^eps / (e^eps + 1)``. Folding both steps together::

    P(y = +s) = 1/2 + x/2 * (e^eps - 1)/(e^eps + 1),   P(y = -s) = 1 - P(y = +s),   s = (e^eps + 1)/(e^eps - 1)

so ``y`` is unbiased for ``x`` (``E[y] = x``) with ``Var[y] = s^2 - x^2`` (Appendix E.2). The likelihood ratio of
an output for the inputs -1 and +1 is ``(1 + z)/(1 - z) = e^eps`` with ``z = (e^eps - 1)/(e^eps + 1)``.

One uniform ``u`` in (0, 1) decides a report: ``y = +s`` iff ``u < P(y = +s)``.

Examples
--------
>>> from operators.noise import Domain, KeyedGenerator
>>> u = KeyedGenerator(bytes(32)).uniforms(Domain.LOCAL, 0, 0, 4)
>>> y = stochastic_rounding_perturb([-1.0, 0.0, 0.5, 1.0], 1.0, u)
>>> bool(np.all(np.abs(y) == stochastic_rounding_scale(1.0)))
True
>>> round(stochastic_rounding_scale(1.0), 4), round(float(stochastic_rounding_variance(0.0, 1.0)), 4)
(2.164, 4.6827)
>>> r = stochastic_rounding_report([0.0, 3.0, 10.0, 99.0], 10.0, 1.0, u)   # readings truncated to [0, 10]
>>> sorted({round(float(v), 3) for v in r} - {-5.82, 15.82})
[]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from operators.local._units import as_float_array, check_epsilon, from_signed_unit, to_signed_unit

__all__ = [
    "sr_unit",
    "stochastic_rounding_perturb",
    "stochastic_rounding_report",
    "stochastic_rounding_scale",
    "stochastic_rounding_variance",
]


def stochastic_rounding_scale(epsilon: float) -> float:
    """``s = (e^eps + 1) / (e^eps - 1)``: SR reports are ``+s`` or ``-s`` on the unit scale."""
    eps = check_epsilon(epsilon)
    return (math.exp(eps) + 1.0) / math.expm1(eps)


def stochastic_rounding_variance(x: Any, epsilon: float) -> np.ndarray | float:
    """``Var[y] = s^2 - x^2`` for a unit-scale input ``x`` (Appendix E.2); maximal (``s^2``) at ``x = 0``."""
    s = stochastic_rounding_scale(epsilon)
    out = s * s - np.square(np.asarray(x, dtype=np.float64))
    return float(out) if np.ndim(out) == 0 else out


def sr_unit(x: np.ndarray, u: np.ndarray, slope: float, scale: float) -> np.ndarray:
    """SR reports for unit-scale inputs (clipped to ``[-1, 1]``): ``+scale`` iff ``u < 1/2 + slope x / 2``."""
    return np.where(u < 0.5 + 0.5 * slope * np.clip(x, -1.0, 1.0), scale, -scale)


def stochastic_rounding_perturb(x: Any, epsilon: float, u: Any) -> np.ndarray:
    """SR on the unit scale: ``x`` in ``[-1, 1]`` (clipped), one uniform per value; returns ``+-s``, unbiased."""
    eps = check_epsilon(epsilon)
    xs = as_float_array(x, "x")
    us = as_float_array(u, "u")
    if us.shape != xs.shape:
        msg = "x and u must have the same length"
        raise ValueError(msg)
    return sr_unit(xs, us, math.tanh(eps / 2.0), stochastic_rounding_scale(eps))


def stochastic_rounding_report(values: Any, theta: float, epsilon: float, u: Any) -> np.ndarray:
    """Truncate readings to ``[0, theta]``, run SR and map back: an unbiased estimate of each truncated reading.

    Reports are ``theta (1 +- s) / 2``; their variance is ``theta^2 / 4 * (s^2 - x^2)``.
    """
    return from_signed_unit(stochastic_rounding_perturb(to_signed_unit(values, theta), epsilon, u), theta)

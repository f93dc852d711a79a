"""Piecewise mechanism (PM; Wang et al., ICDE 2019), eps-LDP mean estimation on [-1, 1] (Wang et al., CCS 2021, Eq. 19).

For a unit-scale input ``x`` in ``[-1, 1]`` the output ``y`` lies in ``[-C, C]`` with ``C = (e^(eps/2) + 1) /
(e^(eps/2) - 1)``; its density is ``p`` on the piece ``[l(x), r(x)]`` and ``q = p / e^eps`` elsewhere (Eq. 19)::

    l(x) = (e^(eps/2) x - 1) / (e^(eps/2) - 1),    r(x) = l(x) + C - 1,
    p = (e^eps - e^(eps/2)) / (2 e^(eps/2) + 2),   q = p / e^eps.

``y`` is unbiased for ``x`` with ``Var[y] = x^2 / (e^(eps/2) - 1) + (e^(eps/2) + 3) / (3 (e^(eps/2) - 1)^2)``
(Appendix E.2). A report is the inverse CDF of that piecewise-constant density at one uniform ``u``, rounded to
the report grid (see :mod:`operators.local._units`). Unlike the reference code's ``pm()``, the piece bounds are
local to each sample and never overwrite the domain bounds used to map the estimate back.

Examples
--------
>>> from operators.noise import Domain, KeyedGenerator
>>> u = KeyedGenerator(bytes(32)).uniforms(Domain.LOCAL, 0, 0, 5)
>>> y = piecewise_perturb([-1.0, -0.5, 0.0, 0.5, 1.0], 2.0, u)
>>> bool(np.all(np.abs(y) <= piecewise_scale(2.0)))
True
>>> round(piecewise_scale(2.0), 4), round(float(piecewise_variance(1.0, 2.0)), 4)
(2.164, 1.2276)
>>> piecewise_perturb([0.3], 2.0, [0.5])    # the middle of the CDF falls inside the high-probability piece
array([0.41036...])
>>> r = piecewise_report([0.0, 4.0, 10.0], 10.0, 2.0, u[:3])   # unbiased estimates of the readings
>>> bool(np.all((r >= 5 * (1 - piecewise_scale(2.0))) & (r <= 5 * (1 + piecewise_scale(2.0)))))
True
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from operators.local._units import (
    REPORT_GRID_INVERSE,
    as_float_array,
    check_epsilon,
    from_signed_unit,
    to_signed_unit,
)

__all__ = [
    "piecewise_parameters",
    "piecewise_perturb",
    "piecewise_report",
    "piecewise_scale",
    "piecewise_variance",
    "pm_unit",
]


def piecewise_parameters(epsilon: float) -> tuple[float, float, float]:
    """``(C, p, q)`` of Eq. 19: output range ``[-C, C]``, density ``p`` on the piece and ``q`` off it."""
    eps = check_epsilon(epsilon)
    e_half = math.exp(eps / 2.0)
    c = (e_half + 1.0) / math.expm1(eps / 2.0)
    p = (math.exp(eps) - e_half) / (2.0 * e_half + 2.0)
    return c, p, p / math.exp(eps)


def piecewise_scale(epsilon: float) -> float:
    """``C = (e^(eps/2) + 1) / (e^(eps/2) - 1)``: PM reports lie in ``[-C, C]`` on the unit scale."""
    return piecewise_parameters(epsilon)[0]


def piecewise_variance(x: Any, epsilon: float) -> np.ndarray | float:
    """``Var[y] = x^2/(e^(eps/2) - 1) + (e^(eps/2) + 3)/(3 (e^(eps/2) - 1)^2)`` (Appendix E.2); largest at |x| = 1."""
    eps = check_epsilon(epsilon)
    em1 = math.expm1(eps / 2.0)
    out = np.square(np.asarray(x, dtype=np.float64)) / em1 + (em1 + 4.0) / (3.0 * em1 * em1)
    return float(out) if np.ndim(out) == 0 else out


def pm_unit(x: np.ndarray, u: np.ndarray, c: float, p: float, q: float) -> np.ndarray:
    """PM reports for unit-scale inputs (clipped to ``[-1, 1]``): the inverse CDF of Eq. 19's density at ``u``,
    rounded to the report grid."""
    lo = 0.5 * (c + 1.0) * np.clip(x, -1.0, 1.0) - 0.5 * (c - 1.0)  # l(x); r(x) = lo + c - 1
    mass_left = q * (lo + c)
    mass_piece = p * (c - 1.0)
    y = np.where(
        u < mass_left,
        -c + u / q,
        np.where(
            u < mass_left + mass_piece, lo + (u - mass_left) / p, lo + (c - 1.0) + (u - mass_left - mass_piece) / q
        ),
    )
    return np.floor(np.clip(y, -c, c) * REPORT_GRID_INVERSE + 0.5) / REPORT_GRID_INVERSE


def piecewise_perturb(x: Any, epsilon: float, u: Any) -> np.ndarray:
    """PM on the unit scale: ``x`` in ``[-1, 1]`` (clipped), one uniform per value; unbiased reports in ``[-C, C]``."""
    c, p, q = piecewise_parameters(epsilon)
    xs = as_float_array(x, "x")
    us = as_float_array(u, "u")
    if us.shape != xs.shape:
        msg = "x and u must have the same length"
        raise ValueError(msg)
    return pm_unit(xs, us, c, p, q)


def piecewise_report(values: Any, theta: float, epsilon: float, u: Any) -> np.ndarray:
    """Truncate readings to ``[0, theta]``, run PM and map back: an unbiased estimate of each truncated reading.

    Reports lie in ``[theta (1 - C) / 2, theta (1 + C) / 2]``; their variance is ``theta^2 / 4`` times PM's.
    """
    return from_signed_unit(piecewise_perturb(to_signed_unit(values, theta), epsilon, u), theta)

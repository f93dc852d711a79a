"""Hybrid mechanism (HM; Wang et al., ICDE 2019), the ToPL perturber (Wang et al., CCS 2021, Section 4.2, Eq. 22).

With ``alpha = 1 - e^(-eps/2)`` when ``eps > 0.61`` and ``alpha = 0`` otherwise, a device reports with the
Piecewise mechanism with probability ``alpha`` and with Stochastic Rounding otherwise, both at the full ``eps``
(the choice does not depend on the reading, so each report is eps-LDP). Both outputs are unbiased on the unit
scale, so ``Var[y] = alpha Var_PM(x) + (1 - alpha) Var_SR(x)``; for ``eps > 0.61`` the ``x^2`` terms cancel and the
variance is the same for every input, Eq. 22::

    Var = s^2                                                     eps <= 0.61
    Var = e^(-eps/2) [ s^2 + (e^(eps/2) + 3) / (3 (e^(eps/2) - 1)) ]  eps >  0.61,    s = (e^eps + 1)/(e^eps - 1)

Two uniforms decide a report: ``u_select`` picks the mechanism, ``u`` drives it.

Examples
--------
>>> from operators.noise import Domain, KeyedGenerator
>>> u = KeyedGenerator(bytes(32)).uniforms(Domain.LOCAL, 0, 0, 8)
>>> y = hybrid_perturb([-1.0, 0.0, 0.5, 1.0], 1.0, u[0::2], u[1::2])
>>> bool(np.all(np.abs(y) <= hybrid_scale(1.0)))
True
>>> hybrid_alpha(0.5), round(hybrid_alpha(1.0), 4)
(0.0, 0.3935)
>>> round(hybrid_worst_case_variance(1.0), 4), round(float(hybrid_variance(0.3, 1.0)), 4)
(4.289, 4.289)
>>> r = hybrid_report([0.0, 7.0, 30.0], 20.0, 1.0, u[0:3], u[3:6])   # estimates of 0, 7 and 20 (truncated)
>>> r.shape
(3,)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from operators.local._units import as_float_array, check_epsilon, from_signed_unit, to_signed_unit
from operators.local.piecewise import piecewise_parameters, piecewise_variance, pm_unit
from operators.local.stochastic_rounding import sr_unit, stochastic_rounding_scale, stochastic_rounding_variance

__all__ = [
    "HYBRID_PM_THRESHOLD",
    "hybrid_alpha",
    "hybrid_perturb",
    "hybrid_report",
    "hybrid_scale",
    "hybrid_variance",
    "hybrid_worst_case_variance",
]

HYBRID_PM_THRESHOLD = 0.61  # eps above which HM mixes in PM (Wang et al., CCS 2021, Appendix E.2)


def hybrid_alpha(epsilon: float) -> float:
    """The probability of using PM: ``1 - e^(-eps/2)`` when ``eps > 0.61``, else 0."""
    eps = check_epsilon(epsilon)
    return -math.expm1(-eps / 2.0) if eps > HYBRID_PM_THRESHOLD else 0.0


def hybrid_scale(epsilon: float) -> float:
    """The largest absolute unit-scale report: PM's ``C`` when PM is used, else SR's ``s``."""
    return piecewise_parameters(epsilon)[0] if hybrid_alpha(epsilon) > 0 else stochastic_rounding_scale(epsilon)


def hybrid_variance(x: Any, epsilon: float) -> np.ndarray | float:
    """``alpha Var_PM(x) + (1 - alpha) Var_SR(x)`` on the unit scale (input-free for eps > 0.61: Eq. 22)."""
    a = hybrid_alpha(epsilon)
    out = a * np.asarray(piecewise_variance(x, epsilon)) + (1.0 - a) * np.asarray(
        stochastic_rounding_variance(x, epsilon)
    )
    return float(out) if np.ndim(out) == 0 else out


def hybrid_worst_case_variance(epsilon: float) -> float:
    """Eq. 22: the largest unit-scale variance of HM over inputs in ``[-1, 1]``."""
    eps = check_epsilon(epsilon)
    s2 = stochastic_rounding_scale(eps) ** 2
    if eps <= HYBRID_PM_THRESHOLD:
        return s2
    e_half = math.exp(eps / 2.0)
    return (s2 + (e_half + 3.0) / (3.0 * math.expm1(eps / 2.0))) / e_half


def hybrid_perturb(x: Any, epsilon: float, u_select: Any, u: Any) -> np.ndarray:
    """HM on the unit scale: ``x`` in ``[-1, 1]`` (clipped), two uniforms per value; unbiased unit-scale reports."""
    eps = check_epsilon(epsilon)
    xs = as_float_array(x, "x")
    us = as_float_array(u_select, "u_select")
    um = as_float_array(u, "u")
    if us.shape != xs.shape or um.shape != xs.shape:
        msg = "x, u_select and u must have the same length"
        raise ValueError(msg)
    alpha = hybrid_alpha(eps)
    out = sr_unit(xs, um, math.tanh(eps / 2.0), stochastic_rounding_scale(eps))
    pick = us < alpha
    if pick.any():
        out[pick] = pm_unit(xs[pick], um[pick], *piecewise_parameters(eps))
    return out


def hybrid_report(values: Any, theta: float, epsilon: float, u_select: Any, u: Any) -> np.ndarray:
    """Truncate readings to ``[0, theta]``, run HM and map back: the unbiased ToPL report of each reading.

    Reports lie in ``[theta (1 - S) / 2, theta (1 + S) / 2]`` with ``S = hybrid_scale(eps)``; their variance is
    ``theta^2 / 4 * hybrid_variance(x, eps)``, at most ``theta^2 / 4`` times Eq. 22.
    """
    return from_signed_unit(hybrid_perturb(to_signed_unit(values, theta), epsilon, u_select, u), theta)

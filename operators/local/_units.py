"""Maps between readings and the randomizers' unit scales, and the grid every continuous report is rounded to.

The mean randomizers (SR, PM, HM) work on ``[-1, 1]``: a reading ``v`` in ``[0, theta]`` becomes
``x = 2 v / theta - 1`` and an unbiased unit-scale output ``y`` becomes ``theta (y + 1) / 2`` again, an unbiased
estimate of ``v`` whose variance is ``theta^2 / 4`` times the unit-scale variance. Square Wave works on ``[0, 1]``:
``x = v / B``.

Continuous outputs are rounded to multiples of :data:`REPORT_GRID` on the unit scale. The inverse-CDF arithmetic
of a float implementation leaves input-dependent low-order bits in a sample (the floating-point attack of
Mironov 2012 on the Laplace mechanism); after rounding to a grid far coarser than 2^-53, the probability of each
grid cell is the ideal mechanism's probability up to a relative error of about 2^-25, and the rounding moves a
report by at most 2^-25 (its effect on the mean is far below that: the densities are flat over almost every cell).

>>> to_signed_unit([0.0, 5.0, 10.0, 12.0], 10.0)
array([-1.,  0.,  1.,  1.])
>>> from_signed_unit(to_signed_unit([0.0, 2.5, 10.0], 10.0), 10.0)
array([ 0. ,  2.5, 10. ])
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

__all__ = [
    "REPORT_GRID",
    "REPORT_GRID_INVERSE",
    "as_float_array",
    "check_epsilon",
    "from_signed_unit",
    "to_signed_unit",
    "to_unit",
]

REPORT_GRID = 2.0**-24
REPORT_GRID_INVERSE = 2.0**24


def check_epsilon(epsilon: Any, name: str = "epsilon") -> float:
    """``epsilon`` as a float, or ValueError unless it is a real number in (0, 700)."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not 0 < epsilon < 700:
        msg = f"{name} must be a positive number below 700 (got {epsilon!r})"
        raise ValueError(msg)
    return float(epsilon)


def as_float_array(values: Any, name: str = "values") -> np.ndarray:
    """A contiguous 1-D float64 copy-or-view of ``values`` (scalars become length 1)."""
    arr = np.ascontiguousarray(np.asarray(values, dtype=np.float64).reshape(-1))
    if arr.size and not np.isfinite(arr).all():
        msg = f"{name} must be finite"
        raise ValueError(msg)
    return arr


def to_signed_unit(values: Any, theta: float) -> np.ndarray:
    """Truncate readings to ``[0, theta]`` and map them onto ``[-1, 1]`` (``x = 2 v / theta - 1``)."""
    if not theta > 0:
        msg = "theta must be positive"
        raise ValueError(msg)
    v = np.clip(as_float_array(values), 0.0, theta)
    return np.clip(2.0 * v / theta - 1.0, -1.0, 1.0)


def from_signed_unit(y: Any, theta: float) -> np.ndarray:
    """The unbiased estimate ``theta (y + 1) / 2`` of a reading from an unbiased unit-scale output ``y``."""
    return 0.5 * theta * (np.asarray(y, dtype=np.float64) + 1.0)


def to_unit(values: Any, bound: float) -> np.ndarray:
    """Clamp readings to ``[0, bound]`` and map them onto ``[0, 1]`` (the Square Wave input domain)."""
    if not bound > 0:
        msg = "bound must be positive"
        raise ValueError(msg)
    return np.clip(as_float_array(values) / bound, 0.0, 1.0)

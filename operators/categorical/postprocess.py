"""Post-processing of estimated counts (Finnegan, thesis 2024, section 4; Wang, Lopuhaa-Zwakenberg, Li, Skoric, Li
2019).

All of them read only the released estimates and the public number of users ``n``, so they cost no privacy. What
each one does to the bias of a cell ``y`` with true count ``c_y``:

* :func:`base`: nothing; unbiased, can be negative, does not sum to ``n`` (except GRR's, which does).
* :func:`base_pro`: ``max(c_hat, 0)``; biased **upwards** (``E[max(X, 0)] >= max(E X, 0)``), most on the many small
  cells, so the total exceeds ``n`` in expectation.
* :func:`base_cut` (the thesis's definition): clip at 0, then keep the largest estimates while their running sum is
  below ``n`` (the one that crosses ``n`` is kept) and zero the rest; biased **downwards** on small cells (zeroed)
  and upwards on the kept ones (clipped noise and selection on a high draw). Not WLZL+19's Base-Cut, which zeroes
  estimates below a significance threshold.
* :func:`norm_sub`: subtract one ``delta`` from every estimate and clip at 0, ``delta`` such that the result sums to
  ``n`` (WLZL+19's iteration); biased down on large cells (by ``delta``) and up on the cells it clips.
* :func:`project_simplex`: the Euclidean projection onto ``{v >= 0, sum v = n}``, by sorting (Held, Wolfe, Crowder
  1974): the same vector as Norm-Sub (its KKT conditions are Norm-Sub's fixed point), computed exactly.

>>> c = np.array([50.0, 30.0, -8.0, 4.0, -1.0])
>>> base_pro(c).tolist()
[50.0, 30.0, 0.0, 4.0, 0.0]
>>> base_cut(c, 70).tolist()
[50.0, 30.0, 0.0, 0.0, 0.0]
>>> project_simplex(c, 75).tolist(), bool(np.allclose(norm_sub(c, 75), project_simplex(c, 75)))
([47.0, 27.0, 0.0, 1.0, 0.0], True)
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["POSTPROCESSORS", "apply", "base", "base_cut", "base_pro", "norm_sub", "project_simplex"]


def _vector(c: Any) -> np.ndarray:
    v = np.array(c, dtype=np.float64).reshape(-1)
    if not np.isfinite(v).all():
        msg = "estimates must be finite"
        raise ValueError(msg)
    return v


def _total(n: Any) -> float:
    if isinstance(n, bool) or not isinstance(n, int | float) or not n >= 0:
        msg = f"n must be a non-negative number (got {n!r})"
        raise ValueError(msg)
    return float(n)


def base(c: Any, n: float | None = None) -> np.ndarray:
    """The unbiased estimates, unchanged (a copy)."""
    return _vector(c)


def base_pro(c: Any, n: float | None = None) -> np.ndarray:
    """``max(c_hat, 0)``."""
    return np.maximum(_vector(c), 0.0)


def base_cut(c: Any, n: float) -> np.ndarray:
    """Clip at 0, keep the largest estimates while the running sum before them is below ``n``, zero the rest."""
    v = np.maximum(_vector(c), 0.0)
    total = _total(n)
    order = np.argsort(-v, kind="stable")
    before = np.cumsum(v[order]) - v[order]
    v[order[before >= total]] = 0.0
    return v


def norm_sub(c: Any, n: float, *, max_iterations: int = 10_000) -> np.ndarray:
    """WLZL+19 Norm-Sub: repeat ``delta = (sum of the positive estimates - n) / #positive``, subtract it from the
    positive ones and clip, until the positive ones sum to ``n``."""
    v = _vector(c)
    total = _total(n)
    if v.size == 0:
        return v
    if total == 0:
        return np.zeros_like(v)
    out = v.copy()
    for _ in range(max_iterations):
        pos = out > 0
        if not pos.any():  # everything was clipped: put the mass on the largest estimates evenly
            return project_simplex(v, total)
        excess = out[pos].sum() - total
        if abs(excess) <= 1e-9 * max(total, 1.0):
            break
        out[pos] -= excess / np.count_nonzero(pos)
        np.maximum(out, 0.0, out=out)
    return out


def project_simplex(c: Any, n: float) -> np.ndarray:
    """The Euclidean projection onto ``{v >= 0, sum v = n}``: ``max(c - tau, 0)`` with ``tau`` found by sorting."""
    v = _vector(c)
    total = _total(n)
    if v.size == 0:
        return v
    s = np.sort(v)[::-1]
    cs = np.cumsum(s) - total
    k = np.arange(1, v.size + 1)
    rho = int(np.flatnonzero(s - cs / k > 0)[-1]) if total > 0 else v.size - 1
    tau = cs[rho] / (rho + 1)
    return np.maximum(v - tau, 0.0)


POSTPROCESSORS = {
    "base": base,
    "base-pro": base_pro,
    "base-cut": base_cut,
    "norm-sub": norm_sub,
    "simplex": project_simplex,
}


def apply(name: str, c: Any, n: float) -> np.ndarray:
    """The post-processing ``name`` (a key of :data:`POSTPROCESSORS`) of the estimates ``c``."""
    if name not in POSTPROCESSORS:
        msg = f"post-processing must be one of {', '.join(POSTPROCESSORS)} (got {name!r})"
        raise ValueError(msg)
    return POSTPROCESSORS[name](c, n)

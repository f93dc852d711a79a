"""The registry of smoothers (Wang et al., CCS 2021, Section 3.5 and Appendix D): each one's name, what the
configuration reference says of it, which configuration keys it reads, what else can serve it, and its arithmetic.

A leaf of the perturber covers ``w = b^s`` ticks; inside leaf ``k`` every tick releases a prediction ``p_k`` made
from the released sums ``u_0, ..., u_{k-1}`` of earlier leaves (:mod:`operators.smoother` holds the state and the
per-tick release; this module what differs between smoothers):

* recent: ``p_k = u_{k-1} / w``;
* ema: ``p_k = alpha u_{k-1} / w + (1 - alpha) p_{k-1}``, ``p_0 = u_0 / w``;
* mean: ``p_k = (u_0 + ... + u_{k-1}) / (k w)``;
* median: the median of the last ``window`` leaf sums, divided by ``w`` (the paper takes the median of the whole
  history; a window keeps the state bounded);
* moving: the mean of the last ``window`` of ``u_0, ..., u_{k-1}``, divided by ``w``.

Every reader (the configuration's validation and reference, the error bars, ``tops query``, the columnar rows, the
hindsight reference of ``tops compare``, the status) asks :data:`SMOOTHERS`: a new smoother is one entry here and
the shared check of ``tests/operators/test_smoothers.py`` runs over it. The lookup that refuses an unknown name with
a :class:`operators.config.ConfigError` is :func:`operators.config.smoother` (the configuration owns its errors and
imports this module, never the reverse).

>>> [name for name, spec in SMOOTHERS.items() if spec.linear]
['recent', 'ema', 'mean', 'moving']
>>> SMOOTHERS["ema"].reads, SMOOTHERS["recent"].in_rows
(('alpha',), True)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

if TYPE_CHECKING:
    from operators.smoother import SmootherState

__all__ = ["SMOOTHERS", "SmootherSpec", "grid", "grid_scalar"]

GRID = 1024.0  # predictions are multiples of 1/1024 unit: the leaf sums of the releases stay exact in float64

Predictions = Callable[["SmootherState", np.ndarray, float], np.ndarray]
Coefficients = Callable[[int, float, int], tuple[np.ndarray, np.ndarray]]


def grid(x):
    """``x`` rounded (half to even) to the release grid of 1/1024 unit."""
    return np.rint(np.asarray(x, dtype=np.float64) * GRID) / GRID


def grid_scalar(x: float) -> float:
    """``float(grid(x))`` for one number without numpy's overhead per call (every new or restored stream makes its
    first prediction): ``round`` is round-half-even as ``np.rint`` is, scaling by 1024 is exact, and a zero keeps the
    sign ``np.rint`` gives it (a test compares both on many numbers)."""
    y = float(x) * GRID
    if not math.isfinite(y):
        return float(grid(x))
    r = round(y) / GRID
    return r if r else math.copysign(0.0, x)


@dataclass(frozen=True, slots=True)
class SmootherSpec:
    """One smoother and what every part of tops needs to know of it.

    ``initial(u0)`` is the leaf-sum history it starts from, given the prior ``u_0``; ``predictions(state, u, alpha)``
    is ``p_{k+1}`` after each new leaf sum ``u_k`` (on the grid), updating the state's memory; ``coefficients(k,
    alpha, window)`` (linear smoothers only) is ``p_k = sum_i weight_i u_i / w`` as the arrays ``(i, weight)``, the
    terms on the prior left out (a public constant, or the start the error bar weighs on its own).
    """

    name: str
    summary: str  # its line in the configuration reference
    reads: tuple[str, ...]  # the configuration keys it uses, beside the hierarchy's
    linear: bool  # p_k is linear in earlier leaf sums: the error bars have an exact noise variance (Eq. 1)
    in_rows: bool  # the columnar rows (operators._columnar_kernel) have a compiled step for it
    in_hindsight: bool  # operators.hindsight models its noiseless release (the hindsight row of tops compare)
    initial: Callable[[float], list[float]]
    predictions: Predictions
    coefficients: Coefficients | None = None


# -- recent ------------------------------------------------------------------------------------------------------
def _recent_predictions(st: SmootherState, u: np.ndarray, alpha: float) -> np.ndarray:
    return grid(u / st.leaf_ticks)


def _recent_coefficients(k: int, alpha: float, window: int) -> tuple[np.ndarray, np.ndarray]:
    return np.array([k - 1]), np.ones(1)


# -- ema ---------------------------------------------------------------------------------------------------------
def _ema_predictions(st: SmootherState, u: np.ndarray, alpha: float) -> np.ndarray:
    out = np.empty(u.size)
    p, w = st.pred, st.leaf_ticks
    for k, uk in enumerate(u.tolist()):
        p = float(grid(alpha * uk / w + (1.0 - alpha) * p))
        out[k] = p
    return out


def _ema_coefficients(k: int, alpha: float, window: int) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(k)
    return i, alpha * (1.0 - alpha) ** (k - 1 - i)


# -- mean --------------------------------------------------------------------------------------------------------
def _mean_predictions(st: SmootherState, u: np.ndarray, alpha: float) -> np.ndarray:
    sums = np.cumsum(np.concatenate([[st.total], u]))[1:]
    counts = st.count + np.arange(1, u.size + 1)
    st.total, st.count = float(sums[-1]), int(counts[-1])
    return grid(sums / (counts * st.leaf_ticks))


def _mean_coefficients(k: int, alpha: float, window: int) -> tuple[np.ndarray, np.ndarray]:
    """``(u_prior + u_0 + ... + u_{k-1}) / (k + 1)``."""
    return np.arange(k), np.full(k, 1.0 / (k + 1))


# -- median and moving: a statistic of the last `window` leaf sums ------------------------------------------------
def _window_stat(full: np.ndarray, first: int, window: int, median: bool) -> np.ndarray:
    """For each end position ``e >= first`` of ``full``, the mean (or median) of the last ``window`` items up to e."""
    out = np.empty(full.size - first)
    short = [e for e in range(first, min(full.size, window - 1))]  # fewer than `window` items so far
    for e in short:
        items = full[: e + 1]
        if median:
            out[e - first] = np.median(items)
        else:
            s = 0.0
            for x in items:
                s += x
            out[e - first] = s / items.size
    start = max(first, window - 1)
    if start < full.size:
        w = sliding_window_view(full, window)[start - window + 1 :]
        if median:
            out[start - first :] = np.median(w, axis=1)
        else:
            s = w[:, 0].copy()
            for c in range(1, window):
                s += w[:, c]
            out[start - first :] = s / window
    return out


def _windowed(median: bool) -> Predictions:
    def predictions(st: SmootherState, u: np.ndarray, alpha: float) -> np.ndarray:
        full = np.concatenate([np.asarray(st.history, dtype=np.float64), u])
        stat = _window_stat(full, len(st.history), st.window, median=median)
        st.history = full[-st.window :].tolist()
        return grid(stat / st.leaf_ticks)

    return predictions


def _moving_coefficients(k: int, alpha: float, window: int) -> tuple[np.ndarray, np.ndarray]:
    """The last ``window`` of ``[u_prior, u_0, ..., u_{k-1}]``, equally weighted: the leaves ``k - n .. k - 1``
    (``n = min(window, k + 1)``), the prior (index -1) left out."""
    n = min(window, k + 1)
    i = np.arange(k - n, k)
    i = i[i >= 0]
    return i, np.full(i.size, 1.0 / n)


def _no_history(u0: float) -> list[float]:
    return []


def _prior_history(u0: float) -> list[float]:
    """The paper's moving average starts from ``u_0``."""
    return [u0]


SMOOTHERS: Mapping[str, SmootherSpec] = MappingProxyType({
    spec.name: spec
    for spec in (
        SmootherSpec("recent", "the last leaf's sum", (), linear=True, in_rows=True, in_hindsight=True,
                     initial=_no_history, predictions=_recent_predictions, coefficients=_recent_coefficients),
        SmootherSpec("ema", "an exponential moving average of the leaf sums, the newest weighted alpha", ("alpha",),
                     linear=True, in_rows=False, in_hindsight=False, initial=_no_history,
                     predictions=_ema_predictions, coefficients=_ema_coefficients),
        SmootherSpec("mean", "the mean of every earlier leaf sum", (), linear=True, in_rows=False,
                     in_hindsight=False, initial=_no_history, predictions=_mean_predictions,
                     coefficients=_mean_coefficients),
        SmootherSpec("median", "the median of the last window leaf sums (no error bars)", ("window",), linear=False,
                     in_rows=False, in_hindsight=False, initial=_no_history, predictions=_windowed(median=True)),
        SmootherSpec("moving", "the mean of the last window leaf sums", ("window",), linear=True, in_rows=False,
                     in_hindsight=False, initial=_prior_history, predictions=_windowed(median=False),
                     coefficients=_moving_coefficients),
    )
})

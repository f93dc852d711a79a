"""Smoothers (Wang et al., CCS 2021, Section 3.5 and Appendix D) and the per-tick release of a leaf's noisy sum.

A leaf of the perturber covers ``w = b^s`` ticks. Inside leaf ``k`` every tick releases a prediction ``p_k`` made
from the released sums ``u_0, ..., u_{k-1}`` of earlier leaves, with the prior ``u_0 = w theta / 2``:

* Recent: ``p_k = u_{k-1} / w``;
* EMA: ``p_k = alpha u_{k-1} / w + (1 - alpha) p_{k-1}``, ``p_0 = u_0 / w``;
* Mean: ``p_k = (u_0 + ... + u_{k-1}) / (k w)``;
* Median: the median of the last ``window`` leaf sums, divided by ``w`` (the paper takes the median of the whole
  history; a window keeps the state bounded);
* Moving average: the mean of the last ``window`` of ``u_0, ..., u_{k-1}``, divided by ``w``.

The last tick of the leaf releases ``u_k - (w - 1) p_k`` (Algorithm 1 prints ``u x (16^s - 1)`` and drops the
``/16^s``), so the released ticks of every complete leaf add up exactly to its consistent noisy sum ``u_k``.
Predictions are rounded to the release grid (1/1024 unit), so these sums are exact in float64. All of it is
post-processing of released values, computed in a fixed order so that batching never changes a bit.

>>> import numpy as np
>>> st = SmootherState.initial("recent", leaf_ticks=4, theta_units=10, window=8)
>>> out = release_ticks(np.array([1, 2, 3, 4, 5, 5, 5, 5]), np.array([0.5, -1.0]), st, alpha=0.6)
>>> out.tolist()       # prior 10/2 = 5 per tick; leaf sums 10 + 0.5 and 20 - 1.0
[5.0, 5.0, 5.0, -4.5, 2.625, 2.625, 2.625, 11.125]
>>> float(out[:4].sum()), float(out[4:].sum())
(10.5, 19.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["SmootherState", "release_ticks"]

_GRID = 1024.0


def _grid(x):
    return np.rint(np.asarray(x, dtype=np.float64) * _GRID) / _GRID


def _grid_scalar(x: float) -> float:
    """``float(_grid(x))`` for one number without numpy's overhead per call (every new or restored stream makes its
    first prediction): ``round`` is round-half-even as ``np.rint`` is, scaling by 1024 is exact, and a zero keeps the
    sign ``np.rint`` gives it (a test compares both on many numbers)."""
    y = float(x) * _GRID
    if not math.isfinite(y):
        return float(_grid(x))
    r = round(y) / _GRID
    return r if r else math.copysign(0.0, x)


@dataclass
class SmootherState:
    """Everything the release carries from one call to the next (small and of fixed size)."""

    smoother: str
    leaf_ticks: int  # w = b^s
    window: int
    pred: float  # the prediction of the current leaf (on the grid)
    pos: int = 0  # ticks already seen in the current leaf
    leaf_sum: int = 0  # their truncated sum, in quantized units
    total: float = 0.0  # mean smoother: u_0 + ... + u_{k-1}
    count: int = 1  # mean smoother: k
    history: list[float] = field(default_factory=list)  # last `window` leaf sums, oldest first

    @classmethod
    def initial(
        cls, smoother: str, *, leaf_ticks: int, theta_units: int, window: int, start: float | None = None
    ) -> SmootherState:
        """The state before the first leaf: the prior ``u_0 = w * start`` (the paper's ``start = theta / 2``, or a
        private estimate of the per-tick mean from the holdout: operators.selection)."""
        u0 = leaf_ticks * (theta_units / 2.0 if start is None else float(start))
        history = [u0] if smoother == "moving" else []  # the paper's moving average starts from u_0
        return cls(smoother, leaf_ticks, window, _grid_scalar(u0 / leaf_ticks), total=u0, history=history)

    def to_dict(self) -> dict:
        return {
            "pred": self.pred,
            "pos": self.pos,
            "leaf_sum": self.leaf_sum,
            "total": self.total,
            "count": self.count,
            "history": list(self.history),
        }

    @classmethod
    def from_dict(cls, smoother: str, leaf_ticks: int, window: int, d: dict) -> SmootherState:
        return cls(
            smoother,
            leaf_ticks,
            window,
            float(d["pred"]),
            int(d["pos"]),
            int(d["leaf_sum"]),
            float(d["total"]),
            int(d["count"]),
            [float(x) for x in d["history"]],
        )

    def nbytes(self) -> int:
        return 8 * (6 + self.window)


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


def _predictions(st: SmootherState, u: np.ndarray, alpha: float) -> np.ndarray:
    """``p_{k+1}`` after each new leaf sum ``u_k`` (on the grid), updating the smoother's memory."""
    w = st.leaf_ticks
    if st.smoother == "recent":
        return _grid(u / w)
    if st.smoother == "ema":
        out = np.empty(u.size)
        p = st.pred
        for k, uk in enumerate(u.tolist()):
            p = float(_grid(alpha * uk / w + (1.0 - alpha) * p))
            out[k] = p
        return out
    if st.smoother == "mean":
        sums = np.cumsum(np.concatenate([[st.total], u]))[1:]
        counts = st.count + np.arange(1, u.size + 1)
        st.total, st.count = float(sums[-1]), int(counts[-1])
        return _grid(sums / (counts * w))
    full = np.concatenate([np.asarray(st.history, dtype=np.float64), u])
    first = len(st.history)
    stat = _window_stat(full, first, st.window, median=st.smoother == "median")
    st.history = full[-st.window :].tolist()
    return _grid(stat / w)


def release_ticks(
    units: np.ndarray, leaf_noise: np.ndarray, st: SmootherState, *, alpha: float
) -> np.ndarray:
    """One release per tick (in quantized units) for truncated, quantized ``units``.

    ``leaf_noise`` is the consistent noise (on the release grid) of exactly the leaves that complete in this call.
    """
    units = np.asarray(units, dtype=np.int64)
    n, w = units.size, st.leaf_ticks
    first = w - st.pos  # ticks that complete the current leaf
    if n < first:
        st.pos += n
        st.leaf_sum += int(units.sum())
        return np.full(n, st.pred)
    full = (n - first) // w
    rest = n - first - full * w
    sums = np.empty(1 + full, dtype=np.int64)
    sums[0] = st.leaf_sum + int(units[:first].sum())
    if full:
        sums[1:] = units[first : first + full * w].reshape(full, w).sum(axis=1)
    if leaf_noise.size != sums.size:
        msg = "leaf noise does not match the completing leaves"
        raise ValueError(msg)
    u = sums.astype(np.float64) + leaf_noise
    preds = np.empty(sums.size + 1)
    preds[0] = st.pred
    preds[1:] = _predictions(st, u, alpha)
    lengths = np.full(sums.size + 1, w)
    lengths[0], lengths[-1] = first, rest
    out = np.repeat(preds, lengths)
    ends = first - 1 + w * np.arange(sums.size)
    out[ends] = u - (w - 1) * preds[:-1]
    st.pred = float(preds[-1])
    st.pos = rest
    st.leaf_sum = int(units[n - rest :].sum()) if rest else 0
    return out

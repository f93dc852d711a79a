"""Smoothers (Wang et al., CCS 2021, Section 3.5 and Appendix D) and the per-tick release of a leaf's noisy sum.

A leaf of the perturber covers ``w = b^s`` ticks. Inside leaf ``k`` every tick releases a prediction ``p_k`` made
from the released sums ``u_0, ..., u_{k-1}`` of earlier leaves, with the prior ``u_0 = w theta / 2``; how, is the
smoother's entry in :data:`operators.smoothers.SMOOTHERS` (recent, ema, mean, median, moving).

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

from dataclasses import dataclass, field

import numpy as np

from operators.smoothers import SMOOTHERS, grid_scalar

__all__ = ["SmootherState", "release_ticks"]


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
        history = SMOOTHERS[smoother].initial(u0)
        return cls(smoother, leaf_ticks, window, grid_scalar(u0 / leaf_ticks), total=u0, history=history)

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
    preds[1:] = SMOOTHERS[st.smoother].predictions(st, u, alpha)
    lengths = np.full(sums.size + 1, w)
    lengths[0], lengths[-1] = first, rest
    out = np.repeat(preds, lengths)
    ends = first - 1 + w * np.arange(sums.size)
    out[ends] = u - (w - 1) * preds[:-1]
    st.pred = float(preds[-1])
    st.pos = rest
    st.leaf_sum = int(units[n - rest :].sum()) if rest else 0
    return out

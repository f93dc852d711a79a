"""Smoothers (seed 001, Section 3.5 and Appendix D) and the compiled per-tick release loop.

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
Predictions are rounded to the release grid, so these sums are exact in float64. All of it is post-processing of
released values.

>>> import numpy as np
>>> from operators.smoother import SmootherState, release_ticks
>>> st = SmootherState.initial("recent", leaf_ticks=4, theta_units=10, window=8)
>>> out = np.empty(8)
>>> used = release_ticks(np.array([1, 2, 3, 4, 5, 5, 5, 5]), np.array([0.5, -1.0]), out, st, alpha=0.6)
>>> out.tolist()       # prior 10/2 = 5 per tick; leaf sums 10 + 0.5 and 20 - 1.0
[5.0, 5.0, 5.0, -4.5, 2.625, 2.625, 2.625, 11.125]
>>> used, float(out[:4].sum()), float(out[4:].sum())
(2, 10.5, 19.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from operators.config import SMOOTHERS

__all__ = ["SmootherState", "release_ticks"]

_GRID = 1024.0


@dataclass
class SmootherState:
    """Everything the release loop carries from one call to the next (small, fixed size)."""

    code: int  # index in SMOOTHERS
    leaf_ticks: int  # w = b^s
    f: np.ndarray  # [prediction, running sum (mean), count (mean)]
    ring: np.ndarray  # last `window` leaf sums (median, moving)
    i: np.ndarray  # [position in leaf, partial leaf sum (units), ring fill, ring position]

    @classmethod
    def initial(cls, smoother: str, *, leaf_ticks: int, theta_units: int, window: int) -> SmootherState:
        code = SMOOTHERS.index(smoother)
        u0 = leaf_ticks * theta_units / 2.0
        f = np.array([np.rint(u0 / leaf_ticks * _GRID) / _GRID, u0, 1.0])
        ring = np.zeros(window)
        i = np.zeros(4, dtype=np.int64)
        if smoother == "moving":  # the paper's moving average starts from u_0
            ring[0] = u0
            i[2], i[3] = 1, 1 % window
        return cls(code, leaf_ticks, f, ring, i)

    def to_dict(self) -> dict:
        return {"f": self.f.tolist(), "ring": self.ring.tolist(), "i": self.i.tolist()}

    @classmethod
    def from_dict(cls, smoother: str, leaf_ticks: int, d: dict) -> SmootherState:
        return cls(
            SMOOTHERS.index(smoother),
            leaf_ticks,
            np.array(d["f"], dtype=np.float64),
            np.array(d["ring"], dtype=np.float64),
            np.array(d["i"], dtype=np.int64),
        )


@numba.njit(cache=True, nogil=True)
def _kernel(units, leaf_noise, out, code, w, alpha, f, ring, ist):  # pragma: no cover - compiled
    pos = ist[0]
    leaf_sum = ist[1]
    k = 0
    window = ring.size
    for t in range(units.size):
        leaf_sum += units[t]
        pred = f[0]
        if pos == w - 1:
            u = float(leaf_sum) + leaf_noise[k]
            k += 1
            out[t] = u - (w - 1) * pred
            if code == 0:
                p = u / w
            elif code == 1:
                p = alpha * u / w + (1.0 - alpha) * pred
            elif code == 2:
                f[1] += u
                f[2] += 1.0
                p = f[1] / (f[2] * w)
            else:
                ring[ist[3]] = u
                ist[3] = (ist[3] + 1) % window
                if ist[2] < window:
                    ist[2] += 1
                n = ist[2]
                if code == 3:
                    p = np.median(ring[:n]) / w
                else:
                    s = 0.0
                    for q in range(n):
                        s += ring[q]
                    p = s / n / w
            f[0] = np.rint(p * 1024.0) / 1024.0
            leaf_sum = 0
            pos = 0
        else:
            out[t] = pred
            pos += 1
    ist[0] = pos
    ist[1] = leaf_sum
    return k


def release_ticks(
    units: np.ndarray, leaf_noise: np.ndarray, out: np.ndarray, state: SmootherState, *, alpha: float
) -> int:
    """Release one value per tick (in quantized units) into ``out``; returns how many leaf noises were used.

    ``units`` are the truncated, quantized values; ``leaf_noise`` the consistent noise (on the release grid) of the
    leaves that complete in this call, in order.
    """
    return int(
        _kernel(
            np.ascontiguousarray(units, dtype=np.int64),
            np.ascontiguousarray(leaf_noise, dtype=np.float64),
            out,
            state.code,
            state.leaf_ticks,
            float(alpha),
            state.f,
            state.ring,
            state.i,
        )
    )

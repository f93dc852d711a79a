"""The authors' reference ToPL (dp-cont/dp-cont, ``percentile_estimator/sw_mse.py`` + the ``hm`` range estimator),
re-implemented as a comparison baseline for ``tops compare --mode local``, with its Piecewise bug fixed.

What the reference does, read from its code (MIT license):

* Threshold (``SWMSE.obtain_ell``): Square Wave reports of the holdout over ``[0, B]`` (1,024 report and density
  buckets), EM **without** smoothing, then ``remove_trailing_zero``: estimates below 1/10,000 of the mass are zeroed,
  the density is cut at the first run of at least 5 zero buckets, and the missing mass is spread evenly over the
  non-zero buckets. The candidates are ``linspace(0, B, 1024)`` (0 included) and theta minimises::

      (std theta)^2 n / 3 + n^2 / 24 (sum_{t_i >= theta} f_i (t_i - theta))^2

  with ``std^2`` the worst-case variance of Eq. 8 of Wang et al. (ICDE 2019) for eps > 0.61 and SR's ``((e^eps + 1) /
  (e^eps - 1))^2`` below, on the unit scale, and n = the released ticks. Against Eq. 22 and the r^2/6 of random
  ranges, its noise term is 4x too high (theta^2 instead of (theta/2)^2) and its bias term 4x too low (1/24).
* Stream (``hm``, "an approximation form": the full HM "runs slow"): Piecewise (PM) when eps > 1.29, else
  Stochastic Rounding (SR), of the reading truncated to theta. The reference's ``pm()`` reuses the name of the
  domain's lower bound inside its sampling loop, so every report is mapped back with the last sample's piece bound:
  worse than answering 0. Here PM is :func:`operators.local.piecewise.piecewise_report` (unbiased), i.e. the bug
  fixed.

Uniforms come from the stream key (Domain.LOCAL, SW at address 1 like ToPL, the stream phase at address 3), so a
run is reproducible. This is a baseline, not a mechanism offered for deployment (it is eps-LDP like ToPL, for the
same reasons: SW at ``threshold_epsilon``, PM or SR at ``epsilon``, one report per reading).

>>> cfg_values = np.arange(3000) % 5.0
>>> ref = ReferenceToPL(epsilon=1.0, bound=64.0, holdout=1000, key=bytes(32))
>>> out = ref.process(cfg_values)
>>> bool(np.isnan(out[:1000]).all()), 0.0 <= ref.theta <= 64.0
(True, True)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from operators.local.piecewise import piecewise_report
from operators.local.square_wave import (
    square_wave_em,
    square_wave_histogram,
    square_wave_parameters,
    square_wave_perturb,
)
from operators.local.stochastic_rounding import stochastic_rounding_report
from operators.noise import Domain, KeyedGenerator

__all__ = ["PM_ABOVE", "ReferenceToPL", "reference_threshold"]

PM_ABOVE = 1.29  # the reference's hm: PM above this eps, SR at or below
_BUCKETS = 1024
_ADDRESS_SW = 1
_ADDRESS_STREAM = 3


def _remove_trailing_zero(hist: np.ndarray) -> np.ndarray:
    """The reference's post-processing of the EM density (``SWMSE.remove_trailing_zero``)."""
    hist = hist.copy()
    hist[hist < hist.sum() / 10000] = 0
    iszero = np.concatenate(([0], (hist == 0).astype(np.int8), [0]))
    runs = np.flatnonzero(np.abs(np.diff(iszero)) == 1).reshape(-1, 2)
    for start, end in runs:
        if end - start >= 5:
            hist[start:] = 0
            break
    mask = hist > 0
    if mask.any():
        hist[mask] += (1.0 - hist.sum()) / mask.sum()
    return hist


def reference_threshold(counts: Any, bound: float, threshold_epsilon: float, epsilon: float, released: int) -> float:
    """The reference's theta from SW report counts over ``[-b, 1 + b]`` (1,024 buckets)."""
    b = square_wave_parameters(threshold_epsilon)[0]
    f, _ = square_wave_em(np.asarray(counts, dtype=np.float64), threshold_epsilon, _BUCKETS, b)
    hist = _remove_trailing_zero(f / f.sum())
    ee = math.exp(epsilon)
    if epsilon > 0.61:
        es = math.exp(epsilon / 2.0)
        std = math.sqrt((es + 3.0) / (3.0 * es * (es - 1.0)) + (ee + 1.0) ** 2 / (es * (ee - 1.0) ** 2))
    else:
        std = (ee + 1.0) / (ee - 1.0)
    bins = np.linspace(0.0, float(bound), _BUCKETS)
    tail_moment = np.cumsum((hist * bins)[::-1])[::-1]
    tail_mass = np.cumsum(hist[::-1])[::-1]
    n = float(released)
    mse = (std * bins) ** 2 * n / 3.0 + n * n / 24.0 * (tail_moment - bins * tail_mass) ** 2
    return float(np.argmin(mse)) / _BUCKETS * float(bound)


class ReferenceToPL:
    """The reference pipeline over one stream: NaN for the holdout ticks, then one unbiased PM or SR report of the
    reading truncated to theta per tick (no smoother). ``released`` is the n of its score (default 2^20)."""

    def __init__(
        self,
        *,
        epsilon: float,
        bound: float,
        holdout: int,
        key: bytes,
        threshold_epsilon: float | None = None,
        released: int = 1 << 20,
    ) -> None:
        self.epsilon, self.bound, self.holdout = float(epsilon), float(bound), int(holdout)
        self.threshold_epsilon = float(threshold_epsilon or epsilon)
        self.released = released
        self._gen = KeyedGenerator(key)
        self._b = square_wave_parameters(self.threshold_epsilon)[0]
        self._counts = np.zeros(_BUCKETS, dtype=np.int64)
        self.theta: float | None = None
        self.ticks = 0

    def process(self, values: Any) -> np.ndarray:
        v = np.clip(np.asarray(values, dtype=np.float64), 0.0, self.bound)
        out = np.full(v.size, np.nan)
        done = 0
        if self.theta is None:
            k = min(v.size, self.holdout - self.ticks)
            if k > 0:
                u = self._gen.uniforms(Domain.LOCAL, _ADDRESS_SW, self.ticks, k)
                y = square_wave_perturb(v[:k] / self.bound, self.threshold_epsilon, u, self._b)
                self._counts += square_wave_histogram(y, self._b, _BUCKETS)
                self.ticks += k
                done = k
            if self.ticks >= self.holdout:
                self.theta = reference_threshold(
                    self._counts, self.bound, self.threshold_epsilon, self.epsilon, self.released
                )
        rest = v.size - done
        if rest:
            if self.theta <= 0.0:  # the reference's candidates include 0: it then reports nothing but 0
                out[done:] = 0.0
            else:
                u = self._gen.uniforms(Domain.LOCAL, _ADDRESS_STREAM, self.ticks, rest)
                report = piecewise_report if self.epsilon > PM_ABOVE else stochastic_rounding_report
                out[done:] = report(v[done:], self.theta, self.epsilon, u)
            self.ticks += rest
        return out

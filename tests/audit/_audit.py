"""The audit's statistics: Clopper-Pearson bounds and a Bonferroni-corrected lower bound on eps.

For a mechanism M claimed eps-DP and neighbouring inputs D0, D1, every event S satisfies
``P(M(D1) in S) <= e^eps P(M(D0) in S)`` and the same with D0 and D1 swapped. From ``n`` samples on each side with
``k0``, ``k1`` hits of S, a one-sided Clopper-Pearson lower bound on ``P(M(D1) in S)`` and upper bound on
``P(M(D0) in S)`` give ``eps_lb = log(p1_lower / p0_upper)``, a lower bound on the true eps that holds with
probability at least ``1 - alpha`` jointly over all events and both directions (Bonferroni: each of the
``4 * events`` one-sided bounds at ``alpha / (4 * events)``). Events must be fixed before the samples are drawn
(here: in advance, or from a separate calibration sample).

>>> lo, hi = clopper_pearson(np.array([50]), 1000, 0.001)
>>> bool(lo[0] < 0.05 < hi[0])
True
>>> round(eps_lower_bound(np.array([100]), np.array([100]), 10_000, 10_000, 0.001), 3)   # same rates: nothing
0.0
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np
from scipy.stats import beta

from operators.hierarchy import ConsistentNoise
from operators.noise import DiscreteLaplace, KeyedGenerator

ALPHA = 1e-3  # per test: the probability that a correct mechanism is flagged


def clopper_pearson(k: np.ndarray, n: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """One-sided Clopper-Pearson bounds, each holding with probability at least ``1 - alpha``."""
    k = np.asarray(k, dtype=np.float64)
    lo = np.where(k > 0, beta.ppf(alpha, k, n - k + 1), 0.0)
    hi = np.where(k < n, beta.ppf(1.0 - alpha, k + 1, n - k), 1.0)
    return lo, hi


def eps_lower_bound(hits0: np.ndarray, hits1: np.ndarray, n0: int, n1: int, alpha: float = ALPHA) -> float:
    """The largest ``log(p_lower / q_upper)`` over the events and both directions (0 if none is positive)."""
    hits0, hits1 = np.atleast_1d(hits0), np.atleast_1d(hits1)
    a = alpha / (4 * hits0.size)
    lo0, hi0 = clopper_pearson(hits0, n0, a)
    lo1, hi1 = clopper_pearson(hits1, n1, a)
    with np.errstate(divide="ignore"):
        ratios = np.concatenate([np.log(lo1 / hi0), np.log(lo0 / hi1)])
    return float(max(0.0, np.nanmax(ratios)))


def event_hits(samples: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """``#{samples >= t}`` for each threshold ``t`` (events of the form "the output is at least t")."""
    s = np.sort(np.asarray(samples, dtype=np.float64))
    return s.size - np.searchsorted(s, np.asarray(thresholds, dtype=np.float64), side="left")


def audit_key(label: str, i: int) -> bytes:
    """A distinct key per sample: the hash of a label and a counter."""
    return hashlib.sha256(f"tops-audit/{label}/{i}".encode()).digest()


# -- the one place that knows how raw noise is drawn and parametrised ---------------------------------------------
# The audits read raw noise and build deliberately broken variants only through these functions, so that a change of
# the sampler's API (operators/noise.py, operators/hierarchy.py) is adapted here and nowhere else in tests/audit/.


def discrete_laplace(
    gen: KeyedGenerator, domain: int, address: int, start: int, count: int, *, epsilon: float, sensitivity: float
) -> np.ndarray:
    """Raw integer discrete Laplace noise that is ``epsilon``-DP for ``sensitivity`` (quantized units)."""
    return gen.discrete_laplace(domain, address, start, count, DiscreteLaplace(epsilon, sensitivity))


def node_noise(op, layer: int, trees: Iterable[int], count: int) -> np.ndarray:
    """The raw noise ``N(x)`` that ``op``'s hierarchy (a ``ToPS`` after its threshold is known) draws for the first
    ``count`` nodes of ``layer`` (0 = leaves) of each tree in ``trees``: shape ``(len(trees), count)``."""
    walk = op._noise
    rows = [
        ConsistentNoise(
            op._gen, fanout=walk.b, layers=walk.layers, top_nodes=walk.top_nodes, noise=walk.noise, tree=int(t)
        )._raw(layer, 0, count)
        for t in trees
    ]
    return np.array(rows, dtype=np.int64).reshape(-1, count)


def scale_noise_epsilon(noise, factor: float) -> None:
    """A broken variant: ``noise`` (a ``ConsistentNoise`` walk or a baseline operator) draws every sample at ``factor``
    times its epsilon (the scale ``sensitivity / epsilon`` divided by ``factor``). Call it before any noise is drawn."""
    dl = noise.noise
    noise.noise = DiscreteLaplace(epsilon=dl.epsilon * factor, sensitivity=dl.sensitivity)

"""Audit of the hierarchies on neighbouring streams: one tick moved from 0 to theta (fixed public theta, small r).

Trees are independent (each has its own noise address), so one long stream of T trees gives T independent samples
of the one-tree mechanism: D0 is all zeros, D1 has theta at the first tick of every tree. The statistic is a fixed
function of the released output (the first tick's release, the first leaf's released sum, or the sum of the nodes
that contain the tick); the events are "statistic >= t" with t fixed in advance or taken from a separate calibration
run on another key.
"""

from __future__ import annotations

import numpy as np
import pytest

from operators import ToPS, ToPSConfig
from operators.baselines import Hierarchy
from operators.noise import DiscreteLaplace
from tests.audit._audit import audit_key, eps_lower_bound, event_hits

EPS = 1.0


def _streams(trees: int, r: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    d0 = np.zeros(trees * r)
    d1 = d0.copy()
    d1[::r] = theta
    return d0, d1


def _tops_stat(cfg: ToPSConfig, x: np.ndarray, key: bytes, leaf: int) -> np.ndarray:
    """The released sum of the first leaf (``leaf`` ticks) of every tree."""
    rel = ToPS(cfg, key).process(x).reshape(-1, cfg.query_range)
    return rel[:, :leaf].sum(axis=1)


@pytest.mark.slow
@pytest.mark.parametrize(("fanout", "r", "s"), [(4, 16, 0), (4, 64, 1), (2, 8, 0)])
def test_tops_on_neighbouring_streams(fanout: int, r: int, s: int) -> None:
    """ToPS's consistent tree (s = 0: H16c-like; s = 1: with the Recent smoother): eps_lb <= eps."""
    trees = 10_000
    cfg = ToPSConfig(epsilon=EPS, bound=1, theta=1, query_range=r, fanout=fanout, smoother_layers=s)
    leaf = fanout**s
    d0, d1 = _streams(trees, r, 1.0)
    calib = _tops_stat(cfg, d1, audit_key(f"tops-calib-{r}", 0), leaf)
    t = np.quantile(calib, [0.5, 0.9, 0.99])
    x0 = _tops_stat(cfg, d0, audit_key(f"tops-0-{r}", 0), leaf)
    x1 = _tops_stat(cfg, d1, audit_key(f"tops-1-{r}", 0), leaf)
    lb = eps_lower_bound(event_hits(x0, t), event_hits(x1, t), trees, trees)
    assert lb <= EPS
    assert lb > 0.1  # the statistic does see the change: the audit is not vacuous


def _h2_stat(x: np.ndarray, key: bytes, *, noise_scale: float = 1.0) -> np.ndarray:
    """Leaf + parent of the first tick of every tree of H2 with r = 4 (h = 2 layers at eps/2 each)."""
    op = Hierarchy(ToPSConfig(epsilon=EPS, bound=1, theta=1, query_range=4), key, fanout=2)
    if noise_scale != 1.0:  # the deliberately broken version: noise scale multiplied by noise_scale
        op.noise = DiscreteLaplace(epsilon=EPS / op.layers, sensitivity=noise_scale)
    op.process(x)
    leaves, parents = op.node_values()
    return leaves[::4] + parents[::2]


@pytest.mark.parametrize(("noise_scale", "flagged"), [(1.0, False), (0.5, True)])
def test_h2_on_neighbouring_streams(noise_scale: float, flagged: bool) -> None:
    """H2 without consistency: correct noise gives eps_lb <= eps (about 0.7 eps at these events); half the noise
    scale (true eps = 2) is flagged."""
    trees = 60_000
    d0, d1 = _streams(trees, 4, 1.0)
    t = np.array([2, 4, 6])
    x0 = _h2_stat(d0, audit_key(f"h2-0-{noise_scale}", 0), noise_scale=noise_scale)
    x1 = _h2_stat(d1, audit_key(f"h2-1-{noise_scale}", 0), noise_scale=noise_scale)
    lb = eps_lower_bound(event_hits(x0, t), event_hits(x1, t), trees, trees)
    if flagged:
        assert lb > EPS
    else:
        assert 0.5 * EPS <= lb <= EPS

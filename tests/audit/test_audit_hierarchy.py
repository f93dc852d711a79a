"""Audit of the H2 baseline on neighbouring streams: one tick moved from 0 to theta (fixed public theta, small r).

Trees are independent (each has its own noise address), so one long stream of T trees gives T independent samples
of the one-tree mechanism: D0 is all zeros, D1 has theta at the first tick of every tree. The statistic is the sum
of the nodes that contain the tick; the events are "statistic >= t" with t fixed in advance. ToPS's own tree is
audited in test_audit_tops.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from operators import ToPSConfig
from operators.baselines import Hierarchy
from tests.audit._audit import audit_key, eps_lower_bound, event_hits, scale_noise_epsilon

EPS = 1.0


def _streams(trees: int, r: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    d0 = np.zeros(trees * r)
    d1 = d0.copy()
    d1[::r] = theta
    return d0, d1


def _h2_stat(x: np.ndarray, key: bytes, *, noise_scale: float = 1.0) -> np.ndarray:
    """Leaf + parent of the first tick of every tree of H2 with r = 4 (h = 2 layers at eps/2 each)."""
    op = Hierarchy(ToPSConfig(epsilon=EPS, bound=1, theta=1, query_range=4), key, fanout=2)
    if noise_scale != 1.0:  # the deliberately broken version: noise scale multiplied by noise_scale
        scale_noise_epsilon(op, 1.0 / noise_scale)
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

"""Independent reference implementations for tests: the whole-tree offline computations, written plainly."""

from __future__ import annotations

import math

import numpy as np

from operators.noise import DiscreteLaplace, Domain, KeyedGenerator


def whole_tree_noise(
    gen: KeyedGenerator, *, tree: int, fanout: int, layers: int, top_nodes: int, noise: DiscreteLaplace
):
    """Raw noise of every node of one tree, layer 0 (leaves) first, drawn in one go per layer."""
    out = []
    for j in range(layers):
        n = top_nodes * fanout ** (layers - 1 - j)
        out.append(gen.discrete_laplace((int(Domain.HIERARCHY) << 16) | j, tree, 0, n, noise).astype(np.float64))
    return out


def hay_offline(noise: list[np.ndarray], fanout: int) -> np.ndarray:
    """Hay et al.'s two passes on a whole forest of complete subtrees; returns the consistent leaves."""
    b = fanout
    L = len(noise)
    z = [noise[0].copy()]
    for j in range(1, L):
        height = j + 1
        a_l = (b**height - b ** (height - 1)) / (b**height - 1)
        z.append(a_l * noise[j] + (1 - a_l) * z[j - 1].reshape(-1, b).sum(axis=1))
    c = z[L - 1].copy()
    for j in range(L - 2, -1, -1):
        parent_sum = z[j].reshape(-1, b).sum(axis=1)
        c = z[j] + np.repeat((c - parent_sum) / b, b)
    return c


def noise_with_a(a: float) -> DiscreteLaplace:
    """The discrete Laplace of parameter about ``a`` (``epsilon = -ln a``, sensitivity 1), for shape tests."""
    return DiscreteLaplace(epsilon=-math.log(a), sensitivity=1)

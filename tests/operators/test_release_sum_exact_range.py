"""The range where "consistent noise on the 1/1024 grid + integer true sum is exact in float64" holds, and
its refusal in ToPSConfig (operators.hierarchy.exact_range_problem)."""

from __future__ import annotations

import numpy as np
import pytest

from operators.config import ConfigError, ToPSConfig
from operators.hierarchy import MAX_LEAF_UNITS, ConsistentNoise, round_to_grid
from operators.noise import DiscreteLaplace, KeyedGenerator

KEY = bytes(range(32))


class _Coupled(ConsistentNoise):
    """Node noise shifted by ``delta`` on every node of leaf ``path_leaf``'s path: in exact arithmetic the consistent
    noise of that leaf moves by ``delta`` and no other leaf moves (the coupling of the DP proof)."""

    path_leaf = 0
    delta = 0

    def _raw(self, layer: int, start: int, count: int) -> np.ndarray:
        x = super()._raw(layer, start, count)
        i = self.path_leaf // self.b**layer
        if start <= i < start + count:
            x = x.copy()
            x[i - start] += self.delta
        return x


def _moved(scale: float, delta: int, *, b: int, layers: int, top: int) -> int:
    n = top * b ** (layers - 1)
    dl = DiscreteLaplace(epsilon=1.0, sensitivity=scale)
    base = ConsistentNoise(KeyedGenerator(KEY), fanout=b, layers=layers, top_nodes=top, noise=dl).next_leaves(n)
    walk = _Coupled(KeyedGenerator(KEY), fanout=b, layers=layers, top_nodes=top, noise=dl)
    walk.path_leaf, walk.delta = 1234 % n, delta
    d = walk.next_leaves(n) - base
    d[walk.path_leaf] -= delta
    return int(np.count_nonzero(d))


@pytest.mark.parametrize(("b", "layers", "top"), [(16, 3, 16), (4, 6, 4), (2, 12, 2)])
def test_coupling_is_exact_at_the_edge_of_the_accepted_range(b: int, layers: int, top: int) -> None:
    """Noise scale up to 2^30 and a leaf change up to 2^36 - 5 units: every other leaf's rounded consistent
    noise is unchanged and the leaf moves by exactly the change."""
    for scale in (2.0**10, 2.0**30):
        for delta in (3, 1_000_003, MAX_LEAF_UNITS - 5):
            assert _moved(scale, delta, b=b, layers=layers, top=top) == 0


def test_release_sum_is_exact_inside_and_moves_outside() -> None:
    """S + round(c) - S == round(c) for leaf sums up to 2^36 and noise of scale 2^36; with leaf sums of 2^45 units
    (outside, refused) the float sum drops grid bits, so a release would move with the data."""
    dl = DiscreteLaplace(epsilon=1.0, sensitivity=2.0**36)
    c = round_to_grid(KeyedGenerator(KEY).discrete_laplace(1, 0, 0, 20_000, dl) / 3.0)
    assert np.count_nonzero(c != np.rint(c))  # the grid bits are in use
    inside = float(MAX_LEAF_UNITS)
    assert np.array_equal((inside + c) - inside, c)
    outside = float(2**45 + 1)
    assert np.count_nonzero((outside + c) - outside != c) > 1000


def test_configurations_outside_the_range_are_refused() -> None:
    """One line naming the quantity and the limit; the edge itself is accepted."""
    # defaults: fanout 16, query_range 2^20 -> h = 5, a leaf covers at most 16^4 ticks
    edge = MAX_LEAF_UNITS / 16**4
    ToPSConfig(epsilon=1.0, bound=edge)
    with pytest.raises(ConfigError, match=r"fanout\^\(h-1\).*2\^36") as exc:
        ToPSConfig(epsilon=1.0, bound=2 * edge)
    assert "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match="resolution"):
        ToPSConfig(epsilon=1.0, bound=500, resolution=500 / (2 * edge))
    with pytest.raises(ConfigError, match="noise scale"):
        ToPSConfig(epsilon=1e-9, bound=500)
    with pytest.raises(ConfigError, match="noise scale"):
        ToPSConfig(epsilon=2000.0, bound=500)

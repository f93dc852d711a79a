"""The lazy consistent noise of the perturber against Hay et al.'s offline two passes on the whole tree."""

from __future__ import annotations

import numpy as np
import pytest

from operators.hierarchy import ConsistentNoise, round_to_grid
from operators.noise import KeyedGenerator
from tests.reference import hay_offline, noise_with_a, whole_tree_noise

SHAPES = [(2, 4, 2), (4, 5, 4), (16, 2, 16), (16, 3, 16), (16, 4, 16), (4, 3, 2), (8, 3, 4), (3, 1, 3)]


def _batches(total: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    out, done = [], 0
    while done < total:
        k = int(min(total - done, rng.choice([1, 2, 7, 16, 100, 4096, 70000])))
        out.append(k)
        done += k
    return out


@pytest.mark.parametrize(("b", "layers", "top"), SHAPES)
def test_lazy_equals_offline_two_passes_node_for_node(b: int, layers: int, top: int) -> None:
    """Every leaf's consistent noise, produced lazily in random batches over two trees, equals the whole-tree
    computation of the same noise to 1e-9 (and exactly after rounding to the release grid)."""
    gen = KeyedGenerator(bytes(range(32)))
    a = noise_with_a(0.93)
    n = top * b ** (layers - 1)
    walk = ConsistentNoise(gen, fanout=b, layers=layers, top_nodes=top, noise=a)
    lazy = np.concatenate(
        [walk.next_leaves(k, rounded=False) for k in _batches(2 * n, seed=b * 100 + layers)]
    )
    offline = np.concatenate(
        [
            hay_offline(whole_tree_noise(gen, tree=t, fanout=b, layers=layers, top_nodes=top, noise=a), b)
            for t in (0, 1)
        ]
    )
    assert lazy.shape == offline.shape
    np.testing.assert_allclose(lazy, offline, rtol=0, atol=1e-9)
    walk2 = ConsistentNoise(gen, fanout=b, layers=layers, top_nodes=top, noise=a)
    rounded = np.concatenate([walk2.next_leaves(k) for k in _batches(2 * n, seed=7)])
    assert np.array_equal(rounded, round_to_grid(lazy))


def test_consistency_holds_on_the_whole_tree() -> None:
    """The consistent leaves of a subtree add up to the consistent value of its root (a check of the reference)."""
    gen = KeyedGenerator(bytes(32))
    noise = whole_tree_noise(gen, tree=0, fanout=4, layers=3, top_nodes=4, noise=noise_with_a(0.8))
    leaves = hay_offline(noise, 4)
    # the top nodes' consistent value is their bottom-up z; the leaves under each must add up to it
    z1 = 0.8 * 0 + noise[0]  # leaves' z
    a2 = (16 - 4) / 15
    z2 = a2 * noise[1] + (1 - a2) * z1.reshape(-1, 4).sum(axis=1)
    a3 = (64 - 16) / 63
    z3 = a3 * noise[2] + (1 - a3) * z2.reshape(-1, 4).sum(axis=1)
    np.testing.assert_allclose(leaves.reshape(4, 16).sum(axis=1), z3, atol=1e-9)


def test_each_tree_has_fresh_noise() -> None:
    """Tree t + 1 does not repeat tree t: its noise comes from another address of the keyed generator."""
    gen = KeyedGenerator(bytes(32))
    walk = ConsistentNoise(gen, fanout=4, layers=3, top_nodes=4, noise=noise_with_a(0.9))
    trees = walk.next_leaves(64 * 3).reshape(3, 64)
    assert not np.array_equal(trees[0], trees[1])
    assert not np.array_equal(trees[1], trees[2])
    assert walk.tree == 2


def test_state_does_not_grow_with_the_range() -> None:
    """O(b h) numbers between calls: the state of r = 2^20 is a few hundred bytes, not the tree."""
    gen = KeyedGenerator(bytes(32))
    walk = ConsistentNoise(gen, fanout=16, layers=5, top_nodes=16, noise=noise_with_a(0.99))
    walk.next_leaves(12345)
    assert walk.state_nbytes() < 1024


class CountingGenerator(KeyedGenerator):
    """A keyed generator that counts the samples drawn from it."""

    __slots__ = ("drawn",)

    def __init__(self, key: bytes) -> None:
        super().__init__(key)
        self.drawn = 0

    def discrete_laplace(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = super().discrete_laplace(*args, **kwargs)
        self.drawn += out.size
        return out


def test_a_tree_start_regenerates_the_top_node_over_the_next_leaf_not_the_whole_tree() -> None:
    """Each top node's z depends on its own subtree only: the first leaf of a tree of R = 4 top nodes draws that top
    node's subtree, not the whole tree, and the leaves come out as before."""
    b, layers, top = 4, 3, 4
    gen = CountingGenerator(bytes(32))
    walk = ConsistentNoise(gen, fanout=b, layers=layers, top_nodes=top, noise=noise_with_a(0.9))
    first = walk.next_leaves(1)
    # the top node's subtree (its z), its children's subtrees again as it is entered, then its first child's leaves;
    # the whole tree (84 nodes) is never drawn at once
    assert gen.drawn == (1 + b + b * b) + b * (1 + b) + b
    rest = walk.next_leaves(top * b * b - 1)
    whole = ConsistentNoise(KeyedGenerator(bytes(32)), fanout=b, layers=layers, top_nodes=top,
                            noise=noise_with_a(0.9)).next_leaves(top * b * b)
    assert np.array_equal(np.concatenate([first, rest]), whole)

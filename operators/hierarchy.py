"""The perturber's noise: an online b-ary hierarchy with noise drawn ahead and made consistent (Wang et al., CCS 2021,
App. C).

A tree covers ``r`` released ticks and keeps ``L = h - s`` layers; layer ``j`` (0 = leaves) has nodes of
``b^(s+j)`` ticks and ``r / b^(s+j)`` nodes; the top layer has ``R = r / b^(h-1)`` nodes, each the root of its own
subtree. Every node gets integer discrete-Laplace noise ``N(x)`` at ``eps / L`` from the keyed generator, addressed by
(tree, layer, index). Hay et al.'s two passes run on the noise alone (Theorem C.1: adding the consistent noise of a
leaf to the true leaf sum equals the offline consistent tree):

* bottom-up, height ``l = j + 1``: ``z(x) = a_l N(x) + (1 - a_l) * sum z(children)``,
  ``a_l = (b^l - b^(l-1)) / (b^l - 1)`` (leaves: ``a_1 = 1``);
* top-down: ``c(x) = z(x)`` for a top node, else ``c(x) = z(x) + (c(parent) - sum z(children of parent)) / b``.

**Lazily, with O(b h) state.** For every layer the walk keeps the ``z`` of the children of the current ancestor and
that ancestor's consistent value ``c``. Entering a node regenerates its children's subtrees from the keyed generator
to get their ``z`` (O(h) draws per leaf amortized; a burst of O(r / (R b^s)) draws when a top node starts: only the
top node over the next leaf is regenerated, each top node's ``z`` depending on its own subtree alone). A run of complete
subtrees is produced in bulk (bottom-up then top-down over the whole subtree). Every ``z`` and ``c`` is computed by
the same compiled arithmetic in the same order whatever the path, so the output equals the whole-tree computation
bit for bit, however the ticks are batched.

>>> from operators.noise import DiscreteLaplace, KeyedGenerator
>>> dl = DiscreteLaplace(epsilon=0.7, sensitivity=1)
>>> walk = ConsistentNoise(KeyedGenerator(bytes(32)), fanout=4, layers=3, top_nodes=4, noise=dl)
>>> one_by_one = np.concatenate([walk.next_leaves(1) for _ in range(64)])
>>> walk2 = ConsistentNoise(KeyedGenerator(bytes(32)), fanout=4, layers=3, top_nodes=4, noise=dl)
>>> bool((walk2.next_leaves(64) == one_by_one).all())     # batching never changes a bit
True
>>> walk.tree, walk.leaf                                   # one tree of 4 * 4^2 leaves done
(0, 64)
>>> _ = walk.next_leaves(1); walk.tree, walk.leaf          # the next tree starts with fresh noise
(1, 1)
"""

from __future__ import annotations

import functools

import numpy as np

from operators.noise import DiscreteLaplace, Domain, KeyedGenerator

__all__ = [
    "MAX_LEAF_UNITS",
    "MAX_NOISE_SCALE",
    "RELEASE_GRID",
    "ConsistentNoise",
    "exact_range_problem",
    "layer_weight",
    "round_to_grid",
]

RELEASE_GRID = 1024.0  # releases are multiples of 1/1024 quantized units
_CHUNK_LEAVES = 4096  # bulk work is done on subtrees of at most this many leaves
MAX_LEAF_UNITS = 2**36  # largest true leaf sum (quantized units) accepted: see exact_range_problem
MAX_NOISE_SCALE = 2**36  # largest node-noise scale the exact sampler takes (operators.noise)


def exact_range_problem(bound_units: float, epsilon: float, fanout: int, height: int) -> str | None:
    """Why a configuration is outside the range where the rounding argument is exact, or None.

    A release of a leaf is ``S + round_to_grid(c)``: ``S`` the true leaf sum (an integer, at most ``B/res * b^(h-1)``
    units since a leaf covers at most ``b^(h-1)`` ticks) and ``c`` the consistent noise, computed from the noise only
    and rounded to multiples of 2^-10. The sum is exact in float64 while ``|S| + |c| < 2^43`` (53 bits minus the 10
    of the grid). We require ``|S| <= 2^36``; the noise scale is at most ``B/res * h / eps <= 2^36`` (the sampler's
    range), so ``|c| >= 2^42`` has probability below ``exp(-64)`` per node. Within this range the coupled noise
    (node noise shifted along one leaf's path by that leaf's change) leaves every other leaf's rounded noise
    unchanged in all our measurements (tests/operators/test_release_sum_exact_range.py).
    """
    leaf_units = bound_units * fanout ** (height - 1)
    if leaf_units > MAX_LEAF_UNITS:
        return (
            f"bound / resolution * fanout^(h-1) = {leaf_units:.4g} exceeds 2^36: leaf sums would not be exact on the "
            "1/1024 release grid in float64 (raise resolution, lower bound or query_range)"
        )
    scale = bound_units * height / epsilon
    if scale > MAX_NOISE_SCALE:
        return (
            f"noise scale bound / resolution * h / epsilon = {scale:.4g} exceeds 2^36, the range of the exact discrete "
            "Laplace sampler (raise epsilon or resolution, or lower bound)"
        )
    if 1.0 / epsilon < 2.0**-10:
        return (
            f"epsilon = {epsilon:.4g} is above 1024: the noise scale (sensitivity / epsilon, down to 1 / epsilon) "
            "would fall below 2^-10, the range of the exact discrete Laplace sampler (lower epsilon)"
        )
    return None


def layer_weight(height: int, fanout: int) -> float:
    """``a_l = (b^l - b^(l-1)) / (b^l - 1)`` of Hay et al.'s bottom-up pass (``a_1 = 1``)."""
    return (fanout**height - fanout ** (height - 1)) / (fanout**height - 1)


@functools.cache
def _layer_weights(layers: int, fanout: int) -> tuple[float, ...]:
    """``a_1 .. a_layers`` (:func:`layer_weight`), one read-only tuple per shape shared by every walk."""
    return tuple(layer_weight(j + 1, fanout) for j in range(layers))


def _child_sums(zchild: np.ndarray, b: int) -> np.ndarray:
    """Sum of each run of ``b`` children, added strictly left to right (the same bits whatever the batch)."""
    z = zchild.reshape(-1, b)
    s = z[:, 0].copy()
    for k in range(1, b):
        s += z[:, k]
    return s


def _combine(raw: np.ndarray, zchild: np.ndarray, b: int, a: float) -> np.ndarray:
    """Bottom-up step: ``z = a N + (1 - a) * sum z(children)``."""
    return a * raw.astype(np.float64) + (1.0 - a) * _child_sums(zchild, b)


def _top_down(zchild: np.ndarray, cparent: np.ndarray, b: int) -> np.ndarray:
    """Top-down step: ``c(x) = z(x) + (c(parent) - sum z(siblings)) / b`` for all children of ``cparent``."""
    return zchild + np.repeat((cparent - _child_sums(zchild, b)) / b, b)


def round_to_grid(x: np.ndarray | float) -> np.ndarray:
    """Round to the release grid (multiples of 1/1024 unit). Applied to consistent noise, which depends only on
    noise, so adding it to an integer true sum is exact in float64 and no float rounding can depend on the data."""
    return np.rint(np.asarray(x, dtype=np.float64) * RELEASE_GRID) / RELEASE_GRID


class ConsistentNoise:
    """The consistent leaf noise of a sequence of trees, produced left to right with O(b h) state.

    Parameters
    ----------
    gen
        The stream's keyed generator.
    fanout
        b.
    layers
        L = h - s, the layers kept in the tree.
    top_nodes
        R, the nodes of the top layer (each a subtree root).
    noise
        The discrete Laplace of every node's noise (``epsilon = eps / L``, ``sensitivity`` = theta in units).
    """

    def __init__(
        self,
        gen: KeyedGenerator,
        *,
        fanout: int,
        layers: int,
        top_nodes: int,
        noise: DiscreteLaplace,
        tree: int = 0,
        leaf: int = 0,
    ) -> None:
        self._gen = gen
        self.b = fanout
        self.layers = layers
        self.top_nodes = top_nodes
        self.noise = noise
        self.leaves_per_tree = top_nodes * fanout ** (layers - 1)
        self._weights = _layer_weights(layers, fanout)
        self.tree = tree
        self.leaf = leaf
        self._invalidate()

    # -- state --------------------------------------------------------------------------------------------------
    def _invalidate(self) -> None:
        L = self.layers
        self._top_z: np.ndarray | None = None  # z of the R top nodes of the current tree (NaN: not computed yet)
        self._zc: list[np.ndarray | None] = [None] * L  # _zc[j]: z of the children of the layer-j ancestor
        self._cons = [0.0] * L  # consistent value of the layer-j ancestor
        self._cur = [-1] * L  # index of the current layer-j ancestor (-1: not entered)

    def state(self) -> dict[str, int]:
        """The position of the walk; everything else is regenerated from the key on restore."""
        return {"tree": self.tree, "leaf": self.leaf}

    def state_nbytes(self) -> int:
        """Bytes of numeric state held between calls (the O(b h) path; docs/how-it-works.md)."""
        arrays = [self._top_z, *self._zc]
        return sum(x.nbytes for x in arrays if x is not None) + 8 * 3 * self.layers + 16

    # -- noise --------------------------------------------------------------------------------------------------
    def _raw(self, layer: int, start: int, count: int) -> np.ndarray:
        domain = (int(Domain.HIERARCHY) << 16) | layer
        return self._gen.discrete_laplace(domain, self.tree, start, count, self.noise)

    def _subtree_z(self, j: int, i0: int, n: int) -> np.ndarray:
        """Bottom-up ``z`` of nodes ``[i0, i0 + n)`` of layer ``j`` (regenerates their whole subtrees)."""
        b = self.b
        if j == 0:
            return self._raw(0, i0, n).astype(np.float64)
        if n * b**j <= _CHUNK_LEAVES:
            z = self._raw(0, i0 * b**j, n * b**j).astype(np.float64)
            for k in range(1, j + 1):
                z = _combine(self._raw(k, i0 * b ** (j - k), n * b ** (j - k)), z, b, self._weights[k])
            return z
        nchild = n * b
        per = max(1, _CHUNK_LEAVES // b ** (j - 1))
        zchild = np.empty(nchild, dtype=np.float64)
        for c0 in range(0, nchild, per):
            cnt = min(per, nchild - c0)
            zchild[c0 : c0 + cnt] = self._subtree_z(j - 1, i0 * b + c0, cnt)
        return _combine(self._raw(j, i0, n), zchild, b, self._weights[j])

    def _child_cons(self, parent_layer: int, child_index: int) -> float:
        """Consistent value of a child of the current ancestor at ``parent_layer`` (``layers`` = virtual root)."""
        if parent_layer == self.layers:
            return self._top_node_z(child_index)
        # the same arithmetic as the bulk path, so both give identical bits
        cons = _top_down(self._zc[parent_layer], np.array([self._cons[parent_layer]]), self.b)
        return float(cons[child_index % self.b])

    def _top_node_z(self, i: int) -> float:
        """``z`` of top node ``i`` (a top node's consistent value), from its own subtree when first asked for."""
        top = self._top_z
        if top is None:
            top = self._top_z = np.full(self.top_nodes, np.nan)
        if np.isnan(top[i]):
            top[i] = self._subtree_z(self.layers - 1, i, 1)[0]
        return float(top[i])

    def _enter(self, j: int, i: int) -> None:
        """Make node ``i`` of layer ``j >= 1`` the current ancestor: its consistent value and its children's z."""
        self._cons[j] = self._child_cons(j + 1, i)
        zc = self._subtree_z(j - 1, i * self.b, self.b)
        self._zc[j] = zc
        self._cur[j] = i
        for k in range(1, j):
            self._cur[k] = -1

    def _ensure_path(self, pos: int, down_to: int) -> None:
        """Enter the ancestors of leaf ``pos`` from the top layer down to layer ``down_to``."""
        for j in range(self.layers - 1, down_to - 1, -1):
            i = pos // self.b**j
            if self._cur[j] != i:
                self._enter(j, i)

    def _bulk(self, j: int, i: int) -> np.ndarray:
        """Consistent noise of every leaf under node ``i`` of layer ``j``; ancestors above ``j`` are entered."""
        b = self.b
        cons = np.array([self._child_cons(j + 1, i)])
        zs = [self._raw(0, i * b**j, b**j).astype(np.float64)]
        for k in range(1, j):
            zs.append(_combine(self._raw(k, i * b ** (j - k), b ** (j - k)), zs[-1], b, self._weights[k]))
        for k in range(j - 1, -1, -1):
            cons = _top_down(zs[k], cons, b)
        for k in range(1, j + 1):
            self._cur[k] = -1
        return cons

    # -- the walk -----------------------------------------------------------------------------------------------
    def next_leaves(self, count: int, *, rounded: bool = True) -> np.ndarray:
        """The consistent noise of the next ``count`` leaves, rounded to the release grid; trees roll over.

        ``rounded=False`` gives the exact float64 consistent noise (for tests against the offline two passes).
        """
        out = np.empty(count, dtype=np.float64)
        done = 0
        while done < count:
            if self.leaf == self.leaves_per_tree:
                self.tree += 1
                self.leaf = 0
                self._invalidate()
            take = min(count - done, self.leaves_per_tree - self.leaf)
            out[done : done + take] = self._in_tree(self.leaf, self.leaf + take)
            self.leaf += take
            done += take
        return round_to_grid(out) if rounded else out

    def _in_tree(self, start: int, end: int) -> np.ndarray:
        b, L = self.b, self.layers
        if L == 1:
            if self._top_z is None:
                self._top_z = self._subtree_z(0, 0, self.top_nodes)
            return self._top_z[start:end].copy()
        parts = []
        pos = start
        while pos < end:
            # the largest complete subtree (layer J <= L - 1, at most a chunk) that starts at pos and fits
            J = 0
            while (
                J + 1 <= L - 1
                and pos % b ** (J + 1) == 0
                and pos + b ** (J + 1) <= end
                and b ** (J + 1) <= _CHUNK_LEAVES
            ):
                J += 1
            if J >= 1:
                self._ensure_path(pos, J + 1)
                parts.append(self._bulk(J, pos // b**J))
                pos += b**J
                continue
            self._ensure_path(pos, 1)
            stop = min(end, (pos // b + 1) * b)
            zc = self._zc[1]
            corr_all = _top_down(zc, np.array([self._cons[1]]), b)
            parts.append(corr_all[pos % b : pos % b + (stop - pos)])
            pos = stop
        return np.concatenate(parts)

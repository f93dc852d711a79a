"""Many releasing ToPS streams as columns, and one compiled pass over a batch of their readings (issue 13).

Seed 001's perturber with the Recent smoother (Algorithm 1, Appendix D) needs, per stream and between readings, only
a handful of numbers: theta, the leaf width ``w = b^s``, the open leaf's position and truncated sum, the current
prediction, and the consistent noise of the next leaves. :class:`ColumnarRelease` keeps those as arrays, a stream is
a row, and :func:`operators._columnar_kernel.release_batch` runs a batch of ``(row, value)`` pairs of many streams in
one compiled loop. The noise stays what ToPS draws: the row's own :class:`~operators.hierarchy.ConsistentNoise`
walk, keyed by the stream's ChaCha20 generator, produces the consistent noise of ``ahead`` leaves at a time into
the row's buffer (drawn ahead, never redrawn). Every release is bit-identical to :meth:`operators.tops.ToPS.process`
on the same stream (tested on interleaved streams across refills and tree roll-overs).

:meth:`ColumnarRelease.operator` writes a row's state back into its ToPS object (the walk set to the leaves
actually used, the drawn-ahead rest regenerated later from the key), so its snapshot and restore are ToPS's own.

>>> import numpy as np
>>> from operators.tops import ToPS
>>> from operators.config import ToPSConfig
>>> cfg = ToPSConfig(epsilon=1.0, bound=10, theta=4, query_range=64, fanout=4, smoother_layers=1)
>>> cols = ColumnarRelease(capacity=2)
>>> a, b = cols.add(ToPS(cfg, bytes(32))), cols.add(ToPS(cfg, bytes([1]) * 32))
>>> out = cols.process(np.array([a, b, a, a, b]), np.array([1.0, 2.0, 3.0, 12.0, -1.0]))
>>> ref = ToPS(cfg, bytes(32)).process(np.array([1.0, 3.0, 12.0]))
>>> bool(np.array_equal(out[[0, 2, 3]], ref))
True
>>> cols.operator(a).clamped, cols.operator(b).clamped
(1, 1)
"""

from __future__ import annotations

import numpy as np

from operators.tops import ToPS

__all__ = ["ColumnarRelease", "columnar_eligible"]


def columnar_eligible(op: ToPS) -> bool:
    """Whether a ToPS stream can be a row: releasing, the Recent smoother, no lower bound."""
    return (isinstance(op, ToPS) and op.phase == "releasing" and op.config.smoother == "recent"
            and op.config.lower == 0)


class ColumnarRelease:
    """Releasing ToPS streams as rows of arrays; :meth:`process` releases a batch of readings of any of them."""

    def __init__(self, capacity: int = 1024, *, ahead: int = 16) -> None:
        if ahead < 1 or capacity < 1:
            msg = "capacity and ahead must be at least 1"
            raise ValueError(msg)
        self.ahead = ahead
        self.rows = 0
        self._ops: list[ToPS] = []
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        def grow(old: np.ndarray | None, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
            new = np.zeros(shape, dtype=dtype)
            if old is not None:
                new[: old.shape[0]] = old
            return new

        old = getattr(self, "theta", None) is not None
        g = (lambda name: getattr(self, name)) if old else (lambda name: None)
        for name in ("theta", "width", "pos", "leaf_sum", "ticks", "clamped", "bound_units", "head", "avail",
                     "drawn"):
            setattr(self, name, grow(g(name), np.int64, (capacity,)))
        for name in ("pred", "bound", "resolution"):
            setattr(self, name, grow(g(name), np.float64, (capacity,)))
        self.noise = grow(g("noise"), np.float64, (capacity, self.ahead))
        self.capacity = capacity

    def nbytes(self) -> int:
        """Bytes of the columns per row (the walks' own O(b h) state is in the ToPS objects)."""
        return 13 * 8 + 8 * self.ahead

    def add(self, op: ToPS) -> int:
        """Make a releasing ToPS stream a row (its later readings must all go through this store until
        :meth:`operator` gives it back)."""
        if not columnar_eligible(op):
            msg = "only releasing ToPS streams with the recent smoother and lower = 0 become rows"
            raise ValueError(msg)
        if self.rows == self.capacity:
            self._alloc(2 * self.capacity)
        r = self.rows
        st, cfg = op._smoother, op.config
        self.theta[r] = op.theta_units
        self.width[r] = st.leaf_ticks
        self.pos[r] = st.pos
        self.leaf_sum[r] = st.leaf_sum
        self.pred[r] = st.pred
        self.ticks[r] = op.ticks
        self.clamped[r] = op.clamped
        self.bound[r] = cfg.bound
        self.bound_units[r] = op._bound_units
        self.resolution[r] = cfg.resolution
        self.head[r] = self.avail[r] = 0
        self.drawn[r] = op._noise.tree * op._noise.leaves_per_tree + op._noise.leaf  # leaves the walk has produced
        self._ops.append(op)
        self.rows += 1
        return r

    def _refill(self, r: int) -> None:
        walk = self._ops[r]._noise
        k = self.ahead
        self.noise[r, :k] = walk.next_leaves(k)
        self.drawn[r] += k
        self.head[r] = 0
        self.avail[r] = k

    def process(self, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """The release of every reading (``values[i]`` of stream ``rows[i]``), in order."""
        from operators._columnar_kernel import release_batch

        rows = np.ascontiguousarray(rows, dtype=np.int64)
        values = np.ascontiguousarray(values, dtype=np.float64)
        if rows.shape != values.shape or rows.ndim != 1:
            msg = "rows and values must be 1-D arrays of one length"
            raise ValueError(msg)
        if rows.size and (rows.min() < 0 or rows.max() >= self.rows):
            msg = "unknown row"
            raise ValueError(msg)
        if values.size and not np.isfinite(values).all():
            msg = "readings must be finite numbers"
            raise ValueError(msg)
        out = np.empty(rows.size, dtype=np.float64)
        i = 0
        while i < rows.size:
            i = release_batch(rows, values, i, out, self.theta, self.width, self.pos, self.leaf_sum, self.pred,
                              self.ticks, self.clamped, self.bound, self.bound_units, self.resolution, self.noise,
                              self.head, self.avail)
            if i < rows.size:
                self._refill(int(rows[i]))
        return out

    def operator(self, r: int) -> ToPS:
        """Row ``r``'s ToPS object with the row's state written back (for a snapshot, or to continue it alone)."""
        op = self._ops[r]
        st = op._smoother
        st.pos, st.leaf_sum, st.pred = int(self.pos[r]), int(self.leaf_sum[r]), float(self.pred[r])
        op.ticks, op.clamped = int(self.ticks[r]), int(self.clamped[r])
        walk = op._noise
        used = int(self.drawn[r] - self.avail[r])  # leaves whose noise a release used
        if used != walk.tree * walk.leaves_per_tree + walk.leaf:
            tree, leaf = divmod(used, walk.leaves_per_tree)
            if leaf == 0 and tree > 0:  # the end of a tree, as the walk itself records it
                tree, leaf = tree - 1, walk.leaves_per_tree
            if tree != walk.tree:
                walk._invalidate()  # another tree: its top is regenerated from the key at the next leaf
            walk.tree, walk.leaf = tree, leaf  # within a tree the cached path is re-entered by index
            self.drawn[r] = used
            self.avail[r] = 0
            self.head[r] = 0
        return op

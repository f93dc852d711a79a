"""Many releasing ToPS streams as columns, and one compiled pass over a batch of their readings.

The perturber of Wang et al. (CCS 2021) with the Recent smoother (Algorithm 1, Appendix D) needs, per stream and between
readings, only a handful of numbers: theta, the leaf width ``w = b^s``, the open leaf's position and truncated sum, the
current prediction, the position of the noise walk, and the consistent noise of the next leaves.
:class:`ColumnarRelease` keeps those as arrays (no Python object per stream), a stream is a row, and
:func:`operators._columnar_kernel.release_batch` runs a batch of ``(row, value)`` pairs of many streams in one
compiled loop. The noise stays what ToPS draws: when rows have used their noise drawn ahead, every row of the batch
that runs out is refilled in one compiled call (:func:`operators._refill_kernel.refill_rows`), which regenerates from
each row's key, at the row's position, what its :class:`~operators.hierarchy.ConsistentNoise` walk would compute
(never redrawn: the same keyed draws, as a restore does) and produces the consistent noise of its next leaves, up to
``ahead``. Between refills a row keeps, for each layer above the leaves, one number of its walk (the ``shift``
column), so a refill regenerates only the nodes that start in it. Every release is bit-identical to
:meth:`operators.tops.ToPS.process` on the same stream (tested on interleaved streams across refills, tree roll-overs
and restarts, for every tree shape rows hold).

:meth:`ColumnarRelease.snapshot` gives a row's state as ToPS's own snapshot (the same dict, so checkpoints and
``tops replay`` are unchanged) and :meth:`ColumnarRelease.operator` a ToPS object continuing it.
:class:`RowOperator` is a row seen as an operator (what the daemon's router holds for a releasing stream).

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

import math
from typing import Any

import numpy as np

from operators.config import ToPSConfig
from operators.hierarchy import layer_weight
from operators.noise import DiscreteLaplace, shared_laplace
from operators.selection import Selection
from operators.smoother import SmootherState
from operators.smoothers import SMOOTHERS
from operators.smoothers import grid as _grid
from operators.tops import _SNAPSHOT_VERSION, ToPS, release_layers

__all__ = ["ColumnarRelease", "RowOperator", "RowStore", "RowView", "checked_batch", "columnar_eligible"]

_INT_COLUMNS = ("theta", "width", "pos", "leaf_sum", "ticks", "clamped", "bound_units", "head", "avail", "drawn")
_FLOAT_COLUMNS = ("pred", "bound", "resolution", "u0")
_KEY_BYTES = 32


def rows_hold(config: ToPSConfig) -> bool:
    """Whether the streams of a configuration can be rows once releasing: a smoother the rows have a compiled step
    for (``SmootherSpec.in_rows``: the Recent smoother) and no lower bound."""
    return SMOOTHERS[config.smoother].in_rows and config.lower == 0


def born_releasing(config: ToPSConfig) -> bool:
    """Whether a new stream of a configuration releases from its first reading as a row (a public theta, no holdout:
    :meth:`ColumnarRelease.add_new` makes the row ``ToPS(config, key)`` would become, without building it)."""
    return config.theta is not None and rows_hold(config)


def columnar_eligible(op: Any) -> bool:
    """Whether a stream can be a row: a releasing ToPS stream of a configuration rows hold (:func:`rows_hold`)."""
    return type(op) is ToPS and op.phase == "releasing" and rows_hold(op.config)


def checked_batch(rows: Any, values: Any, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """A batch of ``(row, value)`` pairs for a columnar store of ``n_rows`` rows, as contiguous int64 rows and float64
    values; ``ValueError`` unless both are 1-D of one length, every row is below ``n_rows`` and every value finite."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    values = np.ascontiguousarray(values, dtype=np.float64)
    if rows.shape != values.shape or rows.ndim != 1:
        msg = "rows and values must be 1-D arrays of one length"
        raise ValueError(msg)
    if rows.size and (rows.min() < 0 or rows.max() >= n_rows):
        msg = "unknown row"
        raise ValueError(msg)
    if values.size and not np.isfinite(values).all():
        msg = "readings must be finite numbers"
        raise ValueError(msg)
    return rows, values


def _grown(capacity: int, need: int, most: int | None) -> int:
    """The capacity a store grows to when it must hold ``need`` rows: doubled until it does, but never past ``most``
    (the rows it can ever hold, when known) unless ``need`` is more."""
    while capacity < need:
        capacity *= 2
    return capacity if most is None else max(need, min(capacity, most))


class FreeRows:
    """The rows given back, a stack in one int64 array (the last given back is the first handed out again): eight
    bytes a freed row, where a list of Python ints takes about forty."""

    __slots__ = ("_count", "_rows")

    def __init__(self) -> None:
        self._rows = np.zeros(16, dtype=np.int64)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FreeRows) and np.array_equal(self.as_array(), other.as_array())

    __hash__ = None  # type: ignore[assignment]

    def as_array(self) -> np.ndarray:
        """The freed rows in the order they were given back (a copy)."""
        return self._rows[: self._count].copy()

    def push(self, rows: np.ndarray) -> None:
        """Rows given back, in their order."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        need = self._count + rows.size
        if need > self._rows.size:
            grown = np.zeros(max(need, 2 * self._rows.size), dtype=np.int64)
            grown[: self._count] = self._rows[: self._count]
            self._rows = grown
        self._rows[self._count : need] = rows
        self._count = need

    def pop(self) -> int:
        self._count -= 1
        return int(self._rows[self._count])

    def pop_many(self, n: int) -> np.ndarray:
        """The last ``min(n, len)`` rows given back, in the order single pops take them."""
        k = min(n, self._count)
        out = self._rows[self._count - k : self._count][::-1].copy()
        self._count -= k
        return out


class RowStore:
    """Rows of arrays handed out and given back (freed rows first), growing by doubling up to ``most`` rows (the
    most it will be asked for, e.g. the daemon's stream cap; None: unknown): what the columnar stores share. A
    subclass lists its columns in :meth:`_columns` (name, dtype, the shape of one row's part) and frees a row with
    :meth:`_give_back`."""

    def __init__(self, capacity: int, most: int | None = None) -> None:
        self.rows = 0  # rows ever handed out (the high-water mark); freed ones are reused first
        self.capacity = 0
        self.most = most
        self._free = FreeRows()
        self._key_bytes: memoryview | None = None  # the key column's bytes, flat (made again when the store grows)
        self._alloc(capacity)

    def _columns(self) -> list[tuple[str, Any, tuple[int, ...]]]:
        raise NotImplementedError

    def _alloc(self, capacity: int) -> None:
        """Room for ``capacity`` rows: each column copied into a new array, one column at a time (a column's old
        array is freed before the next grows)."""
        old = self.capacity
        for name, dtype, shape in self._columns():
            new = np.zeros((capacity, *shape), dtype=dtype)
            if old:
                new[:old] = getattr(self, name)
            setattr(self, name, new)
        self.capacity = capacity

    def __len__(self) -> int:
        """Rows in use."""
        return self.rows - len(self._free)

    def _new_row(self) -> int:
        """A free row (the store grows when full)."""
        if self._free:
            return self._free.pop()
        if self.rows == self.capacity:
            self._alloc(_grown(self.capacity, self.rows + 1, self.most))
        self.rows += 1
        return self.rows - 1

    def new_rows(self, n: int) -> tuple[np.ndarray, int]:
        """``n`` free rows at once (freed rows first, the store grown once when needed) and how many of them, at the
        start, were freed ones (their columns hold a former stream's numbers; the others are zeros)."""
        reused = self._free.pop_many(n)  # in the order :meth:`_new_row` pops them
        fresh = n - len(reused)
        if self.rows + fresh > self.capacity:
            self._alloc(_grown(self.capacity, self.rows + fresh, self.most))
        rows = np.empty(n, dtype=np.int64)
        rows[: len(reused)] = reused
        rows[len(reused):] = np.arange(self.rows, self.rows + fresh)
        self.rows += fresh
        return rows, len(reused)

    def write_keys(self, rows: np.ndarray, keys: list[bytes]) -> None:
        """:meth:`write_key` of many rows: ``keys[i]`` (32 bytes each, checked) into row ``rows[i]``."""
        if any(len(k) != _KEY_BYTES for k in keys):
            msg = f"a stream key is {_KEY_BYTES} bytes"
            raise ValueError(msg)
        flat = np.frombuffer(b"".join(keys), dtype=np.uint8)
        self.key[rows] = flat.reshape(len(keys), _KEY_BYTES)  # type: ignore[attr-defined]

    def write_key(self, r: int, key: bytes) -> None:
        """Row ``r``'s key (32 bytes), written through a flat view of the key column's bytes: a fifth of the cost of
        numpy's row assignment, which a new stream pays once."""
        view = self._key_bytes
        if view is None or view.obj is not self.key:  # type: ignore[attr-defined]
            view = self._key_bytes = memoryview(self.key).cast("B")  # type: ignore[attr-defined]
        view[r * _KEY_BYTES : (r + 1) * _KEY_BYTES] = key

    def _give_back(self, r: int) -> None:
        self.key[r] = 0  # type: ignore[attr-defined]
        self._free.push(np.array([r], dtype=np.int64))

    def _give_back_many(self, rows: np.ndarray) -> None:
        """:meth:`_give_back` of many rows, in their order (distinct rows in use)."""
        self.key[rows] = 0  # type: ignore[attr-defined]
        self._free.push(rows)


class TreeShapes:
    """The trees rows release with, as arrays the refill kernel reads (a few: one for each configuration and smoother
    layers in use): ``fanout`` b, ``layers`` L = h - s, ``top_nodes`` R = r / b^(h-1), and ``weights[i, k]`` the
    weight ``a_(k+1)`` of Hay et al.'s bottom-up pass at layer ``k`` (:func:`operators.hierarchy.layer_weight`, the
    numbers the walk uses); ``epsilon`` the streams' budget (each layer's noise is at ``epsilon / L``)."""

    def __init__(self) -> None:
        self.fanout = np.zeros(0, dtype=np.int64)
        self.layers = np.zeros(0, dtype=np.int64)
        self.top_nodes = np.zeros(0, dtype=np.int64)
        self.weights = np.zeros((0, 1), dtype=np.float64)
        self.epsilon: list[float] = []

    def add(self, fanout: int, layers: int, top_nodes: int, epsilon: float) -> int:
        """A tree's index (the arrays made again: a new tree is rare)."""
        n = self.fanout.size
        self.epsilon.append(epsilon)
        self.fanout = np.append(self.fanout, fanout)
        self.layers = np.append(self.layers, layers)
        self.top_nodes = np.append(self.top_nodes, top_nodes)
        weights = np.zeros((n + 1, max(self.weights.shape[1], layers)), dtype=np.float64)
        weights[:n, : self.weights.shape[1]] = self.weights
        weights[n, :layers] = [layer_weight(k + 1, fanout) for k in range(layers)]
        self.weights = weights
        return n


class ColumnarRelease(RowStore):
    """Releasing ToPS streams as rows of arrays; :meth:`process` releases a batch of readings of any of them."""

    def __init__(self, capacity: int = 1024, *, ahead: int = 16, most: int | None = None) -> None:
        if ahead < 1 or capacity < 1:
            msg = "capacity and ahead must be at least 1"
            raise ValueError(msg)
        self.ahead = ahead
        self.configs: list[ToPSConfig] = []
        self._config_index: dict[ToPSConfig, int] = {}
        # the walk's shifts a row keeps: one a layer above the leaves, for the deepest tree of the configurations
        self.depth = 0
        # the tree of each (configuration, smoother layers) rows release with, as the refill kernel reads it
        self._shapes: dict[tuple[int, int], int] = {}
        self._shape_table = TreeShapes()
        # a public theta's new row, by the configuration's identity (cheaper than hashing it): the
        # configuration itself (kept: its id cannot be reused) and what its rows start from
        self._births: dict[int, tuple[ToPSConfig, tuple[int, int, SmootherState, int]]] = {}
        super().__init__(capacity, most)

    def _columns(self) -> list[tuple[str, Any, tuple[int, ...]]]:
        return [*((name, np.int64, ()) for name in _INT_COLUMNS), *((name, np.float64, ()) for name in _FLOAT_COLUMNS),
                ("layers_kept", np.int16, ()),  # s, the smoother's layers (the tree keeps h - s)
                ("config", np.int32, ()), ("key", np.uint8, (_KEY_BYTES,)), ("noise", np.float64, (self.ahead,)),
                # the walk between refills (operators/_refill_kernel.py): for each layer j >= 1, (c - S) / b of the
                # ancestor of the next leaf at layer j, valid when walk_known is 1
                ("shift", np.float64, (self.depth,)), ("walk_known", np.int8, ())]

    def row_nbytes(self) -> int:
        """Bytes of the columns per row: the whole state of a releasing stream."""
        return 8 * (len(_INT_COLUMNS) + len(_FLOAT_COLUMNS) + self.ahead + self.depth) + 2 + 4 + _KEY_BYTES + 1

    def _config_id(self, cfg: ToPSConfig) -> int:
        """The index of a configuration in :attr:`configs` (added on first sight; the shift column widens to hold
        the walk of its tree: ``h - 1`` layers above the leaves at most)."""
        ci = self._config_index.get(cfg)
        if ci is None:
            ci = self._config_index[cfg] = len(self.configs)
            self.configs.append(cfg)
            if cfg.height - 1 > self.depth:
                wider = np.zeros((self.capacity, cfg.height - 1), dtype=np.float64)
                wider[:, : self.depth] = self.shift
                self.shift, self.depth = wider, cfg.height - 1
        return ci

    def add(self, op: ToPS) -> int:
        """Make a releasing ToPS stream a row; from then on its readings go through this store (``op`` is no longer
        needed: :meth:`operator` gives a new object continuing the row)."""
        if not columnar_eligible(op):
            msg = "only releasing ToPS streams with the recent smoother and lower = 0 become rows"
            raise ValueError(msg)
        walk = op._noise
        return self._put(op.config, op._gen._key, op.theta_units, op.smoother_layers, op._smoother, op.ticks,
                         op.clamped, op._bound_units, walk.tree * walk.leaves_per_tree + walk.leaf)

    def add_new(self, config: ToPSConfig, key: bytes) -> int:
        """The row :meth:`add` makes of ``ToPS(config, key)`` for a configuration with a public theta
        (:func:`born_releasing`: it releases from its first reading), without building that operator: the theta in
        units ``max(1, round(theta / resolution))``, the layers kept, the Recent smoother's prior (theta / 2) and
        nothing drawn yet, as ``ToPS._start_release`` sets them (computed once a configuration)."""
        theta, s, st, bound_units = self._birth(config)
        if not isinstance(key, (bytes, bytearray)) or len(key) != _KEY_BYTES:
            msg = f"a stream key is {_KEY_BYTES} bytes"
            raise ValueError(msg)
        return self._put(config, bytes(key), theta, s, st, 0, 0, bound_units, 0)

    def add_new_many(self, config: ToPSConfig, keys: list[bytes]) -> np.ndarray:
        """:meth:`add_new` of many new streams of ``config`` at once (a chunk of input's new streams): their rows, in
        order, each written as :meth:`_put` writes it, in a few array writes."""
        theta, s, st, bound_units = self._birth(config)
        rows, _ = self.new_rows(len(keys))
        try:
            self.write_keys(rows, keys)
        except ValueError:
            self._give_back_many(rows)
            raise
        self.config[rows] = self._config_id(config)
        self.theta[rows] = theta
        self.layers_kept[rows] = s
        self.width[rows] = st.leaf_ticks
        self.pos[rows] = st.pos
        self.leaf_sum[rows] = st.leaf_sum
        self.pred[rows] = st.pred
        self.u0[rows] = st.total
        self.ticks[rows] = self.clamped[rows] = 0
        self.bound[rows] = config.bound
        self.bound_units[rows] = bound_units
        self.resolution[rows] = config.resolution
        self.head[rows] = self.avail[rows] = self.drawn[rows] = 0
        self.walk_known[rows] = 0
        return rows

    def _birth(self, config: ToPSConfig) -> tuple[int, int, SmootherState, int]:
        """What a new row of ``config`` (:func:`born_releasing`) starts from: theta in units, the layers kept, the
        smoother's state and the bound in units (computed once a configuration)."""
        if not born_releasing(config):
            msg = "only a configuration with a public theta, the recent smoother and lower = 0 is born a row"
            raise ValueError(msg)
        hit = self._births.get(id(config))
        if hit is None or hit[0] is not config:
            theta = max(1, round((config.theta - config.lower) / config.resolution))  # type: ignore[operator]
            s = release_layers(config, None)
            shared_laplace(config.epsilon / (config.height - s), theta)  # refuses the theta ToPS would refuse
            st = SmootherState.initial(config.smoother, leaf_ticks=config.fanout**s, theta_units=theta,
                                       window=config.window, start=None)
            hit = (config, (theta, s, st, math.floor(config.span / config.resolution + 1e-9)))
            if len(self._births) < 256:
                self._births[id(config)] = hit
        return hit[1]

    def add_chosen(self, op: ToPS, sel: Selection) -> int:
        """The row :meth:`add` makes of ``op`` once ``op.start(sel)`` started it, without building the walk and the
        smoother it would drop at once: ``op`` is a stream at the end of its holdout (it took its last reading,
        :meth:`ToPS.hold`) and ``sel`` its choice (:func:`operators.tops.choose_ends`). ``op`` stays where it was."""
        cfg = op.config
        if type(op) is not ToPS or op.theta_units is not None or op.holdout_left or not rows_hold(cfg):
            msg = "only ToPS streams at the end of their holdout, with the recent smoother and lower = 0, become rows"
            raise ValueError(msg)
        theta, s = sel.theta_units, release_layers(cfg, sel.smoother_layers)
        shared_laplace(cfg.epsilon / (cfg.height - s), theta)  # refuses the theta the walk would refuse
        st = SmootherState.initial(cfg.smoother, leaf_ticks=cfg.fanout**s, theta_units=theta, window=cfg.window,
                                   start=sel.start_units)
        return self._put(cfg, op._gen._key, theta, s, st, op.ticks, op.clamped, op._bound_units, 0)

    def add_started(self, cfg: ToPSConfig, keys: np.ndarray, thetas: list[int], s: int, starts: list[float],
                    ticks: np.ndarray, clamped: np.ndarray) -> list[int]:
        """The rows :meth:`add_chosen` makes of many streams of ``cfg`` at the end of their holdout, all with the one
        ``s`` of the small branch (:meth:`operators.columnar_holdout.ColumnarHoldout.choose_ends`): stream ``i`` has
        key ``keys[i]`` (32 bytes), theta ``thetas[i]``, smoother start ``starts[i]``, ``ticks[i]`` ticks and
        ``clamped[i]`` clamped readings. Every row as :meth:`_put` writes it, in a few array writes."""
        if not rows_hold(cfg):
            msg = "only streams with the recent smoother and lower = 0 become rows"
            raise ValueError(msg)
        s = release_layers(cfg, s)
        for theta in set(thetas):
            shared_laplace(cfg.epsilon / (cfg.height - s), theta)  # refuses the theta the walk would refuse
        w = cfg.fanout**s
        ci = self._config_id(cfg)
        at, _ = self.new_rows(len(thetas))
        u0 = w * np.array(starts, dtype=np.float64)  # SmootherState.initial: u_0 = w * start, pred on the grid
        self.config[at] = ci
        self.key[at] = keys
        self.theta[at] = thetas
        self.layers_kept[at] = s
        self.width[at] = w
        self.pos[at] = self.leaf_sum[at] = 0
        self.pred[at] = _grid(u0 / w)
        self.u0[at] = u0
        self.ticks[at] = ticks
        self.clamped[at] = clamped
        self.bound[at] = cfg.bound
        self.bound_units[at] = math.floor(cfg.span / cfg.resolution + 1e-9)
        self.resolution[at] = cfg.resolution
        self.head[at] = self.avail[at] = self.drawn[at] = 0
        self.walk_known[at] = 0
        return at.tolist()

    def add_snapshot(self, config: ToPSConfig, key: bytes, snapshot: dict[str, Any]) -> int | None:
        """A stored releasing stream straight into a row: the row :meth:`add` makes of ``ToPS.restore(config, key,
        snapshot)``, without building the operator first (its walk, its smoother: most of what a stream restored at
        its first reading after a restart costs). None when a row cannot hold it (in its holdout, another smoother,
        a lower bound): the caller restores the operator. A snapshot that does not fit raises ``KeyError``,
        ``TypeError`` or ``ValueError``, as :meth:`ToPS.restore` does."""
        if not rows_hold(config) or snapshot.get("theta_units") is None:
            return None
        ToPS.check_snapshot(config, snapshot)
        theta, s = int(snapshot["theta_units"]), int(snapshot["smoother_layers"])
        h = config.height
        if not 0 <= s < h:
            msg = "corrupt ToPS snapshot (smoother layers)"
            raise ValueError(msg)
        layers = h - s
        DiscreteLaplace(epsilon=config.epsilon / layers, sensitivity=theta)  # refuses the theta restore refuses
        if not isinstance(key, (bytes, bytearray)) or len(key) != _KEY_BYTES:
            msg = f"a stream key is {_KEY_BYTES} bytes"
            raise ValueError(msg)
        tree, leaf = int(snapshot["walk"]["tree"]), int(snapshot["walk"]["leaf"])
        leaves_per_tree = config.query_range // config.fanout ** (h - 1) * config.fanout ** (layers - 1)
        st = SmootherState.from_dict(config.smoother, config.fanout**s, config.window, snapshot["smoother"])
        return self._put(config, bytes(key), theta, s, st, int(snapshot["ticks"]), int(snapshot["clamped"]),
                         math.floor(config.span / config.resolution + 1e-9), tree * leaves_per_tree + leaf)

    def _put(self, cfg: ToPSConfig, key: bytes, theta: int, s: int, st: SmootherState, ticks: int, clamped: int,
             bound_units: int, drawn: int) -> int:
        """Write a releasing stream into a free row (the store grows when full); its noise is drawn at its first
        refill (``drawn``: the leaves its walk has produced)."""
        ci = self._config_id(cfg)
        r = self._new_row()
        self.config[r] = ci
        self.write_key(r, key)
        self.theta[r] = theta
        self.layers_kept[r] = s
        self.width[r] = st.leaf_ticks
        self.pos[r] = st.pos
        self.leaf_sum[r] = st.leaf_sum
        self.pred[r] = st.pred
        self.u0[r] = st.total  # the Recent smoother's prior u_0 (its snapshot carries it)
        self.ticks[r] = ticks
        self.clamped[r] = clamped
        self.bound[r] = cfg.bound
        self.bound_units[r] = bound_units
        self.resolution[r] = cfg.resolution
        self.head[r] = self.avail[r] = 0
        self.drawn[r] = drawn  # leaves the walk has produced
        self.walk_known[r] = 0  # its shifts are found at its first refill
        return r

    def release(self, r: int) -> None:
        """Free row ``r`` (its stream left memory); its key is wiped."""
        self.avail[r] = self.head[r] = 0
        self._give_back(r)

    def process(self, rows: np.ndarray, values: np.ndarray, *, checked: bool = False) -> np.ndarray:
        """The release of every reading (``values[i]`` of stream ``rows[i]``), in order. ``checked``: the caller
        guarantees int64 rows in use and finite float64 values (the daemon's router, whose readings were validated
        on intake): the checks are skipped.

        The compiled pass stops at the first reading whose row has no noise left; then every row that runs out of
        noise in the rest of the batch is found (a row completes ``(pos + its readings) // width`` leaves) and all
        of them are refilled in one compiled call (:meth:`_refill`), and the pass goes on. Only a row that needs more
        than ``ahead`` leaves in one batch stops it again: then such rows are refilled together."""
        if not checked:
            rows, values = checked_batch(rows, values, self.rows)
        out = np.empty(rows.size, dtype=np.float64)
        i = self._release(rows, values, 0, out)
        if i == rows.size:
            return out
        rest, counts = np.unique(rows[i:], return_counts=True)
        leaves = (self.pos[rest] + counts) // self.width[rest]
        short = leaves > self.avail[rest]
        due = rest[short]
        heavy = due[leaves[short] > self.ahead]  # rows that will run out again in this batch
        self._refill(due)
        while (i := self._release(rows, values, i, out)) < rows.size:
            again = heavy[2 * self.avail[heavy] <= self.ahead]
            stalled = rows[i]
            self._refill(again if stalled in again else np.append(again, stalled))
            if not self.avail[stalled]:  # never: the kernel fills every row it is given
                msg = "a refill drew no noise for its row"
                raise RuntimeError(msg)
        return out

    def _release(self, rows: np.ndarray, values: np.ndarray, start: int, out: np.ndarray) -> int:
        """The compiled release of ``rows[start:]`` until a row has no noise left: the index it stopped at."""
        from operators._columnar_kernel import release_batch

        return release_batch(rows, values, start, out, self.theta, self.width, self.pos, self.leaf_sum, self.pred,
                             self.ticks, self.clamped, self.bound, self.bound_units, self.resolution, self.noise,
                             self.head, self.avail)

    def _refill(self, due: np.ndarray) -> None:
        """Fill the noise drawn ahead of rows ``due`` (distinct rows in use) to ``ahead`` leaves, in one compiled call
        (:func:`operators._refill_kernel.refill_rows`): each row's next leaves are what its stream's own walk
        produces. The tree of each row is looked up once for each (configuration, smoother layers) among them, its
        discrete Laplace once for each (tree, theta)."""
        from operators._refill_kernel import refill_rows

        if not due.size:
            return
        due = np.ascontiguousarray(due, dtype=np.int64)
        # the tree of each row: one per (configuration, smoother layers) among them
        pairs, pair_of = np.unique(self.config[due].astype(np.int64) * 64 + self.layers_kept[due],
                                   return_inverse=True)
        shape_ids = np.array([self._shape(p >> 6, p & 63) for p in pairs.tolist()], dtype=np.int64)
        shape_of = shape_ids[pair_of.reshape(-1)]
        # the discrete Laplace of each row: one per (tree, theta) among them (theta units are below 2^37)
        kinds, which = np.unique((shape_of << 37) | self.theta[due], return_inverse=True)
        table = self._shape_table
        laplace = np.empty((kinds.size, 4), dtype=np.int64)
        for k, kind in enumerate(kinds.tolist()):
            tree = kind >> 37
            dl = shared_laplace(table.epsilon[tree] / int(table.layers[tree]), kind & ((1 << 37) - 1))
            laplace[k] = (dl.log2_t, dl.s, dl.q, dl.r)
        per_row = laplace[which.reshape(-1)]
        failed = refill_rows(due, self.key, self.drawn, self.head, self.avail, self.noise, self.shift,
                             self.walk_known, shape_of, table.fanout, table.layers, table.top_nodes,
                             table.weights, per_row[:, 0], per_row[:, 1], per_row[:, 2], per_row[:, 3])
        if failed >= 0:
            msg = "discrete Laplace sample beyond the int64 range"
            raise OverflowError(msg)

    def _shape(self, ci: int, s: int) -> int:
        """The index in the shape table of the tree that rows of configuration ``ci`` release with at ``s`` smoother
        layers (:class:`TreeShapes`)."""
        at = self._shapes.get((ci, s))
        if at is None:
            cfg = self.configs[ci]
            at = self._shapes[(ci, s)] = self._shape_table.add(
                cfg.fanout, cfg.height - s, cfg.query_range // cfg.fanout ** (cfg.height - 1), cfg.epsilon)
        return at

    def snapshot(self, r: int) -> dict[str, Any]:
        """Row ``r``'s state as :meth:`ToPS.snapshot` writes it (the same dict for the same stream)."""
        cfg = self.configs[int(self.config[r])]
        used = int(self.drawn[r] - self.avail[r])  # leaves whose noise a release used
        leaves_per_tree = cfg.fanout ** (cfg.height - int(self.layers_kept[r]) - 1) * (
            cfg.query_range // cfg.fanout ** (cfg.height - 1))
        tree, leaf = divmod(used, leaves_per_tree)
        if leaf == 0 and tree > 0:
            tree, leaf = tree - 1, leaves_per_tree
        return {
            "version": _SNAPSHOT_VERSION,
            "config": cfg.to_dict(),
            "ticks": int(self.ticks[r]),
            "clamped": int(self.clamped[r]),
            "theta_units": int(self.theta[r]),
            "smoother_layers": int(self.layers_kept[r]),
            "walk": {"tree": tree, "leaf": leaf},
            "smoother": {"pred": float(self.pred[r]), "pos": int(self.pos[r]), "leaf_sum": int(self.leaf_sum[r]),
                         "total": float(self.u0[r]), "count": 1, "history": []},
        }

    def snapshot_columns(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The fields of :meth:`snapshot` for many rows at once, as arrays of their own (copies: the rows may change
        afterwards; one pass per column: a checkpoint of many rows formats them without a dict per row, and later).
        Keys: ticks, clamped, theta_units, smoother_layers, tree, leaf, pred, pos, leaf_sum, total."""
        rows = np.asarray(rows, dtype=np.int64)
        used = self.drawn[rows] - self.avail[rows]
        kept = self.layers_kept[rows].astype(np.int64)
        cfg_idx = self.config[rows]
        per_tree = np.empty(rows.size, dtype=np.int64)
        for ci in np.unique(cfg_idx).tolist():  # leaves per tree: b^(h - s - 1) R, by configuration and s
            cfg = self.configs[ci]
            top = cfg.query_range // cfg.fanout ** (cfg.height - 1)
            sel = cfg_idx == ci
            per_tree[sel] = np.asarray([cfg.fanout ** (cfg.height - k - 1) * top for k in range(cfg.height)],
                                       dtype=np.int64)[kept[sel]]
        tree, leaf = np.divmod(used, per_tree)
        end = (leaf == 0) & (tree > 0)  # the end of a tree, as the walk records it
        tree[end] -= 1
        leaf[end] = per_tree[end]
        return {
            "ticks": self.ticks[rows], "clamped": self.clamped[rows], "theta_units": self.theta[rows],
            "smoother_layers": kept, "tree": tree, "leaf": leaf, "pred": self.pred[rows], "pos": self.pos[rows],
            "leaf_sum": self.leaf_sum[rows], "total": self.u0[rows],
        }

    def operator(self, r: int) -> ToPS:
        """A ToPS object continuing row ``r`` (restored from :meth:`snapshot` and the row's key)."""
        return ToPS.restore(self.configs[int(self.config[r])], self.key[r].tobytes(), self.snapshot(r))


class RowView:
    """A row of a columnar store seen as a ToPS operator: what :class:`RowOperator` (a releasing row) and
    :class:`operators.columnar_holdout.HoldoutRow` (a row in its holdout) share. ``pool`` is the store, ``row`` the
    row's index; a subclass gives ``process`` and the operator's public state."""

    __slots__ = ("pool", "row")

    def __init__(self, pool: Any, row: int) -> None:
        self.pool = pool
        self.row = row

    def __reduce__(self):  # a row's key must not be pickled into a checkpoint by accident
        msg = f"{type(self).__name__} holds a secret and is not picklable"
        raise TypeError(msg)

    @property
    def ticks(self) -> int:
        return int(self.pool.ticks[self.row])

    @property
    def clamped(self) -> int:
        return int(self.pool.clamped[self.row])

    def process(self, values: Any) -> np.ndarray:
        raise NotImplementedError

    def process_one(self, value: float) -> float:
        return float(self.process(np.array([float(value)]))[0])

    def state_nbytes(self) -> int:
        return self.pool.row_nbytes()

    @classmethod
    def restore(cls, config: ToPSConfig, key: bytes, snapshot: dict[str, Any]) -> ToPS:
        """A ToPS object from a snapshot (rows are made from ToPS objects by the store that holds them)."""
        return ToPS.restore(config, key, snapshot)

    def free(self) -> None:
        """Give the row back to its store (the stream left memory)."""
        self.pool.release(self.row)


class RowOperator(RowView):
    """A row of a :class:`ColumnarRelease` seen as a releasing ToPS operator: ``process``, ``process_one``,
    ``snapshot`` and the public state the daemon reads (``phase``, ``theta``, ``config``, ...)."""

    __slots__ = ()
    phase = "releasing"
    holdout_left = 0

    def __repr__(self) -> str:
        return f"RowOperator(row={self.row}, theta={self.theta!r}, key=<secret>)"

    @property
    def config(self) -> ToPSConfig:
        return self.pool.configs[int(self.pool.config[self.row])]

    @property
    def theta_units(self) -> int:
        return int(self.pool.theta[self.row])

    @property
    def theta(self) -> float:
        """As :attr:`ToPS.theta` (``lower`` is 0 for a row)."""
        cfg = self.config
        return cfg.lower + self.theta_units * cfg.resolution

    @property
    def smoother_layers(self) -> int:
        return int(self.pool.layers_kept[self.row])

    def process(self, values: Any) -> np.ndarray:
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        return self.pool.process(np.full(v.size, self.row, dtype=np.int64), v)

    def snapshot(self) -> dict[str, Any]:
        return self.pool.snapshot(self.row)

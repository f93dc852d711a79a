"""Many ToPS streams in their holdout as columns, and one compiled pass over a batch of their readings.

In its holdout a ToPS stream (Wang et al., CCS 2021, Algorithm 1) keeps only sufficient statistics for the choice at the
holdout's end: the histogram of its readings over the candidate thresholds (Eq. 5 counts the values above each candidate
from it) and, for the calibrated selection, the block statistics of :class:`operators.selection.BlockStats` (per leaf
width ``b^s`` and cap ``2^k``: the current block's truncated sum, the previous block's, the sum of ``|dS|``). With the
compact candidate grid (``holdout_grid = "compact"``, ``O(log B)`` cells) these are a few hundred numbers of fixed
shape, so :class:`ColumnarHoldout` keeps them as rows of arrays shared by every stream of one configuration (no
Python object, histogram or array header per stream) and :func:`operators._holdout_kernel.holdout_batch` counts a
batch of ``(row, value)`` pairs of many streams in one compiled loop.

A row is the stream's operator state, nothing less: :meth:`ColumnarHoldout.operator` makes the ToPS object holding
the very numbers the stream's own operator would hold after the same readings (tested on interleaved streams, with
clamped readings and blocks across batches), so its snapshot, its checkpoint and its choice at the holdout's end are
unchanged; the daemon's router hands a stream its operator back for the reading that ends its holdout, and
:class:`HoldoutRow` is a row seen as an operator in its holdout.

>>> import numpy as np
>>> from operators.config import ToPSConfig
>>> cfg = ToPSConfig(epsilon=1.0, bound=100, holdout=40, query_range=64, fanout=4, holdout_grid="compact")
>>> cols = ColumnarHoldout(cfg, capacity=2)
>>> a, b = cols.add(ToPS(cfg, bytes(32))), cols.add(ToPS(cfg, bytes([1]) * 32))
>>> cols.process(np.array([a, b, a, a]), np.array([1.0, 2.0, 37.0, 120.0]))
>>> ref = ToPS(cfg, bytes(32))
>>> _ = ref.process(np.array([1.0, 37.0, 120.0]))
>>> cols.operator(a).snapshot() == ref.snapshot(), cols.operator(a).clamped
(True, 1)
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from operators.columnar import RowStore, RowView, checked_batch
from operators.config import ToPSConfig
from operators.error_stats import measure_rows
from operators.noise import KeyedGenerator, KeyRows
from operators.selection import BlockStats, choose_small_cells, choose_small_dense, chooses_small
from operators.threshold import candidate_grid
from operators.tops import ToPS, _choice_parameters, _pending_array, choice_epsilon

__all__ = ["MIN_HOLDOUT_LEFT", "ColumnarHoldout", "HoldoutRow", "ShortHoldout", "born_in_rows", "ends_in_rows",
           "holdout_eligible", "holdout_store"]

_KEY_BYTES = 32
_SCALARS = ("pos", "ticks", "clamped")


# a stream becomes a row only with at least this many holdout readings to come: making a row and giving the operator
# back costs what counting about five readings in a row instead of by the operator saves
MIN_HOLDOUT_LEFT = 16


def holdout_eligible(op: Any) -> bool:
    """Whether a stream can be a holdout row: a ToPS stream in its holdout with no lower bound (``lower`` shifts
    readings before they are quantized: the scalar path of ToPS hands such readings to its general path, and rows do
    not), on the compact grid (bounded cells: a row of the exact grid's thousands of cells would cost more than the
    sparse histogram of most holdouts) or with a holdout that ends in rows (:func:`ends_in_rows`: on the exact grid,
    a row of :class:`ShortHoldout`, its few readings' cells)."""
    return (type(op) is ToPS and op.theta_units is None and op.config.lower == 0
            and (op.config.holdout_grid == "compact" or ends_in_rows(op.config)))


def _check_keys(keys: list[bytes]) -> None:
    if not all(isinstance(key, (bytes, bytearray)) and len(key) == _KEY_BYTES for key in keys):
        msg = f"a stream key is {_KEY_BYTES} bytes"
        raise ValueError(msg)


def ends_in_rows(config: ToPSConfig) -> bool:
    """Whether the holdout rows of a configuration take their last reading too and end together, row to row
    (``choose_ends``, without an operator): a holdout too short to measure a leaf width, chosen by the calibrated
    choice's small branch (:func:`operators.selection.choose_small_many`), on the compact grid (a row of
    :class:`ColumnarHoldout`) or the exact one (a row of :class:`ShortHoldout`). Such a stream is a row from its first
    reading, however short its holdout."""
    hit = _ENDS_IN_ROWS.get(id(config))  # by identity first: cheaper than hashing the configuration
    if hit is not None and hit[0] is config:
        return hit[1]
    ends = _ends_in_rows(config)
    if len(_ENDS_IN_ROWS) < 256:
        _ENDS_IN_ROWS[id(config)] = (config, ends)  # the configuration is kept: its id cannot be reused
    return ends


_ENDS_IN_ROWS: dict[int, tuple[ToPSConfig, bool]] = {}


@functools.lru_cache(maxsize=256)
def _ends_in_rows(config: ToPSConfig) -> bool:
    if config.theta is not None or config.lower != 0 or config.selection != "calibrated":
        return False
    m = config.holdout_ticks
    if m > np.iinfo(np.uint16).max or BlockStats(config.fanout, config.holdout, 1, config.query_range).widths:
        return False
    compact = config.holdout_grid == "compact"
    return chooses_small(candidate_grid(config.span, config.resolution, compact), holdout=config.holdout,
                         threshold_epsilon=choice_epsilon(config))


def holdout_store(config: ToPSConfig, capacity: int = 1024, most: int | None = None) -> ColumnarHoldout | ShortHoldout:
    """The columnar holdout of a configuration whose streams can be holdout rows: :class:`ColumnarHoldout` on the
    compact grid, :class:`ShortHoldout` on the exact one (``most``: the rows it can ever be asked for, or None)."""
    kind = ColumnarHoldout if config.holdout_grid == "compact" else ShortHoldout
    return kind(config, capacity, most)


def born_in_rows(config: ToPSConfig) -> bool:
    """Whether a new stream of a configuration is a holdout row from the start (what the daemon's router makes of a
    new ToPS stream that :func:`holdout_eligible` admits, with a holdout that is long enough or ends in rows)."""
    return (config.theta is None and config.lower == 0
            and ((config.holdout_grid == "compact" and config.holdout_ticks >= MIN_HOLDOUT_LEFT)
                 or ends_in_rows(config)))


class ColumnarHoldout(RowStore):
    """The holdouts of ToPS streams of one configuration as rows of arrays; :meth:`process` counts a batch of readings
    of any of them. The caller keeps every row's readings inside its holdout: the reading that ends it belongs to the
    stream's operator (:meth:`take`), which makes the choice."""

    def __init__(self, config: ToPSConfig, capacity: int = 1024, most: int | None = None) -> None:
        if capacity < 1:
            msg = "capacity must be at least 1"
            raise ValueError(msg)
        if config.theta is not None or config.holdout_grid != "compact" or config.lower != 0:
            msg = "a columnar holdout takes a configuration with a holdout, the compact grid and lower = 0"
            raise ValueError(msg)
        self.config = config
        self.candidates = candidate_grid(config.span, config.resolution, True)
        self.cells = len(self.candidates) + 1
        self.bound_units = math.floor(config.span / config.resolution + 1e-9)
        model = BlockStats(config.fanout, config.holdout, self.bound_units, config.query_range)
        self.has_blocks = config.selection == "calibrated"
        self.widths = np.asarray(model.widths if self.has_blocks else (), dtype=np.int64)
        self.caps = np.asarray(model.caps, dtype=np.int64)
        self._block_shape = (len(self.widths), len(self.caps))
        # the narrowest integers that hold a row's numbers: a row takes the holdout's last reading only where it ends
        # in rows (then m fits 16 bits: ends_in_rows), else its operator does, so a cell counts at most m - 1; a
        # block's truncated sum is at most its width times the top cap (2^30 keeps their differences inside 32 bits)
        self._hist_type = np.uint16 if config.holdout_ticks - 1 <= np.iinfo(np.uint16).max else np.int32
        top = int(self.widths.max(initial=0)) * int(self.caps.max(initial=0))
        self._sum_type = np.int32 if top < 1 << 30 else np.int64
        self.ends_in_rows = ends_in_rows(config)
        super().__init__(capacity, most)

    def _columns(self) -> list[tuple[str, Any, tuple[int, ...]]]:
        w, c = self._block_shape
        return [("hist", self._hist_type, (self.cells,)), ("partial", self._sum_type, (w, c)),
                ("prev", self._sum_type, (w, c)), ("acc", np.float64, (w, c)), ("pairs", np.int64, (w,)),
                *((name, np.int64, ()) for name in _SCALARS), ("key", np.uint8, (_KEY_BYTES,))]

    def row_nbytes(self) -> int:
        """Bytes of the columns per row: the whole holdout state of a stream."""
        w, c = self._block_shape
        sums = np.dtype(self._sum_type).itemsize
        return (np.dtype(self._hist_type).itemsize * self.cells + (2 * sums + 8) * w * c + 8 * (w + len(_SCALARS))
                + _KEY_BYTES)

    def add(self, op: ToPS) -> int:
        """Make a ToPS stream in its holdout a row (its state moves into the row; ``op`` is no longer needed:
        :meth:`operator` gives an object continuing the row)."""
        if not holdout_eligible(op) or (op.config is not self.config and op.config != self.config):
            msg = "only a ToPS stream of this configuration, in its holdout, becomes a row"
            raise ValueError(msg)
        blocks = op._blocks
        if (op.ticks == 0 and not op._pending and type(op._hist) is dict and not op._hist
                and (blocks is None or (not blocks.widths and blocks.pos == 0))):
            # a new stream (a daemon makes one for every new stream): the fresh row, in a few writes
            return self.add_new(op._gen._key)
        return self._add_state(op)

    def _add_state(self, op: ToPS) -> int:
        """:meth:`add` of any state: every number of the operator copied into a new row."""
        op._flush()  # the block statistics take the pending readings (exact however batched)
        hist, blocks = op._hist, op._blocks
        # the narrow types hold whatever a holdout can count; a stored state that counts more (a corrupt or forged
        # store: ToPS keeps such numbers as they are) would wrap around in a row: it stays an operator
        top = max(hist.values(), default=0) if isinstance(hist, dict) else int(hist.max())
        sums = 0 if blocks is None or not blocks.widths else int(max(abs(blocks.partial).max(), abs(blocks.prev).max()))
        if top > np.iinfo(self._hist_type).max or sums > np.iinfo(self._sum_type).max:
            msg = "the stream's holdout counts more than a row holds"
            raise ValueError(msg)
        r = self._new_row()
        self.hist[r] = 0
        if isinstance(hist, dict):
            for cell, n in hist.items():
                self.hist[r, cell] = n
        else:
            self.hist[r] = hist
        if blocks is not None and blocks.widths:
            self.partial[r] = blocks.partial
            self.prev[r] = blocks.prev
            self.acc[r] = blocks.acc
            self.pairs[r] = blocks.pairs
        else:
            self.prev[r] = -1
            self.partial[r] = self.acc[r] = self.pairs[r] = 0
        self.pos[r] = 0 if blocks is None else blocks.pos
        self.ticks[r] = op.ticks
        self.clamped[r] = op.clamped
        self.write_key(r, op._gen._key)
        return r

    def add_new(self, key: bytes) -> int:
        """A new stream of this configuration (no reading yet) with ``key``: the row :meth:`add` makes of
        ``ToPS(config, key)``, without building that operator (a daemon makes one for every new stream)."""
        if not isinstance(key, (bytes, bytearray)) or len(key) != _KEY_BYTES:
            msg = f"a stream key is {_KEY_BYTES} bytes"
            raise ValueError(msg)
        reused = bool(self._free)
        r = self._new_row()
        if reused:  # a row never handed out is zeros (the arrays are made with np.zeros): only prev is not
            self.hist[r] = 0
            self.partial[r] = self.acc[r] = self.pairs[r] = 0
            self.pos[r] = self.ticks[r] = self.clamped[r] = 0
        if self._block_shape[0]:
            self.prev[r] = -1  # no previous block yet (BlockStats' own start; -1 too where no block is kept)
        self.write_key(r, key)
        return r

    def add_new_many(self, keys: list[bytes]) -> np.ndarray:
        """:meth:`add_new` of many new streams at once (a chunk of input's new streams): their rows, in order."""
        _check_keys(keys)
        rows, reused = self.new_rows(len(keys))
        if reused:
            old = rows[:reused]
            self.hist[old] = 0
            self.partial[old] = self.acc[old] = self.pairs[old] = 0
            self.pos[old] = self.ticks[old] = self.clamped[old] = 0
        if self._block_shape[0]:
            self.prev[rows] = -1
        self.write_keys(rows, keys)
        return rows

    def release(self, r: int) -> None:
        """Free row ``r`` (its stream left memory, or took its operator back); its key is wiped."""
        self._give_back(r)

    def release_many(self, rows: np.ndarray) -> None:
        """:meth:`release` of many rows (distinct, in use), in their order."""
        self._give_back_many(np.asarray(rows, dtype=np.int64))

    def left(self, r: int) -> int:
        """Readings row ``r`` still takes before its holdout ends."""
        return max(0, self.config.holdout_ticks - int(self.ticks[r]))

    def process(self, rows: np.ndarray, values: np.ndarray, *, checked: bool = False, end: bool = False) -> None:
        """Count every reading (``values[i]`` of stream ``rows[i]``), in order. Each row must take fewer readings here
        than it has left in its holdout; with ``end`` (only where :attr:`ends_in_rows`), at most what it has left:
        :meth:`choose_ends` then ends the rows that took their last one. ``checked``: the caller guarantees int64 rows
        in use that stay inside their holdouts and finite float64 values (the daemon's router): the checks are
        skipped."""
        from operators._holdout_kernel import holdout_batch

        if end and not self.ends_in_rows:
            msg = "the rows of this configuration do not end in rows: their operators (take) make the choice"
            raise ValueError(msg)
        if not checked:
            rows, values = checked_batch(rows, values, self.rows)
            used, n = np.unique(rows, return_counts=True)
            if used.size and (self.ticks[used] + n > self.config.holdout_ticks - (not end)).any():
                msg = ("more readings than the holdout has left" if end else
                       "a row's holdout would end here: its operator (take) makes the choice")
                raise ValueError(msg)
        cfg = self.config
        holdout_batch(rows, values, self.candidates, float(cfg.bound), float(cfg.resolution), self.bound_units,
                      self.has_blocks, self.widths, self.caps, self.hist, self.partial, self.prev, self.acc,
                      self.pairs, self.pos, self.ticks, self.clamped)

    def choose_ends(self, rows: np.ndarray) -> tuple[list[int], int, list[float]] | None:
        """The choices that end the holdouts of ``rows`` (each took its last reading: :meth:`process` with ``end``), as
        ``(thetas, s, starts)``: what each stream's own operator chooses (:func:`operators.tops.choose_ends`, bit for
        bit), from the rows' histograms and keys in a few compiled calls. None when the compiled kernels are not
        loaded (the caller takes the operators back: :meth:`take`). The rows stay; the caller releases them."""
        rows = np.asarray(rows, dtype=np.int64)
        if not self.ends_in_rows or (self.ticks[rows] != self.config.holdout_ticks).any():
            msg = "choose_ends() takes rows whose holdout took its last reading, of a configuration that ends in rows"
            raise ValueError(msg)
        return choose_small_dense(self.hist[rows], self.pairs[rows], KeyRows(self.key[rows]), self.candidates,
                                  **_choice_parameters(self.config))

    def error_stats(self, rows: np.ndarray, thetas: list[int]) -> list[bytes]:
        """The error statistics of each of ``rows`` (which end in rows) at its chosen theta: what its own operator
        measures when it starts (:meth:`operators.tops.ToPS.measure_error_stats`), the same values."""
        rows = np.asarray(rows, dtype=np.int64)
        cfg = self.config
        # each row's readings at their cells' values (the histogram's extra cell is empty: readings are at most B)
        at = np.append(self.candidates, self.candidates[-1]).astype(np.int64)
        values = np.stack([np.repeat(at, c) for c in self.hist[rows].astype(np.int64)])
        return measure_rows(values, self.key[rows], thetas=thetas, bound_units=self.bound_units,
                            threshold_epsilon=cfg.threshold_epsilon or cfg.epsilon)

    def operator(self, r: int) -> ToPS:
        """A ToPS object holding row ``r``'s state: the histogram, block statistics and counters the stream's own
        operator would hold after the same readings (its histogram sparse or dense as that operator's would be)."""
        cfg = self.config
        op = ToPS.__new__(ToPS)
        op.config = cfg
        op._gen = KeyedGenerator(self.key[r].tobytes())
        op._bound_units = self.bound_units
        op.ticks = int(self.ticks[r])
        op.clamped = int(self.clamped[r])
        op.theta_units = op.smoother_layers = op.start_units = None
        op._noise = op._smoother = None
        op._pending = _pending_array(self.bound_units)
        op._candidates = self.candidates
        row = self.hist[r]
        cells = np.flatnonzero(row)
        # a histogram's occupied cells only grow: ToPS turned it dense exactly when they first outnumbered this
        op._hist = row.astype(np.int32) if len(cells) > op._sparse_cells() else dict(
            zip(cells.tolist(), row[cells].tolist(), strict=True))
        op._blocks = op._new_blocks()
        blocks = op._blocks
        if blocks is not None:
            blocks.pos = int(self.pos[r])
            if blocks.widths:
                blocks.partial[:] = self.partial[r]
                blocks.prev[:] = self.prev[r]
                blocks.acc[:] = self.acc[r]
                blocks.pairs[:] = self.pairs[r]
        return op

    def take(self, r: int) -> ToPS:
        """Row ``r``'s stream as its own operator again (:meth:`operator`), and the row freed."""
        op = self.operator(r)
        self.release(r)
        return op


class ShortHoldout(RowStore):
    """Short holdouts (:func:`ends_in_rows` on the exact grid: at most 31 readings) as rows of their readings' cells:
    the histogram a ToPS stream keeps is its cells counted, so a row holds the cell of each reading taken, in order
    (4 bytes a reading, not the 4,297 cells of the exact grid's histogram nor a dict). :meth:`process` takes a batch of
    readings of many rows, :meth:`choose_ends` ends rows that took their last reading (the choices each stream's own
    operator makes, from the rows' cells and keys in a few compiled calls) and :meth:`operator` gives the ToPS object
    holding the very numbers the stream's own operator holds after the same readings (its histogram's cells even in
    the order they were first met), so snapshots, checkpoints and restarts are unchanged."""

    def __init__(self, config: ToPSConfig, capacity: int = 1024, most: int | None = None) -> None:
        if capacity < 1:
            msg = "capacity must be at least 1"
            raise ValueError(msg)
        if not ends_in_rows(config):
            msg = "a short holdout takes a configuration whose holdout ends in rows (ends_in_rows)"
            raise ValueError(msg)
        self.config = config
        self.candidates = candidate_grid(config.span, config.resolution, config.holdout_grid == "compact")
        self.bound_units = math.floor(config.span / config.resolution + 1e-9)
        self.m = config.holdout_ticks
        self.ends_in_rows = True
        super().__init__(capacity, most)

    def _columns(self) -> list[tuple[str, Any, tuple[int, ...]]]:
        return [("cell", np.int32, (self.m,)), ("ticks", np.int64, ()), ("clamped", np.int64, ()),
                ("key", np.uint8, (_KEY_BYTES,))]

    def row_nbytes(self) -> int:
        """Bytes of the columns per row: the whole holdout state of a stream."""
        return 4 * self.m + 16 + _KEY_BYTES

    def add_new(self, key: bytes) -> int:
        """A new stream (no reading yet) with ``key``: the row :meth:`add` makes of ``ToPS(config, key)``."""
        if not isinstance(key, (bytes, bytearray)) or len(key) != _KEY_BYTES:
            msg = f"a stream key is {_KEY_BYTES} bytes"
            raise ValueError(msg)
        reused = bool(self._free)
        r = self._new_row()
        if reused:  # a row never handed out is zeros
            self.ticks[r] = self.clamped[r] = 0
        self.write_key(r, key)
        return r

    def add_new_many(self, keys: list[bytes]) -> np.ndarray:
        """:meth:`add_new` of many new streams at once (a chunk of input's new streams): their rows, in order."""
        _check_keys(keys)
        rows, reused = self.new_rows(len(keys))
        if reused:
            old = rows[:reused]
            self.ticks[old] = self.clamped[old] = 0
        self.write_keys(rows, keys)
        return rows

    def add(self, op: ToPS) -> int:
        """Make a ToPS stream of this configuration in its holdout a row: its histogram's cells, each as often as it
        counts, in the order the stream first met them (what :meth:`operator` rebuilds it from)."""
        if not holdout_eligible(op) or (op.config is not self.config and op.config != self.config):
            msg = "only a ToPS stream of this configuration, in its holdout, becomes a row"
            raise ValueError(msg)
        hist, blocks = op._hist, op._blocks
        # a stored state that does not hold together (a corrupt or forged store: ToPS keeps it as it is) stays an
        # operator: its counts must be its ticks, its block position too
        if type(hist) is not dict or sum(hist.values()) != op.ticks or op.ticks > self.m \
                or any(type(c) is not int or not 0 <= c <= len(self.candidates) or n < 1 for c, n in hist.items()) \
                or (blocks is not None and blocks.pos != op.ticks):
            msg = "the stream's holdout is not one a short row holds"
            raise ValueError(msg)
        r = self._new_row()
        cells = [c for c, n in hist.items() for _ in range(n)]
        self.cell[r, : len(cells)] = cells
        self.ticks[r] = op.ticks
        self.clamped[r] = op.clamped
        self.write_key(r, op._gen._key)
        return r

    def release(self, r: int) -> None:
        """Free row ``r`` (its stream left memory, or took its operator back); its key is wiped."""
        self._give_back(r)

    def release_many(self, rows: np.ndarray) -> None:
        """:meth:`release` of many rows (distinct, in use), in their order."""
        self._give_back_many(np.asarray(rows, dtype=np.int64))

    def left(self, r: int) -> int:
        """Readings row ``r`` still takes before its holdout ends."""
        return max(0, self.m - int(self.ticks[r]))

    def process(self, rows: np.ndarray, values: np.ndarray, *, checked: bool = False, end: bool = False) -> None:
        """Take every reading (``values[i]`` of stream ``rows[i]``), in order: clamped to ``[0, B]`` (counted),
        quantized and put in its cell as ToPS does (``_units_one``, then the cell the histogram counts it in). Each row
        takes at most what it has left (fewer without ``end``). ``checked``: as :meth:`ColumnarHoldout.process`."""
        if not checked:
            rows, values = checked_batch(rows, values, self.rows)
            used, n = np.unique(rows, return_counts=True)
            if used.size and (self.ticks[used] + n > self.m - (not end)).any():
                msg = ("more readings than the holdout has left" if end else
                       "a row's holdout would end here: choose_ends (or its operator) makes the choice")
                raise ValueError(msg)
        if not rows.size:
            return
        cfg = self.config
        clamped = (values > cfg.bound) | (values < 0.0)
        units = np.minimum(np.rint(np.clip(values, 0.0, cfg.bound) / cfg.resolution), self.bound_units)
        cells = np.searchsorted(self.candidates, units.astype(np.int64), side="left")
        order = np.argsort(rows, kind="stable")  # a row's readings in their order: the k-th goes to ticks + k
        ranked = rows[order]
        first = np.ones(ranked.size, dtype=bool)
        first[1:] = ranked[1:] != ranked[:-1]
        starts = np.flatnonzero(first)
        rank = np.arange(ranked.size) - np.repeat(starts, np.diff(np.append(starts, ranked.size)))
        self.cell[ranked, self.ticks[ranked] + rank] = cells[order]
        np.add.at(self.ticks, rows, 1)
        np.add.at(self.clamped, rows, clamped.astype(np.int64))

    def choose_ends(self, rows: np.ndarray) -> tuple[list[int], int, list[float]] | None:
        """:meth:`ColumnarHoldout.choose_ends` for short rows: each row's cells counted (sorted, a run a cell), then
        the same compiled calls."""
        rows = np.asarray(rows, dtype=np.int64)
        if (self.ticks[rows] != self.m).any():
            msg = "choose_ends() takes rows whose holdout took its last reading"
            raise ValueError(msg)
        n = rows.size
        flat = np.sort(self.cell[rows], axis=1).reshape(-1).astype(np.int64)
        owner = np.repeat(np.arange(n), self.m)
        new = np.ones(flat.size, dtype=bool)
        new[1:] = (flat[1:] != flat[:-1]) | (owner[1:] != owner[:-1])
        starts = np.flatnonzero(new)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(owner[starts], minlength=n), out=offsets[1:])
        return choose_small_cells(flat[starts], np.diff(np.append(starts, flat.size)), offsets, self.m,
                                  KeyRows(self.key[rows]), self.candidates, **_choice_parameters(self.config))

    def error_stats(self, rows: np.ndarray, thetas: list[int]) -> list[bytes]:
        """:meth:`ColumnarHoldout.error_stats` for short rows (their cells counted)."""
        rows = np.asarray(rows, dtype=np.int64)
        cfg = self.config
        cells = np.minimum(self.cell[rows, : self.m].astype(np.int64), len(self.candidates) - 1)
        return measure_rows(np.asarray(self.candidates, dtype=np.int64)[cells], self.key[rows], thetas=thetas,
                            bound_units=self.bound_units, threshold_epsilon=cfg.threshold_epsilon or cfg.epsilon)

    def operator(self, r: int) -> ToPS:
        """A ToPS object holding row ``r``'s state, as its own operator holds it after the same readings."""
        op = ToPS(self.config, self.key[r].tobytes())
        ticks = int(self.ticks[r])
        hist: dict[int, int] = {}
        for c in self.cell[r, :ticks].tolist():  # in reading order: the dict's order is the operator's
            hist[c] = hist.get(c, 0) + 1
        op._hist = hist
        if len(hist) > op._sparse_cells():  # the operator turned it dense when its cells first outnumbered this
            op._hist = op._dense_hist()
        if op._blocks is not None:
            op._blocks.pos = ticks
        op.ticks = ticks
        op.clamped = int(self.clamped[r])
        return op

    def take(self, r: int) -> ToPS:
        """Row ``r``'s stream as its own operator again, and the row freed."""
        op = self.operator(r)
        self.release(r)
        return op


class HoldoutRow(RowView):
    """A row of a :class:`ColumnarHoldout` seen as a ToPS operator in its holdout: the public state the daemon reads
    (``phase``, ``holdout_left``, ``ticks``, ``config``, ...), ``snapshot`` (the stream's own operator's), ``frozen``
    (a copy, for a checkpoint taken later) and ``process`` of readings inside the holdout. The reading that ends the
    holdout goes to the operator :meth:`ColumnarHoldout.take` gives back (the daemon's router does so)."""

    __slots__ = ()
    pool: ColumnarHoldout
    phase = "holdout"
    theta = None
    theta_units = None
    smoother_layers = None
    start_units = None

    def __repr__(self) -> str:
        return f"HoldoutRow(row={self.row}, key=<secret>)"

    @property
    def config(self) -> ToPSConfig:
        return self.pool.config

    @property
    def holdout_left(self) -> int:
        return self.pool.left(self.row)

    def process(self, values: Any) -> np.ndarray:
        """NaN for every reading (holdout ticks are never released); all of them must fall inside the holdout."""
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        self.pool.process(np.full(v.size, self.row, dtype=np.int64), v)
        return np.full(v.size, np.nan)

    def snapshot(self, *, stored: bool = False) -> dict[str, Any]:
        return self.pool.operator(self.row).snapshot(stored=stored)

    def frozen(self) -> ToPS:
        """The stream's state as it is now, as its own operator (a copy: the row goes on)."""
        return self.pool.operator(self.row)

"""A stream record's state as it is stored: what a record needs to continue exactly, and how it is put back.

Used by the daemon's checkpoints (:mod:`stream.daemon.durability`, SQLite) and by cluster workers
(:mod:`stream.cluster.worker`, the JetStream key-value store): the same JSON either way. No key and no raw reading is
in it (the holdout histogram while a stream is in its holdout: counts of readings per candidate cell).
"""

from __future__ import annotations

import json
import threading
from functools import partial
from itertools import compress, repeat
from typing import Any

import numpy as np

from operators import ToPS, ToPSConfig
from operators.columnar import RowOperator
from operators.columnar_holdout import HoldoutRow
from stream.core.router import StreamRecord
from stream.core.ticking import CategoryBins, PeriodBins

__all__ = ["STATE_VERSION", "Lent", "RowStates", "apply_state", "operator_snapshot", "record_state", "record_states"]

STATE_VERSION = 1


def record_state(rec: StreamRecord) -> dict[str, Any]:
    """What a stream record needs to continue exactly (no key, no raw reading; the holdout histogram while in it;
    the noisy statistics for its error bars once its holdout ended)."""
    state = {
        "version": STATE_VERSION,
        "operator": _stored_snapshot(rec.operator),
        "last_seq": rec.last_seq,
        "ticks": rec.ticks,
        "bins": _bins_state(rec.bins),
    }
    if rec.error_stats is not None:
        state["error_stats"] = _error_stats_state(rec.error_stats)
    if rec.released_from:
        state["released_from"] = rec.released_from
    return state


def _error_stats_state(noisy: bytes) -> list[float]:
    """The noisy statistics for error bars (operators/error_stats.py) as stored: their numbers, a list."""
    return np.frombuffer(noisy, dtype="<f8").tolist()


def _bins_state(bins: Any) -> dict[str, Any] | None:
    return None if bins is None else {"first": bins.first, "open": [
        [k, [[c, n] for c, n in v.items()] if isinstance(v, dict) else v] for k, v in bins.bins.items()]}


_STRIPES = 64  # locks a cut's lender holds, stream i taking lock i % 64 (not a lock object per stream)


class Lent:
    """The holdouts (ToPS operators, or rows of a columnar holdout) one checkpoint's cut lends to its writer thread,
    with their records' other fields as they were at the cut, in columns: copy on write. A stream's entry is the
    pair ``(lent, i)``: the cut hands it to the writer as the stream's state and puts it in ``StreamRecord.lent``.
    The writer calls :meth:`state` (once per stream); the event loop calls :meth:`detach` before it changes the
    operator, which copies the operator for the writer only if the writer has not taken its state yet. A cut of many
    holdout streams thus costs four list appends and a pair each in the event loop, not a copy of each
    histogram, nor an object and a lock each (the copies happen, one at a time, only for streams that take a reading
    while the write runs).

    Stream ``i``'s operator is guarded by lock ``i % 64``: the event loop waits only while the writer works on that
    very stream or one 64 places away (one lock for all starved it: the writer, holding the interpreter, took the
    free lock again for the next stream at once; with 64 the writer takes another lock for each of the next 63)."""

    __slots__ = ("bins", "done", "locks", "ops", "seqs", "ticks")

    def __init__(self) -> None:
        self.ops: list[ToPS | HoldoutRow | None] = []
        self.seqs: list[int | None] = []
        self.ticks: list[int] = []
        self.bins: list[dict[str, Any] | None] = []
        self.done = bytearray()  # made at the cut's end, one flag a stream (the writer took its state)
        self.locks = [threading.Lock() for _ in range(_STRIPES)]

    def detach(self, i: int) -> None:
        """The event loop is about to change stream ``i``'s operator: the writer keeps a copy of it as it was at
        the cut."""
        with self.locks[i % _STRIPES]:
            if not self.done[i]:
                self.ops[i] = self.ops[i].frozen()

    def state(self, i: int) -> dict[str, Any]:
        """Stream ``i``'s state at the cut (the writer thread; once)."""
        with self.locks[i % _STRIPES]:
            snap = _stored_snapshot(self.ops[i])  # new lists and dicts: nothing in it is the operator's own
            self.done[i], self.ops[i] = True, None
        return {"version": STATE_VERSION, "operator": snap, "last_seq": self.seqs[i], "ticks": self.ticks[i],
                "bins": self.bins[i]}


_ROW_STATE = ('{"version":%d,"operator":{"version":1,"ticks":%d,"clamped":%d,"theta_units":%d,"smoother_layers":%d,'
              '"walk":{"tree":%d,"leaf":%d},"smoother":{"pred":%r,"pos":%d,"leaf_sum":%d,"total":%r,"count":1,'
              '"history":[]}},"last_seq":%s,"ticks":%d,"bins":null%s}')


class RowStates:
    """The states of many rows of a columnar store, as at a checkpoint's cut: the columns' values copied there (one
    gather per column), their JSON texts made later, all at once, by whoever asks first (the writer thread): the cut
    itself does no per-stream Python work. ``text(i)``: the ``i``-th stream's state, the very text
    ``json.dumps(record_state(rec), separators=(",", ":"))`` writes."""

    __slots__ = ("cols", "error_stats", "lock", "released_from", "seqs", "texts", "ticks")

    def __init__(self, cols: dict[str, np.ndarray], seqs: list[int | None], ticks: list[int],
                 error_stats: list[bytes | None] | None = None, released_from: list[int] | None = None) -> None:
        self.cols, self.seqs, self.ticks = cols, seqs, ticks
        self.error_stats = error_stats if error_stats is not None else [None] * len(ticks)
        self.released_from = released_from if released_from is not None else [0] * len(ticks)
        self.texts: list[str] | None = None
        self.lock = threading.Lock()

    def text(self, i: int) -> str:
        texts = self.texts
        if texts is None:
            with self.lock:
                if self.texts is None:
                    self.texts = self._make()
                texts = self.texts
        return texts[i]

    def _make(self) -> list[str]:
        c = self.cols
        fields = zip(c["ticks"].tolist(), c["clamped"].tolist(), c["theta_units"].tolist(),
                     c["smoother_layers"].tolist(), c["tree"].tolist(), c["leaf"].tolist(), c["pred"].tolist(),
                     c["pos"].tolist(), c["leaf_sum"].tolist(), c["total"].tolist(), self.seqs, self.ticks,
                     self.error_stats, self.released_from, strict=True)
        return [_ROW_STATE % (STATE_VERSION, ticks, clamped, theta, s, tree, leaf, pred, pos, leaf_sum, total,
                              "null" if seq is None else json.dumps(seq), rticks,
                              ("" if stats is None else ',"error_stats":' + json.dumps(_error_stats_state(stats),
                                                                                        separators=(",", ":")))
                              + (f',"released_from":{start}' if start else ""))
                for ticks, clamped, theta, s, tree, leaf, pred, pos, leaf_sum, total, seq, rticks, stats, start
                in fields]


def record_states(recs: list[StreamRecord]) -> dict[str, Any]:
    """:func:`record_state` of many records, for a checkpoint's cut: a releasing row of a columnar store (and
    has no open periods) comes as a function making its JSON text (:class:`RowStates`: the columns copied here, the
    texts made by the writer in one pass, about ten times faster than a dict each); a ToPS stream in its holdout
    (its operator, or a row of a columnar holdout, whose copy is its operator) as its pair ``(lent, i)`` of the
    cut's :class:`Lent`, whose ``lent.state(i)`` makes its dict later (copied only if the event loop changes it
    first: the snapshot and its encoding are the writer thread's work); the others as dicts."""
    out: dict[str, Any] = {}
    rows: list[StreamRecord] = []
    lent = Lent()
    ops, seqs, ticks, bins = lent.ops, lent.seqs, lent.ticks, lent.bins
    for rec in recs:
        op = rec.operator
        if type(op) is RowOperator and rec.bins is None:
            rows.append(rec)
        elif (type(op) is ToPS and op.theta_units is None) or type(op) is HoldoutRow:
            # a holdout (an operator or a row of a columnar holdout): lent to the writer, copied on write
            out[rec.name] = rec.lent = (lent, len(ops))
            ops.append(op)
            seqs.append(rec.last_seq)
            ticks.append(rec.ticks)
            bins.append(None if rec.bins is None else _bins_state(rec.bins))
        else:
            out[rec.name] = record_state(rec)
    lent.done = bytearray(len(ops))
    if not rows:
        return out
    ops = [r.operator for r in rows]
    first = ops[0].pool
    groups = [(first, rows, ops)] if all(o.pool is first for o in ops) else _by_pool(rows, ops)
    for pool, group, gops in groups:
        col = pool.snapshot_columns(np.fromiter([o.row for o in gops], dtype=np.int64, count=len(gops)))
        ok = np.isfinite(col["pred"]) & np.isfinite(col["total"])
        if not ok.all():  # not JSON numbers: the general path says so
            for i in np.flatnonzero(~ok).tolist():
                out[group[i].name] = record_state(group[i])
            keep = np.flatnonzero(ok)
            group = [group[i] for i in keep.tolist()]
            col = {k: v[keep] for k, v in col.items()}
        text = RowStates(col, [r.last_seq for r in group], [r.ticks for r in group],
                         [r.error_stats for r in group], [r.released_from for r in group]).text
        out.update(zip([r.name for r in group], map(partial, repeat(text), range(len(group))), strict=True))
    return out


def _by_pool(rows: list[StreamRecord], ops: list[RowOperator]) -> list[tuple[Any, list[StreamRecord], list[Any]]]:
    """Rows of several columnar stores (several templates), grouped by store."""
    by: dict[int, tuple[Any, list[StreamRecord], list[Any]]] = {}
    for rec, op in zip(rows, ops, strict=True):
        g = by.get(id(op.pool))
        if g is None:
            g = by[id(op.pool)] = (op.pool, [], [])
        g[1].append(rec)
        g[2].append(op)
    return list(by.values())


def _stored_snapshot(op: Any) -> dict[str, Any]:
    """The operator's snapshot as stored (:func:`_compact`; a ToPS operator makes it so itself, faster)."""
    return op.snapshot(stored=True) if type(op) is ToPS or type(op) is HoldoutRow else _compact(op.snapshot())


def _compact(snap: dict[str, Any]) -> dict[str, Any]:
    """The operator snapshot as stored: without its ``config`` (the stream's parameters are stored beside it) and
    with the holdout histogram as its non-zero cells (at most ``m`` of them, against one cell per candidate)."""
    snap.pop("config", None)
    hist = snap.get("holdout_histogram")
    if isinstance(hist, list):
        idx = list(compress(range(len(hist)), hist))
        snap["holdout_histogram"] = {"cells": len(hist), "index": idx, "count": [hist[i] for i in idx]}
    return snap


def operator_snapshot(state: dict[str, Any], config: Any) -> dict[str, Any]:
    """The operator snapshot of a stored state, as the operator's ``restore`` takes it."""
    snap = dict(state["operator"])
    if "config" not in snap and isinstance(config, ToPSConfig):
        snap["config"] = config.to_dict()
    hist = snap.get("holdout_histogram")
    if isinstance(hist, dict):
        dense = [0] * int(hist["cells"])
        for i, c in zip(hist["index"], hist["count"], strict=True):
            dense[int(i)] = int(c)
        snap["holdout_histogram"] = dense
    return snap


def apply_state(rec: StreamRecord, state: dict[str, Any]) -> None:
    """Put the non-operator fields of a stored state back into a freshly created record."""
    rec.last_seq = state.get("last_seq")
    rec.ticks = int(state.get("ticks", rec.ticks))
    start = state.get("released_from", 0)
    rec.released_from = start if type(start) is int and 0 <= start <= rec.ticks else 0
    stats = state.get("error_stats")
    if isinstance(stats, list) and len(stats) <= 8192 and all(type(c) in (int, float) and abs(c) < 2.0**62
                                                               for c in stats):
        rec.error_stats = np.asarray(stats, dtype="<f8").tobytes()
    b = state.get("bins")
    if b is not None and isinstance(rec.bins, CategoryBins):
        rec.bins = CategoryBins(int(b["first"]))
        rec.bins.bins = {int(k): {int(c): int(n) for c, n in v} for k, v in b["open"]}
    elif b is not None and rec.bins is not None:
        rec.bins = PeriodBins(int(b["first"]))
        rec.bins.bins = {int(k): float(v) for k, v in b["open"]}

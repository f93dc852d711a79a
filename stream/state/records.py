"""A stream record's state as it is stored: what a record needs to continue exactly, and how it is put back.

Used by the daemon's checkpoints (:mod:`stream.daemon.durability`, SQLite) and by cluster workers
(:mod:`stream.cluster.worker`, the JetStream key-value store): the same JSON either way. No key and no raw reading is
in it (the holdout histogram while a stream is in its holdout: counts of readings per candidate cell).
"""

from __future__ import annotations

import json
import math
import threading
from itertools import compress
from typing import Any

import numpy as np

from operators import ToPS, ToPSConfig
from operators.columnar import RowOperator
from stream.core.router import StreamRecord
from stream.core.ticking import CategoryBins, PeriodBins

__all__ = ["STATE_VERSION", "Lent", "apply_state", "operator_snapshot", "record_state", "record_states"]

STATE_VERSION = 1


def record_state(rec: StreamRecord) -> dict[str, Any]:
    """What a stream record needs to continue exactly (no key, no raw reading; the holdout histogram while in it)."""
    return {
        "version": STATE_VERSION,
        "operator": _compact(rec.operator.snapshot()),
        "last_seq": rec.last_seq,
        "ticks": rec.ticks,
        "bins": _bins_state(rec.bins),
    }


def _bins_state(bins: Any) -> dict[str, Any] | None:
    return None if bins is None else {"first": bins.first, "open": [
        [k, [[c, n] for c, n in v.items()] if isinstance(v, dict) else v] for k, v in bins.bins.items()]}


class Lent:
    """A holdout operator lent by a checkpoint's cut to its writer thread, with the record's other fields as they
    were at the cut: copy on write. The writer calls it for the record's state (under the entry's lock); the event
    loop calls :meth:`detach` before it changes the operator (``StreamRecord.lent``), which copies the operator for
    the writer only if the writer has not taken its state yet. A cut of many holdout streams thus costs a reference
    each in the event loop, not a copy of each histogram (the copies happen, one at a time, only for streams that take
    a reading while the write runs)."""

    __slots__ = ("bins", "done", "last_seq", "lock", "op", "ticks")

    def __init__(self, op: ToPS, last_seq: int | None, ticks: int, bins: dict[str, Any] | None) -> None:
        # a lock of its own: the event loop waits only for the writer's work on this very stream (one lock for all
        # starved it: the writer, holding the interpreter, took the free lock again for the next stream at once)
        self.lock = threading.Lock()
        self.op, self.last_seq, self.ticks, self.bins = op, last_seq, ticks, bins
        self.done = False

    def detach(self) -> None:
        """The event loop is about to change the operator: the writer keeps a copy of it as it was at the cut."""
        with self.lock:
            if not self.done:
                self.op = self.op.frozen()

    def __call__(self) -> dict[str, Any]:
        """The record's state at the cut (the writer thread; once)."""
        with self.lock:
            snap = _compact(self.op.snapshot())  # new lists and dicts: nothing in it is the operator's own
            self.done, self.op = True, None
        return {"version": STATE_VERSION, "operator": snap, "last_seq": self.last_seq, "ticks": self.ticks,
                "bins": self.bins}


_ROW_STATE = ('{"version":%d,"operator":{"version":1,"ticks":%d,"clamped":%d,"theta_units":%d,"smoother_layers":%d,'
              '"walk":{"tree":%d,"leaf":%d},"smoother":{"pred":%r,"pos":%d,"leaf_sum":%d,"total":%r,"count":1,'
              '"history":[]}},"last_seq":%s,"ticks":%d,"bins":null}')


def record_states(recs: list[StreamRecord]) -> dict[str, Any]:
    """:func:`record_state` of many records, for a checkpoint's cut: a stream that is a row of a columnar store (and
    has no open periods) comes as its JSON text, made from the store's columns in one pass (the very text
    ``json.dumps(record_state(rec), separators=(",", ":"))`` writes, about ten times faster); a ToPS stream in its
    holdout as a :class:`Lent` making its dict later (copied only if the event loop changes it first: the snapshot
    and its encoding are the writer thread's work); the others as dicts."""
    out: dict[str, Any] = {}
    rows: dict[int, list[StreamRecord]] = {}  # id(pool) -> its records
    pools: dict[int, Any] = {}
    for rec in recs:
        op = rec.operator
        if type(op) is RowOperator and rec.bins is None:
            rows.setdefault(id(op.pool), []).append(rec)
            pools[id(op.pool)] = op.pool
        elif type(op) is ToPS and op.theta_units is None:  # a holdout: lent to the writer, copied on write
            out[rec.name] = rec.lent = Lent(op, rec.last_seq, rec.ticks, _bins_state(rec.bins))
        else:
            out[rec.name] = record_state(rec)
    for pid, group in rows.items():
        col = pools[pid].snapshot_columns(np.fromiter((r.operator.row for r in group), dtype=np.int64,
                                                      count=len(group)))
        fields = zip(col["ticks"], col["clamped"], col["theta_units"], col["smoother_layers"], col["tree"],
                     col["leaf"], col["pred"], col["pos"], col["leaf_sum"], col["total"], strict=True)
        for rec, (ticks, clamped, theta, s, tree, leaf, pred, pos, leaf_sum, total) in zip(group, fields,
                                                                                              strict=True):
            if not (math.isfinite(pred) and math.isfinite(total)):  # not JSON numbers: the general path says so
                out[rec.name] = record_state(rec)
                continue
            seq = "null" if rec.last_seq is None else json.dumps(rec.last_seq)
            out[rec.name] = _ROW_STATE % (STATE_VERSION, ticks, clamped, theta, s, tree, leaf, pred, pos, leaf_sum,
                                          total, seq, rec.ticks)
    return out


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
    b = state.get("bins")
    if b is not None and isinstance(rec.bins, CategoryBins):
        rec.bins = CategoryBins(int(b["first"]))
        rec.bins.bins = {int(k): {int(c): int(n) for c, n in v} for k, v in b["open"]}
    elif b is not None and rec.bins is not None:
        rec.bins = PeriodBins(int(b["first"]))
        rec.bins.bins = {int(k): float(v) for k, v in b["open"]}

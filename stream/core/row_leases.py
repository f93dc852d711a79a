"""Release rows an intake addresses by row number, without visiting their streams' records.

A stream that is a release row (operators/columnar.py) takes its readings in one compiled pass over the rows of a
chunk. To give such a pass the rows of a chunk's readings without a lookup per reading, an intake keeps, for each
name it knows, the row its stream holds and a **lease**: a number the router gives the row (:meth:`RowLeases.grant`)
and takes back when the stream can no longer take readings at once (it failed, left memory, or has readings waiting
for the step). A lease is checked for a whole chunk at once (:meth:`RowLeases.held`): where it no longer holds, the
readings go the record's way, and the intake asks for a new lease afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from operators.columnar import RowOperator

__all__ = ["RowLeases", "SlotRows"]


class RowLeases:
    """For each row of the router's columnar store: the record of the stream it holds (``records``) and its lease
    (``lease``; 0: none). Leases are numbered from 1 and never reused, so a row freed and handed to another stream
    fails every check of the lease its former stream had."""

    def __init__(self) -> None:
        self.records = np.empty(1024, dtype=object)
        self.lease = np.zeros(1024, dtype=np.int64)
        self._next = 1

    def _room(self, rows: int) -> None:
        if rows > self.lease.size:
            size = max(rows, 2 * self.lease.size, 1024)
            records = np.empty(size, dtype=object)
            records[: self.records.size] = self.records
            lease = np.zeros(size, dtype=np.int64)
            lease[: self.lease.size] = self.lease
            self.records, self.lease = records, lease

    def grant(self, recs: Iterable[Any]) -> tuple[np.ndarray, np.ndarray]:
        """The row and a lease of each of ``recs`` that can take its readings at once (a release row, not failed,
        nothing pending); row -1 and lease 0 for the others."""
        recs = list(recs)
        rows = np.full(len(recs), -1, dtype=np.int64)
        leases = np.zeros(len(recs), dtype=np.int64)
        able = [i for i, rec in enumerate(recs) if rec is not None and type(rec.operator) is RowOperator
                and not rec.failed and rec.pending is None]
        if able:
            at = np.array(able, dtype=np.int64)
            rows[at] = [recs[i].operator.row for i in able]
            self._room(int(rows[at].max()) + 1)
            leases[at] = np.arange(self._next, self._next + len(able), dtype=np.int64)
            self._next += len(able)
            self.records[rows[at]] = [recs[i] for i in able]
            self.lease[rows[at]] = leases[at]
        return rows, leases

    def revoke(self, row: int) -> None:
        """Row ``row``'s stream can no longer take readings at once: its lease ends."""
        if row < self.lease.size:
            self.lease[row] = 0
            self.records[row] = None

    def held(self, rows: np.ndarray, leases: np.ndarray) -> np.ndarray:
        """Whether each ``(rows[i], leases[i])`` still holds (row -1: never granted)."""
        inside = (rows >= 0) & (rows < self.lease.size)
        return inside & (self.lease[np.where(inside, rows, 0)] == leases) & (leases > 0)


class SlotRows:
    """What an intake keeps for each slot of its name table (stream/core/_line_scan.py): the release row of the
    slot's stream and the lease it was granted (row -1: none)."""

    def __init__(self) -> None:
        self.rows = np.full(1024, -1, dtype=np.int64)
        self.leases = np.zeros(1024, dtype=np.int64)

    def of(self, slots: np.ndarray, leases: RowLeases) -> np.ndarray:
        """The row of each slot whose lease still holds, -1 elsewhere (slot -1: a name not in the table)."""
        inside = (slots >= 0) & (slots < self.rows.size)
        at = np.where(inside, slots, 0)
        rows = np.where(inside, self.rows[at], -1)
        ok = leases.held(rows, np.where(inside, self.leases[at], 0))
        return np.where(ok, rows, -1)

    def learn(self, slots: np.ndarray, rows: np.ndarray, leases: np.ndarray) -> None:
        """Slot ``slots[i]``'s stream holds row ``rows[i]`` under lease ``leases[i]``."""
        if not slots.size:
            return
        top = int(slots.max()) + 1
        if top > self.rows.size:
            size = max(top, 2 * self.rows.size, 1024)
            grown_rows = np.full(size, -1, dtype=np.int64)
            grown_rows[: self.rows.size] = self.rows
            grown_leases = np.zeros(size, dtype=np.int64)
            grown_leases[: self.leases.size] = self.leases
            self.rows, self.leases = grown_rows, grown_leases
        self.rows[slots] = rows
        self.leases[slots] = leases

"""The daemon's intake with durable state: every reading the router accepts goes to the journal.

:class:`JournaledIntake` wraps the router's intake (``add``, ``add_many``, ``add_values``, ``release_rows``) and
is what the daemon calls when ``[state] data_dir`` is set: each call is the router's, then the readings it accepted
are appended to the journal in their order (the readings of one message make one line), each with the time its tick
was decided by, and their streams are marked changed for the next checkpoint. The journal's lines are made durable
by the sync loop before any release that depends on them leaves the process (stream/daemon/durability.py).
"""

from __future__ import annotations

import numpy as np

from stream.core.router import Router, StreamRecord
from stream.state.journal import Journal

__all__ = ["JournaledIntake"]


class JournaledIntake:
    """``router``'s intake, each accepted reading appended to ``journal`` and its stream added to ``changed``."""

    def __init__(self, router: Router, journal: Journal, changed: set[str]) -> None:
        self.router = router
        self.journal = journal
        self.changed = changed
        # periods on the wall clock: the arrival time decides the period, whatever the reading's ts
        self.arrival_time = router.clock is not None and not router.event_time
        self._add = router.add
        self._add_many = router.add_many
        self._add_values = router.add_values
        self._release_rows = router.release_rows

    def add(self, rec: StreamRecord, value: float, ts: float | None, seq: int | None, now: float) -> str:
        """``Router.add``, then the accepted reading goes to the journal (with the time its tick was decided by:
        the tick's ts with one reading per tick, the time that chose the period with periods)."""
        result = self._add(rec, value, ts, seq, now)
        if result == "ok":
            t = now if ts is None or self.arrival_time else ts
            self.journal.append_json(rec.name_json, value, t, seq)
            self.changed.add(rec.name)
        return result

    def add_many(self, rec: StreamRecord, values: list[float], ts: list[float | None] | None,
                 seqs: list[int | None] | None, now: float) -> list[int] | None:
        """``Router.add_many``, then the accepted readings of the message go to the journal as one line (each with
        the time its tick was decided by, as in :meth:`add`)."""
        kept = self._add_many(rec, values, ts, seqs, now)
        if kept is not None:
            if not kept:
                return kept
            values = [values[i] for i in kept]
            ts = None if ts is None else [ts[i] for i in kept]
            seqs = None if seqs is None else [seqs[i] for i in kept]
        t: float | list[float] = now if ts is None or self.arrival_time else [now if x is None else x for x in ts]
        self.journal.append_many(rec.name_json, values, t, seqs)
        self.changed.add(rec.name)
        return kept

    def add_values(self, recs: list[StreamRecord], values: list[float], now: float) -> list[int]:
        """``Router.add_values``, then every reading it accepted goes to the journal, in its order (the readings it
        leaves go through :meth:`add`)."""
        left = self._add_values(recs, values, now)
        append, changed = self.journal.append_json, self.changed
        skip = set(left)
        for i, rec in enumerate(recs):
            if i not in skip:
                append(rec.name_json, values[i], now, None)
                changed.add(rec.name)
        return left

    def release_rows(self, rows: np.ndarray, values: np.ndarray, now: float) -> None:
        """``Router.release_rows``, then every reading goes to the journal, in its order."""
        self._release_rows(rows, values, now)
        recs = self.router.leases.records[rows].tolist()
        append, changed = self.journal.append_json, self.changed
        for rec, value in zip(recs, values.tolist(), strict=True):
            append(rec.name_json, value, now, None)
            changed.add(rec.name)

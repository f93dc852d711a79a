"""The state store: SQLite (WAL) in the data directory, mode 0600, written atomically; and the privacy ledger.

Per stream it keeps the parameters, the key *generation* (never a key: keys are derived from the master key file),
and the checkpointed state (the operator snapshot: tick position, holdout histogram until theta is chosen, theta,
perturber walk and smoother state, last ``seq``). A checkpoint of all streams and the journal position it covers are
one transaction, so a crash leaves either the old or the new checkpoint, never a mix. A checkpoint appends the states
(table ``slices``: one row a stream, its latest) at the end of the file instead of rewriting each stream's row where
it lies; :meth:`Store.fold` moves them into the rows later, and readers take the appended state when there is one.

The ledger records, per stream and generation, eps, the holdout size and the dates. Opening a stream with other
privacy parameters than its ledger entry is refused unless a new generation is asked for explicitly: a new
generation has a new key (so no noise is ever reused across parameter sets) and its own ledger entry.

>>> import tempfile, os
>>> st = Store.open(os.path.join(tempfile.mkdtemp(), "state.db"))
>>> st.admit("meter-1", {"epsilon": 1.0, "bound": 10.0}).generation
1
>>> st.admit("meter-1", {"epsilon": 2.0, "bound": 10.0})
Traceback (most recent call last):
...
stream.state.store.PrivacyParametersChanged: stream 'meter-1' was started with other privacy parameters ...
>>> st.admit("meter-1", {"epsilon": 2.0, "bound": 10.0}, new_generation=True).generation
2
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import sqlite3
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream.core.keys import new_identity
from stream.state.disk import refusal

__all__ = ["Admission", "PrivacyParametersChanged", "Store", "StoreError"]

SCHEMA_VERSION = 2  # 2: the appended states (table ``slices``); a store of schema 1 is brought to 2 when opened
# parameters whose change alters the privacy guarantee or the meaning of released values
PRIVACY_KEYS = (
    "mode",
    "method",
    "epsilon",
    "threshold_epsilon",
    "bound",
    "lower",
    "holdout",
    "query_range",
    "fanout",
    "resolution",
    "theta",
    "smoother",
    "smoother_layers",
    "alpha",
    "window",
    "holdout_grid",  # the holdout histogram's cells (a holdout kept in one grid can not continue in the other)
    "holdout_scope",  # a stream's own holdout or the fleet's (a stored holdout of one can not continue as the other)
    "fleet_generation",  # a new fleet holdout: its streams start new generations
    "kind",  # categorical streams (only their params hold these keys)
    "categories",
    "mechanism",
    "neighbours",
    "delta",
    "width",  # range-counting streams
    "buckets",
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS streams (
    name TEXT PRIMARY KEY,
    generation INTEGER NOT NULL,
    params TEXT NOT NULL,
    state TEXT,
    updated TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS slices (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL,
    updated TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    stream TEXT NOT NULL,
    generation INTEGER NOT NULL,
    epsilon REAL,
    threshold_epsilon REAL,
    holdout INTEGER,
    params TEXT NOT NULL,
    started TEXT NOT NULL,
    retired TEXT,
    UNIQUE (stream, generation)
);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    retain INTEGER NOT NULL,
    releases INTEGER NOT NULL
);
"""


class StoreError(Exception):
    """The state store cannot be opened or read: corrupt, of another version, or not accessible."""


class PrivacyParametersChanged(StoreError):
    """A stream's privacy parameters differ from its ledger entry and no new generation was asked for."""


@dataclass(frozen=True, slots=True)
class Admission:
    """A stream admitted by the ledger: its key generation and its checkpointed state (None if new)."""

    name: str
    generation: int
    state: dict[str, Any] | None


_YIELD_AFTER = 0.001  # seconds of encoding in the writer thread between two offers of the interpreter


def _encoded(states: dict[str, Any], now: str, *, polite: bool) -> list[tuple[str, str, str]]:
    """The rows of a checkpoint: each state as JSON text (dicts encoded, functions called for a dict or its text, a
    pair ``(lent, i)`` of a holdout lent by the cut for ``lent.state(i)``: ``stream.state.records.Lent``).

    ``polite`` (the daemon's writer thread): every millisecond of encoding, the interpreter is offered to the event
    loop (``time.sleep(0)`` releases it), which otherwise waits for the interpreter's 5 ms switch each time it wants it
    back; a checkpoint of many holdouts (snapshots and JSON) then takes a small share of the
    loop's time, and more time of its own, while readings flow."""
    rows = []
    mark = time.perf_counter()
    for i, (name, state) in enumerate(states.items()):
        if type(state) is tuple:
            state = state[0].state(state[1])
        elif callable(state):
            state = state()
        rows.append((state if isinstance(state, str) else json.dumps(state, separators=(",", ":")), now, name))
        if polite and i & 7 == 7 and time.perf_counter() - mark >= _YIELD_AFTER:
            time.sleep(0)
            mark = time.perf_counter()
    return rows


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _privacy_view(params: dict[str, Any]) -> dict[str, Any]:
    return {k: params.get(k) for k in PRIVACY_KEYS if k in params}


def _changed_message(name: str, gen: int, old: dict[str, Any], new: dict[str, Any]) -> str:
    diff = ", ".join(f"{k} {old.get(k)} -> {new.get(k)}" for k in PRIVACY_KEYS if old.get(k) != new.get(k))
    return (
        f"stream {name!r} was started with other privacy parameters ({diff}); refusing to mix them. "
        f"Keep the old parameters, or start generation {gen + 1} of this stream explicitly "
        f"(new key, new ledger entry): tops run --new-generation {name} (every changed stream: --new-generation-all)"
    )


class Store:
    """One SQLite file; use :meth:`open`. Not thread-safe: the daemon calls it from its event loop, except
    :meth:`checkpoint` with ``writer=True``, which has its own connection and runs one at a time in a worker thread."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._db = conn
        self._params_json: tuple[dict[str, Any], str] | None = None
        self._wdb: sqlite3.Connection | None = None
        self._pending: dict[str, tuple[Any, ...]] = {}  # deferred admissions (admit(defer=True)), by stream
        self._sliced = True  # whether the store has the appended states' table (a schema 1 store opened read-only not)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, create: bool = True, readonly: bool = False) -> Store:
        """Open (or create, mode 0600) the store; anything wrong stops here with a clear :class:`StoreError`."""
        p = Path(path)
        if not p.exists():
            if readonly or not create:
                msg = f"state store {p} does not exist"
                raise StoreError(msg)
            p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        elif not readonly and p.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            msg = f"state store {p} must not be readable by group or others (chmod 600): it holds private data"
            raise StoreError(msg)
        try:
            if readonly:
                conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True, isolation_level=None)
            else:
                conn = sqlite3.connect(p, isolation_level=None)
            conn.execute("PRAGMA busy_timeout = 5000")
            conn.execute("PRAGMA secure_delete = ON")  # a replaced holdout histogram is overwritten, not left behind
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                msg = (
                    f"state store {p} is corrupt ({check}); refusing to start. Restore it from a backup or move it away"
                )
                raise StoreError(msg)
            if not readonly:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = FULL")
                conn.executescript(_SCHEMA)
                row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
                if row is None:
                    conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
                    conn.execute("INSERT INTO meta VALUES ('created', ?)", (_now(),))
                if conn.execute("SELECT value FROM meta WHERE key = 'identity'").fetchone() is None:
                    if conn.execute("SELECT COUNT(*) FROM streams").fetchone()[0]:
                        msg = (f"state store {p} was made by an older tops without a store identity: its streams' "
                               f"keys would be the same as in any other run; refusing to continue it (move it away "
                               f"and start with a new [state] data_dir)")
                        raise StoreError(msg)
                    conn.execute("INSERT INTO meta VALUES ('identity', ?)", (new_identity(),))
                if row is not None and row[0] == "1":  # schema 1 had no appended states: the table is made above
                    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION),))
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            sliced = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'slices'").fetchone()
        except sqlite3.DatabaseError as exc:
            if refusal(exc) is not None:  # the disk, not the store (a full disk cannot give the WAL its memory map)
                msg = (f"state store {p} cannot be opened: its disk refuses ({exc}; full?); free space in {p.parent} "
                       f"and start again (the store is unchanged)")
            else:
                msg = f"state store {p} is not a readable tops store ({exc}); refusing to start"
            raise StoreError(msg) from None
        # an older tops refuses schema 2 (it would not see the appended states and would continue from older ones)
        readable = {str(SCHEMA_VERSION), "1"} if readonly else {str(SCHEMA_VERSION)}  # read-only: read as it is
        if row is None or row[0] not in readable:
            msg = f"state store {p} has schema {row[0] if row else 'none'}, this tops reads {SCHEMA_VERSION}"
            raise StoreError(msg)
        st = cls(p, conn)
        st._sliced = sliced is not None
        return st

    @property
    def identity(self) -> str:
        """The random identity drawn when this store was created (stream keys derive from it; not secret)."""
        ident = self.meta("identity")
        if ident is None:
            msg = f"state store {self.path} has no identity"
            raise StoreError(msg)
        return ident

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            if self._wdb is not None:
                self._wdb.close()
            self._db.close()

    # -- the ledger ---------------------------------------------------------------------------------------------
    def admit(self, name: str, params: dict[str, Any], *, new_generation: bool = False,
              defer: bool = False) -> Admission:
        """Check ``params`` against the ledger; return the generation and checkpointed state of the stream.

        A new stream gets generation 1 and a ledger entry. An existing one must have the same privacy parameters,
        unless ``new_generation``: then the old entry is retired, the generation goes up by one (a new key) and its
        state starts afresh. ``defer``: the entry is written by the next :meth:`checkpoint` (in its transaction,
        before the states) instead of a transaction of its own; until then this store answers for the stream from
        memory. Safe because the generation is a function of what is durable: a crash before that checkpoint loses
        the entry, and the restart, re-processing the same readings from the journal, admits the stream again to
        the very same generation (the same key on the same data).
        """
        pending = self._pending.get(name)
        if pending is not None:  # admitted in this run, its entry not written yet
            return Admission(name, pending[1], None)
        db = self._db
        row = db.execute(self._read_sql + " WHERE s.name = ?", (name,)).fetchone()
        if row is not None:
            gen, state = int(row[0]), row[2]
            if row[1] == self._params_text(params):  # the usual case: the very parameters it was stored with
                return Admission(name, gen, json.loads(state) if state else None)
            old, new = _privacy_view(json.loads(row[1])), _privacy_view(params)
            if old == new:
                return Admission(name, gen, json.loads(state) if state else None)
            if not new_generation:
                raise PrivacyParametersChanged(_changed_message(name, gen, old, new))
            gen += 1
        else:  # new, or retired: a retired name comes back as its next generation (a new key, never an old one)
            last = db.execute("SELECT MAX(generation) FROM ledger WHERE stream = ?", (name,)).fetchone()[0]
            gen = 1 if last is None else int(last) + 1
        entry = (name, gen, params.get("epsilon"), params.get("threshold_epsilon") or params.get("epsilon"),
                 params.get("holdout"), self._params_text(params), _now())
        if defer:
            self._pending[name] = entry
        else:
            with self._transaction():
                self._write_admissions(db, [entry])
        return Admission(name, gen, None)

    @property
    def _read_sql(self) -> str:
        """Generation, parameters and latest state of streams ``s``: the appended state if there is one, else the
        stream row's (an appended state is always of the stream's generation: a new generation's admission deletes
        the old one's, as retiring does)."""
        if not self._sliced:
            return "SELECT s.generation, s.params, s.state, s.name, s.updated FROM streams AS s"
        return ("SELECT s.generation, s.params, coalesce(a.state, s.state), s.name, coalesce(a.updated, s.updated) "
                "FROM streams AS s LEFT JOIN slices AS a ON a.name = s.name")

    @staticmethod
    def _write_admissions(db: sqlite3.Connection, entries: list[tuple[Any, ...]]) -> None:
        """The ledger entries (and stream rows, state empty) of admitted streams; the caller's transaction. A new
        generation's stream row starts empty, and the old generation's appended state goes."""
        db.executemany("UPDATE ledger SET retired = ? WHERE stream = ? AND retired IS NULL",
                       [(e[6], e[0]) for e in entries])
        db.executemany("DELETE FROM slices WHERE name = ?", [(e[0],) for e in entries if e[1] > 1])
        db.executemany("INSERT INTO ledger (stream, generation, epsilon, threshold_epsilon, holdout, params, started) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)", entries)
        db.executemany(
            "INSERT INTO streams (name, generation, params, state, updated) VALUES (?, ?, ?, NULL, ?) "
            "ON CONFLICT(name) DO UPDATE SET generation = excluded.generation, params = excluded.params, "
            "state = NULL, updated = excluded.updated",
            [(e[0], e[1], e[5], e[6]) for e in entries],
        )

    def take_admissions(self) -> list[tuple[Any, ...]]:
        """The deferred admissions so far, for a checkpoint to write (it hands them back if it fails)."""
        out = list(self._pending.values())
        self._pending = {}
        return out

    def return_admissions(self, entries: list[tuple[Any, ...]]) -> None:
        """A checkpoint that failed: its admissions wait for the next one."""
        for e in entries:
            self._pending.setdefault(e[0], e)

    def _params_text(self, params: dict[str, Any]) -> str:
        """``params`` as the store writes them (made once per parameters object: every stream shares the daemon's)."""
        got = self._params_json
        if got is None or got[0] is not params:
            got = self._params_json = (params, json.dumps(params, sort_keys=True))
        return got[1]

    def privacy_mismatches(self, params: dict[str, Any], skip: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """What :meth:`admit` would refuse, for every stored stream at once (``tops run --check`` lists them all;
        the start runs it too, since stored streams are restored when their next reading comes). One pass over the
        distinct parameter sets (streams of one template share one), then the streams of those that differ."""
        new = _privacy_view(params)
        return sorted(_changed_message(name, gen, _privacy_view(json.loads(pj)), new)
                      for name, gen, pj in self._changed(params) if name not in skip)

    def changed_streams(self, params: dict[str, Any]) -> list[str]:
        """The stored streams whose privacy parameters differ from ``params``, in name order."""
        return sorted(name for name, _, _ in self._changed(params))

    def _changed(self, params: dict[str, Any]) -> list[tuple[str, int, str]]:
        new = _privacy_view(params)
        out = []
        for (pj,) in self._db.execute("SELECT DISTINCT params FROM streams").fetchall():
            if _privacy_view(json.loads(pj)) == new:
                continue
            out += [(name, int(gen), pj) for name, gen in self._db.execute(
                "SELECT name, generation FROM streams WHERE params = ? ORDER BY name", (pj,))]
        return out

    def count_streams(self) -> int:
        """How many streams the store holds."""
        return int(self._db.execute("SELECT COUNT(*) FROM streams").fetchone()[0])

    def has_stream(self, name: str) -> bool:
        """Whether the store holds ``name``."""
        return self._db.execute("SELECT 1 FROM streams WHERE name = ?", (name,)).fetchone() is not None

    def stream_names(self) -> list[str]:
        """The stored streams' names, in order."""
        return [r[0] for r in self._db.execute("SELECT name FROM streams ORDER BY name")]

    def retire(self, name: str) -> bool:
        """Retire a stream for good: its state leaves the store (its slot and memory with it) and its ledger entry
        is closed. Should the name come back, it starts as the next generation (a new key). False if unknown."""
        with self._transaction():
            cur = self._db.execute("DELETE FROM streams WHERE name = ?", (name,))
            if cur.rowcount == 0:
                return False
            self._db.execute("DELETE FROM slices WHERE name = ?", (name,))
            self._db.execute("UPDATE ledger SET retired = ? WHERE stream = ? AND retired IS NULL", (_now(), name))
        return True

    def ledger(self) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT stream, generation, epsilon, threshold_epsilon, holdout, started, retired FROM ledger ORDER BY id"
        ).fetchall()
        keys = ("stream", "generation", "epsilon", "threshold_epsilon", "holdout", "started", "retired")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    # -- checkpoints --------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _transaction(self, db: sqlite3.Connection | None = None):
        db = self._db if db is None else db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield
            db.execute("COMMIT")
        except BaseException:
            # a COMMIT the disk refused (SQLITE_FULL) may leave the transaction open: roll it back, so that the
            # retry starts a new one (SQLite may have rolled it back already: then ROLLBACK fails, harmlessly)
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise

    def checkpoint(
        self,
        states: dict[str, Any],
        journal_position: int,
        outbox: list[tuple[str, bytes, bool, int]] | None = None,
        meta: dict[str, str] | None = None,
        *,
        writer: bool = False,
        admissions: list[tuple[Any, ...]] | None = None,
        clear_rows: set[str] | frozenset[str] | list[str] = frozenset(),
    ) -> None:
        """Write the states of the given streams (dicts, their JSON text, or functions making either) and the
        journal position they cover, in one transaction.

        A state is *appended* (table ``slices``, one row per stream: its latest state, the older one deleted), not
        written into the stream's row: the rows of a checkpoint go to the table's end, a few pages written in
        order, where updating them in place writes one page per stream wherever it lies (10,000 streams of a
        million: 40 MB of pages to the write-ahead log). :meth:`fold` moves them into the stream rows later.
        ``clear_rows``: streams whose row's state (an older one, put there by a fold) goes now, not at the next
        fold (the daemon's streams that left their holdout: the row may hold a holdout histogram; their appended
        holdout state is replaced like any other, and ``secure_delete`` overwrites both).

        ``outbox``: the messages not yet confirmed by the broker (replaces the stored outbox; None keeps it).
        ``meta``: more ``meta`` values to write in the same transaction. ``writer``: on the checkpoints' own
        connection (:meth:`_writer`; the daemon calls it from a worker thread, one checkpoint at a time).
        ``admissions``: deferred ledger entries (:meth:`take_admissions`), written first.
        """
        rows = self.encode(states, polite=writer)  # before the transaction: it holds the write lock
        self.commit_checkpoint(rows, journal_position, outbox, meta, writer=writer, admissions=admissions,
                               clear_rows=clear_rows)

    @staticmethod
    def encode(states: dict[str, Any], *, polite: bool = False) -> list[tuple[str, str, str]]:
        """The rows :meth:`commit_checkpoint` writes: each state's JSON text (made once: a lent holdout gives its
        state once), with the time."""
        return _encoded(states, _now(), polite=polite)

    def commit_checkpoint(
        self,
        rows: list[tuple[str, str, str]],
        journal_position: int,
        outbox: list[tuple[str, bytes, bool, int]] | None = None,
        meta: dict[str, str] | None = None,
        *,
        writer: bool = False,
        admissions: list[tuple[Any, ...]] | None = None,
        clear_rows: set[str] | frozenset[str] | list[str] = frozenset(),
    ) -> None:
        """:meth:`checkpoint`'s transaction, of states already encoded (:meth:`encode`): all or nothing, so it can
        be tried again after the disk refused it."""
        db = self._writer() if writer else self._db
        with self._transaction(db):
            if admissions:
                self._write_admissions(db, admissions)
            if outbox is not None:
                db.execute("DELETE FROM outbox")
                db.executemany(
                    "INSERT INTO outbox (topic, payload, retain, releases) VALUES (?, ?, ?, ?)",
                    [(t, bytes(p), int(r), int(n)) for t, p, r, n in outbox],
                )
            if clear_rows:  # a row never folded has no state: looked up, not written
                db.executemany("UPDATE streams SET state = NULL WHERE name = ? AND state IS NOT NULL",
                               [(n,) for n in clear_rows])
            db.executemany("INSERT OR REPLACE INTO slices (state, updated, name) VALUES (?, ?, ?)", rows)
            db.execute(
                "INSERT INTO meta VALUES ('journal_position', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (str(journal_position),),
            )
            for key, value in (meta or {}).items():
                db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                           (key, value))

    def appended(self, *, writer: bool = False) -> int:
        """How many appended states wait for :meth:`fold`."""
        return int((self._writer() if writer else self._db).execute("SELECT COUNT(*) FROM slices").fetchone()[0])

    def fold(self, *, writer: bool = False) -> int:
        """Move the appended states into their streams' rows, in one transaction (the daemon folds once
        ``[state] fold_after`` of them wait, in its checkpoints' worker thread); returns how many moved."""
        db = self._writer() if writer else self._db
        with self._transaction(db):
            # in the rows' order: neighbouring rows share pages (3.6 s for 100,000 of a million, against 4.3-6.2 s in
            # the join's order and 5.7 s for as many updates in place, one checkpoint of 10,000 at a time)
            rows = db.execute("SELECT a.state, a.updated, s.rowid FROM slices AS a JOIN streams AS s "
                              "ON s.name = a.name ORDER BY s.rowid").fetchall()
            db.executemany("UPDATE streams SET state = ?, updated = ? WHERE rowid = ?", rows)
            db.execute("DELETE FROM slices")  # and any state of a stream no longer in the store
        return len(rows)

    def _writer(self) -> sqlite3.Connection:
        """The checkpoints' own connection (opened at the first one), usable from a worker thread: a checkpoint's
        transaction runs there while the event loop reads and admits through the main one (WAL: readers do not
        wait for it; a new stream's ledger entry waits for its commit)."""
        if self._wdb is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 5000")
            conn.execute("PRAGMA secure_delete = ON")  # per connection: replaced holdout histograms are overwritten
            conn.execute("PRAGMA synchronous = FULL")
            self._wdb = conn
        return self._wdb

    def outbox(self) -> list[tuple[str, bytes, bool, int]]:
        """The messages of the last checkpoint that the broker had not confirmed, in order."""
        rows = self._db.execute("SELECT topic, payload, retain, releases FROM outbox ORDER BY id").fetchall()
        return [(str(t), bytes(p), bool(r), int(n)) for t, p, r, n in rows]

    def meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self._db.execute(
            "INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value)
        )

    def purge_freed_pages(self, *, writer: bool = False) -> None:
        """Fold the WAL into the database and truncate it (old page images, e.g. a holdout histogram, go away).
        It waits for other writers; ``writer``: on the checkpoints' connection (from their worker thread)."""
        (self._writer() if writer else self._db).execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def journal_position(self) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'journal_position'").fetchone()
        return int(row[0]) if row else 0

    def streams(self) -> list[dict[str, Any]]:
        """Every stream with its generation, parameters and checkpointed state (for ``tops state`` and restarts)."""
        rows = self._db.execute(self._read_sql + " ORDER BY s.name")
        return [
            {
                "name": r[3],
                "generation": int(r[0]),
                "params": json.loads(r[1]),
                "state": json.loads(r[2]) if r[2] else None,
                "updated": r[4],
            }
            for r in rows
        ]

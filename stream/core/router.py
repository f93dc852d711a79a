"""Routing by stream name to per-stream operators, created on first sight by the router's :class:`StreamMaker`.

Every stream has one :class:`StreamRecord`: its name, operator, last ``seq``, tick counter and what waits to be
processed. It is the one place that holds a stream's state (what a checkpoint will save). ``flush`` processes
each stream's pending ticks as one batch with ``operator.process`` (the same code as ``tops replay``) and hands
the released ticks to ``emit``.

A stream whose operator raises is marked *failed* (:meth:`Router.fail`): its status says so, it takes no more
readings (result ``failed``) until the daemon restarts, and the other streams go on. A stream idle for
``[streams] idle_timeout`` leaves memory (:meth:`Router.evict`, after a checkpoint of its state: see the daemon).

The router is its own intake (``add``, ``add_many``, ``add_values``); a layer over it (the journal of durable state,
stream/state/journaled.py) wraps the router object and is what the daemon calls. How a new stream is made is the
router's :class:`StreamMaker`, given at construction (durable state gives one that admits it through the privacy
ledger and restores its stored state, stream/state/admission.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from json.encoder import encode_basestring_ascii  # json.dumps of a str, without its checks
from operator import attrgetter
from typing import Any

import numpy as np

from operators.columnar import ColumnarRelease, RowOperator, born_releasing, columnar_eligible, rows_hold
from operators.columnar_holdout import (
    MIN_HOLDOUT_LEFT,
    ColumnarHoldout,
    HoldoutRow,
    born_in_rows,
    ends_in_rows,
    holdout_eligible,
    holdout_store,
)
from operators.config import ToPSConfig
from operators.tops import ToPS, choose_ends
from stream.core.errors import StreamCapError
from stream.core.row_leases import RowLeases
from stream.core.ticking import CategoryBins, PeriodBins, PeriodClock

__all__ = ["ReleaseBatch", "Releases", "Router", "RowReleases", "StreamMaker", "StreamRecord"]

log = logging.getLogger("tops.router")

_row_of = attrgetter("operator.row")

_COUNTS = ("ok", "late", "duplicate", "invalid", "failed")
ROWS_ENDED_TOGETHER = 8192  # holdout rows ending in one step are chosen this many at a time (bounds the arrays)


@dataclass(slots=True, eq=False)
class StreamRecord:
    """Everything the daemon knows about one stream (no secret: the key lives only inside the operator)."""

    name: str
    operator: Any
    name_json: str
    last_seq: int | None = None
    own_ticks: int = 0  # :attr:`ticks` of a stream that is not a release row (a release row counts them in its row)
    pending: list[float] | None = None  # readings waiting for the next step (None: none; no list per idle stream)
    pending_ts: list[float] | None = None
    bins: PeriodBins | None = None
    phase: str = "holdout"
    status_due: bool = True
    identity: str = ""  # the run's or the store's identity its key derives from (stream/core/keys.py; not secret)
    failed: bool = False
    last_seen: float = 0.0  # time.monotonic() of the last reading taken (idle eviction)
    seen_window: int = -1  # the idle window of ``last_seen`` (Router.seen), when eviction runs
    lent: Any = None  # a checkpoint's writer may still read this holdout operator: ``(lent, i)``, whose
    # ``lent.detach(i)`` comes before changing it (stream/state/records.py)
    generation: int = 1  # the key's generation (stream/core/keys.py; a new generation restarts the ticks)
    error_stats: bytes | None = None  # the holdout's statistics for error bars (operators/error_stats.py)
    # the tick its hierarchy starts at, where a fleet holdout took its first readings (its status states it); else 0
    released_from: int = 0
    described: bool = False  # its status line went to stdout in this run (stream/core/sinks.py)

    @property
    def ticks(self) -> int:
        """Ticks processed so far, holdout included (= the next tick's number). A release row's are its row's
        ``ticks`` column, which the compiled release pass advances: the record is not visited per reading."""
        op = self.operator
        return int(op.pool.ticks[op.row]) if type(op) is RowOperator else self.own_ticks

    @ticks.setter
    def ticks(self, n: int) -> None:
        self.own_ticks = n

    def status(self) -> dict[str, Any]:
        """The retained status message of this stream (with the identity that ``tops replay --identity`` takes)."""
        if self.failed:
            return {"stream": self.name, "phase": "failed", "identity": self.identity} if self.identity else {
                "stream": self.name, "phase": "failed"}
        op = self.operator
        if getattr(op, "takes_categories", False):
            cfg = op.config
            st = {"stream": self.name, "phase": "releasing", "mechanism": getattr(cfg, "mechanism", "countofcounts"),
                  "epsilon": cfg.report_epsilon}
            if hasattr(cfg, "leaves"):
                st.update(kind="countofcounts", max_size=cfg.max_size, leaves=len(cfg.leaves))
            elif hasattr(cfg, "buckets"):
                st.update(kind="range", lower=cfg.lower, width=cfg.width, buckets=cfg.buckets)
            else:
                st.update(kind="categorical", categories=cfg.categories)
        elif op.phase == "holdout":
            st = {"stream": self.name, "phase": "holdout", "holdout_left": int(op.holdout_left)}
            if getattr(op.config, "holdout_scope", "stream") == "fleet":
                st["holdout_scope"] = "fleet"  # holdout_left counts the readings the template's fleet holdout takes
        else:
            st = {"stream": self.name, "phase": "releasing", "theta": float(op.theta)}
        if self.identity:
            st["identity"] = self.identity
            st["generation"] = self.generation
        return st


@dataclass(slots=True)
class ReleaseBatch:
    """Released ticks of one stream from one processing step (parallel lists)."""

    record: StreamRecord
    ticks: list[int]
    ts: list[float]
    values: list[float]
    theta: float


@dataclass(slots=True)
class RowReleases:
    """The releases of release rows from one processing step, as columns: stream ``i`` (``records[i]``, with theta
    ``theta[i]``) released ``counts[i]`` ticks from ``first_tick[i]`` on, and they are the next ``counts[i]`` entries
    of ``ts`` and ``values`` (streams one after another, each in tick order)."""

    records: list[StreamRecord]
    first_tick: np.ndarray  # int64, per stream
    counts: np.ndarray  # int64, per stream
    ts: np.ndarray  # float64, per release
    values: np.ndarray  # float64, per release
    theta: np.ndarray  # float64, per stream

    def __len__(self) -> int:
        return len(self.records)

    @staticmethod
    def joined(parts: list[RowReleases]) -> RowReleases | None:
        """The releases of ``parts`` one after another (None: no part)."""
        if len(parts) < 2:
            return parts[0] if parts else None
        return RowReleases([rec for p in parts for rec in p.records],
                           *(np.concatenate([getattr(p, f) for p in parts])
                             for f in ("first_tick", "counts", "ts", "values", "theta")))

    def batches(self) -> list[ReleaseBatch]:
        """The same releases as a :class:`ReleaseBatch` a stream (what consumers that take batches read)."""
        ts, values = self.ts.tolist(), self.values.tolist()
        out, at = [], 0
        for rec, t, n, theta in zip(self.records, self.first_tick.tolist(), self.counts.tolist(),
                                    self.theta.tolist(), strict=True):
            out.append(ReleaseBatch(rec, [t] if n == 1 else list(range(t, t + n)), ts[at:at + n], values[at:at + n],
                                    theta))
            at += n
        return out


class Releases(Sequence[ReleaseBatch]):
    """One processing step's releases: those of release rows as columns (``rows``, written in bulk by the stdout
    sink), then the others as a :class:`ReleaseBatch` a stream (``others``). Read as a sequence, it is every stream's
    batch in that order (made from the columns when first read so)."""

    __slots__ = ("_all", "others", "rows")

    def __init__(self, rows: RowReleases | None = None, others: list[ReleaseBatch] | None = None) -> None:
        self.rows = rows
        self.others = others if others is not None else []
        self._all: list[ReleaseBatch] | None = None

    def _batches(self) -> list[ReleaseBatch]:
        if self._all is None:
            self._all = (self.rows.batches() if self.rows is not None else []) + self.others
        return self._all

    def __len__(self) -> int:
        return (len(self.rows) if self.rows is not None else 0) + len(self.others)

    def __iter__(self) -> Iterator[ReleaseBatch]:
        return iter(self._batches())

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        return self._batches()[i]


def _by_store(recs: Iterable[StreamRecord]) -> list[tuple[Any, list[StreamRecord]]]:
    """Streams that are rows of columnar holdouts, grouped by the store that holds their row (each store once, in the
    order first met; a store is told apart by identity, not by its configuration's hash)."""
    groups: dict[int, tuple[Any, list[StreamRecord]]] = {}
    for rec in recs:
        store = rec.operator.pool
        g = groups.get(id(store))
        if g is None:
            g = groups[id(store)] = (store, [])
        g[1].append(rec)
    return list(groups.values())


def _name_of(rec: StreamRecord) -> str:
    return rec.name


class StreamMaker:
    """How a router makes a new stream: the operator from ``factory(name)``; the record starts from nothing.

    A subclass given to the router at construction changes both (stream/state/admission.py: the ledger admits the
    stream, and a stored one is restored)."""

    def __init__(self, factory: Callable[[str], Any]) -> None:
        self.factory = factory

    def operator(self, name: str, router: Router) -> Any:
        """The operator of the new stream ``name`` (``router``: where rows of its columnar stores are made)."""
        return self.factory(name)

    def made(self, rec: StreamRecord) -> None:
        """The router made the record of a new stream (its operator from :meth:`operator`): nothing to add here."""


class Router:
    """Streams by name, made by ``maker`` on first sight (a plain ``factory(name)`` is a :class:`StreamMaker` of
    it), at most ``max_streams`` of them."""

    def __init__(self, maker: StreamMaker | Callable[[str], Any], max_streams: int, *,
                 clock: PeriodClock | None = None, aggregate: str = "sum", event_time: bool = False,
                 close_in_period_order: Callable[[], bool] | None = None) -> None:
        self.maker = maker if isinstance(maker, StreamMaker) else StreamMaker(maker)
        # while this says so (a fleet holdout takes period values), closed periods are processed period by period
        # and, within a period, in the order of the streams' names: what the holdout takes does not depend on the
        # order streams were first seen or restored in, nor on how many periods one pass closes
        self.close_in_period_order = close_in_period_order
        self.max_streams = max_streams
        self.clock = clock  # None: one reading = one tick
        self.count_events = aggregate == "count"
        self.event_time = event_time
        self.streams: dict[str, StreamRecord] = {}
        self.dirty: dict[str, StreamRecord] = {}
        self.in_holdout = 0
        self.counts = dict.fromkeys(_COUNTS, 0)
        self.failed = 0  # streams marked failed
        self.ticks_processed = 0
        self.ticks_total = 0  # ticks processed since the start, never reset (checkpoint every N ticks)
        self.latencies: list[float] = []
        # new streams and phase changes, with the phase each change made (None: a status that changes no phase,
        # e.g. a local stream's refined control): their status goes out at once, the changes are logged
        self.status_now: list[tuple[StreamRecord, str | None]] = []
        # streams whose status became due (a holdout took a reading): the status loop visits these, not every
        # stream; None (kept by nobody) when no status loop runs
        self.status_pending: set[str] | None = None
        # idle eviction (:meth:`track_idle`): the names last seen in each window of ``idle_window`` seconds, so that
        # finding the idle streams visits old windows, not every stream
        self.idle_window = 0.0
        self.seen: dict[int, set[str]] | None = None
        # releasing ToPS streams as rows of one columnar store, released together in one compiled pass per flush
        # (operators/columnar.py); None: every stream keeps its own operator object
        self.pool: ColumnarRelease | None = None
        # ToPS streams in their holdout on the compact grid as rows of one columnar store per configuration, counted
        # together in one compiled pass per flush (operators/columnar_holdout.py); None: not used
        self.holdouts: dict[Any, ColumnarHoldout] | None = None
        self._holdout_of: dict[int, ColumnarHoldout] = {}  # id of a configuration object -> its columnar holdout
        self._released: list[RowReleases] = []  # releases of rows made before the step's flush (add_values)
        self.leases = RowLeases()  # the release rows an intake may address by row number (release_rows)

    def use_columns(self, capacity: int = 1024, ahead: int = 16, *, rows: ColumnarRelease | None = None) -> None:
        """Keep releasing ToPS streams (Recent smoother, lower = 0) as rows of one columnar store from now on, each
        with the noise of ``ahead`` leaves drawn ahead, and ToPS streams in their holdout on the compact grid as rows of
        a columnar holdout. The rows that run out of noise in a step are refilled together in one compiled call, and a
        row keeps its walk between refills, so a refill's draws do not depend on ``ahead``: 16 leaves (the default
        fanout, so a refill enters whole leaf groups) cost 128 B of a row. ``rows``: the columnar store to use (a
        test's, which fails on demand) instead of a new one."""
        if self.pool is None:
            self.pool = rows if rows is not None else ColumnarRelease(capacity=max(1, min(capacity, self.max_streams)),
                                                                      ahead=ahead, most=self.max_streams)
        if self.holdouts is None:
            self.holdouts = {}

    def _adopt(self, rec: StreamRecord) -> None:
        """A stream that is releasing becomes a row of the columnar store (when there is one and it fits)."""
        if self.pool is not None and columnar_eligible(rec.operator):
            rec.operator = RowOperator(self.pool, self.pool.add(rec.operator))

    def _adopt_holdout(self, rec: StreamRecord) -> None:
        """A stream in its holdout (on the compact grid, with at least ``MIN_HOLDOUT_LEFT`` readings to come or a
        holdout that ends in rows: ``ends_in_rows``) becomes a row of its configuration's columnar holdout."""
        op = rec.operator
        if self.holdouts is not None and holdout_eligible(op) and (op.holdout_left >= MIN_HOLDOUT_LEFT
                                                                    or ends_in_rows(op.config)):
            store = self._holdout_store(op.config)
            try:
                rec.operator = HoldoutRow(store, store.add(op))
            except ValueError:  # numbers a row cannot hold (a stored state counting more than a holdout can)
                pass

    def _holdout_store(self, cfg: ToPSConfig) -> ColumnarHoldout:
        """The columnar holdout of a configuration (made at its first stream)."""
        assert self.holdouts is not None
        store = self._holdout_of.get(id(cfg))  # by identity first: cheaper than hashing the configuration
        if store is None or store.config is not cfg:
            store = self.holdouts.get(cfg)
            if store is None:
                store = self.holdouts[cfg] = holdout_store(cfg, min(1024, self.max_streams), self.max_streams)
            self._holdout_of[id(cfg)] = store  # the store keeps its configuration: the id cannot be reused
        return store

    def holdout_row(self, cfg: ToPSConfig, key: bytes) -> HoldoutRow:
        """A new ToPS stream of ``cfg`` with ``key`` as the holdout row :meth:`record` would make of ``ToPS(cfg, key)``
        (``born_in_rows(cfg)``, after :meth:`use_columns`), without building that operator: what a daemon's factory
        returns for each new stream of such a configuration."""
        if self.holdouts is None or not born_in_rows(cfg):
            msg = "only a configuration whose new streams are holdout rows, once the router uses columns"
            raise ValueError(msg)
        store = self._holdout_store(cfg)
        return HoldoutRow(store, store.add_new(key))

    def holdout_rows(self, cfg: ToPSConfig, keys: list[bytes]) -> list[HoldoutRow]:
        """:meth:`holdout_row` of many new streams at once (their rows made together), in order."""
        if self.holdouts is None or not born_in_rows(cfg):
            msg = "only a configuration whose new streams are holdout rows, once the router uses columns"
            raise ValueError(msg)
        store = self._holdout_store(cfg)
        return [HoldoutRow(store, r) for r in store.add_new_many(keys).tolist()]

    def release_row(self, cfg: ToPSConfig, key: bytes) -> RowOperator:
        """A new ToPS stream of ``cfg`` (a public theta: ``born_releasing(cfg)``) with ``key`` as the release row
        :meth:`record` would make of ``ToPS(cfg, key)``, after :meth:`use_columns`, without building that operator."""
        if self.pool is None or not born_releasing(cfg):
            msg = "only a configuration with a public theta whose streams rows hold, once the router uses columns"
            raise ValueError(msg)
        return RowOperator(self.pool, self.pool.add_new(cfg, key))

    def release_rows_new(self, cfg: ToPSConfig, keys: list[bytes]) -> list[RowOperator]:
        """:meth:`release_row` of many new streams at once (their rows made together), in order."""
        if self.pool is None or not born_releasing(cfg):
            msg = "only a configuration with a public theta whose streams rows hold, once the router uses columns"
            raise ValueError(msg)
        pool = self.pool
        return [RowOperator(pool, r) for r in pool.add_new_many(cfg, keys).tolist()]

    def record(self, name: str, now: float | None = None) -> StreamRecord:
        """The stream's record, created on first sight; :class:`StreamCapError` past the cap. ``now``: the time
        of the reading that creates it (its periods open from there; default: the clock now)."""
        rec = self.streams.get(name)
        if rec is not None:
            return rec
        if len(self.streams) >= self.max_streams:
            msg = f"stream cap of {self.max_streams} reached"
            raise StreamCapError(msg)
        op = self.maker.operator(name, self)
        rec = StreamRecord(name=name, operator=op, name_json=encode_basestring_ascii(name), phase=op.phase,
                           last_seen=time.monotonic(), error_stats=getattr(op, "error_stats", None))
        if self.clock is not None:
            first = self.clock.last_closable(time.time() if now is None else now) + 1
            rec.bins = CategoryBins(first) if getattr(op, "takes_categories", False) else PeriodBins(first)
        self.streams[name] = rec
        if self.seen is not None:
            self._seen_now(rec)
        if rec.phase == "holdout":
            self.in_holdout += 1
            self._adopt_holdout(rec)
        else:
            self._adopt(rec)
        self.status_now.append((rec, rec.phase))
        self.maker.made(rec)
        return rec

    def records_new(self, names: list[str], ops: list[Any], identity: str) -> list[StreamRecord]:
        """The records :meth:`record` makes of new streams ``names`` (none known yet, distinct, within the cap) whose
        operators, made together, are ``ops``: holdout rows (:meth:`holdout_rows`) or release rows
        (:meth:`release_rows_new`), all of one kind, in a router without periods (what a chunk of stdin's new streams
        get), whose maker is a plain one (it adds nothing to a new record). ``identity``: the one their keys derive
        from."""
        streams, status_now = self.streams, self.status_now
        kind = type(ops[0]) if ops else HoldoutRow
        if self.clock is not None or len(streams) + len(names) > self.max_streams \
                or type(self.maker) is not StreamMaker or kind not in (HoldoutRow, RowOperator) \
                or not all(type(op) is kind for op in ops):
            msg = ("records_new takes new holdout rows or release rows within the stream cap, without periods, with a "
                   "plain maker")
            raise ValueError(msg)
        phase = "holdout" if kind is HoldoutRow else "releasing"
        mono = time.monotonic()
        seen = self.seen
        out: list[StreamRecord] = []
        for name, op in zip(names, ops, strict=True):
            rec = StreamRecord(name=name, operator=op, name_json=encode_basestring_ascii(name), last_seen=mono,
                               identity=identity, phase=phase)
            streams[name] = rec
            if seen is not None:
                self._seen_now(rec)
            out.append(rec)
        if kind is HoldoutRow:
            self.in_holdout += len(out)
        status_now.extend(zip(out, repeat(phase)))
        return out

    def add(self, rec: StreamRecord, value: float, ts: float | None, seq: int | None, now: float) -> str:
        """Accept one reading into its stream; returns the result label (ok, duplicate, late, invalid, failed)."""
        if rec.failed:
            self.counts["failed"] += 1
            return "failed"
        if seq is not None:
            if rec.last_seq is not None and seq <= rec.last_seq:
                self.counts["duplicate"] += 1
                return "duplicate"
        if rec.phase == "holdout" and getattr(rec.operator, "takes_reports", False):
            self._holdout_report(rec, value, seq)
            return "ok"
        bins = rec.bins
        if bins is None:
            if rec.pending is None:
                rec.pending, rec.pending_ts = [value], [now if ts is None else ts]
                self._pending_now(rec)
            else:
                rec.pending.append(value)
                rec.pending_ts.append(now if ts is None else ts)  # type: ignore[union-attr]
        else:
            assert self.clock is not None
            t = ts if (self.event_time and ts is not None) else now
            k = self.clock.index(t)
            if k > self.clock.index(now) + 1:
                self.counts["invalid"] += 1
                return "invalid"
            if isinstance(bins, CategoryBins):
                if not rec.operator.valid(value):  # not a category (or report value) of this stream
                    self.counts["invalid"] += 1
                    return "invalid"
                value = rec.operator.category_of(value)  # a category, or a range stream's bucket
            elif self.count_events:
                value = 1.0
            if not bins.add(k, value):
                self.counts["late"] += 1
                return "late"
        if seq is not None:
            rec.last_seq = seq
        self.counts["ok"] += 1
        self.dirty[rec.name] = rec
        rec.last_seen = time.monotonic()
        if self.seen is not None:
            self._seen_now(rec)
        return "ok"

    def track_idle(self, window: float) -> None:
        """Keep, per ``window`` seconds, the names of the streams last seen then (the daemon's idle eviction)."""
        self.idle_window = window
        self.seen = {}
        for rec in self.streams.values():
            self._seen_now(rec)

    def _seen_now(self, rec: StreamRecord) -> None:
        """``rec.last_seen`` changed: move its name to that time's window (once per window per stream)."""
        w = int(rec.last_seen / self.idle_window)
        if w != rec.seen_window:
            self._leave_window(rec)
            self.seen.setdefault(w, set()).add(rec.name)  # type: ignore[union-attr]
            rec.seen_window = w

    def _leave_window(self, rec: StreamRecord) -> None:
        """Take the stream's name out of the window it was last seen in (an empty window goes)."""
        seen = self.seen
        assert seen is not None
        names = seen.get(rec.seen_window)
        if names is not None:
            names.discard(rec.name)
            if not names:
                del seen[rec.seen_window]

    def idle(self, cutoff: float) -> list[str]:
        """The streams without a reading since ``cutoff`` (monotonic time), from the windows that end before it and
        the one it falls in: the streams seen later are not visited."""
        seen = self.seen
        if seen is None:
            return [n for n, rec in self.streams.items() if rec.last_seen <= cutoff]
        last = int(cutoff / self.idle_window)
        streams, out = self.streams, []
        for w in [w for w in seen if w <= last]:
            names = seen[w]
            for n in list(names):
                rec = streams.get(n)
                if rec is None or rec.seen_window != w:  # gone, or a new record under this name: not here any more
                    names.discard(n)
                elif rec.last_seen <= cutoff:
                    out.append(n)
            if not names:
                del seen[w]
        return out

    def add_many(self, rec: StreamRecord, values: list[float], ts: list[float | None] | None,
                 seqs: list[int | None] | None, now: float) -> list[int] | None:
        """:meth:`add` for the readings of one message, as columns (``ts``/``seqs`` None: no reading carries one);
        returns the indexes of the accepted readings, or None when all of them were accepted.

        Readings without ts and seq in mode ``reading`` (the common batch) are taken without a call per reading."""
        if rec.failed:
            self.counts["failed"] += len(values)
            return []
        if (ts is None and seqs is None and rec.bins is None
                and not (rec.phase == "holdout" and getattr(rec.operator, "takes_reports", False))):
            if values:
                if rec.pending is None:
                    rec.pending, rec.pending_ts = list(values), [now] * len(values)
                    self._pending_now(rec)
                else:
                    rec.pending += values
                    rec.pending_ts += [now] * len(values)  # type: ignore[operator]
                self.counts["ok"] += len(values)
                self.dirty[rec.name] = rec
                rec.last_seen = time.monotonic()
                if self.seen is not None:
                    self._seen_now(rec)
            return None
        accept = self.add
        kept = [i for i, v in enumerate(values)
                if accept(rec, v, None if ts is None else ts[i], None if seqs is None else seqs[i], now) == "ok"]
        return None if len(kept) == len(values) else kept

    def add_values(self, recs: list[StreamRecord], values: list[float], now: float) -> list[int]:
        """:meth:`add` for readings without ts and seq of many streams at once (the ``stream,value`` lines of a stdin
        chunk, in their order), in mode ``reading``. The readings of release rows with nothing pending are released at
        once, together (:meth:`_release_now`); every other reading is appended to its stream's pending readings,
        without a call per reading. Returns the indexes it left for :meth:`add` (a failed stream, periods, a local
        holdout that takes reports): those streams' readings, in their order; every other reading was accepted."""
        if self.clock is not None or not recs:
            return list(range(len(recs)))
        if self.pool is not None:
            now_rows = [type(rec.operator) is RowOperator and rec.pending is None and not rec.failed for rec in recs]
            if all(now_rows):
                self._release_now(recs, values, now)
                return []
            if any(now_rows):
                self._release_now(list(compress(recs, now_rows)), list(compress(values, now_rows)), now)
                others = [i for i, row in enumerate(now_rows) if not row]
                left = self._add_pending([recs[i] for i in others], [values[i] for i in others], now)
                return [others[i] for i in left]
        return self._add_pending(recs, values, now)

    def _add_pending(self, recs: list[StreamRecord], values: list[float], now: float) -> list[int]:
        """Each reading appended to its stream's pending readings (:meth:`add_values`)."""
        left: list[int] = []
        dirty, seen = self.dirty, self.seen
        mono = time.monotonic()
        taken = 0
        for i, rec in enumerate(recs):
            if rec.failed or (rec.phase == "holdout" and getattr(rec.operator, "takes_reports", False)):
                left.append(i)
                continue
            pending = rec.pending
            if pending is None:
                rec.pending, rec.pending_ts = [values[i]], [now]
                self._pending_now(rec)
            else:
                pending.append(values[i])
                rec.pending_ts.append(now)  # type: ignore[union-attr]
            dirty[rec.name] = rec
            rec.last_seen = mono
            if seen is not None:
                self._seen_now(rec)
            taken += 1
        self.counts["ok"] += taken
        return left

    def _release_now(self, recs: list[StreamRecord], values: list[float], now: float) -> None:
        """Readings (``values[i]`` of ``recs[i]``, received at ``now``) of streams that are release rows with nothing
        pending, released together (:meth:`_release`)."""
        rows = np.fromiter(map(_row_of, recs), dtype=np.int64, count=len(recs))
        self._release(rows, np.array(values, dtype=np.float64), now, recs)

    def release_rows(self, rows: np.ndarray, values: np.ndarray, now: float) -> None:
        """Readings (``values[i]``, received at ``now``) of the release rows ``rows[i]``, which hold a lease
        (:attr:`leases`: checked by the caller, stream/core/row_leases.py), released together (:meth:`_release`)
        without visiting a record per reading."""
        self._release(rows, values, now, None)

    def _release(self, rows: np.ndarray, values: np.ndarray, now: float, recs: list[StreamRecord] | None) -> None:
        """Readings ``values[i]`` of release rows ``rows[i]`` (streams with nothing pending; ``recs[i]`` their records,
        or None: the rows' leases name them), released in one compiled pass in their order (each stream's readings in
        its order, as its own ``process`` takes them: operators/columnar.py); the releases wait for the step's
        :meth:`flush`, as columns, streams in the order of their first reading. A pass that raises fails its streams
        only."""
        t0 = time.perf_counter()
        pool = self.pool
        assert pool is not None
        n = rows.size
        # the streams in the order of their first reading, and the readings grouped by stream in that order
        distinct, first, inverse, counts = np.unique(rows, return_index=True, return_inverse=True, return_counts=True)
        by_first = np.argsort(first, kind="stable")
        rank = np.empty_like(by_first)
        rank[by_first] = np.arange(by_first.size)
        grouped = np.argsort(rank[inverse.reshape(-1)], kind="stable")
        order = distinct[by_first]
        streams = self.leases.records[order].tolist() if recs is None else [recs[i] for i in first[by_first].tolist()]
        counts = counts[by_first]
        ticks = pool.ticks[order]  # each stream's next tick (a copy: the pass advances the column)
        self.counts["ok"] += n
        try:
            # readings were validated on intake (finite numbers) and the rows belong to live records
            released = pool.process(rows, values, checked=True)
        except Exception as exc:  # a bug: the streams of this pass fail (their rows may have moved), no other
            for rec, k in zip(streams, counts.tolist(), strict=True):
                self.fail(rec, f"operator failed ({type(exc).__name__}); {k} ticks not released")
            return
        deque(map(setattr, streams, repeat("last_seen"), repeat(time.monotonic())), maxlen=0)
        if self.seen is not None:
            for rec in streams:
                self._seen_now(rec)
        self._released.append(RowReleases(streams, ticks, counts.astype(np.int64), np.full(n, float(now)),
                                          released[grouped], pool.theta[order] * pool.resolution[order]))
        self.ticks_processed += n
        self.ticks_total += n
        self.latencies.append(time.perf_counter() - t0)

    def _pending_now(self, rec: StreamRecord) -> None:
        """``rec`` has readings waiting for the step: a release row's lease ends (they must go first)."""
        if type(rec.operator) is RowOperator:
            self.leases.revoke(rec.operator.row)

    def _holdout_report(self, rec: StreamRecord, value: float, seq: int | None) -> None:
        """A holdout report feeds the threshold estimate directly: local mode's (not a tick), or a fleet holdout's
        reading (a tick of its stream, never released)."""
        op = rec.operator
        op.observe_threshold(np.array([value]))
        if seq is not None:
            rec.last_seq = seq
        self.counts["ok"] += 1
        if getattr(op, "reports_are_ticks", False):  # a fleet holdout's reading: a tick of its stream, not released
            rec.ticks += 1
            self.ticks_processed += 1
            self.ticks_total += 1
        if op.phase != rec.phase:
            rec.phase = op.phase
            rec.status_due = False
            self.in_holdout -= 1
            self.status_now.append((rec, rec.phase))
        elif getattr(op, "control_changed", False):  # a new round of the threshold phase: tell the devices now
            op.control_changed = False
            rec.status_due = False
            self.status_now.append((rec, None))
        else:
            rec.status_due = True
            if self.status_pending is not None:
                self.status_pending.add(rec.name)

    def _process(self, rec: StreamRecord, values: list[float], ts: list[float]) -> ReleaseBatch | None:
        try:
            return self._process_batch(rec, values, ts)
        except Exception as exc:  # an operator bug must not stop the other streams
            self.fail(rec, f"operator failed ({type(exc).__name__}); {len(values)} ticks not released")
            return None

    def fail(self, rec: StreamRecord, what: str) -> None:
        """Mark a stream failed: no more readings (result ``failed``) until a restart; its status says so at once.
        ``what`` names the failure, never a value."""
        if rec.failed:
            return
        log.error("stream %r failed: %s; it takes no more readings until the daemon restarts", rec.name, what)
        rec.failed = True
        rec.pending = rec.pending_ts = None
        if type(rec.operator) is RowOperator:
            self.leases.revoke(rec.operator.row)
        if rec.phase == "holdout":
            self.in_holdout -= 1
        rec.phase = "failed"
        self.failed += 1
        self.status_now.append((rec, rec.phase))

    def evict(self, names: list[str]) -> int:
        """Remove idle streams from memory (their state was checkpointed by the caller); returns how many."""
        n = 0
        for name in names:
            rec = self.streams.pop(name, None)
            if rec is None:
                continue
            self.dirty.pop(name, None)
            if self.seen is not None:
                self._leave_window(rec)
            if type(rec.operator) is RowOperator:
                self.leases.revoke(rec.operator.row)
                rec.operator.free()
            elif type(rec.operator) is HoldoutRow:
                self._detach_from_checkpoint(rec)  # a checkpoint's writer may still read the row: it keeps a copy
                rec.operator.free()
            if rec.phase == "holdout":
                self.in_holdout -= 1
            if rec.failed:
                self.failed -= 1
            n += 1
        return n

    @staticmethod
    def _detach_from_checkpoint(rec: StreamRecord) -> None:
        """Before a lent holdout changes (or its row is freed): a checkpoint's writer gets its state as it was at the
        cut, copied only now (stream/state/records.py)."""
        lent = rec.lent
        if lent is not None:
            rec.lent = None
            lent[0].detach(lent[1])

    def _process_batch(self, rec: StreamRecord, values: list[float], ts: list[float]) -> ReleaseBatch | None:
        t0 = time.perf_counter()
        self._detach_from_checkpoint(rec)
        op = rec.operator
        n = len(values)
        if type(op) is HoldoutRow:
            if n < op.holdout_left:  # inside the holdout: counted in the row (no release)
                op.pool.process(np.full(n, op.row, dtype=np.int64), np.asarray(values, dtype=np.float64),
                                 checked=True)
                self._holdout_taken(rec, n)
                self.latencies.append(time.perf_counter() - t0)
                return None
            rec.operator = op = op.pool.take(op.row)  # the holdout ends here: the stream's operator chooses
        if getattr(op, "takes_categories", False):  # one histogram release per period
            out = op.process(values)
            first = rec.ticks
            rec.ticks += n
            self.ticks_processed += n
            self.ticks_total += n
            self.latencies.append(time.perf_counter() - t0)
            return ReleaseBatch(rec, list(range(first, first + n)), ts, out, math.nan)
        first = rec.ticks
        if n == 1:
            out = [op.process_one(values[0])]
        else:
            out = op.process(np.asarray(values, dtype=np.float64)).tolist()
        rec.ticks = first + n
        self.ticks_processed += n
        self.ticks_total += n
        batch = None
        if op.phase != "holdout":
            total = sum(out)
            if total == total:  # no NaN among them (a NaN makes the sum NaN): every tick is released
                batch = ReleaseBatch(rec, list(range(first, first + n)), ts, out, float(op.theta))
            elif idx := [i for i, v in enumerate(out) if v == v]:  # not NaN
                batch = ReleaseBatch(rec, [first + i for i in idx], [ts[i] for i in idx], [out[i] for i in idx],
                                     float(op.theta))
        if op.phase != rec.phase:
            successor = getattr(op, "successor", None)
            if successor is not None:  # an operator that hands its stream on (a fleet's member: to its own ToPS)
                rec.released_from = op.held
                rec.operator = op = successor
            rec.phase = op.phase
            rec.status_due = False
            self.in_holdout -= 1
            rec.error_stats = getattr(op, "error_stats", None)  # measured as its holdout ended
            self.status_now.append((rec, rec.phase))
            self._adopt(rec)
        elif rec.phase == "holdout":
            rec.status_due = True
            if self.status_pending is not None:
                self.status_pending.add(rec.name)
        self.latencies.append(time.perf_counter() - t0)
        return batch

    def _holdout_taken(self, rec: StreamRecord, n: int) -> None:
        """The bookkeeping of ``n`` readings a holdout took (as :meth:`_process_batch` does for them)."""
        rec.ticks += n
        self.ticks_processed += n
        self.ticks_total += n
        rec.status_due = True
        if self.status_pending is not None:
            self.status_pending.add(rec.name)

    def flush(self) -> Releases:
        """Process the pending readings of every stream that has some (mode ``reading``)."""
        out: list[ReleaseBatch] = []
        if self.clock is not None:
            self.dirty.clear()
            return Releases()
        if self.holdouts:
            self._holdout_rows()
        self._holdout_ends()
        if self.pool is not None:  # the rows' releases: those of add_values, then those of pending readings
            late = self._release_rows()
            parts, self._released = self._released, []
            rows = RowReleases.joined([*parts, late] if late is not None else parts)
        else:
            rows = None
        for rec in self.dirty.values():
            if rec.pending:
                values, ts = rec.pending, rec.pending_ts
                rec.pending = rec.pending_ts = None
                assert ts is not None
                b = self._process(rec, values, ts)
                if b is not None:
                    out.append(b)
        self.dirty.clear()
        return Releases(rows, out)

    def _holdout_rows(self) -> None:
        """The pending readings of every dirty stream that is a holdout row and stays inside its holdout, counted in
        one compiled pass per columnar holdout (the same numbers, stream by stream, as each stream's own operator:
        operators/columnar_holdout.py); their pending lists are emptied. A stream whose holdout ends in this step
        keeps its readings for :meth:`_process_batch`, which hands it its operator back for the choice."""
        for store, recs in _by_store(rec for rec in self.dirty.values()
                                     if rec.pending and type(rec.operator) is HoldoutRow):
            t0 = time.perf_counter()
            lengths = [len(rec.pending) for rec in recs]  # type: ignore[arg-type]
            row_of = [rec.operator.row for rec in recs]
            left = store.config.holdout_ticks - store.ticks[np.array(row_of, dtype=np.int64)]
            if (ends := np.flatnonzero(np.array(lengths) >= left)).size:  # these end their holdout in this step
                keep = np.ones(len(recs), dtype=bool)
                keep[ends] = False
                recs = list(compress(recs, keep.tolist()))
                lengths = list(compress(lengths, keep.tolist()))
                row_of = list(compress(row_of, keep.tolist()))
                if not recs:
                    continue
            for rec in recs:
                self._detach_from_checkpoint(rec)
            if len(recs) == sum(lengths):  # one reading each (the common step)
                rows = np.array(row_of, dtype=np.int64)
                values = np.array([rec.pending[0] for rec in recs], dtype=np.float64)  # type: ignore[index]
            else:
                rows = np.repeat(np.array(row_of, dtype=np.int64), lengths)
                values = np.array([v for rec in recs for v in rec.pending], dtype=np.float64)  # type: ignore[union-attr]
            try:
                # readings were validated on intake (finite numbers), the rows belong to live records and every row
                # stays inside its holdout (checked above)
                store.process(rows, values, checked=True)
            except Exception as exc:  # a bug: the streams of this pass fail, no other
                for rec in recs:
                    self.fail(rec, f"operator failed ({type(exc).__name__}); {len(rec.pending)} ticks not taken")
                continue
            for rec, n in zip(recs, lengths, strict=True):
                rec.pending = rec.pending_ts = None
                self._holdout_taken(rec, n)
            self.latencies.append(time.perf_counter() - t0)

    def _hold(self, recs: list[StreamRecord]) -> None:
        """The pending readings of ToPS streams (objects) that stay in their holdout, taken by each operator's
        ``hold`` (what its ``process`` does with them, without the release path's set-up per stream)."""
        for rec in recs:
            self._detach_from_checkpoint(rec)
            values = rec.pending
            assert values is not None
            try:
                rec.operator.hold(values)
            except Exception as exc:  # an operator bug must not stop the other streams
                self.fail(rec, f"operator failed ({type(exc).__name__}); {len(values)} ticks not taken")
                continue
            rec.pending = rec.pending_ts = None
            self._holdout_taken(rec, len(values))

    def _holdout_ends(self) -> None:
        """Every dirty ToPS stream (an object or a holdout row) whose holdout ends in this step takes its last holdout
        readings, and the choices that end them are made together (:func:`operators.tops.choose_ends`: the small
        holdouts of one configuration in a few compiled calls; the same choice, bit for bit, as each stream's own
        ``process``). Holdout rows of a configuration that ends in rows end row to row (:meth:`_end_rows`). A stream
        that can be a row goes straight into its row (without the release objects its operator would build); its
        readings after the holdout stay pending, for the release below. The readings of ToPS streams (objects) that
        stay in their holdout are taken here too (:meth:`_hold`)."""
        ending = []
        staying = []
        in_rows = []
        for rec in self.dirty.values():
            op, pending = rec.operator, rec.pending
            if pending:
                t = type(op)
                if t is ToPS and op.theta_units is None:
                    (ending if len(pending) >= op.holdout_left else staying).append(rec)
                elif t is HoldoutRow and len(pending) >= op.holdout_left:
                    (in_rows if op.pool.ends_in_rows else ending).append(rec)
        t0 = time.perf_counter()
        if staying:
            self._hold(staying)
        held = self._end_rows(in_rows) if in_rows else []
        if not held and len(ending) < 2:  # one stream: its own path makes the same choice
            if staying or in_rows:
                self.latencies.append(time.perf_counter() - t0)
            return
        for rec in ending:
            self._detach_from_checkpoint(rec)
            values, ts = rec.pending, rec.pending_ts
            assert values is not None and ts is not None
            try:
                op = rec.operator
                if type(op) is HoldoutRow:
                    rec.operator = op = op.pool.take(op.row)
                n = op.holdout_left
                op.hold(values[:n])
            except Exception as exc:  # an operator bug must not stop the other streams
                self.fail(rec, f"operator failed ({type(exc).__name__}); {len(values)} ticks not released")
                continue
            self._took_last(rec, n)
            held.append((rec, op))
        try:
            chosen = choose_ends([op for _, op in held])
        except Exception as exc:  # a bug: the streams of this pass fail, no other
            for rec, _ in held:
                self.fail(rec, f"operator failed ({type(exc).__name__}) at the end of its holdout")
            return
        pool = self.pool
        for (rec, op), sel in zip(held, chosen, strict=True):
            try:
                if pool is not None and rows_hold(op.config):
                    # straight into its row: the row its started operator would make (operators/columnar.py)
                    rec.error_stats = op.measure_error_stats(sel)
                    rec.operator = RowOperator(pool, pool.add_chosen(op, sel))
                else:
                    op.start(sel)
                    rec.error_stats = op.error_stats
            except Exception as exc:  # an operator bug must not stop the other streams
                self.fail(rec, f"operator failed ({type(exc).__name__}) at the end of its holdout")
                continue
            self._started(rec)
        self.latencies.append(time.perf_counter() - t0)

    def _took_last(self, rec: StreamRecord, n: int) -> None:
        """A stream took its last ``n`` holdout readings: what follows them stays pending, for the release."""
        values, ts = rec.pending, rec.pending_ts
        assert values is not None and ts is not None
        rec.pending, rec.pending_ts = (values[n:], ts[n:]) if len(values) > n else (None, None)
        rec.ticks += n
        self.ticks_processed += n
        self.ticks_total += n

    def _started(self, rec: StreamRecord) -> None:
        """The bookkeeping of a stream whose holdout ended: releasing from now on, its status out at once."""
        rec.phase = "releasing"
        rec.status_due = False
        self.in_holdout -= 1
        self.status_now.append((rec, rec.phase))

    def _end_rows(self, recs: list[StreamRecord]) -> list[tuple[StreamRecord, ToPS]]:
        """Holdout rows whose holdout ends in this step, of configurations that end in rows (a holdout too short to
        measure a leaf width: ``ColumnarHoldout.ends_in_rows``): per configuration, the rows take their last readings
        in one compiled pass, the choices are made from the rows (``ColumnarHoldout.choose_ends``: what each stream's
        operator chooses) and the streams go straight into release rows (``ColumnarRelease.add_started``), with no
        operator object on the way. Returns the streams given back as operators with their holdout taken (no compiled
        kernels loaded, or a configuration rows do not release): the caller chooses for them."""
        back: list[tuple[StreamRecord, ToPS]] = []
        pool = self.pool
        slices = [(store, whole[at : at + ROWS_ENDED_TOGETHER]) for store, whole in _by_store(recs)
                  for at in range(0, len(whole), ROWS_ENDED_TOGETHER)]  # what the choice's arrays hold at once
        for store, group in slices:
            for rec in group:
                self._detach_from_checkpoint(rec)
            rows = np.array([rec.operator.row for rec in group], dtype=np.int64)
            lefts = (store.config.holdout_ticks - store.ticks[rows]).tolist()
            values = [v for rec, n in zip(group, lefts, strict=True) for v in rec.pending[:n]]  # type: ignore[index]
            try:
                # readings were validated on intake (finite numbers); each row takes exactly what it has left
                store.process(np.repeat(rows, lefts), np.array(values, dtype=np.float64), checked=True, end=True)
                chosen = store.choose_ends(rows) if pool is not None and rows_hold(store.config) else None
                if chosen is not None:
                    assert pool is not None
                    thetas, s, starts = chosen
                    measured = store.error_stats(rows, thetas)
                    made = pool.add_started(store.config, store.key[rows], thetas, s, starts, store.ticks[rows],
                                            store.clamped[rows])
            except Exception as exc:  # a bug: the streams of this pass fail, no other
                for rec in group:
                    self.fail(rec, f"operator failed ({type(exc).__name__}) at the end of its holdout")
                continue
            for rec, n in zip(group, lefts, strict=True):
                self._took_last(rec, n)
            if chosen is None:
                for rec in group:
                    rec.operator = op = store.take(rec.operator.row)
                    back.append((rec, op))
                continue
            store.release_many(rows)
            for rec, r, stats in zip(group, made, measured, strict=True):
                rec.operator = RowOperator(pool, r)  # type: ignore[arg-type]
                rec.error_stats = stats
                self._started(rec)
        return back

    def _release_rows(self) -> RowReleases | None:
        """The pending readings of every dirty stream that is a row, released in one compiled pass (the same
        releases, stream by stream, as each stream's own ``process``: operators/columnar.py), with each stream's
        theta (``RowOperator.theta``: a row has no lower bound, so ``theta_units * resolution``): the releases as
        columns, streams in their dirty order, their pending readings taken."""
        pool = self.pool
        assert pool is not None
        recs = [rec for rec in self.dirty.values() if rec.pending and type(rec.operator) is RowOperator]
        if not recs:
            return None
        t0 = time.perf_counter()
        lengths = [len(rec.pending) for rec in recs]  # type: ignore[arg-type]
        row_of = np.array([rec.operator.row for rec in recs], dtype=np.int64)
        if len(recs) == sum(lengths):  # one reading each (the common step)
            rows = row_of
            values = np.array([rec.pending[0] for rec in recs], dtype=np.float64)  # type: ignore[index]
            ts = np.array([rec.pending_ts[0] for rec in recs], dtype=np.float64)  # type: ignore[index]
        else:
            rows = np.repeat(row_of, lengths)
            values = np.array([v for rec in recs for v in rec.pending], dtype=np.float64)  # type: ignore[union-attr]
            ts = np.array([t for rec in recs for t in rec.pending_ts], dtype=np.float64)  # type: ignore[union-attr]
        thetas = pool.theta[row_of] * pool.resolution[row_of]
        first = pool.ticks[row_of]  # each stream's next tick (a copy: the pass advances the column)
        try:
            # readings were validated on intake (finite numbers) and the rows belong to live records
            released = pool.process(rows, values, checked=True)
        except Exception as exc:  # a bug: the streams of this pass fail (their rows may have moved), no other
            for rec in recs:
                self.fail(rec, f"operator failed ({type(exc).__name__}); {len(rec.pending)} ticks not released")
            return None
        for rec in recs:
            rec.pending = rec.pending_ts = None
        n = int(values.size)
        self.ticks_processed += n
        self.ticks_total += n
        self.latencies.append(time.perf_counter() - t0)
        return RowReleases(recs, first, np.array(lengths, dtype=np.int64), ts, released, thetas.astype(np.float64))

    def close_periods(self, now: float, final: bool = False) -> list[ReleaseBatch]:
        """Close every period that is due at ``now`` (``final``: also the open ones, at shutdown)."""
        out: list[ReleaseBatch] = []
        clock = self.clock
        if clock is None:
            return out
        last = clock.last_closable(now)
        ordered = self.close_in_period_order is not None and self.close_in_period_order()
        closed: list[tuple[StreamRecord, int, list[Any]]] = []
        for rec in sorted(self.streams.values(), key=_name_of) if ordered else self.streams.values():
            assert rec.bins is not None
            if rec.failed:
                continue
            # At shutdown the current (partial) period closes too, for every stream alike.
            upto = max(clock.index(now), max(rec.bins.bins, default=last)) if final else last
            first = rec.bins.first
            values = rec.bins.close_through(upto)
            if not values:
                continue
            if ordered:
                closed.append((rec, first, values))
                continue
            ts = [clock.end(k) for k in range(first, first + len(values))]
            b = self._process(rec, values, ts)
            if b is not None:
                out.append(b)
        if closed:
            for k in range(min(c[1] for c in closed), max(c[1] + len(c[2]) for c in closed)):
                for rec, first, values in closed:
                    if first <= k < first + len(values) and not rec.failed:
                        b = self._process(rec, [values[k - first]], [clock.end(k)])
                        if b is not None:
                            out.append(b)
        return out

    def take_counts(self) -> dict[str, int]:
        """Reading results counted since the last call."""
        c = self.counts
        self.counts = dict.fromkeys(_COUNTS, 0)
        return c

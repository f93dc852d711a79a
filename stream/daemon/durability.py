"""Durable state of ``tops run``: the state store and the input journal, composed into the daemon as it is built.

:meth:`Durability.open` (startup, before the router and the MQTT link exist) opens the store (refusing a corrupt one
or one made with another master key) and the journal, and fixes the identity the stream keys derive from. The
daemon then builds its parts with the layers durable state gives it:

- the router with :meth:`Durability.admitting`'s stream maker (stream/state/admission.py): new streams are admitted
  by the privacy ledger, keyed by their generation, and restored from their stored state;
- its intake through :meth:`Durability.journaled` (stream/state/journaled.py): the daemon calls that object, so every
  reading the router accepts is appended to the journal (the readings of one message make one line);
- the MQTT link and input source, when readings come over MQTT, with the :attr:`Durability.repeats` filter
  (stream/daemon/repeats.py): a QoS 1 message the broker sends again after it was processed is acknowledged, never
  processed twice.

Then :meth:`Durability.restore` restores the stored streams (with period ticks all of them at once; with one tick
per reading each at its next reading, as after an eviction; changed privacy parameters stop the start unless a new
generation is asked for: the preflight checks every stored stream), puts the stored outbox back into the publish
queue, re-processes the journal since the last checkpoint through the router itself (re-producing byte-identical
releases, published again) and checkpoints.

While running, ``sync_loop`` makes batches of journaled readings durable (write + fsync in a worker thread).
Releases and status messages are *held* until the readings they depend on are durable, and the input's chunks are
acknowledged only then (:meth:`Durability.acknowledge_after_sync`: MQTT's QoS 1 messages); so whatever leaves the
process can be re-produced from the journal, and a release is never made twice with different values.

A checkpoint (every ``checkpoint_interval`` s, after ``checkpoint_every`` ticks, at start and at shutdown) makes its
cut in one event-loop step: rotate the journal (syncing what is buffered), release what was held, take the changed
streams' states (operator snapshot, last ``seq``, tick counter, open period bins; a columnar row's as its JSON text,
all rows in one pass) and the messages the broker has not confirmed (the outbox). Encoding them and committing it all
in one transaction run in a worker thread on the store's own writer connection while intake goes on (what arrives
is after the cut: the next checkpoint's); then the covered journal segments are deleted. A checkpoint that fails
leaves everything for the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from prometheus_client import Counter

from operators.fleet_holdout import FleetHoldout
from stream.core.config import stream_params
from stream.core.keys import load_master_key
from stream.core.router import ReleaseBatch, Router
from stream.daemon.mqtt_paho import published
from stream.daemon.repeats import RedeliveryFilter
from stream.state.admission import AdmittedStreams
from stream.state.disk import DiskRefused, DiskRetry
from stream.state.journal import Journal
from stream.state.journaled import JournaledIntake
from stream.state.records import record_states
from stream.state.redelivery import Redeliveries
from stream.state.spill import Spill
from stream.state.store import PrivacyParametersChanged, Store, StoreError

__all__ = ["Durability", "key_check"]

log = logging.getLogger("tops.state")



FLEET_META = "fleet_holdout"  # the meta key of the template's fleet holdout (operators.fleet_holdout)


@dataclass(slots=True)
class _Cut:
    """What one checkpoint writes, taken at the cut (journal ``position``) in the event loop."""

    states: dict[str, Any]  # dicts, JSON texts, or functions making the dicts (stream.state.records)
    position: int
    outbox: list[tuple[str, bytes, bool, int]] | None
    meta: dict[str, str] | None
    spill_pos: int | None
    left_holdout: list[str]
    t0: float
    admissions: list[tuple[Any, ...]]
    pause: float = 0.0
    appended: int = 0  # appended states in the store after this checkpoint (Store.fold)
    rows: list[tuple[str, str, str]] | None = None  # the states encoded (Store.encode), kept for a retried commit


def key_check(master: bytes) -> str:
    """A one-way tag of the master key, so a store is never continued with another key (it reveals nothing)."""
    tag = HKDF(algorithm=hashes.SHA256(), length=16, salt=b"tops/store-key-check/v1", info=b"").derive(master)
    return tag.hex()


def private_dir(d: Path, what: str) -> None:
    """Mode 0700 on a folder of private data (readings at rest): a looser one is tightened and logged; one that is
    not a folder, not ours or cannot be changed stops the start."""
    try:
        st = d.stat()
        if not d.is_dir():
            msg = f"{what} {d} is not a folder"
            raise StoreError(msg)
        if st.st_mode & 0o077:
            os.chmod(d, 0o700)
            log.warning("%s %s had mode %o: set to 0700 (it holds readings at rest)", what, d, st.st_mode & 0o777)
    except OSError as exc:
        msg = f"{what} {d} must have mode 0700 and cannot be changed ({exc.strerror}): chmod 700 it"
        raise StoreError(msg) from None


class Durability:
    """The store, the journal and what waits for them, for one daemon; use :meth:`open`, then build the router with
    :meth:`admitting`, its intake with :meth:`journaled` and the MQTT link with :attr:`repeats`, then
    :meth:`restore`.

    ``daemon`` is the :class:`stream.daemon.service.Daemon` it serves (typed ``Any``: the service imports this
    module, not the other way)."""

    def __init__(self, daemon: Any, store: Store, journal: Journal) -> None:
        cfg = daemon.cfg
        st = cfg.state
        self.daemon = daemon
        self.store = store
        self.journal = journal
        self.fsync = bool(st.fsync)
        self.fsync_interval = float(st.fsync_interval) / 1000.0
        self.fsync_batch = int(st.fsync_batch)
        self.checkpoint_interval = float(st.checkpoint_interval)
        self.checkpoint_every = int(st.checkpoint_every)
        self.fold_after = int(st.fold_after)
        self.params = stream_params(cfg)
        self.new_generation = set(st.new_generation)
        if st.new_generation_all:  # every stream whose privacy parameters changed
            self.new_generation |= set(store.changed_streams(self.params))
        self.master: bytes | None = None
        self.held: list[list[ReleaseBatch]] = []  # releases waiting for the sync of their readings
        # streams whose state changed since the last checkpoint (shared with the stream maker and the journaled
        # intake: changed in place, never replaced)
        self.changed: set[str] = set()
        self.saved_in_holdout: set[str] = set()  # streams whose stored state holds a holdout histogram
        self.fleet_saved: tuple[int, bool] | None = None  # (readings taken, chosen) of the fleet holdout as stored
        self.releasing = False
        self.syncing = False
        self.wake = asyncio.Event()
        self.checkpoint_due = asyncio.Event()
        # every write into the data directory: a full disk makes it wait and retry (stdin intake waits for
        # `writable`); a spill append the disk refused is retried by a checkpoint at once
        self.disk = DiskRetry(store.path.parent, daemon.metrics.registry, retry_soon=self.checkpoint_due.set,
                              settle=max(10.0, 2.0 * self.checkpoint_interval))
        self.writable = self.disk.writable
        self.io_lock = asyncio.Lock()
        self.checkpoint_lock = asyncio.Lock()  # one checkpoint at a time (its write runs in a worker thread)
        self.max_checkpoint_pause = 0.0  # the longest share of a checkpoint spent in the event loop (seconds)
        self.ticks_at_checkpoint = 0
        self.checkpoints = 0
        self.folds = 0
        self.last_checkpoint_seconds = 0.0
        self.max_checkpoint_seconds = 0.0
        self.synced_readings = 0
        self.redeliveries: Redeliveries | None = None  # MQTT input: the messages the broker may send again
        self.repeats: RedeliveryFilter | None = None  # the MQTT link's and source's filter of them
        self.source_acks: list[tuple[Any, Any]] = []  # (source, ack token) of chunks taken since the last sync
        self.redelivered = Counter("tops_redeliveries_dropped", "QoS 1 messages the broker sent again after they "
                                   "were processed (acknowledged, not counted twice).",
                                   registry=daemon.metrics.registry)

    @property
    def router(self) -> Router:
        """The daemon's router (built after :meth:`open`, with :meth:`admitting`'s maker)."""
        return self.daemon.router

    # -- startup ------------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, daemon: Any) -> Durability:
        """Open the store and journal of ``[state] data_dir``, fix the identity, make the MQTT input's filter of
        repeats (before the daemon builds its router and link: :meth:`restore` restores the streams)."""
        cfg = daemon.cfg
        d = Path(cfg.state.data_dir).expanduser()
        try:
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            msg = f"[state] data_dir {d} cannot be created ({exc.strerror})"
            raise StoreError(msg) from None
        if not os.access(d, os.W_OK | os.X_OK):
            msg = f"[state] data_dir {d} is not writable by this user"
            raise StoreError(msg)
        private_dir(d, "[state] data_dir")
        if (d / "journal").is_dir():
            private_dir(d / "journal", "the journal folder")
        store = Store.open(d / "state.db")
        try:
            journal = Journal.open(d / "journal")
        except OSError as exc:
            store.close()
            msg = f"journal in {d / 'journal'} cannot be opened ({exc.strerror})"
            raise StoreError(msg) from None
        self = cls(daemon, store, journal)
        try:
            self._bind_key()
            cfg = daemon.cfg
            if cfg.uses_mqtt and cfg.input.source == "mqtt" and cfg.input.topics:
                self._make_repeats(cfg.mqtt)
        except BaseException:
            store.close()
            raise
        return self

    def restore(self) -> None:
        """Restore every stream, re-process the journal, checkpoint (the daemon's router and link are built)."""
        try:
            self._restore()
        except BaseException:
            self.store.close()
            raise

    def _bind_key(self) -> None:
        # the store's identity replaces the run's: restarts on this store derive the same keys (and reproduce their
        # releases bit for bit); a new or lost store is a new identity, so its keys never meet the old data
        self.daemon.set_identity(self.store.identity, durable=True)
        if getattr(self.daemon, "local", False):  # local mode: the server holds no key
            return
        self.master = load_master_key(self.daemon.cfg.streams.key_file, create=True)
        tag, stored = key_check(self.master), self.store.meta("key_check")
        if stored is None:
            self.store.set_meta("key_check", tag)
        elif stored != tag:
            msg = (f"state store {self.store.path} was made with another master key than "
                   f"{self.daemon.cfg.streams.key_file}; refusing to start (use the key file it was made with, or "
                   f"another [state] data_dir)")
            raise StoreError(msg)

    def _make_repeats(self, settings: Any) -> None:
        """The MQTT input's redelivery table and the link's filter of it (a repeat is acknowledged, not processed;
        entries without the broker's evidence go ``grace`` = two keepalives after their PUBACK)."""
        red = self.redeliveries = Redeliveries(self._digest_key(), grace=2.0 * settings.keepalive,
                                               mark=self.journal.append_mark)
        self.repeats = RedeliveryFilter(red, persistent=settings.session == "persistent",
                                        on_repeat=self.redelivered.inc)

    # -- the layers the daemon is built with --------------------------------------------------------------------
    def admitting(self, factory: Callable[[str], Any], keyed: Callable[[bytes], Any],
                  fleet_member: Callable[[bytes, dict[str, Any]], Any] | None = None) -> AdmittedStreams:
        """The router's stream maker: new streams admitted by the ledger, keyed by their generation (``keyed(key)``
        makes the operator; ``factory(name)`` without a master key, in local mode), restored when stored
        (``fleet_member(key, snapshot)``: the operator of a stored stream the fleet holdout took readings of, or
        None for another one)."""
        return AdmittedStreams(factory, keyed, store=self.store, params=self.params,
                               new_generation=self.new_generation, master=self.master,
                               identity=self.daemon.identity, changed=self.changed,
                               saved_in_holdout=self.saved_in_holdout, fleet_member=fleet_member)

    def journaled(self, router: Router) -> JournaledIntake:
        """The intake the daemon calls: ``router``'s, every accepted reading appended to the journal."""
        return JournaledIntake(router, self.journal, self.changed)

    def _digest_key(self) -> bytes:
        """The key of the redelivery digests: from the master key (or, in local mode, a random one in the store)."""
        if self.master is not None:
            return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"tops/redelivery-digest/v1",
                        info=b"").derive(self.master)
        stored = self.store.meta("redelivery_key")
        if stored is None:
            stored = os.urandom(32).hex()
            self.store.set_meta("redelivery_key", stored)
        return bytes.fromhex(stored)

    def _confirm(self) -> None:
        """Drop the redelivery entries whose acknowledgement the broker has (see stream.state.redelivery)."""
        repeats, link = self.repeats, self.daemon.link
        if repeats is not None and link is not None:
            repeats.confirm(link.connection, link.connected.is_set())

    def _restore(self) -> None:
        daemon, router = self.daemon, self.router
        t0 = time.perf_counter()
        stored_fleet = self.store.meta(FLEET_META)
        if daemon.fleet is not None and stored_fleet is not None:  # before any of its streams is restored
            fleet = daemon.fleet
            try:
                snap = json.loads(stored_fleet)
                if snap["generation"] == fleet.config.fleet_generation:  # else: a new fleet holdout starts afresh
                    daemon.fleet = FleetHoldout.restore(fleet.config, daemon.fleet_key, snap)
                    self.fleet_saved = (daemon.fleet.taken, daemon.fleet.choice is not None)
                else:
                    log.info("fleet holdout generation %d starts: the next %d readings choose its threshold",
                             fleet.config.fleet_generation, fleet.config.holdout)
            except (KeyError, TypeError, ValueError):
                msg = (f"the stored fleet holdout does not fit the configuration; restore the old [streams.template] "
                       f"or start from an empty [state] data_dir ({self.store.path.parent})")
                raise StoreError(msg) from None
        # With one tick per reading a stream does nothing until its next reading: it is restored then (the ledger
        # checks it, its checkpoint is loaded), as after an eviction, so a restart does not read every stored stream
        # first (a million streams: seconds, not minutes). The journal's streams are restored as it is re-processed.
        # Period ticks release every stream every period: all are restored now.
        eager = router.clock is not None
        n_stored = self.store.count_streams()
        if n_stored > router.max_streams:
            log.warning("the store holds %d streams, more than [streams] max_streams = %d: the cap is raised to "
                        "take them all back", n_stored, router.max_streams)
            router.max_streams = n_stored
        if eager:
            for name in self.store.stream_names():
                daemon.stream_record(name)
        else:
            # what the eager restore refused at once is refused at once still (the preflight says it too)
            changed = self.store.privacy_mismatches(self.params, self.new_generation)
            if changed:
                raise PrivacyParametersChanged(changed[0] + (f" (and {len(changed) - 1} more streams)"
                                                             if len(changed) > 1 else ""))
            for name in sorted(self.new_generation):  # a new generation asked for is taken now, as before
                if self.store.has_stream(name):
                    daemon.stream_record(name)
        outbox = self.store.outbox()
        if daemon.pubq is not None:  # the outbox: in the store, then what did not fit in memory (stream/state/spill.py)
            daemon.pubq.spill = Spill.open(self.store.path.parent, daemon.cfg.output.outbox_max_bytes, self.fsync,
                                           self.disk)
        if outbox:
            if daemon.pubq is not None:
                daemon.pubq.requeue(outbox)
            else:
                log.warning("%d stored messages not published: no MQTT sink any more", len(outbox))
        red = self.redeliveries
        on_mark = None
        if red is not None:
            red.load(json.loads(self.store.meta("redeliveries") or "[]"))
            on_mark = red.replay_mark
        n, skipped = 0, 0
        for rec_j in self.journal.replay(self.store.journal_position(), on_mark):
            rec = daemon.stream_record(rec_j.stream)
            if rec is None:
                skipped += 1
                continue
            router.add(rec, rec_j.value, rec_j.ts, rec_j.seq, rec_j.ts)  # the router's own: not journaled again
            self.changed.add(rec.name)
            n += 1
            if n % 5000 == 0:
                daemon.emit(router.flush())
        daemon.emit(router.flush())
        router.take_counts()  # replayed readings were counted by the process that accepted them
        self.ticks_at_checkpoint = router.ticks_total
        self.try_checkpoint()
        # with period counts the number of readings is the protected value: the log says neither how many were
        # re-processed nor how many were skipped
        hidden = daemon.metrics.counts_protected
        readings = "journaled readings" if hidden else f"{n} journaled readings"
        past_cap = "" if not skipped else " (some for streams past the cap, skipped)" if hidden else \
            f" ({skipped} for streams past the cap)"
        log.info("state: %d streams stored (%s), %s re-processed%s, %d stored messages requeued (%.2f s)",
                 n_stored, "all restored" if eager else f"{len(router.streams)} restored, the others at their next "
                 "reading", readings, past_cap, len(outbox), time.perf_counter() - t0)

    # -- holding releases until their readings are durable ------------------------------------------------------
    def hold(self, batches: list[ReleaseBatch]) -> bool:
        """Called by ``Daemon.emit``: True when the releases must wait for the next sync (they are kept)."""
        if self.releasing:
            return False
        if self.router.ticks_total - self.ticks_at_checkpoint >= self.checkpoint_every:
            self.checkpoint_due.set()
        if self.journal.pending_records or self.syncing or self.held or self.journal.unwritten or self.source_acks:
            if batches or self.router.status_now:
                self.held.append(batches)
            self.wake.set()
            return True
        return False

    def _release(self, held: list[list[ReleaseBatch]]) -> None:
        if not held:
            return
        self.releasing = True
        try:
            for batches in held:
                self.daemon.emit(batches)
        finally:
            self.releasing = False

    def acknowledge_after_sync(self, source: Any, token: Any) -> None:
        """Acknowledge a chunk of ``source`` (its ``token``) once the journal holds what it carried: after the next
        sync (``source`` is a stream.daemon.source.Source)."""
        self.source_acks.append((source, token))
        self.wake.set()

    def mark(self, marks: Any) -> None:
        """Journal a chunk's marks (after its readings: the sync that makes them durable makes the marks too)."""
        for m in marks:
            self.journal.append_mark(m)

    def _acknowledge_sources(self, tokens: list[tuple[Any, Any]]) -> None:
        """Each source's tokens, in the order their chunks were taken."""
        by_source: dict[int, tuple[Any, list[Any]]] = {}
        for source, token in tokens:
            by_source.setdefault(id(source), (source, []))[1].append(token)
        for source, taken in by_source.values():
            source.acknowledge(taken)

    async def sync_loop(self) -> None:
        """Group commit: gather readings for ``fsync_interval`` (or ``fsync_batch`` of them), write and fsync in a
        worker thread, then release what waited for them and acknowledge their messages."""
        while True:
            await self.wake.wait()
            if self.fsync_interval > 0 and self.journal.pending_records < self.fsync_batch:
                await asyncio.sleep(self.fsync_interval)
            self.wake.clear()
            async with self.io_lock:
                await self._sync()

    async def _sync(self) -> None:
        """Write and fsync what the journal took, waiting for the disk while it refuses (nothing is accepted,
        released or acknowledged meanwhile), then release and acknowledge what waited for it."""
        self.journal.take()
        held, tokens = self.held, self.source_acks
        self.held, self.source_acks = [], []
        n = 0
        if self.journal.unwritten:
            self.syncing = True
            try:
                n = await self.disk.run("journal", self.journal.write_durable, fsync=self.fsync, thread=True)
            except DiskRefused:  # stopping on a full disk: what was not written was never accepted
                self.held = held + self.held
                self.source_acks = tokens + self.source_acks
                return
            finally:
                self.syncing = False
        self.synced_readings += n
        if n:
            self.daemon.metrics.journal_synced.inc(n)
        self._release(held)
        self._acknowledge_sources(tokens)
        self._confirm()

    # -- checkpoints --------------------------------------------------------------------------------------------
    async def checkpoint_loop(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: in 3.11 wait_for loses a cancellation that comes as the event is set
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.checkpoint_interval):
                    await self.checkpoint_due.wait()
            await self.checkpoint_async()

    async def checkpoint_now(self) -> None:
        """A checkpoint as soon as no sync and no other checkpoint is under way (shutdown, eviction)."""
        await self.checkpoint_async()

    def try_checkpoint(self) -> bool:
        """:meth:`checkpoint`; when the disk is full it is left for later (the journal still holds everything)."""
        try:
            self.checkpoint()
        except (OSError, sqlite3.Error) as exc:
            self._failed(exc, None)
            return False
        return True

    def _failed(self, exc: BaseException, cut: _Cut | None) -> None:
        if isinstance(exc, DiskRefused):  # stopping on a full disk (else it is waited out): close() says it once
            log.debug("checkpoint left undone at the stop: the disk refuses writes (%s)", exc.file)
        else:
            log.error("checkpoint failed (%s): the journal keeps the readings; retrying later", exc)
        if cut is not None:
            self._hand_back(cut)
        self.wake.set()  # the sync loop notices a journal it cannot write

    def checkpoint(self) -> None:
        """One consistent checkpoint, all of it in this event-loop step (the start, tests); the caller holds
        ``io_lock`` if running."""
        cut = self._cut()
        try:
            self._write(cut)
        except BaseException:
            self._hand_back(cut)
            raise
        self._finish(cut)
        self._commit_spill(cut)
        if cut.left_holdout:
            self.store.purge_freed_pages(writer=True)

    def _hand_back(self, cut: _Cut) -> None:
        """A checkpoint that failed: what it was to write is written by the next one."""
        self.changed.update(cut.states)
        self.store.return_admissions(cut.admissions)
        if cut.meta is not None and FLEET_META in cut.meta:
            self.fleet_saved = None  # the fleet holdout too

    async def checkpoint_async(self) -> None:
        """One consistent checkpoint while intake goes on: its cut in one event-loop step (:meth:`_cut`: the journal
        rotated, the changed streams' states taken), their encoding and the store's transaction in a worker thread
        (:meth:`_write`; readings keep being accepted, journaled and released meanwhile: they are after the cut),
        then :meth:`_finish` in the loop. One checkpoint at a time; a failure is logged and left for the next one
        (the journal still holds everything)."""
        async with self.checkpoint_lock:
            disk = self.disk
            async with self.io_lock:  # the journal is rotated while no sync writes to it
                try:
                    cut = await disk.run("journal", self._cut)
                except (OSError, sqlite3.Error) as exc:
                    self._failed(exc, None)
                    return
            try:
                await disk.run("store", self._write, cut, thread=True)
            except (OSError, sqlite3.Error) as exc:
                self._failed(exc, cut)
                return
            self._finish(cut)
            try:  # stopping on a full disk: the next start reads some spilled messages twice at most
                await disk.run("outbox_position", self._commit_spill, cut)
                if cut.left_holdout:  # the holdout histograms are gone from the rows: their old page images too
                    await disk.run("store", self.store.purge_freed_pages, writer=True, thread=True)  # (it waits
                    # for other writers: in a worker thread, not in the event loop)
            except (OSError, sqlite3.Error) as exc:
                self.saved_in_holdout.update(cut.left_holdout)  # the next checkpoint clears and purges them again
                self.changed.update(cut.left_holdout)
                log.error("after a checkpoint (%s): left to the next one", exc)
            if cut.appended >= self.fold_after:
                try:
                    await disk.run("store", self._fold, thread=True)
                except (OSError, sqlite3.Error) as exc:  # the appended states stay where they are: nothing is lost
                    log.error("folding the appended states failed (%s); retrying after the next checkpoint", exc)

    def _cut(self) -> _Cut:
        """The checkpoint's event-loop part: everything up to the rotated journal's ``position`` is in what it takes
        (the changed streams' states, the outbox, the redelivery entries, the spill's read position)."""
        t0 = time.perf_counter()
        daemon, router = self.daemon, self.router
        self.checkpoint_due.clear()
        if router.clock is None and router.dirty:
            daemon.emit(router.flush())
        synced = self.journal.sync(fsync=self.fsync)
        position = self.journal.rotate(fsync=self.fsync)
        if synced:
            self.synced_readings += synced
            self.daemon.metrics.journal_synced.inc(synced)
        held, tokens = self.held, self.source_acks
        self.held, self.source_acks = [], []
        self._release(held)
        self._acknowledge_sources(tokens)
        self._confirm()
        spill = daemon.pubq.spill if daemon.pubq is not None else None
        if spill is not None:  # the last of the cut's writes (a refusal retries the cut: it changed nothing yet)
            spill.sync()
        streams = router.streams
        names = list(streams) if router.clock is not None else [n for n in self.changed if n in streams]
        recs = [streams[n] for n in names]
        states = record_states(recs)
        saved, left_holdout = self.saved_in_holdout, []
        for rec in recs:  # one pass: stored in its holdout now, or no longer in it
            if rec.operator.phase == "holdout":
                saved.add(rec.name)
            elif rec.name in saved:
                left_holdout.append(rec.name)
        red = self.redeliveries
        meta = None if red is None else {"redeliveries": json.dumps(red.snapshot(), separators=(",", ":"))}
        fleet = daemon.fleet
        if fleet is not None and (fleet.taken, fleet.choice is not None) != self.fleet_saved:
            # the fleet holdout in the same transaction as its streams' states: they continue from one cut
            meta = {**(meta or {}), FLEET_META: json.dumps(fleet.snapshot(), separators=(",", ":"))}
            self.fleet_saved = (fleet.taken, fleet.choice is not None)
        self.changed.clear()  # what changes from now on is after the cut: the next checkpoint's
        self.ticks_at_checkpoint = router.ticks_total  # the next one is due checkpoint_every ticks after this cut
        cut = _Cut(states, position, self.outbox(), meta, None if spill is None else spill.read_pos, left_holdout,
                   t0, self.store.take_admissions())
        cut.pause = time.perf_counter() - t0
        return cut

    def _write(self, cut: _Cut) -> _Cut:
        """Encode the states (once) and commit them with the journal position and the outbox in one transaction (a
        worker thread's part: the store's writer connection is used by nothing else); again after a refusal."""
        store = self.store
        if cut.rows is None:
            cut.rows = store.encode(cut.states, polite=True)
        try:
            store.commit_checkpoint(cut.rows, cut.position, cut.outbox, meta=cut.meta, writer=True,
                                    admissions=cut.admissions, clear_rows=cut.left_holdout)
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):  # a full disk: fold the store's WAL in, truncate it
                store.purge_freed_pages(writer=True)
            raise
        cut.appended = store.appended(writer=True)
        return cut

    def _fold(self) -> None:
        """The appended states into the streams' rows (a worker thread's part, under the checkpoint lock)."""
        t0 = time.perf_counter()
        n = self.store.fold(writer=True)
        # its pages are copied from the WAL into the file now (and the WAL truncated: 140 MB after a fold of 100,000
        # of a million), not by the commits of the next checkpoints
        self.store.purge_freed_pages(writer=True)
        self.folds += 1
        log.info("state: %d appended states folded into the streams' rows (%.2f s)", n, time.perf_counter() - t0)

    def _finish(self, cut: _Cut) -> None:
        t1 = time.perf_counter()
        self.journal.drop_before(cut.position)  # first: frees space the spill's position file may need
        self.saved_in_holdout.difference_update(cut.left_holdout)
        self.checkpoints += 1
        dt = time.perf_counter() - cut.t0
        pause = cut.pause + time.perf_counter() - t1
        self.last_checkpoint_seconds = dt
        self.max_checkpoint_seconds = max(self.max_checkpoint_seconds, dt)
        self.max_checkpoint_pause = max(self.max_checkpoint_pause, pause)
        self.daemon.metrics.checkpoint_seconds.observe(dt)
        self.daemon.metrics.checkpoint_pause.observe(pause)
        log.debug("checkpoint: %d streams written in %.3f s, %.3f s of it in the event loop (journal position %d)",
                  len(cut.states), dt, pause, cut.position)

    def _commit_spill(self, cut: _Cut) -> None:
        """The spill's read position at the cut, after the commit: a crash in between repeats messages, never loses
        one."""
        spill = self.daemon.pubq.spill if self.daemon.pubq is not None else None
        if spill is not None and cut.spill_pos is not None:
            spill.commit(cut.spill_pos)

    def outbox(self) -> list[tuple[str, bytes, bool, int]] | None:
        """Messages made but not confirmed by the broker: unconfirmed in-flight ones first, then the queue."""
        daemon = self.daemon
        if daemon.pubq is None:
            return None
        items: list[tuple[str, bytes, bool, int]] = []
        if daemon.link is not None:
            items += [item for info, item in daemon.link.inflight if not published(info)]
        items += list(daemon.pubq.items)
        return items

    def start(self, tg: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        """Start the sync and checkpoint loops."""
        return [tg.create_task(self.sync_loop(), name="tops.state.sync"),
                tg.create_task(self.checkpoint_loop(), name="tops.state.checkpoint")]

    def close(self) -> None:
        """The last checkpoint is taken by the drain; close the files."""
        if self.disk.waiting:
            log.error("stopping while the disk refuses writes (%s): readings not yet in the journal were never "
                      "accepted (nor acknowledged or released); the next start re-processes the journal",
                      ", ".join(sorted(self.disk.waiting)))
        self.disk.close()
        with contextlib.suppress(OSError):
            self.journal.close()
        if self.daemon.pubq is not None and self.daemon.pubq.spill is not None:
            self.daemon.pubq.spill.close()
        self.store.close()

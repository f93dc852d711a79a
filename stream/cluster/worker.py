"""A cluster worker (``tops run`` with ``[input] source = "nats"``): the partitions it leases, through the daemon's
operators, to the output stream, with failover that never noises a tick twice.

Per owned partition ``p`` the worker reads, in order, a durable pull consumer on ``<input_subject>.p.>`` that starts
right after the partition's *floor* (the last input sequence whose effect is in the state bucket). Every message
is one stream's readings (the subject's last token names the stream; the payload is what MQTT readings are). A
stream's state is loaded from the state bucket the first time the worker sees it; a message at or below the stream's
stored input sequence is already in that state and is skipped, so nothing is counted twice after a failover. The
consumer's delivery sequence must go up by one from message to message: a gap is a delivery lost in flight (a node
died with it on the wire), and the consumer is made again right after the last message taken, so that nothing is
acknowledged that was not seen.

The same :class:`stream.core.router.Router` and operators as ``tops run`` and ``tops replay`` release every tick; the
release is published to ``<output_subject>.<stream>`` with the message id ``<stream>:<tick>`` and its ``ts`` is the
input message's JetStream time (the reading's ``ts`` if it has one), so whichever worker makes a tick makes the same
bytes, and JetStream keeps one. Every ``checkpoint_interval`` seconds, per partition: renew the lease (compare-and-set
on its revision), write each changed stream's state (compare-and-set on the revision this worker read or wrote),
move the partition's floor (compare-and-set), then acknowledge the partition's messages up to the floor (ack policy
*all*). Releases are published (and confirmed) before the state that follows them is written. A refused
compare-and-set means another worker owns the partition now: this worker drops it without another write or publish.

Keys: the same master key file on every worker; the cluster's identity (``derive_stream_key``'s ``identity``) is
created once in the meta bucket, with the streams' privacy parameters and the key check
(:func:`stream.cluster.jetstream.key_check`). A worker with other parameters, or whose master key gives another key
check, refuses to start (one line, exit 2) before it takes a partition. Every stream state carries the key check of
the worker that wrote it; a worker that loads a state with another one (the meta bucket was lost and made again, so
the identity and the stream keys are new) processes no reading of it: it drops its partitions without writing, gives
their leases back and ends with one line (exit 2). So a stream's ticks are all noised under one key.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from operators.fleet_holdout import FleetHoldout
from stream.cluster.jetstream import Names, ensure, key_check, state_key
from stream.cluster.leases import lease_key, share, wanted
from stream.cluster.pipeline import BatchPull, ReleasePublisher, ack_sequences
from stream.core.config import DaemonConfig, build_operator, stream_params
from stream.core.errors import PayloadError, StreamCapError
from stream.core.keys import derive_stream_key, load_master_key, new_identity
from stream.core.payload import check_stream_name, decode_payload_columns
from stream.core.router import Router, StreamRecord
from stream.core.sinks import encode_releases
from stream.state.records import apply_state, operator_snapshot, record_state

__all__ = ["ClusterWorker", "WorkerError"]

log = logging.getLogger("tops.cluster")

# A consumer's creation waits for its raft group's leader: after a NATS node died, 5-10 s (the election waits out the
# dead peer), longer than the client's 5 s; it runs beside the main loop (partitions held keep releasing) with this
# timeout, its partition's lease renewed meanwhile
CONSUMER_TIMEOUT = 30.0
PUBLISH_TIMEOUT = 5.0  # seconds for the releases sent to be confirmed, once their confirmations are gathered
PUBLISH_PENDING = 4096  # releases sent and not yet confirmed, at most (then the sends before are confirmed first)
ARRIVAL_WAIT = 0.05  # seconds a step waits for a message when no partition has one


class WorkerError(RuntimeError):
    """The worker cannot start (one line, no secret)."""


class KeyMismatch(WorkerError):
    """A stream's stored state was made under another master key or cluster identity than this worker's."""


class Fenced(Exception):
    """Another worker owns the partition now."""


@dataclass
class Partition:
    index: int
    lease_rev: int
    floor: int = 0  # last input sequence whose effect is in the state bucket
    floor_rev: int | None = None
    applied: int = 0  # last input sequence applied in memory
    last_msg: Any = None  # the last message taken (acknowledged, with all before it, once the floor covers it)
    delivered: int = 0  # the consumer's delivery sequence of the last message taken (a gap: one was lost)
    gap: bool = False  # a delivery went missing: the consumer is made again right after ``applied``
    sub: Any = None
    consumer: str = ""
    streams: set[str] = field(default_factory=set)
    renewed: float = 0.0


class ClusterWorker:
    """One worker process of a cluster (see the module docstring)."""

    def __init__(self, cfg: DaemonConfig, master: bytes, *, name: str | None = None, heap: Any = None) -> None:
        self.cfg = cfg
        self.heap = heap  # `tops run` keeps the collector's full passes short (stream/daemon/heap.py): tick() per pass
        self.master = master
        nt = cfg.nats
        self.name = name or nt.worker or f"{socket.gethostname()}-{os.getpid()}"
        self.names = Names.from_config(nt)
        self.template = cfg.template
        self.identity = ""
        self.key_check = ""  # jetstream.key_check(master, identity), once the identity is known
        self.router = Router(self._operator, cfg.streams.max_streams)
        self.owned: dict[int, Partition] = {}
        self.of_stream: dict[str, int] = {}  # stream -> partition
        self.js_seq: dict[str, int] = {}  # stream -> last input sequence in its state
        self.state_rev: dict[str, int | None] = {}
        self.changed: set[str] = set()
        self.releases: ReleasePublisher | None = None  # made on the first send (the connection is up by then)
        self.arrived = asyncio.Event()  # set when a message reaches any partition's pull
        self.stopping = asyncio.Event()
        self.nc: Any = None
        self.js: Any = None
        self.kv: dict[str, Any] = {}
        self.taking: asyncio.Task | None = None  # free partitions being taken, beside the main loop
        self.fleet: FleetOutcome | None = None  # holdout_scope = "fleet": the cluster's fleet holdout, chosen
        self.remaking: dict[int, asyncio.Task] = {}  # partition -> its consumer being made again (a lost delivery)
        reg = self.registry = CollectorRegistry()
        self.m_partitions = Gauge("tops_cluster_partitions_owned", "Partitions this worker holds", registry=reg)
        self.m_readings = Counter("tops_cluster_readings", "Readings taken, by result", ["result"], registry=reg)
        self.m_releases = Counter("tops_cluster_releases", "Releases published (confirmed by JetStream)",
                                  registry=reg)
        self.m_fenced = Counter("tops_cluster_partitions_lost", "Partitions lost to another worker (a refused "
                                "compare-and-set or an expired lease)", registry=reg)
        self.m_lost = Counter("tops_cluster_deliveries_lost", "Gaps in a partition's delivery sequence (a message "
                              "lost in flight): the consumer is made again after the last message taken",
                              registry=reg)
        self.m_checkpoints = Counter("tops_cluster_checkpoints", "Partition checkpoints written", registry=reg)

    # -- streams ----------------------------------------------------------------------------------------------------
    def _operator(self, name: str) -> Any:
        key = derive_stream_key(self.master, name, identity=self.identity)
        if self.fleet is not None:  # the fleet holdout chose before any partition was taken (_fleet_choice)
            return self.fleet.holdout.member(key, self.fleet.held.get(name, 0))
        return build_operator(self.template, "tops", key)

    async def _record(self, name: str, part: Partition) -> StreamRecord | None:
        """The stream's record, loaded from the state bucket the first time the worker sees it. The stored state is
        read before the record exists: a read that fails (a timeout while a node dies) leaves no record behind, and
        the next sight reads it again (a fresh record left in memory would restart the stream at tick 0)."""
        rec = self.router.streams.get(name)
        if rec is not None:
            return rec
        if len(self.router.streams) >= self.router.max_streams:
            self.m_readings.labels("stream_cap").inc()
            return None
        from nats.js.errors import KeyNotFoundError

        try:
            entry = await self.kv["state"].get(state_key(name))
        except KeyNotFoundError:
            entry = None
        state = json.loads(entry.value) if entry is not None and entry.value else None
        if state is not None:
            self._check_state_key(state)
        try:
            rec = self.router.record(name)
        except StreamCapError:
            self.m_readings.labels("stream_cap").inc()
            return None
        if entry is not None and entry.value:
            op = rec.operator
            rec.operator = type(op).restore(op.config, derive_stream_key(self.master, name, identity=self.identity),
                                            operator_snapshot(state, op.config))
            if rec.phase == "holdout" and rec.operator.phase != "holdout":
                self.router.in_holdout -= 1
            rec.phase = rec.operator.phase
            apply_state(rec, state)
            self.js_seq[name] = int(state["js_seq"])
            self.state_rev[name] = entry.revision
        else:
            self.js_seq[name] = 0
            self.state_rev[name] = None
            if self.fleet is not None:  # its readings the fleet holdout took are its first ticks; later repeats of
                rec.ticks = rec.released_from = self.fleet.held.get(name, 0)  # their seqs are dropped
                rec.last_seq = self.fleet.last_seq.get(name)
        part.streams.add(name)
        self.of_stream[name] = part.index
        return rec

    def _check_state_key(self, state: dict[str, Any]) -> None:
        """A stored stream state is continued only under the key check it was written with (a state written before
        states carried one is taken: the start's check against the meta bucket covered it)."""
        stored = state.get("key_check")
        if stored is not None and not hmac.compare_digest(str(stored).encode(), self.key_check.encode()):
            msg = (f"a stream's stored state was made with another master key or cluster identity than this "
                   f"worker's (key file {self.cfg.streams.key_file}, identity {self.identity}); refusing to go on: "
                   "its readings are not processed and the partitions go back without writing (use the key file the "
                   "streams were made with; if the cluster's identity was lost, so are their keys: clear the state "
                   "bucket)")
            raise KeyMismatch(msg)

    def _forget(self, part: Partition) -> None:
        """Drop a partition's streams from memory (another worker continues them from the state bucket)."""
        for name in part.streams:
            rec = self.router.streams.pop(name, None)
            if rec is not None and rec.phase == "holdout":
                self.router.in_holdout -= 1
            self.router.dirty.pop(name, None)
            for d in (self.of_stream, self.js_seq, self.state_rev):
                d.pop(name, None)
            self.changed.discard(name)
        part.streams.clear()

    # -- input ------------------------------------------------------------------------------------------------------
    async def _take(self, part: Partition, msgs: list[Any]) -> None:
        """The messages of one fetch, in order; the readings' results counted once for all of them."""
        try:
            await self._take_messages(part, msgs)
        finally:
            for result, n in self.router.take_counts().items():
                if n:
                    self.m_readings.labels(result).inc(n)

    async def _take_messages(self, part: Partition, msgs: list[Any]) -> None:
        prefix = f"{self.names.input_subject}.{part.index}."
        limit = self.cfg.input.max_payload_bytes
        for m in msgs:
            seq, delivered, now = ack_sequences(m.reply)  # now: the broker's time, the same for every worker
            if delivered != part.delivered + 1:  # a delivery lost in flight: fetch again from here
                part.gap = True
                self.m_lost.inc()
                return
            part.delivered += 1
            part.last_msg = m
            part.applied = max(part.applied, seq)
            name = m.subject[len(prefix):] if m.subject.startswith(prefix) else ""
            try:
                check_stream_name(name)
            except PayloadError:
                self.m_readings.labels("invalid_subject").inc()
                continue
            rec = await self._record(name, part)
            if rec is None:
                continue
            if seq <= self.js_seq.get(name, 0):  # already in the stream's stored state
                self.m_readings.labels("already_applied").inc()
                continue
            self.js_seq[name] = seq
            self.changed.add(name)
            fleet = self.fleet
            if fleet is not None and seq <= fleet.until:  # the fleet holdout's readings (the stream's ticks: held)
                if seq < fleet.until or fleet.tail is None or fleet.tail[0] != name:
                    self.m_readings.labels("fleet_holdout").inc()
                    continue
                values, ts, seqs = fleet.tail[1:]  # the readings of the message after the holdout's last one
                bad = 0
            elif len(m.data) > limit:
                self.m_readings.labels("too_large").inc()
                continue
            else:
                try:
                    values, ts, seqs, bad = decode_payload_columns(m.data)
                except PayloadError:
                    self.m_readings.labels("invalid").inc()
                    continue
            if bad:
                self.m_readings.labels("invalid").inc(bad)
            if not values or rec.failed:
                continue
            try:
                self.router.add_many(rec, values, ts, seqs, now)
            except Exception as exc:  # an operator that raises fails its stream only
                self.router.fail(rec, f"a message raised {type(exc).__name__}")

    async def _publish(self) -> None:
        """Process what was taken and publish every release, all of them confirmed (those sent before too): what
        comes before any state is written."""
        await self._send()
        await self._confirm()

    @property
    def unconfirmed(self) -> set[int]:
        """The releases sent whose confirmation has not come yet."""
        return self.releases.waiting if self.releases is not None else set()

    async def _send(self) -> None:
        """Process what was taken and send its releases, pipelined: each goes at once, its confirmation is struck
        off when it comes and checked later (:meth:`_confirm`); at most ``PUBLISH_PENDING`` wait for theirs (the
        sends before are confirmed first)."""
        batches = self.router.flush()
        if self.releases is None:
            self.releases = ReleasePublisher(self.nc)
            await self.releases.start()
        eps = float(self.template.epsilon)
        out, releases = self.names.output_subject, self.releases
        for b in batches:
            name = b.record.name
            subject = f"{out}.{name}"
            for tick, line in zip(b.ticks, encode_releases(b, eps), strict=True):
                if len(releases.waiting) >= PUBLISH_PENDING:
                    await self._confirm()
                await releases.send(subject, line.encode(), f"{name}:{tick}")

    async def _confirm(self) -> None:
        """Every release sent is confirmed by JetStream within ``PUBLISH_TIMEOUT``, or the step fails (the caller's
        reset: the releases are made again, the same bytes, and the broker keeps one of each message id)."""
        if self.releases is not None:
            self.m_releases.inc(await self.releases.confirm(PUBLISH_TIMEOUT))

    # -- leases and checkpoints ---------------------------------------------------------------------------------------
    async def _checkpoint(self, part: Partition, *, final: bool = False) -> None:
        """Lease renewal, the changed streams' states, the floor, then the acknowledgement (module docstring)."""
        from nats.js.errors import KeyWrongLastSequenceError

        leases, state = self.kv["leases"], self.kv["state"]
        try:
            part.lease_rev = await leases.update(lease_key(part.index), self.name.encode(), last=part.lease_rev)
        except KeyWrongLastSequenceError:
            raise Fenced from None
        part.renewed = time.monotonic()
        names = [n for n in part.streams if n in self.changed]
        # the changed streams' states, written together (each a compare-and-set of its own key), all before the floor
        written = await asyncio.gather(*(self._write_state(state, n) for n in names), return_exceptions=True)
        failed = [w for w in written if isinstance(w, BaseException)]
        if any(isinstance(w, KeyWrongLastSequenceError) for w in failed):
            raise Fenced
        if failed:
            raise failed[0]
        if part.applied > part.floor or final:
            doc = self._floor_doc(part, part.applied)
            try:
                part.floor_rev = await state.update(f"p.{part.index}", doc, last=part.floor_rev or 0)
            except KeyWrongLastSequenceError:
                raise Fenced from None
            part.floor = part.applied
            if part.last_msg is not None:
                with contextlib.suppress(Exception):  # a lost ack is redelivered and skipped by the stored seq
                    await part.last_msg.ack()
                part.last_msg = None
            self.m_checkpoints.inc()

    async def _write_state(self, state: Any, name: str) -> None:
        """One stream's state, compare-and-set on the revision this worker last wrote or read."""
        doc = record_state(self.router.streams[name])
        doc["js_seq"] = self.js_seq[name]
        doc["key_check"] = self.key_check
        value = json.dumps(doc, separators=(",", ":")).encode()
        rev = self.state_rev.get(name)
        if rev is None:
            self.state_rev[name] = await state.create(state_key(name), value)
        else:
            self.state_rev[name] = await state.update(state_key(name), value, last=rev)
        self.changed.discard(name)

    def _floor_doc(self, part: Partition, floor: int) -> bytes:
        return json.dumps({"floor": floor, "owner": self.name, "consumer": part.consumer}).encode()

    async def _reset(self, why: str) -> None:
        """Something failed half-way (a timeout while the cluster elects a leader, a publish not confirmed): drop
        every partition without writing its state and give the leases back; they are taken again (here or by
        another worker) from their last checkpoint, and the releases made again are the same bytes (the broker
        keeps one of each message id)."""
        log.warning("cluster step failed (%s): %d partitions dropped without writing, taken again from their last "
                    "checkpoint", why, len(self.owned))
        await self._abandon()

    async def _abandon(self) -> None:
        """Every partition dropped without writing or publishing, its lease given back, nothing left in memory."""
        await self._cancel_background()
        if self.releases is not None:  # sent or not, they are made again by whoever takes the partitions (same ids)
            self.releases.forget()
        for part in list(self.owned.values()):
            self.owned.pop(part.index, None)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(part.sub.unsubscribe(), 2.0)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.kv["leases"].delete(lease_key(part.index), last=part.lease_rev), 2.0)
            self._forget(part)
        # a worker without partitions holds no stream: whatever is left (a record half made when the step failed)
        # would be taken for the stream's stored state the next time
        self.router.flush()
        self.router.streams.clear()
        self.router.in_holdout = self.router.failed = 0
        for d in (self.of_stream, self.js_seq, self.state_rev):
            d.clear()
        self.changed.clear()
        self.m_partitions.set(0)

    async def _cancel_background(self) -> None:
        """Stop the partitions being taken and the consumers being made again (a task cancelled while taking gives
        its lease back before it ends)."""
        tasks = [t for t in (self.taking, *self.remaking.values()) if t is not None and not t.done()]
        self.taking = None
        self.remaking.clear()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t

    async def _acquire(self, index: int) -> None:
        from nats.js.errors import KeyWrongLastSequenceError

        try:  # create: refused while another worker's lease lives (a deleted or expired one can be taken)
            rev = await self.kv["leases"].create(lease_key(index), self.name.encode())
        except KeyWrongLastSequenceError:
            return  # someone else's
        part = Partition(index, rev, renewed=time.monotonic())
        try:
            await self._claim(part)
        except BaseException:  # half taken (a timeout while the cluster elects): the lease goes back now, not at ttl
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.kv["leases"].delete(lease_key(index), last=part.lease_rev), 2.0)
            raise

    async def _claim(self, part: Partition) -> None:
        """The rest of :meth:`_acquire` under a new lease: the floor claimed (the fence), the old consumer deleted,
        this lease's consumer made (its lease renewed while that takes long)."""
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

        index, rev = part.index, part.lease_rev
        state = self.kv["state"]
        try:
            entry = await state.get(f"p.{index}")
            part.floor = int(json.loads(entry.value)["floor"]) if entry.value else 0
            part.floor_rev = entry.revision
        except KeyNotFoundError:
            part.floor_rev = None
        previous = ""
        if part.floor_rev is not None:
            previous = str(json.loads(entry.value).get("consumer", ""))
        part.consumer = self.names.consumer(index, rev)
        claim = self._floor_doc(part, part.floor)
        try:  # the fence: a stale owner's next floor write is refused from now on
            if part.floor_rev is None:
                part.floor_rev = await state.create(f"p.{index}", claim)
            else:
                part.floor_rev = await state.update(f"p.{index}", claim, last=part.floor_rev)
        except KeyWrongLastSequenceError:
            with contextlib.suppress(Exception):
                await self.kv["leases"].delete(lease_key(index), last=rev)
            return
        part.applied = part.floor
        if previous:
            with contextlib.suppress(NotFoundError):
                await self.js.delete_consumer(self.names.input_stream, previous)
        await self._consume_leased(part)
        self.owned[index] = part
        self.m_partitions.set(len(self.owned))
        log.info("partition %d taken (floor %d)", index, part.floor)

    async def _consume(self, part: Partition) -> None:
        """The partition's consumer (this lease's name), delivering from right after the last message taken."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        cc = ConsumerConfig(durable_name=part.consumer, filter_subject=self.names.partition_subject(part.index),
                            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=part.applied + 1,
                            ack_policy=AckPolicy.ALL, ack_wait=60.0, max_ack_pending=-1)
        await self.js.add_consumer(self.names.input_stream, cc, timeout=CONSUMER_TIMEOUT)
        pull = BatchPull(self.nc, self.names.input_stream, part.consumer, int(self.cfg.nats.fetch_batch), self.arrived)
        await pull.start()
        part.sub = pull
        part.delivered, part.gap, part.last_msg = 0, False, None

    async def _consume_leased(self, part: Partition) -> None:
        """:meth:`_consume` for a partition being taken (not yet held, so the main loop does not renew its lease):
        the lease is renewed every third of its life until the consumer is made (a refusal ends the taking)."""
        from nats.js.errors import KeyWrongLastSequenceError

        made = asyncio.ensure_future(self._consume(part))
        try:
            while not (await asyncio.wait({made}, timeout=self.names.lease_ttl / 3))[0]:
                try:
                    part.lease_rev = await self.kv["leases"].update(lease_key(part.index), self.name.encode(),
                                                                    last=part.lease_rev)
                except KeyWrongLastSequenceError:
                    raise Fenced from None
                part.renewed = time.monotonic()
            made.result()
        finally:
            if not made.done():
                made.cancel()
                with contextlib.suppress(BaseException):
                    await made

    async def _refetch(self, part: Partition) -> None:
        """A delivery was lost in flight (a node died with it on the wire): the consumer counts it delivered, and
        acknowledging a later message (ack policy all) would acknowledge it away. The lease is renewed first (a
        partition lost meanwhile is dropped, no consumer is made for it again), then the consumer is made again from
        right after the last message taken, beside the main loop (that takes a raft election after a node died);
        the messages after the gap were not taken and come again in order."""
        from nats.js.errors import KeyWrongLastSequenceError

        try:
            part.lease_rev = await self.kv["leases"].update(lease_key(part.index), self.name.encode(),
                                                            last=part.lease_rev)
        except KeyWrongLastSequenceError:
            await self._drop(part, hand_back=False)
            return
        part.renewed = time.monotonic()
        sub, part.sub = part.sub, None  # not fetched until made again
        with contextlib.suppress(Exception):
            await asyncio.wait_for(sub.unsubscribe(), 2.0)
        log.warning("partition %d: a delivery was lost in flight; fetching again after sequence %d", part.index,
                    part.applied)
        self.remaking[part.index] = asyncio.ensure_future(self._remake(part))

    async def _remake(self, part: Partition) -> None:
        """The consumer of a held partition made again (its lease renewed by the main loop meanwhile), until it
        is made or the partition is dropped."""
        from nats.js.errors import NotFoundError

        while self.owned.get(part.index) is part:
            try:
                with contextlib.suppress(NotFoundError):
                    await self.js.delete_consumer(self.names.input_stream, part.consumer)
                await self._consume(part)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("partition %d: consumer not made again (%s); trying again", part.index, _where(exc))
                await asyncio.sleep(0.5)
        self.remaking.pop(part.index, None)

    async def _drop(self, part: Partition, *, hand_back: bool) -> None:
        """Stop running a partition; ``hand_back``: checkpoint it and delete the lease so another takes it now."""
        self.owned.pop(part.index, None)
        remake = self.remaking.pop(part.index, None)
        if remake is not None:
            remake.cancel()
        self.m_partitions.set(len(self.owned))
        try:
            if hand_back:
                try:
                    await self._publish()
                    await self._checkpoint(part, final=True)
                    await self.kv["leases"].delete(lease_key(part.index), last=part.lease_rev)
                    log.info("partition %d handed back (floor %d)", part.index, part.floor)
                except Fenced:
                    self.m_fenced.inc()
            else:
                self.m_fenced.inc()
                log.warning("partition %d lost to another worker: dropped without writing", part.index)
        finally:  # whatever happened, its streams leave memory (taken again, they are loaded from the store)
            if part.sub is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(part.sub.unsubscribe(), 2.0)
            self._forget(part)

    async def _rebalance(self) -> None:
        """Heartbeat, then take or hand back partitions toward this worker's share. Only key reads and stream info:
        listing keys would create a consumer per call, which a cluster that just lost a node cannot place. Free
        partitions are taken beside the main loop (:meth:`_take_free`), one taking at a time."""
        await self.kv["workers"].put(self.name, b"1")
        if self.taking is not None and not self.taking.done():
            return
        info = await self.js.stream_info(f"KV_{self.names.workers}")
        alive = max(1, int(info.state.messages or 1))  # history 1: one message per live heartbeat
        p = self.names.partitions
        target = share(p, alive)
        if len(self.owned) > target:
            _, give = wanted(range(p), owned=set(self.owned), free=set(), target=target)
            for i in give:
                await self._drop(self.owned[i], hand_back=True)
            return
        if len(self.owned) < target:
            self.taking = asyncio.ensure_future(self._take_free(target))

    async def _take_free(self, target: int) -> None:
        """Take free partitions, one after the other, until this worker holds ``target``. A failure gives that
        partition's lease back and ends the round; the partitions held go on (resetting them would need a new
        consumer for each, and after a node died every creation waits out a raft election)."""
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        for i in range(self.names.partitions):
            if len(self.owned) >= target or self.stopping.is_set():
                break
            if i in self.owned:
                continue
            try:
                try:
                    await self.kv["leases"].get(lease_key(i))
                    continue  # held
                except (KeyNotFoundError, KeyDeletedError):
                    pass
                await self._acquire(i)
            except Exception as exc:
                log.warning("partition %d: not taken (%s); tried again later", i, _where(exc))
                break

    # -- the loops --------------------------------------------------------------------------------------------------
    async def _step(self) -> int:
        """One pass over the owned partitions: wait (at most ``ARRIVAL_WAIT``) until one of them has messages, take
        what each has (one partition after the other), publish. Returns messages taken."""
        batch = int(self.cfg.nats.fetch_batch)
        parts = [part for part in self.owned.values() if part.sub is not None]  # (None: its consumer is remade)
        if parts and not any(part.sub.ready for part in parts):
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), ARRIVAL_WAIT)
        n, failed = 0, False
        for part in parts:
            msgs = await self._fetch(part, batch)
            failed |= msgs is None
            if not msgs or self.owned.get(part.index) is not part:
                continue
            await self._take(part, msgs)
            n += len(msgs)
            if part.gap:
                await self._refetch(part)
        if failed:
            await asyncio.sleep(0.2)
        if n:
            await self._fresh_leases()
            # the previous step's releases were confirmed while this step fetched and took (one step in flight);
            # no state is written before every release sent is confirmed (_maintain and _drop publish first)
            await self._confirm()
            await self._send()
        self.router.status_now.clear()  # no status messages in a cluster: releases only
        return n

    @staticmethod
    async def _fetch(part: Partition, batch: int) -> list[Any] | None:
        """Up to ``batch`` messages the partition's pull holds now; None when the pull failed (the consumer went
        away: another owner recreated it, or the link is down)."""
        try:
            return await part.sub.fetch(batch, timeout=0)
        except Exception as exc:
            log.warning("partition %d: fetch failed (%s)", part.index, type(exc).__name__)
            return None

    async def _fresh_leases(self) -> None:
        """No release leaves for a partition whose lease was not renewed within half its life (a worker paused
        longer renews first, and drops the partition without publishing if the renewal is refused). What remains,
        a pause between this check and the publish, can only repeat bytes the new owner makes too (same message id)."""
        from nats.js.errors import KeyWrongLastSequenceError

        now = time.monotonic()
        for part in list(self.owned.values()):
            if now - part.renewed <= self.names.lease_ttl / 2:
                continue
            try:
                part.lease_rev = await self.kv["leases"].update(lease_key(part.index), self.name.encode(),
                                                                last=part.lease_rev)
                part.renewed = now
            except KeyWrongLastSequenceError:
                await self._drop(part, hand_back=False)

    async def _maintain(self, last_checkpoint: float) -> float:
        now = time.monotonic()
        interval = float(self.cfg.nats.checkpoint_interval)
        renew = self.names.lease_ttl / 3
        due = now - last_checkpoint >= interval
        for part in list(self.owned.values()):
            if now - part.renewed > self.names.lease_ttl:  # could not renew in time: the lease may be gone
                await self._drop(part, hand_back=False)
                continue
            if due or now - part.renewed >= renew:
                try:
                    await self._publish()
                    await self._checkpoint(part)
                except Fenced:
                    await self._drop(part, hand_back=False)
        return now if due else last_checkpoint

    async def serve(self) -> int:
        import nats

        async def error_cb(exc: Exception) -> None:  # one line, not the client's traceback
            log.warning("NATS: %s", type(exc).__name__)

        # a stop asked while the worker is still joining (a cluster electing its leaders can take a while) ends
        # it cleanly too: the handlers come first
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        self.nc = await nats.connect(servers=list(self.cfg.nats.servers), name=f"tops-worker-{self.name}",
                                     max_reconnect_attempts=-1, reconnect_time_wait=0.25, connect_timeout=5,
                                     error_cb=error_cb)
        self.js = self.nc.jetstream(timeout=5.0)
        try:
            joined = await self._join()
        except WorkerError:
            with contextlib.suppress(Exception):
                await self.nc.drain()
            raise
        if joined and self.template.holdout_scope == "fleet":
            joined = await self._fleet_choice()
        if not joined:
            with contextlib.suppress(Exception):
                await self.nc.drain()
            log.info("worker %s stopped before it joined", self.name)
            return 0
        log.info("worker %s: cluster identity %s, %d partitions", self.name, self.identity, self.names.partitions)
        try:
            await self._run()
        finally:
            with contextlib.suppress(Exception):  # the heartbeat expires by itself (a delete marker would count)
                await self.nc.drain()
        log.info("worker %s stopped", self.name)
        return 0

    async def _join(self, timeout: float = 120.0) -> bool:
        """The streams and buckets made or found, then the cluster's identity and parameters checked; retried while
        the cluster elects its leaders (workers starting together race here). False: a stop came first."""
        deadline = time.monotonic() + timeout
        while not self.stopping.is_set():
            try:
                self.kv = await ensure(self.js, self.names)
                await self._identity()
                return True
            except WorkerError:
                raise
            except Exception as exc:
                if time.monotonic() > deadline:
                    msg = f"the NATS cluster's JetStream is not available ({type(exc).__name__})"
                    raise WorkerError(msg) from None
                await asyncio.sleep(0.5)
        return False

    async def _run(self) -> None:
        """The main loop until a stop: rebalance every third of a lease's life, fetch and release, checkpoint; then
        every partition handed back."""
        last_checkpoint = last_balance = 0.0
        while not self.stopping.is_set():
            now = time.monotonic()
            try:
                if now - last_balance >= self.names.lease_ttl / 3:
                    await self._rebalance()
                    last_balance = now
                if not await self._step():
                    await asyncio.sleep(0.02)
                last_checkpoint = await self._maintain(last_checkpoint)
                if self.heap is not None:
                    self.heap.tick()
            except KeyMismatch:  # nothing of that stream processed: nothing written, the leases back, then the end
                await self._abandon()
                raise
            except Exception as exc:  # the cluster is unreachable for a moment: retry, leases decide the rest
                log.debug("cluster step failed", exc_info=True)
                await self._reset(_where(exc))
                await asyncio.sleep(0.5)
        await self._cancel_background()
        for part in list(self.owned.values()):
            await self._drop(part, hand_back=True)

    async def _fleet_choice(self) -> bool:
        """The cluster's fleet holdout (one per template generation, in the meta bucket under the cluster's key check):
        read from there, or made from the input's first readings and created there (compare-and-set: of two workers
        making it together, one creates it and the other reads it; both made the same). The partitions wait for it:
        whether a message is the holdout's depends on it. False: a stop came first."""
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

        from operators.fleet_holdout import FLEET_KEY_NAME

        meta, cfg = self.kv["meta"], self.template
        entry_key = f"fleet.{cfg.fleet_generation}"
        key = derive_stream_key(self.master, FLEET_KEY_NAME, identity=self.identity, generation=cfg.fleet_generation)
        prefix = f"{self.names.input_subject}."
        messages: list[tuple[int, str, bytes]] = []
        next_seq = 1
        while not self.stopping.is_set():
            try:
                entry = await meta.get(entry_key)
            except KeyNotFoundError:
                entry = None
            except Exception as exc:  # no leader for a moment (a node died): ask again, as the join does
                log.debug("fleet holdout: %s", type(exc).__name__)
                await asyncio.sleep(0.5)
                continue
            if entry is not None:
                doc = json.loads(entry.value)
                if not hmac.compare_digest(str(doc.get("key_check")).encode(), self.key_check.encode()):
                    msg = ("the cluster's fleet holdout was made with another master key or cluster identity than "
                           "this worker's; refusing to start")
                    raise WorkerError(msg)
                self.fleet = FleetOutcome.from_doc(doc, cfg, key)
                log.info("worker %s: fleet holdout generation %d, theta %g", self.name, cfg.fleet_generation,
                         cfg.lower + self.fleet.holdout.choice.theta_units * cfg.resolution)
                return True
            try:  # the input's messages from the next one on, in sequence order
                while True:
                    m = await self.js.get_msg(self.names.input_stream, seq=next_seq, subject=f"{prefix}>", next=True)
                    name = m.subject[len(prefix):].partition(".")[2]
                    messages.append((m.seq, name, m.data or b""))
                    next_seq = m.seq + 1
            except NotFoundError:
                pass
            except Exception as exc:  # no leader for a moment: the messages read so far are kept, the rest asked again
                log.debug("fleet holdout: %s", type(exc).__name__)
                await asyncio.sleep(0.5)
                continue
            made = read_fleet_holdout(FleetHoldout(cfg, key), messages, self.cfg.input.max_payload_bytes)
            if made is not None:
                doc = json.dumps(made.to_doc(self.key_check), separators=(",", ":")).encode()
                with contextlib.suppress(KeyWrongLastSequenceError, TimeoutError):  # a timeout: read, then again
                    await meta.create(entry_key, doc)
                continue  # what the meta bucket holds now
            await asyncio.sleep(0.2)
        return False

    async def _identity(self) -> None:
        """The cluster's identity, key check and parameters: each created by the first worker (compare-and-set),
        compared by every other."""
        from nats.js.errors import KeyWrongLastSequenceError

        meta = self.kv["meta"]
        params = json.dumps(stream_params(self.cfg), sort_keys=True).encode()
        with contextlib.suppress(KeyWrongLastSequenceError):
            await meta.create("identity", new_identity().encode())
        self.identity = (await meta.get("identity")).value.decode()
        self.key_check = key_check(self.master, self.identity)
        with contextlib.suppress(KeyWrongLastSequenceError):
            await meta.create("key_check", self.key_check.encode())
        if not hmac.compare_digest((await meta.get("key_check")).value, self.key_check.encode()):
            msg = (f"the cluster's streams were made with another master key than {self.cfg.streams.key_file}; "
                   "refusing to start (run every worker with the key file the cluster was started with)")
            raise WorkerError(msg)
        with contextlib.suppress(KeyWrongLastSequenceError):
            await meta.create("params", params)
        stored = (await meta.get("params")).value
        if json.loads(stored) != json.loads(params):
            msg = ("the cluster's streams were started with other privacy parameters (stream template); refusing "
                   "to start (run every worker with the same [streams.template])")
            raise WorkerError(msg)


@dataclass
class FleetOutcome:
    """What a cluster's fleet holdout decided (:mod:`operators.fleet_holdout`), as every worker reads it from the meta
    bucket: the holdout with its choice; ``until``, the input sequence of the message holding its last reading;
    ``tail``, that message's readings after it (``(stream, values, ts, seqs)``: its stream's first readings to
    release, or None); and for each stream that gave readings, how many (``held``: its ticks before its first
    release) and the last ``seq`` among them."""

    holdout: FleetHoldout
    until: int
    tail: tuple[str, list[float], list[float | None] | None, list[int | None] | None] | None
    held: dict[str, int]
    last_seq: dict[str, int]

    def to_doc(self, key_check: str) -> dict[str, Any]:
        return {"key_check": key_check, "holdout": self.holdout.snapshot(), "until": self.until,
                "tail": None if self.tail is None else list(self.tail), "held": self.held, "last_seq": self.last_seq}

    @classmethod
    def from_doc(cls, doc: dict[str, Any], config: Any, key: bytes) -> FleetOutcome:
        holdout = FleetHoldout.restore(config, key, doc["holdout"])
        if holdout.choice is None:
            msg = "a stored fleet outcome without a choice"
            raise ValueError(msg)
        tail = doc["tail"]
        return cls(holdout, int(doc["until"]), None if tail is None else (str(tail[0]), *tail[1:]),
                   {str(k): int(v) for k, v in doc["held"].items()},
                   {str(k): int(v) for k, v in doc["last_seq"].items()})


def read_fleet_holdout(fleet: FleetHoldout, messages: list[tuple[int, str, bytes]], limit: int) -> FleetOutcome | None:
    """The fleet holdout of a cluster's input: the first ``holdout`` readings of the messages ``(input sequence,
    stream name, payload)`` in sequence order, taken as a worker takes them (a valid stream name, at most ``limit``
    bytes, decoded; a reading whose ``seq`` is not above its stream's last one is a repeat, not taken). Every worker
    reads the same messages the same way under the same key, so each would make the same choice. None while the
    messages hold fewer readings."""
    held: dict[str, int] = {}
    last_seq: dict[str, int] = {}
    for seq, name, data in messages:
        try:
            check_stream_name(name)
            if len(data) > limit:
                continue
            values, ts, seqs, _ = decode_payload_columns(data)
        except PayloadError:
            continue
        for i, v in enumerate(values):
            r = None if seqs is None else seqs[i]
            if r is not None:
                if name in last_seq and r <= last_seq[name]:
                    continue
                last_seq[name] = r
            fleet.take([v])
            held[name] = held.get(name, 0) + 1
            if fleet.choice is not None:
                rest = (name, values[i + 1:], None if ts is None else ts[i + 1:],
                        None if seqs is None else seqs[i + 1:])
                return FleetOutcome(fleet, seq, rest if rest[1] else None, held, last_seq)
    return None


def _where(exc: BaseException) -> str:
    """The exception's type and the worker's step it came from (``TimeoutError in _record``): no message, no value."""
    where = ""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == __file__:
            where = tb.tb_frame.f_code.co_name
        tb = tb.tb_next
    return f"{type(exc).__name__} in {where}" if where else type(exc).__name__


def run_worker(cfg: DaemonConfig, *, heap: Any = None) -> int:
    """``tops run`` with ``[input] source = "nats"`` (``heap``: what keeps the collector's passes short)."""
    master = load_master_key(cfg.streams.key_file, create=False)  # every worker: the same key file
    worker = ClusterWorker(cfg, master, heap=heap)
    if cfg.metrics.port:
        start_http_server(int(cfg.metrics.port), addr=cfg.metrics.host, registry=worker.registry)
    return asyncio.run(worker.serve())

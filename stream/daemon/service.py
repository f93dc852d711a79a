"""``tops run``: the streaming daemon, readings in (MQTT or stdin), one private release per tick out.

The lifecycle reads top to bottom in :meth:`Daemon.serve`: startup (key, metrics, streams), the loops under one
TaskGroup (MQTT link, the engine loop over the input source, period clock, status, accounting), drain on
SIGTERM/SIGINT or end of input (stop intake, process what was accepted, close open periods, publish), shutdown. A
second signal exits at once. The engine loop (:meth:`Daemon.intake_loop`) knows its input only as a
:class:`~stream.daemon.source.Source` (stdin: stream/daemon/stdin.py; MQTT: stream/daemon/mqtt_source.py, whose
connection, the link, also publishes the releases).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from itertools import compress
from pathlib import Path
from typing import IO, Any

import numpy as np

from operators import ToPLConfig
from operators.categorical.release import CategoricalRelease
from operators.columnar import born_releasing
from operators.columnar_holdout import born_in_rows
from operators.fleet_holdout import FLEET_KEY_NAME, FleetHoldout, FleetMember
from operators.ranges.release import RangeRelease
from operators.selection import prepare as prepare_selection
from operators.topl_server import LocalServer
from stream.core._line_scan import PLAIN_KNOWN, PLAIN_NEW, NameTable, ScannedLines
from stream.core.config import (
    STDIN_TEMPLATE,
    DaemonConfig,
    build_config,
    build_operator,
    histogram_operator,
    load_config,
)
from stream.core.control import categorical_control, range_control, stream_control, threshold_control
from stream.core.errors import ConfigFileError, PayloadError, StartupError, StreamCapError
from stream.core.keys import KeyFileError, derive_stream_key, load_master_key, new_identity
from stream.core.metrics import MESSAGE_RESULTS, Metrics
from stream.core.payload import check_stream_name, decode_line, decode_payload_columns, decode_reports
from stream.core.router import ReleaseBatch, Releases, Router, StreamRecord
from stream.core.row_leases import SlotRows
from stream.core.sinks import (
    PublishQueue,
    StdoutSink,
    encode_releases,
    encode_status,
    encode_step,
    releases_in,
    status_lines,
)
from stream.core.ticking import PeriodClock
from stream.daemon.durability import Durability
from stream.daemon.heap import Heap
from stream.daemon.mqtt_source import MqttSource
from stream.daemon.phaselog import PhaseLog
from stream.daemon.preflight import DataDirLocked, lock_data_dir, preflight
from stream.daemon.source import Chunk, ChunkKind, Source
from stream.daemon.sources import MqttLink, TopicRouter
from stream.daemon.stdin import StdinSource
from stream.state.journaled import JournaledIntake
from stream.state.store import StoreError

__all__ = ["Daemon", "add_arguments", "main"]

log = logging.getLogger("tops")

HANDLED_SIGNALS = (
    signal.SIGINT,  # Unix signal 2. Sent by Ctrl+C.
    signal.SIGTERM,  # Unix signal 15. Sent by `kill <pid>` and systemd.
)

ACCOUNT_INTERVAL = 0.25  # seconds between pushes of local counters into the metrics
STATUS_LINES_A_WRITE = 4096  # status lines encoded together before stdout takes them (bounds their text in memory)


class RateLimitedLog:
    """Logs a rejection reason at most once per ``interval`` seconds, with the number suppressed meanwhile."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self.last: dict[str, float] = {}
        self.suppressed: dict[str, int] = {}

    def __call__(self, result: str, reason: str, where: str = "") -> None:
        key = f"{result}:{reason}"
        now = time.monotonic()
        if now - self.last.get(key, -1e9) >= self.interval:
            n = self.suppressed.pop(key, 0)
            more = f" ({n} more like it since the last report)" if n else ""
            log.warning("rejected %s (%s): %s%s", where or "input", result, reason, more)
            self.last[key] = now
        else:
            self.suppressed[key] = self.suppressed.get(key, 0) + 1


class Daemon:
    """One running daemon. ``stdin``/``stdout``/``operator_factory`` can be replaced (tests), and so can the
    input ``source`` of a daemon that reads stdin: any :class:`~stream.daemon.source.Source` (of LINES or ADDRESSED
    chunks)."""

    def __init__(self, cfg: DaemonConfig, *, stdin: IO[bytes] | None = None, stdout: IO[str] | None = None,
                 operator_factory: Callable[[str], Any] | None = None, install_signals: bool = True,
                 heap: Heap | None = None, source: Source | None = None) -> None:
        self.cfg = cfg
        self.heap = heap  # `tops run` keeps the collector's full passes short (stream/daemon/heap.py); tests do not
        self.stdin_stream = stdin if stdin is not None else sys.stdin.buffer
        self.stdout = StdoutSink(stdout) if "stdout" in cfg.output.sinks else None
        self.stdout_left = False  # its reader went away (noted once: the run stops, or goes on to the broker)
        self.operator_factory = operator_factory
        self.install_signals = install_signals
        # period counts: the number of events is the protected value, so no metric may count them
        # with period counts, or the histograms of central categorical streams, the number of readings is the
        # protected value (local categorical: every report reaches the server anyway)
        self.metrics = Metrics(counts_protected=cfg.ticks.mode == "period" and (
            cfg.ticks.aggregate == "count" or (cfg.category is not None and not cfg.category.local)))
        self.stopping = asyncio.Event()
        self.rejected = RateLimitedLog()
        self.msg_counts = dict.fromkeys(MESSAGE_RESULTS, 0)
        self._keyed: Callable[[bytes], Any] | None = None  # keyed_operator's maker, its settings read once
        self._master: bytes | None = None  # the master key, where new streams are keyed operators (a secret)
        self.fleet: FleetHoldout | None = None  # the template's fleet holdout (holdout_scope = "fleet")
        self.fleet_key = b""  # its key (a secret), derived from the master key and the identity
        # the rows of many new streams' keys made at once, where keyed_operator makes plain rows (_keyed_maker;
        # new_streams_in_bulk); None: new streams are made one at a time
        self._rows_of_new_keys: Callable[[list[bytes]], list[Any]] | None = None
        # stdin: the bytes of plain ``stream,value`` lines' names -> slots standing for the names (take_lines)
        self._names = NameTable()
        self._slot_rows = SlotRows()  # the release row and lease of each slot's stream (take_lines)
        self._new_names: dict[bytes, str] = {}  # names' bytes met, to enter the table once their streams exist
        self._csv_names_max = max(1 << 16, 2 * cfg.streams.max_streams)
        self.cap_readings = 0
        self.phase_log = PhaseLog()
        self.stdout_written = 0
        self.epsilon = cfg.release_epsilon
        self.pubq: PublishQueue | None = None
        self.link: MqttLink | None = None
        self.source = source  # the input the engine loop takes chunks from, made at startup if not given
        self.source_done = asyncio.Event()  # the engine loop has taken its source's last chunk
        self._signals = 0
        self.durable: Durability | None = None  # durable state ([state] data_dir), see stream/daemon/durability.py
        # stream keys derive from this run's random identity, or from the state store's (stream/core/keys.py)
        self.identity = new_identity()
        self.identity_durable = False
        self._lock: IO[bytes] | None = None  # the data directory's lock (stream/daemon/preflight.py)

    def set_identity(self, identity: str, *, durable: bool) -> None:
        """Use the state store's identity instead of the run's (called before any stream exists; durable state calls
        it before the router is built)."""
        router = getattr(self, "router", None)
        assert router is None or not router.streams, "the identity must be fixed before the first stream"
        self.identity, self.identity_durable = identity, durable

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def serve(self) -> int:
        """Run until a signal or the end of stdin; returns the exit code."""
        self.startup()
        try:
            async with asyncio.TaskGroup() as tg:
                background = self.start_loops(tg)
                await self.stopping.wait()
                log.info("stopping: intake closed, finishing what was accepted")
                await self.drain()
                for task in background:
                    task.cancel()
        finally:
            self.shutdown()
        return 0

    def startup(self) -> None:
        cfg = self.cfg
        self.local = cfg.streams.mode == "local"
        category = cfg.category
        if self.operator_factory is None and category is not None and category.local:
            self.operator_factory = lambda name: histogram_operator(category, None)
        elif self.operator_factory is None and self.local:
            t = cfg.template
            topl = ToPLConfig(epsilon=t.epsilon, bound=t.bound, threshold_epsilon=t.threshold_epsilon,
                              holdout=t.holdout, query_range=t.query_range, resolution=t.resolution, theta=t.theta,
                              refine=cfg.local.refine)
            self.operator_factory = lambda name: LocalServer(topl)
        elif self.operator_factory is None:
            try:
                master = load_master_key(cfg.streams.key_file, create=True)
            except OSError as exc:
                msg = f"[streams] key_file {cfg.streams.key_file} cannot be created ({exc.strerror})"
                raise StartupError(msg) from None
            template = cfg.template
            method = cfg.streams.method
            if category is None and method == "tops" and template.selection == "calibrated" \
                    and template.theta is None:
                prepare_selection(template.fanout, template.query_range)  # a constant per hierarchy, now
            if getattr(category, "counter", None) is not None:
                prepare_selection(category.counter.fanout, category.counter.query_range)
            self.operator_factory = lambda name: self.keyed_operator(
                derive_stream_key(master, name, identity=self.identity))
            self._master = master
        if cfg.state.data_dir:  # one daemon per data directory; its layers are composed into what is built next
            with contextlib.suppress(OSError):  # if it cannot be made, Durability.open says why
                Path(cfg.state.data_dir).expanduser().mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                self._lock = lock_data_dir(cfg.state.data_dir)
            except DataDirLocked as exc:
                raise StartupError(str(exc)) from None
            except OSError:
                self._lock = None  # Durability.open says what is wrong with the directory
            self.durable = Durability.open(self)
        durable = self.durable
        if self._master is not None and category is None and cfg.streams.method == "tops" \
                and cfg.template.holdout_scope == "fleet":  # keyed by the identity (the store's, with durable state)
            self.fleet_key = derive_stream_key(self._master, FLEET_KEY_NAME, identity=self.identity,
                                               generation=cfg.template.fleet_generation)
            self.fleet = FleetHoldout(cfg.template, self.fleet_key)
        clock = None
        if cfg.ticks.mode == "period":
            clock = PeriodClock(cfg.ticks.period, cfg.ticks.lateness if cfg.ticks.clock == "event" else 0.0)
        # with durable state new streams are admitted by the ledger and restored when stored
        maker = durable.admitting(self.operator_factory, self.keyed_operator,
                                  self.stored_fleet_member if self.fleet is not None else None) \
            if durable is not None else self.operator_factory
        self.router = Router(maker, cfg.streams.max_streams, clock=clock, aggregate=cfg.ticks.aggregate,
                             event_time=cfg.ticks.clock == "event",
                             close_in_period_order=self.fleet_takes_readings if self.fleet is not None else None)
        if category is None and not self.local and cfg.streams.method == "tops":
            self.router.use_columns()  # releasing streams as rows of one columnar store (operators/columnar.py)
        self.intake = self.intake_of(self.router)
        m = self.metrics
        m.watch(m.streams_active, lambda: len(self.router.streams))
        m.watch(m.streams_holdout, lambda: self.router.in_holdout)
        m.watch(m.streams_failed, lambda: self.router.failed)
        if cfg.uses_mqtt:
            self.pubq = PublishQueue(cfg.output.publish_queue)
            mqtt_out = "mqtt" in cfg.output.sinks
            # with durable state QoS 1 readings are acknowledged once journaled, and the broker's repeats dropped
            repeats = durable.repeats if durable is not None else None
            self.link = MqttLink(
                cfg.mqtt, topics=cfg.input.topics if cfg.input.source == "mqtt" else [], in_qos=cfg.input.qos,
                out_qos=cfg.output.qos, pubq=self.pubq, metrics=m, max_batch=cfg.input.max_batch,
                inflight=cfg.output.inflight, max_queue=cfg.input.max_queue, ack_timeout=cfg.mqtt.timeout,
                repeats=repeats)
            if cfg.input.source == "mqtt" and self.source is None:
                self.source = MqttSource(self.link, TopicRouter(cfg.input.topics), repeats=repeats)
                m.watch(m.incoming_queue, self.link.queue_depth)
            pubq = self.pubq
            m.watch(m.publish_queue, lambda: len(pubq))
            self.mqtt_out = mqtt_out
            if mqtt_out and cfg.output.status_topic:  # the status loop runs: the router keeps who is due
                self.router.status_pending = set()
        else:
            self.mqtt_out = False
        if cfg.input.source == "stdin" and self.source is None:
            stdin = StdinSource(self.stdin_stream, max_line=cfg.input.max_payload_bytes)
            m.watch(m.incoming_queue, stdin.queued)
            self.source = stdin
        if durable is not None:  # restore, re-process the journal, checkpoint
            durable.restore()
        self.announce_identity()
        try:
            m.serve(cfg.metrics.host, cfg.metrics.port)
        except OSError as exc:
            msg = f"[metrics] port {cfg.metrics.port} on {cfg.metrics.host} cannot be opened ({exc.strerror or exc})"
            raise StartupError(msg) from None
        if self.install_signals:
            loop = asyncio.get_running_loop()
            for sig in HANDLED_SIGNALS:
                loop.add_signal_handler(sig, self.on_signal, sig)
        if self.local:  # devices wait for their control message: the streams exist from the start
            for name in cfg.local.streams:
                self.stream_record(name)
            self.emit([])
        log.info("started: input %s, sinks %s, ticks %s, metrics %s", cfg.input.source,
                 ",".join(cfg.output.sinks), cfg.ticks.mode,
                 f"{cfg.metrics.host}:{cfg.metrics.port}" if cfg.metrics.port else "off")

    def intake_of(self, router: Router) -> Router | JournaledIntake:
        """The intake the daemon calls: the router's own, or with durable state the journaled one over it."""
        return self.durable.journaled(router) if self.durable is not None else router

    def keyed_operator(self, key: bytes) -> Any:
        """The operator of a central stream with its key: the categorical release, ToPS or a baseline."""
        make = self._keyed
        if make is None:
            make = self._keyed_maker()
        return make(key)

    def _keyed_maker(self) -> Callable[[bytes], Any]:
        """What :meth:`keyed_operator` makes of a key, decided once (not looked up in the configuration per
        key); ``_rows_of_new_keys`` makes the rows of many new streams' keys at once when each is a plain row, in its
        holdout or releasing (:meth:`new_streams_in_bulk`)."""
        category, template, method = self.cfg.category, self.cfg.template, self.cfg.streams.method
        self._rows_of_new_keys = None
        if category is not None:
            make = self._keyed = lambda key: histogram_operator(category, key)
        elif self.fleet is not None:
            make = self._keyed = self.fleet_operator
        elif method == "tops" and self.router.holdouts is not None and born_in_rows(template):
            # a new stream is the holdout row its ToPS would become, made without that ToPS (whose cost is mostly the
            # collector's share of the objects made and dropped)
            make = self._keyed = partial(self.router.holdout_row, template)
            self._rows_of_new_keys = partial(self.router.holdout_rows, template)
        elif method == "tops" and self.router.pool is not None and born_releasing(template):
            # a public theta: a new stream is the release row its ToPS would become, made without that ToPS
            make = self._keyed = partial(self.router.release_row, template)
            self._rows_of_new_keys = partial(self.router.release_rows_new, template)
        else:
            make = self._keyed = lambda key: build_operator(template, method, key)
        return make

    def fleet_operator(self, key: bytes, held: int = 0) -> Any:
        """The operator of a stream of a fleet-holdout template (``held``: its readings the holdout took): a member
        feeding the fleet holdout until its choice, or, once it is made, a ToPS releasing with it from the stream's
        next reading."""
        fleet = self.fleet
        assert fleet is not None
        return FleetMember(fleet, key, held, at_intake=self.router.clock is None) if fleet.choice is None \
            else fleet.member(key, held)

    def fleet_takes_readings(self) -> bool:
        """Whether the template's fleet holdout still takes readings (it has not chosen)."""
        return self.fleet is not None and self.fleet.choice is None

    def stored_fleet_member(self, key: bytes, snapshot: dict[str, Any]) -> Any:
        """The operator of a stored stream that was in the fleet holdout (its snapshot says how many of its readings
        the holdout took), or None for any other stored stream (restored as its snapshot says)."""
        held = FleetMember.held_in(snapshot)
        return None if held is None else self.fleet_operator(key, held)

    def announce_identity(self) -> None:
        """One line on stderr with the identity the stream keys derive from (also in every status message)."""
        what = "state store identity" if self.identity_durable else "run identity (no durable state: new every run)"
        print(f"tops: {what} {self.identity}; tops replay --key-file KEY --identity {self.identity} --stream NAME "
              f"reproduces a stream's releases", file=sys.stderr, flush=True)

    def start_loops(self, tg: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        """Start the long-lived tasks; returns the ones to cancel after the drain."""
        background = [tg.create_task(self.account_loop(), name="tops.account")]
        if self.link is not None:
            self.link_task = tg.create_task(self.link.run(), name="tops.mqtt")
        if self.source is not None:
            tg.create_task(self.intake_loop(self.source), name="tops.intake")
        else:
            self.source_done.set()
        if self.router.clock is not None:
            background.append(tg.create_task(self.period_loop(), name="tops.periods"))
        if self.mqtt_out and self.cfg.output.status_topic:
            background.append(tg.create_task(self.status_loop(), name="tops.status"))
        if self.durable is not None:
            background += self.durable.start(tg)
            if self.cfg.streams.idle_timeout > 0:
                background.append(tg.create_task(self.evict_loop(), name="tops.evict"))
        return background

    async def drain(self) -> None:
        """Stop intake, process everything accepted, close open periods, publish, within ``drain_timeout``."""
        if self.source is not None:
            self.source.stop_intake()  # the engine loop takes what was read, then ends
        if self.link is not None:
            self.link.stop_intake()
            await self.link.intake_done.wait()
        await self.source_done.wait()
        self.emit(self.router.flush())
        # With durable state the open periods are checkpointed and close after the restart (never twice).
        self.emit(self.router.close_periods(time.time(), final=self.durable is None))
        self.publish_statuses()
        if self.durable is not None:
            await self.durable.checkpoint_now()  # unpublished messages go into the outbox
        if self.link is not None:
            self.link.close()
            try:
                await asyncio.wait_for(asyncio.shield(self.link_task), self.cfg.output.drain_timeout)
            except TimeoutError:
                assert self.pubq is not None
                log.error("shutdown: %d messages could not be published within drain_timeout",
                          len(self.pubq) + len(self.link.inflight))
                self.link_task.cancel()
        if self.durable is not None:
            await self.durable.checkpoint_now()  # what was published leaves the outbox
        self.account()

    def shutdown(self) -> None:
        if self.stdout is not None:
            self.stdout.flush()
        if self.durable is not None:
            self.durable.close()
        self.metrics.close()
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.close()
        if hasattr(self, "phase_log"):
            self.phase_log.roll(final=True)
        log.info("stopped: %d streams", len(self.router.streams) if hasattr(self, "router") else 0)

    def on_signal(self, sig: int) -> None:
        """First signal: drain and exit 0. Second: exit now."""
        self._signals += 1
        if self._signals > 1:
            log.error("second %s: exiting without draining", signal.Signals(sig).name)
            os._exit(1)
        log.info("%s received", signal.Signals(sig).name)
        self.stopping.set()
        if self.durable is not None:
            self.durable.disk.interrupt()  # writes waiting for a full disk give up: the drain ends

    def output_topic(self, name: str) -> str:
        """The topic of a stream's releases (made when needed: a record keeps no topic strings)."""
        return self.cfg.output.topic.replace("{stream}", name)

    # -- intake ----------------------------------------------------------------------------------------------
    def stream_record(self, name: str, now: float | None = None) -> StreamRecord | None:
        """The record of ``name`` (created on first sight, by a reading that arrived at ``now``), or None past the
        stream cap."""
        rec = self.router.streams.get(name)
        if rec is not None:
            return rec
        try:
            rec = self.router.record(name, now)
        except StreamCapError:
            self.rejected("stream_cap", f"max_streams = {self.cfg.streams.max_streams} reached")
            return None
        rec.identity = self.identity
        return rec

    def take_messages(self, names: Sequence[str | None], payloads: Sequence[bytes]) -> None:
        """Decode, validate and route an ADDRESSED chunk's messages (``names[i]``: the stream ``payloads[i]`` was
        addressed to, None if its topic names none), then process and emit.

        Nothing a message holds stops the daemon: a message whose handling raises is counted ``failed`` (and
        acknowledged with the others), the stream it touched is marked failed, the other streams go on."""
        now = time.time()
        one = self.take_message
        limit = self.cfg.input.max_payload_bytes  # once a batch, not once a reading
        for name, payload in zip(names, payloads, strict=True):
            try:
                one(name, payload, now, limit)
            except OSError:  # the journal's disk: what a full disk does is decided there
                raise
            except Exception as exc:
                self.message_failed(exc, "message")
        self.safe_step()

    def message_failed(self, exc: Exception, where: str, rec: StreamRecord | None = None) -> None:
        """A message whose handling raised: counted ``failed``; logged with the exception's type only (a stored
        stream whose state cannot be restored: the store's own message, which names the stream and no value)."""
        self.msg_counts["failed"] += 1
        self.rejected("failed", str(exc) if isinstance(exc, StoreError) else f"handling raised {type(exc).__name__}",
                      where)
        if rec is not None:
            self.router.fail(rec, f"a message raised {type(exc).__name__}")

    def safe_step(self) -> None:
        """:meth:`step`; an exception outside the operators (which fail their stream only) is logged, not fatal."""
        try:
            self.step()
        except OSError:
            raise
        except Exception as exc:
            log.error("processing step failed (%s); the daemon goes on", type(exc).__name__)
        if self.heap is not None:  # after each batch too: the accounting loop waits while a long batch runs
            self.heap.tick()

    def take_message(self, name: str | None, payload: bytes, now: float, limit: int) -> None:
        """One addressed message: size (``limit``: ``[input] max_payload_bytes``), topic, decoding, stream, then
        its readings into the router."""
        counts, router = self.msg_counts, self.router
        if len(payload) > limit:
            counts["too_large"] += 1
            self.rejected("too_large", f"payload larger than max_payload_bytes = {limit}")
            return
        if name is None:
            counts["invalid_topic"] += 1
            self.rejected("invalid_topic", "topic matches no input pattern or names no valid stream")
            return
        if self.local:
            self.on_reports(name, payload, now)
            return
        try:
            values, ts, seqs, bad = decode_payload_columns(payload)
        except PayloadError as exc:
            counts["invalid"] += 1
            self.rejected("invalid", exc.reason, f"message for stream {name!r}")
            return
        if not values:  # a batch without one valid element
            counts["invalid"] += 1
            self.rejected("invalid", "batch elements that are not finite numbers", f"message for {name!r}")
            return
        rec = router.streams.get(name) or self.stream_record(name, now)
        if rec is None:
            counts["stream_cap"] += 1
            self.cap_readings += len(values)
            return
        if rec.failed:
            counts["failed"] += 1
            router.counts["failed"] += len(values)
            self.rejected("failed", "the stream is marked failed", f"message for stream {name!r}")
            return
        if bad:
            router.counts["invalid"] += bad
            self.rejected("invalid", "batch elements that are not finite numbers",
                          f"readings for stream {name!r}")
        intake = self.intake
        self.into_stream(rec, lambda: intake.add_many(rec, values, ts, seqs, now))

    def into_stream(self, rec: StreamRecord, work: Callable[[], object]) -> None:
        """Run one message's ``work`` on its stream: counted ``ok``, or, if it raises, ``failed`` with the stream
        marked failed (the disk's ``OSError`` goes up: what a full disk does is decided in the state layer)."""
        try:
            work()
        except OSError:
            raise
        except Exception as exc:
            self.message_failed(exc, f"message for stream {rec.name!r}", rec)
            return
        self.msg_counts["ok"] += 1

    def on_reports(self, name: str, payload: bytes, now: float) -> None:
        """Local mode: decode device reports, keep those made for the stream's current phase and theta."""
        counts, router, intake = self.msg_counts, self.router, self.intake
        try:
            reports, bad = decode_reports(payload)
        except PayloadError as exc:
            counts["invalid"] += 1
            self.rejected("invalid", exc.reason, f"message for stream {name!r}")
            return
        rec = router.streams.get(name)
        if rec is None:
            counts["invalid_topic"] += 1
            self.rejected("invalid_topic", "reports for a stream not in [local] streams")
            return
        if not reports:
            counts["invalid"] += 1
            return
        if rec.failed:
            counts["failed"] += 1
            router.counts["failed"] += len(reports)
            return
        router.counts["invalid"] += bad
        op = rec.operator

        def add_reports() -> None:
            for y, ts, seq, phase, theta in reports:
                verdict = op.accepts(phase, theta, y)
                if verdict != "ok":  # checked one by one: a batch may cross the switch of phase
                    router.counts["invalid"] += 1
                    self.rejected("invalid", f"{verdict} report (another phase or theta, or out of range)",
                                  f"stream {name!r}")
                    continue
                intake.add(rec, y, ts, seq, now)

        self.into_stream(rec, add_reports)

    def on_lines(self, lines: list[bytes]) -> None:
        """:meth:`take_lines` of lines given one by one (without their newlines)."""
        self.take_lines(b"".join(line + b"\n" for line in lines))

    def take_lines(self, data: bytes) -> None:
        """Decode, validate and route stdin lines (``data``: whole lines, each ending in a newline; a line is one
        message), then process and emit. As with MQTT, a line whose handling raises is counted ``failed`` and the
        stream it touched is marked failed.

        One compiled pass (stream/core/_line_scan.py) splits the lines, finds the name of each plain
        ``stream,value`` line in the table of names already taken and parses its value (the double ``float()``
        gives); every other line goes to :meth:`take_line`, the full decoder. The lines of streams whose release rows
        hold a lease (:meth:`renew_leases`) are taken by row, in one pass (:meth:`release_rows`); the others through
        their records (:meth:`take_by_record`)."""
        now = time.time()
        limit, default = self.cfg.input.max_payload_bytes, self.cfg.input.default_stream
        if data and not data.endswith(b"\n"):
            data += b"\n"
        scan = ScannedLines(data, limit, self._names)
        n = scan.count
        kinds, values, slots = scan.kinds[:n], scan.values[:n], scan.slots[:n]
        known = kinds == PLAIN_KNOWN
        rows = self._slot_rows.of(np.where(known, slots, -1), self.router.leases)
        if known.all():
            leased = rows >= 0
            if leased.all():  # the common chunk: every line a reading of a release row that holds its lease
                self.release_rows(rows, values, now)
                self.safe_step()
                return
            if leased.any():  # their streams have no other line in the chunk: taken first
                self.release_rows(rows[leased], values[leased], now)
            rest = np.flatnonzero(~leased)
        else:
            rest = np.arange(n)
        self.take_by_record(scan, rest, now, limit, default)
        self.renew_leases(np.unique(slots[rest[known[rest]]]))
        self.learn_names()
        self.safe_step()

    def take_by_record(self, scan: ScannedLines, lines: np.ndarray, now: float, limit: int,
                       default: str | None) -> None:
        """Lines ``lines`` of a scanned chunk (in order) through their streams' records: the plain lines of known
        streams, and the first lines of new streams (:meth:`first_line_of_new_stream`), together
        (:meth:`add_values`), those before any other line first, so that every stream keeps its order; every other
        line through :meth:`take_line`."""
        kinds = scan.kinds[lines]
        known = kinds == PLAIN_KNOWN
        # the record of each known name's stream (None: it left memory since, and is met anew)
        found = list(map(self.router.streams.get, self._names.values[np.where(known, scan.slots[lines], 0)]))
        if None in found:
            gone = known & np.array([rec is None for rec in found])
            kinds[gone] = PLAIN_NEW
            known &= ~gone
        special = np.flatnonzero(~known).tolist()
        value_list = scan.values[lines].tolist()
        if not special:
            self.add_values(found, value_list, now)
            return
        line_of = lines.tolist()
        # a new stream's record is made at the chunk's next call of add_values, with the other new streams met since:
        # ``born`` gives its index, which stands for its record in ``recs`` until then (new_streams_in_bulk)
        recs: list[StreamRecord | int] = []
        taken: list[float] = []
        born: dict[str, int] = {}
        at = 0  # the first line not yet taken
        for i in special:
            recs += found[at:i]
            taken += value_list[at:i]
            at = i + 1
            if kinds[i] == PLAIN_NEW and (got := self.first_line_of_new_stream(scan.name(line_of[i]), value_list[i],
                                                                               now, born)) is not None:
                recs.append(got)
                taken.append(value_list[i])
                continue
            if recs:
                self.add_values(recs, taken, now, born)
                recs, taken, born = [], [], {}
            try:
                self.take_line(scan.line(line_of[i]), now, limit, default)
            except OSError:
                raise
            except Exception as exc:
                self.message_failed(exc, "stdin line")
        recs += found[at:]
        taken += value_list[at:]
        if recs:
            self.add_values(recs, taken, now, born)

    def renew_leases(self, slots: np.ndarray) -> None:
        """The streams of name-table slots ``slots`` (distinct) that are release rows able to take readings at once
        get a lease on their rows (stream/core/row_leases.py): their next lines are taken by row."""
        if slots.size:
            recs = map(self.router.streams.get, self._names.values[slots])
            self._slot_rows.learn(slots, *self.router.leases.grant(recs))

    def release_rows(self, rows: np.ndarray, values: np.ndarray, now: float) -> None:
        """Plain lines (one reading each, a line one message) of streams whose release rows hold a lease: taken
        together by row (``Router.release_rows``)."""
        try:
            self.intake.release_rows(rows, values, now)
        except OSError:  # the journal's disk: what a full disk does is decided there
            raise
        except Exception as exc:  # a bug: the streams of these lines fail (as one line's would), no other
            streams = [rec for rec in self.router.leases.records[np.unique(rows)].tolist() if rec is not None]
            for rec in streams:
                self.message_failed(exc, f"stdin line for stream {rec.name!r}", rec)
            self.msg_counts["failed"] += rows.size - len(streams)
            return
        self.msg_counts["ok"] += rows.size

    def first_line_of_new_stream(self, raw: bytes, value: float, now: float,
                                 born: dict[str, int]) -> StreamRecord | int | None:
        """The plain line ``raw,value`` of a stream whose name is not in the table yet: its record, made as
        :meth:`take_line` makes it (or, where new streams are born together, its index in ``born``, the chunk's new
        streams so far: made by :meth:`add_values`), to be taken with the chunk's other plain lines; None for
        anything else (an invalid name, the stream cap): :meth:`take_line` then decides, and counts, as for any
        line. The name's bytes enter the table once its record exists (:meth:`learn_names`)."""
        try:
            name = check_stream_name(raw.decode("utf-8"))
        except (ValueError, PayloadError):  # (UnicodeDecodeError is a ValueError)
            return None
        router = self.router
        rec: StreamRecord | int | None = router.streams.get(name)
        if rec is None and (rec := born.get(name)) is None:
            if len(router.streams) + len(born) >= router.max_streams:
                return None
            if self.new_streams_in_bulk():
                rec = born[name] = len(born)
            else:
                try:
                    rec = self.stream_record(name, now)
                except OSError:  # the journal's disk: decided there
                    raise
                except Exception:  # a stored stream that cannot be restored: take_line counts the line failed
                    return None
                if rec is None:
                    return None
        self._new_names[raw] = name
        return rec

    def learn_names(self) -> None:
        """The names met since the last call whose streams now exist enter the name table (bounded: a flood of new
        names starts a new table)."""
        met, self._new_names = self._new_names, {}
        streams = self.router.streams
        made = [(raw, name) for raw, name in met.items() if name in streams]
        if not made:
            return
        learnt = list(compress(made, (self._names.slots([raw for raw, _ in made]) < 0).tolist()))
        if len(self._names) + len(learnt) > self._csv_names_max:
            self._names, self._slot_rows = NameTable(), SlotRows()
        self._names.add([raw for raw, _ in learnt], [name for _, name in learnt])

    def new_streams_in_bulk(self) -> bool:
        """Whether new streams are the plain rows (in their holdout, or releasing with a public theta) that
        :meth:`keyed_operator` makes (its own decision, with the daemon's keyed factory as the router's: no durable
        state, no factory given; and no periods): then a stdin chunk's new streams are made together
        (:meth:`make_new_streams`: their keys, rows and records), as one at a time they would be."""
        if self._master is None or self.durable is not None or self.router.clock is not None:
            return False
        if self._keyed is None:
            self._keyed_maker()
        return self._rows_of_new_keys is not None

    def make_new_streams(self, names: list[str]) -> list[StreamRecord]:
        """The records of new streams ``names`` (distinct, unknown, within the cap), made together: what
        :meth:`stream_record` makes of each (``new_streams_in_bulk``)."""
        master, identity, router = self._master, self.identity, self.router
        assert master is not None
        assert self._rows_of_new_keys is not None
        keys = [derive_stream_key(master, name, identity=identity) for name in names]
        return router.records_new(names, self._rows_of_new_keys(keys), identity)

    def add_values(self, recs: list[StreamRecord | int], values: list[float], now: float,
                   born: dict[str, int] | None = None) -> None:
        """The ``stream,value`` lines of known streams (one reading each), routed together; a line is one message.
        An int in ``recs``: the index of a new stream in ``born`` (:meth:`first_line_of_new_stream`), whose records
        are made first."""
        intake, counts = self.intake, self.msg_counts
        if born:
            try:
                made = self.make_new_streams(list(born))
            except OSError:
                raise
            except Exception as exc:  # a bug: the lines of these new streams fail (as each would alone), no other
                keep = [type(r) is not int for r in recs]
                for _ in range(len(recs) - sum(keep)):
                    self.message_failed(exc, "stdin line of a new stream")
                recs, values = list(compress(recs, keep)), list(compress(values, keep))
            else:
                recs = [made[r] if type(r) is int else r for r in recs]  # type: ignore[index]
        try:
            left = intake.add_values(recs, values, now)
        except OSError:  # the journal's disk: what a full disk does is decided there
            raise
        except Exception as exc:  # a bug: the streams of these lines fail (as one line's would), no other
            streams = dict.fromkeys(recs)
            for rec in streams:
                self.message_failed(exc, f"stdin line for stream {rec.name!r}", rec)
            counts["failed"] += len(recs) - len(streams)
            return
        counts["ok"] += len(recs) - len(left)
        for i in left:  # a failed stream, periods, a local holdout's reports: one at a time
            rec = recs[i]
            try:
                counts["failed" if intake.add(rec, values[i], None, None, now) == "failed" else "ok"] += 1
            except OSError:
                raise
            except Exception as exc:
                self.message_failed(exc, f"stdin line for stream {rec.name!r}", rec)

    def take_line(self, line: bytes, now: float, limit: int, default: str | None) -> None:
        """One stdin line (``limit``: ``[input] max_payload_bytes``; ``default``: ``[input] default_stream``)."""
        counts, router, intake = self.msg_counts, self.router, self.intake
        if len(line) > limit:
            self.line_too_large(limit)
            return
        try:
            readings, bad = decode_line(line)
        except PayloadError as exc:
            counts["invalid"] += 1
            self.rejected("invalid", exc.reason, "stdin line")
            return
        if not readings:
            if bad:
                counts["invalid"] += 1
            return
        if bad:
            router.counts["invalid"] += bad
        first = line[:1]
        if len(readings) == 1 and readings[0][2] is None and line.count(b",") == 1 and first \
                and not first.isspace() and first not in (b"{", b"["):
            # a ``stream,value`` line: its name's bytes enter the name table (learn_names)
            self._new_names[line.split(b",")[0]] = readings[0][0]
        failed = 0
        for name, value, ts, seq in readings:
            rec = self.stream_record(name or default, now)
            if rec is None:
                self.cap_readings += 1
                continue
            try:
                if intake.add(rec, value, ts, seq, now) == "failed":
                    failed += 1
            except OSError:
                raise
            except Exception as exc:
                self.message_failed(exc, f"stdin line for stream {rec.name!r}", rec)
                return
        counts["failed" if failed == len(readings) else "ok"] += 1

    def line_too_large(self, limit: int, n: int = 1) -> None:
        """Count ``n`` lines longer than ``limit`` (``[input] max_payload_bytes``), whether decoded or not."""
        self.msg_counts["too_large"] += n
        for _ in range(n):
            self.rejected("too_large", f"line longer than max_payload_bytes = {limit}", "stdin line")

    async def intake_loop(self, source: Source) -> None:
        """The engine: every chunk the source yields goes to the intake, in order, each once there is room for it
        (:meth:`room_for_intake`). It ends when the source does: at the end of input (which stops the daemon), or
        after the drain stopped the source's intake and the chunks it had already read were taken."""
        try:
            async with source:
                await self.room_for_intake(source)
                async for chunk in source.chunks():
                    self.take_chunk(chunk, source)
                    await self.room_for_intake(source)
        finally:
            self.source_done.set()
        if not self.stopping.is_set():
            log.info("end of input")
            self.stopping.set()

    async def room_for_intake(self, source: Source) -> None:
        """Backpressure, one point for the source: wait while the journal cannot be written (a full disk) and while
        releases wait for the broker (intake waits, never drops). Stopping ends the wait and the source's intake:
        what it had already read is then taken at once."""
        if self.durable is not None and not self.durable.writable.is_set():
            await self.until_stopping(self.durable.writable.wait())
        if self.pubq is not None and not self.pubq.has_room():
            await self.until_stopping(self.pubq.wait_room())
        if self.stopping.is_set():
            source.stop_intake()

    async def until_stopping(self, wait: Coroutine[Any, Any, Any]) -> None:
        """Await ``wait`` unless the daemon stops first (then ``wait`` is cancelled)."""
        if self.stopping.is_set():
            wait.close()
            return
        waiting = asyncio.ensure_future(wait)
        stopping = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait((waiting, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiting, stopping):
                task.cancel()

    def take_chunk(self, chunk: Chunk, source: Source) -> None:
        """One chunk of ``source`` into the intake: what the source refused is counted, the lines or messages are
        taken, the chunk's marks journaled after its readings, and the chunk is acknowledged now, or with durable
        state once the journal holds what it carried (its readings and marks: one sync writes both)."""
        if chunk.kind == ChunkKind.ADDRESSED:
            if chunk.payloads:
                self.take_messages(chunk.names, chunk.payloads)
        else:
            too_large = chunk.refused.get("too_large", 0)
            if too_large:
                self.line_too_large(self.cfg.input.max_payload_bytes, too_large)
            if chunk.data:
                self.take_lines(chunk.data)
        if chunk.marks:
            if self.durable is None:
                msg = "a chunk with journal marks needs durable state"
                raise TypeError(msg)
            self.durable.mark(chunk.marks)
        if chunk.ack is not None:
            if self.durable is None:
                source.acknowledge([chunk.ack])
            else:
                self.durable.acknowledge_after_sync(source, chunk.ack)

    # -- processing and output ------------------------------------------------------------------------------
    def step(self) -> None:
        """Process the pending readings of every touched stream and emit the releases."""
        self.emit(self.router.flush())

    def emit(self, batches: Releases | list[ReleaseBatch]) -> None:
        if self.durable is not None and self.durable.hold(batches):
            return  # released once the readings they come from are in the journal on disk
        eps = self.epsilon
        stdout, pubq = self.stdout, self.pubq if self.mqtt_out else None
        retain, as_array = self.cfg.output.retain, self.cfg.output.batch
        topic_of = self.output_topic
        if pubq is not None:
            reprs: dict[float, str] = {}  # the step's times and epsilon, formatted once
            for b in batches:
                lines = encode_releases(b, eps, reprs)
                topic = topic_of(b.record.name)
                if as_array:
                    pubq.put(topic, ("[" + ",".join(lines) + "]").encode(), retain, len(lines))
                else:
                    for line in lines:
                        pubq.put(topic, line.encode(), retain, 1)
        if stdout is not None and batches and not stdout.gone:
            # the status lines of streams first described here, then every release of the step
            new = self.first_described(batches)
            for at in range(0, len(new), STATUS_LINES_A_WRITE):  # the text of a few thousand at a time in memory
                heads = [line for line in status_lines(new[at : at + STATUS_LINES_A_WRITE]) if line is not None]
                stdout.write_lines(["".join(line + "\n" for line in heads).encode()])
            stdout.write_lines(encode_step(batches, eps))
            stdout.flush()
            if not stdout.gone:  # written (the releases of a step the reader left in count as not written)
                self.stdout_written += releases_in(batches)
        if stdout is not None and stdout.gone and not self.stdout_left:
            self.stdout_left = True
            if self.mqtt_out:
                log.warning("the reader of stdout went away; releases go on to the broker only")
            elif not self.stopping.is_set():
                log.info("stopping: the reader of stdout went away; finishing what was accepted")
                self.stopping.set()
        status = self.router.status_now
        if status:
            self.phase_log.note_many([(rec.name, phase) for rec, phase in status if phase is not None])
            if self.pubq is None:  # nothing to publish (publish_status): only due no more
                for rec, _ in status:
                    rec.status_due = False
            else:
                for rec, _ in status:
                    self.publish_status(rec)
            status.clear()

    @staticmethod
    def first_described(batches: Releases | list[ReleaseBatch]) -> list[StreamRecord]:
        """The streams whose status lines go to stdout before the releases of ``batches``: each releasing numeric
        stream whose first release in this run's output is among them (``stream.core.sinks.status_line``), so that
        a file of releases says what they mean without a retained message; they are marked described."""
        if isinstance(batches, Releases):  # the rows' streams read without making their batches
            rows = batches.rows
            new = [rec for rec in rows.records if not rec.described] if rows is not None else []
            new += [b.record for b in batches.others if not b.record.described]
        else:
            new = [b.record for b in batches if not b.record.described]
        new = list(dict.fromkeys(new))  # a stream once (its releases may come in more than one part)
        for rec in new:
            rec.described = True
        return new

    def publish_status(self, rec: StreamRecord) -> None:
        rec.status_due = False
        if self.mqtt_out and self.cfg.output.status_topic and self.pubq is not None:
            self.pubq.put(self.cfg.output.status_topic.replace("{stream}", rec.name), encode_status(rec), True, 0)
        if self.local and self.pubq is not None:
            self.publish_control(rec)

    def publish_control(self, rec: StreamRecord) -> None:
        """Local mode: the retained control message devices follow (Square Wave phase, then Hybrid with theta)."""
        op, t = rec.operator, self.cfg.template
        if isinstance(op, CategoricalRelease):
            c = op.config
            msg = categorical_control(rec.name, c.epsilon, c.mechanism, c.categories)
        elif isinstance(op, RangeRelease):
            r = op.config
            msg = range_control(rec.name, r.epsilon, r.mechanism, r.lower, r.width, r.buckets, r.fanout)
        elif op.theta is None:
            msg = threshold_control(rec.name, op.config.threshold_budget, t.bound, op.sw_b, domain=op.sw_domain,
                                    received=op.received, take=op.holdout_take)
        else:
            msg = stream_control(rec.name, t.epsilon, op.theta)
        topic = self.cfg.local.control_topic.replace("{stream}", rec.name)
        assert self.pubq is not None
        self.pubq.put(topic, json.dumps(msg).encode(), True, 0)

    def publish_statuses(self) -> None:
        """The status of every stream whose status became due since the last pass (the router's pending names,
        not every stream: a pass over a million streams would stop the loop every ``status_interval``)."""
        router = self.router
        pending = router.status_pending
        if not pending:
            return
        router.status_pending = set()
        streams = router.streams
        for name in pending:
            rec = streams.get(name)  # gone (evicted) meanwhile: nothing to say
            if rec is not None and rec.status_due:
                self.publish_status(rec)

    async def evict_loop(self) -> None:
        """Idle streams leave memory: every quarter of ``[streams] idle_timeout`` (at most a minute)."""
        timeout = float(self.cfg.streams.idle_timeout)
        interval = min(max(timeout / 4, 0.05), 60.0)
        self.router.track_idle(interval)  # the idle ones are found in old windows, not by a walk of every stream
        while True:
            await asyncio.sleep(interval)
            await self.evict_idle(timeout)

    async def evict_idle(self, timeout: float) -> int:
        """Checkpoint, then take out of memory the streams without a reading for ``timeout`` seconds. Their state
        (operator, tick counter, last seq, open periods) is in the store: when one returns, the store restores it
        and it continues exactly where it was (same ticks, same noise). Returns how many left."""
        durable, router = self.durable, self.router
        assert durable is not None
        cutoff = time.monotonic() - timeout
        if not router.idle(cutoff):
            return 0
        await durable.checkpoint_now()
        # Right after the checkpoint (no await in between): evict only what it saved as it is now.
        streams = router.streams
        gone = [name for name in router.idle(cutoff)
                if not streams[name].pending and name not in router.dirty and name not in durable.changed]
        n = router.evict(gone)
        if n:
            self.metrics.streams_evicted.inc(n)
            log.info("%d streams idle for %g s left memory (%d remain)", n, timeout, len(router.streams))
        return n

    async def period_loop(self) -> None:
        clock = self.router.clock
        assert clock is not None
        while True:
            now = time.time()
            await asyncio.sleep(max(0.0, clock.next_close(now) - now) + 0.001)
            self.emit(self.router.close_periods(time.time()))

    async def status_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.output.status_interval)
            self.publish_statuses()

    async def account_loop(self) -> None:
        while True:
            await asyncio.sleep(ACCOUNT_INTERVAL)
            self.account()

    def account(self) -> None:
        """Push the local counters into the metrics (cheap per message, batched per interval)."""
        self.phase_log.roll()
        if self.heap is not None:
            self.heap.tick()
        m = self.metrics
        for result, n in self.msg_counts.items():
            if n:
                m.count(m.messages, result, n)
                self.msg_counts[result] = 0
        for result, n in self.router.take_counts().items():
            m.count(m.readings, result, n)
        if self.cap_readings:
            m.count(m.readings, "stream_cap", self.cap_readings)
            self.cap_readings = 0
        if self.router.ticks_processed:
            m.ticks.inc(self.router.ticks_processed)
            self.router.ticks_processed = 0
        lat, self.router.latencies = self.router.latencies, []
        for x in lat:
            m.tick_latency.observe(x)
        if self.stdout_written:
            m.releases.labels("stdout").inc(self.stdout_written)
            self.stdout_written = 0
        if self.link is not None:
            n = self.link.take_published()
            if n:
                m.releases.labels("mqtt").inc(n)
            n = self.link.take_overload()
            if n:
                m.messages.labels("overload").inc(n)
        if self.pubq is not None:
            n = self.pubq.take_dropped()
            if n:
                m.releases_dropped.inc(n)


# -- command line ---------------------------------------------------------------------------------------------
_TEMPLATE_FLAGS = {"epsilon": float, "bound": float, "lower": float, "holdout": int, "range": int, "fanout": int,
                   "smoother": str, "resolution": float, "holdout_grid": str}  # --holdout-grid: the key's dashes


def _template_key(flag: str) -> str:
    return "query_range" if flag == "range" else flag


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", metavar="TOML", help="configuration file (docs/configuration.md); "
                        "without it: readings on stdin, JSONL releases on stdout")
    for flag, kind in _TEMPLATE_FLAGS.items():
        parser.add_argument(f"--{flag.replace('_', '-')}", type=kind, default=None,
                            help=f"override [streams.template] {_template_key(flag)}")
    parser.add_argument("--key-file", help="override [streams] key_file")
    parser.add_argument("--metrics-port", type=int, help="override [metrics] port (0: off)")
    parser.add_argument("--check", action="store_true", help="check the configuration and exit")
    parser.add_argument("--data-dir", help="override [state] data_dir (durable state; '' turns it off)")
    parser.add_argument("--new-generation", action="append", default=[], metavar="NAME",
                        help="start stream NAME as a new generation (new key, new ledger entry) when its privacy "
                        "parameters changed; repeatable")
    parser.add_argument("--new-generation-all", action="store_true",
                        help="start every stream whose privacy parameters changed as a new generation (a raised "
                        "fleet_generation: a new fleet holdout)")


def config_from_args(args: argparse.Namespace) -> DaemonConfig:
    overrides = {_template_key(k): getattr(args, k) for k in _TEMPLATE_FLAGS if getattr(args, k, None) is not None}
    if args.config:
        cfg = load_config(args.config, overrides)
    else:
        doc: dict[str, Any] = {"metrics": {"port": 0}, "streams": {"template": dict(STDIN_TEMPLATE)}}
        cfg = build_config(doc, None, overrides)
    s, mt = dict(cfg.streams.values), dict(cfg.metrics.values)
    if args.key_file:
        s["key_file"] = args.key_file
    if args.metrics_port is not None:
        if not 0 <= args.metrics_port <= 65535:
            raise ConfigFileError(["--metrics-port must be between 0 and 65535"])
        mt["port"] = args.metrics_port
    cfg.streams.values.update(s)
    cfg.metrics.values.update(mt)
    st = cfg.state.values
    if getattr(args, "data_dir", None) is not None:
        st["data_dir"] = args.data_dir
    st["new_generation"] = list(st["new_generation"]) + list(getattr(args, "new_generation", None) or [])
    st["new_generation_all"] = bool(st["new_generation_all"] or getattr(args, "new_generation_all", False))
    return cfg


def describe_defaults(cfg: DaemonConfig) -> str:
    """The one line printed when ``tops run`` starts without a configuration file."""
    t = cfg.template
    return (f"tops run: no --config: readings on stdin (a number, stream,value or JSON per line), JSONL releases on "
            f"stdout; one reading = one tick; stream template epsilon={t.epsilon:g} bound={t.bound:g} "
            f"holdout={t.holdout} query_range={t.query_range} fanout={t.fanout} smoother={t.smoother} "
            f"resolution={t.resolution:g}; key file {cfg.streams.key_file}; durable state "
            f"{cfg.state.data_dir or 'off (--data-dir DIR keeps streams across runs)'}")


def settle_heap() -> None:
    """Take what the process holds before the daemon runs (its imports, the configuration: tens of thousands of
    objects that live as long as the process) out of the garbage collector's full passes, which stop the event loop
    in proportion to the objects they walk. Collected first, so no garbage is kept. ``tops run`` calls it once."""
    gc.collect()
    gc.freeze()


def main(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except ConfigFileError as exc:
        for line in exc.problems:
            print(f"tops run: {line}", file=sys.stderr)
        return 2
    if cfg.input.source == "nats":  # a cluster worker: its state is in JetStream, not in [state]
        return _run_worker(cfg, args)
    problems = preflight(cfg)  # what would stop the start, all at once
    for line in problems:
        print(f"tops run: {line}", file=sys.stderr)
    if problems:
        return 2
    if args.check:
        print(f"tops run: configuration {cfg.source_path or '(defaults)'} is valid", file=sys.stderr)
        return 0
    logging.basicConfig(level=cfg.log.level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.config:
        print(describe_defaults(cfg), file=sys.stderr)
    settle_heap()
    try:
        return asyncio.run(Daemon(cfg, heap=Heap()).serve())
    except (KeyFileError, StoreError, StartupError) as exc:
        print(f"tops run: {exc}", file=sys.stderr)
        return 2



def _run_worker(cfg: DaemonConfig, args: argparse.Namespace) -> int:
    from stream.cluster.worker import WorkerError, run_worker

    if args.check:
        print(f"tops run: configuration {cfg.source_path or '(defaults)'} is valid (cluster worker)", file=sys.stderr)
        return 0
    logging.basicConfig(level=cfg.log.level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settle_heap()
    try:
        return run_worker(cfg, heap=Heap())
    except (KeyFileError, WorkerError) as exc:
        print(f"tops run: {exc}", file=sys.stderr)
        return 2

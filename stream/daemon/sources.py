"""The MQTT link: one connection for input and output, reconnecting (stdin is stream/daemon/stdin.py).

The MQTT link runs one connection at a time: subscribe, receive in batches (whatever the client's queue holds),
publish from the bounded :class:`~stream.core.sinks.PublishQueue` with a window of unconfirmed messages. When the
connection is lost, unconfirmed messages go back to the front of the queue, messages already received are
still processed, and the link reconnects with capped exponential backoff and jitter, then subscribes again. A
connection on which the broker stops answering is given up the same way (:class:`AckWatchdog`): an open socket is
not a working connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import socket
import ssl
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from stream.core.errors import PayloadError
from stream.core.metrics import Metrics
from stream.core.payload import check_stream_name
from stream.core.sinks import PublishQueue
from stream.daemon.mqtt_paho import PahoSession, ReadAheadSocket, published

if TYPE_CHECKING:
    from stream.daemon.repeats import RedeliveryFilter


__all__ = ["AckWatchdog", "Inbox", "MqttLink", "ReadAheadSocket", "Received", "TopicRouter", "backoff_delay",
           "published"]

log = logging.getLogger("tops.mqtt")

Message = tuple[str, bytes, bool, int]  # topic, payload, retain, releases carried


def backoff_delay(attempt: int, low: float, high: float) -> float:
    """Capped exponential backoff with jitter: ``min(high, low 2^attempt)`` scaled by U(0.5, 1).

    >>> 0.5 <= backoff_delay(0, 1.0, 30.0) <= 1.0, backoff_delay(20, 1.0, 30.0) <= 30.0
    (True, True)
    """
    return min(high, low * 2.0 ** min(attempt, 30)) * random.uniform(0.5, 1.0)


class AckWatchdog:
    """Tells when the broker has stopped answering: something awaits its answer (a publish its PUBACK, a probe its
    UNSUBACK) and none came for ``limit`` seconds of a running event loop.

    A broker can drop its answers on a connection it keeps open: Mosquitto 2.0 (Debian's 2.0.11 since its fix of
    CVE-2023-28366, upstream from 2.0.16) drops every packet it would queue for a client that already has
    ``max_queued_messages`` packets waiting, whatever the packet: PUBACKs, UNSUBACKs, PINGRESPs, and QoS 1
    readings, which it then counts as in flight to this client. A QoS 0 flood to that client fills exactly that
    queue. MQTT resends only on a new connection, so without one the publish window stays full, and readings the
    broker counts as sent never arrive, for good.

    An answer that is late is not a lost one: behind a backlog (a broker without a queue limit holds a flood for
    minutes) it comes when the daemon has read what is ahead of it. So only time counts during which the broker sent
    nothing and everything received was read (``counting``: nothing read since the last look, the socket drained,
    reading not paused by the daemon's own backpressure), and a gap between two looks longer than ``step`` (the loop
    was busy or blocked) counts as ``step``. A broker short of CPU sends its backlog in bursts, with the socket
    drained between them: those gaps do not count, since it sent something. While a flood goes on the broker sends
    all the time: the connection is given up once it has ended, ``limit`` seconds later.

    >>> w = AckWatchdog(3.0)
    >>> [w.stalled(t, False) for t in (0.0, 0.5, 1.0, 1.5, 2.0, 2.5)], w.stalled(3.0, False)
    ([False, False, False, False, False, False], True)
    >>> w.stalled(3.5, True), w.stalled(60.0, False), w.waited  # answered; then a blocked loop's 56.5 s count as 1
    (False, False, 1.0)
    >>> w.stalled(70.0, False, counting=False), w.waited  # reading paused: not counted
    (False, 1.0)
    """

    def __init__(self, limit: float, step: float = 1.0) -> None:
        self.limit = limit
        self.step = step
        self.waited = 0.0  # seconds without an answer while one was awaited
        self._last: float | None = None

    def idle(self) -> None:
        """Nothing awaits an answer."""
        self.waited, self._last = 0.0, None

    def stalled(self, now: float, progressed: bool, *, counting: bool = True) -> bool:
        """A look while answers are awaited, ``progressed`` when one came since the last look, ``counting`` False
        while the socket is not read. True once ``limit`` seconds passed without an answer."""
        if progressed or self._last is None:
            self.waited = 0.0
        elif counting:
            self.waited += min(now - self._last, self.step)
        self._last = now
        return self.waited >= self.limit


class FloodResync:
    """Tells when to reconnect after a QoS 0 flood, so that the broker resends QoS 1 readings it may have dropped.

    A broker whose queue for this client is full drops what it owes it (see :class:`AckWatchdog`), QoS 1 readings of
    other devices included, which it counts as in flight: MQTT resends those only on a new connection, and whether an
    answer the daemon awaits was dropped too is a matter of timing, so the watchdog alone misses some floods. That
    queue fills only with QoS 0 messages sent faster than the daemon reads them (the broker's in-flight window bounds
    QoS 1). So a look that finds QoS 0 messages received while the daemon was behind (more than one read's budget left
    unread on its socket, or QoS 0 messages counted as overload; a few readings that arrived just before the look are
    not a backlog) marks the connection flooded, and the first later look at which the broker has sent no message
    since the last one (the flood and the backlog it left are over: a reconnect throws nothing away) asks for one
    reconnect. The daemon uses it with QoS 1 input on a persistent session only: a clean
    session loses what is in flight on any reconnect, and QoS 0 messages are never resent.

    >>> f = FloodResync()
    >>> f.look(sent=True, qos0=True, behind=True), f.look(sent=True, qos0=False, behind=False), f.look(sent=False)
    (False, False, True)
    >>> f.look(sent=False), f.look(sent=True, qos0=True, behind=False), f.look(sent=False)  # once; QoS 0 kept up with
    (False, False, False)
    """

    def __init__(self) -> None:
        self.flooded = False

    def look(self, *, sent: bool, qos0: bool = False, behind: bool = False) -> bool:
        """A look: ``sent`` when the broker sent something since the last look, ``qos0`` when QoS 0 messages were
        among it, ``behind`` when the daemon had not read all of it. True when a reconnect is due."""
        if sent:
            self.flooded |= qos0 and behind
            return False
        due, self.flooded = self.flooded, False
        return due


class TopicRouter:
    """Maps an input topic to its stream name through patterns whose single ``+`` level names the stream.

    >>> r = TopicRouter(["meters/+/reading"])
    >>> r.stream("meters/m-1/reading"), r.stream("meters/m-1/other")
    ('m-1', None)
    """

    def __init__(self, patterns: list[str], cache_limit: int = 100_000) -> None:
        self.patterns = []
        for p in patterns:
            levels = p.split("/")
            self.patterns.append((len(levels), levels.index("+"), levels))
        self.cache: dict[str, str | None] = {}
        self.cache_limit = cache_limit

    def stream(self, topic: str) -> str | None:
        """The stream named by ``topic``, or None when it matches no pattern or names no valid stream."""
        try:
            return self.cache[topic]
        except KeyError:
            pass
        name = None
        levels = topic.split("/")
        for n, plus, pat in self.patterns:
            if len(levels) == n and all(a == b for i, (a, b) in enumerate(zip(levels, pat, strict=True))
                                        if i != plus):
                try:
                    name = check_stream_name(levels[plus])
                except PayloadError:
                    name = None
                break
        if len(self.cache) >= self.cache_limit:
            self.cache.clear()
        self.cache[topic] = name
        return name


def _tls_context(settings: Any) -> ssl.SSLContext | None:
    if not settings.tls:
        return None
    ctx = ssl.create_default_context(cafile=settings.ca_file or None)
    if settings.cert_file:
        ctx.load_cert_chain(settings.cert_file, settings.key_file)
    if settings.tls_insecure:
        ctx.check_hostname = False
    return ctx


class IncomingQueue(asyncio.Queue):  # type: ignore[type-arg]
    """The client's queue of received messages, bounded by ``bound`` for QoS 0.

    A QoS 0 message that arrives while the queue holds ``bound`` messages is not kept: it is counted in
    ``overload`` (metric result `overload`). QoS 1 messages are always kept: they are acknowledged only once
    processed, so the broker holds the rest (its in-flight window); ``qos1`` counts them, and the link stops
    reading the socket while they alone fill the queue.
    """

    def __init__(self, bound: int) -> None:
        super().__init__()
        self.bound = bound
        self.overload = 0
        self.qos1 = 0
        self.received = 0  # messages received, taken or not
        self.qos0_received = 0

    def put_nowait(self, item: Any) -> None:
        self.received += 1
        if item.qos:
            self.qos1 += 1
        else:
            self.qos0_received += 1
            if self.qsize() >= self.bound:
                self.overload += 1
                return
        super().put_nowait(item)

    def get_nowait(self) -> Any:
        item = super().get_nowait()
        if item.qos:
            self.qos1 -= 1
        return item


@dataclass(slots=True)
class Received:
    """Messages the link received, in order, handed to the input source (stream/daemon/mqtt_source.py) as one batch.

    ``connection`` is the number of the connection they came on, while it is up: their QoS 1 messages are
    acknowledged on it once taken. None: received on a connection that has ended, or left by a session the broker
    lost (never acknowledged: there is no connection to acknowledge them on, and never filtered for repeats)."""

    messages: list[aiomqtt.Message]
    connection: int | None
    arrival: float = field(default_factory=time.time)  # when the link handed them over


class Inbox:
    """The batches the link received and the input source has not taken yet: at most ``depth`` while intake runs
    (the link waits for room, reading on: see :meth:`MqttLink._receive`), in order. What a connection leaves when it
    ends is taken back by the link (:meth:`take_back`): it is settled like the rest of that connection's messages."""

    def __init__(self, depth: int = 1) -> None:
        self.depth = depth
        self.batches: deque[Received] = deque()
        self.ready = asyncio.Event()  # a batch came, or intake ended
        self.emptied = asyncio.Event()  # there is room
        self.emptied.set()
        # the engine is not asking for a batch (it has not started, or has the last chunk made from this inbox and has
        # not asked for the next): whenever the link runs meanwhile, the engine waits for room (for releases to
        # leave, for the disk), not taking input
        self.engine_waits = True

    def put(self, received: Received) -> None:
        if received.messages:
            self.batches.append(received)
            self.ready.set()
            if len(self.batches) >= self.depth:
                self.emptied.clear()

    def take(self) -> Received | None:
        """The oldest batch, or None."""
        if not self.batches:
            return None
        received = self.batches.popleft()
        if len(self.batches) < self.depth:
            self.emptied.set()
        return received

    def full(self) -> bool:
        return len(self.batches) >= self.depth

    def take_back(self, connection: int | None) -> list[aiomqtt.Message]:
        """The messages of ``connection``'s batches not taken yet (they leave the inbox, in order)."""
        mine = [r for r in self.batches if r.connection == connection]
        if not mine:
            return []
        self.batches = deque(r for r in self.batches if r.connection != connection)
        if len(self.batches) < self.depth:
            self.emptied.set()
        return [m for r in mine for m in r.messages]


READ_BUDGET = 1 << 16  # bytes one reader callback takes from the socket before the event loop runs the others
PROBE_LOOK = 0.25  # seconds between looks at the probes (and between probes while the broker sends)
PROBE_LIMIT = 8  # probes unanswered at a time (one lost is enough; aiomqtt warns above 10 pending requests)
PROBE_TOPIC = "tops/probe"  # never subscribed: unsubscribing it changes nothing, and the broker answers (UNSUBACK)


class MqttLink:
    """The broker connection of the daemon; ``run()`` is its one long-lived task.

    Each batch received goes into :attr:`inbox`, for the input source (stream/daemon/mqtt_source.py), which the
    daemon's engine loop takes chunks from. QoS 1 messages are acknowledged only through :meth:`acknowledge` (the
    engine's call once a chunk was taken, or with durable state once the journal holds it), never on receipt, so
    that the broker holds what is not taken yet. With durable state the link is built with a ``repeats`` filter
    (stream/daemon/repeats.py), which it tells each connection's CONNACK, the DUP flag of each QoS 1 message and
    each message it publishes; the source filters each batch through it."""

    def __init__(self, settings: Any, *, topics: list[str], in_qos: int, out_qos: int, pubq: PublishQueue,
                 metrics: Metrics, max_batch: int, inflight: int, max_queue: int = 10_000,
                 ack_timeout: float = 10.0, repeats: RedeliveryFilter | None = None) -> None:
        self.settings = settings
        self.ack_timeout = ack_timeout  # seconds without an answer while one is awaited: reconnect
        self.repeats = repeats
        # two batches: the link gathers the next while the engine takes one (at one, each batch would cost two more
        # event-loop passes, each reading up to READ_BUDGET: QoS 0 floods counted as overload half as often again)
        self.inbox = Inbox(depth=2)
        self.connection = 0  # the number of the current (or last) connection, from 1
        self.max_queue = max_queue
        self.overload = 0  # QoS 0 messages not taken (queue full), since the last take_overload()
        self._paused = False
        self._waiting_room = False  # intake waits for the publish queue: keep reading (acknowledgements)
        self._reader: tuple[PahoSession, Any] | None = None  # (session, socket) of the reader callback
        self._reads = 0  # reader callbacks run (the broker sent something)
        self.client: aiomqtt.Client | None = None  # the current connection's client
        self.session: PahoSession | None = None  # the same, with what aiomqtt offers no API for (mqtt_paho.py)
        self.session_present = False  # from the last CONNACK (manual acknowledgements only)
        self._backlog: list[aiomqtt.Message] = []
        self.topics = topics
        self.in_qos = in_qos
        self.out_qos = out_qos
        self.pubq = pubq
        self.metrics = metrics
        self.max_batch = max_batch
        self.window = inflight
        self.queue: IncomingQueue | None = None
        self.inflight: deque[tuple[Any, Message]] = deque()
        self.published_releases = 0  # confirmed since the last take_published()
        self.confirmed = 0  # messages confirmed by the broker (the watchdog's evidence that it answers)
        self.connected = asyncio.Event()
        self.intake_done = asyncio.Event()  # intake stopped, and everything received is in the inbox
        if not topics:
            self._end_intake()
        self._stop_intake = False
        self._closing = False
        self._receiver: asyncio.Task[None] | None = None

    # -- control, called by the daemon ------------------------------------------------------------------
    def stop_intake(self) -> None:
        """Stop receiving: unsubscribe, hand over what was received, then set ``intake_done``."""
        self._stop_intake = True
        if self._receiver is not None and not self._receiver.done():
            self._receiver.cancel()
        elif not self.connected.is_set():
            self._end_intake()

    def _end_intake(self) -> None:
        self.intake_done.set()
        self.inbox.ready.set()

    def close(self) -> None:
        """Finish publishing what is queued, then disconnect (``run()`` returns)."""
        self._closing = True
        self.pubq.nonempty.set()

    def queue_depth(self) -> int:
        return self.queue.qsize() if self.queue is not None else 0

    def acknowledge(self, acks: list[tuple[int | None, list[int]]]) -> list[int]:
        """Acknowledge received QoS 1 messages ``(connection, mids)`` on the current connection: those of an earlier
        one are skipped (the broker redelivers them to the session, or lost it). Returns the mids acknowledged."""
        session, current = self.session, self.connection
        if session is None or not self.connected.is_set():
            return []
        mids = [mid for c, batch in acks if c == current for mid in batch]
        if mids:
            session.acknowledge(mids)
        return mids

    def take_published(self) -> int:
        n, self.published_releases = self.published_releases, 0
        return n

    def take_overload(self) -> int:
        q = self.queue
        n = self.overload + (q.overload if q is not None else 0)
        self.overload = 0
        if q is not None:
            q.overload = 0
        return n

    @property
    def _acks_qos1(self) -> bool:
        """paho-mqtt manual acknowledgements: on whenever readings come at QoS 1."""
        return bool(self.topics) and self.in_qos >= 1

    # -- reading the socket: bounded work per callback, paused while QoS 1 messages fill the queue ---------------
    def _install_reader(self, session: PahoSession) -> None:
        session.after_socket_opens(lambda sock: self._take_reader(session, sock))

    def _take_reader(self, session: PahoSession, sock: Any) -> None:
        """Replace aiomqtt's reader callback (which reads as long as data keeps coming) with :meth:`_on_readable`."""
        if not session.owns(sock):  # already closed
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(sock.fileno())
        loop.add_reader(sock.fileno(), self._on_readable, session, sock)
        self._reader, self._paused = (session, sock), False

    def _on_readable(self, session: PahoSession, sock: Any) -> None:
        """Read at most ``READ_BUDGET`` bytes from the kernel (plus what was read ahead), then let the loop run
        processing, acknowledgements, publishing and keepalive; stop reading while QoS 1 messages fill the queue."""
        q = self.queue
        if q is not None and q.qos1 >= self.max_queue and not (self._waiting_room or self._stop_intake):
            self._pause()
            return
        self._reads += 1
        try:
            sock.budget = READ_BUDGET
            while True:
                session.read()
                if sock.buffered() > 0 or (sock.budget > 0 and sock.pending() > 0):
                    continue
                break
            if sock.pending() > 0 and session.owns(sock):  # TLS bytes decrypted ahead, which the selector misses
                asyncio.get_running_loop().call_soon(self._on_readable, session, sock)
        except Exception as exc:  # as aiomqtt's callback: a read error ends the connection
            session.end(exc)
        finally:
            sock.budget = None

    def _pause(self) -> None:
        if self._reader is not None and not self._paused:
            session, sock = self._reader
            if session.owns(sock):
                asyncio.get_running_loop().remove_reader(sock.fileno())
            self._paused = True

    def _resume(self) -> None:
        if self._paused and self._reader is not None:
            self._paused = False
            session, sock = self._reader
            if session.owns(sock):
                loop = asyncio.get_running_loop()
                loop.add_reader(sock.fileno(), self._on_readable, session, sock)
                loop.call_soon(self._on_readable, session, sock)  # bytes read ahead: the selector does not see them

    # -- the connection loop ----------------------------------------------------------------------------
    def _session(self, queue: IncomingQueue) -> PahoSession:
        s = self.settings
        persistent = s.session == "persistent"
        client_id = s.client_id or (f"tops-{socket.gethostname()}" if persistent else None)
        session_args: dict[str, Any] = {}
        if s.protocol == "5":
            props = Properties(PacketTypes.CONNECT)
            if persistent:
                props.SessionExpiryInterval = s.session_expiry
            session_args = {"protocol": aiomqtt.ProtocolVersion.V5, "clean_start": not persistent,
                            "properties": props}
        else:
            session_args = {"clean_session": not persistent}
        session = PahoSession.make(
            queue, manual_acks=self._acks_qos1,
            hostname=s.host, port=s.port, username=s.username or None, password=s.password or None,
            identifier=client_id, keepalive=s.keepalive, timeout=s.timeout,
            tls_context=_tls_context(s), tls_insecure=s.tls_insecure if s.tls else None,
            # 0: no limit inside paho. The window is enforced by _publish (it never hands paho more than `window`
            # unconfirmed messages), and with a limit paho scans every in-flight message on each PUBACK.
            max_inflight_messages=0, **session_args,
        )
        self._install_reader(session)
        acks_qos1, repeats = self._acks_qos1, self.repeats
        connection = self.connection
        if acks_qos1 or repeats is not None:  # aiomqtt 2.x drops the CONNACK's session-present flag

            def on_connack(session_present: bool) -> None:
                if acks_qos1:
                    self.session_present = session_present
                if repeats is not None:
                    repeats.connected(connection, self.session_present)

            session.on_connack(on_connack)
        if repeats is not None:  # telling a repeat needs each QoS 1 message's DUP flag, which aiomqtt 2.x drops
            session.on_dup_flags(repeats.dups)
        return session

    async def run(self) -> None:
        """Connect, serve, and reconnect with backoff until ``close()`` has drained the publish queue."""
        attempt = 0
        ever_connected = False
        while True:
            queue = IncomingQueue(self.max_queue)
            if self.queue is not None:
                self.overload += self.queue.overload
            self.queue = queue
            self.connection += 1
            session = self.session = self._session(queue)
            client = self.client = session.client
            try:
                async with client:
                    if ever_connected:
                        self.metrics.mqtt_reconnects.inc()
                    ever_connected, attempt = True, 0
                    self.connected.set()
                    self.pubq.set_connected(True)
                    self.metrics.mqtt_connected.set(1)
                    self._settle_backlog()
                    log.info("connected to %s:%s", self.settings.host, self.settings.port)
                    await self._serve(client, queue)
                    return
            except* aiomqtt.MqttError as group:
                reason = "; ".join(str(e) for e in group.exceptions)
                delay = backoff_delay(attempt, self.settings.reconnect_min, self.settings.reconnect_max)
                attempt += 1
                log.warning("broker connection failed or lost (%s); retrying in %.1f s", reason, delay)
            finally:
                self.connected.clear()
                self.pubq.set_connected(False)
                self._reader, self._paused = None, False
                self.metrics.mqtt_connected.set(0)
                self._after_connection(queue)
            if self._closing and not len(self.pubq) and self.intake_done.is_set():
                return
            await asyncio.sleep(delay)

    def _settle_backlog(self) -> None:
        """QoS 1 messages left unacknowledged by the last connection: redelivered if the broker kept the session,
        processed now if it lost it."""
        backlog, self._backlog = self._backlog, []
        if not backlog:
            return
        if self.session_present:
            log.info("%d unacknowledged messages of the last connection: the broker redelivers them", len(backlog))
            return
        log.warning("the broker lost the session: %d messages received before are processed now", len(backlog))
        self._hand_over(backlog, None)  # their message ids belong to the old session: never acked

    def _after_connection(self, queue: IncomingQueue) -> None:
        """Put unconfirmed messages back and hand over what was received before the connection ended (with what the
        input source had not taken yet: settled the same way)."""
        pending = [item for info, item in self.inflight if not published(info)]
        self.published_releases += sum(item[3] for info, item in self.inflight if published(info))
        self.inflight.clear()
        self.pubq.requeue(pending)
        left = self.inbox.take_back(self.connection)
        while not queue.empty():
            left.append(queue.get_nowait())
        if self._acks_qos1 and self.settings.session == "persistent":
            # QoS 1: not acknowledged, and no connection left to acknowledge them on: the broker redelivers them to
            # the session, so processing them now would count them twice. Kept until the next CONNACK says whether
            # the broker still has the session (if it lost it, they are processed then). QoS 0 messages are never
            # redelivered: processed now.
            now: list[aiomqtt.Message] = []
            for m in left:
                (self._backlog if m.qos else now).append(m)
            self._hand_over(now, None)
        else:
            self._hand_over(left, None)
        if self._stop_intake:
            self._end_intake()

    def _hand_over(self, messages: list[aiomqtt.Message], connection: int | None) -> None:
        """Into the inbox in batches of at most ``max_batch`` (whatever room there is: they were received)."""
        for k in range(0, len(messages), self.max_batch):
            self.inbox.put(Received(messages[k:k + self.max_batch], connection))

    def _drain(self, queue: IncomingQueue, connection: int | None) -> None:
        left = []
        while not queue.empty():
            left.append(queue.get_nowait())
        self._hand_over(left, connection)

    async def _serve(self, client: aiomqtt.Client, queue: IncomingQueue) -> None:
        async with asyncio.TaskGroup() as tg:
            if self.topics and not self._stop_intake:
                for t in self.topics:
                    await client.subscribe(t, qos=self.in_qos)
                self._receiver = tg.create_task(self._receive(client, queue), name="tops.mqtt.receive")
            else:
                self._end_intake()
            watch = tg.create_task(self._watch(client), name="tops.mqtt.watch")
            tg.create_task(self._publish(client, watch), name="tops.mqtt.publish")

    async def _watch(self, client: aiomqtt.Client) -> None:
        """End the connection's tasks when it is lost, even with nothing to receive or publish (stdin input), or when
        the broker stops answering (:class:`AckWatchdog`): messages the daemon published wait for their PUBACK, or
        probes for their answer, and none came for ``ack_timeout`` s.

        A broker that drops what it owes this client drops the QoS 1 readings it sends as well, and counts them in
        flight: they come again only on a new connection, and nothing the daemon publishes need be in flight to
        show it. So while the broker sends, the daemon asks it for an answer every ``PROBE_LOOK`` s: an UNSUBSCRIBE
        of a topic it never subscribed (which changes nothing; each is answered by an UNSUBACK with its own packet
        id, unlike a PINGREQ, and leaves paho's keepalive alone)."""
        assert self.session is not None and self.session.client is client
        disconnected = self.session.disconnected  # raises MqttError when the link is lost
        loop = asyncio.get_running_loop()
        watchdog = AckWatchdog(self.ack_timeout)
        resync = FloodResync() if self._acks_qos1 and self.settings.session == "persistent" else None
        queue = self.queue
        assert queue is not None
        received, qos0_received, overload = queue.received, queue.qos0_received, queue.overload
        # each probe with how many publishes were confirmed when it was sent, and how many were in flight: a broker
        # that answers in order has sent their PUBACKs before the probe's answer; one still missing ``ack_timeout`` s
        # later (a broker may confirm a publish once it is stored, after answering what came next) was dropped
        probes: deque[tuple[asyncio.Future[None], int]] = deque()
        overtaken: tuple[Any, float] | None = None  # such a publish, and when it is given up
        reads, confirmed = self._reads, self.confirmed
        looked_at_reads = self._reads  # reader callbacks run by the last look: the broker sent since, or not
        try:
            while True:
                try:
                    await asyncio.wait_for(asyncio.shield(disconnected), PROBE_LOOK)
                    return
                except TimeoutError:
                    pass
                answered = confirmed != self.confirmed
                confirmed = self.confirmed
                while probes and probes[0][0].done():
                    probe, confirmed_by = probes.popleft()  # the count once every publish sent before it is confirmed
                    probe.result()  # an error of the probe ends the connection
                    answered = True
                    if overtaken is None and self.confirmed < confirmed_by and not published(self.inflight[0][0]):
                        overtaken = (self.inflight[0][0], loop.time() + self.ack_timeout)
                if overtaken is not None and published(overtaken[0]):
                    overtaken = None
                elif overtaken is not None and loop.time() >= overtaken[1]:
                    self._give_up(f"the broker answered a probe sent after a release and has not confirmed that "
                                  f"release for {self.ack_timeout:g} s: it dropped the acknowledgement")
                sent_since = self._reads != looked_at_reads
                looked_at_reads = self._reads
                if resync is not None:  # messages only: the answers to probes are not what a flood leaves behind
                    messages = queue.received != received
                    qos0 = queue.qos0_received != qos0_received
                    behind = queue.overload != overload or self._unread() >= READ_BUDGET
                    received, qos0_received, overload = queue.received, queue.qos0_received, queue.overload
                    if resync.look(sent=messages, qos0=qos0, behind=behind):
                        self._resync()
                if not (probes or self.inflight):
                    watchdog.idle()
                elif watchdog.stalled(loop.time(), answered,
                                      counting=not (answered or sent_since) and self._counting()):
                    awaited = [f"{n} {what}" for n, what in ((len(self.inflight), "messages in flight"),
                                                              (len(probes), "probes")) if n]
                    self._give_up(f"the broker has answered none of {' and '.join(awaited)} for "
                                  f"{self.ack_timeout:g} s")
                if self._reads != reads and len(probes) < PROBE_LIMIT:
                    reads = self._reads
                    probes.append((asyncio.ensure_future(client.unsubscribe(PROBE_TOPIC, timeout=math.inf)),
                                   self.confirmed + len(self.inflight)))
        finally:
            for probe, _ in probes:
                if not probe.done():
                    probe.cancel()
                elif not probe.cancelled():
                    probe.exception()  # retrieved: a probe that failed with the connection is not an error to log

    def _counting(self) -> bool:
        """Whether time without an answer counts now: everything received was read, and reading is not paused."""
        return not self._paused and self._drained()

    def _drained(self) -> bool:
        """Whether everything the broker sent has been read from the socket."""
        return self._unread() == 0

    def _unread(self) -> int:
        """Bytes the broker sent that are not read yet."""
        if self._reader is None:
            return 0
        try:
            return self._reader[1].unread()
        except (OSError, ValueError):  # the socket is closed: the connection is ending anyway
            return 0

    async def _receive(self, client: aiomqtt.Client, queue: IncomingQueue) -> None:
        messages = client.messages
        inbox, connection = self.inbox, self.connection
        batch: list[aiomqtt.Message] = []
        try:
            while not self._stop_intake:
                while inbox.full():
                    # The engine has not taken the last batch. If it waits for room (releases waiting for the
                    # broker, a disk that refuses writes: the one point of backpressure), reading goes on (the
                    # broker's acknowledgements of releases come through the same socket): QoS 1 readings are not
                    # acknowledged meanwhile, so the broker holds them; QoS 0 past the queue's bound are counted as
                    # overload. Else it is about to take it, and reading pauses while QoS 1 messages fill the queue.
                    self._waiting_room = inbox.engine_waits
                    if self._waiting_room:
                        self._resume()
                    try:
                        await inbox.emptied.wait()
                    finally:
                        self._waiting_room = False
                batch = [await anext(messages)]
                # The client reads a bounded amount per event-loop pass: let a few more passes run while messages
                # keep coming, so that a step takes a batch (no waiting when the input is idle).
                for _ in range(64):
                    while not queue.empty() and len(batch) < self.max_batch:
                        batch.append(queue.get_nowait())
                    if len(batch) >= self.max_batch:
                        break
                    await asyncio.sleep(0)
                    if queue.empty():
                        break
                inbox.put(Received(batch, connection))
                batch = []
                if self._paused and queue.qos1 < self.max_queue:
                    self._resume()
        except asyncio.CancelledError:
            if batch:  # taken from the queue: received, so handed over whatever happens
                inbox.put(Received(batch, connection))
            if not self._stop_intake:
                raise
        # Stopping: no new messages, then hand over what the broker had already delivered. With QoS 1 and a
        # persistent session the subscriptions stay (the broker queues readings while the daemon is down); what
        # arrives from now on is neither processed nor acknowledged, so it is redelivered.
        self._resume()  # the unsubscribe acknowledgement comes through the socket
        if not (self._acks_qos1 and self.settings.session == "persistent"):
            with contextlib.suppress(aiomqtt.MqttError):
                for t in self.topics:
                    await client.unsubscribe(t)
        self._drain(queue, connection)
        self._end_intake()

    def _give_up(self, why: str) -> None:
        """End a connection on which the broker stopped answering (``why``: what went unanswered): the reconnect
        sends the unconfirmed messages again, and the broker resends the readings it counts in flight to this
        session."""
        self.metrics.mqtt_ack_timeouts.inc()
        log.warning("%s; reconnecting", why)
        msg = "the broker stopped answering"
        raise aiomqtt.MqttError(msg)

    def _resync(self) -> None:
        """End a connection after a QoS 0 flood (:class:`FloodResync`): the broker resends on the new one the QoS 1
        readings it may have dropped, and the repeats filter drops those the daemon had."""
        self.metrics.mqtt_resyncs.inc()
        log.info("the broker sent QoS 0 messages faster than they were read; reconnecting, so that it resends any "
                 "QoS 1 reading it dropped meanwhile")
        msg = "reconnecting after a QoS 0 flood"
        raise aiomqtt.MqttError(msg)

    async def _publish(self, client: aiomqtt.Client, watch: asyncio.Task[None]) -> None:
        try:
            await self._publish_loop(client)
        finally:
            watch.cancel()

    async def _publish_loop(self, client: aiomqtt.Client) -> None:
        assert self.session is not None and self.session.client is client
        publish = self.session.publish  # without awaiting each confirmation
        connection = self.connection
        pubq, items, inflight, qos, repeats = self.pubq, self.pubq.items, self.inflight, self.out_qos, self.repeats
        while True:
            pubq.taken()  # read back what waits on disk, wake an intake waiting for room
            while items and len(inflight) < self.window:
                item = items.popleft()
                info = publish(item[0], item[1], qos, item[2])
                if repeats is not None:  # the broker's confirmation of it: evidence that it has earlier PUBACKs
                    repeats.published(connection, info, qos)
                if info.rc != 0:
                    items.appendleft(item)
                    msg = f"publish refused (code {info.rc})"
                    raise aiomqtt.MqttError(msg)
                inflight.append((info, item))
            while inflight and published(inflight[0][0]):
                self.published_releases += inflight.popleft()[1][3]
                self.confirmed += 1
            if inflight:
                await asyncio.sleep(0.001)  # writes and acknowledgements arrive through the event loop
                continue
            pubq.taken()
            if not items:
                if self._closing and self.intake_done.is_set():
                    return
                pubq.nonempty.clear()
                await pubq.nonempty.wait()

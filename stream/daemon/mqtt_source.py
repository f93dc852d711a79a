"""MQTT input as a :class:`~stream.daemon.source.Source`: the link's received batches, as ADDRESSED chunks.

The link (:class:`~stream.daemon.sources.MqttLink`) owns the connection, which carries the daemon's releases too; it
puts what it receives into its :class:`~stream.daemon.sources.Inbox`, at most two batches ahead of the engine. Each
chunk names each message's stream from its topic (:class:`~stream.daemon.sources.TopicRouter`), carries its
payload, and as ``ack`` an :class:`MqttAcks`: the connection the batch came on and its QoS 1 packet ids.
:meth:`MqttSource.acknowledge` sends their PUBACKs on that connection only while it is still the current one (an
earlier connection's messages are the broker's to redeliver).

With durable state the source is built with the :class:`~stream.daemon.repeats.RedeliveryFilter`: a batch of the
current connection goes through it as the engine takes it (in the same event-loop step, so no checkpoint sees the
filter's entries without the readings): repeats the broker sent again leave the chunk (their packet ids stay in
``ack``), and the entries kept go into ``marks``, which the engine journals after the chunk's readings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Self

from stream.daemon.repeats import RedeliveryFilter
from stream.daemon.source import Chunk, ChunkKind
from stream.daemon.sources import MqttLink, Received, TopicRouter

__all__ = ["MqttAcks", "MqttSource"]


@dataclass(frozen=True, slots=True)
class MqttAcks:
    """What acknowledges one chunk: the QoS 1 packet ids of its messages, on connection number ``connection``."""

    connection: int
    mids: list[int]


def _payload(m: Any) -> bytes:
    payload = m.payload
    if isinstance(payload, bytes | bytearray):
        return bytes(payload) if isinstance(payload, bytearray) else payload
    return b"" if payload is None else str(payload).encode()


class MqttSource:
    """The MQTT input: ``link``'s received batches as chunks (the link runs in its own task: it also publishes).

    ``repeats``: durable state's filter of the broker's redeliveries (None: none are told apart)."""

    def __init__(self, link: MqttLink, topics: TopicRouter, *, repeats: RedeliveryFilter | None = None) -> None:
        self.link = link
        self.topics = topics
        self.repeats = repeats

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop_intake()

    async def chunks(self) -> AsyncIterator[Chunk]:
        """The batches received, in order; ends once intake stopped and everything received was yielded."""
        link = self.link
        inbox = link.inbox
        while True:
            inbox.engine_waits = False  # the engine asks for a batch
            received = inbox.take()
            while received is None:
                if link.intake_done.is_set():
                    return
                inbox.ready.clear()
                await inbox.ready.wait()
                received = inbox.take()
            inbox.engine_waits = True  # until it asks for the next: it takes this one, then waits for room
            yield self._chunk(received)  # taken by the engine in this event-loop step

    def _chunk(self, received: Received) -> Chunk:
        messages, connection = received.messages, received.connection
        repeats, marks = self.repeats, ()
        if connection is None:  # an ended connection's: never acknowledged, never filtered
            taken, mids = messages, []
        elif repeats is not None and connection == repeats.connection:
            taken, mids, kept = repeats.sort(messages)
            if kept:
                marks = ({"u": kept},)
        else:
            taken, mids = messages, [m.mid for m in messages if m.qos]
        stream = self.topics.stream
        return Chunk(ChunkKind.ADDRESSED, names=[stream(m.topic.value) for m in taken],
                     payloads=[_payload(m) for m in taken], arrival=received.arrival,
                     ack=MqttAcks(connection, mids) if mids and connection is not None else None, marks=marks)

    def acknowledge(self, tokens: Sequence[MqttAcks]) -> None:
        """PUBACKs for the tokens' packet ids of the current connection (in the order given); an earlier
        connection's are left to the broker's redelivery."""
        link = self.link
        acked = link.acknowledge([(t.connection, t.mids) for t in tokens])
        if self.repeats is not None and acked:
            self.repeats.acked(acked, link.connection)

    def stop_intake(self) -> None:
        """Receive no more (unsubscribing where the session is not kept); what was received is still yielded."""
        self.link.stop_intake()

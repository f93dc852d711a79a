"""The MQTT input's QoS 1 messages with durable state: repeats the broker sends again are acknowledged, never processed.

:class:`RedeliveryFilter` is made by durable state (stream/daemon/durability.py) and given, when they are built, to
the link (:class:`~stream.daemon.sources.MqttLink`, the session: CONNACKs, DUP flags, our publishes) and to the input
source (:class:`~stream.daemon.mqtt_source.MqttSource`, the data: each batch); stream.state.redelivery says how a
repeat is told apart from a new message:

- the link calls :meth:`~RedeliveryFilter.connected` at each CONNACK, with the connection's number and its
  session-present flag; keeps in ``dups`` the current connection's QoS 1 packet ids whose DUP flag was set, as paho
  parses each PUBLISH; and calls :meth:`~RedeliveryFilter.published` for each message it hands paho (ours, after a
  PUBACK: the evidence that the broker has it);
- the source calls :meth:`~RedeliveryFilter.sort` with each batch of the current connection as the engine takes it:
  repeats are dropped (counted), the others taken, every QoS 1 packet id goes into the chunk's acknowledgement, and
  the kept packet ids and digests into a journal mark the engine writes after the chunk's readings (the same sync
  makes both durable);
- the source reports the PUBACKs it queued (:meth:`~RedeliveryFilter.acked`), and durable state drops the entries
  the broker confirmed (:meth:`~RedeliveryFilter.confirm`) after each sync.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from stream.daemon.sources import published
from stream.state.redelivery import Redeliveries

__all__ = ["RedeliveryFilter"]


class RedeliveryFilter:
    """The redelivery table of a broker session, fed by the link and the source it was given to.

    ``persistent``: the session outlives a connection (else nothing is ever redelivered); ``on_repeat``: called for
    each repeat dropped (a metric)."""

    def __init__(self, table: Redeliveries, *, persistent: bool, on_repeat: Callable[[], None]) -> None:
        self.table = table
        self.persistent = persistent
        self.on_repeat = on_repeat
        self.connection: int | None = None  # the number of the connection of the last CONNACK
        self.dups: set[int] = set()  # its QoS 1 packet ids received with the DUP flag (filled by the link)
        self.pubs: deque[tuple[int, Any]] = deque()  # its QoS >= 1 publishes of ours: (number, paho message info)
        self.sent = 0  # messages handed to paho on it
        self.confirmed = 0  # the number of its last publish the broker confirmed

    # -- called by the link --------------------------------------------------------------------------------------
    def connected(self, connection: int, session_present: bool) -> None:
        """The CONNACK of connection number ``connection`` (``session_present``: the broker kept the session)."""
        self.dups.clear()  # the earlier connection's ids: never looked at again (its backlog is not filtered)
        self.connection, self.sent, self.confirmed = connection, 0, 0
        self.pubs.clear()
        self.table.connected(session_present=session_present if self.persistent else False)

    def published(self, connection: int, info: Any, qos: int) -> None:
        """A message handed to paho on connection ``connection`` (``info``: its message info)."""
        if connection == self.connection:
            self.sent += 1
            if qos:
                self.pubs.append((self.sent, info))

    # -- called by the source ------------------------------------------------------------------------------------
    def sort(self, batch: list[Any]) -> tuple[list[Any], list[int], list[list[int]]]:
        """A batch of the current connection, as the engine takes it: ``(taken, mids, kept)``, the messages that are
        not repeats, the packet ids of every QoS 1 message (repeats included: all are acknowledged once the chunk is
        durable) and the ``[mid, digest]`` entries kept (the journal mark to write after the taken readings)."""
        table, dups = self.table, self.dups
        digest = table.digest
        mids, taken, kept = [], [], []
        for m in batch:
            if not m.qos:
                taken.append(m)
                continue
            mid = m.mid
            mids.append(mid)
            d = digest(m.topic.value, m.payload)
            if table.is_repeat(mid, d, dup=mid in dups):
                table.dropped += 1
                self.on_repeat()
                continue
            table.keep(mid, d)
            kept.append([mid, d])
            taken.append(m)
        return taken, mids, kept

    def acked(self, mids: list[int], connection: int) -> None:
        """PUBACKs of ``mids`` were queued on connection ``connection``, up now."""
        if mids and connection == self.connection:
            self.table.acked(mids, self.sent)

    # -- called by durable state ---------------------------------------------------------------------------------
    def confirm(self, connection: int, connected: bool) -> None:
        """Drop the entries whose acknowledgement the broker has (see stream.state.redelivery); ``connection``: the
        link's current one (``connected``: up)."""
        pubs = self.pubs
        while pubs and published(pubs[0][1]):
            self.confirmed = pubs.popleft()[0]
        self.table.confirm(self.confirmed, connected=connected and connection == self.connection)

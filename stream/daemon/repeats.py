"""The MQTT link's QoS 1 input with durable state: repeats the broker sends again are acknowledged, never processed.

:class:`RedeliveryFilter` is given to :class:`~stream.daemon.sources.MqttLink` when it is built (durable state makes
it, stream/daemon/durability.py); the link calls it where a connection's packets pass (stream.state.redelivery says
how a repeat is told apart from a new message):

- :meth:`~RedeliveryFilter.connected` at each CONNACK, with its session-present flag;
- ``dups``, the set the link keeps of the current connection's QoS 1 packet ids whose DUP flag was set, as paho
  parses each PUBLISH;
- :meth:`~RedeliveryFilter.published` for each message the link hands paho (ours, after a PUBACK: the evidence that
  the broker has it);
- :meth:`~RedeliveryFilter.deliver` with each batch of received messages: repeats are dropped (counted), the others
  processed, and every QoS 1 packet id is kept to be acknowledged once the journal holds the batch; the packet ids
  and digests of the processed ones are journaled as a mark after their readings (the same sync makes both
  durable).

Durable state takes the packet ids to acknowledge after each sync (:meth:`~RedeliveryFilter.take_acks`), reports the
PUBACKs it queued (:meth:`~RedeliveryFilter.acked`) and drops the entries the broker confirmed
(:meth:`~RedeliveryFilter.confirm`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from stream.daemon.sources import published
from stream.state.redelivery import Redeliveries

__all__ = ["RedeliveryFilter"]

Acks = list[tuple[Any, list[int]]]  # (client of the connection, packet ids of a batch)


class RedeliveryFilter:
    """The redelivery table of a broker session, fed by the link it was given to.

    ``persistent``: the session outlives a connection (else nothing is ever redelivered); ``mark``: the journal's
    mark writer; ``on_repeat``: called for each repeat dropped (a metric); ``wake``: called when a batch had repeats
    (their acknowledgements wait for a sync)."""

    def __init__(self, table: Redeliveries, *, persistent: bool, mark: Callable[[dict[str, Any]], None],
                 on_repeat: Callable[[], None], wake: Callable[[], None]) -> None:
        self.table = table
        self.persistent = persistent
        self.mark = mark
        self.on_repeat = on_repeat
        self.wake = wake
        self.client: Any = None  # the connection of the last CONNACK (aiomqtt client)
        self.dups: set[int] = set()  # its QoS 1 packet ids received with the DUP flag (filled by the link)
        self.pubs: deque[tuple[int, Any]] = deque()  # its QoS >= 1 publishes of ours: (number, paho message info)
        self.sent = 0  # messages handed to paho on it
        self.confirmed = 0  # the number of its last publish the broker confirmed
        self.acks: Acks = []  # QoS 1 messages to acknowledge once the journal holds them

    # -- called by the link --------------------------------------------------------------------------------------
    def connected(self, client: Any, session_present: bool) -> None:
        """The CONNACK of ``client``'s connection (``session_present``: the broker kept the session)."""
        self.dups.clear()  # the earlier connection's ids: never looked at again (its backlog is not filtered)
        self.client, self.sent, self.confirmed = client, 0, 0
        self.pubs.clear()
        self.table.connected(session_present=session_present if self.persistent else False)

    def published(self, client: Any, info: Any, qos: int) -> None:
        """A message handed to paho on ``client`` (``info``: its message info)."""
        if client is self.client:
            self.sent += 1
            if qos:
                self.pubs.append((self.sent, info))

    def deliver(self, batch: list[Any], client: Any, process: Callable[[list[Any]], None]) -> None:
        """``process`` the batch without the repeats; ``client``: the link's current connection (None while a lost
        session's backlog is processed)."""
        if client is None or client is not self.client:  # a lost session's backlog: never repeated
            mids = [m.mid for m in batch if m.qos]
            if mids:
                self.acks.append((client, mids))
            process(batch)
            return
        table, dups = self.table, self.dups
        digest = table.digest
        mids, fresh, kept = [], [], []
        for m in batch:
            if not m.qos:
                fresh.append(m)
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
            fresh.append(m)
        if mids:
            self.acks.append((client, mids))
        process(fresh)
        if kept:  # after the messages' readings: the same sync makes both durable (whole syncs only)
            self.mark({"u": kept})
        if len(fresh) < len(batch):
            self.wake()

    # -- called by durable state ---------------------------------------------------------------------------------
    def take_acks(self) -> Acks:
        """The messages to acknowledge now that the journal holds them (they are forgotten here)."""
        acks, self.acks = self.acks, []
        return acks

    def hand_back(self, acks: Acks) -> None:
        """Messages taken by :meth:`take_acks` whose sync failed: acknowledged after the next one, first."""
        self.acks = acks + self.acks

    def acked(self, acks: Acks, client: Any, connected: bool) -> None:
        """PUBACKs of ``acks`` were queued on the link's current connection ``client`` (if ``connected``)."""
        if connected and client is self.client:
            self.table.acked([mid for c, mids in acks if c is client for mid in mids], self.sent)

    def confirm(self, client: Any, connected: bool) -> None:
        """Drop the entries whose acknowledgement the broker has (see stream.state.redelivery)."""
        pubs = self.pubs
        while pubs and published(pubs[0][1]):
            self.confirmed = pubs.popleft()[0]
        self.table.confirm(self.confirmed, connected=connected and client is self.client)

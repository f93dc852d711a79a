"""The worker's two pipelines to JetStream: a partition's messages pulled ahead in batches, and releases published
with their confirmations tallied, both through core NATS subscriptions whose callbacks only file what arrives.

nats-py's own ``fetch`` waits for each message of a batch with a timer of its own and its ``publish_async`` makes a
future, an inbox and a parsed acknowledgement for every message: together most of a worker's CPU. Here a pull
request for ``batch`` messages is kept open ahead of the worker (the next one goes out when the last ends), so the
server streams a partition while the worker processes what came before; and every release goes out with a reply
subject of one wildcard subscription, whose callback strikes it off the releases waiting for theirs.

What the worker relies on is unchanged: messages come in the consumer's order, with the subject and reply JetStream
gave them (:func:`ack_sequences` reads the sequences and time from the reply), and no state is written before every
release sent is confirmed (:meth:`ReleasePublisher.confirm`).

>>> ack_sequences("$JS.ACK.TOPS_IN.c.1.812.40.1733600000123456789.7")
(812, 40, 1733600000.123457)
>>> ack_sequences("$JS.ACK._.ACC.TOPS_IN.c.1.812.40.1733600000123456789.7.abc")
(812, 40, 1733600000.123457)
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections import deque
from typing import Any

__all__ = ["BatchPull", "PublishNotConfirmed", "ReleasePublisher", "ack_sequences"]

API_PREFIX = "$JS.API"
HEARTBEAT = "100"  # a status message that ends no request
PULL_EXPIRES = 2.0  # seconds a pull request waits on the server for its batch (then a 408 ends it)
PULL_LOST = PULL_EXPIRES + 3.0  # a request unanswered this long was lost with a node: another goes out
PULL_RETRY = 0.1  # seconds at least between requests that came back empty (a status at once: no tight loop)


def ack_sequences(reply: str) -> tuple[int, int, float]:
    """(stream sequence, consumer delivery sequence, JetStream time in seconds) of a message's reply subject
    (``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ns>.<pending>``, or the form with a
    domain and an account hash after ``ACK`` and a token at the end). The time is the broker's, rounded to the
    microsecond as nats-py's metadata rounds it, so every worker makes the same ``ts`` of a release."""
    tokens = reply.split(".")
    at = 5 if len(tokens) == 9 else 7
    if len(tokens) < 9 or tokens[0] != "$JS" or tokens[1] != "ACK":
        raise ValueError("not a JetStream message")
    when = datetime.datetime.fromtimestamp(int(tokens[at + 2]) / 1_000_000_000.0, datetime.UTC)
    return int(tokens[at]), int(tokens[at + 1]), when.timestamp()


class BatchPull:
    """A durable pull consumer's messages, requested ``batch`` at a time, one request open ahead of the reader.

    :meth:`fetch` hands out what arrived (waiting up to ``timeout`` when nothing did). A request asks for what the
    consumer has (``no_wait``) while the last one found messages, else it waits on the server up to
    ``PULL_EXPIRES`` for them. It ends when its batch is delivered or a status (no messages, request timeout, a
    leadership change) says so; the next goes out then if fewer than ``batch`` messages wait to be read, else when
    the reader takes them (a request that came back empty at once is asked again by the reader, ``PULL_RETRY``
    later). A status other than those (the consumer was deleted: another worker owns the partition now) makes the
    next :meth:`fetch` raise."""

    def __init__(self, nc: Any, stream: str, consumer: str, batch: int, arrived: asyncio.Event | None = None) -> None:
        self.nc, self.batch = nc, max(1, int(batch))
        self.subject = f"{API_PREFIX}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.drain = json.dumps({"batch": self.batch, "no_wait": True}).encode()  # what is there, then a 404
        self.linger = json.dumps({"batch": self.batch, "expires": int(PULL_EXPIRES * 1e9)}).encode()
        self.backlog = True  # the last request found messages: the next asks for what is there (else: it waits)
        self.arrived = arrived or asyncio.Event()  # set by every message (shared by a worker's partitions)
        self.messages: deque[Any] = deque()
        self.owed = 0  # messages the open request may still deliver (0: no request open)
        self.got = 0  # messages the open request delivered
        self.asked_at = 0.0
        self.broken = ""  # a status that ends the consumer for this reader
        self.inbox = ""
        self.sub: Any = None

    async def start(self) -> None:
        self.inbox = self.nc.new_inbox()
        self.sub = await self.nc.subscribe(self.inbox, cb=self._on_message, pending_msgs_limit=0,
                                           pending_bytes_limit=0)
        await self._ask()

    @property
    def ready(self) -> bool:
        return bool(self.messages) or bool(self.broken)

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        if self.broken:
            raise ConnectionError(f"pull consumer ended ({self.broken})")
        if not self.messages and timeout > 0:
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), timeout)
            except TimeoutError:
                pass
        n = min(batch, len(self.messages))
        out = [self.messages.popleft() for _ in range(n)]
        waited = time.monotonic() - self.asked_at
        if self.owed and waited > PULL_LOST:
            self.owed = 0
        if not self.owed and len(self.messages) < self.batch and waited >= PULL_RETRY:
            await self._ask()
        return out

    async def unsubscribe(self) -> None:
        if self.sub is not None:
            await self.sub.unsubscribe()

    async def _ask(self) -> None:
        self.owed, self.got, self.asked_at = self.batch, 0, time.monotonic()
        await self.nc.publish(self.subject, self.drain if self.backlog else self.linger, reply=self.inbox)

    async def _on_message(self, msg: Any) -> None:
        headers = msg.headers
        status = headers.get("Status") if headers else None
        if status is None:
            self.messages.append(msg)
            self.owed -= 1
            self.got += 1
            self.backlog = True
        elif status == HEARTBEAT:
            return
        else:  # the request ended: 404 no messages, 408 expired, 409 a leadership change or the consumer's end
            self.owed = 0
            self.backlog = self.got > 0
            if status == "409" and "deleted" in str(headers.get("Description", "")).lower():
                self.broken = "consumer deleted"
        self.arrived.set()
        # after a 404 the next request waits on the server; any other empty answer is asked again by fetch, later
        useful = self.got or status == "404" or time.monotonic() - self.asked_at >= PULL_EXPIRES / 2
        if self.owed <= 0 and len(self.messages) < self.batch and not self.broken and useful:
            await self._ask()


class PublishNotConfirmed(RuntimeError):
    """A release sent was refused by JetStream or not confirmed in time (no value or secret in the message)."""


class ReleasePublisher:
    """Releases published to JetStream with a message id, each with the reply subject ``<inbox>.<n>`` of one
    wildcard subscription; its callback strikes ``n`` off :attr:`waiting` (an error reply is counted refused).
    :meth:`forget` drops what waits (the worker makes those releases again); a late reply to one forgotten finds no
    ``n`` to strike and is ignored."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self.inbox = ""
        self.sent = 0
        self.waiting: set[int] = set()
        self.refused = 0
        self.confirmed = 0  # since the last :meth:`confirm`
        self.settled = asyncio.Event()
        self.sub: Any = None

    async def start(self) -> None:
        self.inbox = self.nc.new_inbox()
        self.sub = await self.nc.subscribe(f"{self.inbox}.*", cb=self._on_reply, pending_msgs_limit=0,
                                           pending_bytes_limit=0)

    async def send(self, subject: str, payload: bytes, msg_id: str) -> None:
        n = self.sent = self.sent + 1
        self.waiting.add(n)
        await self.nc.publish(subject, payload, reply=f"{self.inbox}.{n}", headers={"Nats-Msg-Id": msg_id})

    async def confirm(self, timeout: float) -> int:
        """Wait until every release sent is confirmed; returns how many were since the last call. Raises
        :class:`PublishNotConfirmed` (and forgets the rest) when one was refused or ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        while self.waiting and not self.refused:
            self.settled.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(self.settled.wait(), left)
            except TimeoutError:
                break
        if self.waiting or self.refused:
            refused, unconfirmed = self.refused, len(self.waiting)
            self.forget()
            raise PublishNotConfirmed(f"{refused} releases refused, {unconfirmed} not confirmed in {timeout:g} s")
        done, self.confirmed = self.confirmed, 0
        return done

    def forget(self) -> None:
        self.waiting.clear()
        self.refused = self.confirmed = 0

    async def _on_reply(self, msg: Any) -> None:
        n = int(msg.subject.rsplit(".", 1)[1])
        if n not in self.waiting:
            return
        self.waiting.discard(n)
        status = msg.headers.get("Status") if msg.headers else None
        if status is not None or b'"error"' in msg.data:  # 503: no stream took it; an error: the stream refused it
            self.refused += 1
        else:
            self.confirmed += 1
        if not self.waiting or self.refused:
            self.settled.set()

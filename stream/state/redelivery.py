"""Telling a broker's redelivery from a new message, so that a QoS 1 reading without ``seq`` is never counted twice.

MQTT QoS 1 is at least once: a message whose PUBACK did not reach the broker (the daemon was killed between the
journal sync and the acknowledgement, or the connection broke) is sent again on the next connection of the same
session, with its original packet id and the DUP flag set (MQTT 3.1.1 s. 4.4, MQTT 5 s. 4.4). Its readings are
already in the journal (re-processed after a restart) or already processed (after a reconnect); processing them
again would make one more tick, and a reading counted twice is protected at 2 eps, not eps.

So the daemon keeps, per broker session, the messages it processed whose acknowledgement the broker may not have:
packet id -> a keyed 64-bit digest of (topic, payload) (never the payload itself). A message that arrives with DUP
set, whose packet id is kept with the same digest, is the repeat: it is acknowledged and not processed. Anything
else is new. Entries go once the broker has the PUBACK:

- a QoS >= 1 publish the daemon handed over after the PUBACK was confirmed by the broker (TCP keeps the order, the
  broker handles packets in order);
- or a new message (DUP clear) arrived on a later connection: the broker resends what is unacknowledged first
  (a repeat recognised on the new connection belongs to it from then on: its PUBACK leaves on that connection and
  may be lost with it, so it stays until the broker has that PUBACK);
- or the same packet id arrived again with DUP clear (the broker reused it: the old one was acknowledged);
- or, without such evidence (no QoS 1 output), ``grace`` seconds after the PUBACK left on a connection still up;
- and all of them when the broker lost the session (nothing can be redelivered).

The changes are journaled as marks (``{"u": [[mid, digest], ...]}`` kept, ``{"k": [mid, ...]}`` gone,
``{"n": 1}`` a new connection, ``{"o": 1}`` the older connections' entries gone, ``{"x": 1}`` all gone) and the
whole table is in every checkpoint, so a restart knows what the broker may still redeliver.

>>> r = Redeliveries(b"k" * 32)
>>> r.connected(session_present=False)
>>> d = r.digest("meters/a/reading", b"5")
>>> r.is_repeat(7, d, dup=True), r.keep(7, d), r.is_repeat(7, d, dup=True), r.is_repeat(7, d, dup=False)
(False, None, True, False)
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from hashlib import blake2b
from typing import Any

__all__ = ["Redeliveries"]


class Redeliveries:
    """The unconfirmed QoS 1 messages of one broker session (at most one per packet id: at most 65,535)."""

    def __init__(self, key: bytes, *, grace: float = 60.0, mark: Callable[[dict[str, Any]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._key = key[:64]
        self.grace = grace
        self.mark = mark or (lambda rec: None)
        self.clock = clock
        self.epoch = 0  # connection number in this process; entries of earlier ones have a smaller epoch
        self.entries: dict[int, tuple[int, int, int]] = {}  # mid -> (digest, epoch, serial)
        self._serial = 0
        self.batches: deque[tuple[int, float, int, list[tuple[int, int]]]] = deque()  # epoch, t, pub_seq, (mid, s)
        self.old_pending = False  # entries of earlier connections wait for the first new message
        self.dropped = 0  # repeats recognised (acknowledged, not processed)

    def digest(self, topic: str, payload: bytes) -> int:
        h = blake2b(topic.encode(), digest_size=8, key=self._key)
        h.update(b"\0")
        h.update(payload)
        return int.from_bytes(h.digest(), "big")

    # -- the connection -------------------------------------------------------------------------------------------
    def connected(self, *, session_present: bool) -> None:
        """A CONNACK: without the session nothing is redelivered, every entry goes."""
        self.epoch += 1
        self.batches.clear()
        if not session_present:
            if self.entries:
                self.entries.clear()
                self.mark({"x": 1})
            self.old_pending = False
        else:
            self.mark({"n": 1})
            self.old_pending = bool(self.entries)

    # -- messages -------------------------------------------------------------------------------------------------
    def is_repeat(self, mid: int, digest: int, *, dup: bool) -> bool:
        """True when the message is the broker's repeat of one already processed (acknowledge it, skip it)."""
        e = self.entries.get(mid)
        if dup:
            if e is None or e[0] != digest:
                return False
            if e[1] != self.epoch:
                # Its PUBACK now goes on this connection and may be lost with it: the entry stays until the broker
                # has that PUBACK (a new message does not clear it, the broker sent this one again before it).
                self.keep(mid, digest)
                self.mark({"u": [[mid, digest]]})
            return True
        if self.old_pending:  # a new message: the broker has resent everything unacknowledged before it
            self._drop_old()
        return False

    def keep(self, mid: int, digest: int) -> None:
        """Remember a processed message until the broker has its PUBACK (replaces an entry of a reused id)."""
        self._serial += 1
        self.entries[mid] = (digest, self.epoch, self._serial)

    def _drop_old(self) -> None:
        self.old_pending = False
        epoch = self.epoch
        old = [mid for mid, e in self.entries.items() if e[1] < epoch]
        for mid in old:
            del self.entries[mid]
        if old:
            self.mark({"o": 1})

    # -- acknowledgements and their evidence ----------------------------------------------------------------------
    def acked(self, mids: list[int], pub_seq: int) -> None:
        """PUBACKs of ``mids`` were queued on the current connection after ``pub_seq`` publishes were handed over."""
        entries = self.entries
        items = [(m, e[2]) for m in mids if (e := entries.get(m)) is not None and e[1] == self.epoch]
        if items:
            self.batches.append((self.epoch, self.clock(), pub_seq, items))

    def confirm(self, confirmed_pubs: int, *, connected: bool) -> int:
        """Drop the entries whose PUBACK the broker has: a publish handed over after it was confirmed
        (``confirmed_pubs`` publishes of this connection are), or ``grace`` seconds passed on a connection still
        up. Returns how many went."""
        batches, entries = self.batches, self.entries
        now = self.clock()
        gone: list[int] = []
        while batches:
            epoch, t, pub_seq, items = batches[0]
            if epoch != self.epoch or not connected or (confirmed_pubs <= pub_seq and now - t < self.grace):
                break
            batches.popleft()
            for mid, serial in items:
                e = entries.get(mid)
                if e is not None and e[2] == serial:
                    del entries[mid]
                    gone.append(mid)
        if gone:
            self.mark({"k": gone})
        return len(gone)

    # -- persistence ----------------------------------------------------------------------------------------------
    def snapshot(self) -> list[list[int]]:
        """The table as a checkpoint keeps it: ``[[mid, digest], ...]``."""
        return [[mid, e[0]] for mid, e in self.entries.items()]

    def load(self, rows: list[list[int]]) -> None:
        """Entries of a checkpoint (all of an earlier connection)."""
        for mid, d in rows:
            self.keep(int(mid), int(d))

    def replay_mark(self, rec: dict[str, Any]) -> None:
        """Apply one journaled mark (restart), in journal order."""
        if "u" in rec:
            for mid, d in rec["u"]:
                self.keep(int(mid), int(d))
        elif "k" in rec:
            for mid in rec["k"]:
                self.entries.pop(int(mid), None)
        elif "n" in rec:
            self.epoch += 1
        elif "o" in rec:
            epoch = self.epoch
            for mid in [m for m, e in self.entries.items() if e[1] < epoch]:
                del self.entries[mid]
        elif "x" in rec:
            self.entries.clear()

"""The publish queue never drops a release: past its limit it says there is no room (intake waits); while
disconnected it spills to disk in order, and its disk budget ends the room, never a message."""

from __future__ import annotations

import asyncio
from pathlib import Path

from stream.core.sinks import PublishQueue


def test_publish_queue_never_drops_and_spills_to_disk_while_disconnected(tmp_path: Path) -> None:
    """Nothing is dropped: past the limit the queue says "no room" (intake waits); while disconnected, with a spill,
    the rest goes to disk in order and comes back in order; the disk budget ends the room, never a message."""
    from stream.state.spill import Spill

    async def go() -> None:
        q = PublishQueue(limit=3)
        for i in range(5):
            q.put("t", str(i).encode(), False, 1)
        q.requeue([("t", b"x", False, 1)])
        assert [p for _, p, _, _ in q.items] == [b"x", b"0", b"1", b"2", b"3", b"4"] and q.take_dropped() == 0
        assert not q.has_room()
        q.items.clear()
        q.spill = Spill.open(tmp_path, max_bytes=70, fsync=False)
        q.set_connected(False)
        for i in range(8):
            q.put("t", f"m{i}".encode(), False, 1)
        assert len(q.items) == 3 and len(q.spill) == 5 and len(q) == 8
        assert not q.has_room()  # the disk budget (70 bytes) is reached: intake waits
        q.put("t", b"m8", False, 1)  # made anyway (a period tick): kept, in memory
        q.set_connected(True)
        out = []
        while len(q):
            while q.items:
                out.append(q.items.popleft()[1])
            q.taken()
        assert out[:3] == [b"m0", b"m1", b"m2"] and sorted(out) == [f"m{i}".encode() for i in range(9)]
        assert q.has_room()

    asyncio.run(go())

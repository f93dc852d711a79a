"""The disk part of the outbox: releases that do not fit in the publish queue while the broker is unreachable.

With durable state, :class:`~stream.core.sinks.PublishQueue` appends what does not fit in memory (``publish_queue``
messages) to ``outbox-<g>.spill`` in the data directory, in order, and reads it back as the queue drains after the
reconnection. Records: ``!I`` topic length, topic, ``!I`` payload length, payload, ``!B`` retain, ``!I`` releases.

``outbox.pos`` (JSON ``{"gen", "offset"}``, replaced atomically) says where the unread part starts. It is written
*after* each checkpoint's commit (whose outbox holds what was read back into memory): a crash between the two reads
some messages twice (byte-identical repeats, as the README allows), never loses one. A spill read to its end at a
checkpoint is deleted and the next one starts empty. A torn last record (a crash while appending) is cut off.

``max_bytes`` (``[output] outbox_max_bytes``, 0: no limit) bounds the file: past it :meth:`Spill.append` refuses and
the daemon's intake waits (nothing is dropped).
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path

__all__ = ["Spill"]

Message = tuple[str, bytes, bool, int]
_LEN = struct.Struct("!I")
_TAIL = struct.Struct("!BI")


def _encode(m: Message) -> bytes:
    topic = m[0].encode()
    payload = bytes(m[1])
    return b"".join((_LEN.pack(len(topic)), topic, _LEN.pack(len(payload)), payload, _TAIL.pack(int(m[2]), m[3])))


class Spill:
    """An append-only FIFO of messages in one file, with a durable read position; use :meth:`open`."""

    def __init__(self, folder: Path, gen: int, offset: int, max_bytes: int = 0, fsync: bool = True) -> None:
        self.folder = folder
        self.gen = gen
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.path = folder / f"outbox-{gen}.spill"
        self.file = self.path.open("a+b")
        os.chmod(self.path, 0o600)
        self.end = self._valid_end(offset)
        self.read_pos = min(offset, self.end)
        self.count = self._count(self.read_pos, self.end)  # unread messages

    @classmethod
    def open(cls, folder: str | os.PathLike[str], max_bytes: int = 0, fsync: bool = True) -> Spill:
        folder = Path(folder)
        pos = folder / "outbox.pos"
        gen, offset = 0, 0
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            d = json.loads(pos.read_text())
            gen, offset = int(d["gen"]), int(d["offset"])
        return cls(folder, gen, offset, max_bytes, fsync)

    def __len__(self) -> int:
        return self.count

    # -- writing ------------------------------------------------------------------------------------------------
    def room(self) -> bool:
        return not self.max_bytes or self.end - self.read_pos < self.max_bytes

    def append(self, messages: Iterable[Message]) -> bool:
        """Append ``messages`` in order; False (nothing written) when the disk budget is reached."""
        if not self.room():
            return False
        messages = list(messages)
        data = b"".join(_encode(m) for m in messages)
        self.file.seek(0, os.SEEK_END)
        self.file.write(data)
        self.end += len(data)
        self.count += len(messages)
        return True

    def sync(self) -> None:
        """Make what was appended durable (before a checkpoint's commit)."""
        self.file.flush()
        if self.fsync:
            os.fsync(self.file.fileno())

    def commit(self, read_pos: int | None = None) -> None:
        """After a checkpoint's commit: record the read position it covers (``read_pos``, taken at its cut: what
        was read from the spill after the cut is not in the stored outbox; default: the position now); start a new
        file when this one was read out."""
        if read_pos is not None and read_pos != self.read_pos:
            self._write_pos(read_pos)
            return
        if self.read_pos == self.end and self.end > 0:
            old = self.path
            self.file.close()
            self.gen += 1
            self.path = self.folder / f"outbox-{self.gen}.spill"
            self.file = self.path.open("a+b")
            os.chmod(self.path, 0o600)
            self.end = self.read_pos = 0
            self._write_pos()
            with contextlib.suppress(OSError):
                old.unlink()
        else:
            self._write_pos()

    def _write_pos(self, read_pos: int | None = None) -> None:
        tmp = self.folder / "outbox.pos.tmp"
        with tmp.open("w") as f:
            f.write(json.dumps({"gen": self.gen, "offset": self.read_pos if read_pos is None else read_pos}))
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, self.folder / "outbox.pos")

    # -- reading ------------------------------------------------------------------------------------------------
    def read(self, n: int) -> list[Message]:
        """Up to ``n`` messages from the front (they leave the spill: the caller queues them in memory)."""
        out: list[Message] = []
        if not self.count:
            return out
        self.file.flush()
        f = self.file
        f.seek(self.read_pos)
        while len(out) < n and self.read_pos < self.end:
            m, self.read_pos = self._record(f, self.read_pos)
            out.append(m)
        self.count -= len(out)
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()

    # -- file layout --------------------------------------------------------------------------------------------
    @staticmethod
    def _record(f, pos: int) -> tuple[Message, int]:
        (tl,) = _LEN.unpack(f.read(4))
        topic = f.read(tl).decode()
        (pl,) = _LEN.unpack(f.read(4))
        payload = f.read(pl)
        retain, n = _TAIL.unpack(f.read(_TAIL.size))
        return (topic, payload, bool(retain), n), pos + 8 + tl + pl + _TAIL.size

    def _valid_end(self, offset: int) -> int:
        """The end of the last whole record (a torn tail is cut off)."""
        f = self.file
        f.flush()
        size = f.seek(0, os.SEEK_END)
        pos = min(offset, size)
        while pos < size:
            f.seek(pos)
            head = f.read(4)
            if len(head) < 4:
                break
            (tl,) = _LEN.unpack(head)
            f.seek(pos + 4 + tl)
            head = f.read(4)
            if len(head) < 4:
                break
            (pl,) = _LEN.unpack(head)
            nxt = pos + 8 + tl + pl + _TAIL.size
            if nxt > size:
                break
            pos = nxt
        if pos < size:
            f.truncate(pos)
        return pos

    def _count(self, start: int, end: int) -> int:
        f = self.file
        f.flush()
        n, pos = 0, start
        while pos < end:
            f.seek(pos)
            (tl,) = _LEN.unpack(f.read(4))
            f.seek(pos + 4 + tl)
            (pl,) = _LEN.unpack(f.read(4))
            pos += 8 + tl + pl + _TAIL.size
            n += 1
        return n

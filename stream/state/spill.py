"""The disk part of the outbox: releases that do not fit in the publish queue while the broker is unreachable.

With durable state, :class:`~stream.core.sinks.PublishQueue` appends what does not fit in memory (``publish_queue``
messages) to ``outbox-<g>.spill`` in the data directory, in order, and reads it back as the queue drains after the
reconnection. Records: ``!I`` topic length, topic, ``!I`` payload length, payload, ``!B`` retain, ``!I`` releases.

``outbox.pos`` (JSON ``{"gen", "offset"}``, replaced atomically) says where the unread part starts. It is written
*after* each checkpoint's commit (whose outbox holds what was read back into memory): a crash between the two reads
some messages twice (byte-identical repeats, as docs/delivery.md allows), never loses one. A spill read to its end at a
checkpoint is deleted and the next one starts empty. A torn last record (a crash while appending) is cut off.
Every file here is made mode 0600 (releases waiting for the broker are private until they are published).

Appends are written 64 KiB at a time and at each :meth:`Spill.sync`, through the daemon's
:class:`~stream.state.disk.DiskRetry`: until then, and while the disk refuses them (full), they stay in memory behind
the file (``tail``) and are read back from there like the rest (a checkpoint's :meth:`Spill.sync` waits until the
disk takes them). ``max_bytes`` (``[output] outbox_max_bytes``,
0: no limit) bounds the spill: past it :meth:`Spill.append` refuses and the daemon's intake waits (nothing is
dropped).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

from stream.state.disk import DiskRetry

__all__ = ["Spill"]

Message = tuple[str, bytes, bool, int]
_LEN = struct.Struct("!I")
_TAIL = struct.Struct("!BI")
_WRITE_AT = 1 << 16  # appended bytes written at once (and at each sync)
_READ_AT = 1 << 18  # bytes read at once


def _encode(m: Message) -> bytes:
    topic = m[0].encode()
    payload = bytes(m[1])
    return b"".join((_LEN.pack(len(topic)), topic, _LEN.pack(len(payload)), payload, _TAIL.pack(int(m[2]), m[3])))


def _private_fd(path: Path, flags: int) -> int:
    """``path`` opened with ``flags`` (created if missing), mode 0600 whatever the umask or an older file said."""
    fd = os.open(path, flags | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def _size(buf: bytes, off: int) -> int | None:
    """The size of the record at ``buf[off:]``, None unless all of it is there."""
    if len(buf) - off < 4:
        return None
    (tl,) = _LEN.unpack_from(buf, off)
    if len(buf) - off < 8 + tl:
        return None
    (pl,) = _LEN.unpack_from(buf, off + 4 + tl)
    size = 8 + tl + pl + _TAIL.size
    return size if len(buf) - off >= size else None


def _decode(buf: bytes, off: int) -> Message:
    """The record at ``buf[off:]``."""
    (tl,) = _LEN.unpack_from(buf, off)
    (pl,) = _LEN.unpack_from(buf, off + 4 + tl)
    retain, k = _TAIL.unpack_from(buf, off + 8 + tl + pl)
    return buf[off + 4:off + 4 + tl].decode(), buf[off + 8 + tl:off + 8 + tl + pl], bool(retain), k


class Spill:
    """An append-only FIFO of messages in one file, with a durable read position; use :meth:`open`.

    Offsets count the bytes of the file and then of ``tail`` (appended, not written yet: the disk refused it)."""

    def __init__(self, folder: Path, gen: int, offset: int, max_bytes: int = 0, fsync: bool = True,
                 disk: DiskRetry | None = None, pos_written: tuple[int, int] | None = None) -> None:
        self.folder = folder
        self.gen = gen
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.disk = disk if disk is not None else DiskRetry(folder)
        self.path = folder / f"outbox-{gen}.spill"
        self.fd = _private_fd(self.path, os.O_RDWR | os.O_APPEND)
        self.written = os.fstat(self.fd).st_size  # bytes in the file
        self.tail = bytearray()
        self.read_pos = min(offset, self.written)
        self.count = 0  # unread messages
        end = self.read_pos
        for after, _, _ in self._records(self.read_pos, self.written):
            self.count += 1
            end = after
        if end < self.written:  # a torn last record: cut off
            os.ftruncate(self.fd, end)
            self.written = end
        self.pos_written = pos_written  # (gen, offset) in outbox.pos
        self.stale: list[Path] = []  # read-out files to delete once outbox.pos no longer names them

    @classmethod
    def open(cls, folder: str | os.PathLike[str], max_bytes: int = 0, fsync: bool = True,
             disk: DiskRetry | None = None) -> Spill:
        folder = Path(folder)
        pos = folder / "outbox.pos"
        gen, offset, written = 0, 0, None
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            d = json.loads(pos.read_text())
            gen, offset = int(d["gen"]), int(d["offset"])
            written = (gen, offset)
        return cls(folder, gen, offset, max_bytes, fsync, disk, written)

    def __len__(self) -> int:
        return self.count

    @property
    def end(self) -> int:
        return self.written + len(self.tail)

    # -- writing ------------------------------------------------------------------------------------------------
    def room(self) -> bool:
        return not self.max_bytes or self.end - self.read_pos < self.max_bytes

    def append(self, messages: Iterable[Message]) -> bool:
        """Append ``messages`` in order; False (nothing appended) when the disk budget is reached. What the disk
        refuses stays in memory, in order, until a later write succeeds."""
        if not self.room():
            return False
        messages = list(messages)
        self.tail += b"".join(_encode(m) for m in messages)
        self.count += len(messages)
        if len(self.tail) >= _WRITE_AT and "spill" not in self.disk.waiting:  # (a refused write is retried by
            self.disk.attempt("spill", self._write_tail)  # the daemon's checkpoint, not at every append)
        return True

    def _write_tail(self) -> None:
        """Write ``tail`` to the file; what the disk refuses stays in it (``OSError``)."""
        tail = self.tail
        while tail:
            n = os.write(self.fd, tail)
            del tail[:n]
            self.written += n

    def sync(self) -> None:
        """Make what was appended durable (before a checkpoint's commit): :class:`~stream.state.disk.DiskRefused`
        when the disk refuses it (the caller retries)."""
        with self.disk.writing("spill"):
            self._write_tail()
            if self.fsync:
                os.fsync(self.fd)

    def commit(self, read_pos: int | None = None) -> None:
        """After a checkpoint's commit: record the read position it covers (``read_pos``, taken at its cut: what
        was read from the spill after the cut is not in the stored outbox; default: the position now); start a new
        file when this one was read out. Safe to call again after a refusal of the disk."""
        if read_pos is not None and read_pos != self.read_pos:
            self._write_pos(self.gen, read_pos)
            return
        if self.read_pos == self.end and self.end > 0:
            with self.disk.writing("spill"):
                fd = _private_fd(self.folder / f"outbox-{self.gen + 1}.spill", os.O_RDWR | os.O_APPEND)
            os.close(self.fd)
            self.stale.append(self.path)
            self.gen += 1
            self.path = self.folder / f"outbox-{self.gen}.spill"
            self.fd = fd
            self.written = self.read_pos = 0
            self.tail.clear()
        self._write_pos(self.gen, self.read_pos)
        while self.stale:
            with contextlib.suppress(OSError):
                self.stale[-1].unlink()
            self.stale.pop()

    def _write_pos(self, gen: int, offset: int) -> None:
        """``outbox.pos`` := ``(gen, offset)``, replaced atomically, mode 0600 (nothing written when it says so)."""
        if self.pos_written == (gen, offset):
            return
        tmp = self.folder / "outbox.pos.tmp"
        with self.disk.writing("outbox_position"):
            fd = _private_fd(tmp, os.O_WRONLY | os.O_TRUNC)
            try:
                data = json.dumps({"gen": gen, "offset": offset}).encode()
                if os.write(fd, data) != len(data):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.folder / "outbox.pos")
        self.pos_written = (gen, offset)

    # -- reading ------------------------------------------------------------------------------------------------
    def read(self, n: int) -> list[Message]:
        """Up to ``n`` messages from the front (they leave the spill: the caller queues them in memory)."""
        out: list[Message] = []
        if not self.count or n <= 0:
            return out
        pos = self.read_pos
        for after, buf, off in self._records(pos, self.end):
            out.append(_decode(buf, off))
            pos = after
            if len(out) == n:
                break
        self.read_pos = pos
        self.count -= len(out)
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    # -- file layout --------------------------------------------------------------------------------------------
    def _bytes(self, pos: int, size: int) -> bytes:
        """``size`` bytes from offset ``pos``: from the file, then from ``tail``."""
        data = os.pread(self.fd, min(size, self.written - pos), pos) if pos < self.written else b""
        if len(data) < size:
            start = pos + len(data) - self.written
            data += bytes(self.tail[start:start + size - len(data)])
        return data

    def _records(self, pos: int, end: int) -> Iterator[tuple[int, bytes, int]]:
        """The whole records from offset ``pos`` up to ``end``, read 256 KiB at a time: (the offset after the
        record, a buffer, the record's place in it). A torn last record ends them."""
        buf, base = b"", pos
        while pos < end:
            off = pos - base
            size = _size(buf, off)
            if size is None:  # the record goes on past what was read
                more = self._bytes(base + len(buf), min(_READ_AT, end - base - len(buf)))
                if not more:
                    return
                buf, base = buf[off:] + more, pos
                continue
            pos += size
            yield pos, buf, off

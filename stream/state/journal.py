"""The input journal: a reading is *accepted* once it is appended here and synced to disk.

Segments ``seg-<n>.log`` (mode 0600: readings are private data at rest) hold one JSON line per accepted reading,
or per accepted message with several readings (``"v"`` an array; ``"t"`` one time for all or an array; ``"q"``
absent or an array, ``null`` for a reading without ``seq``). A line is written whole or not at all as far as replay
goes: a torn line yields none of its readings. A segment starts with ``{"f":2}``; each sync ends what it writes with
``{"e":1}``, and replay takes whole syncs only: the lines after the last end mark (a write cut by a crash, never
acknowledged) yield nothing. Lines without ``"v"`` are marks of :mod:`stream.state.redelivery`, handed to ``on_mark``.
Appends are buffered and synced in batches (``sync``); only after a sync does the daemon acknowledge QoS 1 messages.
A checkpoint rotates to a new segment first (unless the current one holds nothing yet), so the checkpoint covers
exactly the segments before it; a restart re-processes the segments from the checkpoint's position on (re-producing
byte-identical releases from the keyed noise) and the covered segments are deleted. A torn last line (a crash in the
middle of a write, never synced, so never acknowledged) is skipped. A write the disk refuses (full) keeps what it did
not write and writes just that, first, the next time (:meth:`Journal.write_durable`).

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> j = Journal.open(d)
>>> j.append("meter-1", 3.0, ts=10.0, seq=1); j.append("meter-2", 4.5, ts=11.0, seq=None)
>>> j.sync()                       # now both are accepted
2
>>> covered = j.rotate()           # a checkpoint covers segments before `covered`
>>> j.append("meter-1", 5.0, ts=12.0, seq=2); _ = j.sync()
>>> restarted = Journal.open(d)    # after a crash: re-process what the checkpoint does not cover
>>> [(r.stream, r.seq) for r in restarted.replay(covered)]
[('meter-1', 2)]
>>> restarted.append_many('"meter-2"', [1.0, 2.5], 12.5, None); _ = restarted.sync()
>>> [(r.value, r.ts, r.seq) for r in Journal.open(d).replay(covered)][-2:]
[(1.0, 12.5, None), (2.5, 12.5, None)]
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Journal", "JournalRecord"]

_SEGMENT = re.compile(r"^seg-(\d{12})\.log$")
_dumps = json.JSONEncoder(separators=(",", ":")).encode
_HEADER = b'{"f":2}\n'  # format 2: replay only what is followed by an end mark
_END = b'{"e":1}\n'  # the end of one sync's write


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One accepted reading, as the daemon saw it (``ts`` is the time used for ticking)."""

    stream: str
    value: float
    ts: float
    seq: int | None


class Journal:
    """Append-only segments in one directory; use :meth:`open`."""

    def __init__(self, directory: Path, segment: int) -> None:
        self.dir = directory
        self.segment = segment
        self._fd = self._open_segment(segment)
        self._buf: list[bytes] = []
        self._ts_obj: object = None
        self._ts_repr = ""
        self.pending_records = 0  # appended, not yet taken for a write
        self.unwritten = b""  # taken for a write and not yet written (a write the disk refused keeps its rest here)
        self.unwritten_records = 0  # the readings in `unwritten`
        self._fsync_owed = False
        self.segment_used = False  # whether the current segment holds more than its header

    @classmethod
    def open(cls, directory: str | os.PathLike[str]) -> Journal:
        """Open the journal; new appends go to a fresh segment after the newest one on disk."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        segs = cls.segments_in(d)
        return cls(d, (segs[-1] + 1) if segs else 1)

    @staticmethod
    def segments_in(d: Path) -> list[int]:
        return sorted(int(m.group(1)) for p in d.iterdir() if (m := _SEGMENT.match(p.name)))

    def _path(self, n: int) -> Path:
        return self.dir / f"seg-{n:012d}.log"

    def _open_segment(self, n: int) -> int:
        fd = os.open(self._path(n), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size < len(_HEADER):  # new, or its header cut by a full disk: (re)written whole
                if size:
                    os.ftruncate(fd, 0)
                if os.write(fd, _HEADER) != len(_HEADER):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            os.close(fd)
            raise
        return fd

    def append_mark(self, rec: dict[str, object]) -> None:
        """Buffer a mark (no reading): written with the next sync, replayed in order through ``on_mark``."""
        self._buf.append(_dumps(rec).encode() + b"\n")

    def append(self, stream: str, value: float, *, ts: float, seq: int | None) -> None:
        """Buffer one reading; it counts as accepted after the next :meth:`sync`."""
        rec = {"s": stream, "v": value, "t": ts}
        if seq is not None:
            rec["q"] = seq
        self._buf.append(json.dumps(rec, separators=(",", ":")).encode() + b"\n")
        self.pending_records += 1

    def append_json(self, stream_json: str, value: float, ts: float, seq: int | None) -> None:
        """:meth:`append` for the hot path: ``stream_json`` is the stream name already JSON-encoded."""
        if ts is not self._ts_obj:  # the readings of one message share their time: format it once
            self._ts_obj, self._ts_repr = ts, (repr(ts) if math.isfinite(ts) else "")
        if self._ts_repr and math.isfinite(value):
            q = "" if seq is None else f',"q":{seq}'
            self._buf.append(f'{{"s":{stream_json},"v":{value!r},"t":{self._ts_repr}{q}}}\n'.encode())
            self.pending_records += 1
        else:
            self.append(json.loads(stream_json), value, ts=ts, seq=seq)

    def append_many(self, stream_json: str, values: list[float], ts: float | list[float],
                    seqs: list[int | None] | None) -> None:
        """Buffer the accepted readings of one message as one line (one reading: the line of :meth:`append_json`);
        ``ts`` is one time for all of them or one per reading, ``seqs`` None when none has a ``seq``."""
        n = len(values)
        if n == 1:
            self.append_json(stream_json, values[0], ts if type(ts) is float else ts[0],  # type: ignore[index]
                             None if seqs is None else seqs[0])
            return
        if not n:
            return
        total = sum(values)
        if seqs is None and type(ts) is float and math.isfinite(ts) and total - total == 0.0:
            if ts is not self._ts_obj:
                self._ts_obj, self._ts_repr = ts, repr(ts)
            self._buf.append(f'{{"s":{stream_json},"v":[{",".join(map(repr, values))}],"t":{self._ts_repr}}}\n'
                             .encode())
        else:  # per-reading times or seqs (or a non-finite number): the general encoder, same format
            rec: dict[str, object] = {"s": json.loads(stream_json), "v": values, "t": ts}
            if seqs is not None:
                rec["q"] = seqs
            self._buf.append(_dumps(rec).encode() + b"\n")
        self.pending_records += n

    def sync(self, *, fsync: bool = True) -> int:
        """Write the buffered readings and (by default) fsync them; returns how many were made durable. A write the
        disk refuses raises ``OSError`` and keeps its rest for the next call."""
        self.take()
        return self.write_durable(fsync=fsync and bool(self.unwritten_records))

    def take(self) -> int:
        """Put the buffered lines, with an end mark, behind what waits to be written (event-loop thread: then
        :meth:`write_durable` may run in a worker thread); returns how many readings they hold."""
        n = self.pending_records
        if self._buf:
            self._buf.append(_END)
            self.unwritten += b"".join(self._buf)
            self._buf.clear()
        self.unwritten_records += n
        self.pending_records = 0
        return n

    def write_durable(self, *, fsync: bool = True) -> int:
        """Write what was taken (``unwritten``) to the current segment and fsync it; returns the readings made
        durable. May run in a worker thread (the caller makes sure nothing else touches the journal's write side
        meanwhile). When the disk refuses (``OSError``: full, or failing) what was not written stays in
        ``unwritten`` for the next call, so a line is never written twice or cut; a missing fsync is owed too."""
        view = memoryview(self.unwritten)
        fsync = fsync and (bool(self.unwritten) or self._fsync_owed)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            if len(view) < len(self.unwritten):
                self.unwritten = bytes(view)
                self._fsync_owed = self._fsync_owed or fsync
            raise
        if self.unwritten:
            self.unwritten = b""
            self.segment_used = True
        if fsync:
            self._fsync_owed = True  # until it succeeds: a refused fsync is retried at the next call
            os.fsync(self._fd)
        self._fsync_owed = False
        n, self.unwritten_records = self.unwritten_records, 0
        return n

    def rotate(self, *, fsync: bool = True) -> int:
        """Sync, close the current segment and start the next; returns the position a checkpoint now covers up to
        (the first segment *not* covered). A segment that holds nothing yet stays the current one."""
        self.sync(fsync=fsync)
        if not self.segment_used:
            return self.segment
        fd = self._open_segment(self.segment + 1)  # first: a full disk leaves the journal as it was
        os.close(self._fd)
        self.segment += 1
        self._fd = fd
        self.segment_used = False
        return self.segment

    def drop_before(self, position: int) -> None:
        """Delete the segments a committed checkpoint covers."""
        for n in self.segments_in(self.dir):
            if n < position:
                self._path(n).unlink(missing_ok=True)

    def replay(self, position: int, on_mark: Callable[[dict[str, Any]], None] | None = None
               ) -> Iterator[JournalRecord]:
        """The readings of the segments from ``position`` on (before the current one), in order; the marks go to
        ``on_mark`` in their place."""
        for n in self.segments_in(self.dir):
            if n < position or n >= self.segment:
                continue
            yield from self._read_segment(self._path(n), on_mark)

    @staticmethod
    def _read_segment(path: Path, on_mark: Callable[[dict[str, Any]], None] | None = None
                      ) -> Iterator[JournalRecord]:
        data = path.read_bytes()
        lines = data.split(b"\n")
        if data.startswith(_HEADER):  # whole syncs only: what follows the last end mark was cut by a crash
            end = data.rfind(b"\n" + _END)
            lines = data[len(_HEADER):end + 1].split(b"\n") if end >= 0 else []
        for k, line in enumerate(lines):
            if not line or line == _END[:-1]:
                continue
            try:
                rec = json.loads(line)
                if "v" not in rec and type(rec) is dict and "s" not in rec:
                    if on_mark is not None:
                        on_mark(rec)
                    continue
                v = rec["v"]
                if type(v) is not list:
                    one = JournalRecord(str(rec["s"]), float(v), float(rec["t"]), rec.get("q"))
                else:
                    many = _records(str(rec["s"]), v, rec["t"], rec.get("q"))
            except (ValueError, KeyError, TypeError):
                if k == len(lines) - 1:  # a torn tail: never synced, never acknowledged
                    return
                msg = f"journal segment {path.name} is corrupt at line {k + 1}"
                raise ValueError(msg) from None
            if type(v) is not list:
                yield one
            else:
                yield from many

    def close(self) -> None:
        self.sync()
        os.close(self._fd)


def _records(stream: str, values: list[object], ts: object, seqs: object) -> list[JournalRecord]:
    """The readings of a multi-reading line, all or none (ValueError/TypeError when the line is not well formed)."""
    n = len(values)
    times = ts if type(ts) is list else [ts] * n
    seq = seqs if type(seqs) is list else [seqs] * n
    if not n or len(times) != n or len(seq) != n:
        raise ValueError
    return [JournalRecord(stream, float(v), float(t), q)  # type: ignore[arg-type]
            for v, t, q in zip(values, times, seq, strict=True)]

"""stdin as a :class:`~stream.daemon.source.Source`: raw buffers of whole lines, read by a thread.

The reader thread reads what the stream has (``read1``: a lone line is handed over at once, a flood in buffers of
``chunk_bytes``), cuts each buffer at its last newline and hands the whole lines over as one LINES chunk; the bytes
after the cut wait for the rest of their line. A line longer than ``max_line`` is skipped to its end without being
kept or decoded, and counted in the chunk's ``refused["too_large"]``. At most ``depth`` chunks wait for the engine:
past that the thread stops reading, and the producer's writes block on the full pipe (backpressure, nothing
dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from types import MappingProxyType
from typing import IO, Self

from stream.daemon.source import NO_REFUSALS, AckToken, Chunk, ChunkKind

__all__ = ["StdinSource"]

log = logging.getLogger("tops.stdin")

ONE_TOO_LARGE = MappingProxyType({"too_large": 1})


class StdinSource:
    """Lines of a binary stream, handed to the engine in chunks of whole lines (``ack`` is None: stdin has no one to
    acknowledge to). Entered once: a stream is read once, by one reader thread."""

    def __init__(self, stream: IO[bytes], *, chunk_bytes: int = 1 << 16, depth: int = 64,
                 max_line: int = 1 << 20) -> None:
        self.stream = stream
        self.chunk_bytes = chunk_bytes
        self.depth = depth
        self.max_line = max_line
        self._queue: deque[Chunk | None] = deque()  # None: the end of input
        self._ready = asyncio.Event()  # set when something was queued or intake stopped
        self._slots = threading.Semaphore(depth)  # chunks the reader may still queue
        self._stopped = threading.Event()  # intake stopped: the reader reads no more
        self._loop: asyncio.AbstractEventLoop | None = None  # the engine's, while entered
        self._entered = False

    async def __aenter__(self) -> Self:
        if self._entered:
            msg = "a StdinSource is entered once"
            raise RuntimeError(msg)
        self._entered = True
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, name="tops.stdin", daemon=True).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop_intake()
        self._slots.release(self.depth)  # a reader waiting for room goes on to see that intake stopped
        self._loop = None

    async def chunks(self) -> AsyncIterator[Chunk]:
        """The chunks read, in order; ends at the end of input, or once intake stopped and the queue is empty."""
        queue, ready = self._queue, self._ready
        while True:
            while not queue:
                if self._stopped.is_set():
                    return
                ready.clear()
                await ready.wait()
            chunk = queue.popleft()
            if chunk is None:
                return
            self._slots.release()
            yield chunk

    def acknowledge(self, tokens: Sequence[AckToken]) -> None:
        """Nothing to do: no one is told what stdin readings were taken."""

    def stop_intake(self) -> None:
        """Read no more; the chunks already read are still yielded."""
        self._stopped.set()
        self._ready.set()

    def queued(self) -> int:
        """Chunks read and not yet taken by the engine."""
        return len(self._queue)

    # -- the reader thread -------------------------------------------------------------------------------------
    def _read(self) -> None:
        read = getattr(self.stream, "read1", self.stream.read)  # read1: what is available, without waiting for more
        rest, skipping = b"", False
        try:
            while not self._stopped.is_set():
                data = read(self.chunk_bytes)
                if not data:
                    if rest:
                        self._hand(rest + b"\n", NO_REFUSALS)  # the last line, without its newline
                    break
                if skipping:  # the rest of an overlong line
                    cut = data.find(b"\n")
                    if cut < 0:
                        continue
                    data, skipping = data[cut + 1:], False
                buf = rest + data if rest else data
                cut = buf.rfind(b"\n") + 1
                lines, rest = buf[:cut], buf[cut:]
                refused = NO_REFUSALS
                if len(rest) > self.max_line:  # never kept whole: skipped to its end, counted once
                    refused, rest, skipping = ONE_TOO_LARGE, b"", True
                if lines or refused:
                    self._hand(lines, refused)
        except (OSError, ValueError) as exc:
            log.error("stdin: read failed (%s)", exc)
        finally:
            self._call(None)

    def _hand(self, lines: bytes, refused: Mapping[str, int]) -> None:
        """Queue a chunk for the engine, once fewer than ``depth`` wait (the thread blocks until then)."""
        chunk = Chunk(ChunkKind.LINES, lines, arrival=time.time(), refused=refused)
        self._slots.acquire()
        self._call(chunk)

    def _call(self, chunk: Chunk | None) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the event loop has closed: the run is over
                loop.call_soon_threadsafe(self._arrive, chunk)

    def _arrive(self, chunk: Chunk | None) -> None:
        self._queue.append(chunk)
        self._ready.set()

"""Writes the data directory's disk refuses wait and are retried: a full disk never stops the daemon nor loses what
was accepted.

Every write of the durable state (the journal, the store's checkpoints, the outbox spill and its position file) goes
through one :class:`DiskRetry`. ``with disk.writing("journal"): ...`` turns the disk's refusal of a write into
:class:`DiskRefused`, naming the file; :meth:`DiskRetry.run` repeats a write until the disk takes it, waiting
``first_wait`` (0.1 s) after the first refusal and twice as long after each next one, up to ``longest_wait`` (2 s);
:meth:`DiskRetry.attempt` tries once where the caller cannot wait (the spill's appends: what the disk refused stays
in memory until a :meth:`run` writes it). A refusal is an ``OSError`` (``ENOSPC``, ``EDQUOT``, or another error of the
disk) or SQLite's ``SQLITE_FULL`` or ``SQLITE_IOERR``; any other error goes up unchanged.

While some file waits, ``writable`` is clear (stdin intake waits for it), ``tops_state_unwritable{file}`` is 1 and
``tops_state_refused_writes_total{file}`` counts the refused attempts. One log line says when the disk starts
refusing writes (the file, the disk's reason; never what was being written), one when it has refused none for
``settle`` seconds (a nearly full disk refuses a checkpoint, takes it once the store's write-ahead log is truncated,
refuses the next: one incident, not a pair of lines each time). :meth:`DiskRetry.interrupt` (the daemon's stop
signal) ends the waits: a refused write then raises at once, and the daemon stops with what is on disk (every
accepted reading is in the journal).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["FILES", "DiskRefused", "DiskRetry", "refusal"]

log = logging.getLogger("tops.state")

T = TypeVar("T")

# The files of the data directory that are written while the daemon runs (the outbox itself is in the store).
FILES = ("journal", "store", "spill", "outbox_position")

# SQLite's primary result codes of a write the disk refused (the extended codes keep them in their low byte)
_SQLITE_REFUSALS = (13, 10)  # SQLITE_FULL, SQLITE_IOERR


def refusal(exc: BaseException) -> str | None:
    """Why the disk refused a write (its own words: never what was written), or None when ``exc`` is not the disk's
    refusal (a bug, a locked store: those go up unchanged)."""
    if isinstance(exc, OSError):
        return exc.strerror or errno.errorcode.get(exc.errno or 0) or type(exc).__name__
    if isinstance(exc, sqlite3.Error) and (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF in _SQLITE_REFUSALS:
        return str(exc)
    return None


class DiskRefused(OSError):
    """The disk refused a write of ``file`` (one of :data:`FILES`) for ``reason``."""

    def __init__(self, file: str, reason: str, code: int | None = None) -> None:
        super().__init__(code or errno.ENOSPC, reason)
        self.file = file
        self.reason = reason


class DiskRetry:
    """The one way the durable state writes into ``folder``: refusals counted, reported and retried (see the module
    docstring). ``registry``: where the two metrics go (none: not exported). ``retry_soon``: called when
    :meth:`attempt` leaves a refused write to whoever writes that file next (the daemon then checkpoints at once,
    which retries it)."""

    def __init__(self, folder: str | Path, registry: CollectorRegistry | None = None, *, first_wait: float = 0.1,
                 longest_wait: float = 2.0, settle: float = 10.0, retry_soon: Callable[[], None] | None = None
                 ) -> None:
        self.folder = Path(folder)
        self.first_wait, self.longest_wait, self.settle = first_wait, longest_wait, settle
        self.retry_soon = retry_soon
        self.waiting: dict[str, str] = {}  # file -> the disk's reason, while its writes are refused
        self.refusals = 0  # refused attempts since the disk started refusing
        self.incident: float | None = None  # when the disk started refusing (monotonic), until it settled
        self._settling: asyncio.TimerHandle | None = None  # the "writable again" line, due once none was refused
        self.writable = asyncio.Event()
        self.writable.set()
        self.interrupted = asyncio.Event()
        self.unwritable: Gauge | None = None
        self.refused: Counter | None = None
        if registry is not None:
            self.unwritable = Gauge("tops_state_unwritable", "1 while the disk refuses this file's writes in the "
                                    "data directory (full: ENOSPC, EDQUOT, SQLITE_FULL; or an I/O error): they "
                                    "wait and are retried.", ["file"], registry=registry)
            self.refused = Counter("tops_state_refused_writes", "Writes into the data directory the disk refused "
                                   "(each retried until it is taken).", ["file"], registry=registry)
            for f in FILES:
                self.unwritable.labels(f)
                self.refused.labels(f)

    # -- one write ----------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def writing(self, file: str) -> Iterator[None]:
        """The writes of ``file`` inside: a refusal becomes :class:`DiskRefused` (a refusal of an inner ``writing``
        keeps its file); success ends the wait of ``file``."""
        try:
            yield
        except DiskRefused:
            raise
        except (OSError, sqlite3.Error) as exc:
            reason = refusal(exc)
            if reason is None:
                raise
            self._refused(file, reason)
            raise DiskRefused(file, reason, getattr(exc, "errno", None)) from None
        if file in self.waiting:
            self._written(file)

    def attempt(self, file: str, write: Callable[..., Any], *args: Any) -> bool:
        """One try of ``write(*args)`` (the caller keeps what was not written); False when the disk refused it."""
        try:
            with self.writing(file):
                write(*args)
        except DiskRefused:
            if self.retry_soon is not None:
                self.retry_soon()
            return False
        return True

    async def run(self, file: str, write: Callable[..., T], *args: Any, thread: bool = False, **kwargs: Any) -> T:
        """``write(*args, **kwargs)`` (in a worker thread with ``thread``) until the disk takes it: after a refusal
        it waits ``first_wait``, then twice as long each time up to ``longest_wait``. ``write`` must be safe to call
        again after a refusal (the state layer's writes keep what they did not write). Once :meth:`interrupt` was
        called a refusal raises :class:`DiskRefused` at once."""
        wait = self.first_wait
        while True:
            try:
                with self.writing(file):
                    if thread:
                        return await asyncio.to_thread(write, *args, **kwargs)
                    return write(*args, **kwargs)
            except DiskRefused:
                if self.interrupted.is_set():
                    raise
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self.interrupted.wait()
            wait = min(2.0 * wait, self.longest_wait)

    def interrupt(self) -> None:
        """The daemon stops: no write waits for the disk any more."""
        self.interrupted.set()

    # -- the condition ------------------------------------------------------------------------------------------
    def _refused(self, file: str, reason: str) -> None:
        if not self.waiting:
            self.writable.clear()
        if self._settling is not None:  # refused again before it settled: the same incident
            self._settling.cancel()
            self._settling = None
        if self.incident is None:
            self.incident = time.monotonic()
            log.error("data directory %s cannot be written (%s, the %s): writes wait and are retried every %g s to "
                      "%g s; a reading is accepted only once the journal has it on disk, nothing accepted is lost",
                      self.folder, reason, file.replace("_", " "), self.first_wait, self.longest_wait)
        self.waiting[file] = reason
        self.refusals += 1
        if self.unwritable is not None and self.refused is not None:
            self.unwritable.labels(file).set(1)
            self.refused.labels(file).inc()

    def _written(self, file: str) -> None:
        del self.waiting[file]
        if self.unwritable is not None:
            self.unwritable.labels(file).set(0)
        if not self.waiting:
            self.writable.set()
            try:
                self._settling = asyncio.get_running_loop().call_later(self.settle, self._settled)
            except RuntimeError:  # no event loop (the state layer used alone): no incident to wait out
                self._settled()

    def _settled(self) -> None:
        """No write refused for ``settle`` seconds: the incident's second line."""
        self._settling = None
        if self.incident is not None:
            log.warning("data directory %s writable again: %d writes were refused over %.0f s, none since; what "
                        "waited is written", self.folder, self.refusals, time.monotonic() - self.incident)
        self.incident = None
        self.refusals = 0

    def close(self) -> None:
        """The daemon stops: an incident the disk recovered from ends now (its line is not left unsaid)."""
        if self._settling is not None:
            self._settling.cancel()
            self._settled()

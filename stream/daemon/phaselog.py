"""The log lines of streams changing phase (holdout, releasing, failed), bounded: one line per stream for the
first few in a window, then one line per window that counts the rest. A fleet of a million meters starting would
otherwise log two million lines (and spend more time logging than releasing); each stream's retained status message
still says its phase."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["PhaseLog"]

log = logging.getLogger("tops")


class PhaseLog:
    """At most ``burst`` lines ``stream 'name': phase`` per ``window`` seconds; the rest counted by phase and logged
    as one line when the window ends (:meth:`roll`, called by the daemon's accounting loop and at the stop)."""

    def __init__(self, burst: int = 20, window: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.window, self.clock = burst, window, clock
        self.start = clock()
        self.logged = 0
        self.quiet: dict[str, int] = {}

    def note(self, name: str, phase: str) -> None:
        if self.logged < self.burst:
            self.logged += 1
            log.info("stream %r: %s", name, phase)
        else:
            self.quiet[phase] = self.quiet.get(phase, 0) + 1

    def note_many(self, changes: list[tuple[str, str]]) -> None:
        """:meth:`note` of each ``(name, phase)``, in order."""
        room = max(0, self.burst - self.logged)
        for name, phase in changes[:room]:
            self.note(name, phase)
        quiet = self.quiet
        for phase in [phase for _, phase in changes[room:]]:
            quiet[phase] = quiet.get(phase, 0) + 1

    def roll(self, *, final: bool = False) -> None:
        """End the window when it is over (``final``: now): the count of the streams not named, by phase."""
        now = self.clock()
        if not final and now - self.start < self.window:
            return
        if self.quiet:
            n = sum(self.quiet.values())
            by = ", ".join(f"{phase} {k:,}" for phase, k in sorted(self.quiet.items()))
            log.info("%s more streams changed phase in the last %.0f s (%s); each stream's status message says its "
                     "phase", f"{n:,}", now - self.start, by)
        self.start, self.logged, self.quiet = now, 0, {}

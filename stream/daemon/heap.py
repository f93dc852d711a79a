"""The garbage collector's full passes kept short: what lives is frozen as the daemon goes, and swept rarely.

CPython's cyclic collector walks every tracked object of its oldest generation at each full pass, with the event loop
stopped. A daemon's streams are such objects (a stream in its holdout: its record, operator, generator, leaf
statistics and a few lists, about 6) and live as long as the process; a full pass runs whenever the objects that
survived two younger passes grew by a quarter of the oldest generation, which a growing fleet and every checkpoint
(the states lent to the writer thread live through it) keep doing. With thousands of streams in their holdout such
passes are the longest pauses of intake (``bench/bench_state.py`` shows them).

:class:`Heap` freezes (``gc.freeze``) what is alive every ``freeze_every`` seconds, after a pass over the two younger
generations (young cyclic garbage is collected, not frozen): full passes then walk only what was made since, whatever
the number of streams. A stream's objects are freed by reference counting when it is dropped (they hold no cycle:
tested), so freezing keeps nothing alive that would otherwise go. What could still be kept is cyclic garbage that
was alive when frozen (a library's object that later forms a cycle; a 20 s run of 10,000 streams at 20,000
readings/s with checkpoints every second left about one such object a second): once a day (``sweep_every``) the
frozen objects are unfrozen and collected in one full pass (logged with its duration: 1.7 s with a million streams
in their holdout, about 6 tracked objects each), then frozen again.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

__all__ = ["FREEZE_EVERY", "SWEEP_EVERY", "Heap"]

log = logging.getLogger("tops")

FREEZE_EVERY = 0.5  # seconds between freezes of what lives (each costs a pass over the two younger generations)
SWEEP_EVERY = 86400.0  # seconds between full passes over everything, frozen included (1.7 s at a million streams)


class Heap:
    """Freezes what lives every ``freeze_every`` s and sweeps everything every ``sweep_every`` s (:meth:`tick`, called
    after each processing step and by the accounting loop)."""

    def __init__(self, freeze_every: float = FREEZE_EVERY, sweep_every: float = SWEEP_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.freeze_every, self.sweep_every, self.clock = freeze_every, sweep_every, clock
        self.last_freeze = self.last_sweep = clock()
        self.freezes = self.sweeps = 0
        self.last_sweep_seconds = 0.0

    def tick(self) -> None:
        now = self.clock()
        if now - self.last_sweep >= self.sweep_every:
            self.sweep()
        elif now - self.last_freeze >= self.freeze_every:
            self.freeze()

    def freeze(self) -> None:
        """Collect the two younger generations (their cyclic garbage goes), then freeze everything alive."""
        gc.collect(1)
        gc.freeze()
        self.freezes += 1
        self.last_freeze = self.clock()

    def sweep(self) -> int:
        """One full pass over every object, frozen ones included; returns what it collected."""
        t0 = time.perf_counter()
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
        self.last_sweep_seconds = time.perf_counter() - t0
        self.sweeps += 1
        self.last_sweep = self.last_freeze = self.clock()
        log.info("heap swept: %d unreachable objects collected in %.3f s", found, self.last_sweep_seconds)
        return found

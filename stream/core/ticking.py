"""Period ticks: events binned into fixed, epoch-aligned periods, closed on the wall-clock schedule.

A period ``k`` covers ``[k P, (k + 1) P)`` seconds since the epoch. It closes when the wall clock passes
``(k + 1) P + lateness``, whatever data arrived: an empty period releases the value 0, so the release timing
never depends on the data. An event for a period that is already closed is *late*: counted and dropped.

>>> clock = PeriodClock(period=10.0, lateness=2.0)
>>> clock.index(125.0), clock.last_closable(131.9), clock.last_closable(132.0)
(12, 11, 12)
>>> bins = PeriodBins(first=12)
>>> bins.add(12, 3.0), bins.add(13, 1.0), bins.add(11, 5.0)
(True, True, False)
>>> bins.close_through(13)
[3.0, 1.0]
>>> bins.close_through(15)  # empty periods release too
[0.0, 0.0]
"""

from __future__ import annotations

import math

__all__ = ["PeriodBins", "PeriodClock"]


class PeriodClock:
    """Period arithmetic shared by all streams (periods align to multiples of ``period`` since the epoch)."""

    __slots__ = ("lateness", "period")

    def __init__(self, period: float, lateness: float = 0.0) -> None:
        self.period = float(period)
        self.lateness = float(lateness)

    def index(self, ts: float) -> int:
        """The period holding time ``ts``."""
        return math.floor(ts / self.period)

    def end(self, k: int) -> float:
        """End time of period ``k`` (the ``ts`` of its release)."""
        return (k + 1) * self.period

    def last_closable(self, now: float) -> int:
        """The last period whose end plus lateness has passed at ``now``."""
        return math.floor((now - self.lateness) / self.period) - 1

    def next_close(self, now: float) -> float:
        """Wall-clock time at which the next period closes."""
        return (self.last_closable(now) + 2) * self.period + self.lateness


class PeriodBins:
    """The open periods of one stream: ``first`` is the oldest period not yet released."""

    __slots__ = ("bins", "first")

    def __init__(self, first: int) -> None:
        self.first = first
        self.bins: dict[int, float] = {}

    def add(self, k: int, amount: float) -> bool:
        """Add to period ``k``; False when that period is already closed (a late event)."""
        if k < self.first:
            return False
        self.bins[k] = self.bins.get(k, 0.0) + amount
        return True

    def close_through(self, last: int) -> list[float]:
        """Values of periods ``first .. last`` in order (0 for an empty one); they are closed afterwards."""
        if last < self.first:
            return []
        pop = self.bins.pop
        out = [pop(k, 0.0) for k in range(self.first, last + 1)]
        self.first = last + 1
        return out


class CategoryBins(PeriodBins):
    """The open periods of a categorical stream: a tally ``{category (or report value): count}`` per period."""

    __slots__ = ()

    def add(self, k: int, amount: float) -> bool:
        """Count one ``amount`` (a category) in period ``k``; False when that period is already closed."""
        if k < self.first:
            return False
        tally = self.bins.get(k)
        if tally is None:
            tally = self.bins[k] = {}
        c = int(amount)
        tally[c] = tally.get(c, 0) + 1
        return True

    def close_through(self, last: int) -> list[dict[int, int]]:  # type: ignore[override]
        """Tallies of periods ``first .. last`` in order (empty for a period without readings); closed afterwards."""
        if last < self.first:
            return []
        pop = self.bins.pop
        out = [pop(k, {}) for k in range(self.first, last + 1)]
        self.first = last + 1
        return out

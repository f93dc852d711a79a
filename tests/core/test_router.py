"""Period clocks and bins, and the router: every period released (0 when empty), late readings counted and dropped,
count aggregates on the wall clock, repeated ``seq`` dropped, the stream cap, a new stream's first period."""

from __future__ import annotations

import pytest

from stream.core.errors import StreamCapError
from stream.core.router import Router
from stream.core.ticking import PeriodBins, PeriodClock
from tests.support import FakeOperator


# -- ticks and routing ---------------------------------------------------------------------------------------
def test_period_clock_and_bins() -> None:
    c = PeriodClock(60.0, lateness=5.0)
    assert c.index(119.9) == 1 and c.end(1) == 120.0
    assert c.last_closable(124.9) == 0 and c.last_closable(125.0) == 1
    assert c.next_close(100.0) == 125.0
    b = PeriodBins(first=3)
    assert b.add(3, 1.0) and b.add(5, 2.0) and not b.add(2, 1.0)
    assert b.close_through(6) == [1.0, 0.0, 2.0, 0.0] and b.first == 7


def test_router_periods_release_empty_periods_and_drop_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """Event-time periods: every period releases (0 when empty), late events are counted and dropped."""
    now = 1000.0
    monkeypatch.setattr("stream.core.router.time.time", lambda: now)
    ops: dict[str, FakeOperator] = {}

    def factory(name: str) -> FakeOperator:
        ops[name] = FakeOperator(holdout=0)
        ops[name].theta = 10.0
        return ops[name]

    r = Router(factory, 10, clock=PeriodClock(10.0, lateness=2.0), aggregate="sum", event_time=True)
    rec = r.record("s")
    assert rec.bins is not None and rec.bins.first == 99  # period 99 = [990, 1000) is still open (lateness)
    assert r.add(rec, 4.0, 995.0, None, now) == "ok"
    assert r.add(rec, 1.0, 1001.0, None, now) == "ok"
    assert r.add(rec, 2.0, 1005.0, None, now) == "ok"
    assert r.add(rec, 9.0, 985.0, None, now) == "late"
    assert r.add(rec, 9.0, 1500.0, None, now) == "invalid"  # far in the future
    batches = r.close_periods(1041.9)  # closes 99, 100, 101, 102 (103 closes at 1040 + lateness)
    assert len(batches) == 1
    assert ops["s"].seen == [4.0, 3.0, 0.0, 0.0]
    assert batches[0].ticks == [0, 1, 2, 3] and batches[0].ts == [1000.0, 1010.0, 1020.0, 1030.0]
    assert r.take_counts() == {"ok": 3, "late": 1, "duplicate": 0, "invalid": 1, "failed": 0}
    assert r.add(rec, 5.0, 1030.0, None, 1041.9) == "ok"  # period 103 = [1030, 1040) still open
    assert r.close_periods(1042.0)[0].ticks == [4]
    assert r.add(rec, 5.0, 1035.0, None, 1042.0) == "late"
    final = r.close_periods(1043.0, final=True)  # shutdown: the current period 104 closes too
    assert final[0].ticks == [5] and ops["s"].seen[-2:] == [5.0, 0.0]


def test_router_count_aggregate_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("stream.core.router.time.time", lambda: 100.0)
    op = FakeOperator(holdout=0)
    op.theta = 5.0
    r = Router(lambda _: op, 10, clock=PeriodClock(1.0), aggregate="count", event_time=False)
    rec = r.record("c")
    for v in (7.0, 8.0, 9.0):
        r.add(rec, v, 5.0, None, 100.2)  # ts ignored on the wall clock
    r.close_periods(102.0)
    assert op.seen == [3.0, 0.0]


def test_router_readings_seq_and_cap() -> None:
    r = Router(lambda _: FakeOperator(holdout=2), max_streams=2)
    a = r.record("a")
    for i, v in enumerate([1.0, 2.0, 3.0, 4.0]):
        assert r.add(a, v, 10.0 + i, i, 0.0) == "ok"
    assert r.add(a, 9.0, None, 3, 0.0) == "duplicate"
    batches = r.flush()
    assert batches[0].ticks == [2, 3] and batches[0].values == [3.5, 4.5] and batches[0].ts == [12.0, 13.0]
    assert a.ticks == 4 and a.last_seq == 3 and a.phase == "releasing" and r.in_holdout == 0
    assert [(x.name, phase) for x, phase in r.status_now] == [("a", "holdout"), ("a", "releasing")]
    r.record("b")
    with pytest.raises(StreamCapError):
        r.record("c")


def test_a_stream_created_by_a_reading_opens_its_periods_at_that_reading() -> None:
    """A big batch shares one arrival time: a stream created late in it (the wall clock already in the next period)
    still takes its first reading into the reading's period, not as late."""
    r = Router(lambda _: FakeOperator(), 10, clock=PeriodClock(1.0))
    rec = r.record("s", 99.9)  # created while processing a reading that arrived at 99.9
    assert rec.bins is not None and rec.bins.first == 99
    assert r.add_many(rec, [1.0, 2.0], None, None, 99.9) is None and rec.bins.bins == {99: 3.0}

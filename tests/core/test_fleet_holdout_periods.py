"""A fleet holdout with period ticks: a tick is a stream's period value, and while the fleet holdout takes them the
router closes periods period by period and, within a period, in the order of the streams' names.

The attack: the same readings, with the streams first seen in another order (as a restart restores them in the
store's order) and their periods closed in one pass instead of one pass per period (as after a downtime). Closed
in the order the streams were first seen, the fleet holdout would take other period values, choose another theta,
and every stream would release other numbers."""

from __future__ import annotations

import math

import numpy as np

from operators import ToPSConfig
from operators.fleet_holdout import FleetHoldout, FleetMember
from stream.core.router import Router
from stream.core.ticking import PeriodClock

CFG = ToPSConfig(epsilon=1.0, bound=60.0, holdout=30, query_range=64, fanout=2, holdout_scope="fleet")
PERIOD = 10.0


def _key(name: str) -> bytes:
    return name.encode().ljust(32, b".")


def _readings(rng: np.random.Generator) -> list[tuple[int, str, float]]:
    """(period, stream, value): seven streams from period 0, two more from period 4; some periods left empty."""
    out = []
    for k in range(12):
        names = [f"s{i}" for i in range(7)] + (["late-a", "late-b"] if k >= 4 else [])
        for name in names:
            for _ in range(int(rng.integers(0, 3))):
                out.append((k, name, float(rng.integers(0, 20))))
    return out


def _run(readings: list[tuple[int, str, float]], first_seen: list[str], close_each_period: bool
         ) -> dict[str, dict[int, float]]:
    fleet = FleetHoldout(CFG, bytes(32))
    router = Router(lambda name: FleetMember(fleet, _key(name), at_intake=False), 100, clock=PeriodClock(PERIOD),
                    close_in_period_order=lambda: fleet.choice is None)
    got: dict[str, dict[int, float]] = {}

    def keep(batches) -> None:  # type: ignore[no-untyped-def]
        for b in batches:
            for t, v in zip(b.ticks, b.values, strict=True):
                assert (t not in got.setdefault(b.record.name, {})) and not math.isnan(v)
                got[b.record.name][t] = v

    for k in range(12):
        now = k * PERIOD + 1.0
        for name in first_seen:  # streams are made in this order, at their first period's first reading
            if name not in router.streams and any(r[0] == k and r[1] == name for r in readings):
                router.record(name, now)
        for kk, name, v in readings:
            if kk == k:
                assert router.add(router.streams[name], v, None, None, now) == "ok"
        if close_each_period:
            keep(router.close_periods((k + 1) * PERIOD + 0.5))
    keep(router.close_periods(12 * PERIOD + 0.5))
    assert fleet.choice is not None
    return got


def _oracle(readings: list[tuple[int, str, float]]) -> dict[str, dict[int, float]]:
    """Period values in (period, name) order through the fleet's operators."""
    fleet = FleetHoldout(CFG, bytes(32))
    ops: dict[str, FleetMember] = {}
    first = {}
    for k, name, _ in readings:
        first.setdefault(name, k)
    out: dict[str, dict[int, float]] = {}
    for k in range(12):
        for name in sorted(n for n, f in first.items() if f <= k):
            op = ops.setdefault(name, FleetMember(fleet, _key(name), at_intake=False))
            v = sum(x for kk, n, x in readings if kk == k and n == name)
            r = float(op.process(np.array([v]))[0])
            if not math.isnan(r):
                out.setdefault(name, {})[k - first[name]] = r
    return out


def test_period_values_reach_the_fleet_in_period_and_name_order_whatever_the_passes() -> None:
    readings = _readings(np.random.default_rng(4))
    names = sorted({r[1] for r in readings})
    want = _oracle(readings)
    assert sum(map(len, want.values())) == sum(12 - min(r[0] for r in readings if r[1] == n) for n in names) - 30
    for first_seen, each in ((names, True), (names[::-1], True), (names[::-1], False), (names[3:] + names[:3], False)):
        assert _run(readings, first_seen, each) == want, (first_seen, each)

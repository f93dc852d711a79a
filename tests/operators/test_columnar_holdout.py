"""Holdouts as rows of a columnar store: a ToPS stream in its holdout on the compact grid keeps its
histogram and block statistics in one row of arrays shared by its configuration, counted in one compiled pass. The
attacks: a row must hold the very numbers the stream's own operator would (or its choice, its snapshot and every later
release change), a reading must never end a holdout inside the compiled pass (the choice is the operator's), a
checkpoint's writer must get the row as it was at the cut while the event loop goes on (and while rows are freed and
reused), and a row's key never shows."""

from __future__ import annotations

import json
import pickle
import threading

import numpy as np
import pytest

from operators.columnar_holdout import MIN_HOLDOUT_LEFT, ColumnarHoldout, HoldoutRow
from operators.config import ToPSConfig
from operators.tops import ToPS
from stream.core.router import Router
from stream.state.records import Lent, record_state, record_states
from tests.support import key_of

CONFIGS = {
    "calibrated": ToPSConfig(epsilon=1.0, bound=5000, holdout=700, query_range=1024, fanout=4, holdout_grid="compact"),
    "paper": ToPSConfig(epsilon=1.0, bound=5000, holdout=300, query_range=1024, fanout=4, holdout_grid="compact",
                        selection="paper"),
    "half-units": ToPSConfig(epsilon=0.5, bound=80.0, resolution=0.5, holdout=400, query_range=256, fanout=2,
                             holdout_grid="compact"),
    "long": ToPSConfig(epsilon=1.0, bound=5000, holdout=3000, query_range=1 << 16, fanout=16, holdout_grid="compact"),
}


def readings(rng: np.random.Generator, n: int, bound: float) -> np.ndarray:
    """Mostly small readings (many distinct: the histogram turns dense), some halves (rounding ties), some outside
    ``[0, B]`` (clamped)."""
    v = rng.integers(0, int(bound * 0.6), n).astype(float) + rng.choice([0.0, 0.25, 0.5], n)
    out = rng.random(n) < 0.05
    v[out] = rng.uniform(-bound, 2.0 * bound, int(out.sum()))
    return v


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_row_holds_the_numbers_of_the_streams_own_operator(name: str) -> None:
    """Twenty streams' readings interleaved at random and counted in batches of random sizes: at every cut each row's
    operator has the snapshot of the stream's own operator fed one reading at a time (histogram sparse or dense alike,
    block statistics across widths, clamped counts); its operator taken back ends the holdout and releases exactly
    what the stream's own operator releases."""
    cfg = CONFIGS[name]
    rng = np.random.default_rng(5)
    names = [f"s{i}" for i in range(20)]
    own = [ToPS(cfg, key_of(n)) for n in names]
    store = ColumnarHoldout(cfg, capacity=3)  # grows on the way
    rows = np.array([store.add(ToPS(cfg, key_of(n))) for n in names])
    per = rng.integers(1, cfg.holdout_ticks, len(names))  # every stream stays inside its holdout
    order = np.repeat(np.arange(len(names)), per)
    rng.shuffle(order)
    values = readings(rng, order.size, cfg.bound)
    cuts = [*np.sort(rng.choice(order.size, 6, replace=False)).tolist(), order.size]
    at = 0
    for cut in cuts:
        for j in range(at, cut):
            own[order[j]].process_one(values[j])
        for chunk in np.array_split(np.arange(at, cut), int(rng.integers(1, 5))):
            store.process(rows[order[chunk]], values[chunk])
        at = cut
        for i, r in enumerate(rows.tolist()):
            assert store.operator(r).snapshot() == own[i].snapshot(), names[i]
    assert any(isinstance(op._hist, np.ndarray) for op in own) and any(op.clamped for op in own)
    for i, r in enumerate(rows.tolist()):
        back = store.take(r)
        rest = readings(rng, own[i].holdout_left + 40, cfg.bound)
        assert np.array_equal(back.process(rest), own[i].process(rest), equal_nan=True), names[i]
    assert len(store) == 0


def test_the_compiled_pass_never_ends_a_holdout_and_refuses_what_it_cannot_count() -> None:
    cfg = CONFIGS["paper"]
    store = ColumnarHoldout(cfg)
    r = store.add(ToPS(cfg, key_of("a")))
    store.process(np.full(cfg.holdout_ticks - 1, r), np.ones(cfg.holdout_ticks - 1))
    assert store.left(r) == 1
    with pytest.raises(ValueError, match="holdout would end"):  # the last reading is the operator's: it chooses
        store.process(np.array([r]), np.array([1.0]))
    with pytest.raises(ValueError, match="unknown row"):
        store.process(np.array([r + 1]), np.array([1.0]))
    with pytest.raises(ValueError, match="finite"):
        store.process(np.array([r]), np.array([np.nan]))
    assert store.left(r) == 1
    op = store.take(r)
    op.process(np.array([1.0]))
    assert op.phase == "releasing"
    with pytest.raises(ValueError):  # another configuration, the exact grid, a releasing stream: no row
        store.add(ToPS(CONFIGS["calibrated"], key_of("b")))
    with pytest.raises(ValueError):
        ColumnarHoldout(ToPSConfig(epsilon=1.0, bound=100, holdout=100))
    with pytest.raises(ValueError):
        store.add(op)


def test_a_row_never_shows_its_key() -> None:
    cfg = CONFIGS["paper"]
    store = ColumnarHoldout(cfg)
    key = key_of("m1")
    row = HoldoutRow(store, store.add(ToPS(cfg, key)))
    assert key.hex() not in repr(row) and str(list(key)) not in repr(row)
    with pytest.raises(TypeError):
        pickle.dumps(row)
    assert key.hex() not in json.dumps(row.snapshot())
    row.free()
    assert not store.key[row.row].any()  # a freed row's key is wiped


def test_the_router_counts_holdouts_in_rows_and_releases_what_each_stream_releases_alone() -> None:
    """Streams of two configurations (two stores) and a holdout too short for a row, readings in random bursts (a
    stream often takes several readings in one step, some crossing the end of its holdout): the holdouts are rows
    while they last, and every stream releases exactly what its own operator releases from the same readings."""
    rng = np.random.default_rng(3)
    short = ToPSConfig(epsilon=1.0, bound=100, holdout=MIN_HOLDOUT_LEFT - 1, query_range=256, fanout=4,
                       holdout_grid="compact")
    cfgs = {"a": CONFIGS["half-units"], "b": CONFIGS["paper"], "c": short}
    names = [f"{g}{i}" for g in cfgs for i in range(12)]
    router = Router(lambda n: ToPS(cfgs[n[0]], key_of(n)), 1000)
    router.use_columns(capacity=4)
    fed: dict[str, list[float]] = {n: [] for n in names}
    got: dict[str, dict[int, float]] = {n: {} for n in names}
    rows_seen = 0
    while min(len(v) for v in fed.values()) < 520:
        for _ in range(int(rng.integers(1, 60))):
            n = names[int(rng.integers(len(names)))]
            v = float(readings(rng, 1, cfgs[n[0]].bound)[0])
            fed[n].append(v)
            assert router.add(router.record(n), v, None, None, 0.0) == "ok"
        rows_seen += sum(type(r.operator) is HoldoutRow for r in router.streams.values())
        assert not any(type(router.streams[n].operator) is HoldoutRow for n in names[24:] if n in router.streams)
        for b in router.flush():
            got[b.record.name].update(zip(b.ticks, b.values, strict=True))
    assert rows_seen > 100 and set(router.holdouts) == {cfgs["a"], cfgs["b"]}
    assert not any(type(r.operator) is HoldoutRow for r in router.streams.values())  # every holdout ended
    assert all(len(s) == 0 for s in router.holdouts.values())  # every row given back
    assert router.in_holdout == 0
    for n in names:
        alone = ToPS(cfgs[n[0]], key_of(n)).process(np.asarray(fed[n]))
        want = {t: float(x) for t, x in enumerate(alone) if not np.isnan(x)}
        assert got[n] == want, n
        assert router.streams[n].ticks == len(fed[n])


def test_the_writer_gets_each_row_as_it_was_at_the_cut_while_rows_change_are_freed_and_reused() -> None:
    """The attack of the copy-on-write race, on rows: the writer thread makes the lent states in a random order while
    the event loop feeds the same streams, evicts some of them (their rows freed) and creates new streams (the freed
    rows reused). Every state written is the stream's state at the cut, byte for byte."""
    cfg = ToPSConfig(epsilon=1.0, bound=100, holdout=400, query_range=256, fanout=4, holdout_grid="compact")
    rng = np.random.default_rng(8)
    router = Router(lambda n: ToPS(cfg, key_of(n)), 10_000)
    router.use_columns(capacity=8)
    made_names = [f"h{i}" for i in range(120)]
    fresh = iter(f"n{i}" for i in range(100_000))

    def feed(k: int) -> None:
        for _ in range(k):
            name = made_names[int(rng.integers(len(made_names)))]
            assert router.add(router.record(name), float(rng.integers(0, 100)), None, None, 0.0) == "ok"
        router.flush()

    feed(3000)
    lent_total = 0
    for _cut in range(5):
        recs = [r for r in router.streams.values() if type(r.operator) is HoldoutRow]
        wants = {r.name: json.dumps(record_state(r), separators=(",", ":")) for r in recs}
        states = record_states(recs)
        lent = [n for n, s in states.items() if type(s) is tuple and isinstance(s[0], Lent)]
        assert len(lent) == len(recs)
        lent_total += len(lent)
        made: dict[str, str] = {}
        order = list(rng.permutation(lent))

        def writer(order: list[str] = order, states: dict = states, made: dict = made) -> None:
            for n in order:
                made[n] = json.dumps(states[n][0].state(states[n][1]), separators=(",", ":"))

        t = threading.Thread(target=writer)
        t.start()
        while t.is_alive():
            feed(30)  # readings into the lent rows while the writer runs
            gone = [n for n in rng.choice(made_names, 3, replace=False).tolist() if n in router.streams]
            router.evict(gone)  # their rows are freed ...
            for n in gone:
                made_names.remove(n)
                made_names.append(next(fresh))  # ... and taken by new streams
        t.join()
        assert made == {n: wants[n] for n in lent}
    assert lent_total > 300


def test_a_row_keeps_its_numbers_in_the_narrowest_types_that_hold_them() -> None:
    """A row never takes its holdout's last reading, so with m = 65,536 a cell counts at most 65,535: 2 bytes. The
    edge: one value 65,535 times fills its cell to the top, and the operator taken back chooses as the stream's own.
    A holdout longer than that counts in 4 bytes, and block sums that could pass 2^30 (2^19 units x a width of
    4,096) in 8."""
    cfg = ToPSConfig(epsilon=1.0, bound=5000, holdout=65_536, query_range=1 << 16, fanout=16, holdout_grid="compact")
    store = ColumnarHoldout(cfg)
    assert store.hist.dtype == np.uint16 and store.partial.dtype == np.int32
    own = ToPS(cfg, key_of("edge"))
    r = store.add(ToPS(cfg, key_of("edge")))
    values = np.full(cfg.holdout_ticks - 1, 7.0)
    own.process(values)
    store.process(np.full(values.size, r), values)
    assert int(store.hist[r].max()) == 65_535
    back = store.take(r)
    assert back.snapshot() == own.snapshot()
    rest = np.arange(300, dtype=float)
    assert np.array_equal(back.process(rest), own.process(rest), equal_nan=True)
    wide = ToPSConfig(epsilon=1.0, bound=1e9, resolution=1000.0, holdout=70_000, query_range=1 << 16, fanout=16,
                      holdout_grid="compact")
    store = ColumnarHoldout(wide)
    assert store.hist.dtype == np.int32 and store.partial.dtype == np.int64
    rng = np.random.default_rng(2)
    own = ToPS(wide, key_of("wide"))
    r = store.add(ToPS(wide, key_of("wide")))
    values = rng.uniform(0, 1e9, 5000)
    for v in values:
        own.process_one(v)
    store.process(np.full(values.size, r), values)
    assert store.operator(r).snapshot() == own.snapshot()


def test_periods_close_into_rows_and_release_what_each_stream_releases_alone() -> None:
    """With periods (one tick per period, sums), closing many periods at once hands a row a batch of period sums,
    often across the end of its holdout: the same releases as the stream's own operator on the same sums."""
    from stream.core.ticking import PeriodClock

    cfg = ToPSConfig(epsilon=1.0, bound=100, holdout=40, query_range=256, fanout=4, holdout_grid="compact")
    rng = np.random.default_rng(4)
    router = Router(lambda n: ToPS(cfg, key_of(n)), 100, clock=PeriodClock(1.0), aggregate="sum", event_time=True)
    router.use_columns()
    names = [f"p{i}" for i in range(6)]
    sums: dict[str, list[float]] = {n: [] for n in names}
    got: dict[str, dict[int, float]] = {n: {} for n in names}
    for n in names:
        router.record(n, 0.0)
    assert all(type(router.streams[n].operator) is HoldoutRow for n in names)
    t = 0
    while t < 200:
        step = int(rng.integers(1, 15))  # periods closed together
        for k in range(t, t + step):
            for n in names:
                v = float(rng.integers(0, 60))
                sums[n].append(v)
                assert router.add(router.streams[n], v, k + 0.5, None, k + 0.5) == "ok"
        t += step
        for b in router.close_periods(t + 0.0):
            got[b.record.name].update(zip(b.ticks, b.values, strict=True))
    for n in names:
        k = len(got[n]) + cfg.holdout
        alone = ToPS(cfg, key_of(n)).process(np.asarray(sums[n][:k]))
        assert got[n] == {i: float(x) for i, x in enumerate(alone) if not np.isnan(x)}, n
        assert type(router.streams[n].operator) is not HoldoutRow


def test_a_stored_holdout_counting_more_than_a_row_holds_stays_an_operator() -> None:
    """The attack: a stored state (a corrupt or forged store) whose histogram counts 70,000 readings in one cell of a
    holdout of 1,000. ToPS keeps such numbers as they are; in a row's 2-byte cells they would wrap around silently.
    The row is refused, the router keeps the stream's operator, and its choice is the operator's."""
    cfg = ToPSConfig(epsilon=1.0, bound=5000, holdout=1000, query_range=256, fanout=4, holdout_grid="compact")
    op = ToPS(cfg, key_of("forged"))
    op.process(np.arange(100, dtype=float))
    snap = op.snapshot()
    snap["holdout_histogram"] = {"cells": 204, "index": [5], "count": [70_000]}
    forged = ToPS.restore(cfg, key_of("forged"), snap)
    with pytest.raises(ValueError, match="more than a row holds"):
        ColumnarHoldout(cfg).add(ToPS.restore(cfg, key_of("forged"), snap))
    router = Router(lambda n: ToPS.restore(cfg, key_of(n), snap), 10)
    router.use_columns()
    rec = router.record("forged")
    assert type(rec.operator) is ToPS
    rest = np.full(1000, 40.0)
    for v in rest:
        router.add(rec, float(v), None, None, 0.0)
    got = {t: v for b in router.flush() for t, v in zip(b.ticks, b.values, strict=True)}
    alone = forged.process(rest)
    assert got and got == {i: float(x) for i, x in enumerate(alone) if not np.isnan(x)}  # (the router counts from 0)

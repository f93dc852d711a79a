"""The columnar store and its compiled kernel release exactly what ToPS releases, stream by stream, however the
readings of many streams interleave, across noise refills and tree roll-overs; a row handed back as a ToPS object
snapshots and restores like any ToPS stream."""

from __future__ import annotations

import json

import numpy as np
import pytest

from operators.columnar import ColumnarRelease, RowOperator, columnar_eligible
from operators.config import ToPSConfig
from operators.tops import ToPS

CONFIGS = [
    ToPSConfig(epsilon=1.0, bound=50, theta=20, query_range=64, fanout=4, smoother_layers=0),
    ToPSConfig(epsilon=0.5, bound=50, theta=7, query_range=64, fanout=4, smoother_layers=1),
    ToPSConfig(epsilon=2.0, bound=30, theta=12, query_range=256, fanout=4, smoother_layers=2, resolution=0.5),
    ToPSConfig(epsilon=1.0, bound=100, holdout=40, query_range=128, fanout=2),  # theta chosen on a holdout
]


def _streams(rng: np.random.Generator, n: int) -> list[tuple[ToPSConfig, bytes, np.ndarray]]:
    out = []
    for i in range(n):
        cfg = CONFIGS[i % len(CONFIGS)]
        out.append((cfg, rng.bytes(32), rng.uniform(-5, cfg.bound + 10, size=int(rng.integers(300, 700)))))
    return out


def _released(cfg: ToPSConfig, key: bytes, values: np.ndarray) -> tuple[ToPS, np.ndarray]:
    """A ToPS stream past its holdout (if any), and the readings left for the releasing phase."""
    op = ToPS(cfg, key)
    take = cfg.holdout_ticks if cfg.theta is None else 0
    op.process(values[:take])
    return op, values[take:]


@pytest.mark.parametrize("ahead", [1, 3, 16])
def test_interleaved_streams_release_exactly_what_tops_releases(ahead: int) -> None:
    rng = np.random.default_rng(ahead)
    streams = _streams(rng, 24)
    cols = ColumnarRelease(capacity=4, ahead=ahead)  # grows while rows are added
    rows, vals, owner = [], [], []
    for cfg, key, values in streams:
        op, rest = _released(cfg, key, values)
        if cfg.smoother_layers is None:
            assert columnar_eligible(op)
        r = cols.add(op)
        rows += [r] * rest.size
        vals += rest.tolist()
        owner.append(rest)
    # a random interleaving that keeps every stream's own order: each reading gets a random time, sorted per stream
    times = np.concatenate([np.sort(rng.uniform(0, 1, rest.size)) for rest in owner])
    order = np.argsort(times, kind="stable")
    rows_a, vals_a = np.array(rows)[order], np.array(vals)[order]
    out = cols.process(rows_a, vals_a)
    for r, (cfg, key, values) in enumerate(streams):
        ref_op, rest = _released(cfg, key, values)
        expected = ref_op.process(rest)
        got = out[rows_a == r]
        assert np.array_equal(got, expected), r
        assert cols.operator(r).clamped == ref_op.clamped and cols.operator(r).ticks == ref_op.ticks


def test_a_row_given_back_snapshots_and_continues_bit_for_bit() -> None:
    rng = np.random.default_rng(9)
    cfg, key, values = CONFIGS[1], rng.bytes(32), rng.uniform(0, 50, 2000)
    whole = ToPS(cfg, key).process(values)
    cols = ColumnarRelease(ahead=8)
    r = cols.add(ToPS(cfg, key))
    first = cols.process(np.full(777, r), values[:777])  # stops inside drawn-ahead noise and inside a leaf
    snap = json.loads(json.dumps(cols.operator(r).snapshot()))
    again = ToPS.restore(cfg, key, snap)
    rest = again.process(values[777:])
    assert np.array_equal(np.concatenate([first, rest]), whole)
    more = cols.process(np.full(1223, r), values[777:])  # the row itself also goes on exactly
    assert np.array_equal(more, rest)


def test_only_releasing_recent_streams_become_rows_and_bad_input_is_refused() -> None:
    cols = ColumnarRelease()
    holdout = ToPS(ToPSConfig(epsilon=1.0, bound=10, holdout=5), bytes(32))
    ema = ToPS(ToPSConfig(epsilon=1.0, bound=10, theta=3, smoother="ema"), bytes(32))
    for op in (holdout, ema):
        assert not columnar_eligible(op)
        with pytest.raises(ValueError, match="only releasing"):
            cols.add(op)
    r = cols.add(ToPS(ToPSConfig(epsilon=1.0, bound=10, theta=3), bytes(32)))
    with pytest.raises(ValueError, match="unknown row"):
        cols.process(np.array([r + 1]), np.array([1.0]))
    with pytest.raises(ValueError, match="finite"):
        cols.process(np.array([r]), np.array([np.nan]))


@pytest.mark.parametrize("cut", [1, 5, 16, 17, 63, 64, 65, 300])
def test_a_row_snapshots_as_tops_does(cut: int) -> None:
    """The row's snapshot is ToPS's own dict at any point: inside a leaf, at a leaf's end, at a tree's end."""
    rng = np.random.default_rng(cut)
    for cfg in CONFIGS:
        key = rng.bytes(32)
        values = rng.uniform(-3, cfg.bound + 5, 400 + cfg.holdout)
        op, rest = _released(cfg, key, values)
        ref, _ = _released(cfg, key, values)
        cols = ColumnarRelease(capacity=1, ahead=4)
        r = cols.add(op)
        cols.process(np.full(cut, r), rest[:cut])
        ref.process(rest[:cut])
        assert cols.snapshot(r) == ref.snapshot()
        assert json.loads(json.dumps(cols.snapshot(r))) == cols.snapshot(r)


def test_freed_rows_are_wiped_and_reused_by_other_streams() -> None:
    rng = np.random.default_rng(3)
    cfg = CONFIGS[1]
    cols = ColumnarRelease(capacity=2, ahead=4)
    keys = [rng.bytes(32) for _ in range(3)]
    values = rng.uniform(0, 50, 200)
    a = cols.add(ToPS(cfg, keys[0]))
    b = cols.add(ToPS(cfg, keys[1]))
    cols.process(np.full(50, a), values[:50])
    cols.release(a)
    assert not cols.key[a].any() and len(cols) == 1
    c = cols.add(ToPS(cfg, keys[2]))  # takes the freed row
    assert c == a and cols.rows == 2
    got = cols.process(np.array([c, b] * 100), np.repeat(values[:100], 2))
    assert np.array_equal(got[0::2], ToPS(cfg, keys[2]).process(values[:100]))
    assert np.array_equal(got[1::2], ToPS(cfg, keys[1]).process(values[:100]))


def test_row_operator_is_the_stream_as_an_operator() -> None:
    rng = np.random.default_rng(5)
    cfg, key = CONFIGS[2], rng.bytes(32)
    values = rng.uniform(-1, 35, 300)
    ref = ToPS(cfg, key)
    cols = ColumnarRelease(ahead=2)
    row = RowOperator(cols, cols.add(ToPS(cfg, key)))
    assert (row.phase, row.holdout_left, row.config) == ("releasing", 0, cfg)
    assert row.theta == ref.theta and row.smoother_layers == ref.smoother_layers
    one = [row.process_one(v) for v in values[:37]]
    assert one == [ref.process_one(v) for v in values[:37]]
    assert np.array_equal(row.process(values[37:]), ref.process(values[37:]))
    assert (row.ticks, row.clamped) == (ref.ticks, ref.clamped)
    assert row.snapshot() == ref.snapshot()
    again = RowOperator.restore(cfg, key, row.snapshot())
    assert isinstance(again, ToPS) and again.snapshot() == ref.snapshot()
    assert "key" not in repr(row).replace("key=<secret>", "") and key.hex() not in repr(row)
    assert columnar_eligible(ref) and not columnar_eligible(row)

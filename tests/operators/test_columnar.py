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


_COLUMNS = ("config", "key", "theta", "layers_kept", "width", "pos", "leaf_sum", "pred", "u0", "ticks", "clamped",
            "bound", "bound_units", "resolution", "head", "avail", "drawn")


def test_a_stored_stream_goes_straight_into_the_row_restore_would_make() -> None:
    """After a restart a releasing stream is restored at its first reading straight into a row
    (``add_snapshot``: no ToPS object first). Every column equals the row made from ``ToPS.restore`` of the same
    snapshot (cut anywhere: inside a leaf, at a leaf's end, across tree roll-overs), and both rows then release what
    the stream that was never stored releases."""
    rng = np.random.default_rng(1126)
    via_op, straight = ColumnarRelease(capacity=2, ahead=3), ColumnarRelease(capacity=2, ahead=3)
    checked = 0
    for cfg, key, values in _streams(rng, 60):
        op, rest = _released(cfg, key, values)
        cut = int(rng.integers(0, rest.size))
        before = op.process(rest[:cut])
        assert not np.isnan(before).any()
        snap = json.loads(json.dumps(op.snapshot()))
        a = via_op.add(ToPS.restore(cfg, key, snap))
        b = straight.add_snapshot(cfg, key, snap)
        assert b is not None
        for col in _COLUMNS:
            assert np.array_equal(getattr(via_op, col)[a], getattr(straight, col)[b]), col
        want = op.process(rest[cut:])
        got_a = via_op.process(np.full(rest.size - cut, a), rest[cut:])
        got_b = straight.process(np.full(rest.size - cut, b), rest[cut:])
        assert np.array_equal(got_a, want) and np.array_equal(got_b, want)
        via_op.release(a)
        straight.release(b)
        checked += 1
    assert checked == 60


def test_a_snapshot_a_row_cannot_hold_or_that_does_not_fit() -> None:
    """A holdout, another smoother or a lower bound are left to ``ToPS.restore`` (None); a snapshot that does not
    fit is refused with the exception types the daemon turns into one refusal line, as ``ToPS.restore`` refuses it."""
    pool = ColumnarRelease(capacity=4)
    cfg = ToPSConfig(epsilon=1.0, bound=50, theta=20, query_range=64, fanout=4, smoother_layers=1)
    key = bytes(range(32))
    op = ToPS(cfg, key)
    op.process(np.arange(10.0))
    good = json.loads(json.dumps(op.snapshot()))
    held = ToPS(ToPSConfig(epsilon=1.0, bound=50, holdout=40, query_range=64, fanout=4), key)
    held.process(np.arange(5.0))
    assert pool.add_snapshot(held.config, key, held.snapshot()) is None
    moving = cfg.replace(smoother="moving")
    assert pool.add_snapshot(moving, key, ToPS(moving, key).snapshot()) is None
    low = ToPSConfig(epsilon=1.0, bound=50, lower=5.0, theta=20, query_range=64, fanout=4, smoother_layers=1)
    assert pool.add_snapshot(low, key, ToPS(low, key).snapshot()) is None
    bad = [{**good, "version": 99}, {**good, "theta_units": 0}, {**good, "theta_units": "x"},
           {k: v for k, v in good.items() if k != "walk"}, {**good, "walk": {"tree": 0}},
           {**good, "smoother": {"pos": 1}}, {**good, "config": {**good["config"], "epsilon": 2.0}},
           {**good, "smoother_layers": 3}]
    for snap in bad:
        with pytest.raises((KeyError, TypeError, ValueError)):
            pool.add_snapshot(cfg, key, snap)
        if snap["smoother_layers"] != 3:  # (restore takes s = h as a zero division; a row refuses it plainly)
            with pytest.raises((KeyError, TypeError, ValueError)):
                ToPS.restore(cfg, key, snap)
    with pytest.raises(ValueError, match="32 bytes"):
        pool.add_snapshot(cfg, key[:16], good)
    assert len(pool) == 0  # nothing refused took a row

"""Rows refilled together: when many rows of a columnar store run out of noise drawn ahead in a batch, one compiled
call (operators/_refill_kernel.py) draws the next leaves of all of them, and every release is still bit for bit what
each stream's own ToPS releases: for every shape of tree rows hold (fanouts 2 to 16, one to five layers, one or many
top nodes, trees rolling over), both holdout grids, streams interleaved in batches of any size, rows restored from a
snapshot in the middle of their walk, rows made from operators, rows born with a public theta and rows that end their
holdout in rows."""

from __future__ import annotations

import numpy as np
import pytest

from operators import noise
from operators._chacha_kernel import keystream
from operators._dlap_kernel import sample
from operators._refill_kernel import chacha_blocks, node_noise, node_noise_run, scratch
from operators.columnar import ColumnarRelease, RowOperator
from operators.config import ToPSConfig
from operators.noise import DiscreteLaplace, Domain, KeyedGenerator
from operators.tops import ToPS
from stream.core.router import Router
from tests.support import feed_router, holdout_readings, key_of

SHAPES = [
    ToPSConfig(epsilon=1.0, bound=50, theta=20, query_range=64, fanout=4, smoother_layers=0),  # L 3, R 4, 64 leaves
    ToPSConfig(epsilon=0.5, bound=50, theta=7, query_range=48, fanout=4, smoother_layers=0),  # R 3
    ToPSConfig(epsilon=2.0, bound=30, theta=12, query_range=256, fanout=4, smoother_layers=1, resolution=0.5),
    ToPSConfig(epsilon=1.0, bound=40, theta=9, query_range=27, fanout=3, smoother_layers=0),  # a fanout of 3
    ToPSConfig(epsilon=1.0, bound=40, theta=9, query_range=48, fanout=4, smoother_layers=2),  # one layer: L = 1
    ToPSConfig(epsilon=1.0, bound=20, theta=5, query_range=64, fanout=2, smoother_layers=1),  # five layers
    ToPSConfig(epsilon=1.0, bound=5000, theta=3000, query_range=4096, fanout=16, smoother_layers=0),  # R 16
    ToPSConfig(epsilon=1.0, bound=100, holdout=40, query_range=64, fanout=2),  # theta and s chosen, exact grid
    ToPSConfig(epsilon=1.0, bound=100, holdout=40, query_range=64, fanout=2, holdout_grid="compact"),
]


@pytest.fixture(autouse=True)
def _compiled() -> None:
    noise._kernel(1 << 16)  # the compiled kernels, as a daemon (which draws often) has them


def _releasing(cfg: ToPSConfig, key: bytes, values: np.ndarray) -> tuple[ToPS, np.ndarray]:
    """A ToPS stream past its holdout (if any) and the readings left for its releasing phase."""
    op = ToPS(cfg, key)
    take = cfg.holdout_ticks if cfg.theta is None else 0
    op.process(values[:take])
    return op, values[take:]


def _interleaved(rng: np.random.Generator, per_row: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The readings of every row in a random interleaving that keeps each row's own order."""
    rows = np.concatenate([np.full(v.size, r) for r, v in per_row.items()])
    vals = np.concatenate(list(per_row.values()))
    times = np.concatenate([np.sort(rng.uniform(0, 1, v.size)) for v in per_row.values()])
    order = np.argsort(times, kind="stable")
    return rows[order], vals[order]


def _in_batches(cols: ColumnarRelease, rng: np.random.Generator, rows: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """``cols.process`` over random cuts of the readings (batches of 1 to thousands)."""
    cuts = np.sort(rng.choice(np.arange(1, rows.size), size=min(rows.size - 1, 12), replace=False))
    return np.concatenate([cols.process(r, v) for r, v in zip(np.split(rows, cuts), np.split(vals, cuts),
                                                              strict=True)])


@pytest.mark.parametrize("ahead", [1, 5, 64])
def test_rows_refilled_together_release_what_each_streams_tops_releases(ahead: int) -> None:
    rng = np.random.default_rng(ahead)
    cols = ColumnarRelease(capacity=2, ahead=ahead)
    streams = []
    for i in range(2 * len(SHAPES)):
        cfg = SHAPES[i % len(SHAPES)]
        values = rng.uniform(-5, cfg.bound + 10, size=int(rng.integers(150, 700)))
        streams.append((cfg, rng.bytes(32), values))
    expected, first, second = {}, {}, {}
    for cfg, key, values in streams[: len(SHAPES)]:  # the first half, then the deeper trees join mid-way
        op, rest = _releasing(cfg, key, values)
        r = cols.add(op)
        expected[r] = ToPS(cfg, key).process(values)[values.size - rest.size :]
        first[r], second[r] = rest[: rest.size // 2], rest[rest.size // 2 :]
    got = {r: [] for r in expected}
    rows, vals = _interleaved(rng, first)
    out = _in_batches(cols, rng, rows, vals)
    for r in first:
        got[r].append(out[rows == r])
    for cfg, key, values in streams[len(SHAPES) :]:
        op, rest = _releasing(cfg, key, values)
        r = cols.add(op)
        expected[r] = ToPS(cfg, key).process(values)[values.size - rest.size :]
        second[r] = rest
        got[r] = []
    rows, vals = _interleaved(rng, second)
    out = _in_batches(cols, rng, rows, vals)
    for r in second:
        got[r].append(out[rows == r])
    for r, want in expected.items():
        assert np.array_equal(np.concatenate(got[r]), want), (r, cols.configs[int(cols.config[r])])


@pytest.mark.parametrize("cfg", SHAPES, ids=range(len(SHAPES)))
def test_a_row_restored_in_the_middle_of_its_walk_releases_what_the_uninterrupted_stream_releases(
        cfg: ToPSConfig) -> None:
    """Cuts anywhere: inside a leaf, inside the noise drawn ahead, just after a refill, at a tree's end; each time the
    row's snapshot goes into a new store (``add_snapshot``, which knows none of the walk's shifts), or through a ToPS
    object (``operator`` then ``add``)."""
    rng = np.random.default_rng(cfg.query_range + cfg.fanout)
    key = rng.bytes(32)
    values = rng.uniform(0, cfg.bound * 1.1, size=900)
    op, rest = _releasing(cfg, key, values)
    want = ToPS(cfg, key).process(values)[values.size - rest.size :]
    cols = ColumnarRelease(capacity=1, ahead=7)
    r = cols.add(op)
    got, at = [], 0
    cuts = np.sort(rng.choice(np.arange(1, rest.size), size=9, replace=False)).tolist()
    for k, cut in enumerate([*cuts, rest.size]):
        got.append(cols.process(np.full(cut - at, r), rest[at:cut]))
        at = cut
        snap = cols.snapshot(r)
        cols = ColumnarRelease(capacity=1, ahead=int(rng.integers(1, 9)))
        if k % 2:
            r = cols.add_snapshot(cfg, key, snap)
        else:
            r = cols.add(ToPS.restore(cfg, key, snap))
    assert np.array_equal(np.concatenate(got), want)


def test_rows_born_with_a_public_theta_refill_together_as_their_operators_would_release() -> None:
    cfg = SHAPES[0]
    rng = np.random.default_rng(5)
    keys = [rng.bytes(32) for _ in range(40)]
    cols = ColumnarRelease(capacity=8, ahead=3)
    per_row = {cols.add_new(cfg, k): rng.uniform(0, 60, 200) for k in keys}
    rows, vals = _interleaved(rng, per_row)
    out = _in_batches(cols, rng, rows, vals)
    for (r, values), key in zip(per_row.items(), keys, strict=True):
        assert np.array_equal(out[rows == r], ToPS(cfg, key).process(values)), r


@pytest.mark.parametrize("cfg", SHAPES[:7], ids=range(7))
def test_rows_born_together_are_the_rows_born_one_at_a_time_even_in_freed_rows(cfg: ToPSConfig) -> None:
    """``add_new_many`` (a chunk's new streams) writes every column ``add_new`` writes, into rows freed by streams
    that released before (whose numbers must not leak into the new ones), and the rows release what each stream's
    own ToPS releases."""
    rng = np.random.default_rng(7)
    keys = [rng.bytes(32) for _ in range(30)]
    one, many = ColumnarRelease(capacity=4, ahead=3), ColumnarRelease(capacity=4, ahead=3)
    for cols in (one, many):
        old = [cols.add_new(cfg, rng.bytes(32)) for _ in range(12)]
        cols.process(np.repeat(np.array(old), 40), rng.uniform(0, 60, 480))
        for r in old[::2]:
            cols.release(r)
    rows_one = np.array([one.add_new(cfg, k) for k in keys])
    rows_many = many.add_new_many(cfg, keys)
    assert np.array_equal(rows_one, rows_many)
    for name, _, _ in one._columns():
        if name not in ("noise", "shift"):  # drawn at a row's first refill
            assert np.array_equal(getattr(one, name)[rows_one], getattr(many, name)[rows_many]), name
    per_row = {r: rng.uniform(0, 60, 90) for r in rows_many.tolist()}
    rows, vals = _interleaved(rng, per_row)
    out = _in_batches(many, rng, rows, vals)
    for (r, values), key in zip(per_row.items(), keys, strict=True):
        assert np.array_equal(out[rows == r], ToPS(cfg, key).process(values)), r
    with pytest.raises(ValueError, match="32 bytes"):
        many.add_new_many(cfg, [b"short"])


def test_a_batch_in_which_every_row_runs_out_refills_them_all_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = SHAPES[0]
    rng = np.random.default_rng(11)
    keys = [rng.bytes(32) for _ in range(50)]
    cols = ColumnarRelease(capacity=64, ahead=4)
    rows = np.array([cols.add_new(cfg, k) for k in keys])
    calls = []
    real = ColumnarRelease._refill
    monkeypatch.setattr(ColumnarRelease, "_refill", lambda self, due: calls.append(due.size) or real(self, due))
    batch = np.tile(rows, 3)  # three leaves each (a leaf a tick): every row runs out at its first reading
    values = rng.uniform(0, 60, batch.size)
    out = cols.process(batch, values)
    assert calls == [50]
    heavy = np.concatenate([np.full(10, rows[0]), np.tile(rows[1:], 2)])  # row 0 needs 10 leaves: 2.5 buffers
    heavy_values = rng.uniform(0, 60, heavy.size)
    calls.clear()
    out2 = cols.process(heavy, heavy_values)
    assert calls == [50, 1, 1]  # all of them, then the one that needs more than a buffer, each time it runs out
    for r, key in zip(rows.tolist(), keys, strict=True):
        alone = ToPS(cfg, key).process(np.concatenate([values[batch == r], heavy_values[heavy == r]]))
        assert np.array_equal(np.concatenate([out[batch == r], out2[heavy == r]]), alone), r


@pytest.mark.parametrize("grid", ["exact", "compact"])
def test_streams_ending_their_holdout_in_the_router_release_through_batched_refills_what_each_releases_alone(
        grid: str) -> None:
    """Short holdouts end in rows (``add_started``: no noise drawn yet), longer ones through their operators
    (``add_chosen``); then every stream releases past many leaves, the refills of all of them batched."""
    cfgs = [ToPSConfig(epsilon=1.0, bound=5000, holdout=3, query_range=256, fanout=4, holdout_grid=grid),
            ToPSConfig(epsilon=1.0, bound=100, holdout=40, query_range=64, fanout=2, holdout_grid=grid)]
    names = [f"m{i}" for i in range(60)]
    cfg_of = {name: cfgs[i % 2] for i, name in enumerate(names)}
    rng = np.random.default_rng(len(grid))
    feed = [(name, float(v)) for _ in range(400) for name, v in zip(names, holdout_readings(rng, len(names), 5000),
                                                                   strict=True)]
    router = Router(lambda name: ToPS(cfg_of[name], key_of(name)), 1000)
    router.use_columns(capacity=4, ahead=4)
    got = feed_router(router, feed, 997)
    assert all(type(rec.operator) is RowOperator for rec in router.streams.values())
    assert router.pool is not None and int(router.pool.drawn[: router.pool.rows].min()) > 8  # refilled repeatedly
    for name in names:
        alone = ToPS(cfg_of[name], key_of(name)).process(np.array([v for n, v in feed if n == name]))
        assert got[name] == [(t, float(x)) for t, x in enumerate(alone) if x == x], name


@pytest.mark.parametrize("theta", [3000, 100_000])
def test_a_nodes_noise_is_the_generators_draw_even_past_its_512_bits(theta: int) -> None:
    """The kernel's draw of one node is sample ``i`` of the keyed generator at ``(HIERARCHY << 16 | layer, tree)``,
    including the samples whose 512 bits run out and go on in their overflow keystream (a few in ten thousand at
    these scales)."""
    gen = KeyedGenerator(np.random.default_rng(theta).bytes(32))
    dl = DiscreteLaplace(epsilon=1 / 3, sensitivity=theta)
    layer, tree, n = 2, (1 << 33) + 5, 20_000  # a tree index past 32 bits: both halves of the address
    want = gen.discrete_laplace((int(Domain.HIERARCHY) << 16) | layer, tree, 0, n, dl)
    buf, res, ovf = np.empty(9, np.uint64), np.zeros(1, np.int64), np.zeros(1, np.bool_)
    kw = gen.key_words()
    got = [node_noise(kw, layer, tree, i, dl.log2_t, dl.s, dl.q, dl.r, buf, res, ovf) for i in range(n)]
    assert all(status == 0 for _, status in got)
    assert np.array_equal(want, [v for v, _ in got])
    ws, runs = scratch(4), []
    for first in range(0, n, 64):  # runs of 64 side by side, then the short ones a node's leaves make
        count = min(64, n - first) if first % 128 == 0 else 1 + first % 37
        assert node_noise_run(kw, layer, tree, first, count, dl.log2_t, dl.s, dl.q, dl.r, ws[7], ws) == 0
        runs.append((first, ws[7][:count].copy()))
    assert all(np.array_equal(vals, want[first : first + vals.size]) for first, vals in runs)
    words = keystream(kw, 0, (int(Domain.HIERARCHY) << 16) | layer, tree & 0xFFFFFFFF, tree >> 32, n)
    padded = np.zeros((n, 9), dtype=np.uint64)
    padded[:, :8] = words.reshape(n, 8)
    out, ran_out = np.zeros(n, np.int64), np.zeros(n, np.bool_)
    sample(padded.reshape(-1), 8, dl.log2_t, dl.s, dl.q, dl.r, out, ran_out)
    assert ran_out.any()  # the overflow path was taken, and agreed


def test_blocks_made_side_by_side_are_the_keystreams_blocks() -> None:
    """Any count (not only multiples of the 16 lanes), any counter up to the 32-bit counter's end, any nonce: the
    words of the compiled keystream (itself tested against OpenSSL), each block followed by one zero word."""
    rng = np.random.default_rng(16)
    x, init = np.empty((16, 16), np.uint32), np.empty(16, np.uint32)
    for trial in range(300):
        kw = np.frombuffer(rng.bytes(32), dtype="<u4").astype(np.uint64)
        count = int(rng.integers(1, 65))
        counter = [0, (1 << 32) - count, int(rng.integers(0, (1 << 32) - count))][trial % 3]
        n0, n1, n2 = (int(v) for v in rng.integers(0, 1 << 32, 3))
        out = np.full(9 * 64, 7, dtype=np.uint64)
        chacha_blocks(kw, counter, n0, n1, n2, count, out, x, init)
        want = keystream(kw, counter, n0, n1, n2, count).reshape(count, 8)
        got = out[: 9 * count].reshape(count, 9)
        assert np.array_equal(got[:, :8], want) and not got[:, 8].any(), trial

"""Short holdouts live and end as rows: on the compact grid, a holdout too short to measure a leaf width (the
calibrated choice's small branch) is a row of a columnar holdout from its first reading, takes its last reading in the
row too, its choice is made from the rows (``ColumnarHoldout.choose_ends``) and it goes straight into a release row
(``ColumnarRelease.add_started``), with no ToPS object on the way. Each stream must still release exactly what its
own ``process`` releases (the daemon and ``tops replay`` agree bit for bit), the rows must be the very rows the object
path writes, and a bug in the batch fails its own streams only."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from operators import noise, selection
from operators.columnar import ColumnarRelease, RowOperator
from operators.columnar_holdout import (
    ColumnarHoldout,
    HoldoutRow,
    ShortHoldout,
    born_in_rows,
    ends_in_rows,
    holdout_store,
)
from operators.config import ToPSConfig
from operators.noise import KeyedGenerator, KeyRows, discrete_laplace_one_many
from operators.tops import ToPS, choose_ends
from stream.core import router as router_module
from stream.core.router import Router
from tests.support import failing_batch, feed_router, holdout_readings, key_of

# the compiled kernels loaded, as a daemon (which draws often) has them
pytestmark = pytest.mark.usefixtures("compiled_kernels")


def test_which_configurations_end_in_rows() -> None:
    small = ToPSConfig(epsilon=1.0, bound=5000, holdout=3, holdout_grid="compact")
    assert ends_in_rows(small) and born_in_rows(small)
    exact = ToPSConfig(epsilon=1.0, bound=5000, holdout=3)  # the exact grid: rows of their readings' cells
    assert ends_in_rows(exact) and born_in_rows(exact) and type(holdout_store(exact)) is ShortHoldout
    assert type(holdout_store(small)) is ColumnarHoldout
    assert not born_in_rows(ToPSConfig(epsilon=1.0, bound=5000, holdout=40))  # exact, a width fits twice: objects
    assert not ends_in_rows(ToPSConfig(epsilon=1.0, bound=5000, holdout=3, holdout_grid="compact", selection="paper"))
    long = ToPSConfig(epsilon=1.0, bound=5000, holdout=40, holdout_grid="compact")  # a leaf width fits twice
    assert not ends_in_rows(long) and born_in_rows(long)
    short = ToPSConfig(epsilon=1.0, bound=5000, holdout=5, holdout_grid="compact", lower=1)
    assert not ends_in_rows(short) and not born_in_rows(short)
    assert not born_in_rows(ToPSConfig(epsilon=1.0, bound=5000, theta=10, holdout_grid="compact"))
    # the percentile's branch (m eps large enough), no leaf width measured: the operators choose
    wide = ToPSConfig(epsilon=1.0, bound=5000, holdout=2000, fanout=4096, query_range=4096, holdout_grid="compact")
    assert not ends_in_rows(wide)


@pytest.mark.parametrize("cfg", [
    ToPSConfig(epsilon=1.0, bound=5000, holdout=3, holdout_grid="compact"),
    ToPSConfig(epsilon=1.0, bound=100, holdout=40, holdout_grid="compact", fanout=4, query_range=256),
    ToPSConfig(epsilon=0.5, bound=100, holdout=20, holdout_grid="compact", selection="paper"),
])
def test_a_new_row_is_the_row_of_a_new_operator(cfg: ToPSConfig) -> None:
    """``add_new`` (a new stream's row, no operator built) writes what the general ``add`` (every number of the
    operator copied) writes for a new ToPS, every column; ``add`` of a new operator takes the short path, and of one
    that took readings, the general one."""
    direct, short, via = (ColumnarHoldout(cfg, capacity=2) for _ in range(3))
    keys = [key_of(f"k{i}") for i in range(5)]
    for k in keys:
        direct.add_new(k)
        short.add(ToPS(cfg, k))
        via._add_state(ToPS(cfg, k))
    for name, _, _ in direct._columns():
        assert np.array_equal(getattr(direct, name)[:5], getattr(via, name)[:5]), name
        assert np.array_equal(getattr(short, name)[:5], getattr(via, name)[:5]), name
    assert direct.operator(3).snapshot() == ToPS(cfg, keys[3]).snapshot()
    used = ToPS(cfg, keys[0])
    used.process(np.array([7.0, 9000.0]))
    r = via.add(used)
    assert via.operator(r).snapshot() == used.snapshot() and int(via.clamped[r]) == 1
    with pytest.raises(ValueError, match="32 bytes"):
        direct.add_new(b"short")


@pytest.mark.parametrize("cfg", [
    ToPSConfig(epsilon=1.0, bound=5000, holdout=3, holdout_grid="compact"),
    ToPSConfig(epsilon=1.0, bound=100, holdout=40, holdout_grid="compact", fanout=4, query_range=256),
    ToPSConfig(epsilon=1.0, bound=5000, holdout=3),  # the exact grid: ShortHoldout
])
def test_new_rows_made_together_are_the_rows_made_one_at_a_time(cfg: ToPSConfig) -> None:
    """``add_new_many`` (a chunk of input's new streams) hands out the rows ``add_new`` would, one at a time, freed
    rows first (a former stream's numbers wiped), the store grown as needed, and writes the same columns; a key of
    the wrong length is refused before any row is taken."""
    data = holdout_readings(np.random.default_rng(3), 9, cfg.bound)
    one, many = holdout_store(cfg, capacity=2), holdout_store(cfg, capacity=2)
    for store in (one, many):  # 9 streams that took a reading, 4 of them gone (their rows freed)
        rows = np.array([store.add_new(key_of(f"old{i}")) for i in range(9)], dtype=np.int64)
        store.process(rows, data)
        for r in (2, 7, 0, 5):
            store.release(r)
    keys = [key_of(f"new{i}") for i in range(12)]  # 4 reuse freed rows, 8 are new: the store grows 16 -> 32
    got = many.add_new_many(keys)
    assert got.tolist() == [one.add_new(k) for k in keys]
    assert one.capacity == many.capacity and one.rows == many.rows and one._free == many._free
    for name, _, _ in one._columns():
        assert np.array_equal(getattr(one, name)[: one.rows], getattr(many, name)[: many.rows]), name
    for r, k in zip(got.tolist(), keys, strict=True):
        assert many.key[r].tobytes() == k and many.left(r) == cfg.holdout_ticks
    rows_before = many.rows
    with pytest.raises(ValueError, match="32 bytes"):
        many.add_new_many([key_of("x"), b"short"])
    assert many.rows == rows_before and many._free == one._free
    assert many.add_new_many([]).size == 0


def held_rows(cfg: ToPSConfig, n: int, seed: int) -> tuple[ColumnarHoldout, np.ndarray, list[ToPS], np.ndarray]:
    """``n`` streams whose whole holdout went into rows (in batches of every stream's next reading, a batch of several
    readings of some streams, and the last readings with ``end``), and the same streams as operators that took the
    same readings with ``hold``."""
    rng = np.random.default_rng(seed)
    keys = [rng.bytes(32) for _ in range(n)]
    data = holdout_readings(rng, n * cfg.holdout, cfg.bound).reshape(n, cfg.holdout)
    store = holdout_store(cfg, capacity=8)
    rows = np.array([store.add_new(k) for k in keys], dtype=np.int64)
    if cfg.holdout > 2:  # two readings of every fourth stream in one batch, interleaved with the others'
        some = rows[::4]
        both = np.concatenate([rows, some])
        store.process(both, np.concatenate([data[:, 0], data[::4, 1]]))
        rest = np.setdiff1d(rows, some)
        store.process(rest, data[rest, 1])
        start = 2
    else:
        start = 0
    for t in range(start, cfg.holdout - 1):
        store.process(rows, data[:, t])
    store.process(rows, data[:, -1], end=True)
    ops = [ToPS(cfg, k) for k in keys]
    for op, d in zip(ops, data, strict=True):
        op.hold(d)
    return store, rows, ops, data


@pytest.mark.parametrize("grid", ["compact", "exact"])
@pytest.mark.parametrize("holdout", [1, 2, 3, 7, 31])
@pytest.mark.parametrize(("epsilon", "threshold_epsilon", "bound"), [(1.0, None, 5000.0), (0.3, 0.9, 1e6)])
def test_rows_choose_and_start_what_the_operators_do(grid: str, holdout: int, epsilon: float,
                                                     threshold_epsilon: float | None, bound: float) -> None:
    """From rows: the same state (every snapshot) and the same choices, bit for bit, as the operators' (clamped
    readings and half-unit ties included); the release rows ``add_started`` makes are the rows ``add_chosen`` makes,
    every column; they release the same."""
    cfg = ToPSConfig(epsilon=epsilon, threshold_epsilon=threshold_epsilon, bound=bound, holdout=holdout,
                     holdout_grid=grid, query_range=4096, fanout=16)
    assert ends_in_rows(cfg)
    store, rows, ops, _ = held_rows(cfg, 150, holdout)
    assert [store.operator(int(r)).snapshot() for r in rows] == [op.snapshot() for op in ops]
    chosen = store.choose_ends(rows)
    assert chosen is not None
    thetas, s, starts = chosen
    want = choose_ends(ops)
    assert [(t, s, st) for t, st in zip(thetas, starts, strict=True)] == [
        (sel.theta_units, sel.smoother_layers, sel.start_units) for sel in want]
    assert len(set(thetas)) > 1 and len(set(starts)) > 10
    direct, via = ColumnarRelease(capacity=4), ColumnarRelease(capacity=4)
    made = direct.add_started(cfg, store.key[rows], thetas, s, starts, store.ticks[rows], store.clamped[rows])
    assert made == list(range(150))
    for op, sel in zip(ops, want, strict=True):
        via.add_chosen(op, sel)
    for name, _, _ in direct._columns():
        assert np.array_equal(getattr(direct, name)[:150], getattr(via, name)[:150]), name
    rng = np.random.default_rng(holdout)
    at, more = rng.integers(0, 150, 5000), holdout_readings(rng, 5000, bound)
    assert np.array_equal(direct.process(at, more), via.process(at, more))


def test_rows_refuse_what_is_not_a_holdouts_end() -> None:
    cfg = ToPSConfig(epsilon=1.0, bound=100, holdout=3, holdout_grid="compact")
    store = ColumnarHoldout(cfg, capacity=4)
    a, b = store.add_new(key_of("a")), store.add_new(key_of("b"))
    with pytest.raises(ValueError, match="would end here"):
        store.process(np.array([a, a, a]), np.array([1.0, 2.0, 3.0]))  # the end needs end=True
    with pytest.raises(ValueError, match="more readings than the holdout has left"):
        store.process(np.array([a, a, a, a]), np.array([1.0, 2.0, 3.0, 4.0]), end=True)
    store.process(np.array([a, a, a, b]), np.array([1.0, 2.0, 3.0, 4.0]), end=True)
    with pytest.raises(ValueError, match="took its last reading"):
        store.choose_ends(np.array([a, b]))  # b has two readings to come
    assert store.choose_ends(np.array([a])) is not None
    long = ColumnarHoldout(ToPSConfig(epsilon=1.0, bound=100, holdout=40, holdout_grid="compact"), capacity=2)
    r = long.add_new(key_of("c"))
    with pytest.raises(ValueError, match="do not end in rows"):
        long.process(np.array([r]), np.array([1.0]), end=True)
    with pytest.raises(ValueError, match="become rows"):
        ColumnarRelease().add_started(ToPSConfig(epsilon=1.0, bound=100, holdout=3, smoother="moving"),
                                      store.key[[a]], [4], 1, [2.0], np.array([3]), np.array([0]))


@pytest.mark.parametrize("grid", ["compact", "exact"])
def test_keys_written_through_the_flat_view_land_in_their_rows_as_the_store_grows(grid: str) -> None:
    """``write_key`` writes a new row's key through a flat view of the key column: the view follows the column when
    the store grows (a new array), a freed row's key is wiped and a reused row takes the new key."""
    cfg = ToPSConfig(epsilon=1.0, bound=5000, holdout=3, holdout_grid=grid)
    store = holdout_store(cfg, capacity=1)
    rng = np.random.default_rng(9)
    keys = [rng.bytes(32) for _ in range(40)]
    rows = [store.add_new(k) for k in keys]  # grows 1 -> 64, the view made again at each growth
    assert store.capacity == 64
    assert [store.key[r].tobytes() for r in rows] == keys
    store.release(rows[7])
    assert not store.key[rows[7]].any()
    again = rng.bytes(32)
    assert store.add_new(again) == rows[7] and store.key[rows[7]].tobytes() == again
    assert [store.key[r].tobytes() for r in rows if r != rows[7]] == keys[:7] + keys[8:]


def test_key_rows_are_the_streams_generators_and_stay_secret() -> None:
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 256, (40, 32), dtype=np.uint8)
    rows, gens = KeyRows(keys), [KeyedGenerator(k.tobytes()) for k in keys]
    assert np.array_equal(rows.key_words(), np.stack([g.key_words() for g in gens]))
    assert [r.words(1, 4, 0, 30).tolist() for r in rows[5:9]] == [g.words(1, 4, 0, 30).tolist() for g in gens[5:9]]
    dls = [noise.DiscreteLaplace(0.2, int(s)) for s in rng.integers(1, 5000, 40)]
    assert discrete_laplace_one_many(rows, 1, 3, 0, dls) == discrete_laplace_one_many(gens, 1, 3, 0, dls)
    assert rows[7].words(2, 9, 0, 5).tolist() == gens[7].words(2, 9, 0, 5).tolist()
    assert keys[0].tobytes().hex() not in repr(rows) and "secret" in repr(rows)
    with pytest.raises(TypeError, match="not picklable"):
        pickle.dumps(rows)
    with pytest.raises(ValueError, match="uint8"):
        KeyRows(keys.astype(np.int64))


CFGS = [ToPSConfig(epsilon=1.0, bound=5000, holdout=3, holdout_grid="compact"),
        ToPSConfig(epsilon=0.5, bound=5000, holdout=5),  # the exact grid: objects
        ToPSConfig(epsilon=1.0, bound=5000, holdout=7, holdout_grid="compact", fanout=4, query_range=256)]


@pytest.mark.parametrize(("step", "together"), [(1, 8192), (40, 8192), (5000, 8192), (5000, 7)])
def test_the_router_ends_rows_in_rows(step: int, together: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Streams of configurations that end in rows are rows from their first reading and never an operator on the way
    to their release row (``take`` is never called), alongside streams that are objects; each releases what it
    releases alone, and the router's counts stay right; also when a step's ends are chosen a few rows at a time
    (``together``, below the 30 of a configuration that end in one step)."""
    monkeypatch.setattr(router_module, "ROWS_ENDED_TOGETHER", together)
    taken = []
    real_take = ColumnarHoldout.take
    monkeypatch.setattr(ColumnarHoldout, "take", lambda self, r: taken.append(r) or real_take(self, r))
    names = [f"m{i}" for i in range(90)]
    cfg_of = {name: CFGS[i % 3] for i, name in enumerate(names)}
    rng = np.random.default_rng(step)
    feed = [(name, float(v)) for _ in range(12) for name, v in zip(names, holdout_readings(rng, len(names), 5000),
                                                                  strict=True)]
    router = Router(lambda name: ToPS(cfg_of[name], key_of(name)), 1000)
    router.use_columns(capacity=4)
    router.record("m0")
    assert type(router.streams["m0"].operator) is HoldoutRow
    got = feed_router(router, feed, step)
    assert not taken
    assert router.in_holdout == 0 and all(rec.phase == "releasing" for rec in router.streams.values())
    assert all(type(rec.operator) is RowOperator for rec in router.streams.values())
    assert router.ticks_total == len(feed)
    assert all(len(store) == 0 for store in router.holdouts.values())  # every holdout row was freed
    for name in names:
        values = np.array([v for n, v in feed if n == name])
        alone = ToPS(cfg_of[name], key_of(name)).process(values)
        assert got[name] == [(t, float(x)) for t, x in enumerate(alone) if x == x], name
        assert router.streams[name].ticks == 12


def test_without_the_compiled_kernels_rows_are_given_back_to_their_operators(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selection, "_counts_kernel", lambda: None)
    names = [f"m{i}" for i in range(40)]
    router = Router(lambda name: ToPS(CFGS[0], key_of(name)), 100)
    router.use_columns(capacity=4)
    rng = np.random.default_rng(3)
    feed = [(n, float(v)) for _ in range(5) for n, v in zip(names, holdout_readings(rng, 40, 5000), strict=True)]
    got = feed_router(router, feed, 25)
    for name in names:
        alone = ToPS(CFGS[0], key_of(name)).process(np.array([v for n, v in feed if n == name]))
        assert got[name] == [(t, float(x)) for t, x in enumerate(alone) if x == x], name
    assert router.in_holdout == 0


def test_a_failing_batch_of_rows_fails_its_streams_only(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    def broken(self: ColumnarHoldout, rows: np.ndarray) -> None:
        raise RuntimeError("choice bug 77.5")

    router = failing_batch(CFGS[0], lambda: monkeypatch.setattr(ColumnarHoldout, "choose_ends", broken), caplog)
    monkeypatch.undo()
    noise._kernel(1 << 16)
    got = feed_router(router, [("m3", 1.0), ("fresh", 2.0), ("fresh", 3.0), ("m3", 4.0)], 4)  # the others go on
    assert set(got) == {"m3"} and router.streams["fresh"].phase == "releasing"


@pytest.mark.parametrize("cfg", [CFGS[0], ToPSConfig(epsilon=1.0, bound=5000, holdout=3)])
def test_a_checkpoint_gets_the_states_at_the_cut_of_rows_ended_in_rows(cfg: ToPSConfig) -> None:
    """Holdout rows lent to a checkpoint's writer, then ended row to row before the writer made their states: what
    the writer makes is each stream's state at its cut (the row was freed and its key wiped in between)."""
    import json

    from stream.state.records import Lent, record_state, record_states

    names = [f"m{i}" for i in range(40)]
    router = Router(lambda name: ToPS(cfg, key_of(name)), 100)
    router.use_columns()
    feed_router(router, [(n, float(i)) for i, n in enumerate(names)] * 2, 10_000)  # one reading left each
    recs = list(router.streams.values())
    assert all(type(rec.operator) is HoldoutRow for rec in recs)
    wants = {r.name: json.dumps(record_state(r), separators=(",", ":")) for r in recs}
    states = record_states(recs)
    assert all(type(s) is tuple and isinstance(s[0], Lent) for s in states.values())
    feed_router(router, [(n, 60.0) for n in names] * 2, 10_000)  # the ends (in rows) and a release each
    assert all(type(rec.operator) is RowOperator for rec in recs)
    made = {n: json.dumps(states[n][0].state(states[n][1]), separators=(",", ":")) for n in names}
    assert made == wants


@pytest.mark.parametrize("born", ["holdout-row", "release-row"])
def test_streams_born_as_rows_restart_and_release_what_each_releases_alone(tmp_path, born: str) -> None:
    """`tops run` with durable state and a configuration whose new streams are rows (no ToPS built for them): holdout
    rows (a holdout that ends in rows) or, with a public theta, release rows from the first reading. Streams stored
    (in their holdout, or releasing), restored at their next reading after a restart (the first one teaches the
    restart the operators' kind: the row made for that is given back), new streams among them, holdouts ending in
    rows in every run: each stream releases what its own operator releases from its readings with its key."""

    from operators.columnar import born_releasing
    from stream.core.keys import derive_stream_key, load_master_key
    from tests.support import identity_from_log, release_lines, tops, write_toml

    template: dict[str, object] = {"epsilon": 1.0, "bound": 5000.0, "query_range": 256, "fanout": 4}
    template.update({"holdout": 3, "holdout_grid": "compact"} if born == "holdout-row" else {"theta": 2500.0})
    cfg_file = write_toml(tmp_path / "tops.toml", {
        "input": {"source": "stdin"}, "output": {"sinks": ["stdout"]},
        "streams": {"key_file": str(tmp_path / "master.key"), "template": template},
        "metrics": {"port": 0}, "state": {"data_dir": str(tmp_path / "state")}})
    cfg = ToPSConfig(**template)  # type: ignore[arg-type]
    assert ends_in_rows(cfg) if born == "holdout-row" else born_releasing(cfg)
    rng = np.random.default_rng(23)
    names = [f"s{i}" for i in range(120)]
    values = {n: holdout_readings(rng, 9, 5000.0) for n in names}
    old, new = names[:80], names[80:]  # the new ones appear in the second run
    runs = [[(old, 0, 2)], [(old, 2, 5), (new, 0, 5)], [(names, 5, 9)]]
    got: dict[str, dict[int, float]] = {n: {} for n in names}
    identities = set()
    for parts in runs:
        lines = "".join(f"{n},{float(values[n][i])!r}\n" for who, lo, hi in parts for i in range(lo, hi) for n in who)
        r = tops("run", "--config", str(cfg_file), stdin=lines.encode(), timeout=120)
        err = r.stderr.decode()
        assert r.returncode == 0 and "Traceback" not in err, err[-2000:]
        identities.add(identity_from_log(err))
        for rel in release_lines(r.stdout):
            assert rel["tick"] not in got[rel["stream"]]  # never released twice
            got[rel["stream"]][rel["tick"]] = rel["value"]
    assert len(identities) == 1  # the store's
    master = load_master_key(tmp_path / "master.key")
    for n in names:
        alone = ToPS(cfg, derive_stream_key(master, n, identity=next(iter(identities))))
        assert got[n] == {t: float(x) for t, x in enumerate(alone.process(values[n])) if x == x}, n


@pytest.mark.parametrize("born", ["holdout-row", "release-row"])
def test_the_first_stored_stream_after_a_restart_leaves_no_row_behind(tmp_path, born: str) -> None:
    """After a restart the first stored stream makes a new stream's operator to learn the operators' kind (a holdout
    row, or a release row with a public theta, for a configuration whose new streams are rows): that row goes back at
    once; only the restored streams' rows stay."""
    import asyncio

    from tests.support import started, stdin_config, stdin_daemon, tops

    small: dict[str, object] = {"holdout": 3, "holdout_grid": "compact"} if born == "holdout-row" else {"theta": 60.0}
    cfg = stdin_config(tmp_path)
    lines = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in {"holdout": 50, **small}.items())
    text = cfg.read_text().replace("holdout = 50", lines)  # the in-process daemon's template: TEMPLATE and these
    assert all(k in text for k in small)
    cfg.write_text(text)
    assert tops("run", "--config", str(cfg), stdin=b"p,1\nq,2\nr,3\n").returncode == 0
    d = stdin_daemon(tmp_path, **small)
    asyncio.run(started(d))
    try:
        d.on_lines([b"p,4", b"q,5"])
        stores = list(d.router.holdouts.values()) if born == "holdout-row" else [d.router.pool]
        assert [len(s) for s in stores] == [2]  # p and q: their rows, and no other
        d.on_lines([b"new,6"])
        assert [len(s) for s in stores] == [3]
        kind = HoldoutRow if born == "holdout-row" else RowOperator
        assert type(d.router.streams["new"].operator) is kind
        made = d.keyed_operator(bytes(32))  # the daemon's factory makes the row itself (no ToPS built first)
        assert type(made) is kind and [len(s) for s in stores] == [4]
        made.free()
    finally:
        d.shutdown()


def test_a_public_thetas_new_row_is_the_row_its_operator_becomes() -> None:
    """``ColumnarRelease.add_new`` (a public theta: a stream releasing from its first reading) writes every column as
    :meth:`ColumnarRelease.add` of ``ToPS(config, key)`` does, on several configurations (units other than 1, a theta
    above the bound), and the rows release what each stream's own operator releases; it refuses a configuration with
    a holdout, another smoother, a lower bound or a bad key."""
    from operators.columnar import born_releasing

    cfgs = [ToPSConfig(epsilon=1.0, bound=5000, theta=100.0),
            ToPSConfig(epsilon=0.5, bound=100, theta=7.3, fanout=4, query_range=256, resolution=0.5),
            ToPSConfig(epsilon=2.0, bound=1000, theta=1000.0, fanout=2, query_range=64)]
    rng = np.random.default_rng(31)
    for cfg in cfgs:
        assert born_releasing(cfg)
        objects, born = ColumnarRelease(capacity=1), ColumnarRelease(capacity=1)
        keys = [rng.bytes(32) for _ in range(6)]
        rows = [born.add_new(cfg, k) for k in keys]
        assert [objects.add(ToPS(cfg, k)) for k in keys] == rows
        for name, _, _ in objects._columns():
            assert np.array_equal(getattr(objects, name)[:6], getattr(born, name)[:6]), name
        values = rng.uniform(0.0, 1.2 * cfg.bound, size=(6, 70))  # past a refill of the noise drawn ahead
        want = [ToPS(cfg, k).process(v) for k, v in zip(keys, values, strict=True)]
        got = [[born.process(np.array([r]), values[i, t : t + 1])[0] for i, r in enumerate(rows)] for t in range(70)]
        assert np.array_equal(np.stack(want), np.array(got).T)  # tick by tick, the streams interleaved
    for bad in (ToPSConfig(epsilon=1.0, bound=100, holdout=20), ToPSConfig(epsilon=1.0, bound=100, theta=5.0,
                                                                           smoother="moving"),
                ToPSConfig(epsilon=1.0, bound=100, theta=50.0, lower=10.0)):
        assert not born_releasing(bad)
        with pytest.raises(ValueError, match="public theta"):
            ColumnarRelease().add_new(bad, bytes(32))
    with pytest.raises(ValueError, match="32 bytes"):
        ColumnarRelease().add_new(cfgs[0], b"short")


def test_every_release_of_a_row_carries_its_streams_theta() -> None:
    """The router gives a row's releases the theta the stream's operator has (``theta_units * resolution``, read
    for all rows of a step at once), on a grid where a unit is not 1."""
    cfg = ToPSConfig(epsilon=1.0, bound=500, holdout=3, holdout_grid="compact", resolution=0.25)
    router = Router(lambda name: ToPS(cfg, key_of(name)), 100)
    router.use_columns()
    rng = np.random.default_rng(2)
    seen = 0
    for _ in range(8):
        for n in range(30):
            rec = router.record(f"m{n}")
            router.add(rec, float(rng.integers(0, 400)) / 3, None, None, 0.0)
        for b in router.flush():
            assert type(b.record.operator) is RowOperator
            assert b.theta == ToPS.restore(cfg, key_of(b.record.name), b.record.operator.snapshot()).theta
            seen += 1
    assert seen == 30 * 5


def test_a_short_row_holds_an_operators_holdout_as_its_readings_cells() -> None:
    """A short row (exact grid) made from an operator part-way through its holdout gives back the very operator: the
    same snapshot, the same histogram with its cells in the order the stream met them; a state that does not hold
    together (a forged store) stays an operator; the row is 4 bytes a reading and a few numbers."""
    cfg = ToPSConfig(epsilon=1.0, bound=5000, holdout=7)
    store = holdout_store(cfg, capacity=2)
    assert type(store) is ShortHoldout and store.row_nbytes() == 4 * 7 + 16 + 32
    rng = np.random.default_rng(8)
    for k in range(40):
        op = ToPS(cfg, key_of(f"s{k}"))
        data = holdout_readings(rng, 7, cfg.bound)
        op.hold(data[: k % 7])
        r = store.add(op)
        back = store.operator(r)
        assert back.snapshot() == op.snapshot() and list(back._hist.items()) == list(op._hist.items())
        store.process(np.full(7 - k % 7, r), data[k % 7 :], end=True)
        op.hold(data[k % 7 :])
        assert store.operator(r).snapshot() == op.snapshot() and store.operator(r).clamped == op.clamped
        store.release(r)
    forged = ToPS(cfg, key_of("f"))
    forged.hold([1.0, 2.0])
    forged._hist[5] = 3  # more counts than readings
    with pytest.raises(ValueError, match="not one a short row holds"):
        store.add(forged)
    a = store.add_new(key_of("a"))
    with pytest.raises(ValueError, match="would end here"):
        store.process(np.full(7, a), np.ones(7))
    with pytest.raises(ValueError, match="more readings than the holdout has left"):
        store.process(np.full(8, a), np.ones(8), end=True)
    with pytest.raises(ValueError, match="took its last reading"):
        store.choose_ends(np.array([a]))
    with pytest.raises(ValueError, match="ends in rows"):
        ShortHoldout(ToPSConfig(epsilon=1.0, bound=5000, holdout=40))


def test_a_store_told_the_most_rows_it_holds_grows_no_further() -> None:
    """A store made with ``most`` (the daemon's stream cap) doubles as it fills but stops at ``most`` rows: no room
    for rows that can never come (at a cap of 100,000 streams, doubling alone would make room for 131,072)."""
    from operators.columnar import ColumnarRelease

    cfg = ToPSConfig(epsilon=1.0, bound=5000, holdout=3)
    store = holdout_store(cfg, capacity=4, most=50)
    rows = [store.add_new(bytes([i]) * 32) for i in range(50)]
    assert store.capacity == 50 and sorted(rows) == list(range(50))
    release = ColumnarRelease(capacity=4, most=50)
    got, _ = release.new_rows(33)
    assert release.capacity == 50 and got.tolist() == list(range(33))
    got, _ = release.new_rows(20)  # past the most it was told of: room for what is asked, no more
    assert release.capacity == 53

"""Many holdouts ended together: ``ToPS.hold`` takes a holdout's last readings without the choice,
``end_holdouts`` makes the choices of many streams at once (the small holdout's branch of the calibrated choice in a
few compiled calls: ``operators.selection.choose_small_many``), and the router ends every holdout of a processing step
that way. Each stream must release exactly what its own ``process`` releases (a daemon and ``tops replay`` must agree,
bit for bit), whatever the grid, the holdout length, the budget, clamped readings or half-unit ties; a bug in the
batch fails its own streams only."""

from __future__ import annotations

import numpy as np
import pytest

from operators import selection
from operators.columnar import ColumnarRelease
from operators.config import ToPSConfig
from operators.noise import DiscreteLaplace, KeyedGenerator, discrete_laplace_one_many
from operators.tops import ToPS, choose_ends, end_holdouts
from stream.core.router import Router
from tests.support import failing_batch, feed_router, holdout_readings, key_of

# the compiled kernels loaded, as a daemon (which draws often) has them
pytestmark = pytest.mark.usefixtures("compiled_kernels")


def ended_together(cfg: ToPSConfig, n: int, seed: int, after: int = 5) -> tuple[list[ToPS], list[ToPS], np.ndarray]:
    """``n`` streams run by ``process`` alone, and the same streams held then ended together, then ``after`` more
    readings each through ``process``; returns both sets of operators and the readings."""
    rng = np.random.default_rng(seed)
    keys = [rng.bytes(32) for _ in range(n)]
    data = holdout_readings(rng, n * (cfg.holdout + after), cfg.bound).reshape(n, -1)
    alone = [ToPS(cfg, k) for k in keys]
    together = [ToPS(cfg, k) for k in keys]
    ref = [op.process(d) for op, d in zip(alone, data, strict=True)]
    for op, d in zip(together, data, strict=True):
        op.hold(d[: cfg.holdout])
    end_holdouts(together)
    for op, d, r in zip(together, data, ref, strict=True):
        got = np.concatenate([np.full(cfg.holdout, np.nan), op.process(d[cfg.holdout :])])
        assert np.array_equal(got, r, equal_nan=True)
    return alone, together, data


@pytest.mark.parametrize("grid", ["compact", "exact"])
@pytest.mark.parametrize("holdout", [1, 2, 3, 7, 9, 31])
def test_holdouts_ended_together_release_what_each_releases_alone(grid: str, holdout: int) -> None:
    cfg = ToPSConfig(epsilon=1.0, bound=5000, holdout=holdout, holdout_grid=grid)
    alone, together, _ = ended_together(cfg, 120, holdout)
    for a, b in zip(alone, together, strict=True):
        assert a.snapshot() == b.snapshot()
        assert (a.theta_units, a.smoother_layers, a.start_units) == (b.theta_units, b.smoother_layers, b.start_units)


@pytest.mark.parametrize(("epsilon", "threshold_epsilon", "bound", "fixed_s", "fanout"), [
    (0.1, None, 500, None, 16), (0.1, None, 500, 1, 16), (4.0, 0.5, 100, None, 4), (2.0, None, 1e6, 2, 16),
    (1.0, 3.0, 20, None, 2)])
def test_every_budget_and_shape_of_the_small_branch(epsilon: float, threshold_epsilon: float | None, bound: float,
                                                    fixed_s: int | None, fanout: int) -> None:
    cfg = ToPSConfig(epsilon=epsilon, threshold_epsilon=threshold_epsilon, bound=bound, holdout=3,
                     smoother_layers=fixed_s, fanout=fanout, query_range=4096)
    alone, together, _ = ended_together(cfg, 80, int(bound))
    assert [a.snapshot() for a in alone] == [b.snapshot() for b in together]


def test_the_small_branch_is_compiled_and_the_others_are_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """Holdouts of the small branch never reach the per-stream choice; holdouts that measure a leaf width (m >= 2b)
    or take the percentile's step (a large m eps) go through it, with the same result."""
    calls = []
    real = selection.choose

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)

    import operators.tops as tops

    monkeypatch.setattr(tops, "choose", counted)
    for cfg, n, chosen_alone in [
            (ToPSConfig(epsilon=1.0, bound=5000, holdout=5, holdout_grid="compact"), 50, 0),
            (ToPSConfig(epsilon=1.0, bound=5000, holdout=40, holdout_grid="compact"), 20, 20),  # a width fits twice
            # the percentile's branch (m eps large enough), nothing measured
            (ToPSConfig(epsilon=1.0, bound=5000, holdout=2000, fanout=4096, query_range=4096), 4, 4)]:
        rng = np.random.default_rng(n)
        ops = [ToPS(cfg, rng.bytes(32)) for _ in range(n)]
        for op in ops:
            op.hold(holdout_readings(rng, cfg.holdout, cfg.bound))
        calls.clear()
        end_holdouts(ops)
        assert len(calls) == chosen_alone and all(op.phase == "releasing" for op in ops)


def test_without_the_compiled_kernels_each_stream_chooses_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selection, "_counts_kernel", lambda: None)
    cfg = ToPSConfig(epsilon=1.0, bound=5000, holdout=3)
    alone, together, _ = ended_together(cfg, 30, 4)
    assert [a.snapshot() for a in alone] == [b.snapshot() for b in together]


@pytest.mark.parametrize("grid", ["compact", "exact"])
def test_choices_whose_first_words_run_out_are_made_again_the_same(grid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled report-noisy-max gets the keystream's first words (two blocks) and says when they run out; those
    streams are chosen again with more, and past that in Python. With one block, then two, many run out at each
    stage: every choice, theta and start alike, is still the one made with enough words."""
    cfg = ToPSConfig(epsilon=1.0, bound=5000, holdout=3, holdout_grid=grid)
    _, enough, _ = ended_together(cfg, 200, 4)
    monkeypatch.setattr(selection, "_KERNEL_WORDS", (8, 16))
    alone, short, _ = ended_together(cfg, 200, 4)
    assert [a.snapshot() for a in alone] == [b.snapshot() for b in short] == [c.snapshot() for c in enough]


def test_hold_and_end_refuse_what_is_not_a_holdouts_end() -> None:
    cfg = ToPSConfig(epsilon=1.0, bound=100, holdout=3)
    op = ToPS(cfg, key_of("a"))
    with pytest.raises(ValueError, match="at most the readings"):
        op.hold([1.0, 2.0, 3.0, 4.0])
    op.hold([1.0, 2.0])
    done = ToPS(cfg, key_of("b"))
    done.hold([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="took its last reading"):
        end_holdouts([done, op])  # op still has a reading to take: nothing is chosen, not even done's
    assert done.theta_units is None
    end_holdouts([done])
    assert done.theta_units is not None
    with pytest.raises(ValueError, match="at most the readings"):
        done.hold([1.0])


def test_the_batched_draws_are_each_streams_own() -> None:
    """``discrete_laplace_one_many`` gives every generator's own draw, from generators or key rows."""
    from operators import noise

    rng = np.random.default_rng(5)
    gens = [KeyedGenerator(rng.bytes(32)) for _ in range(40)]
    rows = noise.KeyRows(np.stack([np.frombuffer(g._key, dtype=np.uint8) for g in gens]))
    noises = [DiscreteLaplace(0.1, int(s)) for s in rng.integers(1, 5000, 40)]
    many = discrete_laplace_one_many(gens, 1, 3, 0, noises)
    assert many == [g.discrete_laplace_one(1, 3, 0, dl) for g, dl in zip(gens, noises, strict=True)]
    assert discrete_laplace_one_many(rows, 1, 3, 0, noises) == many
    assert len(set(many)) > 30
    # a few distinct noises shared by many streams (``which``: each stream's): the same draws as each given its own
    distinct = noises[:3]
    which = rng.integers(0, 3, 40)
    assert discrete_laplace_one_many(rows, 1, 3, 0, distinct, which) == [
        g.discrete_laplace_one(1, 3, 0, distinct[w]) for g, w in zip(gens, which.tolist(), strict=True)]
    with pytest.raises(ValueError, match="one noise for each"):
        discrete_laplace_one_many(rows, 1, 3, 0, distinct, which[:-1])
    compiled = noise._kernel_state["one"]
    try:  # without the compiled kernels: the same draws one by one
        noise._kernel_state["one"] = None
        assert discrete_laplace_one_many(rows, 1, 3, 0, distinct, which) == [
            g.discrete_laplace_one(1, 3, 0, distinct[w]) for g, w in zip(gens, which.tolist(), strict=True)]
    finally:
        noise._kernel_state["one"] = compiled


@pytest.mark.parametrize("step", [1, 40, 5000])
def test_the_router_ends_a_steps_holdouts_together(step: int) -> None:
    """Streams of three configurations (objects, and rows of a columnar holdout on the compact grid) end their
    holdouts in the same steps, with readings after the end in the same step: each releases what it releases alone,
    and the router's counts of ticks and holdouts stay right."""
    cfgs = [ToPSConfig(epsilon=1.0, bound=5000, holdout=3, holdout_grid="compact"),
            ToPSConfig(epsilon=0.5, bound=5000, holdout=5),
            ToPSConfig(epsilon=1.0, bound=5000, holdout=20, holdout_grid="compact", fanout=4, query_range=256)]
    names = [f"m{i}" for i in range(90)]
    cfg_of = {name: cfgs[i % 3] for i, name in enumerate(names)}
    rng = np.random.default_rng(step)
    feed = [(name, float(v)) for _ in range(30) for name, v in zip(names, holdout_readings(rng, len(names), 5000),
                                                                  strict=True)]
    router = Router(lambda name: ToPS(cfg_of[name], key_of(name)), 1000)
    router.use_columns(capacity=4)
    got = feed_router(router, feed, step)
    assert router.in_holdout == 0 and all(rec.phase == "releasing" for rec in router.streams.values())
    assert router.ticks_total == len(feed)
    for name in names:
        values = np.array([v for n, v in feed if n == name])
        alone = ToPS(cfg_of[name], key_of(name)).process(values)
        assert got[name] == [(t, float(x)) for t, x in enumerate(alone) if x == x], name
        assert router.streams[name].ticks == 30


def test_a_failing_batch_fails_its_streams_only(monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    import stream.core.router as router_module

    def broken(ops: list[ToPS]) -> None:
        raise RuntimeError("choice bug 77.5")

    # a holdout that measures a leaf width: objects (the short ones are rows: test_short_holdouts_live_as_rows.py)
    failing_batch(ToPSConfig(epsilon=1.0, bound=100, holdout=9, fanout=4, query_range=256),
                  lambda: monkeypatch.setattr(router_module, "choose_ends", broken), caplog)


def test_a_checkpoint_gets_the_states_at_the_cut_of_holdouts_ended_together() -> None:
    """Holdout states lent to a checkpoint's writer (objects and rows of a columnar holdout), then changed before the
    writer made them: by a reading each that stays in the holdout (taken by ``hold``), then, at a second cut, by the
    readings that end them all together: what the writer makes is each stream's state at its cut."""
    import json

    from stream.state.records import Lent, record_state, record_states

    cfgs = [ToPSConfig(epsilon=1.0, bound=100, holdout=9, fanout=4, query_range=256),  # objects (it measures a width)
            ToPSConfig(epsilon=1.0, bound=100, holdout=40, holdout_grid="compact")]
    names = [f"m{i}" for i in range(40)]
    router = Router(lambda name: ToPS(cfgs[int(name[1:]) % 2], key_of(name)), 100)
    router.use_columns()
    rng = np.random.default_rng(9)
    feed_router(router, [(n, float(rng.integers(0, 90))) for n in names], 80)
    left = [(n, float(rng.integers(0, 90))) for n in names for _ in range(router.streams[n].operator.holdout_left - 2)]
    feed_router(router, left, 10_000)  # every stream two readings before its holdout's end
    assert sum(type(rec.operator) is not ToPS for rec in router.streams.values()) == len(names) // 2  # rows
    for last in (False, True):
        assert all(rec.operator.holdout_left == 1 + (not last) for rec in router.streams.values())
        recs = list(router.streams.values())
        wants = {r.name: json.dumps(record_state(r), separators=(",", ":")) for r in recs}
        states = record_states(recs)
        lent = [n for n, s in states.items() if type(s) is tuple and isinstance(s[0], Lent)]
        assert len(lent) == len(names)
        feed = [(n, 50.0) for n in names] + ([(n, 60.0) for n in names] if last else [])
        feed_router(router, feed, 10_000)  # a reading each that stays; then the ends and a release each
        made = {n: json.dumps(states[n][0].state(states[n][1]), separators=(",", ":")) for n in lent}
        assert made == wants
    assert router.in_holdout == 0


@pytest.mark.parametrize("grid", ["compact", "exact"])
def test_the_daemon_ends_many_holdouts_in_a_step_as_replay_does(tmp_path, grid: str) -> None:
    """`tops run` on stdin with 300 streams of holdout 3 fed all at once (hundreds of holdouts end in each processing
    step, with readings after the end in the same step): every stream releases what `tops replay` releases from its
    readings with the same key (one stream checked by the command itself, all of them by the operator it runs)."""
    import json
    import subprocess
    import sys

    from stream.core.keys import derive_stream_key, load_master_key
    from tests.support import ROOT, identity_from_log

    params = ["--epsilon", "1", "--holdout", "3", "--range", "256", "--fanout", "4", "--bound", "5000"]
    rng = np.random.default_rng(31)
    names = [f"s{i}" for i in range(300)]
    values = {n: holdout_readings(rng, 7, 5000.0) for n in names}
    lines = "".join(f"{n},{float(values[n][i])!r}\n" for i in range(7) for n in names)
    key = tmp_path / "master.key"
    proc = subprocess.run([sys.executable, "-m", "stream.cli", "run", *params, "--holdout-grid", grid, "--key-file",
                           str(key)], input=lines.encode(), capture_output=True, cwd=ROOT, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    identity = identity_from_log(proc.stderr.decode())
    got: dict[str, dict[int, float]] = {n: {} for n in names}
    for line in proc.stdout.splitlines():
        r = json.loads(line)
        got[r["stream"]][r["tick"]] = r["value"]
    cfg = ToPSConfig(epsilon=1.0, holdout=3, query_range=256, fanout=4, bound=5000.0, holdout_grid=grid)
    master = load_master_key(key)
    for n in names:
        alone = ToPS(cfg, derive_stream_key(master, n, identity=identity)).process(values[n])
        assert got[n] == {t: float(x) for t, x in enumerate(alone) if x == x}, n
    src, out = tmp_path / "s7.npy", tmp_path / "s7.out.npy"
    np.save(src, values["s7"])
    subprocess.run([sys.executable, "-m", "stream.cli", "replay", str(src), *params, "--holdout-grid", grid,
                    "--key-file", str(key), "--identity", identity, "--stream", "s7", "--out", str(out)], cwd=ROOT,
                   check=True, capture_output=True, timeout=120)
    assert got["s7"] == {t: float(v) for t, v in enumerate(np.load(out)) if v == v}


@pytest.mark.parametrize(("selection", "holdout"), [("calibrated", 5), ("paper", 5), ("calibrated", 300)])
def test_a_stream_goes_straight_into_the_row_its_started_operator_would_make(selection: str, holdout: int) -> None:
    """``ColumnarRelease.add_chosen`` (the router's path for a holdout that ends in a batch) writes the very row that
    ``add`` writes for the operator once started with the same choice, every column, whichever s the choice took
    (a holdout of 300 measures its leaf widths: s varies between streams); it refuses what is no row."""
    cfg = ToPSConfig(epsilon=0.7, bound=5000, holdout=holdout, holdout_grid="compact", selection=selection,
                     query_range=4096, fanout=4)
    rng = np.random.default_rng(17)
    keys = [rng.bytes(32) for _ in range(60)]
    data = holdout_readings(rng, 60 * 5, cfg.bound).reshape(60, 5)
    if holdout > 5:  # random walks: a smooth series, for which a coarser smoother pays
        data = np.cumsum(rng.integers(-3, 4, (60, holdout)), axis=1).clip(0) + rng.integers(0, 50, (60, 1))
    ops = [ToPS(cfg, k) for k in keys]
    for op, d in zip(ops, data, strict=True):
        op.hold(d)
    chosen = choose_ends(ops)
    if holdout > 5:
        assert len({sel.smoother_layers for sel in chosen}) > 1
    direct, via = ColumnarRelease(capacity=4), ColumnarRelease(capacity=4)
    for op, sel in zip(ops, chosen, strict=True):
        direct.add_chosen(op, sel)
        op.start(sel)
        via.add(op)
    for name, _, _ in direct._columns():
        assert np.array_equal(getattr(direct, name)[:60], getattr(via, name)[:60]), name
    more = rng.integers(0, 100, 4000).astype(float)
    rows = rng.integers(0, 60, 4000)
    assert np.array_equal(direct.process(rows, more), via.process(rows, more))
    held = ToPS(cfg, keys[0])
    held.hold(data[0][: holdout - 1])  # one reading left
    for bad in (held, ops[0], ToPS(ToPSConfig(epsilon=1.0, bound=100, holdout=1, lower=5), keys[0]),
                ToPS(ToPSConfig(epsilon=1.0, bound=100, holdout=1, smoother="moving"), keys[0])):
        if bad.holdout_left == 1 and bad is not held:
            bad.hold([3.0])
        with pytest.raises(ValueError, match="become rows"):
            direct.add_chosen(bad, chosen[0])

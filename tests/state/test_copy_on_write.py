"""A checkpoint's cut lends its holdout streams to the writer thread instead of copying them (copy on write): the
writer must still write every stream's state exactly as it was at the cut while the event loop goes on feeding the
same streams, and nothing the writer does may change what a stream releases later."""

from __future__ import annotations

import json
import threading

import numpy as np

from operators.config import ToPSConfig
from operators.tops import ToPS
from stream.core.router import Router
from stream.state.records import Lent, record_state, record_states
from tests.support import key_of


def lent_op(state: tuple[Lent, int]) -> ToPS | None:
    """The operator a lent holdout's pair gives the writer (the live one, or its copy)."""
    lent, i = state
    return lent.ops[i]


def state_of(state: tuple[Lent, int]) -> dict:
    """What the writer makes of a lent holdout's pair."""
    lent, i = state
    return lent.state(i)

CFG = ToPSConfig(epsilon=1.0, bound=100, holdout=60, query_range=256, fanout=4)


def test_the_writer_and_the_event_loop_race_on_lent_holdouts() -> None:
    """The attack: the writer thread makes the lent states in a random order while the main thread (the event loop)
    feeds readings into the very same streams and processes them. Every state written is the stream's state at the
    cut (byte for byte), five cuts in a row; afterwards every stream releases exactly what its own operator releases
    from the same readings with no checkpoint at all (the writer's snapshot of a live operator changed nothing)."""
    rng = np.random.default_rng(8)
    names = [f"h{i}" for i in range(150)]
    router = Router(lambda name: ToPS(CFG, key_of(name)), 1000)
    fed: dict[str, list[float]] = {n: [] for n in names}
    got: dict[str, dict[int, float]] = {n: {} for n in names}

    def feed(k: int) -> None:
        for _ in range(k):
            name = names[int(rng.integers(len(names)))]
            v = float(rng.integers(0, 100))
            fed[name].append(v)
            assert router.add(router.record(name), v, None, None, 0.0) == "ok"
        for b in router.flush():
            got[b.record.name].update(zip(b.ticks, b.values, strict=True))

    feed(1500)
    lent_total = 0
    for _cut in range(5):
        recs = [r for r in router.streams.values() if r.operator.phase == "holdout"]
        wants = {r.name: json.dumps(record_state(r), separators=(",", ":")) for r in recs}
        states = record_states(recs)
        lent = [n for n, s in states.items() if type(s) is tuple and isinstance(s[0], Lent)]
        lent_total += len(lent)
        made: dict[str, str] = {}
        order = list(rng.permutation(lent))

        def writer(order: list[str] = order, states: dict = states, made: dict = made) -> None:
            for n in order:
                made[n] = json.dumps(state_of(states[n]), separators=(",", ":"))

        t = threading.Thread(target=writer)
        t.start()
        while t.is_alive():
            feed(40)  # readings into the lent streams while the writer runs
        t.join()
        assert made == {n: wants[n] for n in lent}
        feed(300)
    assert lent_total > 300
    feed(9000)  # every holdout ends; releases from here on
    for n in names:
        alone = ToPS(CFG, key_of(n)).process(np.asarray(fed[n]))
        want = {t: float(x) for t, x in enumerate(alone) if not np.isnan(x)}
        assert got[n] == want, n


def test_a_lent_holdout_is_copied_only_when_it_changes_before_the_writer() -> None:
    """The cut copies nothing; a stream that takes a reading before the writer made its state is copied then (the
    writer gets the state at the cut), one that does not is never copied."""
    router = Router(lambda name: ToPS(CFG, key_of(name)), 10)
    for name in ("a", "b"):
        rec = router.record(name)
        for v in (3.0, 5.0, 8.0):
            router.add(rec, v, None, None, 0.0)
    router.flush()
    a, b = router.streams["a"], router.streams["b"]
    want_a = json.dumps(record_state(a), separators=(",", ":"))
    states = record_states([a, b])
    assert lent_op(states["a"]) is a.operator and lent_op(states["b"]) is b.operator  # lent, not copied
    assert states["a"][0] is states["b"][0] and a.lent == states["a"]  # one lender per cut
    router.add(a, 9.0, None, None, 0.0)
    router.flush()
    assert lent_op(states["a"]) is not a.operator and a.lent is None  # copied at a's first change
    assert lent_op(states["b"]) is b.operator  # untouched: never copied
    assert json.dumps(state_of(states["a"]), separators=(",", ":")) == want_a
    state_of(states["b"])
    router.add(b, 1.0, None, None, 0.0)  # after the writer: nothing left to copy
    router.flush()


def test_a_stored_snapshot_is_the_compacted_snapshot_byte_for_byte() -> None:
    """``ToPS.snapshot(stored=True)`` (what the writer stores, its histogram's cells found by numpy) is the text
    the general path (``_compact(snapshot())``) makes, at every step of holdouts that stay sparse, turn dense, end
    and release, at several bounds; and a stored state restores the same stream."""
    from stream.state.records import _compact, operator_snapshot

    rng = np.random.default_rng(21)
    checked = dense = 0
    for bound, spread in ((100, 5), (100, 100), (1000, 1000), (5000, 40)):
        cfg = ToPSConfig(epsilon=1.0, bound=bound, holdout=60, query_range=256, fanout=4)
        for s in range(4):
            op = ToPS(cfg, key_of(f"{bound}-{s}"))
            vals = rng.integers(0, spread, 80).astype(float)
            for i, v in enumerate(vals):
                op.process_one(float(v))
                want = json.dumps(_compact(op.snapshot()), separators=(",", ":"))
                got = json.dumps(op.snapshot(stored=True), separators=(",", ":"))
                assert got == want
                checked += 1
                dense += op.theta_units is None and not isinstance(op._hist, dict)
                if i == 39:  # in the holdout: the stored state continues the stream exactly
                    mid = json.loads(got)
            back = ToPS.restore(cfg, key_of(f"{bound}-{s}"), operator_snapshot({"operator": mid}, cfg))
            alone = ToPS(cfg, key_of(f"{bound}-{s}")).process(vals)
            assert np.array_equal(back.process(vals[40:]), alone[40:], equal_nan=True)
    assert checked == 1280 and dense > 100

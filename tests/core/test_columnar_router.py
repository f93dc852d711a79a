"""The router keeps releasing ToPS streams as rows of one columnar store and releases them in one compiled pass per
step: the same releases, stream by stream, as each stream's own operator; rows go back when streams leave memory;
a failing pass fails its own streams only."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from operators.columnar import ColumnarRelease, RowOperator
from operators.config import ToPSConfig
from operators.tops import ToPS
from stream.core.router import Router
from tests.support import feed_router, key_of

CFG = ToPSConfig(epsilon=1.0, bound=100, holdout=20, query_range=256, fanout=4)


@pytest.mark.parametrize("step", [1, 7, 500])
def test_rows_release_what_each_stream_releases_alone(step: int) -> None:
    rng = np.random.default_rng(step)
    names = [f"m{i}" for i in range(30)]
    feed = [(names[int(rng.integers(len(names)))], float(rng.uniform(-5, 120))) for _ in range(3000)]
    router = Router(lambda name: ToPS(CFG, key_of(name)), 100)
    router.use_columns(capacity=4)
    got = feed_router(router, feed, step)
    releasing = [rec for rec in router.streams.values() if rec.phase == "releasing"]
    assert releasing and all(type(rec.operator) is RowOperator for rec in releasing)
    assert router.pool is not None and len(router.pool) == len(releasing)
    for name in names:
        values = np.array([v for n, v in feed if n == name])
        alone = ToPS(CFG, key_of(name)).process(values)
        expected = [(t, float(x)) for t, x in enumerate(alone) if x == x]
        assert got.get(name, []) == expected, name
        rec = router.streams[name]
        ref = ToPS(CFG, key_of(name))
        ref.process(values)
        assert rec.operator.snapshot() == ref.snapshot()


def test_evicted_streams_give_their_rows_back() -> None:
    router = Router(lambda name: ToPS(CFG, key_of(name)), 100)
    router.use_columns()
    feed = [(f"m{i % 10}", 3.0) for i in range(400)]
    feed_router(router, feed, 50)
    assert router.pool is not None and len(router.pool) == 10
    rows = sorted(rec.operator.row for rec in router.streams.values())
    router.evict([f"m{i}" for i in range(5)])
    assert len(router.pool) == 5
    feed_router(router, [(f"n{i % 5}", 4.0) for i in range(200)], 50)  # five new streams take the five freed rows
    assert len(router.pool) == 10 and router.pool.rows == 10
    assert sorted(rec.operator.row for rec in router.streams.values()) == rows


class _FailingRows(ColumnarRelease):
    """A columnar store whose pass raises while ``broken`` is set (a kernel bug injected at construction)."""

    broken = False

    def process(self, rows: np.ndarray, values: np.ndarray, *, checked: bool = False) -> np.ndarray:
        if self.broken:
            raise RuntimeError("kernel bug")
        return super().process(rows, values, checked=checked)


def test_a_failing_pass_fails_its_streams_only(caplog: pytest.LogCaptureFixture) -> None:
    router = Router(lambda name: ToPS(CFG, key_of(name)), 100)
    router.use_columns(rows=_FailingRows(capacity=1024, ahead=16))
    feed_router(router, [(f"m{i % 4}", 5.0) for i in range(100)], 10)  # four streams releasing (rows)
    assert router.pool is not None
    router.pool.broken = True
    with caplog.at_level(logging.ERROR, logger="tops.router"):
        got = feed_router(router, [("m0", 1234.5), ("m1", 5.0), ("fresh", 6.0)], 3)
    assert got == {}
    assert router.streams["m0"].failed and router.streams["m1"].failed
    assert not router.streams["m2"].failed and not router.streams["fresh"].failed  # untouched, in its holdout
    assert "1234.5" not in caplog.text and "RuntimeError" in caplog.text
    rec = router.streams["m0"]
    assert router.add(rec, 1.0, None, None, 0.0) == "failed"


def test_a_checkpoint_writes_the_rows_states_as_the_general_path_does() -> None:
    """The checkpoint's one-pass text of the rows' states is the very JSON of their record_state (two
    configurations, every smoother layer count the choice makes, tree ends, seq or none), and a holdout stream's
    state copied at the cut is its record_state at the cut even when readings come before the writer makes it."""
    import json

    from stream.state.records import RowStates, record_state, record_states

    other = ToPSConfig(epsilon=0.5, bound=50, holdout=10, query_range=64, fanout=2)
    router = Router(lambda name: ToPS(other if name.startswith("o") else CFG, key_of(name)), 200)
    router.use_columns(capacity=8, ahead=3)
    rng = np.random.default_rng(3)
    names = [f"m{i}" for i in range(40)] + [f"o{i}" for i in range(40)]
    for i in range(12_000):
        name = names[int(rng.integers(len(names)))]
        rec = router.record(name)
        assert router.add(rec, float(rng.choice([0.0, 3.5, 40.0, 99.0, 250.0])), None,
                          i if name.endswith("7") else None, 0.0) == "ok"
        if i % 97 == 0 or i == 11_999:
            router.flush()
            recs = list(router.streams.values())
            states = record_states(recs)
            assert set(states) == {r.name for r in recs}
            wants = {rec.name: json.dumps(record_state(rec), separators=(",", ":")) for rec in recs}
            for rec in recs[:5]:  # readings after the cut, before the writer makes the deferred states
                router.add(rec, 1.0, None, None, 0.0)
            router.flush()
            for rec in recs:
                got = states[rec.name]
                if type(got) is tuple:  # a holdout lent by the cut: (lent, i)
                    got = got[0].state(got[1])
                elif callable(got):
                    got = got()
                assert (got if isinstance(got, str) else json.dumps(got, separators=(",", ":"))) == wants[rec.name]
    # the rows went the one-pass way: their columns copied at the cut, their texts made later, all at once
    assert sum(isinstance(getattr(getattr(s, "func", None), "__self__", None), RowStates)
               for s in states.values()) > 60
    early = [record_states([router.record(f"new{i}")]) for i in range(3)]  # holdout streams: deferred
    assert all(type(s) is tuple for e in early for s in e.values())

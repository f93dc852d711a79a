"""Checkpoints append the changed streams' states; a fold moves them into the streams' rows.

Each test breaks a promise that comes with it: a checkpoint writes a few pages in order, not one page per stream; a
reader always gets a stream's latest state; an older generation's state never comes back for a new generation, and
a retired stream's appended state leaves the file; a stream that left its holdout has no holdout histogram left
anywhere; an old store is brought to the new schema with its states; a kill -9 while states are appended and folded
loses nothing and repeats nothing (``tests/e2e/test_kill9_restarts.py``, run with a fold after every checkpoint).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from stream.state.store import Store, StoreError

PARAMS = {"mode": "central", "epsilon": 1.0, "bound": 100.0, "holdout": 50}


def state(ticks: int, mark: str = "") -> dict:
    return {"operator": {"ticks": ticks, "mark": mark}}


def raw(path: Path) -> bytes:
    """The store's bytes on disk: its file and its write-ahead log."""
    wal = path.with_name(path.name + "-wal")
    return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


def rows(path: Path) -> dict[str, str | None]:
    db = sqlite3.connect(path)
    try:
        return dict(db.execute("SELECT name, state FROM streams"))
    finally:
        db.close()


def test_a_checkpoint_appends_and_every_reader_gets_the_latest_state(tmp_path: Path) -> None:
    p = tmp_path / "state.db"
    st = Store.open(p)
    for n in ("a", "b", "c"):
        st.admit(n, PARAMS)
    st.checkpoint({"a": state(1), "b": state(1)}, journal_position=1)
    st.checkpoint({"a": state(2)}, journal_position=2)
    assert st.appended() == 2  # one appended state a stream: a's first one was replaced
    assert rows(p) == {"a": None, "b": None, "c": None}  # nothing written into the rows yet
    assert st.admit("a", PARAMS).state == state(2) and st.admit("b", PARAMS).state == state(1)
    assert st.admit("c", PARAMS).state is None
    assert {s["name"]: s["state"] for s in st.streams()} == {"a": state(2), "b": state(1), "c": None}
    ro = Store.open(p, readonly=True)  # `tops state` reads the same
    assert {s["name"]: s["state"] for s in ro.streams()} == {"a": state(2), "b": state(1), "c": None}
    ro.close()
    assert st.fold() == 2
    assert st.appended() == 0
    assert {n: json.loads(s) if s else None for n, s in rows(p).items()} == {"a": state(2), "b": state(1), "c": None}
    st.checkpoint({"b": state(3)}, journal_position=3)  # after a fold: appended again, newer than the row
    assert st.admit("b", PARAMS).state == state(3) and st.admit("a", PARAMS).state == state(2)
    st.close()
    again = Store.open(p)
    assert again.admit("b", PARAMS).state == state(3) and again.journal_position() == 3


def test_a_checkpoint_of_few_streams_of_many_writes_few_pages(tmp_path: Path) -> None:
    """2,000 changed streams of 40,000: the write-ahead log grows by the appended rows' pages (about 150), where the
    same states written into the rows wrote one page per stream (measured here: 2,012 pages)."""
    p = tmp_path / "state.db"
    st = Store.open(p)
    filler = json.dumps(state(7, "x" * 200))
    st.checkpoint({}, 0, admissions=[(f"m{k}", 1, 1.0, 1.0, 50, json.dumps(PARAMS, sort_keys=True), "now")
                                     for k in range(40_000)])
    with st._transaction():
        st._db.executemany("UPDATE streams SET state = ? WHERE name = ?", [(filler, f"m{k}") for k in range(40_000)])
    st.purge_freed_pages()
    wal = p.with_name("state.db-wal")
    assert wal.stat().st_size == 0
    st.checkpoint({f"m{k}": state(k, "y" * 200) for k in range(7, 40_000, 20)}, journal_position=1)
    pages = wal.stat().st_size // 4096
    assert pages < 400, pages
    assert st.admit("m27", PARAMS).state == state(27, "y" * 200)


def test_a_new_generation_never_gets_the_old_generations_appended_state(tmp_path: Path) -> None:
    """The old generation's state is deleted with its admission (and its bytes leave the file): the new key starts
    from nothing, never from the old key's position."""
    p = tmp_path / "state.db"
    st = Store.open(p)
    st.admit("m", PARAMS)
    st.checkpoint({"m": state(40, "old-generation-secret")}, journal_position=1)
    adm = st.admit("m", {**PARAMS, "epsilon": 2.0}, new_generation=True)
    assert adm.generation == 2 and adm.state is None
    assert st.admit("m", {**PARAMS, "epsilon": 2.0}).state is None
    assert st.appended() == 0
    st.purge_freed_pages()
    assert b"old-generation-secret" not in raw(p)
    # deferred, as the daemon admits: the checkpoint that writes the entry drops the old state, then appends the new
    st.checkpoint({"m": state(5, "second")}, journal_position=2)
    adm = st.admit("m", {**PARAMS, "epsilon": 3.0}, new_generation=True, defer=True)
    assert adm.generation == 3
    st.checkpoint({"m": state(1, "third")}, journal_position=3, admissions=st.take_admissions())
    assert st.admit("m", {**PARAMS, "epsilon": 3.0}).state == state(1, "third")


def test_retiring_a_stream_takes_its_appended_state_out_of_the_file(tmp_path: Path) -> None:
    p = tmp_path / "state.db"
    st = Store.open(p)
    st.admit("gone", PARAMS)
    st.admit("kept", PARAMS)
    st.checkpoint({"gone": state(9, "retired-secret"), "kept": state(4)}, journal_position=1)
    assert st.retire("gone")
    st.purge_freed_pages()
    assert b"retired-secret" not in raw(p)
    assert st.appended() == 1
    assert st.admit("gone", PARAMS).generation == 2 and st.admit("gone", PARAMS).state is None


def test_a_stream_that_left_its_holdout_leaves_no_holdout_byte_in_its_row_or_appended(tmp_path: Path) -> None:
    """A stream that left its holdout (``clear_rows``): its appended holdout state is replaced, and the holdout state
    a fold put into its row goes in the same transaction; with the write-ahead log purged no byte of either is
    left. Another stream's row keeps its state."""
    p = tmp_path / "state.db"
    st = Store.open(p)
    st.admit("h", PARAMS)
    st.admit("other", PARAMS)
    st.checkpoint({"h": {"operator": {"holdout_histogram": [[3, 1]], "secret": "folded-holdout-counts"}},
                   "other": state(5)}, 1)
    st.fold()  # the first holdout state now in h's row
    st.checkpoint({"h": {"operator": {"holdout_histogram": [[3, 2]], "secret": "appended-holdout-counts"}}}, 2)
    st.checkpoint({"h": state(60)}, 3, clear_rows={"h"})
    assert rows(p) == {"h": None, "other": json.dumps(state(5), separators=(",", ":"))}
    assert st.appended() == 1 and st.admit("h", PARAMS).state == state(60)
    st.purge_freed_pages()
    assert b"holdout-counts" not in raw(p)


def test_a_store_of_schema_1_is_brought_to_schema_2_with_its_states(tmp_path: Path) -> None:
    p = tmp_path / "state.db"
    st = Store.open(p)
    st.admit("a", PARAMS)
    st.checkpoint({"a": state(3)}, 1)
    st.fold()
    st.close()
    db = sqlite3.connect(p)  # as tops wrote it before the appended states
    db.execute("DROP TABLE slices")
    db.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    db.commit()
    db.close()
    ro = Store.open(p, readonly=True)  # read-only (`tops state`): read as it is
    assert [s["state"] for s in ro.streams()] == [state(3)]
    ro.close()
    st = Store.open(p)
    assert st.meta("schema") == "2" and st.admit("a", PARAMS).state == state(3)
    st.checkpoint({"a": state(4)}, 2)
    assert st.admit("a", PARAMS).state == state(4)
    st.close()
    db = sqlite3.connect(p)  # a store of a later schema is refused, not misread
    db.execute("UPDATE meta SET value = '3' WHERE key = 'schema'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="has schema 3, this tops reads 2"):
        Store.open(p)
    q = tmp_path / "empty.db"  # an empty store of schema 1 from before the store identity: given one, and brought to 2
    Store.open(q).close()
    db = sqlite3.connect(q)
    db.execute("DROP TABLE slices")
    db.execute("DELETE FROM meta WHERE key = 'identity'")
    db.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    db.commit()
    db.close()
    st = Store.open(q)
    assert st.meta("schema") == "2" and st.identity
    st.close()


def test_the_daemon_folds_once_fold_after_states_wait_and_truncates_the_log(tmp_path: Path) -> None:
    """With ``fold_after`` = 30: the checkpoints append until 30 states wait, then the worker thread folds them into
    the rows and truncates the write-ahead log (its pages are not left to the next checkpoints' commits); every
    stream's state is then in its row, and each stream continues from it."""
    import asyncio
    import io

    from stream.core.config import build_config
    from stream.daemon.service import Daemon

    cfg = build_config({
        "input": {"source": "stdin"}, "output": {"sinks": ["stdout"]},
        "streams": {"key_file": str(tmp_path / "master.key"), "template": {"epsilon": 1.0, "bound": 100.0,
                                                                             "holdout": 3}},
        "metrics": {"port": 0}, "log": {"level": "warning"},
        "state": {"data_dir": str(tmp_path / "state"), "checkpoint_interval": 3600.0, "fold_after": 30},
    })
    out = io.StringIO()
    d = Daemon(cfg, stdin=io.BytesIO(b""), stdout=out, install_signals=False)
    d.startup()
    dur = d.durable
    assert dur is not None
    db_path = tmp_path / "state" / "state.db"
    wal = db_path.with_name("state.db-wal")

    wal_after_fold: list[int] = []

    async def rounds() -> list[int]:
        waiting = []
        for r in range(8):  # 10 streams a round: the fourth checkpoint finds 30 waiting
            d.on_lines([f"s{(10 * r + k) % 50},{(7 * k + r) % 90}".encode() for k in range(10)])
            d.emit(d.router.flush())
            folds = dur.folds
            await dur.checkpoint_now()
            waiting.append(dur.store.appended())
            if dur.folds > folds:
                wal_after_fold.append(wal.stat().st_size)
        return waiting

    waiting = asyncio.run(rounds())
    assert dur.folds >= 1 and wal_after_fold == [0] * dur.folds
    assert 0 in waiting and max(waiting) < 30, waiting
    d.shutdown()
    stored = {s["name"]: s["state"] for s in Store.open(db_path, readonly=True).streams()}
    db = sqlite3.connect(db_path)
    appended = {n for (n,) in db.execute("SELECT name FROM slices")}
    db.close()
    in_rows = {n: json.loads(s) for n, s in rows(db_path).items() if s}
    assert len(stored) == 50 and len(appended) < 30
    # a stream without an appended state has its latest state in its row (folded there)
    assert all(in_rows[n] == st for n, st in stored.items() if n not in appended)

"""The state store, the privacy ledger and the input journal, on real files."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from stream.state.journal import Journal
from stream.state.store import PrivacyParametersChanged, Store, StoreError

PARAMS = {"mode": "central", "epsilon": 1.0, "bound": 100.0, "holdout": 500, "query_range": 4096, "fanout": 16}


def test_store_is_private_and_checkpoints_atomically(tmp_path: Path) -> None:
    st = Store.open(tmp_path / "state.db")
    assert (tmp_path / "state.db").stat().st_mode & 0o777 == 0o600
    st.admit("a", PARAMS)
    st.admit("b", PARAMS)
    st.checkpoint({"a": {"operator": {"ticks": 3}}, "b": {"operator": {"ticks": 4}}}, journal_position=7)
    st.close()
    again = Store.open(tmp_path / "state.db")
    assert again.journal_position() == 7
    assert {s["name"]: s["state"]["operator"]["ticks"] for s in again.streams()} == {"a": 3, "b": 4}
    assert again.admit("a", dict(PARAMS)).state == {"operator": {"ticks": 3}}


def test_changed_privacy_parameters_are_refused_unless_a_new_generation(tmp_path: Path) -> None:
    st = Store.open(tmp_path / "state.db")
    st.admit("m", PARAMS)
    for key, value in (("epsilon", 2.0), ("bound", 50.0), ("holdout", 10)):
        with pytest.raises(PrivacyParametersChanged, match=f"{key} "):
            st.admit("m", {**PARAMS, key: value})
    adm = st.admit("m", {**PARAMS, "epsilon": 2.0}, new_generation=True)
    assert adm.generation == 2 and adm.state is None
    ledger = st.ledger()
    assert [(r["generation"], r["epsilon"], r["retired"] is not None) for r in ledger] == [
        (1, 1.0, True),
        (2, 2.0, False),
    ]


def test_a_corrupt_or_open_store_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "state.db"
    Store.open(p).close()
    data = bytearray(p.read_bytes())
    data[100:4000] = os.urandom(3900)
    p.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="refusing to start"):
        Store.open(p)
    q = tmp_path / "other.db"
    q.write_text("this is not a database at all " * 100)
    q.chmod(0o600)
    with pytest.raises(StoreError, match=r"not a readable tops store|corrupt"):
        Store.open(q)
    r = tmp_path / "open.db"
    Store.open(r).close()
    r.chmod(0o644)
    with pytest.raises(StoreError, match="chmod 600"):
        Store.open(r)


def test_journal_replays_from_the_checkpoint_and_skips_a_torn_tail(tmp_path: Path) -> None:
    j = Journal.open(tmp_path)
    for k in range(5):
        j.append("s", float(k), ts=float(k), seq=k)
    j.sync()
    pos = j.rotate()
    for k in range(5, 8):
        j.append("s", float(k), ts=float(k), seq=k)
    j.sync()
    seg = tmp_path / f"seg-{j.segment:012d}.log"
    with open(seg, "ab") as f:
        f.write(b'{"s":"s","v":9')  # a crash in the middle of a write
    assert oct(seg.stat().st_mode & 0o777) == "0o600"
    j2 = Journal.open(tmp_path)
    assert [r.seq for r in j2.replay(pos)] == [5, 6, 7]
    assert [r.seq for r in j2.replay(0)] == [0, 1, 2, 3, 4, 5, 6, 7]
    j2.drop_before(pos)
    assert [r.seq for r in j2.replay(0)] == [5, 6, 7]


def test_sqlite_wal_mode(tmp_path: Path) -> None:
    Store.open(tmp_path / "state.db").close()
    mode = sqlite3.connect(tmp_path / "state.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_journal_lines_of_several_readings_replay_all_or_none(tmp_path: Path) -> None:
    """One line per message: its readings come back in order with their own time and seq; a torn last line gives
    none of its readings, nor does a whole line after the last sync's end mark; a line that does not hold together
    in the middle stops the replay."""
    j = Journal.open(tmp_path)
    j.append_many('"a"', [1.0, 2.5, 0.0], 100.25, None)
    j.append_many('"b"', [4.0, 5.0], [7.0, 8.5], [3, None])  # per-reading times, one reading without seq
    j.append_many('"a"', [6.0], 101.0, [9])  # one reading: the line of a single reading
    j.append_json('"c"', 7.0, 102.0, None)
    assert j.sync() == 7
    seg = tmp_path / f"seg-{j.segment:012d}.log"
    raw = seg.read_bytes().splitlines()
    assert raw[0] == b'{"f":2}' and raw[-1] == b'{"e":1}'  # the format, and the end of one sync
    lines = raw[1:-1]
    assert len(lines) == 4 and json.loads(lines[2]) == {"s": "a", "v": 6.0, "t": 101.0, "q": 9}
    want = [("a", 1.0, 100.25, None), ("a", 2.5, 100.25, None), ("a", 0.0, 100.25, None), ("b", 4.0, 7.0, 3),
            ("b", 5.0, 8.5, None), ("a", 6.0, 101.0, 9), ("c", 7.0, 102.0, None)]
    with open(seg, "ab") as f:
        f.write(b'{"s":"a","v":[8.0,9.0],"t":10')  # torn in the middle of a write: none of its readings
    j2 = Journal.open(tmp_path)
    assert [(r.stream, r.value, r.ts, r.seq) for r in j2.replay(0)] == want
    with open(seg, "ab") as f:
        f.write(b'3.0}\n')  # complete, but its sync never ended: none of its readings
    assert [(r.stream, r.value, r.ts, r.seq) for r in Journal.open(tmp_path).replay(0)] == want
    with open(seg, "ab") as f:
        f.write(b'{"e":1}\n')  # now its sync ended: both readings
    assert [r.value for r in Journal.open(tmp_path).replay(0)][-2:] == [8.0, 9.0]
    for bad in (b'{"s":"a","v":[1.0,2.0],"t":[1.0]}', b'{"s":"a","v":[1.0],"t":1.0,"q":[1,2]}',
                b'{"s":"a","v":[],"t":1.0}', b'{"s":"a","v":[1.0,"x"],"t":1.0}'):
        seg.write_bytes(bad + b"\n" + lines[0] + b"\n")
        with pytest.raises(ValueError, match="corrupt at line 1"):
            list(Journal.open(tmp_path).replay(0))
        seg.write_bytes(lines[0] + b"\n" + bad)  # the same as a torn tail: skipped
        assert len(list(Journal.open(tmp_path).replay(0))) == 3

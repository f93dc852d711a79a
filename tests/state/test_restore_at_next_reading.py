"""A restart restores each stored stream at its next reading (one tick per reading), and what that must not break.

The restart does not read every stored stream first (a million of them took minutes); these tests break the
promises that come with it: a stream left in the store continues exactly when it returns, its stored state is not
touched meanwhile, a changed privacy parameter still stops the start at once (not at some stream's next reading),
a stored state that cannot be restored refuses only that stream's readings, and the cap takes every stored stream
back.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from stream.state.store import PrivacyParametersChanged
from tests.support import (
    TEMPLATE,
    check_against_replay,
    identity_from_log,
    release_lines,
    started,
    stdin_config,
    stdin_daemon,
    tops,
)


def lines(values: dict[str, np.ndarray], lo: int, hi: int) -> bytes:
    return b"".join(f"{s},{v[i]:g}\n".encode() for i in range(lo, hi) for s, v in values.items() if i < len(v))


def stored_states(tmp: Path) -> dict[str, bytes]:
    """Each stream's latest stored state as text: its appended state if it has one, else its row's."""
    db = sqlite3.connect(tmp / "state" / "state.db")
    try:
        return {n: s for n, s in db.execute("SELECT s.name, coalesce(a.state, s.state) FROM streams AS s "
                                            "LEFT JOIN slices AS a ON a.name = s.name")}
    finally:
        db.close()


def test_a_stream_left_in_the_store_is_untouched_and_continues_exactly_at_its_next_reading(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    a = rng.integers(0, 90, 150).astype(float)
    b = rng.integers(0, 90, 140).astype(float)
    c = rng.integers(0, 90, 90).astype(float)  # 30 readings before the restarts: still in its holdout (50)
    cfg = stdin_config(tmp_path)
    got: list[dict] = []
    r = tops("run", "--config", str(cfg), stdin=lines({"a": a[:60], "b": b[:60], "c": c[:30]}, 0, 60))
    assert r.returncode == 0, r.stderr.decode()
    got += release_lines(r.stdout)
    before = stored_states(tmp_path)
    # run 2: only a sends; b and c stay in the store
    r = tops("run", "--config", str(cfg), stdin=lines({"a": a}, 60, 100))
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "3 streams stored (0 restored, the others at their next reading)" in err, err
    got += release_lines(r.stdout)
    after = stored_states(tmp_path)
    assert after["b"] == before["b"] and after["c"] == before["c"]  # not read into memory, not rewritten
    assert after["a"] != before["a"]
    # run 3: all three again; b and c are restored at their reading and go on where they were
    r = tops("run", "--config", str(cfg), stdin=lines({"a": a}, 100, 150) + lines({"b": b}, 60, 140)
             + lines({"c": c}, 30, 90))
    err = r.stderr.decode()
    assert r.returncode == 0 and "Traceback" not in err, err
    got += release_lines(r.stdout)
    ident = identity_from_log(err)
    key = tmp_path / "master.key"
    sent = {"a": a, "b": b, "c": c}
    for s in ("a", "b", "c"):
        n = check_against_replay(got, sent[s], key, s, tmp_path, ident)
        assert n == len(sent[s]) - TEMPLATE["holdout"]


def test_a_changed_epsilon_stops_the_start_at_once_without_the_preflight(tmp_path: Path) -> None:
    """The command's preflight lists changed privacy parameters; a daemon started without it (embedded, tests) must
    refuse them at the start too, not take the stored streams back one by one with another epsilon."""
    cfg = stdin_config(tmp_path)
    assert tops("run", "--config", str(cfg), stdin=b"p,1\nq,2\n").returncode == 0
    import asyncio

    d = stdin_daemon(tmp_path, epsilon=2.0)
    with pytest.raises(PrivacyParametersChanged, match="other privacy parameters") as exc:
        asyncio.run(started(d))
    assert "(and 1 more streams)" in str(exc.value)
    d.shutdown()
    d = stdin_daemon(tmp_path)  # the same parameters: it starts
    asyncio.run(started(d))
    d.shutdown()


def test_a_stored_state_that_cannot_be_restored_refuses_only_that_streams_readings(tmp_path: Path) -> None:
    cfg = stdin_config(tmp_path)
    vals = {"good": np.arange(80.0) % 70, "bad": np.arange(80.0) % 50}
    r = tops("run", "--config", str(cfg), stdin=lines(vals, 0, 60))
    assert r.returncode == 0, r.stderr.decode()
    state = json.loads(stored_states(tmp_path)["bad"])
    state["operator"]["walk"] = {"tree": "not a number", "leaf": 0}
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    db.execute("UPDATE streams SET state = ? WHERE name = 'bad'", (json.dumps(state),))
    db.execute("UPDATE slices SET state = ? WHERE name = 'bad'", (json.dumps(state),))
    db.commit()
    db.close()
    r = tops("run", "--config", str(cfg), stdin=lines(vals, 60, 80))
    err = r.stderr.decode()
    assert r.returncode == 0 and "Traceback" not in err, err
    assert "stream 'bad': the stored state does not fit the configuration" in err
    assert "not a number" not in err  # the log names the stream, never the stored content
    got = release_lines(r.stdout)
    assert {x["stream"] for x in got} == {"good"} and len(got) == 20


def test_the_cap_takes_every_stored_stream_back(tmp_path: Path) -> None:
    cfg = stdin_config(tmp_path)
    four = {f"s{i}": np.full(60, 10.0 + i) for i in range(4)}
    assert tops("run", "--config", str(cfg), stdin=lines(four, 0, 55)).returncode == 0
    text = cfg.read_text().replace("[streams]\n", "[streams]\nmax_streams = 2\n")
    cfg.write_text(text)
    r = tops("run", "--config", str(cfg), stdin=lines(four, 55, 60) + b"new,1\n")
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "the cap is raised to take them all back" in err
    got = release_lines(r.stdout)
    assert {x["stream"] for x in got} == set(four) and len(got) == 20

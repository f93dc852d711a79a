"""A new stream's ledger entry is written by the next checkpoint, not by a transaction of its own: what that must not
break. A kill -9 before that checkpoint loses the entry; the restart must admit the stream to the very same
generation (the same key on the same readings, re-processed from the journal), never to another one, and a retired
name that came back must come back as the same next generation again.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

import numpy as np

from tests.support import (
    TEMPLATE,
    StdinRun,
    check_against_replay,
    identity_from_log,
    release_lines,
    stdin_config,
    tops,
    wait_for,
)


def ledger(tmp: Path, name: str) -> list[tuple[int, bool]]:
    db = sqlite3.connect(tmp / "state" / "state.db")
    try:
        return [(int(g), r is None) for g, r in db.execute(
            "SELECT generation, retired FROM ledger WHERE stream = ? ORDER BY generation", (name,))]
    finally:
        db.close()


def killed_before_a_checkpoint(cfg: Path, tmp: Path, stream: str, values: np.ndarray, log: str) -> list[dict]:
    """``tops run`` takes ``values`` of ``stream``, releases them, and is killed -9 before any checkpoint after them."""
    run = StdinRun(cfg, tmp / log)
    try:
        run.send(stream, values)
        wait_for(lambda: len(run.releases) == len(values) - TEMPLATE["holdout"], 30, what="releases")
        time.sleep(0.3)
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(10)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    return list(run.releases)


def test_kill9_before_a_new_streams_entry_is_written_gives_it_the_same_generation_again(tmp_path: Path) -> None:
    values = np.random.default_rng(4).integers(0, 90, 120).astype(float)
    cfg = stdin_config(tmp_path, checkpoint_interval=3600.0, checkpoint_every=10**9)
    first = killed_before_a_checkpoint(cfg, tmp_path, "n", values[:90], "run1.log")
    assert ledger(tmp_path, "n") == []  # the entry was not written yet: the attack's premise
    r = tops("run", "--config", str(cfg), stdin=b"".join(f"n,{v:g}\n".encode() for v in values[90:]))
    err = r.stderr.decode()
    assert r.returncode == 0 and "Traceback" not in err, err
    again = release_lines(r.stdout)
    assert ledger(tmp_path, "n") == [(1, True)]
    before = {x["tick"]: x["value"] for x in first}
    repeats = [x for x in again if x["tick"] in before]
    assert len(repeats) == len(first) and all(before[x["tick"]] == x["value"] for x in repeats)  # the same key
    n = check_against_replay(first + again, values, tmp_path / "master.key", "n", tmp_path, identity_from_log(err))
    assert n == len(values) - TEMPLATE["holdout"]


def test_a_retired_name_killed_before_its_entry_is_written_comes_back_as_the_same_generation(tmp_path: Path) -> None:
    values = np.random.default_rng(6).integers(0, 90, 100).astype(float)
    cfg = stdin_config(tmp_path, checkpoint_interval=3600.0, checkpoint_every=10**9)
    assert tops("run", "--config", str(cfg), stdin=b"".join(f"late,{v:g}\n".encode() for v in values[:60]))\
        .returncode == 0
    assert tops("state", "retire", "late", "--config", str(cfg)).returncode == 0
    assert ledger(tmp_path, "late") == [(1, False)]
    first = killed_before_a_checkpoint(cfg, tmp_path, "late", values[:80], "run2.log")
    assert ledger(tmp_path, "late") == [(1, False)]  # generation 2's entry was not written yet
    r = tops("run", "--config", str(cfg), stdin=b"".join(f"late,{v:g}\n".encode() for v in values[80:]))
    assert r.returncode == 0, r.stderr.decode()
    again = release_lines(r.stdout)
    assert ledger(tmp_path, "late") == [(1, False), (2, True)]  # generation 2 once: not 3, not 1 again
    before = {x["tick"]: x["value"] for x in first}
    repeats = [x for x in again if x["tick"] in before]
    assert len(repeats) == len(first) and all(before[x["tick"]] == x["value"] for x in repeats)
    assert sorted({x["tick"] for x in first + again}) == list(range(TEMPLATE["holdout"], 100))

"""A checkpoint's write does not stop intake, and a kill -9 in the middle of it loses nothing.

The attack: another process holds the state store's write lock (a backup tool, an operator's ``sqlite3`` shell, a
slow disk has the same effect), so the checkpoint's transaction waits. Before the checkpoint's write moved to a worker
thread, the event loop waited with it (up to SQLite's 5 s busy timeout, every checkpoint): no reading was processed,
no release left. Now readings keep being accepted, journaled and released meanwhile; the daemon is then killed -9
while that checkpoint is still waiting, and the restart's releases together with the first run's equal ``tops
replay`` of every reading sent, tick for tick.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support import (
    TEMPLATE,
    StdinRun,
    check_against_replay,
    identity_from_log,
    stdin_config,
    tops,
    wait_for,
)

# it times intake while a checkpoint waits: not beside a flood (see pyproject.toml)
pytestmark = pytest.mark.xdist_group("heavy")


def test_intake_goes_on_while_a_checkpoint_waits_for_the_store_and_kill9_then_loses_nothing(tmp_path: Path) -> None:
    values = np.random.default_rng(21).integers(0, 90, 260).astype(float)
    cfg = stdin_config(tmp_path, checkpoint_interval=0.2)
    run = StdinRun(cfg, tmp_path / "run1.log")
    db = tmp_path / "state" / "state.db"
    locker: sqlite3.Connection | None = None
    try:
        run.send("a", values[:100])
        wait_for(lambda: len(run.releases) == 100 - TEMPLATE["holdout"], 30, what="first releases")
        time.sleep(0.5)  # checkpoints of them
        locker = sqlite3.connect(db, timeout=5, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")  # the store's write lock, held by another process's connection
        time.sleep(0.6)  # the next checkpoint is waiting for it now
        t0 = time.monotonic()
        run.send("a", values[100:160])
        wait_for(lambda: len(run.releases) == 160 - TEMPLATE["holdout"], 3,
                 what="releases while a checkpoint waits for the store")
        assert time.monotonic() - t0 < 3.0
        run.proc.send_signal(signal.SIGKILL)  # in the middle of that checkpoint
        run.proc.wait(10)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
        if locker is not None:
            locker.execute("ROLLBACK")
            locker.close()
    first = list(run.releases)
    r = tops("run", "--config", str(cfg), stdin=b"".join(f"a,{v:g}\n".encode() for v in values[160:]))
    err = r.stderr.decode()
    assert r.returncode == 0 and "Traceback" not in err, err
    again = [x for x in map(json.loads, r.stdout.decode().splitlines()) if "tick" in x and "value" in x]
    # every release of the restart is new or an identical repeat; together they are the replay of all 260 readings
    before = {x["tick"]: x["value"] for x in first}
    assert all(before.get(x["tick"], x["value"]) == x["value"] for x in again)
    n = check_against_replay(first + again, values, tmp_path / "master.key", "a", tmp_path, identity_from_log(err))
    assert n == len(values) - TEMPLATE["holdout"]


def test_a_checkpoint_due_by_ticks_is_not_due_again_while_its_write_runs(tmp_path: Path) -> None:
    """``checkpoint_every`` counts from the cut: while a checkpoint's write runs, the ticks it covers must not make
    the next one due at once (found measuring: every tick-triggered checkpoint was followed by a second one)."""
    import asyncio
    import io
    import os

    from stream.core.config import build_config
    from stream.daemon.service import Daemon

    cfg = build_config({
        "input": {"source": "stdin"}, "output": {"sinks": ["stdout"]},
        "streams": {"key_file": str(tmp_path / "master.key"), "template": dict(TEMPLATE)},
        "metrics": {"port": 0},
        "state": {"data_dir": str(tmp_path / "state"), "checkpoint_interval": 3600.0, "checkpoint_every": 50},
    })

    async def run() -> None:
        d = Daemon(cfg, stdin=io.BytesIO(b""), stdout=open(os.devnull, "w"), install_signals=False)
        d.startup()
        dur = d.durable
        assert dur is not None
        d.on_lines([f"a,{i % 7}".encode() for i in range(60)])
        assert dur.checkpoint_due.is_set()  # 60 ticks >= 50
        cut = dur._cut()  # the checkpoint starts; its write would now run in a worker thread
        assert not dur.checkpoint_due.is_set()
        d.on_lines([f"a,{i % 7}".encode() for i in range(10)])  # intake goes on meanwhile: 10 ticks, not 50
        assert not dur.checkpoint_due.is_set()
        dur._write(cut)
        dur._finish(cut)
        d.on_lines([f"a,{i % 7}".encode() for i in range(45)])  # 55 ticks after the cut
        assert dur.checkpoint_due.is_set()
        d.shutdown()

    asyncio.run(run())

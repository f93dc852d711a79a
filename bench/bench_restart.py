"""Restart and checkpoint with a million stored streams; prints figures. Not a test: nothing asserts.

Run: ``python bench/bench_restart.py [--streams 1000000] [--changed 0.01]``. The daemon runs in this process (stdin
source, stdout sink to /dev/null, durable state in a temporary directory on the project's disk, as
``bench/bench_state.py``). A store of ``--streams`` releasing streams is made first: 100 real streams are run
through the daemon (holdout 3, B = 5,000) and their checkpointed states are copied to the other names (a state holds
no key: each name continues with its own). Then, timed:

1. the restart: ``Daemon.startup()`` on that store (the store opened and checked, the ledger's parameters compared,
   the journal re-processed, the first checkpoint);
2. a reading for ``--changed`` of the streams (each restored from the store at its reading), then the checkpoint
   of those streams, and the longest the event loop was kept from intake during it (the checkpoint's share that
   runs in the event loop; encoding and writing run in a worker thread);
3. nine more such rounds on other streams (each checkpoint appends its states), then the fold of the appended
   states into the streams' rows (``[state] fold_after`` = 100,000 makes the daemon fold there).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stream.core.config import build_config  # noqa: E402
from stream.daemon.heap import Heap  # noqa: E402
from stream.daemon.service import Daemon, settle_heap  # noqa: E402
from stream.state.store import Store  # noqa: E402

TEMPLATE = {"epsilon": 1.0, "bound": 5000.0, "holdout": 3}


def config(tmp: Path, n: int) -> object:
    return build_config({
        "input": {"source": "stdin"},
        "output": {"sinks": ["stdout"]},
        "streams": {"key_file": str(tmp / "master.key"), "max_streams": max(n, 1), "template": dict(TEMPLATE)},
        "metrics": {"port": 0},
        "log": {"level": "warning"},
        "state": {"data_dir": str(tmp / "state"), "checkpoint_interval": 3600.0, "checkpoint_every": 10**9},
    })


def make_store(tmp: Path, n: int) -> float:
    """A store of ``n`` releasing streams m0 .. m(n-1); returns its size in MB."""
    d = Daemon(config(tmp, n), stdin=io.BytesIO(b""), stdout=open(os.devnull, "w"), install_signals=False)
    d.startup()
    d.on_lines([f"m{k},{(37 * k + 11 * i) % 100}".encode() for i in range(5) for k in range(100)])
    d.emit(d.router.flush())
    d.durable.checkpoint()
    d.shutdown()
    st = Store.open(tmp / "state" / "state.db")
    st.fold()  # the checkpoint appended the states: into the stream rows, to be copied from there
    db = st._db
    rows = db.execute("SELECT generation, params, state FROM streams").fetchall()
    led = db.execute("SELECT epsilon, threshold_epsilon, holdout, params, started FROM ledger LIMIT 1").fetchone()
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    db.execute("BEGIN")
    step = 100_000
    for lo in range(100, n, step):
        ks = range(lo, min(n, lo + step))
        db.executemany("INSERT INTO streams (name, generation, params, state, updated) VALUES (?, ?, ?, ?, ?)",
                       [(f"m{k}", rows[k % 100][0], rows[k % 100][1], rows[k % 100][2], now) for k in ks])
        db.executemany("INSERT INTO ledger (stream, generation, epsilon, threshold_epsilon, holdout, params, started)"
                       " VALUES (?, 1, ?, ?, ?, ?, ?)", [(f"m{k}", *led) for k in ks])
    db.execute("COMMIT")
    st.close()
    return (tmp / "state" / "state.db").stat().st_size / 1e6


async def restart(tmp: Path, n: int, changed: int) -> None:
    settle_heap()  # as `tops run` does, with its heap kept (stream/daemon/heap.py)
    t0 = time.perf_counter()
    d = Daemon(config(tmp, n), stdin=io.BytesIO(b""), stdout=open(os.devnull, "w"), install_signals=False,
               heap=Heap())
    d.startup()
    dt = time.perf_counter() - t0
    dur = d.durable
    assert dur is not None
    print(f"restart with {n:,} stored streams: {dt:.2f} s to intake ({len(d.router.streams):,} streams in memory)")
    step = max(1, n // changed)
    lines = [f"m{k},{k % 90}".encode() for k in range(0, n, step)][:changed]
    t0 = time.perf_counter()
    d.on_lines(lines)
    d.emit(d.router.flush())
    dt = time.perf_counter() - t0
    print(f"{len(lines):,} streams ({len(lines) / n:.0%}) restored at their reading and released: {dt:.2f} s "
          f"({dt / len(lines) * 1e6:.0f} us per stream)")
    await dur._sync()
    gaps: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:  # how long the event loop is kept from other work (intake) during the checkpoint
        last = time.perf_counter()
        while not stop.is_set():  # wakes every millisecond, as a loop waiting for intake would
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last - 0.001)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    await dur.checkpoint_now()
    dt = time.perf_counter() - t0
    stop.set()
    await task
    print(f"checkpoint of {len(lines):,} changed streams: {dt:.3f} s; the event loop's longest pause "
          f"{max(gaps) * 1e3:.1f} ms; state.db {(tmp / 'state' / 'state.db').stat().st_size / 1e6:,.0f} MB")
    # the checkpoints append; once [state] fold_after states wait (100,000), they are folded into the rows
    dur.fold_after = 10**9  # no fold before it is timed
    times = [dt]
    for k in range(1, 10):
        d.on_lines([f"m{j},{j % 90}".encode() for j in range(k, n, step)][:changed])
        d.emit(d.router.flush())
        t0 = time.perf_counter()
        await dur.checkpoint_now()
        times.append(time.perf_counter() - t0)
    waiting = dur.store.appended()
    t0 = time.perf_counter()
    await asyncio.to_thread(dur._fold)
    print(f"9 more checkpoints of as many other streams: {min(times):.3f}-{max(times):.3f} s each; then the fold of "
          f"the {waiting:,} appended states into the rows: {time.perf_counter() - t0:.2f} s (a worker thread)")
    d.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=1_000_000)
    ap.add_argument("--changed", type=float, default=0.01)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="tops-bench-restart-", dir=ROOT) as t:
        tmp = Path(t)
        t0 = time.perf_counter()
        size = make_store(tmp, args.streams)
        print(f"store of {args.streams:,} releasing streams made in {time.perf_counter() - t0:.1f} s "
              f"({size:,.0f} MB, {size * 1e6 / args.streams:,.0f} B per stream)")
        asyncio.run(restart(tmp, args.streams, max(1, round(args.streams * args.changed))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

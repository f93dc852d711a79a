"""Checkpoint cost of durable state with 10,000 streams, and how long a checkpoint stalls intake; prints figures.

Run: ``python bench/bench_state.py [--streams N] [--grid exact|compact]``. The daemon runs in this process (stdin
source, stdout sink to /dev/null, durable state in a temporary directory on the same disk as the project). Three
checkpoints are timed with every stream changed: all streams in their holdout (the holdout histogram is stored), all
releasing, and an incremental one where 1% of the streams changed (these three all in the event loop, as at the
start). Then readings flow for a few seconds over all streams with a checkpoint every second (the running daemon's
checkpoints: their cut in the event loop, their write in a worker thread); the stall is the longest gap between two
processing steps, once with nothing frozen after the start and once with the live objects frozen every 0.5 s
(``stream/daemon/heap.py``, as `tops run` does); the garbage collector's full passes are counted and timed. With
``--grid compact`` the holdouts are rows of a columnar holdout (operators/columnar_holdout.py).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stream.core.config import build_config  # noqa: E402
from stream.daemon.heap import Heap  # noqa: E402
from stream.daemon.service import Daemon, settle_heap  # noqa: E402

TEMPLATE = {"epsilon": 1.0, "bound": 1000.0, "holdout": 100, "query_range": 1 << 16, "fanout": 16}


def config(tmp: Path, interval: float) -> object:
    return build_config({
        "input": {"source": "stdin"},
        "output": {"sinks": ["stdout"]},
        "streams": {"key_file": str(tmp / "master.key"), "max_streams": 1_000_000, "template": dict(TEMPLATE)},
        "metrics": {"port": 0},
        "log": {"level": "warning"},
        "state": {"data_dir": str(tmp / "state"), "checkpoint_interval": interval, "checkpoint_every": 10**9},
    })


def lines_for(streams: int, per_stream: int, start: int = 0) -> list[bytes]:
    return [f"s{k},{(7 * (k + i)) % 900}".encode() for i in range(start, start + per_stream) for k in range(streams)]


async def checkpoints(tmp: Path, n: int) -> None:
    d = Daemon(config(tmp, 3600.0), stdin=io.BytesIO(b""), stdout=open(os.devnull, "w"), install_signals=False)
    d.startup()
    assert d.durable is not None
    dur = d.durable

    async def timed(what: str) -> None:
        await dur._sync()  # the journal and the held releases as the sync loop would have left them
        changed = len(dur.changed)
        t0 = time.perf_counter()
        dur.checkpoint()
        dt = time.perf_counter() - t0
        size = (tmp / "state" / "state.db").stat().st_size
        print(f"checkpoint, {what}: {changed:,} streams written in {dt:.3f} s ({dt / max(changed, 1) * 1e6:.0f} us "
              f"per stream); state.db {size / 1e6:.1f} MB")

    t0 = time.perf_counter()
    d.on_lines(lines_for(n, 10))  # creates every stream (ledger entries) and puts 10 readings into each holdout
    print(f"{n:,} streams created and admitted by the ledger in {time.perf_counter() - t0:.2f} s")
    await timed("all in holdout (holdout histograms stored)")
    d.on_lines(lines_for(n, TEMPLATE["holdout"], 10))
    await timed("all releasing (theta chosen: histograms deleted)")
    d.on_lines(lines_for(n // 100, 5, 200))
    await timed("1% of the streams changed")
    d.durable.close()


class FullPasses:
    """The garbage collector's full passes while it is installed: how many, and the longest (seconds)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.t0 = 0.0
        self.since = float("inf")  # passes that start before this perf_counter() time are not counted

    def __call__(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self.t0 = time.perf_counter()
        elif self.t0 >= self.since:
            self.times.append(time.perf_counter() - self.t0)

    def __enter__(self) -> FullPasses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)

    def __str__(self) -> str:
        longest = max(self.times, default=0.0)
        return f"{len(self.times)} full collections while measured, the longest {longest * 1e3:.0f} ms"


class GapTimedDaemon(Daemon):
    """A daemon that records the time between two chunks of stdin lines once ``measuring`` is set."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.gaps: list[float] = []
        self.last = 0.0
        self.measuring = threading.Event()

    def on_lines(self, lines: list[bytes]) -> None:
        now = time.perf_counter()
        if self.measuring.is_set():
            if self.last:  # both calls while readings flow at the steady rate
                self.gaps.append(now - self.last)
            self.last = now
        return super().on_lines(lines)


async def stall(tmp: Path, n: int, seconds: float, rate: int, *, keep_heap: bool) -> None:
    r, w = os.pipe()
    stdin = os.fdopen(r, "rb")
    d = GapTimedDaemon(config(tmp, 1.0), stdin=stdin, stdout=open(os.devnull, "w"), install_signals=False,
                       heap=Heap() if keep_heap else None)
    gaps, measuring = d.gaps, d.measuring

    def feed() -> None:
        out = os.fdopen(w, "wb")
        # warm-up: every stream once (a new stream costs one ledger transaction), not measured
        out.write(b"".join(f"s{k},1\n".encode() for k in range(n)))
        out.flush()
        time.sleep(4.0)
        passes.since = time.perf_counter()
        measuring.set()
        chunk = max(1, rate // 200)
        k = 0
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            out.write(b"".join(f"s{(k + i) % n},{(k + i) % 900}\n".encode() for i in range(chunk)))
            out.flush()
            k += chunk
            time.sleep(chunk / rate)
        out.close()

    passes = FullPasses()
    threading.Thread(target=feed, daemon=True).start()
    with passes:
        await d.serve()
    dur = d.durable
    assert dur is not None
    gaps.sort()
    # a checkpoint every 1 s over streams that all changed: the stall is one checkpoint
    print(f"intake at {rate:,} readings/s over {n:,} streams for {seconds:.0f} s, a checkpoint every 1 s: "
          f"{dur.checkpoints} checkpoints, the longest {dur.max_checkpoint_seconds:.3f} s (in the event loop at most "
          f"{dur.max_checkpoint_pause:.3f} s); longest gap between "
          f"processing steps {gaps[-1]:.3f} s (median {gaps[len(gaps) // 2] * 1e3:.1f} ms); {passes} "
          f"({'live objects frozen every 0.5 s, as `tops run` does' if keep_heap else 'nothing frozen after start'})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rate", type=int, default=20_000)
    ap.add_argument("--grid", choices=("exact", "compact"), default="exact",
                    help="the template's holdout_grid (compact: the holdouts are rows of a columnar holdout)")
    args = ap.parse_args()
    TEMPLATE["holdout_grid"] = args.grid
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}")
    settle_heap()  # as `tops run` does before its daemon starts
    with tempfile.TemporaryDirectory(prefix="tops-bench-state-", dir=ROOT) as t:
        asyncio.run(checkpoints(Path(t) / "a", args.streams))
        asyncio.run(stall(Path(t) / "b", args.streams, args.seconds, args.rate, keep_heap=False))
        asyncio.run(stall(Path(t) / "c", args.streams, args.seconds, args.rate, keep_heap=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

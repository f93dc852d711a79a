"""What a stream's memory is made of: the allocations the daemon still holds at the end of input, by the source line
that made them, in bytes per stream.

    python bench/bench_memory.py [--streams 100000] [--readings 10] [--holdout 3] [--theta T] [--top 20]

The daemon runs in this process on stdin (the template of `bench/bench_streams.py`: epsilon 1, B = 5,000, the exact
grid, holdout 3, or a public ``--theta``; no durable state; releases to /dev/null). Python's allocator is traced
(``tracemalloc``, numpy's arrays included) from just before the first reading to the end of input, after a full
collection; the difference is grouped by the line that allocated it. Lines that hold a fixed amount (caches bounded
whatever the number of streams, modules imported late) show fewer bytes a stream as ``--streams`` grows. Tracing
slows the run several times: the time printed is not a throughput. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import os
import random
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stream.core.config import build_config  # noqa: E402
from stream.daemon import service  # noqa: E402


class TracedDaemon(service.Daemon):
    """The daemon, with a snapshot of the traced allocations taken when the run ends (before its state is closed)."""

    snapshot: tracemalloc.Snapshot | None = None

    def shutdown(self) -> None:
        gc.collect()
        self.snapshot = tracemalloc.take_snapshot()
        super().shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=100_000)
    p.add_argument("--readings", type=int, default=10)
    p.add_argument("--holdout", type=int, default=3)
    p.add_argument("--theta", type=float, default=None, help="a public threshold: no holdout")
    p.add_argument("--top", type=int, default=20, help="lines printed")
    args = p.parse_args()
    rng = random.Random(0)
    data = "".join("".join(f"m{i},{rng.randrange(100)}\n" for i in range(args.streams))
                   for _ in range(args.readings)).encode()
    template: dict = {"epsilon": 1.0, "bound": 5000.0, "holdout_grid": "exact"}
    template.update({"theta": args.theta} if args.theta is not None else {"holdout": args.holdout})
    with tempfile.TemporaryDirectory() as tmp:
        key = Path(tmp) / "master.key"
        key.write_text(os.urandom(32).hex() + "\n")
        key.chmod(0o600)
        cfg = build_config({"input": {"source": "stdin"}, "output": {"sinks": ["stdout"]},
                            "streams": {"key_file": str(key), "max_streams": args.streams, "template": template},
                            "metrics": {"port": 0}, "state": {"data_dir": ""}, "log": {"level": "warning"}})
        with open(os.devnull, "w") as null:
            daemon = TracedDaemon(cfg, stdin=io.BytesIO(data), stdout=null, install_signals=False)
            tracemalloc.start(1)
            gc.collect()
            before = tracemalloc.take_snapshot()
            t0 = time.perf_counter()
            asyncio.run(daemon.serve())
            seconds = time.perf_counter() - t0
    assert daemon.snapshot is not None
    stats = daemon.snapshot.compare_to(before, "lineno")
    total = sum(s.size_diff for s in stats)
    n = args.streams
    phase = "public theta" if args.theta is not None else f"holdout {args.holdout}"
    print(f"{n:,} streams x {args.readings} readings ({phase}, exact grid, B = 5000): {total / 2**20:.1f} MiB held "
          f"at the end of input, {total / n:,.0f} bytes a stream ({seconds:.0f} s traced)")
    print("| bytes a stream | objects a stream | allocated at |")
    print("|---|---|---|")
    for s in stats[: args.top]:
        frame = s.traceback[0]
        where = frame.filename.replace(str(ROOT) + os.sep, "")
        print(f"| {s.size_diff / n:,.0f} | {s.count_diff / n:.2f} | {where}:{frame.lineno} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

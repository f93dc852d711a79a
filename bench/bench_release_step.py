"""A processing step of releasing rows, and a new releasing stream, in-process.

    python bench/bench_release_step.py [--streams 50000] [--rounds 6]

Makes ``--streams`` streams with a public theta (releasing from their first reading) in the daemon's router, once as
ToPS objects moved into rows (``Router._adopt``) and once born as release rows (``Router.release_row``), and prints
the microseconds a new stream costs each way; then feeds every stream one reading a round for ``--rounds`` rounds
and prints what ``Router.flush`` costs per releasing row (the compiled release, the release batches). The collector
runs as in the daemon; the streams made before the rounds are frozen (``gc.freeze``) as the daemon freezes what
lives long. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from operators import ToPS, ToPSConfig
from stream.core.router import Router


def births(cfg: ToPSConfig, n: int, rows: bool) -> tuple[float, Router]:
    """(seconds a new stream, the router) for ``n`` new streams made as objects or born as rows."""
    keys = iter([os.urandom(32) for _ in range(n)])
    if rows:  # the row made without its ToPS (the router's own release_row, once it uses columns)
        router = Router(lambda name: router.release_row(cfg, next(keys)), n + 1)
    else:
        router = Router(lambda name: ToPS(cfg, next(keys)), n + 1)
    router.use_columns()
    t0 = time.perf_counter()
    for i in range(n):
        router.record(f"m{i}", 1.0)
    return (time.perf_counter() - t0) / n, router


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=50_000)
    p.add_argument("--rounds", type=int, default=6)
    a = p.parse_args()
    cfg = ToPSConfig(epsilon=1.0, bound=5000, theta=100.0)
    for rows in (False, True, False, True):
        per, router = births(cfg, a.streams, rows)
        print(f"a new releasing stream {'born a row' if rows else 'as an object, then its row'}: {per * 1e6:.1f} us")
    recs = list(router.streams.values())
    now = time.time()
    for rec in recs:  # the first reading: each row's noise drawn ahead (its first refill)
        router.add(rec, 5.0, None, None, now)
    router.flush()
    gc.freeze()
    took = []
    for k in range(a.rounds):
        for rec in recs:
            router.add(rec, float(k % 100), None, None, now)
        t0 = time.perf_counter()
        router.flush()
        took.append((time.perf_counter() - t0) / len(recs))
    took.sort()
    print(f"{len(recs):,} releasing rows, one reading each a step: Router.flush {took[0] * 1e6:.2f} us a row "
          f"(median {took[len(took) // 2] * 1e6:.2f}, {a.rounds} steps)")


if __name__ == "__main__":
    main()

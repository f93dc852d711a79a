"""Readings of many streams through the compiled columnar kernel (the aim: 2 M readings/s on one core with
100,000 streams interleaved).

    python bench/bench_kernel.py [--streams 100000] [--readings 5000000] [--ahead 16] [--query-range 4096]
                                 [--smoother-layers 1]

Every stream is a releasing ToPS stream (public theta = 100, B = 5,000, b = 16, by default r = 2^12 and s = 1:
leaves of 16 ticks) made a row of :class:`operators.columnar.ColumnarRelease`. The readings go to uniformly random
streams (a random interleaving), in batches of 100,000 as a daemon step would hand them over. Prints the time of the
batches (the refills of drawn-ahead noise included, and how many), readings per second (wall time, and per second of
this process's CPU time: on a shared machine the wall time varies with the load), and a check that a sample of
streams released exactly what ToPS releases. Then ``--refill-rows`` rows of the daemon's default tree (r = 2^20,
b = 16, s = 2: leaves of 256 ticks, 3 layers), each with its own theta, have their noise drawn ahead in one call,
three times: the first (a tree's start: each row regenerates its top node's subtree) and the next two (16 leaves
each). Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from operators.columnar import ColumnarRelease
from operators.config import ToPSConfig
from operators.tops import ToPS


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=100_000)
    p.add_argument("--readings", type=int, default=5_000_000)
    p.add_argument("--ahead", type=int, default=16)
    p.add_argument("--batch", type=int, default=100_000)
    p.add_argument("--query-range", type=int, default=1 << 12)
    p.add_argument("--smoother-layers", type=int, default=1)
    p.add_argument("--refill-rows", type=int, default=100_000)
    args = p.parse_args()
    cfg = ToPSConfig(epsilon=1.0, bound=5000.0, theta=100.0, query_range=args.query_range, fanout=16,
                     smoother_layers=args.smoother_layers)
    rng = np.random.default_rng(0)
    keys = [rng.bytes(32) for _ in range(args.streams)]
    t0 = time.perf_counter()
    cols = ColumnarRelease(capacity=args.streams, ahead=args.ahead)
    for k in keys:
        cols.add(ToPS(cfg, k))
    made = time.perf_counter() - t0
    rows = rng.integers(0, args.streams, args.readings)
    values = rng.poisson(60.0, args.readings).astype(np.float64)
    warm = ColumnarRelease(capacity=1)
    warm.process(np.array([warm.add(ToPS(cfg, bytes(32)))]), np.array([1.0]))  # load the compiled kernel
    first_batch = None
    t0, c0 = time.perf_counter(), time.process_time()
    out = np.empty(args.readings)
    for i in range(0, args.readings, args.batch):
        b0 = time.perf_counter()
        out[i : i + args.batch] = cols.process(rows[i : i + args.batch], values[i : i + args.batch])
        if first_batch is None:
            first_batch = time.perf_counter() - b0
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = args.readings
    leaves = int(cols.drawn[: cols.rows].sum())
    print(f"{args.streams:,} streams as rows in {made:.1f} s (r = {cfg.query_range}, s = {cfg.smoother_layers}: "
          f"leaves of {cfg.fanout ** cfg.smoother_layers} ticks); {n:,} readings interleaved in batches of "
          f"{args.batch:,}: {seconds:.2f} s, {n / seconds / 1e6:.2f} M readings/s on one core (CPU {cpu:.2f} s, "
          f"{n / cpu / 1e6:.2f} M readings per CPU second), {leaves:,} leaves of noise drawn ahead (first batch "
          f"{first_batch:.2f} s); columns {cols.row_nbytes()} B per row")
    # the same readings again: the noise drawn ahead in the first pass is mostly still there
    t0, c0 = time.perf_counter(), time.process_time()
    before = int(cols.drawn[: cols.rows].sum())
    for i in range(0, args.readings, args.batch):
        cols.process(rows[i : i + args.batch], values[i : i + args.batch])
    again, cpu = time.perf_counter() - t0, time.process_time() - c0
    more = int(cols.drawn[: cols.rows].sum()) - before
    print(f"second pass over the same interleaving: {again:.2f} s, {n / again / 1e6:.2f} M readings/s (CPU "
          f"{n / cpu / 1e6:.2f} M readings per CPU second), {more:,} more leaves drawn")
    sample = range(0, args.streams, max(1, args.streams // 20))
    ok = sum(bool(np.array_equal(out[rows == r], ToPS(cfg, keys[r]).process(values[rows == r])[: (rows == r).sum()]))
             for r in sample)
    print(f"bit-identical to ToPS on {ok} of {len(sample)} sampled streams")
    refills(args.refill_rows, rng)
    return 0


def refills(n: int, rng: np.random.Generator) -> None:
    """The noise drawn ahead of ``n`` rows of the daemon's default tree, in one call, three times."""
    if n < 1:
        return
    cfg = ToPSConfig(epsilon=1.0, bound=5000.0, holdout=3)
    cols = ColumnarRelease(capacity=n, ahead=16)
    theta = rng.integers(1, 5001, n)
    cols.add_started(cfg, rng.integers(0, 256, (n, 32), dtype=np.uint8), theta.tolist(), 2, (theta / 2).tolist(),
                     np.full(n, 3), np.zeros(n, dtype=np.int64))
    rows = np.arange(n)
    for what in ("a tree's start", "the next 16 leaves", "the next 16 leaves"):
        cols.avail[rows] = 0  # every leaf drawn ahead used
        t0, c0 = time.perf_counter(), time.process_time()
        cols._refill(rows)  # what ColumnarRelease.process calls for the rows that run out in a batch
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"{n:,} rows of the default tree (r = 2^20, b = 16, s = 2), {np.unique(theta).size:,} thetas, refilled "
              f"in one call ({what}): {seconds:.2f} s, CPU {cpu:.2f} s, {cpu / n * 1e6:.1f} us a row")


if __name__ == "__main__":
    sys.exit(main())

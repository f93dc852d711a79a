"""Readings of many streams through the compiled columnar kernel (the aim: 2 M readings/s on one core with
100,000 streams interleaved).

    python bench/bench_kernel.py [--streams 100000] [--readings 5000000] [--ahead 16]

Every stream is a releasing ToPS stream (public theta = 100, B = 5,000, r = 2^12, b = 16, s = 1: leaves of 16
ticks) made a row of :class:`operators.columnar.ColumnarRelease`. The readings go to uniformly random streams (a
random interleaving), in batches of 100,000 as a daemon step would hand them over. Prints the time of the batches
(the refills of drawn-ahead noise included, and how many), readings per second, and a check that a sample of
streams released exactly what ToPS releases. Not a test: nothing here asserts.
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
    args = p.parse_args()
    cfg = ToPSConfig(epsilon=1.0, bound=5000.0, theta=100.0, query_range=1 << 12, fanout=16, smoother_layers=1)
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
    t0 = time.perf_counter()
    out = np.empty(args.readings)
    for i in range(0, args.readings, args.batch):
        b0 = time.perf_counter()
        out[i : i + args.batch] = cols.process(rows[i : i + args.batch], values[i : i + args.batch])
        if first_batch is None:
            first_batch = time.perf_counter() - b0
    seconds = time.perf_counter() - t0
    n = args.readings
    refills = int((cols.drawn[: cols.rows] // args.ahead).sum())
    print(f"{args.streams:,} streams as rows in {made:.1f} s; {n:,} readings interleaved in batches of "
          f"{args.batch:,}: {seconds:.2f} s, {n / seconds / 1e6:.2f} M readings/s on one core, {refills:,} refills "
          f"of {args.ahead} leaves (first batch {first_batch:.2f} s); columns {cols.row_nbytes()} B per row")
    # the same readings again: the noise drawn ahead in the first pass is mostly still there
    t0 = time.perf_counter()
    before = int(cols.drawn[: cols.rows].sum())
    for i in range(0, args.readings, args.batch):
        cols.process(rows[i : i + args.batch], values[i : i + args.batch])
    again = time.perf_counter() - t0
    more = (int(cols.drawn[: cols.rows].sum()) - before) // args.ahead
    print(f"second pass over the same interleaving: {again:.2f} s, {n / again / 1e6:.2f} M readings/s, {more:,} "
          f"refills")
    sample = range(0, args.streams, max(1, args.streams // 20))
    ok = sum(bool(np.array_equal(out[rows == r], ToPS(cfg, keys[r]).process(values[rows == r])[: (rows == r).sum()]))
             for r in sample)
    print(f"bit-identical to ToPS on {ok} of {len(sample)} sampled streams")
    return 0


if __name__ == "__main__":
    sys.exit(main())

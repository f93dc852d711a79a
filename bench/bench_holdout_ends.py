"""The end of many holdouts: each stream's own choice against the choices made together.

    python bench/bench_holdout_ends.py [--streams 20000] [--holdout 3] [--grid compact|exact] [--bound 5000]

Makes ``--streams`` ToPS streams whose holdouts take their readings (drawn over 100 values), then times the end of
their holdouts on the same streams: one at a time (``ToPS._select``, what ``process`` does at the holdout's last
reading), together (``operators.tops.end_holdouts``, what the daemon does with the holdouts of objects that end in one
processing step) and, where the configuration ends in rows (a holdout too short to measure a leaf width), from rows
of a columnar holdout into release rows (``choose_ends`` of ``ColumnarHoldout`` on the compact grid, of
``ShortHoldout`` on the exact one, then ``ColumnarRelease.add_started``: what the daemon does with such streams),
with the compiled kernels loaded and compiled beforehand, and checks that all choose the same. Prints microseconds
per stream. Not a test: only the equality is asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from operators import noise
from operators.columnar import ColumnarRelease
from operators.columnar_holdout import ends_in_rows, holdout_store
from operators.config import ToPSConfig
from operators.tops import ToPS, end_holdouts


def held(cfg: ToPSConfig, keys: list[bytes], data: np.ndarray) -> list[ToPS]:
    ops = [ToPS(cfg, k) for k in keys]
    for op, d in zip(ops, data, strict=True):
        op.hold(d)
    return ops


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=20_000)
    p.add_argument("--holdout", type=int, default=3)
    p.add_argument("--grid", choices=["compact", "exact"], default="compact")
    p.add_argument("--bound", type=float, default=5000.0)
    a = p.parse_args()
    noise._kernel(1 << 16)  # the compiled kernels, as a daemon has them
    cfg = ToPSConfig(epsilon=1.0, bound=a.bound, holdout=a.holdout, holdout_grid=a.grid)
    rng = np.random.default_rng(0)
    keys = [rng.bytes(32) for _ in range(a.streams)]
    data = rng.integers(0, 100, (a.streams, a.holdout)).astype(np.float64)
    end_holdouts(held(cfg, keys[:64], data[:64]))  # compile or load every kernel first
    for op in held(cfg, keys[:64], data[:64]):
        op._select()
    alone, together = held(cfg, keys, data), held(cfg, keys, data)
    t0 = time.perf_counter()
    for op in alone:
        op._select()
    t1 = time.perf_counter()
    end_holdouts(together)
    t2 = time.perf_counter()
    assert all(x.snapshot() == y.snapshot() for x, y in zip(alone, together, strict=True))
    n = a.streams
    rows_text = ""
    if ends_in_rows(cfg):
        store, pool = holdout_store(cfg, capacity=n), ColumnarRelease(capacity=n)
        rows = np.array([store.add_new(k) for k in keys], dtype=np.int64)
        store.process(np.repeat(rows, a.holdout), data.reshape(-1), end=True)
        warm = store.choose_ends(rows[:64])
        assert warm is not None
        t3 = time.perf_counter()
        chosen = store.choose_ends(rows)
        assert chosen is not None
        pool.add_started(cfg, store.key[rows], *chosen, store.ticks[rows], store.clamped[rows])
        t4 = time.perf_counter()
        assert chosen[0] == [op.theta_units for op in alone] and chosen[2] == [op.start_units for op in alone]
        rows_text = f", from rows into release rows {1e6 * (t4 - t3) / n:.1f} us a stream"
    print(f"{n:,} holdouts of {a.holdout} ({a.grid} grid, B = {a.bound:g}): one at a time {1e6 * (t1 - t0) / n:.1f} us "
          f"a stream, together {1e6 * (t2 - t1) / n:.1f} us a stream{rows_text} (the same choices)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

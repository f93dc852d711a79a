"""What the compact holdout grid costs: accuracy against the exact grid, and a holdout's memory.

    python bench/bench_holdout_grid.py [--repetitions 8] [--queries 1000] [--quick] [--memory-only]

Accuracy: ToPS with ``holdout_grid = "exact"`` (the default: every value step up to 4,096, then 0.1% apart) and
``"compact"`` (32 steps, then 3% apart), with the same keys and the same ranges (`stream.commands.compare.run_compare`,
the code behind `tops compare`), on the streams of `bench/bench_accuracy.py` (DNS and retail extended to m + 2^20
ticks, the second half of DNS, retail reversed, three `tops simulate` meters), prints the mean MSE of both, their
ratio and the median theta. Memory: the heap of one ToPS operator in a holdout of m = 65,536 that has taken 1,000
readings spread over [0, B) (B = 5,000; Python's tracemalloc over 300 operators, after a warm-up), for both grids,
and the bytes of the row such a holdout is in the daemon with the compact grid (operators/columnar_holdout.py).
Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operators.columnar_holdout import ColumnarHoldout  # noqa: E402
from operators.config import ToPSConfig  # noqa: E402
from operators.tops import ToPS  # noqa: E402

EPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def holdout_heap(grid: str, *, readings: int = 1000, operators: int = 300) -> tuple[float, int]:
    """(bytes of heap per operator, cells of its holdout histogram) for ``operators`` holdouts of ``readings``."""
    cfg = ToPSConfig(epsilon=1.0, bound=5000.0, holdout=65536, holdout_grid=grid)
    values = np.random.default_rng(0).integers(0, 5000, size=readings).astype(float).tolist()

    def make(i: int) -> ToPS:
        op = ToPS(cfg, key=i.to_bytes(32, "little"))
        for v in values:
            op.process_one(v)
        return op

    warm = [make(i) for i in range(10)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ops = [make(i) for i in range(operators)]
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del warm
    return (after - before) / len(ops), len(ops[0]._dense_hist())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repetitions", type=int, default=8)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--quick", action="store_true", help="DNS and retail only")
    ap.add_argument("--memory-only", action="store_true")
    args = ap.parse_args()
    for grid in ("exact", "compact"):
        heap, cells = holdout_heap(grid)
        print(f"holdout_grid = {grid}: {cells:,} cells; one operator in a holdout of 65,536 after 1,000 readings "
              f"over [0, 5,000): {heap:,.0f} B of heap")
    store = ColumnarHoldout(ToPSConfig(epsilon=1.0, bound=5000.0, holdout=65536, holdout_grid="compact"))
    print(f"holdout_grid = compact, the holdout as a row of a columnar holdout (what `tops run` keeps): "
          f"{store.row_nbytes():,} B a row ({store.cells} histogram cells, {len(store.widths)} widths x "
          f"{len(store.caps)} caps of block statistics), whatever the readings")
    if args.memory_only:
        return 0
    from bench_accuracy import streams

    from stream.commands.compare import run_compare

    print(f"{args.repetitions} keys x {args.queries} ranges per point; m = 65,536, r = 2^20, b = 16; mean MSE")
    print("| stream | eps | exact grid | compact grid | compact / exact | theta exact, compact (median) |")
    print("|---|---|---|---|---|---|")
    t0 = time.perf_counter()
    ratios = []
    for name, values, bound in streams(args.quick):
        rows = {}
        for grid in ("exact", "compact"):
            res = run_compare(
                values, methods=["tops"], grid=[(e, e) for e in EPS],
                base=ToPSConfig(epsilon=1.0, bound=bound, holdout_grid=grid), repetitions=args.repetitions,
                queries=args.queries, seed=0, show_progress=False,
            )
            rows[grid] = {r.epsilon: r.row() for r in res}
        for e in EPS:
            x, c = rows["exact"][e], rows["compact"][e]
            ratio = c["mse_mean"] / x["mse_mean"]
            ratios.append(ratio)
            print(f"| {name} | {e:g} | {x['mse_mean']:.3g} | {c['mse_mean']:.3g} | {ratio:.2f} | "
                  f"{x['theta_median']:g}, {c['theta_median']:g} |", flush=True)
    r = np.array(ratios)
    print(f"compact / exact: median {np.median(r):.2f}, geometric mean {np.exp(np.log(r).mean()):.2f}, "
          f"range {r.min():.2f}-{r.max():.2f} over {r.size} points; {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

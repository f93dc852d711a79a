"""The fleet holdout against each stream's own holdout, on many streams of one template.

    python bench/bench_fleet.py [--data dns,meters,mixed-meters] [--streams 1000] [--queries 200] [--repetitions 2]

For each data set, ``--streams`` streams of one template run with their own holdouts and with one fleet holdout,
with the same keys and readings: the protocol of ``tops compare DATA --holdout-scope fleet``
(:mod:`stream.commands.compare_fleet`), whose table it prints. Data sets: ``dns`` (the shipped DNS stream cut into
consecutive pieces, one a stream; fanout 4, r = 256), ``meters`` (``tops simulate``'s meters, sizes 0.7-1.3x) and
``mixed-meters`` (sizes log-uniform in 0.25-4x: a fleet that is not alike). Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operators import ToPSConfig  # noqa: E402
from stream.commands import datasets  # noqa: E402
from stream.commands.compare_fleet import TABLE_HEAD, compare_fleet, table_line  # noqa: E402
from stream.commands.simulate import simulate_values  # noqa: E402


def fleet_data(name: str, streams: int) -> tuple[np.ndarray, ToPSConfig]:
    """``streams`` rows of readings and the template they run with."""
    if name == "dns":
        x = datasets.load("dns").astype(np.float64)
        each = x.size // streams
        cfg = ToPSConfig(epsilon=1.0, bound=datasets.DATASETS["dns"].bound, holdout=min(100, each // 3),
                         query_range=256, fanout=4, holdout_scope="fleet")
        return x[: each * streams].reshape(streams, each), cfg
    ticks = 3 * 1440
    if name == "meters":
        scales = 0.7 + 0.6 * ((np.arange(streams) * 0.618) % 1)  # as `tops simulate --streams N` makes them
    elif name == "mixed-meters":
        scales = np.exp(np.random.default_rng(7).uniform(np.log(0.25), np.log(4.0), streams))
    else:
        msg = f"unknown data set {name!r}"
        raise SystemExit(msg)
    rows = np.stack([simulate_values(ticks, seed=k, scale=float(s)) for k, s in enumerate(scales)])
    return rows, ToPSConfig(epsilon=1.0, bound=5000, holdout=1440, query_range=1024, fanout=16,
                            holdout_scope="fleet")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="dns,meters,mixed-meters")
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--repetitions", type=int, default=2)
    args = ap.parse_args()
    print(f"{TABLE_HEAD}{'seconds':>9}")
    for name in args.data.split(","):
        t0 = time.perf_counter()
        rows, cfg = fleet_data(name, args.streams)
        c = compare_fleet(rows, cfg, repetitions=args.repetitions, queries=args.queries)
        print(f"{table_line(name, cfg, rows.shape[1], c)}{time.perf_counter() - t0:>9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

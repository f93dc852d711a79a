"""What a shorter holdout costs: range-query accuracy of smart meters against the holdout length.

    python bench/bench_holdout_length.py [--holdouts 30,60,240,1440] [--meters 8] [--keys 4] [--days 14]

The shipped `deploy/tops.toml` counts one tick a minute per meter (period sums, B = 5,000 Wh). A stream releases
nothing until its holdout of m ticks has chosen the threshold, so m minutes is the wait for a new meter's first
release. This runs ToPS (the operator the daemon runs) with the shipped template's parameters on `tops simulate`
meters (one minute a tick, daily cycle, heavy-tailed spikes), for each holdout length, on the same meters, keys and
ranges, and prints the mean range-query MSE (ranges of 1 tick to one day, and of 1 tick to one week) over the ticks
every holdout length releases (those after the longest holdout), its ratio to the longest holdout's, and the median
theta. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operators.config import ToPSConfig  # noqa: E402
from operators.evaluation import range_query_errors  # noqa: E402
from operators.tops import ToPS  # noqa: E402
from stream.commands.simulate import simulate_values  # noqa: E402

DAY = 1440


def run(holdouts: list[int], meters: int, keys: int, days: int, queries: int) -> list[dict[str, float]]:
    """One row per holdout length: mean MSE of day-long and week-long ranges, and the median theta."""
    longest = max(holdouts)
    n = longest + days * DAY
    rows = []
    for m in holdouts:
        cfg = ToPSConfig(epsilon=1.0, bound=5000.0, holdout=m, query_range=65536, fanout=16, smoother="recent")
        day_mse, week_mse, thetas = [], [], []
        for meter in range(meters):
            values = simulate_values(n, seed=meter)
            for k in range(keys):
                key = hashlib.sha256(f"holdout-length {meter} {k}".encode()).digest()
                op = ToPS(cfg, key)
                released = np.asarray(op.process(values), dtype=np.float64)[longest:]
                truth = values[longest:]
                thetas.append(float(op.theta))
                rng = np.random.default_rng(1000 * meter + k)
                day_mse.append(float(np.mean(range_query_errors(truth, released, max_length=DAY, queries=queries,
                                                                rng=rng) ** 2)))
                week_mse.append(float(np.mean(range_query_errors(truth, released, max_length=7 * DAY,
                                                                 queries=queries, rng=rng) ** 2)))
        rows.append({"holdout": m, "day": float(np.mean(day_mse)), "week": float(np.mean(week_mse)),
                     "theta": float(np.median(thetas))})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--holdouts", default="30,60,240,1440", help="holdout lengths in ticks (comma-separated)")
    p.add_argument("--meters", type=int, default=8, help="simulated meters (seeds 0..N-1)")
    p.add_argument("--keys", type=int, default=4, help="noise keys per meter")
    p.add_argument("--days", type=int, default=14, help="days of released ticks evaluated")
    p.add_argument("--queries", type=int, default=1000, help="random ranges per stream and length")
    a = p.parse_args()
    holdouts = sorted(int(x) for x in a.holdouts.split(","))
    rows = run(holdouts, a.meters, a.keys, a.days, a.queries)
    base = rows[-1]
    print(f"epsilon 1, B 5000, r 65536, b 16, recent smoother; {a.meters} meters x {a.keys} keys, "
          f"{a.days} days evaluated after tick {max(holdouts)}")
    print("| holdout (min) | first release after | MSE, ranges up to a day | ratio | up to a week | ratio | "
          "median theta |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        wait = f"{r['holdout'] / 60:.1f} h" if r["holdout"] >= 60 else f"{r['holdout']} min"
        print(f"| {r['holdout']} | {wait} | {r['day']:.3g} | {r['day'] / base['day']:.2f} | {r['week']:.3g} | "
              f"{r['week'] / base['week']:.2f} | {r['theta']:.0f} |")


if __name__ == "__main__":
    main()

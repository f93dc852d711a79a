"""Coverage of ``tops query``'s 95 % intervals for the true range sum, at the scale of the paper's protocol.

    python bench/bench_coverage.py [--runs 100] [--windows 40] [--released 262144] [--seed 1]

For each stream (the shipped DNS and retail data, ``tops simulate`` meters) and configuration, ``--runs`` independent
runs of ToPS (a fresh key each) release ``--released`` ticks after the holdout; ``--windows`` windows a run, of
log-uniform lengths in [1, n] at uniform starts, are answered by ``stream.query.Releases`` from what the daemon
publishes (the releases and the stream's status). Printed per length class: the share of windows whose interval
holds the true sum, the same for the old noise-only bar (``total +- 1.96 noise sd``), and the median width of the
interval over the true sum. Not a test: nothing here asserts (tests/query/test_coverage.py holds the checked version).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.query._coverage import CLASSES, Kind, released_run  # noqa: E402

CONFIGS = [  # (stream, B, holdout, what it shows)
    ("dns", 500.0, 65536, "DNS, B = 500"),
    ("retail", 500.0, 65536, "retail, B = 500"),
    ("retail", 16470.0, 65536, "retail, B = 16,470 (the loose bound of tops compare)"),
    ("meter", 5000.0, 16384, "meters, m = 16,384 (theta truncates the spikes)"),
    ("meter", 5000.0, 65536, "meters, m = 65,536 (theta = B: nothing truncated)"),
]


def measure(name: str, bound: float, holdout: int, *, runs: int, windows: int, released: int,
            seed: int) -> dict[tuple[int, int], list[tuple[bool, bool, float]]]:
    out: dict[tuple[int, int], list[tuple[bool, bool, float]]] = {c: [] for c in CLASSES}
    kind = Kind(name, bound)
    for r in range(runs):
        key = hashlib.sha256(f"bench-coverage/{name}/{bound}/{holdout}/{seed}/{r}".encode()).digest()
        run = released_run(kind, key, holdout=holdout, released=released)
        c = np.concatenate([[0.0], np.cumsum(run.truth)])
        rng = np.random.default_rng([seed, r])
        for length in np.exp(rng.uniform(0.0, np.log(released), windows)).astype(np.int64).tolist():
            a = int(rng.integers(0, released - length + 1))
            ans = run.releases.range_sum(holdout + a, holdout + a + length - 1)
            truth = c[a + length] - c[a]
            noise = 1.96 * (ans.noise_sd or 0.0)
            cls = next(x for x in CLASSES if x[0] <= length < x[1])
            out[cls].append((ans.low <= truth <= ans.high, abs(ans.total - truth) <= noise,
                             (ans.high - ans.low) / max(abs(truth), 1.0)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--windows", type=int, default=40)
    ap.add_argument("--released", type=int, default=1 << 18)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print(f"{args.runs} runs x {args.windows} windows, {args.released} released ticks a run, eps = 1, r = 2^20, "
          "b = 16; per length class: interval coverage / noise-only bar coverage / median width over the true sum")
    print("| stream | " + " | ".join(f"[{lo}, {hi if hi < 1 << 40 else 'n'})" for lo, hi in CLASSES) + " | seconds |")
    print("|---" * (len(CLASSES) + 2) + "|")
    for name, bound, holdout, what in CONFIGS:
        t0 = time.perf_counter()
        got = measure(name, bound, holdout, runs=args.runs, windows=args.windows, released=args.released,
                      seed=args.seed)
        cells = []
        for cls in CLASSES:
            rows = np.array(got[cls], dtype=float)
            cells.append("-" if not rows.size else
                         f"{rows[:, 0].mean():.3f} / {rows[:, 1].mean():.3f} / {np.median(rows[:, 2]):.3g}")
        print(f"| {what} | " + " | ".join(cells) + f" | {time.perf_counter() - t0:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Accuracy of the calibrated selection of (theta, s) against the paper's and the hindsight-best.

    python bench/bench_accuracy.py [--repetitions 8] [--queries 2000] [--quick]

For every stream and eps it runs ToPS (calibrated, the default), ToPS with the paper's selection (Eq. 6 / Eq. 7)
and ToPS at the best fixed (theta, s) found on the truth (not private), each with the same keys and ranges
(`stream.commands.compare.run_compare`, the code behind `tops compare`), and prints mean MSE, the two ratios and
the MSE by range length class. Streams: DNS and retail extended to m + 2^20 ticks (the paper's protocol), and streams
the method was never looked at while it was designed: `tops simulate` meters (three seeds, 1-minute ticks, B = 5000)
and held-out parts of the data (the second half of DNS; retail reversed). Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operators.config import ToPSConfig  # noqa: E402
from stream.commands import datasets  # noqa: E402
from stream.commands.compare import run_compare  # noqa: E402
from stream.commands.scoring import LENGTH_CLASSES, extend  # noqa: E402
from stream.commands.simulate import SUGGESTED_BOUND, simulate_values  # noqa: E402

EPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
M, R = 65536, 1 << 20


def streams(quick: bool) -> list[tuple[str, np.ndarray, float]]:
    dns, retail = datasets.load("dns").astype(float), datasets.load("retail").astype(float)
    out = [
        ("dns", extend(dns, M + R), datasets.DATASETS["dns"].bound),
        ("retail", extend(retail, M + R), datasets.DATASETS["retail"].bound),
    ]
    if quick:
        return out
    out += [
        ("dns second half", extend(dns[dns.size // 2 :], M + R), datasets.DATASETS["dns"].bound),
        ("retail reversed", extend(retail[::-1], M + R), datasets.DATASETS["retail"].bound),
    ]
    out += [(f"meter seed {s}", simulate_values(M + R, seed=s), float(SUGGESTED_BOUND)) for s in (1, 2, 3)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repetitions", type=int, default=8)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="DNS and retail only")
    args = ap.parse_args()
    classes = [name for name, _, _ in LENGTH_CLASSES]
    print(f"{args.repetitions} keys x {args.queries} ranges per point; m = {M}, r = 2^20, b = 16; mean MSE")
    print("| stream | eps | calibrated | paper | hindsight (not private) | calibrated / paper | calibrated / hindsight"
          " | theta, s (median) | " + " | ".join(f"calibrated / paper {c}" for c in classes) + " |")
    print("|---" * (8 + len(classes)) + "|")
    worst_paper = worst_hind = 0.0
    t0 = time.perf_counter()
    for name, values, bound in streams(args.quick):
        res = run_compare(
            values, methods=["tops", "tops-paper", "hindsight"], grid=[(e, e) for e in EPS],
            base=ToPSConfig(epsilon=1.0, bound=bound), repetitions=args.repetitions, queries=args.queries, seed=0,
            show_progress=False,
        )
        rows = {(r.method, r.epsilon): r.row() for r in res}
        for e in EPS:
            c, p, h = rows[("tops", e)], rows[("tops-paper", e)], rows[("hindsight", e)]
            rp, rh = c["mse_mean"] / p["mse_mean"], c["mse_mean"] / h["mse_mean"]
            worst_paper, worst_hind = max(worst_paper, rp), max(worst_hind, rh)
            per_class = " | ".join(f"{c['mse_' + k] / p['mse_' + k]:.2f}" for k in classes)
            print(f"| {name} | {e:g} | {c['mse_mean']:.3g} | {p['mse_mean']:.3g} | {h['mse_mean']:.3g} | {rp:.2f} | "
                  f"{rh:.2f} | {c['theta_median']:g}, {c['s_median']:g} | {per_class} |", flush=True)
    print(f"worst calibrated / paper {worst_paper:.2f}; worst calibrated / hindsight {worst_hind:.2f}; "
          f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What any eps-LDP threshold phase can promise on the shipped streams: Le Cam's two-point bound.

    python bench/bench_local_bound.py [--holdout 65536] [--range 1048576] [--factor 1.5]

For DNS, retail (the reference code's B) and a ``tops simulate`` meter (seed 1, B = 5,000), each extended to
m + r ticks as ``tops compare --mode local`` does, and every eps of the local comparison: the thetas within ``factor``
of the best on the holdout's true readings, the alternative stream (a share of the readings moved to one value)
whose interval is disjoint, the divergence bound between what m reports can show of the two, and the least
probability with which *any* threshold phase (rounds, estimator, mechanism) misses the factor on one of the two
(:mod:`operators.local.lower_bound`). Then the density estimate ToPL's threshold phase ends with (rounds, EM,
SW-W) against the truth, over ``--keys`` keys: Wasserstein-1 distance to the holdout's readings (in reading
units), the estimate's mass above the largest reading, and theta. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operators.local.lower_bound import two_point_bound  # noqa: E402
from operators.topl import ToPL, ToPLConfig  # noqa: E402
from stream.commands import datasets  # noqa: E402
from stream.commands.compare_local import LOCAL_DEFAULT_EPS  # noqa: E402
from stream.commands.scoring import extend, repetition_key  # noqa: E402
from stream.commands.simulate import simulate_values  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--holdout", type=int, default=65536)
    ap.add_argument("--range", type=int, default=1 << 20)
    ap.add_argument("--factor", type=float, default=1.5)
    ap.add_argument("--keys", type=int, default=3)
    args = ap.parse_args()
    m, r = args.holdout, args.range
    streams = [(name, extend(np.asarray(datasets.load(name), dtype=np.float64), m + r), datasets.DATASETS[name].bound)
               for name in ("dns", "retail")]
    streams.append(("meter", simulate_values(m + r, seed=1), 5000.0))
    print(f"holdout m = {m} reports, r = {r}, factor {args.factor}; the bound holds for every eps-LDP threshold phase")
    print(f"{'data':<7}{'eps':>5}{'best':>9}{'interval':>20}{'alt: share':>12}{'at':>8}{'its best':>10}"
          f"{'KL <=':>9}{'P(miss) >=':>12}")
    for name, values, bound in streams:
        for eps in LOCAL_DEFAULT_EPS:
            tb = two_point_bound(values[:m], bound, eps, m, query_range=r, factor=args.factor)
            lo, hi = tb.interval
            print(f"{name:<7}{eps:>5g}{tb.best:>9.4g}{f'[{lo:.4g}, {hi:.4g}]':>20}{tb.share:>12.2%}{tb.value:>8.0f}"
                  f"{tb.alt_theta:>10.4g}{tb.kl:>9.3g}{tb.miss_probability:>12.3g}")
    print(f"\nthe threshold phase's density estimate against the truth ({args.keys} keys; median)")
    print(f"{'data':<7}{'eps':>5}{'W1':>10}{'mass > max':>12}{'theta':>9}{'best':>8}")
    for name, values, bound in streams:
        hold = np.clip(values[:m], 0.0, bound)
        for eps in LOCAL_DEFAULT_EPS:
            w1, tail, thetas = [], [], []
            for rep in range(args.keys):
                op = ToPL(ToPLConfig(epsilon=eps, bound=bound, holdout=m, query_range=r), repetition_key(0, rep))
                op.process(hold)
                assert op.estimate is not None and op.theta is not None
                w1_, tail_ = estimate_against_truth(op.estimate.density, op.domain, hold)
                w1.append(w1_)
                tail.append(tail_)
                thetas.append(op.theta)
            best = two_point_bound(hold, bound, eps, m, query_range=r, factor=args.factor).best
            print(f"{name:<7}{eps:>5g}{np.median(w1):>10.4g}{np.median(tail):>12.2%}{np.median(thetas):>9.4g}{best:>8.4g}")
    return 0


def estimate_against_truth(density: np.ndarray, domain: float, readings: np.ndarray) -> tuple[float, float]:
    """(W1 between the estimate, each bucket's mass spread uniformly over it, and the readings clamped to the
    estimate's domain; the estimate's mass above the largest reading)."""
    f = np.asarray(density, dtype=np.float64) / float(np.sum(density))
    k = f.size
    edges = np.linspace(0.0, domain, k + 1)
    x = np.minimum(readings, domain)
    # W1 = integral of |F_est - F_true| over [0, domain]; both CDFs evaluated on a fine grid (64 points per bucket)
    t = np.linspace(0.0, domain, 64 * k + 1)
    f_est = np.interp(t, edges, np.concatenate([[0.0], np.cumsum(f)]))
    f_true = np.searchsorted(np.sort(x), t, side="right") / x.size
    w1 = float(np.sum(np.abs(f_est - f_true)[:-1]) * (t[1] - t[0]))
    centres = (edges[:-1] + edges[1:]) / 2
    return w1, float(f[centres > x.max()].sum())


if __name__ == "__main__":
    raise SystemExit(main())

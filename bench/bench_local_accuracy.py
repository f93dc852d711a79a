"""Local mode against the authors' reference ToPL on the shipped and held-out streams, key by key.

    python bench/bench_local_accuracy.py [--streams dns,retail,dns-second-half,retail-reversed,meter]
                                         [--eps 0.2,0.4,0.6,1,2,4] [--repetitions 10] [--queries 1000]
                                         [--json FILE]

The protocol of ``tops compare DATA --mode local --ticks 1114112`` (:func:`stream.commands.compare_local.
run_compare_local`): each stream extended to m + r ticks (m = 65,536, r = 2^20), both phases at the same eps, every
repetition its own key, 1,000 random ranges of uniform length in [1, r] over the released ticks. For every stream
and eps it prints the mean MSE of tops's local mode over the reference's (``ratio``), the worst key's MSE over the
reference's mean (``worst/ref``), the thetas of both, and the theta of the true density (not private).

Streams: ``dns`` and ``retail`` (shipped, used in the design), and three not used in it: ``dns-second-half`` (DNS
from its middle on), ``retail-reversed`` and ``meter`` (``tops simulate``'s meter, seed 1, B = 5,000). Not a test:
nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operators.topl import ToPLConfig  # noqa: E402
from stream.commands import datasets  # noqa: E402
from stream.commands.compare_local import run_compare_local, true_density_theta  # noqa: E402
from stream.commands.scoring import extend  # noqa: E402
from stream.commands.simulate import simulate_values  # noqa: E402

HOLDOUT = 65536
RANGE = 1 << 20
STREAMS = ("dns", "retail", "dns-second-half", "retail-reversed", "meter")


def stream(name: str, n: int) -> tuple[np.ndarray, float]:
    """The stream ``name`` extended to ``n`` ticks, and its public bound B."""
    if name in ("dns", "retail"):
        return extend(datasets.load(name), n), datasets.DATASETS[name].bound
    if name == "dns-second-half":
        x = datasets.load("dns")
        return extend(x[x.size // 2 :], n), datasets.DATASETS["dns"].bound
    if name == "retail-reversed":
        return extend(datasets.load("retail")[::-1], n), datasets.DATASETS["retail"].bound
    if name.startswith("meter"):
        seed = int(name[5:] or 1)
        return simulate_values(n, seed=seed), 5000.0
    msg = f"unknown stream {name!r}"
    raise ValueError(msg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default=",".join(STREAMS))
    ap.add_argument("--eps", default="0.2,0.4,0.6,1,2,4")
    ap.add_argument("--repetitions", type=int, default=10)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write every key's MSE and theta here")
    args = ap.parse_args()
    eps_grid = [float(e) for e in args.eps.split(",")]
    rows = []
    print(f"{'stream':<17}{'eps':>5}{'ratio':>8}{'worst/ref':>11}{'tops theta':>16}{'ref theta':>16}"
          f"{'true':>7}{'true/ref':>10}")
    for name in args.streams.split(","):
        values, bound = stream(name, HOLDOUT + RANGE)
        base = ToPLConfig(epsilon=1.0, bound=bound, holdout=HOLDOUT, query_range=RANGE)
        for eps in eps_grid:
            t0 = time.perf_counter()
            res = run_compare_local(values, methods=["topl", "reference", "true-density"], grid=[(eps, eps)],
                                    base=base, repetitions=args.repetitions, queries=args.queries, seed=args.seed,
                                    show_progress=False)
            by = {r.method: r for r in res}
            tops, ref, true = (np.array(by[m].mse) for m in ("topl", "reference", "true-density"))
            th, rth = np.array(by["topl"].thetas), np.array(by["reference"].thetas)
            best = true_density_theta(values[:HOLDOUT], bound, eps, RANGE)
            row = {"stream": name, "eps": eps, "ratio": tops.mean() / ref.mean(),
                   "worst_over_ref": tops.max() / ref.mean(), "true_over_ref": true.mean() / ref.mean(),
                   "tops_mse": tops.tolist(), "ref_mse": ref.tolist(), "tops_theta": th.tolist(),
                   "ref_theta": rth.tolist(), "true_theta": best, "seconds": time.perf_counter() - t0}
            rows.append(row)
            print(f"{name:<17}{eps:>5g}{row['ratio']:>8.3f}{row['worst_over_ref']:>11.3f}"
                  f"{f'{th.min():.4g}-{th.max():.4g}':>16}{f'{rth.min():.4g}-{rth.max():.4g}':>16}"
                  f"{best:>7.4g}{row['true_over_ref']:>10.3f}", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the calibrated choice of (theta, s) costs against the best fixed one in hindsight, over many keys, in seconds.

    python bench/bench_choice_cost.py [--keys 40] [--streams dns,retail,...] [--eps 0.01,0.02,...]

`bench/bench_accuracy.py` runs the whole stream for every key, so a point takes minutes and its 10-key mean carries
the noise of the hierarchy too. This bench runs only the holdout's choice for each key (the first m readings, the
same ToPS and keys as `tops compare`) and prices the chosen (theta, s) on the truth: the hindsight table's
deterministic error of that pair (truncation and the recent smoother, no noise) plus its noise, ``G_s theta^2 /
eps^2`` (:mod:`operators.hindsight`; a theta above the table's largest is priced at the largest's truncation with
its own noise). Each point prints the mean over keys of that expected MSE over the hindsight best's, the worst
key's ratio, the chosen thetas' quartiles and how many keys took each s: where the choice loses, and whether it is
theta or s. The truth of the ranges is the unclipped stream, as in `tops compare` (readings above B cost every
method the same). Streams: DNS and retail extended to m + 2^20 ticks, DNS's second half, retail reversed, and
`tops simulate` meters (seeds 1-3). Not a test: nothing here asserts.
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
from operators.hindsight import DeterministicErrors  # noqa: E402
from operators.selection import noise_constant  # noqa: E402
from operators.tops import ToPS  # noqa: E402
from stream.commands import datasets  # noqa: E402
from stream.commands.scoring import extend, repetition_key  # noqa: E402
from stream.commands.simulate import SUGGESTED_BOUND, simulate_values  # noqa: E402

M, R, FANOUT = 65536, 1 << 20, 16
EPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
STREAMS = ("dns", "retail", "dns-second-half", "retail-reversed", "meter-1", "meter-2", "meter-3")


def stream(name: str) -> tuple[np.ndarray, float]:
    if name.startswith("meter-"):
        return simulate_values(M + R, seed=int(name.split("-")[1])), float(SUGGESTED_BOUND)
    base = name.split("-")[0]
    raw = datasets.load(base).astype(float)
    if name.endswith("second-half"):
        raw = raw[raw.size // 2 :]
    elif name.endswith("reversed"):
        raw = raw[::-1]
    return extend(raw, M + R), datasets.DATASETS[base].bound


def priced(expected: np.ndarray, thetas: np.ndarray, theta: float, s: int, eps: float) -> float:
    """The expected MSE of (theta, s) from the hindsight table: its nearest theta's, or past the table's largest (no
    more truncation than there), the largest's with the noise of ``theta``."""
    if theta > thetas[-1]:
        extra = noise_constant(FANOUT, R, s) * (theta * theta - thetas[-1] ** 2) / eps**2
        return float(expected[-1, s] + extra)
    return float(expected[int(np.argmin(np.abs(thetas - theta))), s])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=40)
    p.add_argument("--streams", default=",".join(STREAMS), help=f"some of {', '.join(STREAMS)}")
    p.add_argument("--eps", default=",".join(f"{e:g}" for e in EPS))
    args = p.parse_args()
    eps_grid = [float(e) for e in args.eps.split(",")]
    print(f"{args.keys} keys a point; m = {M}, r = 2^20, b = {FANOUT}; expected MSE of the chosen (theta, s) over the"
          " hindsight best's")
    print("| stream | eps | mean | worst key | hindsight theta, s | chosen theta (quartiles) | keys at s = 0..4 |")
    print("|---|---|---|---|---|---|---|")
    t0 = time.perf_counter()
    means = []
    for name in args.streams.split(","):
        values, bound = stream(name)
        table = DeterministicErrors(values[:M], np.minimum(values[M:], bound), query_range=R, fanout=FANOUT, seed=0,
                                    truth=values[M:])
        thetas = table.thetas
        for eps in eps_grid:
            expected = table.expected(eps)
            best_i, best_s = np.unravel_index(int(np.argmin(expected)), expected.shape)
            best = float(expected[best_i, best_s])

            ratios, chosen, layers = [], [], []
            cfg = ToPSConfig(epsilon=eps, threshold_epsilon=eps, bound=bound)
            for rep in range(args.keys):
                op = ToPS(cfg, repetition_key(0, rep))
                op.process(values[: M + 1])  # the holdout, and the reading that starts the release
                theta, s = float(op.theta_units) * cfg.resolution, int(op.smoother_layers)
                ratios.append(priced(expected, thetas, theta, s, eps) / best)
                chosen.append(theta)
                layers.append(s)
            ratio = float(np.mean(ratios))
            means.append(ratio)
            q = np.percentile(chosen, [25, 50, 75])
            counts = np.bincount(layers, minlength=len(table.layers)).tolist()
            print(f"| {name} | {eps:g} | {ratio:.2f} | {max(ratios):.2f} | {thetas[best_i]:g}, {best_s} | "
                  f"{q[0]:g}, {q[1]:g}, {q[2]:g} | {' '.join(map(str, counts))} |", flush=True)
    print(f"worst mean {max(means):.2f}; mean of the means {np.mean(means):.2f}; {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

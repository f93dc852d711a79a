"""The fleet holdout against each stream's own holdout, on many streams of one template.

    python bench/bench_fleet.py [--data dns,meters,mixed-meters] [--streams 1000] [--queries 200] [--repetitions 2]

For each data set, ``--streams`` streams of one template run twice, with the same keys and readings:

* ``stream``: each stream's own ToPS (its first ``m`` readings held out, then released);
* ``fleet``: ``holdout_scope = "fleet"``: the streams' readings arrive round-robin (reading ``t`` of every stream,
  then reading ``t + 1``), the fleet holdout takes the first ``m`` of them (:class:`operators.fleet_holdout.
  FleetHoldout`), and every stream releases all its other readings with the fleet's choice, as the daemon and
  ``tops replay --holdout-scope fleet`` do.

It prints the mean squared error of random range sums (lengths uniform in ``[1, r]``) over the ticks both release
(``t >= m``), fleet over stream (``ratio``), and for the ticks a stream's own holdout keeps (``t < m``, which the
per-stream template never releases): the fleet's MSE over that of answering 0, the best a consumer can do without
a release. Data sets: ``dns`` (the shipped DNS stream cut into consecutive pieces, one a stream), ``meters``
(``tops simulate``'s meters, sizes 0.7-1.3x) and ``mixed-meters`` (sizes log-uniform in 0.25-4x: a fleet that is not
alike). Not a test: nothing here asserts.
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

from operators import ToPS, ToPSConfig  # noqa: E402
from operators.fleet_holdout import FleetHoldout  # noqa: E402
from stream.commands import datasets  # noqa: E402
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


def _key(label: str, rep: int, k: int) -> bytes:
    return hashlib.sha256(f"bench-fleet/{label}/{rep}/{k}".encode()).digest()


def per_stream(rows: np.ndarray, cfg: ToPSConfig, rep: int) -> tuple[np.ndarray, list[float]]:
    own = cfg.replace(holdout_scope="stream")
    out = np.empty_like(rows)
    thetas = []
    for k, x in enumerate(rows):
        op = ToPS(own, _key("stream", rep, k))
        out[k] = op.process(x)
        thetas.append(op.theta)
    return out, thetas


def fleet(rows: np.ndarray, cfg: ToPSConfig, rep: int) -> tuple[np.ndarray, float]:
    n, length = rows.shape
    arrival = rows.T.reshape(-1)  # round-robin: reading t of every stream, then reading t + 1
    holdout = FleetHoldout(cfg, _key("fleet", rep, -1))
    holdout.take(arrival)
    assert holdout.choice is not None
    taken = np.zeros(n * length, dtype=bool)
    taken[: holdout.taken] = True
    held = taken.reshape(length, n).sum(axis=0)  # each stream's readings the fleet took (its first ones)
    out = np.full_like(rows, np.nan)
    for k, x in enumerate(rows):
        h = int(held[k])
        out[k, h:] = holdout.member(_key("stream", rep, k), h).process(x[h:])
    return out, holdout.choice.theta_units * cfg.resolution


def range_mse(releases: np.ndarray, rows: np.ndarray, lo: int, hi: int, r: int, queries: int,
              rng: np.random.Generator) -> np.ndarray:
    """Each stream's MSE of ``queries`` random range sums inside ticks ``[lo, hi)``, lengths uniform in
    ``[1, min(r, hi - lo)]`` (NaN releases count as 0: what a consumer has without a release)."""
    rel = np.nan_to_num(releases[:, lo:hi])
    truth = rows[:, lo:hi]
    cr = np.concatenate([np.zeros((rel.shape[0], 1)), np.cumsum(rel, axis=1)], axis=1)
    ct = np.concatenate([np.zeros((rel.shape[0], 1)), np.cumsum(truth, axis=1)], axis=1)
    span = hi - lo
    lengths = rng.integers(1, min(r, span) + 1, size=queries)
    starts = (rng.random(queries) * (span - lengths + 1)).astype(np.int64)
    err = (cr[:, starts + lengths] - cr[:, starts]) - (ct[:, starts + lengths] - ct[:, starts])
    return (err**2).mean(axis=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="dns,meters,mixed-meters")
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--repetitions", type=int, default=2)
    args = ap.parse_args()
    print(f"{'data':<14}{'m':>6}{'ticks':>7}{'fleet theta':>20}{'own thetas (median, 10-90%)':>30}"
          f"{'MSE t>=m, fleet/own':>22}{'MSE t<m, fleet/zero':>22}{'seconds':>9}")
    for name in args.data.split(","):
        t0 = time.perf_counter()
        rows, cfg = fleet_data(name, args.streams)
        m = cfg.holdout
        ratios, young, fleet_thetas, own_thetas = [], [], [], []
        for rep in range(args.repetitions):
            own, thetas = per_stream(rows, cfg, rep)
            shared, theta = fleet(rows, cfg, rep)
            q = np.random.default_rng([rep, 1])
            late_own = range_mse(own, rows, m, rows.shape[1], cfg.query_range, args.queries, q)
            q = np.random.default_rng([rep, 1])
            late_fleet = range_mse(shared, rows, m, rows.shape[1], cfg.query_range, args.queries, q)
            ratios.append(late_fleet.mean() / late_own.mean())
            # the ticks a stream's own holdout keeps, from the first the fleet released in every stream
            first = int(np.isnan(shared).sum(axis=1).max())
            if first < m:
                q = np.random.default_rng([rep, 2])
                young_fleet = range_mse(shared, rows, first, m, cfg.query_range, args.queries, q)
                q = np.random.default_rng([rep, 2])
                young_zero = range_mse(np.full_like(rows, np.nan), rows, first, m, cfg.query_range, args.queries, q)
                young.append(young_fleet.mean() / young_zero.mean())
            fleet_thetas.append(theta)
            own_thetas += thetas
        lo, med, hi = np.percentile(own_thetas, [10, 50, 90])
        young_text = f"{np.mean(young):.3f}" if young else "-"
        print(f"{name:<14}{m:>6}{rows.shape[1]:>7}{'/'.join(f'{t:g}' for t in fleet_thetas):>20}"
              f"{f'{med:g} ({lo:g}-{hi:g})':>30}{np.mean(ratios):>22.3f}{young_text:>22}"
              f"{time.perf_counter() - t0:>9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark of categorical streams on the commuting stand-in (n = 2,750,238; 1,085 county cells;
9,796,900 origin-destination cells, 287,116 non-empty).

    python bench/bench_categorical.py [--eps 1,5] [--skip-od]

Targets: county-level OLH exact decoding <= 5 s; an OD-level estimate with OUE-level accuracy <= 60 s; the
discrete Laplace histogram over the 9.8 M OD cells <= 5 s; the stability histogram <= 1 s. Times are the server's
(devices are simulated first, keyed uniforms included, and timed apart); the RMSE is of the unbiased estimates
(Base) over all cells, next to OUE's closed form sqrt(n 4 e^eps / (e^eps - 1)^2). Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stream.commands.categorical_data import synthetic_dataset  # noqa: E402
from stream.commands.compare_categorical import run_method  # noqa: E402

KEY = bytes(range(32))


def _row(method: str, level: str, eps: float, data, truth) -> dict:
    t = time.perf_counter()
    est, server = run_method(method, level, eps, data, KEY)
    total = time.perf_counter() - t
    e = math.exp(eps)
    return {
        "method": method, "level": level, "eps": eps, "server_s": round(server, 2),
        "devices_s": round(total - server, 2), "rmse": round(math.sqrt(float(np.mean((est - truth) ** 2))), 1),
        "oue_rmse_closed_form": round(math.sqrt(data.n * 4 * e / (e - 1) ** 2), 1),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--eps", default="1,5")
    p.add_argument("--skip-od", action="store_true")
    args = p.parse_args()
    eps_grid = [float(v) for v in args.eps.split(",")]
    t = time.perf_counter()
    data = synthetic_dataset(0)
    print(f"stand-in: {data.n} users, {data.od_cells.size} non-empty OD cells ({time.perf_counter() - t:.1f} s)")
    # warm the compiled kernels (numba cache) on a small problem
    small = synthetic_dataset(1, scale=0.001)
    for m in ("olh", "olh-fourier", "hr", "hm"):
        run_method(m, "county", 2.0, small, KEY)
    rows = []
    county = data.counts("county").astype(np.float64)
    for eps in eps_grid:
        for m in ("olh", "olh-fourier", "hr", "hm", "grr"):
            rows.append(_row(m, "county", eps, data, county))
            print(json.dumps(rows[-1]), flush=True)
    if not args.skip_od:
        od = data.counts("od").astype(np.float64)
        for eps in eps_grid:
            for m in ("olh-fourier", "hr", "hm"):
                rows.append(_row(m, "od", eps, data, od))
                print(json.dumps(rows[-1]), flush=True)
        for m in ("laplace", "stability"):
            rows.append(_row(m, "od", 1.0, data, od))
            print(json.dumps(rows[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

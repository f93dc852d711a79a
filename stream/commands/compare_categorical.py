"""``tops compare-categorical``: the experiments of Finnegan's thesis (2024, section 5) on the synthetic stand-in.

For each method, level (county: 1,085 cells; od: 9,796,900 cells) and eps: simulate every user's device (the
keyed generator, one key per repetition), decode on the server, post-process (Base-Pro by default, as the thesis
does), and write the RMSE over all cells (counts), the largest error and the server's decoding time to a CSV.

Methods: central ``laplace`` (discrete Laplace on every cell) and ``stability`` (stability histogram, delta =
1/(2n)); local ``grr``, ``oue`` (the column sums of the n simulated reports drawn as binomials: the same law, without
the O(n d) bits), ``olh`` (exact decoding, O(n d): county level only), ``olh-fourier`` (OLH over a prime field,
exact decoding by one transform), ``hm`` (one-bit Hadamard) and ``hr`` (Hadamard Response).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from operators.categorical import (
    POSTPROCESSORS,
    fourier_estimate,
    fourier_g,
    fourier_perturb,
    fourier_seeds,
    fourier_support,
    grr_estimate,
    grr_perturb,
    hm_estimate,
    hm_perturb,
    hm_tally,
    hr_estimate,
    hr_perturb,
    laplace_histogram,
    olh_estimate,
    olh_g,
    olh_perturb,
    olh_seeds,
    olh_support,
    stability_histogram,
    unary_estimate,
    unary_simulate_support,
)
from operators.categorical._common import categorical_domain
from operators.noise import KeyedGenerator
from stream.commands.categorical_data import CategoricalData, synthetic_dataset

__all__ = ["METHODS", "add_arguments", "main", "run_method"]

METHODS = ("laplace", "stability", "grr", "oue", "olh", "olh-fourier", "hm", "hr")
LEVELS = ("county", "od")


def run_method(method: str, level: str, eps: float, data: CategoricalData, key: bytes) -> tuple[np.ndarray, float]:
    """``(estimated counts over the level's cells, server seconds)``; devices are simulated before the clock."""
    gen = KeyedGenerator(key)
    d = data.d_county if level == "county" else data.d_od
    sim = categorical_domain("simulate")
    if method == "laplace":
        counts = data.counts(level)
        t0 = time.perf_counter()
        return laplace_histogram(counts, eps, gen, neighbours="substitute").astype(np.float64), time.perf_counter() - t0
    if method == "stability":
        if level == "county":
            cells = np.flatnonzero(data.county_counts())
            cnt = data.county_counts()[cells]
        else:
            cells, cnt = data.od_cells, data.od_counts
        t0 = time.perf_counter()
        out_cells, noisy = stability_histogram(cells, cnt, eps, 1 / (2 * data.n), gen)
        dense = np.zeros(d)
        dense[out_cells] = noisy
        return dense, time.perf_counter() - t0
    n = data.n
    x = data.users(level)
    if method == "oue":
        rng = np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
        support = unary_simulate_support(data.counts(level), eps, rng)
        t0 = time.perf_counter()
        return unary_estimate(support, n, eps), time.perf_counter() - t0
    u = gen.uniforms(sim, 0, 0, 2 * n)
    if method == "grr":
        r = grr_perturb(x, d, eps, u)
        t0 = time.perf_counter()
        return grr_estimate(np.bincount(r, minlength=d), n, d, eps), time.perf_counter() - t0
    if method == "olh":
        g = olh_g(eps)
        a, b = olh_seeds(gen.words(sim, 1, 0, 4 * n))
        r = olh_perturb(x, g, eps, a, b, u)
        t0 = time.perf_counter()
        return olh_estimate(olh_support(a, b, r, g, d), n, g, eps), time.perf_counter() - t0
    if method == "olh-fourier":
        g, k = fourier_g(eps, d)
        a = fourier_seeds(gen.uniforms(sim, 1, 0, k * n), g, k)
        r = fourier_perturb(x, g, eps, a, u)
        t0 = time.perf_counter()
        return fourier_estimate(fourier_support(a, r, g, d), n, g, eps), time.perf_counter() - t0
    if method == "hm":
        col, bit = hm_perturb(x, d, eps, u)
        t0 = time.perf_counter()
        return hm_estimate(hm_tally(col, bit, d), d, eps), time.perf_counter() - t0
    if method == "hr":
        out = hr_perturb(x, d, eps, u)
        t0 = time.perf_counter()
        return hr_estimate(out, d, eps), time.perf_counter() - t0
    msg = f"unknown method {method!r}; known: {', '.join(METHODS)}"
    raise ValueError(msg)


def _floats(text: str) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in text.split(","))
    except ValueError:
        msg = f"not a comma-separated list of numbers: {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if not all(0 < v <= 30 for v in out):
        msg = "every eps must be in (0, 30]"
        raise argparse.ArgumentTypeError(msg)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--methods", default="laplace,stability,grr,oue,olh,olh-fourier,hm,hr",
                   help=f"comma-separated, of: {', '.join(METHODS)}")
    p.add_argument("--level", choices=LEVELS, default="county", help="county (1,085 cells) or od (9,796,900)")
    p.add_argument("--eps", type=_floats, default=(0.5, 1.0, 2.0, 3.0, 5.0), help="eps grid (default 0.5,1,2,3,5)")
    p.add_argument("--repetitions", type=int, default=1, help="runs per point, each with its own key (default 1)")
    p.add_argument("--post", choices=sorted(POSTPROCESSORS), default="base-pro", help="post-processing (base-pro)")
    p.add_argument("--seed", type=int, default=0, help="seed of the stand-in and the keys (default 0)")
    p.add_argument("--out", default="categorical_compare.csv", help="CSV file (default categorical_compare.csv)")


def main(args: argparse.Namespace) -> int:
    methods = [m.strip() for m in args.methods.split(",")]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        print(f"tops compare-categorical: unknown method {bad[0]!r}; known: {', '.join(METHODS)}", file=sys.stderr)
        return 2
    if args.level == "od" and "olh" in methods:
        print("tops compare-categorical: olh's O(n d) exact decoding is for the county level; use olh-fourier",
              file=sys.stderr)
        return 2
    if args.repetitions < 1:
        print("tops compare-categorical: --repetitions must be at least 1", file=sys.stderr)
        return 2
    data = synthetic_dataset(args.seed)
    truth = data.counts(args.level).astype(np.float64)
    rows: list[dict[str, Any]] = []
    for method in methods:
        for eps in args.eps:
            for rep in range(args.repetitions):
                key = hashlib.sha256(f"tops-categorical/{args.seed}/{rep}".encode()).digest()
                est, seconds = run_method(method, args.level, eps, data, key)
                out = POSTPROCESSORS[args.post](est, data.n)
                err = out - truth
                rows.append({"method": method, "level": args.level, "eps": eps, "repetition": rep,
                             "post": args.post, "rmse": math.sqrt(float(np.mean(err**2))),
                             "max_error": float(np.abs(err).max()), "server_seconds": round(seconds, 3)})
                print(f"{method:12s} {args.level:6s} eps={eps:<4} rmse={rows[-1]['rmse']:.1f} "
                      f"max={rows[-1]['max_error']:.0f} server={seconds:.2f}s", flush=True)
    path = Path(args.out)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0

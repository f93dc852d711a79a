"""``tops simulate``: a synthetic smart-meter feed (daily cycle, heavy-tailed spikes) for demos and tests.

Each reading is the energy one household used in one minute, in Wh (integers >= 0): a daily cycle with a morning
and an evening peak, gamma-distributed jitter, and rare Pareto spikes (kettles, ovens) that a threshold should cut.
The generator is numpy's seeded PCG64: this is *data*, not privacy noise.

>>> x = simulate_values(2000, seed=1)
>>> x.dtype, bool((x >= 0).all()), x.shape
(dtype('float64'), True, (2000,))
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

__all__ = ["add_arguments", "main", "simulate_values"]

SUGGESTED_BOUND = 5000


def simulate_values(ticks: int, *, seed: int = 0, period: int = 1440, scale: float = 1.0) -> np.ndarray:
    """``ticks`` readings of one meter (Wh per tick)."""
    rng = np.random.default_rng(seed)
    t = np.arange(ticks)
    phase = 2 * np.pi * (t % period) / period
    cycle = 60 + 50 * np.exp(-((phase - 2.1) ** 2) / 0.2) + 90 * np.exp(-((phase - 4.9) ** 2) / 0.35)
    jitter = rng.gamma(shape=2.0, scale=10.0, size=ticks)
    spikes = np.where(rng.random(ticks) < 0.02, 300 * (rng.pareto(1.5, size=ticks) + 1), 0.0)
    return np.rint(scale * (cycle + jitter + spikes))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--streams", type=int, default=1, help="number of meters (default 1)")
    p.add_argument("--ticks", type=int, default=100_000, help="readings per meter (default 100000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default 0)")
    p.add_argument("--period", type=int, default=1440, help="ticks per day (default 1440: one a minute)")
    p.add_argument("--format", choices=("jsonl", "csv", "npy"), default="jsonl", help="output format")
    p.add_argument("--out", help="output file (default stdout; required for npy)")
    p.add_argument(
        "--rate", type=float, default=0.0, help="readings per second to pace output (default: no pacing)"
    )
    p.add_argument("--prefix", default="meter-", help="stream name prefix (default meter-)")
    p.add_argument(
        "--seq-start", type=int, default=None, metavar="N",
        help="seq of each stream's first reading (default: the time in microseconds, so a re-run continues above "
        "the numbers of an earlier run and its readings are not dropped as duplicates)",
    )


def main(args: argparse.Namespace) -> int:
    if args.streams < 1 or args.ticks < 1:
        print("tops simulate: error: --streams and --ticks must be at least 1", file=sys.stderr)
        return 2
    seq_start = time.time_ns() // 1000 if args.seq_start is None else args.seq_start
    if not 0 <= seq_start < (1 << 63) - args.ticks:
        print("tops simulate: error: --seq-start must be in [0, 2^63 - ticks)", file=sys.stderr)
        return 2
    if args.format == "npy" and (not args.out or args.streams != 1):
        print("tops simulate: error: --format npy needs --out FILE and a single stream", file=sys.stderr)
        return 2
    data = [
        simulate_values(
            args.ticks, seed=args.seed + k, period=args.period, scale=0.7 + 0.6 * ((k * 0.618) % 1)
        )
        for k in range(args.streams)
    ]
    if args.format == "npy":
        np.save(args.out, data[0])
        return 0
    out = open(args.out, "w") if args.out else sys.stdout
    try:
        t0 = 1_767_225_600  # 1 January 2026, 00:00 UTC
        pause = 1.0 / args.rate if args.rate > 0 else 0.0
        for i in range(args.ticks):
            for k in range(args.streams):
                name = f"{args.prefix}{k + 1}"
                v = int(data[k][i])
                if args.format == "csv":
                    out.write(f"{name},{v}\n")
                else:
                    out.write(json.dumps({"stream": name, "seq": seq_start + i, "ts": t0 + 60 * i, "value": v}) + "\n")
                if pause:
                    out.flush()
                    time.sleep(pause)
    finally:
        if out is not sys.stdout:
            out.close()
    return 0

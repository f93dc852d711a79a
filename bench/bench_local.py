"""Benchmark of local mode: Square Wave EM, device-side perturbation throughput, ToPL on DNS.

    python bench/bench_local.py [--repeat 5]

Prints the figures docs/performance.md quotes (targets: SW EM over 65,536 reports with 1024 buckets under 1 s; a device
perturbs 1 million readings per second, keyed uniforms included). Not a test: nothing here asserts.
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

from operators.local import (  # noqa: E402
    estimate_density,
    hybrid_worst_case_variance,
    square_wave_parameters,
    square_wave_perturb,
)
from operators.noise import Domain, KeyedGenerator  # noqa: E402
from operators.topl import ToPL, ToPLConfig  # noqa: E402
from stream.commands import datasets  # noqa: E402
from stream.device.client import Device, stream_control, threshold_control  # noqa: E402

M = 65536


def _best(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return min(times), result


def sw_em(repeat: int) -> list[dict]:
    """histogram + EM (no smoothing) + SW-W over 65,536 reports, 1024 reading and 1024 report buckets."""
    gen = KeyedGenerator(bytes(32))
    dns = datasets.load("dns").astype(np.float64)[:M]
    skewed = np.random.default_rng(0).beta(1.5, 8.0, M)
    t = time.perf_counter()
    estimate_density(square_wave_perturb(skewed[:1000], 1.0, gen.uniforms(Domain.LOCAL, 9, 0, 1000)), 1.0)
    first_call = time.perf_counter() - t  # numba: loads the cached kernel (or compiles it the very first time)
    rows = []
    for name, x in (("beta(1.5,8)", skewed), ("dns/500", dns / 500.0)):
        for eps in (0.5, 1.0, 2.0, 4.0):
            y = square_wave_perturb(x, eps, gen.uniforms(Domain.LOCAL, 1, 0, x.size))
            seconds, est = _best(lambda y=y, eps=eps: estimate_density(y, eps, buckets=1024), repeat)
            rows.append(
                {"data": name, "eps": eps, "seconds": round(seconds, 4), "iterations": est.iterations, "cut": est.cut}
            )
    print(f"first EM call in this process (kernel load/compile): {first_call:.2f} s")
    return rows


def device_throughput(repeat: int) -> dict:
    """Device.perturb_values (keyed uniforms + randomizer) and Device.perturb (+ report dicts), 1 M readings."""
    n = 1_000_000
    readings = np.random.default_rng(1).exponential(5.0, n)
    out = {}
    for phase, control in (
        ("threshold", threshold_control("bench", 1.0, 100.0)),
        ("stream", stream_control("bench", 1.0, 20.0)),
    ):
        dev = Device("bench", 1.0)
        dev.on_control(control)
        seconds, _ = _best(lambda dev=dev: dev.perturb_values(readings), repeat)
        out[f"{phase}_values_per_s"] = round(n / seconds)
        small = readings[:100_000]
        seconds, reports = _best(lambda dev=dev, small=small: dev.perturb(small, ts=0.0), repeat)
        out[f"{phase}_messages_per_s"] = round(small.size / seconds)
        seconds, _ = _best(lambda reports=reports: [json.dumps(r, separators=(",", ":")) for r in reports], 1)
        out[f"{phase}_json_per_s"] = round(small.size / seconds)
    gen = KeyedGenerator(bytes(32))
    seconds, _ = _best(lambda: gen.uniforms(Domain.LOCAL, 2, 0, 2 * n), repeat)
    out["keyed_uniforms_per_s"] = round(2 * n / seconds)
    return out


def topl_dns(repeat: int) -> list[dict]:
    dns = datasets.load("dns").astype(np.float64)
    rows = []
    for eps in (0.5, 1.0, 2.0):
        cfg = ToPLConfig(epsilon=eps, bound=500.0)
        seconds, topl = _best(lambda cfg=cfg: _run(cfg, dns), repeat)
        out = ToPL(cfg, bytes(32)).process(dns)
        truncated = np.minimum(dns[M:], topl.theta)
        err = out[M:] - truncated
        sd = topl.theta / 2 * math.sqrt(hybrid_worst_case_variance(eps))
        rows.append(
            {
                "eps": eps,
                "theta": topl.theta,
                "truncated_share": round(float(np.mean(dns[M:] > topl.theta)), 5),
                "seconds": round(seconds, 3),
                "ticks_per_s": round(dns.size / seconds),
                "per_tick_sd": round(float(err.std()), 3),
                "per_tick_sd_eq22": round(sd, 3),
                "mean_error": round(float(err.mean()), 4),
            }
        )
    return rows


def _run(cfg: ToPLConfig, x: np.ndarray) -> ToPL:
    topl = ToPL(cfg, bytes(32))
    topl.process(x)
    return topl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print("Square Wave EM, 65,536 reports, 1024 x 1024 buckets (best of", args.repeat, "runs):")
    rows = sw_em(args.repeat)
    for r in rows:
        print(
            f"  {r['data']:12s} eps={r['eps']:<4} {r['seconds']:.4f} s  {r['iterations']:5d} iterations  cut={r['cut']}"
        )
    print(f"  slowest: {max(r['seconds'] for r in rows):.4f} s (target < 1 s)")
    print("Device side, 1,000,000 readings:")
    dev = device_throughput(args.repeat)
    for k, v in dev.items():
        print(f"  {k:28s} {v:>12,}")
    print("ToPL on dns_google_per_second (n = 355,872, B = 500, m = 65,536):")
    for r in topl_dns(max(1, args.repeat // 2)):
        print("  " + ", ".join(f"{k}={v}" for k, v in r.items()))
    print("SW parameters b(eps):", {e: round(square_wave_parameters(e)[0], 4) for e in (0.5, 1.0, 2.0, 4.0)})


if __name__ == "__main__":
    main()

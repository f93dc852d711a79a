"""Benchmark of the exact discrete Laplace sampler: samples/s and random bits per sample.

    python bench/bench_noise.py

Not a test: nothing here asserts. One line per scale.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operators import noise  # noqa: E402
from operators.noise import DiscreteLaplace, KeyedGenerator  # noqa: E402

N = 400_000


def main() -> None:
    gen = KeyedGenerator(bytes(32))
    for eps, sens in [(1.0, 0.3), (1.0, 1.0), (1.0, 38.0), (0.05, 38.0), (1.0, 1000.0), (0.001, 2.0**20)]:
        dl = DiscreteLaplace(epsilon=eps, sensitivity=sens)
        gen.discrete_laplace(1, 0, 0, 1000, dl)
        best = 0.0
        for rep in range(3):
            t = time.perf_counter()
            gen.discrete_laplace(1, rep + 1, 0, N, dl)
            best = max(best, N / (time.perf_counter() - t))
        words = gen.words(1, 0, 0, 8 * 100_000)
        bits = noise._Bits(words, 8)
        noise._sample(bits, 100_000, dl)
        print(
            f"scale {sens / eps:>10.4g}: {best / 1e6:5.2f} M samples/s, "
            f"{bits.cur[~bits.ovf].mean():6.1f} random bits per sample, overflow {bits.ovf.mean():.1e}"
        )


if __name__ == "__main__":
    main()

"""Benchmark of the central core: replay throughput, state per stream, utility on DNS.

    python bench/bench_replay.py [--repeat 5]

Prints the figures docs/performance.md and docs/accuracy.md quote. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operators import ToPS, ToPSConfig  # noqa: E402
from operators.evaluation import range_query_errors, summarize  # noqa: E402
from operators.noise import DiscreteLaplace, Domain, KeyedGenerator  # noqa: E402
from stream.commands import datasets  # noqa: E402
from stream.commands.inputs import read_stream  # noqa: E402

M, R = 65536, 1 << 20
KEY_HEX = "ab" * 32


def replay_throughput(path: Path, repeat: int) -> dict:
    walls, inner = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "stream.cli",
                "replay",
                str(path),
                "--epsilon",
                "0.05",
                "--bound",
                "500",
                "--key",
                KEY_HEX,
                "--out",
                str(path.with_name("out.npy")),
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        walls.append(time.perf_counter() - t)
        inner.append(float(res.stderr.split(" M ticks/s")[0].rsplit(" ", 1)[-1]))
    n = M + R
    in_process = []
    for _ in range(repeat):
        t = time.perf_counter()
        x = read_stream(path)
        rel = ToPS(ToPSConfig(epsilon=0.05, bound=500), bytes.fromhex(KEY_HEX)).process(x)
        np.save(path.with_name("out2.npy"), rel)
        in_process.append(n / (time.perf_counter() - t) / 1e6)
    return {
        "ticks": n,
        "command wall seconds (median)": round(statistics.median(walls), 3),
        "command wall M ticks/s (interpreter start included)": round(n / statistics.median(walls) / 1e6, 1),
        "in-command M ticks/s, read+process+write (median)": round(statistics.median(inner), 1),
        "in-process M ticks/s, read+process+write (median)": round(statistics.median(in_process), 1),
    }


def state_per_stream() -> dict:
    cfg = ToPSConfig(epsilon=1.0, bound=500)
    op = ToPS(cfg, bytes(32))
    op.process(np.ones(1000))
    holdout_bytes = op.state_nbytes()
    op.process(np.ones(M))
    release_bytes = op.state_nbytes()
    snap_bytes = len(json.dumps(op.snapshot()))
    # Python heap per stream, all objects included, 2000 streams in their release phase
    n = 2000
    fixed = ToPSConfig(epsilon=1.0, bound=500, theta=20)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    ops = [ToPS(fixed, bytes([k % 256]) * 32) for k in range(n)]
    for o in ops:
        o.process(np.ones(70))
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    heap = sum(s.size_diff for s in after.compare_to(before, "filename")) / n
    return {
        "numeric state, holdout phase (B = 500), bytes": holdout_bytes,
        "numeric state, release phase, bytes": release_bytes,
        "checkpoint JSON, release phase, bytes": snap_bytes,
        "Python heap per stream, release phase, bytes": round(heap),
    }


def utility() -> dict:
    x = datasets.extended("dns", M + R)
    truth = x[M:]
    out = {}
    for eps in (0.05, 1.0):
        op = ToPS(ToPSConfig(epsilon=eps, bound=500), bytes.fromhex(KEY_HEX))
        rel = op.process(x)[M:]
        theta = int(op.theta)
        flat = np.minimum(truth, theta) + KeyedGenerator(bytes(32)).discrete_laplace(
            int(Domain.BASELINE), 0, 0, R, DiscreteLaplace(epsilon=eps, sensitivity=theta)
        )
        row = {"theta": theta, "s": op.smoother_layers}
        for name, est in (("ToPS", rel), ("flat Laplace", flat), ("always zero", np.zeros(R))):
            errs = range_query_errors(
                truth, est, max_length=R, queries=200 * 10, rng=np.random.default_rng(0)
            )
            row[f"MSE {name}"] = float(f"{summarize(errs)[0]:.3g}")
        out[f"eps={eps}"] = row
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "dns.npy"
        np.save(path, datasets.extended("dns", M + R))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "stream.cli",
                "replay",
                str(path),
                "--epsilon",
                "1",
                "--bound",
                "500",
                "--out",
                str(Path(d) / "warm.npy"),
            ],
            check=True,
            capture_output=True,
            cwd=ROOT,
        )
        report = {"replay of 2^20 + 65536 DNS ticks": replay_throughput(path, args.repeat)}
    report["state per stream (defaults)"] = state_per_stream()
    report["range-query MSE on DNS, 2000 queries"] = utility()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

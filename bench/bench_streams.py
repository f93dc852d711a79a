"""Many streams in one process, through `tops run` on stdin.

    python bench/bench_streams.py [--streams 200000] [--readings 6] [--holdout 3] [--bound 5000] [--theta T]
                                  [--grid exact|compact] [--values 100]

Writes ``streams x readings`` lines ``mN,value`` (one reading of every stream, then the next round: every stream is
in its holdout at the same time, the worst case for memory), runs `tops run` on them with no durable state and
stdout to /dev/null, and prints the wall time, readings per second and the peak resident memory of the daemon
(per stream after the process's baseline, measured with 1 stream). With ``--readings`` below ``--holdout`` every
stream stays in its holdout (the holdout's memory); with ``--theta`` (a public threshold) there is no holdout and
every stream is releasing from its first reading (the releasing state's memory); ``--grid`` is the template's
``holdout_grid``; ``--values`` the number of distinct readings (drawn uniformly). Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(tmp: Path, streams: int, readings: int, holdout: int, bound: float, theta: float | None = None,
        grid: str = "exact", values: int = 100) -> tuple[float, int]:
    """(seconds, peak RSS in KiB) of one `tops run` over the generated input."""
    cfg = tmp / "tops.toml"
    cfg.write_text(
        "[input]\nsource = \"stdin\"\n[output]\nsinks = [\"stdout\"]\n"
        f"[streams]\nkey_file = \"{tmp / 'master.key'}\"\nmax_streams = {max(streams, 1)}\n"
        f"[streams.template]\nepsilon = 1.0\nbound = {bound}\nholdout_grid = \"{grid}\"\n"
        + (f"holdout = {holdout}\n" if theta is None else f"theta = {theta}\n")
        + "[state]\ndata_dir = \"\"\n[metrics]\nport = 0\n"
    )
    data = tmp / f"in-{streams}.csv"
    rng = random.Random(0)
    with data.open("w") as f:
        for _ in range(readings):
            f.write("".join(f"m{i},{rng.randrange(values)}\n" for i in range(streams)))
    t0 = time.perf_counter()
    with data.open("rb") as inp:
        proc = subprocess.run([sys.executable, "-m", "stream.cli", "run", "--config", str(cfg)], stdin=inp,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"tops run exited {proc.returncode}")
    return seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=200_000)
    p.add_argument("--readings", type=int, default=6)
    p.add_argument("--holdout", type=int, default=3)
    p.add_argument("--bound", type=float, default=5000.0)
    p.add_argument("--theta", type=float, default=None, help="a public threshold: no holdout")
    p.add_argument("--grid", choices=("exact", "compact"), default="exact", help="the holdout's candidate grid")
    p.add_argument("--values", type=int, default=100, help="readings are drawn from 0 .. VALUES - 1")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        _, base = run(tmp, 1, args.readings, args.holdout, args.bound, args.theta, args.grid, args.values)
        seconds, peak = run(tmp, args.streams, args.readings, args.holdout, args.bound, args.theta, args.grid,
                            args.values)
    n = args.streams * args.readings
    what = f"holdout {args.holdout}, {args.grid} grid" if args.theta is None else f"theta {args.theta:g}, no holdout"
    what += f", readings over {args.values:,} values"
    phase = "releasing" if args.theta is not None or args.readings > args.holdout else "all in holdout"
    print(f"{args.streams:,} streams x {args.readings} readings ({what}, {phase} at the end, B = {args.bound:g}, "
          f"no durable state): {seconds:.1f} s, {n / seconds:,.0f} readings/s; peak RSS {peak / 1024:,.0f} MiB "
          f"({(peak - base) * 1024 / args.streams / 1024:.1f} KiB per stream over the {base / 1024:.0f} MiB baseline)"
          f" on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())

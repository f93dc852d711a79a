"""Many streams in one process, through `tops run` on stdin.

    python bench/bench_streams.py [--streams 200000] [--readings 6] [--holdout 3] [--bound 5000] [--theta T]
                                  [--grid exact|compact] [--values 100] [--smoother-layers S] [--query-range R]
                                  [--repeat 1] [--tree DIR ...]

Writes ``streams x readings`` lines ``mN,value`` (one reading of every stream, then the next round: every stream is
in its holdout at the same time, the worst case for memory), runs `tops run` on them with no durable state and
stdout to /dev/null, and prints the wall time, readings per second, the CPU time of the daemon (user + system: on a
machine shared with other work the wall time varies with the load, the CPU time much less) and the peak resident
memory of the daemon (per stream after the process's baseline, measured with 1 stream). With ``--readings`` below
``--holdout`` every stream stays in its holdout (the holdout's memory); with ``--theta`` (a public threshold) there is
no holdout and every stream is releasing from its first reading (the releasing state's memory); ``--grid`` is the
template's ``holdout_grid``; ``--values`` the number of distinct readings (drawn uniformly); ``--smoother-layers``
and ``--query-range`` set the template's tree (leaves of ``16^s`` ticks: with the default the holdout chooses
``s = 2``, leaves of 256 ticks, and a stream draws noise only after 256 released readings).

``--tree`` runs the same input through the code of other checkouts too (each given directory's ``stream.cli``, in
turn, ``--repeat`` times each, alternating: paired figures on the same machine at the same time), and prints the
median of each. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_config(tmp: Path, streams: int, args: argparse.Namespace) -> Path:
    cfg = tmp / f"tops-{streams}.toml"
    tree = "".join(f"{name} = {value}\n" for name, value in (("smoother_layers", args.smoother_layers),
                                                              ("query_range", args.query_range)) if value is not None)
    cfg.write_text(
        "[input]\nsource = \"stdin\"\n[output]\nsinks = [\"stdout\"]\n"
        f"[streams]\nkey_file = \"{tmp / 'master.key'}\"\nmax_streams = {max(streams, 1)}\n"
        f"[streams.template]\nepsilon = 1.0\nbound = {args.bound}\nholdout_grid = \"{args.grid}\"\n"
        + (f"holdout = {args.holdout}\n" if args.theta is None else f"theta = {args.theta}\n")
        + tree
        + "[state]\ndata_dir = \"\"\n[metrics]\nport = 0\n"
    )
    return cfg


def write_input(tmp: Path, streams: int, readings: int, values: int) -> Path:
    data = tmp / f"in-{streams}.csv"
    rng = random.Random(0)
    with data.open("w") as f:
        for _ in range(readings):
            f.write("".join(f"m{i},{rng.randrange(values)}\n" for i in range(streams)))
    return data


def run(tree: Path, cfg: Path, data: Path) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak RSS in KiB) of one `tops run` of ``tree``'s code over the input (the child's
    own resource usage, from ``wait4``)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.perf_counter()
    with data.open("rb") as inp:
        proc = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config", str(cfg)], stdin=inp,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tree, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"tops run ({tree}) exited {proc.returncode}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=200_000)
    p.add_argument("--readings", type=int, default=6)
    p.add_argument("--holdout", type=int, default=3)
    p.add_argument("--bound", type=float, default=5000.0)
    p.add_argument("--theta", type=float, default=None, help="a public threshold: no holdout")
    p.add_argument("--grid", choices=("exact", "compact"), default="exact", help="the holdout's candidate grid")
    p.add_argument("--values", type=int, default=100, help="readings are drawn from 0 .. VALUES - 1")
    p.add_argument("--smoother-layers", type=int, default=None, help="the template's s (leaves of 16^s ticks)")
    p.add_argument("--query-range", type=int, default=None, help="the template's r (a new tree every r ticks)")
    p.add_argument("--repeat", type=int, default=1, help="runs of each tree (the median is printed)")
    p.add_argument("--tree", type=Path, action="append", default=None,
                   help="a checkout whose code runs the input (repeatable; default: this one)")
    args = p.parse_args()
    trees = [t.resolve() for t in args.tree] if args.tree else [ROOT]
    n = args.streams * args.readings
    what = f"holdout {args.holdout}, {args.grid} grid" if args.theta is None else f"theta {args.theta:g}, no holdout"
    what += f", readings over {args.values:,} values"
    if args.smoother_layers is not None:
        what += f", s = {args.smoother_layers}"
    if args.query_range is not None:
        what += f", r = {args.query_range}"
    phase = "releasing" if args.theta is not None or args.readings > args.holdout else "all in holdout"
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        one = write_config(tmp, 1, args)
        many = write_config(tmp, args.streams, args)
        one_data = write_input(tmp, 1, args.readings, args.values)
        data = write_input(tmp, args.streams, args.readings, args.values)
        results: dict[Path, list[tuple[float, float, int, int]]] = {t: [] for t in trees}
        for _ in range(args.repeat):
            for tree in trees:
                _, _, base = run(tree, one, one_data)
                seconds, cpu, peak = run(tree, many, data)
                results[tree].append((seconds, cpu, peak, base))
    for tree in trees:
        runs = results[tree]
        seconds = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        peak, base = statistics.median(r[2] for r in runs), statistics.median(r[3] for r in runs)
        label = "" if len(trees) == 1 else f"[{tree}] "
        print(f"{label}{args.streams:,} streams x {args.readings} readings ({what}, {phase} at the end, "
              f"B = {args.bound:g}, no durable state): {seconds:.1f} s, {n / seconds:,.0f} readings/s "
              f"(CPU {cpu:.1f} s, {n / cpu:,.0f} readings per CPU second; median of {len(runs)}: "
              f"{', '.join(f'{r[0]:.1f}' for r in runs)} s); peak RSS {peak / 1024:,.0f} MiB "
              f"({(peak - base) * 1024 / args.streams / 1024:.1f} KiB per stream over the {base / 1024:.0f} MiB "
              f"baseline) on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())

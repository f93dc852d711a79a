"""Range counting and count-of-counts: the figures the ranges page reports.

    python bench/bench_ranges.py [--releases 20000]

1. Each central mechanism's empirical variance over ``--releases`` keyed releases against its closed form
   (:func:`operators.ranges.central.range_variance`), for three ranges of a 256-bucket domain at eps = 1; the same
   for the local flat and hierarchical histograms (half as many runs, 16 buckets, eps = 1 and 3).
2. Mean variance by range length (d = 2,048, eps = 1, b = 4): flat, the tree without consistency (Friis's
   structure with the noise eps needs), the consistent tree, and what ``mechanism = "auto"`` picks.
3. Count-of-counts on a synthetic hierarchy (1 root, 5 states, 50 counties, 500 households each, Zipf sizes capped
   at 50), eps = 1: earth mover's distance per level of the per-node least squares (PAV on H_c) and of the consistent
   release (two passes with sorted matching), over 10 keys.
Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from operators.countofcounts import CountOfCounts, counts_of
from operators.noise import KeyedGenerator
from operators.ranges import FlatHistogram, RangeTree, mean_variance, range_variance
from operators.ranges.release import RangeConfig


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--releases", type=int, default=20_000)
    args = p.parse_args()
    counts = np.random.default_rng(0).integers(0, 50, 256)
    print(f"1. empirical / closed-form variance, d = 256, eps = 1, {args.releases:,} releases each")
    mechanisms = [("flat", FlatHistogram(256, 1.0)), ("tree b=4, raw", RangeTree(256, 4, 1.0, consistent=False)),
                  ("tree b=4, consistent", RangeTree(256, 4, 1.0)), ("tree b=2, consistent", RangeTree(256, 2, 1.0))]
    for name, mech in mechanisms:
        ratios = []
        for lo, hi in [(0, 0), (17, 80), (3, 250)]:
            errs = np.empty(args.releases)
            for k in range(args.releases):
                rel = mech.release(counts, KeyedGenerator(k.to_bytes(4, "little") * 8), address=k)
                got = FlatHistogram.answer(rel, lo, hi) if isinstance(mech, FlatHistogram) else rel.answer(lo, hi)
                errs[k] = got - counts[lo : hi + 1].sum()
            ratios.append(f"[{lo},{hi}] {errs.var() / range_variance(mech, lo, hi):.3f}")
        print(f"   {name:22s} " + "  ".join(ratios))
    from operators.ranges.local import LocalTree, flat_estimate, flat_perturb, flat_range_variance

    lcounts = np.random.default_rng(1).integers(0, 80, 16)
    values = np.repeat(np.arange(16), lcounts)
    runs = max(1, args.releases // 2)
    print(f"   local, 16 buckets, {values.size} devices, {runs:,} keyed runs: empirical / closed-form variance")
    for eps in (1.0, 3.0):
        tree = LocalTree(16, 4, eps)
        row = {"flat": [], "tree": []}
        for lo, hi in [(3, 9), (5, 5), (4, 11)]:
            flat, hier = np.empty(runs), np.empty(runs)
            for k in range(runs):
                gen = KeyedGenerator(k.to_bytes(4, "little") * 8)
                flat[k] = flat_estimate(flat_perturb(values, 16, eps, gen), values.size, 16, eps)[lo : hi + 1].sum()
                levels, reports = tree.perturb(values, gen)
                hier[k] = tree.answer(tree.estimate(levels, reports), lo, hi)
            row["flat"].append(f"[{lo},{hi}] {flat.var() / flat_range_variance(lcounts, lo, hi, eps):.3f}")
            row["tree"].append(f"[{lo},{hi}] {hier.var() / tree.range_variance(lcounts, lo, hi):.3f}")
        print(f"   eps {eps:g}, local flat ({tree.oracles[0]} over 16): " + "  ".join(row["flat"]))
        print(f"   eps {eps:g}, local tree ({'/'.join(tree.oracles)}): " + "  ".join(row["tree"]))
    d = 2048
    auto = RangeConfig.auto(1.0, 1.0, d).mechanism
    print(f"2. mean variance by range length, d = {d}, eps = 1, b = 4 (auto: {auto})")
    print("   length   flat        tree raw    tree consistent")
    for r in (1, 16, 128, 512, 2048):
        f, t, c = (mean_variance(m, [r], positions=32) for m in (FlatHistogram(d, 1.0),
                   RangeTree(d, 4, 1.0, consistent=False), RangeTree(d, 4, 1.0)))
        print(f"   {r:6d}   {f:10.1f}  {t:10.1f}  {c:10.1f}")
    rng = np.random.default_rng(0)
    children: dict[str, list[str]] = {"root": [f"s{i}" for i in range(5)]}
    groups: dict[str, list[int]] = {}
    for i in range(5):
        children[f"s{i}"] = [f"c{i}_{k}" for k in range(10)]
        for k in range(10):
            groups[f"c{i}_{k}"] = rng.zipf(2.0, 500).clip(1, 50).tolist()

    def sizes(n: str) -> list[int]:
        return groups[n] if n in groups else [s for c in children[n] for s in sizes(c)]

    truth = {n: counts_of(sizes(n), 50) for n in [*children, *groups]}
    cc = CountOfCounts(1.0, 50)
    err = {False: {0: [], 1: [], 2: []}, True: {0: [], 1: [], 2: []}}
    for k in range(10):
        for td in (False, True):
            out = cc.release(children, groups, KeyedGenerator(bytes([k]) * 32), top_down=td)
            for n, t in truth.items():
                lvl = 0 if n == "root" else 1 if n.startswith("s") else 2
                err[td][lvl].append(np.abs(np.cumsum(out[n]) - np.cumsum(t)).sum())
    print("3. count-of-counts, earth mover's distance per level (root / states / counties), eps = 1, 10 keys")
    for td, name in ((False, "per-node least squares"), (True, "consistent (matching)")):
        print(f"   {name:24s} " + " / ".join(f"{np.mean(err[td][lvl]):.1f}" for lvl in (0, 1, 2)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

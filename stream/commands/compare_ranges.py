"""``tops compare-ranges``: the range-counting experiments of Friis (thesis 2021) and the count-of-counts comparison of
Kuo et al. (PVLDB 2018).

Contract::

    tops compare-ranges [--experiment flat-vs-tree|length|local|coco|all] [--dataset dns] [--epsilons E,...]
                        [--structures 25] [--queries 100] [--seed S] [--out CSV] [--quick] [--domains N,...]

The thesis's domain was consecutive days with a visit count each; here it is the first N seconds of a shipped stream
(``dns``: queries per second), bucket i = second i, a user = one query. Per setting, ``--structures`` independently
keyed releases x ``--queries`` ranges of one length (start uniform, redrawn while the range would leave the domain:
section 10.2); the metric is the RMSE of the range answers (section 10), next to the closed-form RMSE where there is
one.

Experiments (sections of the thesis):

* ``flat-vs-tree`` (10.6.2 / 10.6.3): lengths {6, 35, 64} on N in {32, 512, 2048} and {128, 200, 288} on N in
  {256, 512, 2048}, b = 4, central flat against the trees;
* ``length`` (10.3): the central flat histogram against its closed form, the lengths of Table 1;
* ``local`` (10.5 / 10.6): local flat, local tree (user splitting) and the thesis's local flat;
* ``coco`` (Kuo et al., PVLDB 2018, Tables 3-4): per-node least squares ("naive" with PAV), the consistent top-down
release, and
  bottom-up aggregation of the leaves' estimates, earth mover's distance per level, on the synthetic hierarchy of
  ``bench/bench_ranges.py`` (1 root, 5 states, 50 counties of 500 households).

Methods: ``central-flat``, ``central-tree`` (independent noise of scale (h+1)/eps per node, no consistency),
``central-tree-consistent``, ``local-flat``, ``local-tree``; and, labelled, the thesis's code as written:
``thesis-co`` (noise of scale log2(h+1)/eps per node *summed along the root-to-node path*: NOT eps-DP at the stated
eps, up to 6.8x too little noise) and ``thesis-local-flat`` (its "OLH without hashing": randomized response that keeps
the true value in the uniform branch, which spends eps' = ln(1 + g e^eps / (g - 1)) > eps).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from operators.countofcounts import CountOfCounts, counts_of
from operators.noise import DiscreteLaplace, Domain, KeyedGenerator
from operators.ranges import FlatHistogram, RangeTree, range_variance
from operators.ranges.decomposition import decompose, tree_height
from operators.ranges.local import LocalTree, flat_estimate, flat_perturb, flat_range_variance
from stream.commands.datasets import DATASETS, load

__all__ = ["EXPERIMENTS", "add_arguments", "main", "run"]

EXPERIMENTS = ("flat-vs-tree", "length", "local", "coco")
EPSILONS = (2.0, 1.4, 1.2, 1.0, 0.8, 0.6, 0.4, 0.2)
TABLE1 = {32: (2, 4, 8, 12, 16, 20, 24), 128: (20, 40, 50, 60, 70, 80, 90), 512: (40, 60, 80, 100, 140, 200, 220),
          1024: (200, 300, 400, 500, 600, 800, 900), 2048: (600, 800, 1000, 1250, 1500, 1700, 1800)}
SHORT = ((32, 6), (512, 35), (2048, 64))
LONG = ((256, 128), (512, 200), (2048, 288))
FIELDS = ("experiment", "method", "dataset", "domain", "fanout", "epsilon", "length", "rmse", "closed_form_rmse",
          "runs")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experiment", default="all", choices=(*EXPERIMENTS, "all"))
    p.add_argument("--dataset", default="dns", help=f"a shipped stream ({', '.join(DATASETS)})")
    p.add_argument("--epsilons", default=None, help="comma-separated eps (default the thesis's eight)")
    p.add_argument("--structures", type=int, default=25, help="independently keyed releases per setting")
    p.add_argument("--queries", type=int, default=100, help="ranges per release")
    p.add_argument("--seed", type=int, default=0, help="keys and ranges derive from it")
    p.add_argument("--out", default=None, help="CSV file (default: none, the table only)")
    p.add_argument("--quick", action="store_true", help="a small grid (2 eps, 4 structures x 20 queries)")
    p.add_argument("--domains", default=None,
                   help="comma-separated domain sizes N: only the settings on these (default: every setting)")


def _key(seed: int, *parts: object) -> bytes:
    return hashlib.sha256(repr((seed, *parts)).encode()).digest()


def _ranges(n: int, length: int, count: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Section 10.2: a uniform start, redrawn while the range would leave the domain."""
    out = []
    while len(out) < count:
        lo = int(rng.integers(0, n))
        if lo + length - 1 < n:
            out.append((lo, lo + length - 1))
    return out


# -- the thesis's code, replicated to be measured (not mechanisms to use) -------------------------------------------
def thesis_co(counts: np.ndarray, fanout: int, epsilon: float, gen: KeyedGenerator) -> Callable[[int, int], float]:
    """Section 7.2 as its code does it: every node draws noise of scale log2(h + 1) / eps, and a node's noisy count
    is its true count plus the draws of every node on its root path (itself included). Not eps-DP at eps."""
    d = counts.size
    h = tree_height(d, fanout)
    true = [np.zeros(fanout**h, dtype=np.int64)]
    true[0][:d] = counts
    for _ in range(h):
        true.append(true[-1].reshape(-1, fanout).sum(axis=1))
    dl = DiscreteLaplace(epsilon, math.log2(h + 1))
    draws = [gen.discrete_laplace((int(Domain.RANGES) << 16) | 0x7000 | j, 0, 0, t.size, dl)
             for j, t in enumerate(true)]
    path = [draws[h].astype(np.float64)]  # root first: cumulative noise down the path
    for j in range(h - 1, -1, -1):
        path.insert(0, np.repeat(path[0], fanout) + draws[j])
    levels = [true[j] + path[j] for j in range(h + 1)]
    return lambda lo, hi: float(sum(levels[j][i] for j, i in decompose(lo, hi, fanout=fanout)))


def thesis_local_flat(counts: np.ndarray, epsilon: float, gen: KeyedGenerator) -> np.ndarray:
    """Section 8.2 as its code does it: report the value w.p. p = e^eps / (e^eps + g - 1), else a uniform value of
    all g (the true one included); estimate (T_i - (1 - p) N / g) / p."""
    g = counts.size
    values = np.repeat(np.arange(g), counts)
    u = gen.uniforms((int(Domain.RANGES) << 16) | 0x7100, 0, 0, 2 * values.size)
    p = math.exp(epsilon) / (math.exp(epsilon) + g - 1)
    reports = np.where(u[0::2] < p, values, np.minimum((u[1::2] * g).astype(np.int64), g - 1))
    t = np.bincount(reports, minlength=g).astype(np.float64)
    return (t - (1 - p) * values.size / g) / p


# -- the experiments ------------------------------------------------------------------------------------------------
def _central(method: str, counts: np.ndarray, eps: float, gen: KeyedGenerator) -> Callable[[int, int], float]:
    d = counts.size
    if method == "central-flat":
        noisy = FlatHistogram(d, eps).release(counts, gen, address=0)
        return lambda lo, hi: float(noisy[lo : hi + 1].sum())
    if method == "thesis-co":
        return thesis_co(counts, 4, eps, gen)
    tree = RangeTree(d, 4, eps, consistent=method == "central-tree-consistent").release(counts, gen, address=0)
    return tree.answer


def _closed(method: str, d: int, eps: float, lo: int, hi: int) -> float | None:
    if method == "central-flat":
        return range_variance(FlatHistogram(d, eps), lo, hi)
    if method in ("central-tree", "central-tree-consistent"):
        return range_variance(RangeTree(d, 4, eps, consistent=method == "central-tree-consistent"), lo, hi)
    return None


def _local(method: str, counts: np.ndarray, eps: float, gen: KeyedGenerator) -> Callable[[int, int], float]:
    d = counts.size
    values = np.repeat(np.arange(d), counts)
    if method == "local-flat":
        est = flat_estimate(flat_perturb(values, d, eps, gen), values.size, d, eps)
        return lambda lo, hi: float(est[lo : hi + 1].sum())
    if method == "thesis-local-flat":
        est = thesis_local_flat(counts, eps, gen)
        return lambda lo, hi: float(est[lo : hi + 1].sum())
    tree = LocalTree(d, 4, eps)
    levels, reports = tree.perturb(values, gen)
    est_t = tree.estimate(levels, reports)
    return lambda lo, hi: tree.answer(est_t, lo, hi)


def _local_closed(method: str, counts: np.ndarray, eps: float, lo: int, hi: int) -> float | None:
    if method == "local-flat":
        return flat_range_variance(counts, lo, hi, eps)
    if method == "local-tree":
        return LocalTree(counts.size, 4, eps).range_variance(counts, lo, hi)
    return None


def _measure(experiment: str, methods: list[str], settings: list[tuple[int, int]], data: np.ndarray,
             args: argparse.Namespace, epsilons: list[float]) -> list[dict[str, Any]]:
    rows = []
    local = experiment == "local"
    for n, length in settings:
        counts = data[:n].astype(np.int64)
        rng = np.random.default_rng(args.seed * 1_000_003 + n * 7 + length)
        queries = [_ranges(n, length, args.queries, rng) for _ in range(args.structures)]
        for eps in epsilons:
            for method in methods:
                sq, closed = [], []
                for k in range(args.structures):
                    gen = KeyedGenerator(_key(args.seed, experiment, method, n, length, eps, k))
                    answer = (_local if local else _central)(method, counts, eps, gen)
                    for lo, hi in queries[k]:
                        sq.append((answer(lo, hi) - float(counts[lo : hi + 1].sum())) ** 2)
                        c = (_local_closed(method, counts, eps, lo, hi) if local
                             else _closed(method, n, eps, lo, hi))
                        if c is not None:
                            closed.append(c)
                rows.append({"experiment": experiment, "method": method, "dataset": args.dataset, "domain": n,
                             "fanout": 4, "epsilon": eps, "length": length, "rmse": math.sqrt(float(np.mean(sq))),
                             "closed_form_rmse": math.sqrt(float(np.mean(closed))) if closed else "",
                             "runs": len(sq)})
    return rows


def _coco(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Kuo et al.: EMD per level of naive (per-node least squares), consistent top-down, and bottom-up."""
    rng = np.random.default_rng(args.seed)
    children: dict[str, list[str]] = {"root": [f"s{i}" for i in range(5)]}
    groups: dict[str, list[int]] = {}
    for i in range(5):
        children[f"s{i}"] = [f"c{i}_{k}" for k in range(10)]
        for k in range(10):
            groups[f"c{i}_{k}"] = rng.zipf(2.0, 500).clip(1, 50).tolist()

    def sizes(n: str) -> list[int]:
        return groups[n] if n in groups else [s for c in children[n] for s in sizes(c)]

    truth = {n: counts_of(sizes(n), 50) for n in [*children, *groups]}
    level = {n: 0 if n == "root" else 1 if n.startswith("s") else 2 for n in truth}
    cc = CountOfCounts(1.0, 50)
    err: dict[str, dict[int, list[float]]] = {m: {0: [], 1: [], 2: []} for m in ("naive", "consistent", "bottom-up")}
    for k in range(max(2, args.structures // 2)):
        gen = KeyedGenerator(_key(args.seed, "coco", k))
        naive = cc.release(children, groups, gen, top_down=False)
        cons = cc.release(children, groups, gen, top_down=True)
        up = {n: naive[n] for n in groups}
        for n in reversed([*children]):
            up[n] = np.sum([up[c] for c in children[n]], axis=0)
        for name, est in (("naive", naive), ("consistent", cons), ("bottom-up", up)):
            for n, t in truth.items():
                err[name][level[n]].append(float(np.abs(np.cumsum(est[n]) - np.cumsum(t)).sum()))
    return [{"experiment": "coco", "method": m, "dataset": "synthetic", "domain": lv, "fanout": 10, "epsilon": 1.0,
             "length": "", "rmse": float(np.mean(err[m][lv])), "closed_form_rmse": "", "runs": len(err[m][lv])}
            for m in err for lv in (0, 1, 2)]


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    epsilons = [float(x) for x in args.epsilons.split(",")] if args.epsilons else list(EPSILONS)
    if args.quick:
        epsilons = epsilons[:2] if args.epsilons else [1.0, 0.4]
    data = load(args.dataset)
    todo = EXPERIMENTS if args.experiment == "all" else (args.experiment,)
    central = ["central-flat", "central-tree", "central-tree-consistent", "thesis-co"]
    rows: list[dict[str, Any]] = []
    keep = {int(x) for x in args.domains.split(",")} if args.domains else None

    def on_domains(settings: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
        return [st for st in settings if keep is None or st[0] in keep]

    for ex in todo:
        if ex == "flat-vs-tree":
            settings = [*SHORT, *LONG][:2] if args.quick else [*SHORT, *LONG]
            rows += _measure(ex, central, on_domains(settings), data, args, epsilons)
        elif ex == "length":
            settings = [(32, r) for r in TABLE1[32]] if args.quick else [(n, r) for n, rs in TABLE1.items()
                                                                            for r in rs]
            rows += _measure(ex, ["central-flat"], on_domains(settings), data, args, epsilons)
        elif ex == "local":
            settings = [(32, 6), (512, 200)] if args.quick else [(32, 6), (512, 35), (512, 200), (2048, 64),
                                                                  (2048, 288)]
            local = ["local-flat", "local-tree", "thesis-local-flat"]
            rows += _measure(ex, local, on_domains(settings), data, args, epsilons)
        else:
            rows += _coco(args)
    return rows


def main(args: argparse.Namespace) -> int:
    if args.dataset not in DATASETS:
        print(f"tops compare-ranges: unknown dataset {args.dataset!r} (there are: {', '.join(DATASETS)})",
              file=sys.stderr)
        return 2
    try:
        eps = [float(x) for x in args.epsilons.split(",")] if args.epsilons else []
    except ValueError:
        eps = [-1.0]
    if any(not (0 < e <= 30) for e in eps):
        print("tops compare-ranges: --epsilons must be numbers in (0, 30]", file=sys.stderr)
        return 2
    try:
        domains = [int(x) for x in args.domains.split(",")] if args.domains else []
    except ValueError:
        domains = [0]
    if any(n < 1 for n in domains):
        print("tops compare-ranges: --domains must be positive integers", file=sys.stderr)
        return 2
    if args.structures < 1 or args.queries < 1:
        print("tops compare-ranges: --structures and --queries must be at least 1", file=sys.stderr)
        return 2
    if args.quick:
        args.structures, args.queries = min(args.structures, 4), min(args.queries, 20)
    rows = run(args)
    if args.out:
        with Path(args.out).open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)
    print(f"{'experiment':<13} {'method':<24} {'N':>5} {'eps':>4} {'len':>5} {'rmse':>10} {'closed form':>11}")
    for r in rows:
        cf = f"{r['closed_form_rmse']:.1f}" if r["closed_form_rmse"] != "" else "-"
        print(f"{r['experiment']:<13} {r['method']:<24} {r['domain']!s:>5} {r['epsilon']:>4g} {r['length']!s:>5} "
              f"{r['rmse']:>10.1f} {cf:>11}")
    return 0

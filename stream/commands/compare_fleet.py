"""``tops compare DATA --holdout-scope fleet``: a fleet holdout against each stream's own holdout, on many streams.

The streams are DATA's (a file of several named streams, as ``tops simulate --streams N --format csv`` writes, cut to
the shortest) or DATA cut into ``--streams`` consecutive pieces (a single stream, or a shipped data set). Each
repetition runs them twice with the same keys and readings:

* ``own``: each stream's own ToPS (its first ``m`` readings held out, then released);
* ``fleet``: the readings arrive round-robin (reading ``t`` of every stream, then reading ``t + 1``), the fleet holdout
  takes the first ``m`` of them (:class:`operators.fleet_holdout.FleetHoldout`), and every stream releases its other
  readings with the fleet's choice, as ``tops run`` and ``tops replay --holdout-scope fleet`` do.

It reports the mean squared error of random range sums (lengths uniform in ``[1, r]``) over the ticks both release
(``t >= m``), fleet over own; and over the ticks a stream's own holdout keeps (``t < m``, never released with the
per-stream holdout), the fleet's MSE over that of answering 0, what a consumer has without a release.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from operators import ConfigError, ToPS, ToPSConfig
from operators.fleet_holdout import FleetHoldout
from stream.commands.failure import refuse
from stream.commands.inputs import InputError, read_stream, read_streams

__all__ = ["FleetComparison", "compare_fleet", "fleet_rows", "main_fleet"]


@dataclass(frozen=True)
class FleetComparison:
    """One comparison's figures (means over the repetitions)."""

    fleet_thetas: list[float]
    own_thetas: list[float]
    ratio: float  # MSE over the ticks both release, fleet / own
    young: float | None  # MSE over the ticks a stream's own holdout keeps, fleet / answering 0


def fleet_rows(data: str, streams: int) -> np.ndarray:
    """The streams of DATA as rows of one length: its named streams, or DATA cut into ``streams`` pieces."""
    p = Path(data)
    named: tuple[list[str], np.ndarray] | None = None
    if p.is_file() and p.suffix.lower() != ".npy":
        try:
            named = read_streams(p)
        except InputError:
            named = None  # not a file of named streams: one stream
    if named is not None and len(set(named[0])) > 1:
        names, values = named
        _, which = np.unique(np.asarray(names), return_inverse=True)  # each line's stream, in name order
        order = np.argsort(which, kind="stable")  # the lines of each stream together, in their order
        ends = np.cumsum(np.bincount(which))
        rows = np.split(values[order], ends[:-1])
        length = min(len(r) for r in rows)
        return np.stack([r[:length] for r in rows])
    x = read_stream(data)
    each = x.size // max(1, streams)
    if streams < 2 or each < 2:
        msg = f"--streams must cut the stream ({x.size} ticks) into at least 2 pieces of at least 2 ticks"
        raise InputError(msg)
    return x[: each * streams].reshape(streams, each)


def _key(label: str, rep: int, k: int) -> bytes:
    return hashlib.sha256(f"tops-compare-fleet/{label}/{rep}/{k}".encode()).digest()


def _own(rows: np.ndarray, cfg: ToPSConfig, rep: int) -> tuple[np.ndarray, list[float]]:
    own = cfg.replace(holdout_scope="stream")
    out = np.empty_like(rows)
    thetas = []
    for k, x in enumerate(rows):
        op = ToPS(own, _key("stream", rep, k))
        out[k] = op.process(x)
        thetas.append(float(op.theta))
    return out, thetas


def _fleet(rows: np.ndarray, cfg: ToPSConfig, rep: int) -> tuple[np.ndarray, float]:
    n, length = rows.shape
    holdout = FleetHoldout(cfg, _key("fleet", rep, -1))
    holdout.take(rows.T.reshape(-1))  # round-robin arrival: it takes the first m
    assert holdout.choice is not None
    taken = np.zeros(n * length, dtype=bool)
    taken[: holdout.taken] = True
    held = taken.reshape(length, n).sum(axis=0)  # each stream's readings the fleet took (its first ones)
    out = np.full_like(rows, np.nan)
    for k, x in enumerate(rows):
        h = int(held[k])
        out[k, h:] = holdout.member(_key("stream", rep, k), h).process(x[h:])
    return out, cfg.lower + holdout.choice.theta_units * cfg.resolution


def range_mse(releases: np.ndarray, rows: np.ndarray, lo: int, hi: int, r: int, queries: int,
              rng: np.random.Generator) -> np.ndarray:
    """Each stream's MSE of ``queries`` random range sums inside ticks ``[lo, hi)``, lengths uniform in
    ``[1, min(r, hi - lo)]`` (a tick without a release counts 0)."""
    rel, truth = np.nan_to_num(releases[:, lo:hi]), rows[:, lo:hi]
    zero = np.zeros((rel.shape[0], 1))
    cr, ct = np.concatenate([zero, np.cumsum(rel, axis=1)], 1), np.concatenate([zero, np.cumsum(truth, axis=1)], 1)
    lengths = rng.integers(1, min(r, hi - lo) + 1, size=queries)
    starts = (rng.random(queries) * (hi - lo - lengths + 1)).astype(np.int64)
    err = (cr[:, starts + lengths] - cr[:, starts]) - (ct[:, starts + lengths] - ct[:, starts])
    return (err**2).mean(axis=1)


def compare_fleet(rows: np.ndarray, cfg: ToPSConfig, *, repetitions: int, queries: int, seed: int = 0
                  ) -> FleetComparison:
    """The comparison of the module text on ``rows`` (streams x ticks) with the template ``cfg``."""
    m, length = cfg.holdout, rows.shape[1]
    if m >= length:
        msg = f"--holdout ({m}) must leave released ticks: each stream has {length}"
        raise InputError(msg)
    ratios, young, fleet_thetas, own_thetas = [], [], [], []
    for rep in range(repetitions):
        own, thetas = _own(rows, cfg, rep)
        shared, theta = _fleet(rows, cfg, rep)
        late = [range_mse(x, rows, m, length, cfg.query_range, queries, np.random.default_rng([seed, rep, 1]))
                for x in (shared, own)]
        ratios.append(late[0].mean() / late[1].mean())
        first = int(np.isnan(shared).sum(axis=1).max())  # from there every stream releases with the fleet
        if first < m:
            early = [range_mse(x, rows, first, m, cfg.query_range, queries, np.random.default_rng([seed, rep, 2]))
                     for x in (shared, np.full_like(rows, np.nan))]
            young.append(early[0].mean() / early[1].mean())
        fleet_thetas.append(theta)
        own_thetas += thetas
    return FleetComparison(fleet_thetas, own_thetas, float(np.mean(ratios)),
                           float(np.mean(young)) if young else None)


def table_line(name: str, cfg: ToPSConfig, ticks: int, c: FleetComparison) -> str:
    lo, med, hi = np.percentile(c.own_thetas, [10, 50, 90])
    young = "-" if c.young is None else f"{c.young:.3f}"
    thetas = "/".join(f"{t:g}" for t in c.fleet_thetas)
    return (f"{name:<16}{cfg.epsilon:>6g}{cfg.holdout:>7}{ticks:>7}{thetas:>20}{f'{med:g} ({lo:g}-{hi:g})':>24}"
            f"{c.ratio:>20.3f}{young:>22}")


TABLE_HEAD = (f"{'data':<16}{'eps':>6}{'m':>7}{'ticks':>7}{'fleet theta':>20}{'own theta (10-90%)':>24}"
              f"{'MSE t>=m fleet/own':>20}{'MSE t<m fleet/zero':>22}")


def main_fleet(args: argparse.Namespace) -> int:
    from stream.commands.scoring import default_bound

    try:
        default_bound(args)
        for name, v in (("--queries", args.queries), ("--repetitions", args.repetitions)):
            if v < 1:
                msg = f"{name} must be at least 1"
                raise InputError(msg)
        rows = fleet_rows(args.data, args.streams)
        if args.holdout >= rows.shape[1]:
            msg = f"--holdout ({args.holdout}) must leave released ticks: each stream has {rows.shape[1]}"
            raise InputError(msg)
        thr = args.threshold_eps[0] if args.threshold_eps else None
        configs = [ToPSConfig(epsilon=eps, bound=args.bound, holdout=args.holdout, query_range=args.query_range,
                              threshold_epsilon=thr, holdout_scope="fleet") for eps in args.eps or [1.0]]
        print(f"{rows.shape[0]} streams x {rows.shape[1]} ticks, {args.repetitions} repetitions, "
              f"{args.queries} ranges each", file=sys.stderr)
        print(TABLE_HEAD)
        for cfg in configs:
            c = compare_fleet(rows, cfg, repetitions=args.repetitions, queries=args.queries, seed=args.seed)
            print(table_line(Path(args.data).stem[:15], cfg, rows.shape[1], c), flush=True)
    except (ConfigError, InputError) as exc:
        return refuse("compare", exc)
    return 0

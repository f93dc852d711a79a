"""``tops compare DATA --mode local``: ToPL against the authors' reference, always-zero and the true density's theta.

The protocol: the stream extended to m + r ticks, both phases at the same eps (unless
``--threshold-eps``), every repetition its own key, the same random ranges of uniform length in [1, r] over the
released ticks for every method (Eq. 9), and the MSE by range length class as in the central comparison. Rows:

* ``topl``: tops's local mode (:class:`operators.topl.ToPL`, what the daemon's local mode runs);
* ``reference``: the authors' reference ToPL (:mod:`operators.local.reference`) with its Piecewise bug fixed;
* ``true-density``: ToPL at the theta Eq. 8 picks on the holdout's exact density (NOT private: a yardstick for the
  threshold step alone, the stream phase is ToPL's);
* ``zero``: always 0.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from operators.local.reference import ReferenceToPL
from operators.local.threshold import threshold_candidates, threshold_objective
from operators.topl import ToPL, ToPLConfig
from stream.commands.progress import progress
from stream.commands.scoring import Result, class_queries, repetition_key

__all__ = ["LOCAL_DEFAULT_EPS", "LOCAL_LABELS", "LOCAL_METHODS", "run_compare_local", "true_density_theta"]

LOCAL_DEFAULT_EPS = (0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 2.0, 4.0)
LOCAL_METHODS = ("topl", "reference", "true-density", "zero")
LOCAL_LABELS = {
    "topl": "tops local (ToPL)",
    "reference": "reference ToPL, PM fixed",
    "true-density": "theta of true density (NOT private)",
    "zero": "always zero",
}


def true_density_theta(holdout: np.ndarray, bound: float, epsilon: float, query_range: int) -> float:
    """Eq. 8's theta on the exact density of the holdout, in unit-wide buckets of [0, B] (at most 65,536)."""
    k = max(2, min(1 << 16, math.ceil(bound)))
    idx = np.minimum((np.clip(holdout, 0.0, bound) / bound * k).astype(np.int64), k - 1)
    density = np.bincount(idx, minlength=k).astype(np.float64)
    scores = threshold_objective(density, bound, epsilon, query_range)
    return float(threshold_candidates(bound, k)[int(np.argmin(scores))])


class _Zero:
    def __init__(self, holdout: int) -> None:
        self.holdout = holdout
        self.theta = None

    def process(self, values: np.ndarray) -> np.ndarray:
        out = np.zeros(values.size)
        out[: self.holdout] = np.nan
        return out


class _FixedTheta:
    """ToPL at a given theta, with the holdout ticks held out (NaN) so that every row answers the same ranges."""

    def __init__(self, config: ToPLConfig, key: bytes, theta: float) -> None:
        self.holdout = config.holdout
        self.theta = theta
        self._op = ToPL(config.replace(theta=theta), key)

    def process(self, values: np.ndarray) -> np.ndarray:
        out = np.full(values.size, np.nan)
        out[self.holdout :] = self._op.process(values[self.holdout :])
        return out


def _operator(name: str, cfg: ToPLConfig, key: bytes, values: np.ndarray) -> Any:
    if name == "topl":
        return ToPL(cfg, key)
    if name == "reference":
        return ReferenceToPL(epsilon=cfg.epsilon, bound=cfg.bound, holdout=cfg.holdout, key=key,
                             threshold_epsilon=cfg.threshold_epsilon, released=cfg.query_range)
    if name == "true-density":
        theta = true_density_theta(values[: cfg.holdout], cfg.bound, cfg.epsilon, cfg.query_range)
        return _FixedTheta(cfg, key, theta)
    if name == "zero":
        return _Zero(cfg.holdout)
    msg = f"unknown local method {name!r}; known: {', '.join(LOCAL_METHODS)}"
    raise ValueError(msg)


def run_compare_local(
    values: np.ndarray,
    *,
    methods: list[str],
    grid: list[tuple[float, float]],
    base: ToPLConfig,
    repetitions: int,
    queries: int,
    seed: int,
    show_progress: bool | None = None,
) -> list[Result]:
    """Every local method at every (eps, threshold eps) of ``grid``, ``repetitions`` keys each."""
    values = np.asarray(values, dtype=np.float64)
    hold = base.holdout
    n_eval = values.size - hold
    if n_eval < 1:
        msg = f"the stream ({values.size} ticks) is not longer than the holdout ({hold})"
        raise ValueError(msg)
    ct = np.concatenate([[0.0], np.cumsum(values[hold:])])
    results = {(m, e, t): Result(m, e, t, [], [], []) for m in methods for e, t in grid}
    jobs = [(rep, e, t) for rep in range(repetitions) for e, t in grid]
    for rep, eps, thr in progress(jobs, len(jobs), "comparing", enabled=show_progress):
        rng = np.random.default_rng([seed, rep])
        lengths = rng.integers(1, min(base.query_range, n_eval) + 1, size=queries)
        starts = (rng.random(queries) * (n_eval - lengths + 1)).astype(np.int64)
        exact = ct[starts + lengths] - ct[starts]
        by_class = class_queries(rng, n_eval, base.query_range, queries)
        cfg = base.replace(epsilon=eps, threshold_epsilon=thr)
        key = repetition_key(seed, rep)
        for name in methods:
            op = _operator(name, cfg, key, values)
            releases = op.process(values)
            cum = np.concatenate([[0.0], np.cumsum(releases[hold:])])
            err = cum[starts + lengths] - cum[starts] - exact
            res = results[(name, eps, thr)]
            res.mse.append(float(np.mean(err**2)))
            res.mae.append(float(np.mean(np.abs(err))))
            for cname, (cs, cl) in by_class.items():
                cerr = cum[cs + cl] - cum[cs] - (ct[cs + cl] - ct[cs])
                res.mse_class.setdefault(cname, []).append(float(np.mean(cerr**2)))
            theta = getattr(op, "theta", None)
            res.thetas.append(float("nan") if theta is None else float(theta))
    return list(results.values())


def main_local(args: Any) -> int:
    """``tops compare DATA --mode local`` (the arguments of ``tops compare``)."""
    import sys
    import time
    from pathlib import Path

    from operators.config import ConfigError
    from stream.commands.inputs import InputError, read_stream
    from stream.commands.scoring import LENGTH_CLASSES, default_bound, eps_grid, extend, per_class, plot, write_csv

    try:
        default_bound(args)
        methods = [m.strip() for m in args.methods.split(",")] if args.methods else list(LOCAL_METHODS)
        unknown = [m for m in methods if m not in LOCAL_METHODS]
        if unknown:
            msg = f"unknown local method {unknown[0]!r}; known: {', '.join(LOCAL_METHODS)}"
            raise InputError(msg)
        if args.figure or args.theta_percentile is not None:
            msg = "--figure and --theta-percentile are for the central mode"
            raise InputError(msg)
        for name, v in (("--queries", args.queries), ("--repetitions", args.repetitions)):
            if v < 1:
                msg = f"{name} must be at least 1"
                raise InputError(msg)
        grid, x_threshold = eps_grid(tuple(args.eps or LOCAL_DEFAULT_EPS), args.threshold_eps)
        values = read_stream(args.data)
        if args.ticks:
            values = extend(values, args.ticks)
        base = ToPLConfig(epsilon=grid[0][0], bound=args.bound, holdout=args.holdout, query_range=args.query_range)
        t0 = time.perf_counter()
        results = run_compare_local(values, methods=methods, grid=grid, base=base, repetitions=args.repetitions,
                                    queries=args.queries, seed=args.seed)
        out_dir = Path(args.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = args.name or f"{Path(args.data).stem}_local"
        extra = {"data": Path(args.data).name, "ticks": int(values.size), "mode": "local", "range": args.query_range,
                 "holdout": args.holdout, "bound": args.bound, "queries": args.queries, "seed": args.seed}
        write_csv(out_dir / f"{stem}.csv", results, extra, LOCAL_LABELS)
        if not args.no_plot:
            plot(out_dir / f"{stem}.png", results, x_threshold=x_threshold,
                 title=f"{Path(args.data).stem}: local mode, range-query MSE", labels=LOCAL_LABELS)
    except (ConfigError, InputError, ValueError) as exc:
        print(f"tops compare: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"tops compare: error: {exc.strerror or exc}: {exc.filename or ''}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - t0
    print(f"local mode: {len(methods)} methods x {len(grid)} points x {args.repetitions} repetitions, {elapsed:.1f} s")
    header = "epsilon" if not x_threshold else "thr_eps"
    classes = "".join(f"{'MSE ' + name:>16}" for name, _, _ in LENGTH_CLASSES)
    print(f"{'method':<38}{header:>9}{'theta':>9}{'MSE':>13}{'vs reference':>14}{classes}")
    rows = [r.row(LOCAL_LABELS) for r in results]
    ref = {(r["epsilon"], r["threshold_epsilon"]): r["mse_mean"] for r in rows if r["method"] == "reference"}
    for row in rows:
        x = row["threshold_epsilon"] if x_threshold else row["epsilon"]
        vs = ref.get((row["epsilon"], row["threshold_epsilon"]))
        ratio = f"{row['mse_mean'] / vs:>14.3g}" if vs else f"{'':>14}"
        print(f"{row['label'][:37]:<38}{x:>9g}{row['theta_median']:>9g}{row['mse_mean']:>13.4g}{ratio}{per_class(row)}")
    print(f"wrote {out_dir / (stem + '.csv')}" + ("" if args.no_plot else f" and {out_dir / (stem + '.png')}"))
    return 0

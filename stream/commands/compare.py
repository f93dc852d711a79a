"""``tops compare DATA``: several methods over a grid of eps on real data, the paper's protocol (Section 5).

For every eps (or threshold eps) and repetition, each method runs over the stream with a key of that repetition
(every repetition a different key), and answers the same ``--queries`` random range queries of length 1..min(r, n)
over the released ticks (Eq. 9: MSE; and MAE). Writes ``NAME.csv`` (mean and standard deviation over the
repetitions) and ``NAME.png`` (log-scale MSE against eps, like Figures 3, 5 and 7).

Presets (``--figure``; explicit options override them):

* ``3`` (Section 5.2): pak, nm-e, s-pak, tops; threshold eps = stream eps.
* ``5`` (Section 5.3): h2, h16, h16c, tops, zero at a fixed theta = the 95th percentile of the first m ticks
  (public for the experiment), on the ticks after them, against the truncated truth.
* ``7`` (Section 5.4): tops (NM-E), s-pak, s-p, zero; stream eps fixed at 0.05, threshold eps varies. The paper
  builds the hierarchy on the holdout values themselves; here it runs on the ticks after the holdout, as deployed.

Keys are derived from ``--seed`` and the repetition (``sha256``), so a run is reproducible; query positions come from
numpy's generator seeded the same way (they are not privacy noise).

Two reference rows: ``tops-paper`` is ToPS with the paper's selection (Eq. 6 for theta, Eq. 7 for s), and
``hindsight`` is ToPS at the best *fixed* (theta, s) found by a grid search on the truth (:mod:`operators.hindsight`):
NOT private, a yardstick only. Besides the MSE of ranges of uniform length in [1, r] (the paper's Eq. 9), every row
reports the MSE by range length class (1-60, 61-1,440, 1,441-43,200 ticks and longer: a minute, a day and a month of
minutes), with ``--queries`` ranges of uniform length inside each class.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from operators.baselines import METHODS
from operators.config import SMOOTHERS, ConfigError, ToPSConfig
from operators.hindsight import DeterministicErrors
from operators.tops import ToPS
from stream.commands.failure import refuse
from stream.commands.inputs import InputError, read_stream
from stream.commands.progress import progress
from stream.commands.scoring import (
    HINDSIGHT,
    LENGTH_CLASSES,
    Result,
    answers,
    class_queries,
    default_bound,
    eps_grid,
    extend,
    per_class,
    plot,
    repetition_key,
    write_csv,
)

__all__ = ["FIGURES", "add_arguments", "main", "run_compare"]

DEFAULT_EPS = (0.01, 0.02, 0.03, 0.05, 0.07, 0.1)

FIGURES: dict[str, dict[str, Any]] = {
    "3": {
        "methods": ("pak", "nm-e", "s-pak", "tops", "tops-paper"),
        "title": "end to end (Figure 3)",
    },
    "5": {
        "methods": ("h2", "h16", "h16c", "tops", "zero"),
        "theta_percentile": 95.0,
        "labels": {"tops": "Ĥ16c (ToPS)"},
        "title": "stream phase at theta = p95 (Figure 5)",
    },
    "7": {
        "methods": ("tops", "s-pak", "s-p", "zero"),
        "eps": (0.05,),
        "threshold_eps": DEFAULT_EPS,
        "labels": {"tops": "NM-E (ToPS)"},
        "title": "threshold phase, stream eps = 0.05 (Figure 7)",
    },
}
_PAK_LIKE = ("pak", "s-pak", "s-p")


def _floats(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        msg = f"expected comma-separated numbers (got {text!r})"
        raise argparse.ArgumentTypeError(msg) from None
    if not vals or any(not math.isfinite(v) or v <= 0 for v in vals):
        msg = f"expected positive numbers (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", help="the stream: .npy (1-D), .csv, .jsonl, or a shipped data set: dns, retail, star")
    p.add_argument("--figure", choices=sorted(FIGURES), help="a preset reproducing Figure 3, 5 or 7")
    p.add_argument("--methods", help=f"comma-separated, of: {', '.join(METHODS)}")
    p.add_argument("--eps", type=_floats, help="stream-phase eps grid (default 0.01,0.02,0.03,0.05,0.07,0.1)")
    p.add_argument(
        "--threshold-eps", type=_floats, help="threshold-phase eps: one value, or a grid when --eps is one value"
    )
    p.add_argument("--repetitions", type=int, default=5, help="runs per point, each with its own key (default 5)")
    p.add_argument("--queries", type=int, default=200, help="random range queries per run (default 200)")
    p.add_argument("--range", dest="query_range", type=int, default=1 << 20, help="r (default 2^20)")
    p.add_argument("--holdout", type=int, default=65536, help="m (default 65536)")
    p.add_argument(
        "--bound", type=float, help="public upper bound B (default for a shipped data set: the reference code's B)"
    )
    p.add_argument("--theta-percentile", type=float, help="fixed theta = this percentile of the first m ticks")
    p.add_argument("--ticks", type=int, help="extend the data to this many ticks (appending it reversed)")
    p.add_argument("--seed", type=int, default=0, help="seed of the keys and query positions (default 0)")
    p.add_argument("--out-dir", default=".", help="where NAME.csv and NAME.png go (default .)")
    p.add_argument("--name", help="file name stem (default DATA-stem_figN or DATA-stem_compare)")
    p.add_argument("--no-plot", action="store_true", help="write the CSV only")
    p.add_argument("--holdout-scope", choices=("stream", "fleet"), default="stream",
                   help="fleet: each stream's own holdout against one fleet holdout, on DATA's streams or DATA cut "
                   "into --streams pieces (central ToPS; --eps default 1)")
    p.add_argument("--streams", type=int, default=1000,
                   help="with --holdout-scope fleet: the pieces a single stream is cut into (default 1000)")
    p.add_argument("--mode", choices=("central", "local"), default="central",
                   help="central (default: ToPS and the paper's baselines) or local (ToPL against the authors' "
                        "reference, always zero and the true density's theta; eps default 0.2,...,4)")


def run_compare(
    values: np.ndarray,
    *,
    methods: list[str],
    grid: list[tuple[float, float]],
    base: ToPSConfig,
    repetitions: int,
    queries: int,
    seed: int,
    truth: np.ndarray | None = None,
    show_progress: bool | None = None,
) -> list[Result]:
    """Every method at every ``(eps, threshold_eps)`` of ``grid``, ``repetitions`` times; ``truth`` defaults to the
    values (Figure 5 passes the truncated values)."""
    values = np.asarray(values, dtype=np.float64)
    truth = values if truth is None else np.asarray(truth, dtype=np.float64)
    hold = base.holdout_ticks
    n_eval = values.size - hold
    if n_eval < 1:
        msg = f"the stream ({values.size} ticks) is not longer than the holdout ({hold})"
        raise InputError(msg)
    ct = np.concatenate([[0.0], np.cumsum(truth[hold:])])
    results = {(m, e, t): Result(m, e, t, [], [], []) for m in methods for e, t in grid}
    jobs = [(rep, e, t) for rep in range(repetitions) for e, t in grid]
    table = None
    if HINDSIGHT in methods:
        if hold < 1 or not SMOOTHERS[base.smoother].in_hindsight or base.resolution != 1.0 or base.lower != 0.0:
            modelled = " or ".join(name for name, spec in SMOOTHERS.items() if spec.in_hindsight)
            msg = f"the hindsight row needs a holdout, the {modelled} smoother, resolution 1 and lower 0"
            raise InputError(msg)
        table = DeterministicErrors(
            values[:hold], np.minimum(values[hold:], base.bound), query_range=base.query_range,
            fanout=base.fanout, seed=seed, truth=truth[hold:],
        )
    for rep, eps, thr in progress(jobs, len(jobs), "comparing", enabled=show_progress):
        rng = np.random.default_rng([seed, rep])
        lengths = rng.integers(1, min(base.query_range, n_eval) + 1, size=queries)
        starts = (rng.random(queries) * (n_eval - lengths + 1)).astype(np.int64)
        exact = ct[starts + lengths] - ct[starts]
        by_class = class_queries(rng, n_eval, base.query_range, queries)
        cfg = base.replace(epsilon=eps, threshold_epsilon=thr)
        key = repetition_key(seed, rep)
        for name in methods:
            if name == HINDSIGHT:
                theta, s, start = table.best(eps)
                op = ToPS(cfg.replace(theta=theta, smoother_layers=s), key, start=start)
                releases = np.concatenate([np.full(hold, np.nan), op.process(values[hold:])])
            else:
                kwargs = {"stream_length": values.size} if name in _PAK_LIKE else {}
                op = METHODS[name](cfg, key, **kwargs)
                releases = op.process(values)
            err = answers(op, releases, hold, starts, lengths) - exact
            res = results[(name, eps, thr)]
            res.mse.append(float(np.mean(err**2)))
            res.mae.append(float(np.mean(np.abs(err))))
            for cname, (cs, cl) in by_class.items():
                cerr = answers(op, releases, hold, cs, cl) - (ct[cs + cl] - ct[cs])
                res.mse_class.setdefault(cname, []).append(float(np.mean(cerr**2)))
            theta = getattr(op, "theta", None)
            res.thetas.append(float("nan") if theta is None else float(theta))
            layers = getattr(op, "smoother_layers", None)
            if layers is not None:
                res.layers.append(float(layers))
    return list(results.values())


def main(args: argparse.Namespace) -> int:
    if getattr(args, "holdout_scope", "stream") == "fleet":
        from stream.commands.compare_fleet import main_fleet

        return main_fleet(args)
    if getattr(args, "mode", "central") == "local":
        from stream.commands.compare_local import main_local

        return main_local(args)
    preset = FIGURES.get(args.figure or "", {})
    try:
        default_bound(args)
        methods = (
            [m.strip() for m in args.methods.split(",")]
            if args.methods
            else list(preset.get("methods", ("tops", "tops-paper", HINDSIGHT, "pak", "h2", "h16", "h16c", "zero")))
        )
        unknown = [m for m in methods if m not in METHODS and m != HINDSIGHT]
        if unknown:
            msg = f"unknown method {unknown[0]!r}; known: {', '.join([*METHODS, HINDSIGHT])}"
            raise InputError(msg)
        for name, v in (("--queries", args.queries), ("--repetitions", args.repetitions)):
            if v < 1:
                msg = f"{name} must be at least 1"
                raise InputError(msg)
        eps = args.eps or preset.get("eps", DEFAULT_EPS)
        thr = args.threshold_eps or preset.get("threshold_eps")
        if args.threshold_eps is None and args.eps is not None and "threshold_eps" in preset and len(eps) > 1:
            thr = None  # an explicit --eps grid on the Figure 7 preset means: vary the stream eps
        grid, x_threshold = eps_grid(tuple(eps), thr)
        values = read_stream(args.data)
        if args.ticks:
            values = extend(values, args.ticks)
        percentile = args.theta_percentile if args.theta_percentile is not None else preset.get("theta_percentile")
        truth = None
        theta = None
        if percentile is not None:
            if not 0 < percentile <= 100 or args.holdout < 1 or args.holdout >= values.size:
                msg = "--theta-percentile needs 0 < P <= 100 and 1 <= --holdout < the stream length"
                raise InputError(msg)
            theta = max(float(np.percentile(values[: args.holdout], percentile)), 1.0)
            theta = min(theta, args.bound)
            values = values[args.holdout :]
            truth = np.minimum(np.minimum(values, args.bound), theta)
        base = ToPSConfig(
            epsilon=grid[0][0], bound=args.bound, holdout=args.holdout, query_range=args.query_range, theta=theta
        )
        t0 = time.perf_counter()
        results = run_compare(
            values,
            methods=methods,
            grid=grid,
            base=base,
            repetitions=args.repetitions,
            queries=args.queries,
            seed=args.seed,
            truth=truth,
        )
        out_dir = Path(args.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = args.name or f"{Path(args.data).stem}_{'fig' + args.figure if args.figure else 'compare'}"
        extra = {
            "data": Path(args.data).name,
            "ticks": int(values.size),
            "figure": args.figure or "",
            "range": args.query_range,
            "holdout": 0 if theta is not None else args.holdout,
            "bound": args.bound,
            "fixed_theta": "" if theta is None else theta,
            "queries": args.queries,
            "seed": args.seed,
        }
        labels = preset.get("labels")
        write_csv(out_dir / f"{stem}.csv", results, extra, labels)
        if not args.no_plot:
            title = f"{Path(args.data).stem}: {preset.get('title', 'range-query MSE')}"
            plot(out_dir / f"{stem}.png", results, x_threshold=x_threshold, title=title, labels=labels)
    except (ConfigError, InputError) as exc:
        return refuse("compare", exc)
    except OSError as exc:
        return refuse("compare", f"{exc.strerror or exc}: {exc.filename or ''}")
    elapsed = time.perf_counter() - t0
    print(f"{len(methods)} methods x {len(grid)} points x {args.repetitions} repetitions, {elapsed:.1f} s")
    header = "epsilon" if not x_threshold else "thr_eps"
    classes = "".join(f"{'MSE ' + name:>16}" for name, _, _ in LENGTH_CLASSES)
    print(f"{'method':<24}{header:>9}{'theta':>9}{'s':>4}{'MSE':>13}{'MAE':>12}{classes}")
    for r in results:
        row = r.row(labels)
        x = row["threshold_epsilon"] if x_threshold else row["epsilon"]
        print(f"{row['label'][:23]:<24}{x:>9g}{row['theta_median']:>9g}{row['s_median']:>4g}{row['mse_mean']:>13.4g}"
              f"{row['mae_mean']:>12.4g}{per_class(row)}")
    print(f"wrote {out_dir / (stem + '.csv')}" + ("" if args.no_plot else f" and {out_dir / (stem + '.png')}"))
    return 0

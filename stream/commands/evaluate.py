"""``tops evaluate TRUTH RELEASES``: the paper's range-query MSE (Eq. 9) and MAE, as a table; optional plot.

RELEASES is the output of ``tops replay`` (.npy, NaN for holdout ticks) or the daemon's JSONL (``tops run`` on stdout,
or saved MQTT payloads; one release per ``(stream, tick)``, ``--stream`` picks one of several); queries run over the
released ticks only.
``--plot FILE.png`` draws the true and the released moving average like Figure 2 (needs matplotlib:
``pip install 'tops[plot]'``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from operators.evaluation import interval_means, range_query_errors, summarize
from stream.commands.failure import refuse
from stream.commands.inputs import InputError, load_npy, read_stream
from stream.commands.progress import progress

__all__ = ["add_arguments", "evaluate", "main"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("truth", help="the true stream (.npy, .csv, .jsonl)")
    p.add_argument(
        "releases", help="the releases: .npy from tops replay (NaN = holdout) or the daemon's JSONL output"
    )
    p.add_argument("--stream", help="the stream to evaluate when TRUTH or RELEASES hold several")
    p.add_argument(
        "--range", dest="query_range", type=int, default=1 << 20, help="longest query (default 2^20)"
    )
    p.add_argument(
        "--queries", type=int, default=200, help="random range queries per repetition (default 200)"
    )
    p.add_argument("--repetitions", type=int, default=10, help="repetitions of the query set (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of the query positions (not of any noise)")
    p.add_argument("--plot", help="write a PNG of true vs released moving average (Figure 2 style)")
    p.add_argument(
        "--intervals", type=int, default=120, help="points of the plotted moving average (default 120)"
    )


def evaluate(
    truth: np.ndarray, releases: np.ndarray, *, query_range: int, queries: int, repetitions: int, seed: int
) -> dict[str, tuple[float, float]]:
    """MSE and MAE of the releases and of the always-zero baseline over the same queries."""
    mask = ~np.isnan(releases)
    t, r = truth[mask], releases[mask]
    rng = np.random.default_rng(seed)
    errs, zero = [], []
    for _ in progress(range(repetitions), repetitions, "evaluating"):
        state = rng.bit_generator.state
        errs.append(range_query_errors(t, r, max_length=query_range, queries=queries, rng=rng))
        rng.bit_generator.state = state  # the baseline answers the very same queries
        zero.append(range_query_errors(t, np.zeros_like(t), max_length=query_range, queries=queries, rng=rng))
    return {"releases": summarize(np.concatenate(errs)), "always zero": summarize(np.concatenate(zero))}


def _plot(path: str, truth: np.ndarray, releases: np.ndarray, intervals: int) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        msg = "--plot needs matplotlib: pip install 'tops[plot]'"
        raise InputError(msg) from None
    mask = ~np.isnan(releases)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(interval_means(truth[mask], intervals), label="true", color="black")
    ax.plot(interval_means(releases[mask], intervals), label="released", color="tab:red", alpha=0.8)
    ax.set_xlabel(f"time ({intervals} intervals of the released ticks)")
    ax.set_ylabel("moving average")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _read_releases(path: str, length: int, stream: str | None) -> np.ndarray:
    """A .npy of releases, or the daemon's JSONL placed at its ticks (NaN where no release)."""
    if Path(path).suffix.lower() in (".jsonl", ".ndjson", ".json"):
        from stream.commands.query import QueryError, Releases

        try:
            return Releases.from_file(path).as_array(length, stream)
        except QueryError as exc:
            raise InputError(f"{Path(path).name}: {exc}") from None
    arr = load_npy(path)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.number):
        msg = f"{Path(path).name}: not a 1-D .npy of releases (got shape {arr.shape}, dtype {arr.dtype})"
        raise InputError(msg)
    return np.array(arr, dtype=np.float64)


def main(args: argparse.Namespace) -> int:
    try:
        truth = read_stream(args.truth, args.stream)
        releases = _read_releases(args.releases, truth.size, args.stream)
        if releases.shape != truth.shape:
            msg = f"truth has {truth.size} ticks but releases has {releases.size}"
            raise InputError(msg)
        if np.isnan(releases).all():
            msg = "no released tick (the stream is shorter than its holdout)"
            raise InputError(msg)
        for name, v in (
            ("--queries", args.queries),
            ("--repetitions", args.repetitions),
            ("--range", args.query_range),
        ):
            if v < 1:
                msg = f"{name} must be at least 1"
                raise InputError(msg)
        res = evaluate(
            truth,
            releases,
            query_range=args.query_range,
            queries=args.queries,
            repetitions=args.repetitions,
            seed=args.seed,
        )
        if args.plot:
            _plot(args.plot, truth, releases, args.intervals)
    except InputError as exc:
        return refuse("evaluate", exc)
    except OSError as exc:  # the plot's path
        return refuse("evaluate", f"{exc.strerror or exc}: {exc.filename or ''}")
    n = int(np.count_nonzero(~np.isnan(releases)))
    print(
        f"{args.queries} random range queries x {args.repetitions} repetitions, "
        f"length 1..{min(args.query_range, n)}, "
        f"over {n} released ticks"
    )
    print(f"{'method':<14}{'MSE (Eq. 9)':>16}{'MAE':>14}")
    for name, (mse, mae) in res.items():
        print(f"{name:<14}{mse:>16.4g}{mae:>14.4g}")
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0

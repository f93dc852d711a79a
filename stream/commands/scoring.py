"""What ``tops compare`` and ``tops compare --mode local`` share: keys per repetition, range queries by length class,
the results table, its CSV and its plot (Eq. 9's MSE and the MAE over random ranges of the released ticks)."""

from __future__ import annotations

import argparse
import csv
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from operators.baselines import LABELS
from stream.commands.inputs import InputError

__all__ = [
    "HINDSIGHT",
    "HINDSIGHT_LABEL",
    "LENGTH_CLASSES",
    "Result",
    "answers",
    "class_queries",
    "default_bound",
    "eps_grid",
    "extend",
    "per_class",
    "plot",
    "repetition_key",
    "write_csv",
]

HINDSIGHT = "hindsight"
HINDSIGHT_LABEL = "hindsight (NOT private)"
LENGTH_CLASSES: tuple[tuple[str, int, int | None], ...] = (
    ("1-60", 1, 60),
    ("61-1440", 61, 1440),
    ("1441-43200", 1441, 43200),
    ("longer", 43201, None),
)


def extend(x: np.ndarray, n: int) -> np.ndarray:
    """The stream extended to ``n`` ticks as the reference code does (append the reversed array without its first
    element until long enough)."""
    x = np.asarray(x, dtype=np.float64)
    while x.size < n:
        x = np.concatenate([x, x[::-1][1:]])
    return x[:n]


def repetition_key(seed: int, rep: int) -> bytes:
    """The key of repetition ``rep`` (public: this is an experiment, not a deployment)."""
    return hashlib.sha256(f"tops-compare/{seed}/{rep}".encode()).digest()


@dataclass
class Result:
    """Errors of one method at one grid point over the repetitions."""

    method: str
    epsilon: float
    threshold_epsilon: float
    mse: list[float]
    mae: list[float]
    thetas: list[float]
    mse_class: dict[str, list[float]] = field(default_factory=dict)
    layers: list[float] = field(default_factory=list)

    def row(self, labels: dict[str, str] | None = None) -> dict[str, Any]:
        mse, mae = np.array(self.mse), np.array(self.mae)
        th = [t for t in self.thetas if not math.isnan(t)]
        return {
            "method": self.method,
            "label": _label(self.method, labels),
            "epsilon": self.epsilon,
            "threshold_epsilon": self.threshold_epsilon,
            "repetitions": len(self.mse),
            "theta_median": float(np.median(th)) if th else float("nan"),
            "mse_mean": float(mse.mean()),
            "mse_std": float(mse.std(ddof=1)) if mse.size > 1 else 0.0,
            "mae_mean": float(mae.mean()),
            "mae_std": float(mae.std(ddof=1)) if mae.size > 1 else 0.0,
            "s_median": float(np.median(self.layers)) if self.layers else float("nan"),
            **{
                f"mse_{name}": float(np.mean(self.mse_class[name])) if self.mse_class.get(name) else float("nan")
                for name, _, _ in LENGTH_CLASSES
            },
        }


def _label(method: str, labels: dict[str, str] | None) -> str:
    if method == HINDSIGHT:
        return (labels or {}).get(method) or HINDSIGHT_LABEL
    return (labels or {}).get(method) or LABELS.get(method, method)


def class_queries(rng: np.random.Generator, n_eval: int, r: int, queries: int) -> dict[str, tuple]:
    """Per length class, ``queries`` ranges of uniform length inside the class (classes longer than r or the
    stream are left out)."""
    out = {}
    top = min(r, n_eval)
    for name, lo, hi in LENGTH_CLASSES:
        if lo > top:
            continue
        hi = top if hi is None else min(hi, top)
        lengths = rng.integers(lo, hi + 1, size=queries)
        starts = (rng.random(queries) * (n_eval - lengths + 1)).astype(np.int64)
        out[name] = (starts, lengths)
    return out


def answers(op: Any, releases: np.ndarray, hold: int, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    if getattr(op, "answers_from_nodes", False):
        return np.asarray(op.range_queries(starts, lengths), dtype=np.float64)
    cum = np.concatenate([[0.0], np.cumsum(releases[hold:])])
    return cum[starts + lengths] - cum[starts]

def write_csv(path: Path, results: list[Result], extra: dict[str, Any], labels: dict[str, str] | None = None) -> None:
    rows = [{**extra, **r.row(labels)} for r in results]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def plot(
    path: Path, results: list[Result], *, x_threshold: bool, title: str, labels: dict[str, str] | None = None
) -> None:
    """Log-scale MSE against eps (or threshold eps), one line per method, error bars = one standard deviation."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        msg = "plots need matplotlib: pip install 'tops[plot]' (or pass --no-plot)"
        raise InputError(msg) from None
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    markers = "osD^vP*Xh<>"
    methods = list(dict.fromkeys(r.method for r in results))
    for k, name in enumerate(methods):
        rs = sorted((r for r in results if r.method == name), key=lambda r: (r.threshold_epsilon, r.epsilon))
        xs = [r.threshold_epsilon if x_threshold else r.epsilon for r in rs]
        ys = [float(np.mean(r.mse)) for r in rs]
        sd = [float(np.std(r.mse, ddof=1)) if len(r.mse) > 1 else 0.0 for r in rs]
        low = [min(s, y * 0.999) for s, y in zip(sd, ys, strict=True)]
        style = "--" if name == "zero" else "-"
        ax.errorbar(
            xs,
            ys,
            yerr=[low, sd],
            label=_label(name, labels),
            marker=markers[k % len(markers)],
            linestyle=style,
            markersize=4,
            capsize=2,
            linewidth=1.2,
        )
    ax.set_yscale("log")
    ax.set_xlabel("threshold-phase eps" if x_threshold else "eps")
    ax.set_ylabel("MSE of range queries (Eq. 9)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def default_bound(args: argparse.Namespace) -> None:
    """``--bound`` defaults to the reference code's B for a shipped data set; elsewhere it is required."""
    if args.bound is None:
        from stream.commands.datasets import DATASETS

        if args.data not in DATASETS or Path(args.data).exists():
            msg = "--bound is required (it has a default only for a shipped data set: dns, retail, star)"
            raise InputError(msg)
        args.bound = DATASETS[args.data].bound


def per_class(row: dict[str, Any]) -> str:
    """The MSE of a row by range length class, as table columns."""
    return "".join(f"{row['mse_' + name]:>16.4g}" for name, _, _ in LENGTH_CLASSES)


def eps_grid(eps: tuple[float, ...], thr: tuple[float, ...] | None) -> tuple[list[tuple[float, float]], bool]:
    """The (eps, threshold eps) points and whether the x-axis is the threshold eps."""
    if thr is None:
        return [(e, e) for e in eps], False
    if len(thr) == 1:
        return [(e, thr[0]) for e in eps], False
    if len(eps) == 1:
        return [(eps[0], t) for t in thr], True
    msg = "give a grid for --eps or for --threshold-eps, not both (Section 5.4 fixes one of them)"
    raise InputError(msg)

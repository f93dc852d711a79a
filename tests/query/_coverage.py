"""The coverage of ``tops query``'s intervals, checked as a consumer would: many independent runs of ToPS (a fresh key
each) on a stream, windows of every length (log-uniform), and how often the 95 % interval holds the true sum.

A run releases the stream through the operator the daemon runs, and the consumer gets what the daemon publishes:
the releases and the stream's status (:func:`stream.core.sinks.central_params`, through JSON). Answers come from
:class:`stream.query.Releases`, whose intervals a variant of :class:`operators.error_bar.RangeError` may make (a
model broken on purpose, to see that the check catches it). The true sum is of the readings as the
stream takes them (clamped to ``[0, B]``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from operators import ToPS, ToPSConfig
from operators.error_bar import RangeError
from stream.commands.datasets import extended
from stream.commands.simulate import simulate_values
from stream.core.sinks import central_params
from stream.query import Releases

CLASSES = ((1, 10), (10, 100), (100, 1000), (1000, 10_000), (10_000, 1 << 62))


@dataclass(frozen=True)
class Kind:
    """A stream to run: its readings (``n`` of them) and its public bound B."""

    name: str
    bound: float

    def readings(self, n: int) -> np.ndarray:
        if self.name == "meter":
            x = simulate_values(n, seed=3)
        else:
            x = extended(self.name, n)
        return np.minimum(x, self.bound)


KINDS = {"dns": Kind("dns", 500.0), "retail": Kind("retail", 16470.0), "meter": Kind("meter", 5000.0)}


@dataclass
class Run:
    """One run: the truth after the holdout, the releases as a consumer holds them, and the status they came with."""

    truth: np.ndarray
    releases: Releases
    status: dict
    holdout: int


def released_run(kind: Kind, key: bytes, *, holdout: int, released: int, epsilon: float = 1.0,
                 range_error: type[RangeError] = RangeError) -> Run:
    """One stream released by ToPS with ``key``, as a consumer receives it (its intervals made by
    ``range_error``)."""
    x = kind.readings(holdout + released)
    cfg = ToPSConfig(epsilon=epsilon, bound=kind.bound, holdout=holdout)
    op = ToPS(cfg, key)
    rel = op.process(x)
    status = {"stream": kind.name, "phase": "releasing", "theta": op.theta, "identity": "0" * 32, "generation": 1,
              "params": central_params(cfg, op.theta_units, op.smoother_layers, op.error_stats)}
    status = json.loads(json.dumps(status))  # what a consumer parses
    ticks = np.arange(holdout, holdout + released)
    return Run(x[holdout:], Releases.from_arrays(kind.name, ticks, rel[holdout:], status, range_error=range_error),
               status, holdout)


@dataclass
class Coverage:
    """Windows and hits per length class."""

    hits: dict[tuple[int, int], int]
    windows: dict[tuple[int, int], int]

    def rate(self, cls: tuple[int, int]) -> float:
        return self.hits[cls] / self.windows[cls]

    def __str__(self) -> str:
        return ", ".join(f"[{lo},{hi if hi < 1 << 40 else 'n'}): {self.rate((lo, hi)):.3f} of {self.windows[(lo, hi)]}"
                         for lo, hi in CLASSES if self.windows[(lo, hi)])


def run_coverage(kind: Kind, *, runs: int, windows: int, holdout: int, released: int, seed: int,
                 range_error: type[RangeError] = RangeError) -> Coverage:
    """``runs`` independent runs (key ``sha256(kind, seed, run)``), ``windows`` windows each, log-uniform lengths in
    ``[1, released]`` at uniform starts, each answered by ``Releases.range_sum`` (its intervals made by
    ``range_error``)."""
    hits = dict.fromkeys(CLASSES, 0)
    count = dict.fromkeys(CLASSES, 0)
    for r in range(runs):
        key = hashlib.sha256(f"coverage/{kind.name}/{seed}/{r}".encode()).digest()
        run = released_run(kind, key, holdout=holdout, released=released, range_error=range_error)
        answer = _consumer(run)
        c = np.concatenate([[0.0], np.cumsum(run.truth)])
        rng = np.random.default_rng([seed, r])
        lengths = np.exp(rng.uniform(0.0, np.log(released), windows)).astype(np.int64)
        for length in lengths.tolist():
            a = int(rng.integers(0, released - length + 1))
            low, high = answer(a, a + length - 1)
            cls = next(c_ for c_ in CLASSES if c_[0] <= length < c_[1])
            count[cls] += 1
            hits[cls] += int(low <= c[a + length] - c[a] <= high)
    return Coverage(hits, count)


def _consumer(run: Run) -> Callable[[int, int], tuple[float, float]]:
    rel, m = run.releases, run.holdout

    def answer(first: int, last: int) -> tuple[float, float]:
        ans = rel.range_sum(m + first, m + last)
        assert ans.low is not None and ans.high is not None, ans.note
        return ans.low, ans.high

    return answer

"""A categorical stream released per period (Finnegan, thesis 2024): one private histogram per tick, central or local.

A *categorical stream* is one quantity many devices report a category of (the region a vehicle is in, an appliance
state). Time is cut into periods; each period is one tick, and at its end the stream releases one estimated
histogram over the ``d`` categories ``0 .. d - 1``:

* ``laplace`` (central, the server holds the raw categories of the period): the period's counts plus exact discrete
  Laplace noise of scale ``Delta / eps`` on every cell (:func:`~operators.categorical.central.laplace_histogram`,
  Finnegan, section 2.1), the noise addressed by the tick, so a replay gives the same bits;
* ``stability`` (central, huge sparse domains): noise on the non-empty cells only, released when at least
  ``tau = (Delta / eps) ln(2 / delta) + 1`` (:func:`~operators.categorical.central.stability_histogram`, section 2.2;
  ``(eps, delta)``-DP);
* ``grr`` / ``hr`` (local, the server sees only reports): the devices randomize with generalised randomized response
  or Hadamard Response (``tops device``); the server tallies the period's reports and applies the unbiased estimator
  (Theorem 2 of section 3.1, and section 3.5). The two mechanisms whose report is one number; OUE and OLH reports
  are a bit vector and a hash seed plus a bucket, which the daemon's one-number journal does not carry (Hadamard
  Response's variance is within 1.13-1.41x of OUE's, measured in docs/categorical.md).

Range sums of one category (central only): each category named in ``counters`` also feeds its true count per
period, as one tick, into its own ToPS stream (:class:`operators.tops.ToPS`, Wang et al., CCS 2021, Algorithm 1, keyed
by a PRF of the stream key and the category), and the release carries that stream's value (``None`` during its holdout),
so ``tops query`` style range sums over many periods stay accurate where summing noisy histograms would add up noise.
``counter.epsilon`` is the budget of all the counters together, per report. A report is in exactly one category, so
under add-remove neighbours it moves one counter's count by 1 (parallel composition: each counter runs at
``counter.epsilon``); under substitute neighbours it can move two counters' counts by 1 each (one down, one up), so
with two or more counters each runs at ``counter.epsilon / 2`` (:attr:`CategoricalConfig.counter_each`, sequential
composition of the two that move). A report costs :attr:`CategoricalConfig.report_epsilon` = ``epsilon +
counter.epsilon`` (the counter's threshold budget instead during its holdout, if that is larger), which is the
``epsilon`` every release states.

Privacy unit: one report (one device's category in one period). Central, with neighbours that add or remove a report
(``Delta = 1``) or change its category (``Delta = 2``): each period's histogram is eps-DP, and periods are disjoint,
so every report is eps-DP (parallel composition). Local: every report is eps-LDP on the device; the server's
estimate and all post-processing are post-processing.

Post-processing (no privacy cost; :mod:`~operators.categorical.postprocess`): ``base-pro`` by default (negative
estimates clipped to 0: biased up on small cells), or ``base`` (unbiased), ``base-cut``, ``norm-sub``,
``simplex``. A release carries the ``top_k`` largest cells (ties: the smaller category first) or, with
``release = "full"``, the whole vector.

>>> cfg = CategoricalConfig(epsilon=1.0, categories=4, mechanism="laplace", top_k=2)
>>> op = CategoricalRelease(cfg, key=bytes(32))
>>> rel = op.process([{0: 50, 2: 30}, {}])
>>> [c for c, _ in rel[0]["top"]], len(rel), op.ticks    # the two largest cells of the first period
([0, 2], 2, 2)
>>> rel == CategoricalRelease(cfg, key=bytes(32)).process([{0: 50, 2: 30}, {}])   # keyed by the tick: replayable
True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from operators.categorical._common import categorical_domain
from operators.categorical.central import laplace_histogram, sensitivity, stability_histogram, stability_threshold
from operators.categorical.grr import grr_estimate, grr_perturb, grr_variance
from operators.categorical.hadamard import hr_estimate, hr_layout, hr_perturb, hr_variance
from operators.categorical.postprocess import POSTPROCESSORS, apply
from operators.config import ConfigError, ToPSConfig
from operators.noise import KeyedGenerator
from operators.tops import ToPS

__all__ = [
    "CENTRAL_MECHANISMS",
    "LOCAL_MECHANISMS",
    "CategoricalConfig",
    "CategoricalRelease",
    "choose_local_mechanism",
    "local_perturb",
    "report_outputs",
]

CENTRAL_MECHANISMS = ("laplace", "stability")
LOCAL_MECHANISMS = ("grr", "hr")
RELEASES = ("top-k", "full")
MAX_DENSE_CELLS = 1 << 24  # laplace touches every cell each period; beyond this use stability
MAX_CATEGORIES = 1 << 40
MAX_COUNTERS = 64
_SNAPSHOT_VERSION = 1


def choose_local_mechanism(epsilon: float, d: int) -> str:
    """GRR or HR, whichever has the smaller f-free variance per report (GRR wins for ``d < 3 e^eps + 2`` roughly).

    >>> choose_local_mechanism(1.0, 4), choose_local_mechanism(1.0, 1085)
    ('grr', 'hr')
    """
    grr = float(grr_variance(1, d, epsilon))
    hr = float(np.max(hr_variance(1, d, epsilon, np.zeros(d) if d <= 1 << 16 else 0.0)))
    return "grr" if grr <= hr else "hr"


def report_outputs(mechanism: str, epsilon: float, d: int) -> int:
    """How many report values a local mechanism has: ``d`` (GRR) or ``B b`` (HR); honest reports are integers in
    ``[0, outputs)``."""
    if mechanism == "grr":
        return d
    b, blocks, _ = hr_layout(epsilon, d)
    return blocks * b


def local_perturb(mechanism: str, categories: Any, d: int, epsilon: float, u: Any) -> np.ndarray:
    """The device side: reports of ``categories`` from two uniforms per category (the keyed generator's)."""
    if mechanism == "grr":
        return grr_perturb(categories, d, epsilon, u)
    if mechanism == "hr":
        return hr_perturb(categories, d, epsilon, u)
    msg = f"unknown local mechanism {mechanism!r}"
    raise ValueError(msg)


@dataclass(frozen=True)
class CategoricalConfig:
    """The public parameters of a categorical stream (all of them are stated in every release's status)."""

    epsilon: float
    categories: int
    mechanism: str = "laplace"
    neighbours: str = "add-remove"
    delta: float | None = None
    post: str = "base-pro"
    release: str = "top-k"
    top_k: int = 10
    labels: tuple[str, ...] = field(default=())
    counters: tuple[int, ...] = field(default=())  # categories whose count per period also feeds a ToPS counter
    counter: ToPSConfig | None = None  # the parameters of those counters (central only)

    def __post_init__(self) -> None:
        eps = self.epsilon
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps <= 30:
            msg = f"epsilon must be a number in (0, 30] (got {eps!r})"
            raise ConfigError(msg)
        d = self.categories
        if isinstance(d, bool) or not isinstance(d, int) or not 2 <= d <= MAX_CATEGORIES:
            msg = f"categories must be an integer in [2, 2^40] (got {d!r})"
            raise ConfigError(msg)
        if self.mechanism not in CENTRAL_MECHANISMS + LOCAL_MECHANISMS:
            names = ", ".join(CENTRAL_MECHANISMS + LOCAL_MECHANISMS)
            msg = f"mechanism must be one of {names} (got {self.mechanism!r})"
            raise ConfigError(msg)
        if self.neighbours not in ("add-remove", "substitute"):
            msg = f"neighbours must be add-remove or substitute (got {self.neighbours!r})"
            raise ConfigError(msg)
        if self.mechanism == "stability":
            if not isinstance(self.delta, float | int) or isinstance(self.delta, bool) or not 0 < self.delta < 1:
                msg = f"delta must be in (0, 1) for the stability histogram (got {self.delta!r})"
                raise ConfigError(msg)
        elif self.delta is not None:
            msg = "delta is for the stability histogram only"
            raise ConfigError(msg)
        if self.mechanism == "laplace" and d > MAX_DENSE_CELLS:
            msg = f"categories = {d} is too many for laplace (noise on every cell each period): use stability"
            raise ConfigError(msg)
        if self.mechanism == "grr" and d > MAX_DENSE_CELLS:
            msg = f"categories = {d} is too many for grr: use hr"
            raise ConfigError(msg)
        if self.mechanism == "hr" and d > MAX_DENSE_CELLS:
            msg = f"categories = {d} is too many for hr in the daemon (at most 2^24)"
            raise ConfigError(msg)
        if self.post not in POSTPROCESSORS:
            msg = f"post must be one of {', '.join(POSTPROCESSORS)} (got {self.post!r})"
            raise ConfigError(msg)
        if self.release not in RELEASES:
            msg = f"release must be top-k or full (got {self.release!r})"
            raise ConfigError(msg)
        if self.release == "full" and self.mechanism != "stability" and d > 1 << 20:
            msg = "release = full is for at most 2^20 categories (use top-k)"
            raise ConfigError(msg)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not 1 <= self.top_k <= 10_000:
            msg = f"top_k must be an integer in [1, 10000] (got {self.top_k!r})"
            raise ConfigError(msg)
        if self.labels and len(self.labels) != d:
            msg = f"labels must name every category ({d}), got {len(self.labels)}"
            raise ConfigError(msg)
        if self.counters:
            if self.local:
                msg = "counters need the raw counts: central mechanisms only"
                raise ConfigError(msg)
            if self.counter is None:
                msg = "counters need their ToPS parameters (counter_bound at least)"
                raise ConfigError(msg)
            if len(set(self.counters)) != len(self.counters) or len(self.counters) > MAX_COUNTERS or not all(
                    isinstance(c, int) and 0 <= c < d for c in self.counters):
                msg = f"counters must be at most {MAX_COUNTERS} distinct categories of 0 .. d - 1"
                raise ConfigError(msg)

    @property
    def local(self) -> bool:
        return self.mechanism in LOCAL_MECHANISMS

    @property
    def counters_moved(self) -> int:
        """How many counters' counts one report can move: 2 under substitute neighbours with two or more counters
        (its old category's count drops by 1, its new one's grows by 1), else 1 (add-remove, or one counter)."""
        return 2 if self.neighbours == "substitute" and len(self.counters) >= 2 else 1

    @property
    def counter_each(self) -> ToPSConfig | None:
        """The parameters each counter runs with: :attr:`counter` with its budgets divided by
        :attr:`counters_moved`, so the counters a report moves spend ``counter.epsilon`` together."""
        c, k = self.counter, self.counters_moved
        if c is None or k == 1:
            return c
        return c.replace(epsilon=c.epsilon / k,
                         threshold_epsilon=None if c.threshold_epsilon is None else c.threshold_epsilon / k)

    @property
    def report_epsilon(self) -> float:
        """The guarantee of one report over everything a release carries: the histogram's ``epsilon`` plus the
        counters' budget (``counter.epsilon``, or its threshold budget if larger), composed sequentially."""
        if not self.counters or self.counter is None:
            return float(self.epsilon)
        c = self.counter
        return float(self.epsilon) + max(c.epsilon, c.threshold_epsilon or 0.0)

    @property
    def outputs(self) -> int:
        """Values an honest input takes: categories (central) or report values (local)."""
        return report_outputs(self.mechanism, self.epsilon, self.categories) if self.local else self.categories

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["labels"] = list(self.labels)
        d["counters"] = list(self.counters)
        d["counter"] = None if self.counter is None else self.counter.to_dict()
        return d


class CategoricalRelease:
    """One categorical stream: a private histogram per period (tick), central or from local reports.

    Same interface as the numeric operators where the daemon needs one (``phase``, ``ticks``, ``holdout_left``,
    ``process``, ``process_one``, ``snapshot``, ``restore``), plus ``valid`` (is an input value one an honest
    reading or report takes?) and ``accepts`` for local reports. ``process`` takes one tally per period (a mapping
    of category, or report value, to its count) and returns one release dict per period.
    """

    takes_categories = True  # the router keeps a tally per open period instead of a sum
    takes_reports = False
    phase = "releasing"  # no holdout: every period is released
    holdout_left = 0
    theta = None

    def __init__(self, config: CategoricalConfig, key: bytes | None = None) -> None:
        if not config.local and key is None:
            msg = "a central categorical stream needs its noise key"
            raise ValueError(msg)
        self.config = config
        self._gen = None if key is None else KeyedGenerator(key)
        self.ticks = 0
        self.clamped = 0
        self._outputs = config.outputs
        self._counters: dict[int, ToPS] = {}
        if config.counters:
            each = config.counter_each
            assert each is not None
            self._counters = {c: ToPS(each, self._counter_key(c)) for c in config.counters}

    def _counter_key(self, category: int) -> bytes:
        """The key of a category's counter: 256 bits of the stream's keystream for that purpose (a PRF of the
        stream key), so the counters' noise never meets the histogram's."""
        assert self._gen is not None
        return self._gen.words(categorical_domain("counter"), category, 0, 4).tobytes()

    def __repr__(self) -> str:
        return f"CategoricalRelease({self.config.mechanism}, d={self.config.categories}, ticks={self.ticks})"

    def valid(self, value: float) -> bool:
        """Whether ``value`` is an integer in ``[0, outputs)`` (a category, or a local report value)."""
        return value == value and 0 <= value < self._outputs and value == math.floor(value)

    def category_of(self, value: float) -> int:
        """The cell a valid value counts in: the value itself."""
        return int(value)

    def accepts(self, phase: str, theta: float | None, y: float) -> str:
        """Local mode: ``ok`` for a report of this stream's mechanism in its output range, else why not."""
        if phase != "categorical":
            return "stale"
        return "ok" if self.valid(y) else "out-of-range"

    # -- the release of one period ------------------------------------------------------------------------------
    def _estimate(self, tally: dict[int, int], address: int) -> tuple[np.ndarray, np.ndarray | None, int]:
        """(estimate, cells or None for dense, reports) of one period."""
        cfg, d = self.config, self.config.categories
        cells = np.fromiter((int(k) for k in tally), dtype=np.int64, count=len(tally))
        counts = np.fromiter((int(v) for v in tally.values()), dtype=np.int64, count=len(tally))
        n = int(counts.sum())
        if cfg.mechanism == "stability":
            assert self._gen is not None and cfg.delta is not None
            if not cells.size:
                return np.zeros(0), np.zeros(0, dtype=np.int64), n
            ids, noisy = stability_histogram(cells, counts, cfg.epsilon, cfg.delta, self._gen,
                                             neighbours=cfg.neighbours, address=address)
            return noisy.astype(np.float64), ids, n
        if cfg.mechanism == "laplace":
            assert self._gen is not None
            dense = np.zeros(d, dtype=np.int64)
            dense[cells] = counts
            return laplace_histogram(dense, cfg.epsilon, self._gen, neighbours=cfg.neighbours,
                                     address=address).astype(np.float64), None, n
        if cfg.mechanism == "grr":
            support = np.zeros(d, dtype=np.int64)
            support[cells] = counts
            return grr_estimate(support, n, d, cfg.epsilon), None, n
        outputs = np.repeat(cells, counts)
        return hr_estimate(outputs, d, cfg.epsilon), None, n

    def _label(self, c: int) -> int | str:
        return self.config.labels[c] if self.config.labels else c

    def release_one(self, tally: dict[int, int]) -> dict[str, Any]:
        """The release of the next period (its tick is :attr:`ticks`); the noise is addressed by that tick."""
        cfg = self.config
        est, cells, n = self._estimate(tally, self.ticks)
        out: dict[str, Any] = {"mechanism": cfg.mechanism}
        if cells is not None:  # stability: only the released cells (all others are 0)
            if cfg.release == "full":
                out["cells"] = [[self._label(int(c)), float(v)] for c, v in zip(cells, est, strict=True)]
            order = np.lexsort((cells, -est))[: cfg.top_k]
            out["top"] = [[self._label(int(cells[i])), float(est[i])] for i in order]
            out["threshold"] = stability_threshold(cfg.epsilon, cfg.delta, cfg.neighbours)
        else:
            total = float(n) if cfg.local else None  # central: the period's count is private
            if cfg.post in ("base", "base-pro"):
                est = apply(cfg.post, est, 0.0)
            elif total is not None:
                est = apply(cfg.post, est, total)
            else:  # central: the total the projection needs is the noisy sum (post-processing)
                est = apply(cfg.post, est, max(0.0, float(est.sum())))
            if cfg.release == "full":
                out["counts"] = [float(v) for v in est]
            k = min(cfg.top_k, est.size)
            idx = np.argpartition(-est, k - 1)[:k] if k < est.size else np.arange(est.size)
            idx = idx[np.lexsort((idx, -est[idx]))]
            out["top"] = [[self._label(int(i)), float(est[i])] for i in idx]
        if cfg.local:
            out["reports"] = n  # the server sees every report: public in local mode (never in central)
        if self._counters:  # ToPS on the period's true count of each counter category (None in its holdout)
            vals = {}
            for c, op in self._counters.items():
                v = op.process_one(float(tally.get(c, 0)))
                vals[str(self._label(c))] = None if v != v else v
            out["counters"] = vals
        self.ticks += 1
        return out

    def process(self, tallies: list[dict[int, int]]) -> list[dict[str, Any]]:
        """One release per period tally, in order."""
        return [self.release_one(t) for t in tallies]

    def process_one(self, tally: dict[int, int]) -> dict[str, Any]:
        return self.release_one(tally)

    # -- checkpoints --------------------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The state between periods: the tick counter (the noise of every period is regenerated from the key)."""
        snap: dict[str, Any] = {"version": _SNAPSHOT_VERSION, "kind": "categorical", "config": self.config.to_dict(),
                                "ticks": self.ticks}
        if self._counters:
            snap["counters"] = {str(c): op.snapshot() for c, op in self._counters.items()}
        return snap

    @classmethod
    def restore(cls, config: CategoricalConfig, key: bytes | None, snapshot: dict[str, Any]) -> CategoricalRelease:
        if snapshot.get("version") != _SNAPSHOT_VERSION or snapshot.get("kind") != "categorical":
            msg = "not a categorical snapshot"
            raise ValueError(msg)
        made = snapshot.get("config")
        if made is not None and made != config.to_dict():
            msg = "the snapshot was made with other parameters"
            raise ValueError(msg)
        op = cls(config, key)
        op.ticks = int(snapshot["ticks"])
        if config.counters:
            each = config.counter_each
            assert each is not None
            saved = snapshot["counters"]
            op._counters = {c: ToPS.restore(each, op._counter_key(c), saved[str(c)])
                            for c in config.counters}
        return op

    def state_nbytes(self) -> int:
        return 16 + sum(op.state_nbytes() for op in self._counters.values())


def sensitivity_of(config: CategoricalConfig) -> int:
    """Delta of the central mechanisms (1 add-remove, 2 substitute)."""
    return sensitivity(config.neighbours)

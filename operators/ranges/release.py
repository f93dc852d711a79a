"""A range-counting stream released per period (Friis, thesis 2021): readings bucketed over a value domain, one private
histogram per period from which any range of buckets is answered.

A reading ``v`` falls in bucket ``floor((v - lower) / width)``, clamped to ``0 .. buckets - 1`` (clamped readings are
counted, never dropped). At the end of each period (one tick) the period's bucket counts go through the flat histogram
or the consistent b-ary tree of :mod:`operators.ranges.central`, noise addressed by the tick, and the release carries
the consistent bucket estimates: the answer to "how many readings between 2 and 5 kWh this hour" is the sum of its
buckets, which for the consistent tree equals the sum over the range's decomposition nodes. ``mechanism = "auto"``
takes the tree when its mean variance over ranges of 1, d/8, d/4, d/2 and d buckets is below flat's
(:func:`operators.ranges.central.prefer_tree`).

Local mode (``local=True``, Friis, thesis 2021, sections 8.2-8.3): the devices bucket their own readings and send
one-number reports (:class:`operators.ranges.local.ReportLayout`: flat, or one uniformly chosen level of the tree,
through GRR or Hadamard Response); the server tallies the report values per period and releases per-level unbiased
estimates (``counts`` for flat, ``levels`` for the tree; a range is answered from its decomposition). Every report is
eps-LDP on the device; the server holds no key.

Privacy (central): one reading per period is the unit; neighbouring periods add or remove one reading, each period's
release is eps-DP, periods are disjoint (parallel composition), so every reading is eps-DP.

>>> cfg = RangeConfig(epsilon=1.0, lower=0.0, width=0.5, buckets=16, mechanism="tree", fanout=4)
>>> op = RangeRelease(cfg, key=bytes(32))
>>> op.category_of(2.3), op.category_of(-1.0), op.category_of(99.0), op.clamped
(4, 0, 15, 2)
>>> rel = op.process([{4: 30, 5: 10}])[0]
>>> rel["mechanism"], len(rel["counts"])
('tree', 16)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from operators.config import ConfigError
from operators.noise import KeyedGenerator
from operators.ranges.central import FlatHistogram, RangeTree, prefer_tree
from operators.ranges.local import ReportLayout, prefer_local_tree

__all__ = ["RANGE_MECHANISMS", "RangeConfig", "RangeRelease"]

RANGE_MECHANISMS = ("flat", "tree")
MAX_BUCKETS = 1 << 16
_SNAPSHOT_VERSION = 1


@dataclass(frozen=True)
class RangeConfig:
    """The public parameters of a range-counting stream."""

    epsilon: float
    width: float
    buckets: int
    lower: float = 0.0
    mechanism: str = "tree"
    fanout: int = 4
    local: bool = False  # local mode: devices bucket and randomize, the server tallies one-number reports

    def __post_init__(self) -> None:
        for name in ("epsilon", "width"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                msg = f"{name} must be a positive number (got {v!r})"
                raise ConfigError(msg)
        if not self.epsilon <= 30:
            msg = f"epsilon must be at most 30 (got {self.epsilon!r})"
            raise ConfigError(msg)
        if isinstance(self.lower, bool) or not isinstance(self.lower, int | float) or not math.isfinite(self.lower):
            msg = f"lower must be a finite number (got {self.lower!r})"
            raise ConfigError(msg)
        b = self.buckets
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BUCKETS:
            msg = f"buckets must be an integer in [1, {MAX_BUCKETS}] (got {b!r})"
            raise ConfigError(msg)
        if self.mechanism not in RANGE_MECHANISMS:
            msg = f"mechanism must be one of {', '.join(RANGE_MECHANISMS)} (got {self.mechanism!r})"
            raise ConfigError(msg)
        f = self.fanout
        if isinstance(f, bool) or not isinstance(f, int) or not 2 <= f <= 64:
            msg = f"fanout must be an integer in [2, 64] (got {f!r})"
            raise ConfigError(msg)
        if self.local and b < 2:
            msg = f"buckets must be at least 2 in local mode (got {b!r})"
            raise ConfigError(msg)

    @classmethod
    def auto(cls, epsilon: float, width: float, buckets: int, lower: float = 0.0, fanout: int = 4,
             local: bool = False) -> RangeConfig:
        """The mechanism the rule picks for ranges of 1, d/8, d/4, d/2 and d buckets (local: on uniform data of
        10,000 devices; both variances grow in proportion to the devices, so the choice hardly depends on it)."""
        lengths = sorted({1, max(1, buckets // 8), max(1, buckets // 4), max(1, buckets // 2), buckets})
        if local:
            tree = buckets > 2 and prefer_local_tree(buckets, fanout, float(epsilon), 10_000, lengths)
        else:
            tree = buckets > 1 and prefer_tree(buckets, fanout, float(epsilon), lengths)
        return cls(epsilon, width, buckets, lower, "tree" if tree else "flat", fanout, local)

    @property
    def report_epsilon(self) -> float:
        """The guarantee of one reading over a release (the one histogram it carries): ``epsilon``."""
        return float(self.epsilon)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def layout(self) -> ReportLayout:
        """Local mode: the devices' one-number reports (levels, oracles, offsets)."""
        return ReportLayout(self.buckets, self.fanout, float(self.epsilon), tree=self.mechanism == "tree")

    def mechanism_object(self) -> FlatHistogram | RangeTree:
        if self.mechanism == "flat":
            return FlatHistogram(self.buckets, float(self.epsilon))
        return RangeTree(self.buckets, self.fanout, float(self.epsilon))


class RangeRelease:
    """One range-counting stream: a bucket tally per period in, one private histogram per period out (the same
    interface as :class:`operators.categorical.release.CategoricalRelease`)."""

    takes_categories = True
    takes_reports = False
    phase = "releasing"
    holdout_left = 0
    theta = None

    def __init__(self, config: RangeConfig, key: bytes | None = None) -> None:
        if not config.local and key is None:
            msg = "a central range stream needs its noise key"
            raise ValueError(msg)
        self.config = config
        self._gen = None if key is None else KeyedGenerator(key)
        self._mech = None if config.local else config.mechanism_object()
        self._layout = config.layout() if config.local else None
        self.ticks = 0
        self.clamped = 0

    def __repr__(self) -> str:
        return f"RangeRelease({self.config.mechanism}, buckets={self.config.buckets}, ticks={self.ticks})"

    def valid(self, value: float) -> bool:
        """Central: any finite number is a reading (outside the domain it is clamped to the first or last bucket).
        Local: a report is an integer in ``[0, layout.total)``."""
        if self._layout is not None:
            return value == value and 0 <= value < self._layout.total and value == math.floor(value)
        return math.isfinite(value)

    def accepts(self, phase: str, theta: float | None, y: float) -> str:
        """Local mode: ``ok`` for a report of this stream's phase in its output range, else why not."""
        if phase != "range":
            return "stale"
        return "ok" if self.valid(y) else "out-of-range"

    def category_of(self, value: float) -> int:
        """Central: the bucket of a reading (clamped to the domain, counted in :attr:`clamped`). Local: the report
        value itself."""
        if self._layout is not None:
            return int(value)
        cfg = self.config
        k = math.floor((value - cfg.lower) / cfg.width)
        if k < 0 or k >= cfg.buckets:
            self.clamped += 1
            return 0 if k < 0 else cfg.buckets - 1
        return k

    def release_one(self, tally: dict[int, int]) -> dict[str, Any]:
        cfg = self.config
        if self._layout is not None:
            levels, n = self._layout.estimate(tally)
            self.ticks += 1
            out: dict[str, Any] = {"mechanism": cfg.mechanism, "lower": cfg.lower, "width": cfg.width,
                                   "oracles": list(self._layout.oracles), "reports": n}
            if cfg.mechanism == "flat":
                out["counts"] = [float(v) for v in levels[0]]
            else:  # a range is answered from its decomposition (operators.ranges.local.answer_from_levels)
                out["levels"] = [[float(v) for v in lv] for lv in levels]
            return out
        assert self._gen is not None and self._mech is not None
        counts = np.zeros(cfg.buckets, dtype=np.int64)
        for k, n in tally.items():
            counts[int(k)] += int(n)
        if isinstance(self._mech, FlatHistogram):
            est = self._mech.release(counts, self._gen, address=self.ticks).astype(np.float64)
        else:
            est = self._mech.release(counts, self._gen, address=self.ticks).leaves()
        self.ticks += 1
        return {"mechanism": cfg.mechanism, "lower": cfg.lower, "width": cfg.width,
                "counts": [float(v) for v in est]}

    def process(self, tallies: list[dict[int, int]]) -> list[dict[str, Any]]:
        return [self.release_one(t) for t in tallies]

    def process_one(self, tally: dict[int, int]) -> dict[str, Any]:
        return self.release_one(tally)

    def snapshot(self) -> dict[str, Any]:
        return {"version": _SNAPSHOT_VERSION, "kind": "range", "config": self.config.to_dict(), "ticks": self.ticks,
                "clamped": self.clamped}

    @classmethod
    def restore(cls, config: RangeConfig, key: bytes, snapshot: dict[str, Any]) -> RangeRelease:
        if snapshot.get("version") != _SNAPSHOT_VERSION or snapshot.get("kind") != "range":
            msg = "not a range snapshot"
            raise ValueError(msg)
        if snapshot.get("config") is not None and snapshot["config"] != config.to_dict():
            msg = "the snapshot was made with other parameters"
            raise ValueError(msg)
        op = cls(config, key)
        op.ticks = int(snapshot["ticks"])
        op.clamped = int(snapshot.get("clamped", 0))
        return op

    def state_nbytes(self) -> int:
        return 16

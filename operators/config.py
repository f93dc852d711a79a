"""The configuration of a ToPS stream: what the paper calls its parameters, checked once, immutable.

Configuration and state are kept apart: a :class:`ToPSConfig` says *how* a stream is released; the operator
(:class:`operators.tops.ToPS`) holds what it has learned and drawn so far.

>>> cfg = ToPSConfig(epsilon=1.0, bound=500)
>>> cfg.fanout, cfg.query_range, cfg.holdout, cfg.smoother
(16, 1048576, 65536, 'recent')
>>> ToPSConfig(epsilon=0, bound=500)
Traceback (most recent call last):
...
operators.config.ConfigError: epsilon must be a positive number (got 0)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HOLDOUT_GRIDS",
    "SELECTIONS",
    "SMOOTHERS",
    "ConfigError",
    "ToPSConfig",
    "check_holdout",
    "check_int_at_least",
    "check_positive",
    "tree_height",
]

SMOOTHERS = ("recent", "ema", "mean", "median", "moving")
SELECTIONS = ("calibrated", "paper")
HOLDOUT_GRIDS = ("exact", "compact")


class ConfigError(ValueError):
    """A parameter is outside its allowed values; the message names it and what is allowed."""


@functools.lru_cache(maxsize=256)
def tree_height(query_range: int, fanout: int) -> int:
    """``h = ceil(log_b r)``, computed exactly on integers (once per pair: every new stream asks)."""
    h, span = 0, 1
    while span < query_range:
        span *= fanout
        h += 1
    return max(h, 1)


def check_positive(name: str, value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        msg = f"{name} must be a positive number (got {value!r})"
        raise ConfigError(msg)


def check_int_at_least(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        msg = f"{name} must be an integer >= {low} (got {value!r})"
        raise ConfigError(msg)


def check_holdout(value: Any, theta: Any) -> None:
    """m: an integer >= 1, or >= 0 with a fixed public theta; one message whatever the bad value.

    >>> check_holdout(-3, None)
    Traceback (most recent call last):
    ...
    operators.config.ConfigError: holdout must be an integer >= 1 unless theta is given (got -3)
    >>> check_holdout(0, None)
    Traceback (most recent call last):
    ...
    operators.config.ConfigError: holdout must be an integer >= 1 unless theta is given (got 0)
    """
    if theta is not None:
        check_int_at_least("holdout", value, 0)
    elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"holdout must be an integer >= 1 unless theta is given (got {value!r})"
        raise ConfigError(msg)


_AS_DICT: dict[Any, dict[str, Any]] = {}  # ToPSConfig -> its dict (configurations are few and immutable)


@dataclass(frozen=True, slots=True)
class ToPSConfig:
    """Parameters of one ToPS stream (seed 001, Algorithm 1 and Sections 3.3-3.6).

    Parameters
    ----------
    epsilon
        Privacy budget of the released ticks (event-level eps-DP), split equally over the ``h - s`` tree layers.
    bound
        Public upper bound B of a value; larger values are clamped to B (and counted).
    lower
        Public lower bound of a value (default 0); smaller values are clamped to it (and counted), never dropped (a
        missing tick would itself reveal the value). The stream works on ``value - lower`` in ``[0, B - lower]``
        and adds ``lower`` back to every release (post-processing); theta is in value units, in ``(lower, B]``.
    holdout
        m, the number of first ticks used privately to choose the threshold theta; they are never released.
    query_range
        r, the longest range query the hierarchy is built for; a new tree starts every r released ticks.
    fanout
        b, the fan-out of the hierarchy.
    smoother
        How ticks inside a leaf are predicted (Appendix D): recent, ema, mean, median or moving.
    smoother_layers
        s, the number of lowest layers replaced by the smoother; ``None`` chooses it by Eq. 7.
    alpha
        Weight of the newest leaf in the EMA smoother.
    window
        Number of leaves the moving-average and median smoothers look back on.
    resolution
        Values are quantized to multiples of this before noise is added (noise is integer in these units).
    threshold_epsilon
        Budget of the threshold optimizer on the holdout (default: ``epsilon``; the holdout ticks are disjoint
        from the released ones, so both compose in parallel).
    theta
        A fixed public threshold (from a public sample or domain knowledge): no holdout, no budget spent on it.
    selection
        How the holdout chooses theta, s and the smoother's start: ``calibrated`` (default; operators.selection, an
        error model measured privately on the holdout) or ``paper`` (Eq. 6 for theta, Eq. 7 for s, start theta/2).
    holdout_grid
        The candidate thresholds, which are the holdout histogram's cells: ``exact`` (default; every value step up to
        4,096 steps, then 0.1% apart: 4,297 cells at B = 5,000) or ``compact`` (the first 32 steps, then 3% apart:
        204 cells at B = 5,000, ``O(log B)``; a value is counted at its cell's upper edge). ``to_dict`` leaves out
        the default, so that what was stored before this parameter existed still matches.
    """

    epsilon: float
    bound: float
    holdout: int = 65536
    query_range: int = 1 << 20
    fanout: int = 16
    smoother: str = "recent"
    smoother_layers: int | None = None
    alpha: float = 0.6
    window: int = 8
    resolution: float = 1.0
    threshold_epsilon: float | None = None
    theta: float | None = None
    lower: float = 0.0
    selection: str = "calibrated"
    holdout_grid: str = "exact"

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        if isinstance(self.lower, bool) or not isinstance(self.lower, int | float) or not math.isfinite(self.lower):
            msg = f"lower must be a finite number (got {self.lower!r})"
            raise ConfigError(msg)
        if self.lower == 0:
            check_positive("bound", self.bound)
        elif (isinstance(self.bound, bool) or not isinstance(self.bound, int | float) or not math.isfinite(self.bound)
              or self.bound <= self.lower):
            msg = f"bound must be a finite number above lower ({self.lower}); got {self.bound!r}"
            raise ConfigError(msg)
        check_positive("resolution", self.resolution)
        if self.span >= self.resolution and type(self.fanout) is int and type(self.query_range) is int:
            from operators.hierarchy import exact_range_problem

            b = max(self.fanout, 2)
            h = tree_height(max(self.query_range, 2), b)
            problem = exact_range_problem(self.span / self.resolution, self.epsilon, b, h)
            if problem:
                raise ConfigError(problem)
        if self.span < self.resolution:
            msg = f"bound - lower must be at least one resolution step ({self.resolution})"
            raise ConfigError(msg)
        check_holdout(self.holdout, self.theta)
        if self.holdout > 2**31 - 1:
            msg = f"holdout must be below 2^31 (got {self.holdout})"
            raise ConfigError(msg)
        check_int_at_least("fanout", self.fanout, 2)
        check_int_at_least("query_range", self.query_range, 2)
        if self.query_range > 1 << 32:
            msg = f"query_range must be at most 2^32 (got {self.query_range})"
            raise ConfigError(msg)
        h = tree_height(self.query_range, self.fanout)
        if self.query_range % self.fanout ** (h - 1):
            msg = (
                f"query_range must be a multiple of fanout^(h-1) = {self.fanout ** (h - 1)} "
                f"(e.g. a power of the fanout; got {self.query_range})"
            )
            raise ConfigError(msg)
        if self.selection not in SELECTIONS:
            msg = f"selection must be one of {', '.join(SELECTIONS)} (got {self.selection!r})"
            raise ConfigError(msg)
        if self.holdout_grid not in HOLDOUT_GRIDS:
            msg = f"holdout_grid must be one of {', '.join(HOLDOUT_GRIDS)} (got {self.holdout_grid!r})"
            raise ConfigError(msg)
        if self.smoother not in SMOOTHERS:
            msg = f"smoother must be one of {', '.join(SMOOTHERS)} (got {self.smoother!r})"
            raise ConfigError(msg)
        if self.smoother_layers is not None:
            check_int_at_least("smoother_layers", self.smoother_layers, 0)
            if self.smoother_layers > h - 1:
                msg = f"smoother_layers must be between 0 and h - 1 = {h - 1} (got {self.smoother_layers})"
                raise ConfigError(msg)
        if (
            isinstance(self.alpha, bool)
            or not isinstance(self.alpha, int | float)
            or not 0 <= self.alpha <= 1
        ):
            msg = f"alpha must be in [0, 1] (got {self.alpha!r})"
            raise ConfigError(msg)
        check_int_at_least("window", self.window, 1)
        if self.threshold_epsilon is not None:
            check_positive("threshold_epsilon", self.threshold_epsilon)
        if self.theta is not None:
            if self.lower == 0:
                check_positive("theta", self.theta)
            elif isinstance(self.theta, bool) or not isinstance(self.theta, int | float) or self.theta <= self.lower:
                msg = f"theta must be a number above lower ({self.lower}); got {self.theta!r}"
                raise ConfigError(msg)
            if self.theta > self.bound:
                msg = f"theta must be at most bound ({self.bound}); got {self.theta}"
                raise ConfigError(msg)

    @property
    def span(self) -> float:
        """``B - lower``: the width of the value range, the bound of the shifted values the stream works on."""
        return self.bound - self.lower

    @property
    def height(self) -> int:
        """h = ceil(log_b r), the number of layers of a full hierarchy."""
        return tree_height(self.query_range, self.fanout)

    @property
    def holdout_ticks(self) -> int:
        """Ticks held out for the threshold: m, or 0 when theta is fixed."""
        return 0 if self.theta is not None else self.holdout

    def replace(self, **changes: Any) -> ToPSConfig:
        """A copy with some parameters changed (checked again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The parameters as a plain dict (JSON-serialisable); computed once per distinct configuration (every
        stream's snapshot carries it: ``dataclasses.asdict`` was 95% of a checkpoint's snapshot time)."""
        d = _AS_DICT.get(self)
        if d is None:
            d = dataclasses.asdict(self)
            if d["holdout_grid"] == "exact":  # the default, left out: states and ledgers stored before it match
                del d["holdout_grid"]
            if len(_AS_DICT) < 1024:
                _AS_DICT[self] = d
        return dict(d)

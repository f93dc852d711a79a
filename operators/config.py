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
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from operators.smoothers import SMOOTHERS, SmootherSpec

__all__ = [
    "FANOUT_MAX",
    "HOLDOUT_GRIDS",
    "HOLDOUT_MAX",
    "QUERY_RANGE_MAX",
    "SELECTIONS",
    "SMOOTHERS",
    "SMOOTHER_LAYERS_MAX",
    "WINDOW_MAX",
    "ConfigError",
    "ToPSConfig",
    "check_hierarchy",
    "check_holdout",
    "check_int_at_least",
    "check_int_in",
    "check_parameter",
    "check_positive",
    "check_smoother",
    "smoother",
    "tree_height",
]

SELECTIONS = ("calibrated", "paper")
HOLDOUT_GRIDS = ("exact", "compact")
HOLDOUT_SCOPES = ("stream", "fleet")

# The ranges of the integer parameters. A fanout at or above r is a flat hierarchy (h = 1): anything larger only
# risks overflow. r <= 2^32 and b >= 2 give h <= 32, so s <= h - 1 <= 31. The window is in leaves (8 bytes each in
# a stream's state). The holdout histogram counts ticks in 32-bit signed integers.
FANOUT_MAX = 1 << 16
QUERY_RANGE_MAX = 1 << 32
SMOOTHER_LAYERS_MAX = 31
WINDOW_MAX = 1 << 16
HOLDOUT_MAX = 2**31 - 1


class ConfigError(ValueError):
    """A parameter is outside its allowed values; the message names it and what is allowed, ``param`` is its name
    (None for a problem between parameters that no single one owns)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _shown(value: Any) -> str:
    """``repr(value)``, cut to 40 characters (a message stays one short line, whatever it was given)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _refuse(name: str, rule: str, value: Any) -> ConfigError:
    return ConfigError(f"{name} must be {rule} (got {_shown(value)})", name)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_positive(name: str, value: Any) -> None:
    """A positive finite number (an int is compared before any conversion: 10^400 is refused, not overflowed)."""
    if not _is_real(value) or not 0 < value <= sys.float_info.max:
        raise _refuse(name, "a positive number", value)


def check_int_at_least(name: str, value: Any, low: int) -> None:
    if not _is_int(value) or value < low:
        raise _refuse(name, f"an integer >= {low}", value)


def check_int_in(name: str, value: Any, low: int, high: int) -> None:
    if not _is_int(value) or not low <= value <= high:
        raise _refuse(name, f"an integer >= {low} and <= {high}", value)


def check_holdout(value: Any, theta: Any) -> None:
    """m: an integer in [1, 2^31 - 1], or from 0 with a fixed public theta; one message whatever the bad value.

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
    elif not _is_int(value) or value < 1:
        raise _refuse("holdout", "an integer >= 1 unless theta is given", value)
    check_parameter("holdout", value)


def _check_alpha(name: str, value: Any) -> None:
    if not _is_real(value) or not 0 <= value <= 1:  # NaN fails the comparison
        raise _refuse(name, "a number in [0, 1]", value)


def _check_choice(name: str, value: Any, choices: Iterable[str]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise _refuse(name, f"one of {', '.join(choices)}", value)


_INT_RANGES: dict[str, tuple[int, int]] = {
    "fanout": (2, FANOUT_MAX),
    "query_range": (2, QUERY_RANGE_MAX),
    "smoother_layers": (0, SMOOTHER_LAYERS_MAX),
    "window": (1, WINDOW_MAX),
    "holdout": (0, HOLDOUT_MAX),  # ticks before the first release: 0 with a fixed theta
}
_POSITIVE = ("epsilon", "threshold_epsilon", "resolution", "theta")


def check_parameter(name: str, value: Any) -> None:
    """The range of one public parameter of a ToPS stream on its own (how it relates to the others is checked by
    the configurations that hold them): the one place each range is written.

    >>> check_parameter("fanout", 1)
    Traceback (most recent call last):
    ...
    operators.config.ConfigError: fanout must be an integer >= 2 and <= 65536 (got 1)
    """
    if name in _INT_RANGES:
        check_int_in(name, value, *_INT_RANGES[name])
    elif name in _POSITIVE:
        check_positive(name, value)
    elif name == "alpha":
        _check_alpha(name, value)
    elif name == "smoother":
        smoother(value)
    else:
        msg = f"no range is known for a parameter named {_shown(name)}"
        raise ValueError(msg)


def smoother(name: Any) -> SmootherSpec:
    """The entry of a smoother in the registry (:data:`operators.smoothers.SMOOTHERS`); an unknown name is refused
    with the allowed ones.

    >>> smoother("ema").reads
    ('alpha',)
    >>> smoother("best")
    Traceback (most recent call last):
    ...
    operators.config.ConfigError: smoother must be one of recent, ema, mean, median, moving (got 'best')
    """
    _check_choice("smoother", name, SMOOTHERS)
    return SMOOTHERS[name]


@functools.lru_cache(maxsize=256)
def tree_height(query_range: int, fanout: int) -> int:
    """``h = ceil(log_b r)``, computed exactly on integers (once per pair: every new stream asks). A fanout below 2
    never grows a tree and a range below 1 has none: refused, whoever asks.

    >>> tree_height(4096, 16), tree_height(4097, 16), tree_height(1, 16)
    (3, 4, 1)
    """
    if not fanout >= 2:  # NaN too
        raise _refuse("fanout", "at least 2", fanout)
    if not query_range >= 1:
        raise _refuse("query_range", "at least 1", query_range)
    h, span = 0, 1
    while span < query_range:
        span *= fanout
        h += 1
    return max(h, 1)


def check_hierarchy(query_range: Any, fanout: Any, smoother_layers: Any) -> int:
    """r, b and s of a hierarchy: each in its range, r a multiple of ``b^(h-1)`` (every tree has the same shape), s
    at most ``h - 1`` (one layer of noise remains). Returns h."""
    check_parameter("fanout", fanout)
    check_parameter("query_range", query_range)
    h = tree_height(query_range, fanout)
    if query_range % fanout ** (h - 1):
        msg = (f"query_range must be a multiple of fanout^(h-1) = {fanout ** (h - 1)} "
               f"(e.g. a power of the fanout; got {query_range})")
        raise ConfigError(msg, "query_range")
    if smoother_layers is not None:
        check_parameter("smoother_layers", smoother_layers)
        if smoother_layers > h - 1:
            raise _refuse("smoother_layers", f"between 0 and h - 1 = {h - 1}", smoother_layers)
    return h


def check_smoother(smoother: Any, alpha: Any, window: Any) -> None:
    """The smoother and its two parameters (Appendix D): a known smoother, the EMA weight in [0, 1], a window of
    1 to 65,536 leaves."""
    check_parameter("smoother", smoother)
    check_parameter("alpha", alpha)
    check_parameter("window", window)


_AS_DICT: dict[Any, dict[str, Any]] = {}  # ToPSConfig -> its dict (configurations are few and immutable)


@dataclass(frozen=True, slots=True)
class ToPSConfig:
    """Parameters of one ToPS stream (Wang et al., CCS 2021, Algorithm 1 and Sections 3.3-3.6).

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
        How ticks inside a leaf are predicted (Appendix D): a name in :data:`operators.smoothers.SMOOTHERS` (recent,
        ema, mean, median or moving).
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
    holdout_scope
        Whose readings the holdout is: ``stream`` (default; each stream's own first ``holdout`` readings) or
        ``fleet`` (the first ``holdout`` readings of the template's streams together, one choice for all of them:
        :mod:`operators.fleet_holdout`). A ToPS object holds one stream: it reads this only to state it; the daemon
        keeps the fleet's holdout. ``to_dict`` leaves out the default.
    fleet_generation
        The fleet holdout's generation (``fleet`` only; default 1, left out by ``to_dict``): a new one is a new
        holdout, under a key of its own, of the readings that come after it starts.
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
    holdout_scope: str = "stream"
    fleet_generation: int = 1

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        if not _is_real(self.lower) or not -sys.float_info.max <= self.lower <= sys.float_info.max:
            raise _refuse("lower", "a finite number", self.lower)
        if self.lower == 0:
            check_positive("bound", self.bound)
        elif not _is_real(self.bound) or not self.lower < self.bound <= sys.float_info.max:
            raise _refuse("bound", f"a finite number above lower ({self.lower})", self.bound)
        check_positive("resolution", self.resolution)
        h = check_hierarchy(self.query_range, self.fanout, self.smoother_layers)
        if self.span < self.resolution:
            msg = f"bound - lower must be at least one resolution step ({self.resolution})"
            raise ConfigError(msg, "resolution")
        from operators.hierarchy import exact_range_problem

        problem = exact_range_problem(self.span / self.resolution, self.epsilon, self.fanout, h)
        if problem:
            raise ConfigError(problem)
        check_holdout(self.holdout, self.theta)
        _check_choice("selection", self.selection, SELECTIONS)
        _check_choice("holdout_grid", self.holdout_grid, HOLDOUT_GRIDS)
        _check_choice("holdout_scope", self.holdout_scope, HOLDOUT_SCOPES)
        if not _is_int(self.fleet_generation) or not 1 <= self.fleet_generation <= 2**31 - 1:
            raise _refuse("fleet_generation", "an integer in [1, 2^31 - 1]", self.fleet_generation)
        if self.holdout_scope != "fleet" and self.fleet_generation != 1:
            raise _refuse("fleet_generation", '1 unless holdout_scope = "fleet"', self.fleet_generation)
        if self.holdout_scope == "fleet" and self.theta is not None:
            raise _refuse("holdout_scope", '"stream" when theta is fixed (a fleet holdout chooses theta)',
                          self.holdout_scope)
        check_smoother(self.smoother, self.alpha, self.window)
        if self.threshold_epsilon is not None:
            check_positive("threshold_epsilon", self.threshold_epsilon)
        if self.theta is not None:
            if self.lower == 0:
                check_positive("theta", self.theta)
            elif not _is_real(self.theta) or not self.lower < self.theta <= sys.float_info.max:
                raise _refuse("theta", f"a number above lower ({self.lower})", self.theta)
            if self.theta > self.bound:
                raise _refuse("theta", f"at most bound ({self.bound})", self.theta)

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
            for name, default in (("holdout_grid", "exact"), ("holdout_scope", "stream"), ("fleet_generation", 1)):
                if d[name] == default:  # the default, left out: states and ledgers stored before it match
                    del d[name]
            if len(_AS_DICT) < 1024:
                _AS_DICT[self] = d
        return dict(d)

"""The fleet holdout: one threshold for the streams of a template, chosen from the first readings of its first streams.

ToPS (Wang et al., CCS 2021, Algorithm 1) holds out each stream's first ``m`` readings to choose its threshold theta,
so a stream releases nothing before its ``m``-th reading. The streams of one template (one kind of meter, one kind of
link) are alike, and a daemon sees many of them: with ``holdout_scope = "fleet"`` the first ``m`` readings that reach
the template, from whichever streams send them, form one holdout. When it is full, theta, the smoother layers s and
the smoother's start are chosen once from it, by the very choice a stream's own holdout makes (the calibrated error
model of :mod:`operators.selection`, or Eq. 6 and Eq. 7 with ``selection = "paper"``), and its statistics for error
bars are measured on it (:mod:`operators.error_stats`). Every stream of the template then releases from its next
reading with that choice (:meth:`FleetHoldout.member`), and a stream that appears after the choice releases from its
first reading.

Privacy (event level, one reading is one event). Each reading feeds exactly one of: the fleet holdout, whose only
outputs are the choice and the error statistics (``eps_T``-DP together, by sequential composition of their shares,
exactly as for one stream's holdout of ``m`` readings: the choice reads the multiset of holdout readings and its
sensitivity to one of them is the same whichever stream sent it), or its own stream's hierarchy (``eps``-DP). The two
sets are disjoint, so every reading is ``max(eps, eps_T)``-DP by parallel composition, as in a stream's own ToPS.
Holdout readings are never released.

What differs from a stream's own holdout is accuracy, not privacy: the choice fits the fleet, and the block
statistics that choose s are measured on the readings in arrival order, which interleaves the streams (the spread
of a block's sum is then the spread across streams as well as over time, so s tends to be smaller than one stream's
own holdout would choose).

>>> import numpy as np
>>> cfg = ToPSConfig(epsilon=1.0, bound=10, holdout=100, query_range=256, fanout=4)
>>> fleet = FleetHoldout(cfg, key=bytes(32))
>>> fleet.take(np.full(60, 3.0)), fleet.holdout_left, fleet.choice is None
(60, 40, True)
>>> fleet.take(np.full(60, 3.0))                       # the holdout takes 40; the other 20 are not its own
40
>>> fleet.choice.theta_units, fleet.holdout_left
(3, 0)
>>> op = fleet.member(bytes.fromhex("11" * 32))         # a stream of the template: releasing from its next reading
>>> op.phase, op.theta, bool(np.isfinite(op.process(np.full(5, 3.0))).all())
('releasing', 3.0, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from operators.config import ToPSConfig
from operators.selection import Selection
from operators.tops import ToPS

__all__ = ["FLEET_KEY_NAME", "FleetChoice", "FleetHoldout", "FleetMember"]

# The name a fleet holdout's key is derived under (as a stream's key is under its name): '#' is in no stream name.
FLEET_KEY_NAME = "#fleet"

_SNAPSHOT_VERSION = 1


@dataclass(frozen=True, slots=True)
class FleetChoice:
    """What a full fleet holdout chose (quantized units, as :class:`operators.selection.Selection`) and its statistics
    for error bars (:func:`operators.error_stats.measure`), which every stream released with it states."""

    selection: Selection
    error_stats: bytes

    @property
    def theta_units(self) -> int:
        return self.selection.theta_units

    def to_dict(self) -> dict[str, Any]:
        s = self.selection
        return {"theta_units": s.theta_units, "smoother_layers": s.smoother_layers, "start_units": s.start_units,
                "fallback": s.fallback, "error_stats": np.frombuffer(self.error_stats, dtype="<f8").tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FleetChoice:
        stats = np.asarray(d["error_stats"], dtype="<f8")
        if stats.ndim != 1 or not np.isfinite(stats).all():
            msg = "a fleet choice's error statistics must be finite numbers"
            raise ValueError(msg)
        s = d["smoother_layers"]
        start = d["start_units"]
        sel = Selection(int(d["theta_units"]), None if s is None else int(s), None if start is None else float(start),
                        bool(d["fallback"]))
        if sel.theta_units < 1:
            msg = "a fleet choice's theta must be at least one unit"
            raise ValueError(msg)
        return cls(sel, stats.tobytes())


class FleetHoldout:
    """The holdout of a template's fleet: the first ``config.holdout`` readings of its streams, in arrival order, then
    the choice every stream of the template releases with. ``key``: the fleet's own key (derived under
    :data:`FLEET_KEY_NAME`), which draws the choice's noise as a stream's key draws its own holdout's."""

    __slots__ = ("_holdout", "choice", "config")

    def __init__(self, config: ToPSConfig, key: bytes) -> None:
        if config.theta is not None:
            msg = "a fleet holdout chooses theta: the configuration must not fix one"
            raise ValueError(msg)
        self.config = config
        self._holdout: ToPS | None = ToPS(config, key)
        self.choice: FleetChoice | None = None

    @property
    def holdout_left(self) -> int:
        """Readings the fleet holdout still takes before the choice (0 once it is made)."""
        return 0 if self._holdout is None else self._holdout.holdout_left

    @property
    def taken(self) -> int:
        """Readings the fleet holdout took."""
        return self.config.holdout if self._holdout is None else self._holdout.ticks

    def take(self, values: Any) -> int:
        """The holdout takes the first of ``values`` it has room for (in order; none once the choice is made) and
        makes the choice when it took its last reading; returns how many it took."""
        op = self._holdout
        if op is None:
            return 0
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        n = min(v.size, op.holdout_left)
        if n:
            op.hold(v[:n])
            if op.holdout_left == 0:
                self._choose()
        return n

    def _choose(self) -> None:
        op = self._holdout
        assert op is not None
        sel = op._choice()
        self.choice = FleetChoice(sel, op.measure_error_stats(sel))
        self._holdout = None  # its readings are no longer needed: the choice is all the holdout outputs

    def member(self, key: bytes, held: int = 0) -> ToPS:
        """The operator of a stream of the template (its key) once the choice is made: releasing from its next
        reading with the fleet's theta, s and smoother start, and stating the fleet's error statistics. ``held``: the
        stream's readings the fleet holdout took, its ticks so far (its next reading is tick ``held``)."""
        if self.choice is None:
            msg = "the fleet holdout has not chosen yet"
            raise ValueError(msg)
        op = ToPS(self.config, key)
        op.adopt_choice(self.choice.selection, self.choice.error_stats)
        op.ticks = held
        return op

    def snapshot(self) -> dict[str, Any]:
        """JSON-serialisable state (no key, no reading: the holdout's histogram while it fills, then the choice), with
        what ``tops state`` shows of it: the readings it takes and has taken, and theta in value units once chosen."""
        cfg, choice = self.config, self.choice
        return {"version": _SNAPSHOT_VERSION, "generation": cfg.fleet_generation, "readings": cfg.holdout,
                "taken": self.taken,
                "theta": None if choice is None else cfg.lower + choice.theta_units * cfg.resolution,
                "holdout": None if self._holdout is None else self._holdout.snapshot(),
                "choice": None if choice is None else choice.to_dict()}

    @classmethod
    def restore(cls, config: ToPSConfig, key: bytes, snapshot: dict[str, Any]) -> FleetHoldout:
        if not isinstance(snapshot, dict) or snapshot.get("version") != _SNAPSHOT_VERSION \
                or snapshot.get("generation") != config.fleet_generation:
            msg = "unsupported fleet holdout snapshot (or of another generation)"
            raise ValueError(msg)
        fleet = cls(config, key)
        if snapshot.get("choice") is not None:
            fleet.choice = FleetChoice.from_dict(snapshot["choice"])
            fleet._holdout = None
        elif snapshot.get("holdout") is not None:
            fleet._holdout = ToPS.restore(config, key, snapshot["holdout"])
        return fleet


class FleetMember:
    """A stream of a fleet-holdout template that appeared before the fleet's choice, with its key: its readings go to
    the fleet holdout while it takes readings (NaN for each: they are never released), and once the choice is made
    the stream releases with it from its next reading, through its own ToPS (:attr:`successor`, from
    :meth:`FleetHoldout.member`), which takes the stream over at that phase change.

    While the fleet holdout takes readings, ``takes_reports`` is True: a daemon hands each reading to
    :meth:`observe_threshold` as it arrives (as a local stream's holdout reports are), so the fleet's holdout is the
    template's readings in their order of arrival, whatever the batches they came in. Those readings are ticks of
    their stream (``reports_are_ticks``), released by none, as a stream's own holdout readings are. With period ticks
    (``at_intake`` False) a tick is a period's value, which :meth:`process` takes when the period closes."""

    __slots__ = ("_fleet", "_key", "at_intake", "held", "successor")
    reports_are_ticks = True

    def __init__(self, fleet: FleetHoldout, key: bytes, held: int = 0, *, at_intake: bool = True) -> None:
        self._fleet = fleet
        self._key = key
        self.held = held  # the stream's readings the fleet holdout took
        self.at_intake = at_intake  # False with period ticks: a tick is a period's value, taken when it closes
        self.successor: ToPS | None = None

    def __repr__(self) -> str:
        return f"FleetMember(phase={self.phase!r}, key=<secret>)"

    @property
    def config(self) -> ToPSConfig:
        return self._fleet.config

    @property
    def takes_reports(self) -> bool:
        return self.at_intake and self.successor is None and self._fleet.choice is None

    @property
    def phase(self) -> str:
        return "holdout" if self.successor is None else "releasing"

    @property
    def holdout_left(self) -> int:
        """Readings the fleet holdout still takes (of any stream of the template)."""
        return self._fleet.holdout_left

    @property
    def ticks(self) -> int:
        return self.held if self.successor is None else self.successor.ticks

    @property
    def clamped(self) -> int:
        return 0 if self.successor is None else self.successor.clamped

    @property
    def theta(self) -> float | None:
        return None if self.successor is None else self.successor.theta

    @property
    def theta_units(self) -> int | None:
        return None if self.successor is None else self.successor.theta_units

    @property
    def smoother_layers(self) -> int | None:
        return None if self.successor is None else self.successor.smoother_layers

    @property
    def error_stats(self) -> bytes | None:
        return None if self.successor is None else self.successor.error_stats

    def observe_threshold(self, values: Any) -> int:
        """Readings for the fleet holdout (in their order of arrival); returns how many it took (the others come back
        through :meth:`process` once the choice is made)."""
        n = self._fleet.take(values)
        self.held += n
        return n

    def process(self, values: Any) -> np.ndarray:
        """Readings of the stream: those the fleet holdout still takes (NaN each), then the others released with the
        fleet's choice."""
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        out = np.full(v.size, np.nan)
        done = 0 if self.successor is not None else self.observe_threshold(v)
        if done < v.size:
            if self.successor is None:
                self.successor = self._fleet.member(self._key, self.held)
            out[done:] = self.successor.process(v[done:])
        return out

    def process_one(self, value: float) -> float:
        if self.successor is None:
            return float(self.process(np.array([value], dtype=np.float64))[0])
        return self.successor.process_one(value)

    def snapshot(self) -> dict[str, Any]:
        """What the stream keeps of its own (no key, no reading): how many of its readings the fleet holdout took.
        The holdout itself is the fleet's (:meth:`FleetHoldout.snapshot`)."""
        return {"version": _SNAPSHOT_VERSION, "fleet_member": True, "held": self.held}

    @staticmethod
    def held_in(snapshot: Any) -> int | None:
        """The readings a stored member gave the fleet holdout (its :meth:`snapshot`), None for another stream's
        snapshot; ``ValueError`` for a member's snapshot that does not hold a count."""
        if not isinstance(snapshot, dict) or not snapshot.get("fleet_member"):
            return None
        held = snapshot.get("held")
        if type(held) is not int or not 0 <= held <= 2**62:
            msg = "a fleet member's snapshot must hold the count of its readings the fleet holdout took"
            raise ValueError(msg)
        return held

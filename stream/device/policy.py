"""What a local-mode device decides for itself: pinned limits, its own privacy account, its sequence numbers.

In local mode the server and the broker are the adversary (DESIGN.md, "Noise and secrets"): the control message
only *proposes* parameters. A device accepts a control message only inside the limits its owner pinned
(:class:`DeviceLimits`), keeps its own account of the epsilon each reading was reported at (:class:`SpentAccount`),
and numbers its reports with a monotone ``seq`` that a restart does not reuse (:class:`SequenceNumbers`,
:class:`DeviceState`).

Privacy accounting. Each reading is perturbed and reported exactly once (Square Wave, Eq. 16, at the threshold
phase's epsilon, or the Hybrid mechanism, Eq. 22, at the stream phase's epsilon), so each reading is protected by
eps-LDP with eps the epsilon of that one report; the set of ``k`` readings of a device is protected at the sum of
their epsilons (sequential composition).

>>> limits = DeviceLimits(max_epsilon=1.0, bound=100.0)
>>> acc = SpentAccount()
>>> acc.add("threshold", 0.5, 3); acc.add("stream", 1.0, 2)
>>> acc.to_dict()["max_epsilon_per_reading"], acc.to_dict()["total_epsilon"]
(1.0, 3.5)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import tomllib
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EPSILON_CEILING",
    "SEQ_LIMIT",
    "DeviceLimits",
    "DeviceState",
    "SequenceNumbers",
    "SpentAccount",
    "limits_problems",
    "load_limits_file",
]

EPSILON_CEILING = 50.0  # no owner limit above this: at eps 50 a report is the reading, for all purposes
SEQ_LIMIT = 1 << 63  # the daemon takes seq in [0, 2^63)
SEQ_RESERVE = 1 << 20  # seq numbers reserved in the state file ahead of use (one small write per ~1 M reports)
MECHANISM_NAMES = ("square_wave", "hybrid", "grr", "hr")  # grr, hr: categorical streams
PHASES = ("threshold", "stream", "categorical", "range")
_OPTIONAL_PHASES = ("categorical", "range")  # shown once used; absent from accounts saved before they existed
_LIMIT_KEYS = ("max_epsilon", "max_threshold_epsilon", "bound", "lower", "mechanisms")


def _positive(value: Any, upper: float = math.inf) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        x = float(value)
    except OverflowError:
        return False
    return math.isfinite(x) and 0 < x <= upper


@dataclass(frozen=True, slots=True)
class DeviceLimits:
    """The parameters a device's owner pins; a control message outside them is refused.

    ``max_epsilon`` bounds the stream phase (Hybrid) epsilon, ``max_threshold_epsilon`` (default: the same) the
    threshold phase (Square Wave) epsilon. ``bound``, when pinned, is the only ``B`` a threshold-phase control may
    carry, and theta must lie in ``(0, bound]``; unpinned, the first accepted ``B`` is pinned for the device's life
    (and kept in its state file). ``lower`` is the lower end of the readings' range (only 0 is supported by the
    local randomizers). ``mechanisms`` lists the randomizers the device runs.
    """

    max_epsilon: float
    max_threshold_epsilon: float | None = None
    bound: float | None = None
    lower: float = 0.0
    mechanisms: tuple[str, ...] = MECHANISM_NAMES

    def __post_init__(self) -> None:
        problems = limits_problems(
            self.max_epsilon, self.max_threshold_epsilon, self.bound, self.lower, self.mechanisms
        )
        if problems:
            raise ValueError(problems[0])
        object.__setattr__(self, "max_epsilon", float(self.max_epsilon))
        if self.max_threshold_epsilon is not None:
            object.__setattr__(self, "max_threshold_epsilon", float(self.max_threshold_epsilon))
        if self.bound is not None:
            object.__setattr__(self, "bound", float(self.bound))
        object.__setattr__(self, "mechanisms", tuple(self.mechanisms))

    @property
    def threshold_epsilon_limit(self) -> float:
        return self.max_epsilon if self.max_threshold_epsilon is None else self.max_threshold_epsilon

    def epsilon_limit(self, phase: str) -> float:
        """The largest epsilon this device reports at in ``phase``."""
        return self.threshold_epsilon_limit if phase == "threshold" else self.max_epsilon

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_epsilon": self.max_epsilon,
            "max_threshold_epsilon": self.threshold_epsilon_limit,
            "bound": self.bound,
            "lower": self.lower,
            "mechanisms": list(self.mechanisms),
        }


def limits_problems(
    max_epsilon: Any, max_threshold_epsilon: Any = None, bound: Any = None, lower: Any = 0.0, mechanisms: Any = None
) -> list[str]:
    """One line per problem with these limits (empty: they are valid)."""
    out: list[str] = []
    if max_epsilon is None:
        out.append(f"max_epsilon is required: a number in (0, {EPSILON_CEILING:g}]")
    elif not _positive(max_epsilon, EPSILON_CEILING):
        out.append(f"max_epsilon must be a number in (0, {EPSILON_CEILING:g}]")
    if max_threshold_epsilon is not None and not _positive(max_threshold_epsilon, EPSILON_CEILING):
        out.append(f"max_threshold_epsilon must be a number in (0, {EPSILON_CEILING:g}]")
    if bound is not None and not _positive(bound, 1e15):
        out.append("bound must be a positive number (at most 1e15)")
    if isinstance(lower, bool) or not isinstance(lower, int | float) or lower != 0:
        out.append("lower must be 0 (the local randomizers report readings in [0, bound])")
    if mechanisms is not None:
        if (
            not isinstance(mechanisms, list | tuple)
            or not mechanisms
            or any(m not in MECHANISM_NAMES for m in mechanisms)
        ):
            out.append(f"mechanisms must be a non-empty list of {', '.join(MECHANISM_NAMES)}")
    return out


def load_limits_file(path: str) -> tuple[dict[str, Any], list[str]]:
    """The pinned limits of a TOML device file (keys: max_epsilon, max_threshold_epsilon, bound, lower,
    mechanisms) and one line per problem."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        return {}, [f"cannot read the limits file ({exc.strerror})"]
    except tomllib.TOMLDecodeError as exc:
        return {}, [f"the limits file is not valid TOML ({exc})"]
    problems = [f"unknown key {k!r} in the limits file (allowed: {', '.join(_LIMIT_KEYS)})" for k in doc
                if k not in _LIMIT_KEYS]
    return {k: v for k, v in doc.items() if k in _LIMIT_KEYS}, problems


@dataclass(slots=True)
class _PhaseAccount:
    readings: int = 0
    max_epsilon: float = 0.0
    total_epsilon: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"readings": self.readings, "max_epsilon": self.max_epsilon, "total_epsilon": self.total_epsilon}


@dataclass(slots=True)
class SpentAccount:
    """What a device spent, per phase: readings reported (each exactly once), the largest epsilon one of them was
    reported at, and the sum of their epsilons (sequential composition over the set of readings)."""

    phases: dict[str, _PhaseAccount] = field(default_factory=lambda: {p: _PhaseAccount() for p in PHASES})

    def add(self, phase: str, epsilon: float, readings: int) -> None:
        if readings <= 0:
            return
        a = self.phases[phase]
        a.readings += readings
        a.max_epsilon = max(a.max_epsilon, epsilon)
        a.total_epsilon = math.fsum((a.total_epsilon, epsilon * readings))

    @property
    def readings(self) -> int:
        return sum(a.readings for a in self.phases.values())

    @property
    def max_epsilon_per_reading(self) -> float:
        """The guarantee of every reading reported so far: each is eps-LDP at the epsilon of its one report."""
        return max(a.max_epsilon for a in self.phases.values())

    @property
    def total_epsilon(self) -> float:
        return math.fsum(a.total_epsilon for a in self.phases.values())

    def to_dict(self) -> dict[str, Any]:
        # a numeric device's account keeps its two phases; the categorical one appears once used
        out: dict[str, Any] = {p: a.to_dict() for p, a in self.phases.items()
                               if p not in _OPTIONAL_PHASES or a.readings}
        out.update(
            readings=self.readings,
            max_epsilon_per_reading=self.max_epsilon_per_reading,
            total_epsilon=self.total_epsilon,
        )
        return out

    @classmethod
    def from_dict(cls, doc: Any) -> SpentAccount:
        """The account saved by :meth:`to_dict`; ValueError when it is not one."""
        acc = cls()
        if not isinstance(doc, dict):
            raise ValueError("account")
        for p in PHASES:
            d = doc.get(p)
            if d is None and p in _OPTIONAL_PHASES:  # saved before such streams existed
                continue
            if not isinstance(d, dict):
                raise ValueError("account")
            n, m, t = d.get("readings"), d.get("max_epsilon"), d.get("total_epsilon")
            if type(n) is not int or n < 0 or not all(_positive(x) or x == 0 for x in (m, t)):
                raise ValueError("account")
            acc.phases[p] = _PhaseAccount(n, float(m), float(t))
        return acc

    def line(self) -> str:
        """One log line: counts and epsilons only, never a reading."""
        th, st = self.phases["threshold"], self.phases["stream"]
        cat = "".join(f", {p} {a.readings} at eps <= {a.max_epsilon:g} (sum {a.total_epsilon:g})"
                      for p in _OPTIONAL_PHASES if (a := self.phases[p]).readings)
        return (
            f"account: {self.readings} readings, each reported once; threshold phase {th.readings} at eps <= "
            f"{th.max_epsilon:g} (sum {th.total_epsilon:g}), stream phase {st.readings} at eps <= "
            f"{st.max_epsilon:g} (sum {st.total_epsilon:g}){cat}; every reading is eps-LDP at the epsilon of its one "
            f"report, at most {self.max_epsilon_per_reading:g}; all readings together at most "
            f"{self.total_epsilon:g}"
        )


def _now_us() -> int:
    return time.time_ns() // 1000


class SequenceNumbers:
    """Report ``seq``: each ``max(previous + 1, now in microseconds)``, never below ``floor``.

    Time-based, so a restarted device continues above the numbers it used before unless its clock went back or it
    reported more than a million readings a second; a state file (:class:`DeviceState`) closes both gaps by
    starting from the numbers it reserved.
    """

    def __init__(self, floor: int = 0) -> None:
        if type(floor) is not int or not 0 <= floor < SEQ_LIMIT:
            raise ValueError("seq floor must be an integer in [0, 2^63)")
        self.next = floor

    def peek(self, count: int) -> int:
        """The first number :meth:`take` would return for ``count`` readings now (its last is that + count - 1)."""
        return max(self.next, _now_us())

    def take(self, count: int) -> int:
        """The first of ``count`` consecutive numbers."""
        start = self.peek(count)
        if start + count > SEQ_LIMIT:
            raise OverflowError("seq numbers exhausted")
        self.next = start + count
        return start


class DeviceState:
    """A small JSON file a device keeps: its stream, the pinned bound, the reserved seq numbers and its account.

    Written atomically (temporary file, fsync, rename). ``seq_reserved`` is written *before* a report with a
    number at or above the previous reservation is made, so a restart never reuses a number.
    """

    def __init__(self, path: str, stream: str) -> None:
        self.path = path
        self.stream = stream
        self.seq_reserved = 0
        self.bound: float | None = None
        self.account = SpentAccount()
        self.refused = 0

    def load(self) -> None:
        """Read the file if it exists; ValueError (a one-line reason) when it is not this stream's state."""
        try:
            with open(self.path, encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ValueError(f"cannot read the state file ({exc.strerror})") from None
        except (ValueError, RecursionError):
            raise ValueError("the state file is not JSON") from None
        if not isinstance(doc, dict) or doc.get("stream") != self.stream:
            raise ValueError("the state file belongs to another stream")
        seq, bound = doc.get("seq_reserved"), doc.get("bound")
        if type(seq) is not int or not 0 <= seq < SEQ_LIMIT or not (bound is None or _positive(bound, 1e15)):
            raise ValueError("the state file is damaged")
        try:
            self.account = SpentAccount.from_dict(doc.get("account"))
        except ValueError:
            raise ValueError("the state file is damaged") from None
        refused = doc.get("refused", 0)
        self.seq_reserved, self.bound = seq, None if bound is None else float(bound)
        self.refused = refused if type(refused) is int and refused >= 0 else 0

    def to_dict(self, limits: DeviceLimits | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "stream": self.stream,
            "seq_reserved": self.seq_reserved,
            "bound": self.bound,
            "account": self.account.to_dict(),
            "refused": self.refused,
            "updated": round(time.time(), 3),
        }
        if limits is not None:
            doc["limits"] = limits.to_dict()
        return doc

    def save(self, limits: DeviceLimits | None = None) -> None:
        tmp = f"{self.path}.tmp"
        data = json.dumps(self.to_dict(limits), separators=(",", ":")).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        with contextlib.suppress(OSError):
            dfd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

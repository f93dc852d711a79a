"""What a local-mode device decides for itself: pinned limits, its own privacy account, its sequence numbers.

In local mode the server and the broker are the adversary (docs/local.md): the control message
only *proposes* parameters. A device accepts a control message only inside the limits its owner pinned
(:class:`DeviceLimits`), keeps its own account of the epsilon each reading was reported at (:class:`SpentAccount`),
numbers its reports with a monotone ``seq`` that a restart does not reuse (:class:`SequenceNumbers`,
:class:`DeviceState`), and in the threshold phase reports no more readings than the server still takes
(:class:`HoldoutShare`), keeping the others unspent for the stream phase.

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
    "HoldoutShare",
    "InputPosition",
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


@dataclass(slots=True)
class HoldoutShare:
    """Where this device's threshold-phase reports reach in the server's count of holdout reports.

    A threshold-phase control message says ``received`` (holdout reports the server has counted) and ``take`` (how
    many more it takes in the current round). ``seen`` is the ``received`` of the last such message; ``mark`` is
    that count plus the reports this device sent since: the count the server reaches once they arrive. A message
    republished before they arrived (the retained one, a periodic status) repeats an older ``received``; counting
    from ``mark`` instead keeps the device from sending the same share twice.

    >>> h = HoldoutShare()
    >>> h.follow(received=0, take=13)           # a new round: 13 reports
    13
    >>> h.sent(13); h.follow(received=5, take=8)  # 8 of mine are still in flight: nothing more
    0
    >>> h.follow(received=13, take=12)          # all counted, the next round
    12
    >>> h.follow(received=0, take=100)          # the server counts less than before (it lost its state)
    100
    """

    seen: int = 0
    mark: int = 0

    def follow(self, received: int, take: int) -> int:
        """The reports this device may send now: up to the round's end ``received + take``, counted from
        ``max(mark, received)``."""
        if received < self.seen:
            self.mark = received
        self.seen = received
        self.mark = max(self.mark, received)
        return max(0, received + take - self.mark)

    def sent(self, reports: int) -> None:
        self.mark += reports

    def to_dict(self) -> dict[str, int]:
        return {"seen": self.seen, "mark": self.mark}

    @classmethod
    def from_dict(cls, doc: Any) -> HoldoutShare:
        """The share saved by :meth:`to_dict`; ValueError when it is not one."""
        if doc is None:
            return cls()
        if not isinstance(doc, dict) or not all(type(doc.get(k)) is int and 0 <= doc[k] < SEQ_LIMIT
                                                for k in ("seen", "mark")) or doc["mark"] < doc["seen"]:
            raise ValueError("holdout")
        return cls(doc["seen"], doc["mark"])


@dataclass(slots=True)
class InputPosition:
    """How far a device has taken its input file: the bytes up to ``offset`` hold readings already reported or kept
    in the state file. A restart on the same file (same device and inode) continues there, so no reading is
    reported twice."""

    path: str
    device: int
    inode: int
    offset: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "device": self.device, "inode": self.inode, "offset": self.offset}

    @classmethod
    def from_dict(cls, doc: Any) -> InputPosition | None:
        """The position saved by :meth:`to_dict` (None: none saved); ValueError when it is not one."""
        if doc is None:
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("path"), str) or not all(
                type(doc.get(k)) is int and doc[k] >= 0 for k in ("device", "inode", "offset")):
            raise ValueError("input")
        return cls(doc["path"], doc["device"], doc["inode"], doc["offset"])


def _pending(doc: Any) -> list[tuple[float, float]]:
    """Readings held unreported, ``[[value, ts], ...]``; ValueError when damaged."""
    doc = [] if doc is None else doc
    if not isinstance(doc, list):
        raise ValueError("pending")
    out = []
    for item in doc:
        if (not isinstance(item, list) or len(item) != 2
                or not all(not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x) for x in item)):
            raise ValueError("pending")
        out.append((float(item[0]), float(item[1])))
    return out


def _outbox(doc: Any) -> list[dict[str, Any]]:
    """Reports made and paid for but not known to be published; ValueError when damaged."""
    doc = [] if doc is None else doc
    if not isinstance(doc, list) or not all(
            isinstance(r, dict) and r.get("phase") in PHASES and not isinstance(r.get("report"), bool)
            and isinstance(r.get("report"), int | float) and math.isfinite(r["report"]) for r in doc):
        raise ValueError("outbox")
    return doc


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
    """A small JSON file a device keeps: its stream, the pinned bound, the reserved seq numbers, its account, and
    what a restart must continue: the readings held unreported (``pending``, raw: the file is the device's own, mode
    0600), the reports paid for and not yet published (``outbox``), its share of the holdout and its position in
    its input file.

    Written atomically (temporary file, fsync, rename). ``seq_reserved`` is written *before* a report with a
    number at or above the previous reservation is made, so a restart never reuses a number; the device writes the
    file after it perturbs readings and before it publishes the reports, so the account on disk is never below
    what was published.
    """

    def __init__(self, path: str, stream: str) -> None:
        self.path = path
        self.stream = stream
        self.seq_reserved = 0
        self.bound: float | None = None
        self.account = SpentAccount()
        self.refused = 0
        self.pending: list[tuple[float, float]] = []
        self.outbox: list[dict[str, Any]] = []
        self.holdout = HoldoutShare()
        self.input: InputPosition | None = None

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
            self.pending, self.outbox = _pending(doc.get("pending")), _outbox(doc.get("outbox"))
            self.holdout = HoldoutShare.from_dict(doc.get("holdout"))
            self.input = InputPosition.from_dict(doc.get("input"))
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
            "holdout": self.holdout.to_dict(),
            "pending": [list(p) for p in self.pending],
            "outbox": self.outbox,
        }
        if self.input is not None:
            doc["input"] = self.input.to_dict()
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

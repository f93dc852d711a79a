"""The control messages of local mode: what the daemon proposes to devices, parsed and checked for form.

The control message of stream ``s`` is a retained JSON object on ``tops/control/{stream}``::

    {"stream": s, "phase": "threshold", "epsilon": e1, "bound": B, "mechanism": "square_wave", "sw_b": b,
     "received": r, "take": k}
    {"stream": s, "phase": "stream", "epsilon": e2, "theta": t, "mechanism": "hybrid"}
    {"stream": s, "phase": "categorical", "epsilon": e, "mechanism": "grr" | "hr", "categories": d}
    {"stream": s, "phase": "range", "epsilon": e, "mechanism": "flat" | "tree", "lower": l, "width": w,
     "buckets": d, "fanout": b}

In the threshold phase ``received`` is the number of holdout reports the server has counted and ``take`` how many
more it takes in the current round (over the current ``domain``): a device reports at most that many readings and
keeps the others for the next control message, so no reading is spent on a report the server then drops as stale.
A message without them (an older daemon) sets no limit.

The daemon (:mod:`stream.daemon.service`) publishes them; a device (:mod:`stream.device.client`) parses them here and
then checks them against its own pinned limits. Parsing refuses whatever no honest daemon sends (NaN, ``1e400``, a
domain above the bound, an unknown phase or mechanism) with :class:`ControlError`.

>>> parse_control(threshold_control("m1", 1.0, 100.0)).phase
'threshold'
>>> categorical_control("r", 1.0, "grr", 6)["categories"]
6
>>> parse_control(range_control("kwh", 1.0, "tree", 0.0, 0.5, 16, 4)).layout().total
36
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from typing import Any

from operators.categorical.release import LOCAL_MECHANISMS, MAX_DENSE_CELLS, report_outputs
from operators.local.hybrid import hybrid_scale
from operators.local.square_wave import square_wave_parameters
from operators.ranges.local import ReportLayout
from operators.ranges.release import MAX_BUCKETS, RANGE_MECHANISMS

__all__ = [
    "CATEGORICAL_MECHANISMS",
    "DEFAULT_CONTROL_TOPIC",
    "DEFAULT_REPORT_TOPIC",
    "MAX_CATEGORIES",
    "MAX_COUNT",
    "MECHANISMS",
    "PHASE_CATEGORICAL",
    "PHASE_RANGE",
    "PHASE_STREAM",
    "PHASE_THRESHOLD",
    "Control",
    "ControlError",
    "categorical_control",
    "parse_control",
    "range_control",
    "stream_control",
    "threshold_control",
]

DEFAULT_CONTROL_TOPIC = "tops/control/{stream}"
DEFAULT_REPORT_TOPIC = "meters/{stream}/report"
PHASE_THRESHOLD = "threshold"
PHASE_STREAM = "stream"
PHASE_CATEGORICAL = "categorical"  # a categorical stream (operators/categorical/release.py): one phase, no holdout
PHASE_RANGE = "range"  # a local range-counting stream (operators/ranges/release.py): one phase, no holdout
MECHANISMS = {PHASE_THRESHOLD: "square_wave", PHASE_STREAM: "hybrid"}
CATEGORICAL_MECHANISMS = LOCAL_MECHANISMS
MAX_CATEGORIES = MAX_DENSE_CELLS
_MAX_CONTROL_BYTES = 4096
MAX_COUNT = 1 << 53  # received and take: exact in a JSON double


class ControlError(ValueError):
    """A control message is malformed, for another stream, or outside the device's pinned limits.

    ``reason`` is a short label (``malformed``, ``stream``, ``epsilon``, ``threshold_epsilon``, ``bound``,
    ``theta``, ``lower``, ``mechanism``) for counting; the message holds no reading.
    """

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Control:
    """A validated control message: the phase and the parameters of its randomizer."""

    stream: str
    phase: str
    epsilon: float
    bound: float | None = None
    sw_b: float | None = None
    theta: float | None = None
    lower: float = 0.0
    mechanism: str = ""
    domain: float | None = None  # threshold phase: Square Wave over [0, domain] (the fine round), else [0, bound]
    categories: int | None = None  # phase categorical: d, categories are 0 .. d - 1
    width: float | None = None  # phase range: bucket width; buckets and fanout of the tree, mechanism flat or tree
    buckets: int | None = None
    fanout: int | None = None
    received: int | None = None  # threshold phase: holdout reports the server has counted
    take: int | None = None  # threshold phase: reports it still takes in this round (None: no limit said)

    def layout(self) -> ReportLayout:
        """Phase range: the one-number report layout (the same the server estimates with)."""
        assert self.buckets is not None and self.fanout is not None
        return ReportLayout(self.buckets, self.fanout, self.epsilon, tree=self.mechanism == "tree")

    def bucket_of(self, values: Any) -> Any:
        """Phase range: the buckets of readings, clamped to ``0 .. buckets - 1`` (as the central stream does)."""
        import numpy as np

        assert self.width is not None and self.buckets is not None
        k = np.floor((np.asarray(values, dtype=np.float64) - self.lower) / self.width)
        return np.clip(k, 0, self.buckets - 1).astype(np.int64)

    @property
    def sw_domain(self) -> float:
        assert self.bound is not None
        return self.bound if self.domain is None else self.domain

    def report_range(self) -> tuple[float, float]:
        """The interval every honest report of this phase lies in (the server may reject reports outside it)."""
        if self.phase == PHASE_CATEGORICAL:
            assert self.categories is not None
            return 0.0, float(report_outputs(self.mechanism, self.epsilon, self.categories) - 1)
        if self.phase == PHASE_RANGE:
            return 0.0, float(self.layout().total - 1)
        if self.phase == PHASE_THRESHOLD:
            assert self.bound is not None and self.sw_b is not None
            return -self.sw_b * self.sw_domain, (1.0 + self.sw_b) * self.sw_domain
        assert self.theta is not None
        s = hybrid_scale(self.epsilon)
        return 0.5 * self.theta * (1.0 - s), 0.5 * self.theta * (1.0 + s)

    def to_message(self) -> dict[str, Any]:
        """The JSON object the daemon publishes (retained) on the control topic."""
        msg: dict[str, Any] = {"stream": self.stream, "phase": self.phase, "epsilon": self.epsilon}
        if self.phase == PHASE_CATEGORICAL:
            msg.update(mechanism=self.mechanism, categories=self.categories)
        elif self.phase == PHASE_RANGE:
            msg.update(mechanism=self.mechanism, lower=self.lower, width=self.width, buckets=self.buckets,
                       fanout=self.fanout)
        elif self.phase == PHASE_THRESHOLD:
            msg.update(bound=self.bound, mechanism=MECHANISMS[PHASE_THRESHOLD], sw_b=self.sw_b)
            if self.domain is not None:
                msg["domain"] = self.domain
            if self.take is not None:
                msg.update(received=self.received, take=self.take)
        else:
            msg.update(theta=self.theta, mechanism=MECHANISMS[PHASE_STREAM])
        return msg


def _number(msg: dict[str, Any], name: str, *, upper: float = math.inf) -> float:
    """A positive finite number below ``upper``; huge integers, NaN and infinities (``1e400``) are refused."""
    value = msg.get(name)
    x = math.nan
    if not isinstance(value, bool) and isinstance(value, int | float):
        with contextlib.suppress(OverflowError):
            x = float(value)
    if not (math.isfinite(x) and 0 < x < upper):
        text = f"control field {name!r} must be a positive number"
        raise ControlError(text + (f" below {upper:g}" if math.isfinite(upper) else ""))
    return x


def parse_control(message: Any, stream: str | None = None) -> Control:
    """Validate a control message (dict, JSON text or bytes); ``stream`` must match when given."""
    if isinstance(message, bytes | bytearray):
        if len(message) > _MAX_CONTROL_BYTES:
            msg = "control message too large"
            raise ControlError(msg)
        message = message.decode("utf-8", errors="replace")
    if isinstance(message, str):
        try:
            message = json.loads(message)
        except (ValueError, RecursionError):
            msg = "control message is not JSON"
            raise ControlError(msg) from None
    if not isinstance(message, dict):
        msg = "control message must be a JSON object"
        raise ControlError(msg)
    name = message.get("stream")
    if not isinstance(name, str) or not name:
        msg = "control field 'stream' must be a non-empty string"
        raise ControlError(msg)
    if stream is not None and name != stream:
        msg = "control message is for another stream"
        raise ControlError(msg, "stream")
    phase = message.get("phase")
    if phase == PHASE_CATEGORICAL:
        mech = message.get("mechanism")
        if mech not in CATEGORICAL_MECHANISMS:
            msg = f"control field 'mechanism' must be one of {', '.join(CATEGORICAL_MECHANISMS)} in phase categorical"
            raise ControlError(msg, "mechanism")
        d = message.get("categories")
        if type(d) is not int or not 2 <= d <= MAX_CATEGORIES:
            msg = f"control field 'categories' must be an integer in [2, {MAX_CATEGORIES}]"
            raise ControlError(msg, "categories")
        epsilon = _number(message, "epsilon", upper=30)
        return Control(stream=name, phase=phase, epsilon=epsilon, mechanism=mech, categories=d)
    if phase == PHASE_RANGE:
        return _parse_range(message, name)
    if phase not in MECHANISMS:
        msg = (f"control field 'phase' must be {PHASE_THRESHOLD!r}, {PHASE_STREAM!r}, {PHASE_CATEGORICAL!r} or "
               f"{PHASE_RANGE!r}")
        raise ControlError(msg)
    if message.get("mechanism", MECHANISMS[phase]) != MECHANISMS[phase]:
        msg = f"control field 'mechanism' must be {MECHANISMS[phase]!r} in phase {phase!r}"
        raise ControlError(msg, "mechanism")
    lower = message.get("lower", 0.0)
    if isinstance(lower, bool) or not isinstance(lower, int | float) or not -1e15 <= lower <= 1e15:
        msg = "control field 'lower' must be a number"
        raise ControlError(msg)
    epsilon = _number(message, "epsilon", upper=700)
    if phase == PHASE_THRESHOLD:
        bound = _number(message, "bound")
        sw_b = _number(message, "sw_b", upper=1e6) if "sw_b" in message else square_wave_parameters(epsilon)[0]
        if not math.isfinite(bound):
            msg = "control field 'bound' must be finite"
            raise ControlError(msg)
        domain = None
        if message.get("domain") is not None:
            domain = _number(message, "domain")
            if domain > bound:
                msg = "control field 'domain' must not exceed 'bound'"
                raise ControlError(msg, "bound")
            if domain == bound:
                domain = None
        received, take = _holdout_counts(message)
        return Control(stream=name, phase=phase, epsilon=epsilon, bound=bound, sw_b=sw_b, lower=float(lower),
                       mechanism=MECHANISMS[phase], domain=domain, received=received, take=take)
    theta = _number(message, "theta")
    if not math.isfinite(theta):
        msg = "control field 'theta' must be finite"
        raise ControlError(msg)
    return Control(stream=name, phase=phase, epsilon=epsilon, theta=theta, lower=float(lower),
                   mechanism=MECHANISMS[phase])


def _count(message: dict[str, Any], name: str) -> int:
    value = message.get(name)
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        msg = f"control field {name!r} must be an integer in [0, 2^53]"
        raise ControlError(msg)
    return value


def _holdout_counts(message: dict[str, Any]) -> tuple[int | None, int | None]:
    """``received`` and ``take`` of a threshold-phase message: both or neither (an older daemon: no limit)."""
    if "take" not in message and "received" not in message:
        return None, None
    return _count(message, "received"), _count(message, "take")


def _parse_range(message: dict[str, Any], name: str) -> Control:
    mech = message.get("mechanism")
    if mech not in RANGE_MECHANISMS:
        msg = f"control field 'mechanism' must be one of {', '.join(RANGE_MECHANISMS)} in phase range"
        raise ControlError(msg, "mechanism")
    d, b = message.get("buckets"), message.get("fanout")
    if type(d) is not int or not 2 <= d <= MAX_BUCKETS:
        msg = f"control field 'buckets' must be an integer in [2, {MAX_BUCKETS}]"
        raise ControlError(msg, "buckets")
    if type(b) is not int or not 2 <= b <= 64:
        msg = "control field 'fanout' must be an integer in [2, 64]"
        raise ControlError(msg, "fanout")
    lower = message.get("lower", 0.0)
    if isinstance(lower, bool) or not isinstance(lower, int | float) or not -1e15 <= lower <= 1e15:
        msg = "control field 'lower' must be a number"
        raise ControlError(msg)
    width = _number(message, "width", upper=1e15)
    epsilon = _number(message, "epsilon", upper=30)
    return Control(stream=name, phase=PHASE_RANGE, epsilon=epsilon, lower=float(lower), mechanism=mech,
                   width=width, buckets=d, fanout=b)


def range_control(stream: str, epsilon: float, mechanism: str, lower: float, width: float, buckets: int,
                  fanout: int) -> dict[str, Any]:
    """The control message of a local range-counting stream (devices bucket their readings and report one level)."""
    return parse_control({"stream": stream, "phase": PHASE_RANGE, "epsilon": float(epsilon), "mechanism": mechanism,
                          "lower": float(lower), "width": float(width), "buckets": int(buckets),
                          "fanout": int(fanout)}).to_message()


def threshold_control(
    stream: str, epsilon: float, bound: float, sw_b: float | None = None, domain: float | None = None,
    received: int | None = None, take: int | None = None,
) -> dict[str, Any]:
    """The phase-1 control message (Square Wave on ``[0, bound]``, or on ``[0, domain]`` in the fine round;
    ``sw_b`` from Eq. 16 unless given); with ``take``, the server has counted ``received`` holdout reports and takes
    ``take`` more in this round."""
    b = square_wave_parameters(epsilon, sw_b)[0]
    dom = None if domain is None or domain >= bound else float(domain)
    counts = (None, None) if take is None else (int(received or 0), int(take))
    return Control(
        stream=stream, phase=PHASE_THRESHOLD, epsilon=float(epsilon), bound=float(bound), sw_b=b, domain=dom,
        received=counts[0], take=counts[1],
    ).to_message()


def categorical_control(stream: str, epsilon: float, mechanism: str, categories: int) -> dict[str, Any]:
    """The control message of a local categorical stream (GRR or Hadamard Response over ``categories``)."""
    return parse_control({"stream": stream, "phase": PHASE_CATEGORICAL, "epsilon": float(epsilon),
                          "mechanism": mechanism, "categories": int(categories)}).to_message()


def stream_control(stream: str, epsilon: float, theta: float) -> dict[str, Any]:
    """The phase-2 control message (truncate to ``[0, theta]``, Hybrid mechanism at ``epsilon``)."""
    return parse_control(
        {"stream": stream, "phase": PHASE_STREAM, "epsilon": epsilon, "theta": theta, "mechanism": "hybrid"}
    ).to_message()

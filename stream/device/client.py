"""The device side of local-DP mode (ToPL): check the stream's control message against the device's own pinned
limits, perturb readings, publish reports, and keep an account of the epsilon spent.

Protocol (the daemon publishes, devices decide). The control message of stream ``s`` is a retained JSON object on
``tops/control/{stream}``::

    {"stream": s, "phase": "threshold", "epsilon": e1, "bound": B, "mechanism": "square_wave", "sw_b": b,
     "received": r, "take": k}
    {"stream": s, "phase": "stream", "epsilon": e2, "theta": t, "mechanism": "hybrid"}

In local mode the server and the broker are the adversary: a control message only proposes. The device accepts it
only inside its pinned :class:`~stream.device.policy.DeviceLimits` (epsilon per phase, the bound ``B``, theta in
``(0, B]``, the mechanisms it runs); anything else (too high an epsilon, a changed bound, NaN, ``1e400``, garbage)
is refused, counted and logged on one line, and the device then sends **no** report until an acceptable control
message arrives (readings wait, at most ``--buffer`` of them, and are reported once under that message).

The readings are consumed phase by phase: in phase ``threshold`` a device reports at most what the server still
takes in the current round (``take``, less its own reports still in flight: :class:`~stream.device.policy.HoldoutShare`)
and keeps the other readings, unperturbed and unspent, for the next control message; in phase ``stream`` it
reports every reading. So each reading is perturbed once, under the phase that uses it.

In phase ``threshold`` a device clamps each reading to ``[0, B]`` and reports it with Square Wave (Eq. 16, with the
message's ``sw_b``); in phase ``stream`` it truncates the reading to ``[0, theta]`` and reports it with the Hybrid
mechanism (Eq. 22). Reports are JSON objects on ``meters/{stream}/report`` (configurable), in reading units::

    {"report": y, "phase": "threshold", "ts": t, "seq": n}              y in [-b B, (1 + b) B]
    {"report": y, "phase": "stream", "ts": t, "theta": t, "seq": n}     y an unbiased estimate of min(reading, theta)

``ts`` is the wall-clock time (Unix seconds) at which the device read the reading; ``seq`` increases by report and
is not reused after a restart (:class:`~stream.device.policy.SequenceNumbers`). Raw readings never leave the device:
they are not published, logged, or put into error messages. Each reading is reported exactly once, so it is
eps-LDP at the epsilon of that one report; the device's :class:`~stream.device.policy.SpentAccount` states it.

The randomness of a device comes from a :class:`~operators.noise.KeyedGenerator` with a fresh random key
(``Domain.LOCAL``, address 1 for SW and 2 for HM, positions counting up), so nobody else can reproduce its reports.

Examples
--------
>>> dev = Device("meter-1", DeviceLimits(max_epsilon=1.0, bound=100.0))
>>> dev.phase is None
True
>>> dev.on_control(threshold_control("meter-1", epsilon=1.0, bound=100.0))
'threshold'
>>> reports = dev.perturb([3.0, 250.0], ts=1700000000.0)
>>> [sorted(r) for r in reports]
[['phase', 'report', 'seq', 'ts'], ['phase', 'report', 'seq', 'ts']]
>>> b = threshold_control("meter-1", 1.0, 100.0)["sw_b"]
>>> all(-b * 100 <= r["report"] <= (1 + b) * 100 for r in reports)
True
>>> dev.on_control(stream_control("meter-1", epsilon=60.0, theta=10.0))
Traceback (most recent call last):
    ...
stream.core.control.ControlError: control epsilon 60 is above this device's limit 1 (--max-epsilon)
>>> dev.phase is None  # refused: nothing is reported until an acceptable control message
True
>>> dev.on_control({"stream": "meter-1", "phase": "stream", "epsilon": 1.0, "theta": 10.0, "mechanism": "hybrid"})
'stream'
>>> r = dev.perturb([4.0])[0]
>>> r["phase"], r["theta"], r["seq"] > reports[1]["seq"]
('stream', 10.0, True)
>>> dev.account.to_dict()["threshold"], dev.account.max_epsilon_per_reading
({'readings': 2, 'max_epsilon': 1.0, 'total_epsilon': 2.0}, 1.0)
>>> dev.on_control(threshold_control("meter-1", 1.0, 100.0, received=40, take=3)), dev.room
('threshold', 3)
>>> len(dev.perturb([1.0, 2.0])), dev.room
(2, 1)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import os
import random
import signal
import stat
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from operators.categorical.release import local_perturb
from operators.local.hybrid import hybrid_report
from operators.local.square_wave import square_wave_report
from operators.noise import Domain, KeyedGenerator, new_key
from stream.core.control import (
    DEFAULT_CONTROL_TOPIC,
    DEFAULT_REPORT_TOPIC,
    MAX_CATEGORIES,
    PHASE_CATEGORICAL,
    PHASE_RANGE,
    PHASE_STREAM,
    PHASE_THRESHOLD,
    Control,
    ControlError,
    categorical_control,
    parse_control,
    stream_control,
    threshold_control,
)
from stream.device.policy import (
    SEQ_RESERVE,
    DeviceLimits,
    DeviceState,
    HoldoutShare,
    InputPosition,
    SequenceNumbers,
    SpentAccount,
    limits_problems,
    load_limits_file,
)

__all__ = [
    "DEFAULT_CONTROL_TOPIC",
    "DEFAULT_REPORT_TOPIC",
    "Control",
    "ControlError",
    "Device",
    "DeviceLimits",
    "SpentAccount",
    "add_arguments",
    "categorical_control",
    "main",
    "parse_control",
    "run_device",
    "stream_control",
    "threshold_control",
]

log = logging.getLogger("tops.device")

ADDRESS_SQUARE_WAVE = 1
ADDRESS_HYBRID = 2
ADDRESS_CATEGORICAL = 3
ADDRESS_RANGE = 4
_MAX_POSITION = 1 << 34  # well inside the 2^35 words of one ChaCha20 keystream; a fresh key after that


class Device:
    """One device's randomizer: its pinned limits, the latest accepted control message, a private keyed generator,
    its own privacy account and its report sequence numbers.

    ``limits`` is a :class:`~stream.device.policy.DeviceLimits` or just the largest epsilon (both phases) this
    device ever reports at. A control message outside the limits is refused (:class:`ControlError`) and the device
    then reports nothing until an acceptable one arrives. ``key`` exists for tests only; by default every device
    draws a fresh random key, which is what makes its reports impossible to reproduce (and devices' noise
    independent). ``sequence`` adds ``seq`` to every report (time-based, never below ``seq_floor``); turn it off
    only for several devices that share one stream (the daemon checks ``seq`` per stream). ``account``, ``bound``
    and ``holdout`` continue a saved account, a bound pinned on first use and the device's share of the holdout.

    :attr:`room` is how many readings the control in force takes now: ``None`` for any number, else (threshold
    phase, a control that says ``take``) at most that many, and :meth:`perturb` refuses more.
    """

    def __init__(
        self,
        stream: str,
        limits: DeviceLimits | float,
        *,
        key: bytes | None = None,
        sequence: bool = True,
        seq_floor: int = 0,
        account: SpentAccount | None = None,
        bound: float | None = None,
        categories: int | None = None,
        holdout: HoldoutShare | None = None,
    ) -> None:
        if not isinstance(stream, str) or not stream or any(c in stream for c in "+#/\0"):
            msg = "a stream name is a non-empty string without '+', '#', '/'"
            raise ValueError(msg)
        if not isinstance(limits, DeviceLimits):
            limits = DeviceLimits(max_epsilon=limits)
        self.stream = stream
        self.limits = limits
        self.control: Control | None = None
        self.reports = 0
        self.account = account if account is not None else SpentAccount()
        self.holdout = holdout if holdout is not None else HoldoutShare()
        self.room: int | None = None
        self.refusals: collections.Counter[str] = collections.Counter()
        self.pinned_bound = limits.bound if limits.bound is not None else bound
        self.categories = categories  # a categorical device: its readings are categories 0 .. categories - 1
        self.seq = SequenceNumbers(seq_floor) if sequence else None
        self._fixed_key = key is not None
        self._gen = KeyedGenerator(key if key is not None else new_key())
        self._positions = {ADDRESS_SQUARE_WAVE: 0, ADDRESS_HYBRID: 0, ADDRESS_CATEGORICAL: 0, ADDRESS_RANGE: 0}

    def __repr__(self) -> str:
        return f"Device(stream={self.stream!r}, phase={self.phase!r}, reports={self.reports})"

    @property
    def phase(self) -> str | None:
        """``threshold``, ``stream``, or ``None`` before the first acceptable control message (or after a refused
        or withdrawn one)."""
        return None if self.control is None else self.control.phase

    @property
    def refused(self) -> int:
        """Control messages refused so far."""
        return sum(self.refusals.values())

    def check(self, control: Control) -> None:
        """Raise :class:`ControlError` when ``control`` is outside this device's pinned limits."""
        lim = self.limits
        if control.phase == PHASE_RANGE:
            self._check_range(control)
            return
        if control.mechanism not in lim.mechanisms:
            msg = f"control mechanism is not one this device runs ({', '.join(lim.mechanisms)})"
            raise ControlError(msg, "mechanism")
        if control.lower != lim.lower:
            msg = f"control lower end {control.lower:g} differs from this device's {lim.lower:g}"
            raise ControlError(msg, "lower")
        if (control.phase == PHASE_CATEGORICAL) != (self.categories is not None):
            msg = ("control is for a categorical stream and this device reports numbers" if self.categories is None
                   else "control is for a numeric stream and this device reports categories (--categories)")
            raise ControlError(msg, "kind")
        if control.phase == PHASE_CATEGORICAL and control.categories != self.categories:
            msg = f"control categories {control.categories} differ from this device's {self.categories}"
            raise ControlError(msg, "categories")
        limit = lim.epsilon_limit(control.phase)
        if control.epsilon > limit:
            name = "threshold-phase epsilon" if control.phase == PHASE_THRESHOLD else "epsilon"
            flag = "--max-threshold-epsilon" if control.phase == PHASE_THRESHOLD else "--max-epsilon"
            msg = f"control {name} {control.epsilon:g} is above this device's limit {limit:g} ({flag})"
            raise ControlError(msg, "threshold_epsilon" if control.phase == PHASE_THRESHOLD else "epsilon")
        pinned = self.pinned_bound
        if control.phase == PHASE_THRESHOLD:
            assert control.bound is not None
            if pinned is not None and control.bound != pinned:
                msg = f"control bound {control.bound:g} differs from the bound pinned on this device ({pinned:g})"
                raise ControlError(msg, "bound")
        elif control.phase == PHASE_STREAM:
            assert control.theta is not None
            if pinned is not None and not control.theta <= pinned:
                msg = f"control theta {control.theta:g} is outside (0, {pinned:g}], the bound pinned on this device"
                raise ControlError(msg, "theta")

    def _check_range(self, control: Control) -> None:
        """A local range stream: a numeric device buckets its own readings (any domain: each report is eps-LDP
        whatever the buckets) and reports one level through oracles it runs, at most at its epsilon limit."""
        lim = self.limits
        if self.categories is not None:
            msg = "control is for a range stream and this device reports categories (--categories)"
            raise ControlError(msg, "kind")
        oracles = control.layout().oracles
        if any(o not in lim.mechanisms for o in oracles):
            msg = (f"control needs oracles {', '.join(sorted(set(oracles)))}; this device runs "
                   f"{', '.join(lim.mechanisms)}")
            raise ControlError(msg, "mechanism")
        if control.epsilon > lim.max_epsilon:
            msg = (f"control epsilon {control.epsilon:g} is above this device's limit {lim.max_epsilon:g} "
                   "(--max-epsilon)")
            raise ControlError(msg, "epsilon")

    def on_control(self, message: Any) -> str | None:
        """Follow a control message (dict, JSON text or bytes; empty withdraws it); returns the phase.

        Raises :class:`ControlError` when the message is malformed or outside the pinned limits: it is counted in
        :attr:`refusals`, and the device reports nothing (``perturb`` raises) until an acceptable one arrives.
        """
        if message in (b"", "", None):
            self.control = None
            return None
        try:
            control = parse_control(message, self.stream)
            self.check(control)
        except ControlError as exc:
            self.control = None
            self.refusals[exc.reason] += 1
            raise
        if control.phase == PHASE_THRESHOLD and self.pinned_bound is None:
            self.pinned_bound = control.bound  # pinned on first use: a later bound that differs is refused
        self.control = control
        self.room = None
        if control.phase == PHASE_THRESHOLD and control.take is not None:
            assert control.received is not None
            self.room = self.holdout.follow(control.received, control.take)
        return control.phase

    def _uniforms(self, address: int, count: int) -> np.ndarray:
        start = self._positions[address]
        if start + count > _MAX_POSITION:
            if self._fixed_key:
                msg = "the test key's keystream is exhausted"
                raise RuntimeError(msg)
            self._gen = KeyedGenerator(new_key())
            self._positions = dict.fromkeys(self._positions, 0)
            start = 0
        self._positions[address] = start + count
        return self._gen.uniforms(Domain.LOCAL, address, start, count)

    def perturb_values(self, readings: Any) -> np.ndarray:
        """The reports (reading units) for a batch of finite readings (negative ones clamped to 0), under the current
        control.

        Each reading is reported once: the account adds the control's epsilon for each of them."""
        if self.control is None:
            msg = "no acceptable control message: the device reports nothing"
            raise RuntimeError(msg)
        v = np.asarray(readings, dtype=np.float64).reshape(-1)
        if v.size and not np.isfinite(v).all():
            msg = "readings must be finite numbers"
            raise ValueError(msg)
        if self.room is not None and v.size > self.room:
            msg = f"the server takes {self.room} more threshold-phase reports now, not {v.size}: keep the others"
            raise RuntimeError(msg)
        c = self.control
        if c.phase == PHASE_RANGE:
            lay = c.layout()
            u = self._uniforms(ADDRESS_RANGE, lay.uniforms_per_report * v.size)
            out = lay.report(c.bucket_of(v), u).astype(np.float64)
            self.reports += v.size
            self.account.add(c.phase, c.epsilon, v.size)
            return out
        if c.phase == PHASE_CATEGORICAL:
            assert c.categories is not None
            if v.size and not (np.all(v == np.floor(v)) and v.min() >= 0 and v.max() < c.categories):
                msg = "categories must be integers in [0, categories)"
                raise ValueError(msg)
            u = self._uniforms(ADDRESS_CATEGORICAL, 2 * v.size)
            out = local_perturb(c.mechanism, v.astype(np.int64), c.categories, c.epsilon, u).astype(np.float64)
            self.reports += v.size
            self.account.add(c.phase, c.epsilon, v.size)
            return out
        # a negative reading is clamped to the lower end 0 and reported like any other: a missing report would
        # itself tell the server that the reading was negative
        v = np.maximum(v, 0.0)
        c = self.control
        if c.phase == PHASE_THRESHOLD:
            assert c.bound is not None
            out = square_wave_report(v, c.sw_domain, c.epsilon, self._uniforms(ADDRESS_SQUARE_WAVE, v.size), c.sw_b)
        else:
            assert c.theta is not None
            u = self._uniforms(ADDRESS_HYBRID, 2 * v.size)
            out = hybrid_report(v, c.theta, c.epsilon, u[0::2], u[1::2])
        self.reports += v.size
        self.account.add(c.phase, c.epsilon, v.size)
        if self.room is not None:
            self.room -= v.size
            self.holdout.sent(v.size)
        return out

    def perturb(self, readings: Any, ts: Any = None) -> list[dict[str, Any]]:
        """Report messages (JSON-ready dicts) for a batch of readings; ``ts`` a time or one per reading (default
        now). With ``sequence`` on, each carries the next ``seq``."""
        n = int(np.size(readings))
        if ts is None:
            stamps: list[float] = [round(time.time(), 3)] * n
        elif np.ndim(ts) == 0:
            stamps = [float(ts)] * n
        else:
            stamps = [float(t) for t in ts]
            if len(stamps) != n:
                msg = "ts must be one time or one time per reading"
                raise ValueError(msg)
        values = self.perturb_values(readings)
        assert self.control is not None
        phase, theta = self.control.phase, self.control.theta
        # a threshold report says which domain it was made over (the fine round), a stream report its theta
        extra: dict[str, Any] = {}
        if phase == PHASE_THRESHOLD:
            if self.control.domain is not None:
                extra = {"domain": self.control.domain}
        elif phase in (PHASE_CATEGORICAL, PHASE_RANGE):
            values = values.astype(np.int64)  # a report value is an integer
        else:
            extra = {"theta": theta}
        ys = values.tolist()
        if self.seq is None:
            return [{"report": y, "phase": phase, "ts": t, **extra} for y, t in zip(ys, stamps, strict=True)]
        first = self.seq.take(n) if n else 0
        seqs = range(first, first + n)
        return [
            {"report": y, "phase": phase, "ts": t, **extra, "seq": q} for y, t, q in zip(ys, stamps, seqs, strict=True)
        ]


# --------------------------------------------------------------------------------------------------------------
# the `tops device` command


@dataclass(frozen=True, slots=True)
class DeviceOptions:
    """What ``tops device`` was asked to do."""

    host: str
    port: int
    stream: str
    input: str = "-"
    report_topic: str = DEFAULT_REPORT_TOPIC
    control_topic: str = DEFAULT_CONTROL_TOPIC
    username: str | None = None
    password: str | None = None
    qos: int = 0
    buffer: int = 1000
    control_timeout: float | None = None
    client_id: str | None = None
    limits: DeviceLimits | None = None
    state_file: str | None = None
    status_interval: float = 60.0


class _Pipeline:
    """Readings -> held until the control in force takes them -> reports -> outbox; at most ``limit`` readings in
    flight (held and unpublished).

    A held reading is perturbed once, oldest first, when a control message takes it: every one under a stream-phase
    (or categorical, range) control; in the threshold phase at most :attr:`Device.room`, the rest held, unspent,
    for the next control message. A refused control message stops all new reports. With a state file the account,
    the reports made and what is still held are written after each perturbation and before any of its reports is
    published (and again once they are): a restart continues from there."""

    def __init__(self, device: Device, limit: int, state: DeviceState | None = None) -> None:
        self.device = device
        self.limit = limit
        self.state = state
        self.refused_before = state.refused if state is not None else 0  # refusals of earlier runs
        self.held: collections.deque[tuple[float, float]] = collections.deque(state.pending if state else ())
        self.outbox: collections.deque[dict[str, Any]] = collections.deque(state.outbox if state else ())
        self.input: InputPosition | None = state.input if state is not None else None
        self.cond = asyncio.Condition()
        self.eof = False
        self.has_control = asyncio.Event()
        self.last_refusal: ControlError | None = None
        self.invalid = 0
        self.published = 0
        self._full = False  # the buffer is full of held readings (logged once until it drains)
        self._told_no_take = False
        self._followed: tuple[Control, int | None] | None = None  # the last control followed, and its room

    def _in_flight(self) -> int:
        return len(self.held) + len(self.outbox)

    def save_state(self) -> None:
        """Write the state file (account, pinned bound, reserved seq numbers, holdout share, held readings,
        unpublished reports, input position), if the device keeps one."""
        st = self.state
        if st is None:
            return
        st.account, st.bound, st.holdout = self.device.account, self.device.pinned_bound, self.device.holdout
        st.refused = self.refused_before + self.device.refused
        st.pending, st.outbox, st.input = list(self.held), list(self.outbox), self.input
        try:
            st.save(self.device.limits)
        except OSError as exc:
            log.warning("cannot write the state file (%s)", exc.strerror or type(exc).__name__)

    def _perturb(self, values: list[float], stamps: list[float]) -> list[dict[str, Any]]:
        seq, st = self.device.seq, self.state
        if seq is not None and st is not None:
            last = seq.peek(len(values)) + len(values)
            if last > st.seq_reserved:  # reserve before use: a restart starts above every number sent
                st.seq_reserved = last + SEQ_RESERVE
                self.save_state()
        return self.device.perturb(values, stamps)

    def _release(self) -> None:
        """Perturb the held readings the control in force takes now (oldest first) into the outbox; then write the
        state file, before any of these reports is published."""
        dev, held = self.device, self.held
        if dev.control is None or not held:
            return
        k = len(held) if dev.room is None else min(len(held), dev.room)
        if k == 0:
            return
        values, stamps = zip(*itertools.islice(held, k), strict=True)
        self.outbox.extend(self._perturb(list(values), list(stamps)))
        for _ in range(k):
            held.popleft()
        self.save_state()

    def _note_full(self) -> None:
        """One log line when the held readings fill the buffer (the input pauses), again after it drained."""
        if len(self.held) < self.limit:
            self._full = False
            return
        if not self._full:
            self._full = True
            why = ("an acceptable control message" if self.device.control is None
                   else "the next control message (the server takes no more threshold-phase reports now)")
            log.info("holding %d readings (--buffer) until %s; input paused", len(self.held), why)

    async def add(self, readings: list[float], stamps: list[float], ends: list[int] | None = None,
                  consumed: int | None = None) -> None:
        """Take readings in; ``ends`` (the input offset after each reading's line) and ``consumed`` (after the last
        line of the chunk) move the input position as they are taken."""
        i = 0
        while i < len(readings):
            async with self.cond:
                await self.cond.wait_for(lambda: self._in_flight() < self.limit)
                room = self.limit - self._in_flight()
                part, part_ts = readings[i : i + room], stamps[i : i + room]
                i += len(part)
                self.held.extend(zip(part, part_ts, strict=True))
                if self.input is not None and ends is not None:
                    self.input.offset = ends[i - 1]
                self._release()
                self._note_full()
                self.cond.notify_all()
        if self.input is not None and consumed is not None:
            async with self.cond:
                self.input.offset = consumed

    async def control(self, payload: bytes) -> None:
        async with self.cond:
            try:
                phase = self.device.on_control(payload)
            except ControlError as exc:
                self.has_control.clear()
                self.last_refusal = exc
                log.warning("refusing control message (%s): %s; no report until an acceptable one arrives",
                            exc.reason, exc)
                self.save_state()
                return
            if phase is None:
                log.info("control withdrawn; holding readings")
                self.has_control.clear()
            else:
                self.last_refusal = None
                self._follow(phase)
                self.has_control.set()
                self._release()
                self._note_full()
            self.cond.notify_all()

    def _follow(self, phase: str) -> None:
        """Log the phase an accepted control message names (and in the threshold phase how much it takes), once:
        a message republished as it was (a periodic status) logs at DEBUG only."""
        c, room = self.device.control, self.device.room
        assert c is not None
        followed = (dataclasses.replace(c, received=None, take=None), room)
        level = logging.DEBUG if followed == self._followed else logging.INFO
        self._followed = followed
        if room is not None:
            log.log(level, "phase %s (epsilon %g): this device sends up to %d reports now, and holds the other "
                    "readings for the next control message", phase, c.epsilon, room)
            return
        log.log(level, "phase %s (epsilon %g)", phase, c.epsilon)
        if phase == PHASE_THRESHOLD and not self._told_no_take:
            self._told_no_take = True
            log.warning("the threshold-phase control message does not say how many reports the server takes (an "
                        "older daemon): every reading is reported in this phase, and those past its holdout are "
                        "rejected by the server")

    async def finish(self) -> None:
        async with self.cond:
            self.eof = True
            self.cond.notify_all()

    async def next_report(self) -> dict[str, Any] | None:
        """The oldest unpublished report, or None when the input has ended and everything is published."""
        async with self.cond:
            await self.cond.wait_for(lambda: bool(self.outbox) or (self.eof and not self.held))
            return self.outbox[0] if self.outbox else None

    async def published_one(self) -> None:
        async with self.cond:
            self.outbox.popleft()
            self.published += 1
            if not self.outbox:
                self.save_state()  # the reports are out: a restart must not publish them again
            self.cond.notify_all()


def _parse_lines(lines: list[bytes], pipeline: _Pipeline, start: int = 0) -> tuple[list[float], list[int]]:
    """The readings of ``lines`` (each followed by a newline in the input, which began at offset ``start``) and
    the input offset after each reading's line."""
    out: list[float] = []
    ends: list[int] = []
    end = start
    for line in lines:
        end += len(line) + 1
        text = line.strip()
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            pipeline.invalid += 1
            continue
        if not math.isfinite(value):
            pipeline.invalid += 1
            continue
        d = pipeline.device.categories
        if d is not None and not (value == math.floor(value) and 0 <= value < d):
            pipeline.invalid += 1  # not a category of this device: counted, never reported
            continue
        out.append(value)  # a negative reading is clamped to 0 when perturbed, never skipped
        ends.append(end)
    return out, ends


async def _chunks(path: str, start: int = 0) -> AsyncIterator[bytes]:
    """Chunks of the input as they become available, a file's from byte ``start`` (a daemon thread reads, so a
    blocked stdin never hangs exit)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | BaseException] = asyncio.Queue(maxsize=4)
    fd = sys.stdin.fileno() if path == "-" else os.open(path, os.O_RDONLY)
    if start:
        os.lseek(fd, start, os.SEEK_SET)

    def reader() -> None:
        try:
            while True:
                chunk = os.read(fd, 1 << 16)
                asyncio.run_coroutine_threadsafe(queue.put(chunk), loop).result()
                if not chunk:
                    return
        except BaseException as exc:  # delivered to the event loop, re-raised there
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(queue.put(exc), loop).result()
        finally:
            if path != "-":
                os.close(fd)

    threading.Thread(target=reader, name="tops-device-input", daemon=True).start()
    while True:
        item = await queue.get()
        if isinstance(item, BaseException):
            raise item
        if not item:
            return
        yield item


def _input_position(path: str, saved: InputPosition | None) -> InputPosition | None:
    """Where to read a regular input file from: the saved position when it is the same file (and not shorter),
    else its start. None for stdin, a device, a pipe (nothing to continue)."""
    if path == "-":
        return None
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        return None
    here = InputPosition(os.path.realpath(path), st.st_dev, st.st_ino)
    if saved is None or (saved.path, saved.device, saved.inode) != (here.path, here.device, here.inode):
        return here
    if saved.offset > st.st_size:
        log.warning("the input file is shorter than the part this device already took (state file): it is read "
                    "from its start")
        return here
    if saved.offset:
        log.info("continuing the input file at byte %d: the readings before it were taken by an earlier run",
                 saved.offset)
    here.offset = saved.offset
    return here


async def _read_input(path: str, pipeline: _Pipeline) -> None:
    offset = pipeline.input.offset if pipeline.input is not None else 0
    partial = b""
    async for chunk in _chunks(path, offset):
        data = partial + chunk
        lines = data.split(b"\n")
        partial = lines.pop()
        values, ends = _parse_lines(lines, pipeline, offset)
        offset += len(data) - len(partial)
        now = round(time.time(), 3)
        await pipeline.add(values, [now] * len(values), ends, offset)
    values, _ = _parse_lines([partial], pipeline)
    offset += len(partial)
    await pipeline.add(values, [round(time.time(), 3)] * len(values), [offset] * len(values), offset)
    if pipeline.invalid:
        log.warning("skipped %d input lines that are not finite numbers", pipeline.invalid)
    await pipeline.finish()


async def _listen(client: Any, pipeline: _Pipeline) -> None:
    async for message in client.messages:
        payload = message.payload if isinstance(message.payload, bytes | bytearray) else b""
        await pipeline.control(bytes(payload))
    msg = "message iteration ended"
    raise _Disconnected(msg)


async def _publish(client: Any, pipeline: _Pipeline, topic: str, qos: int) -> None:
    while (report := await pipeline.next_report()) is not None:
        await client.publish(topic, json.dumps(report, separators=(",", ":")), qos=qos)
        await pipeline.published_one()


class _Disconnected(Exception):
    """The broker connection ended while listening for control messages."""


class _ControlTimeout(Exception):
    """No control message arrived in time."""


async def _connection(options: DeviceOptions, pipeline: _Pipeline) -> None:
    import aiomqtt  # the device needs an MQTT client only when it talks to a broker

    control_topic = options.control_topic.replace("{stream}", options.stream)
    report_topic = options.report_topic.replace("{stream}", options.stream)
    identifier = options.client_id or f"tops-device-{options.stream}-{uuid.uuid4().hex[:8]}"
    attempt = 0
    while True:
        try:
            async with aiomqtt.Client(
                options.host,
                options.port,
                username=options.username,
                password=options.password,
                identifier=identifier,
                logger=log,
            ) as client:
                log.info("connected to %s:%d", options.host, options.port)
                attempt = 0
                await client.subscribe(control_topic, qos=1)
                listener = asyncio.create_task(_listen(client, pipeline), name=f"tops-device[{options.stream}].control")
                publisher = asyncio.create_task(
                    _publish(client, pipeline, report_topic, options.qos), name=f"tops-device[{options.stream}].publish"
                )
                try:
                    done, _ = await asyncio.wait({listener, publisher}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (listener, publisher):
                        task.cancel()
                    await asyncio.gather(listener, publisher, return_exceptions=True)
                for task in done:
                    task.result()
                log.info("input ended; %d reports published", pipeline.published)
                return
        except (aiomqtt.MqttError, _Disconnected) as exc:
            attempt += 1
            delay = min(30.0, 0.5 * 2 ** min(attempt, 6)) * random.uniform(0.5, 1.0)
            log.warning("MQTT connection failed or lost (%s); retrying in %.1f s", exc, delay)
            await asyncio.sleep(delay)


async def _watchdog(pipeline: _Pipeline, timeout: float) -> None:
    """Give up when no acceptable control message came within ``timeout``; say so on one line, with the reason of
    the last refusal if the device refused one (the reason holds no reading and no secret)."""
    try:
        await asyncio.wait_for(pipeline.has_control.wait(), timeout)
    except TimeoutError:
        refused = pipeline.last_refusal
        if refused is None:
            msg = f"no control message within {timeout:g} s"
        else:
            reason = " ".join(str(refused).split())
            msg = (f"refused the control message ({refused.reason}: {reason}); no acceptable one within "
                   f"{timeout:g} s")
        raise _ControlTimeout(msg) from None


class _Stopped(Exception):
    """SIGTERM or SIGINT: stop, keeping the state."""


async def _until_signal() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
    raise _Stopped


async def _status(pipeline: _Pipeline, interval: float) -> None:
    """Every ``interval`` seconds: the account on one log line, and the state file."""
    while True:
        await asyncio.sleep(interval)
        log.info("%s; %d control messages refused", pipeline.device.account.line(), pipeline.device.refused)
        pipeline.save_state()


def _device_from_state(stream: str, limits: DeviceLimits, state: DeviceState | None, *, sequence: bool = True,
                       categories: int | None = None) -> Device:
    """A device that continues what its state file saved: seq numbers, account, pinned bound, holdout share."""
    return Device(
        stream,
        limits,
        sequence=sequence,
        seq_floor=state.seq_reserved if state else 0,
        account=state.account if state else None,
        bound=state.bound if state else None,
        categories=categories,
        holdout=state.holdout if state else None,
    )


async def run_device(options: DeviceOptions, device: Device | None = None, state: DeviceState | None = None) -> int:
    """Run a device until its input ends and every report is published (or SIGTERM, SIGINT); returns the exit
    status.

    Without ``device`` one is made from ``options.limits`` and the state file, when given; ``state`` is that file
    already loaded (the one ``device`` was made from)."""
    if state is None and options.state_file:
        state = DeviceState(options.state_file, options.stream)
        state.load()  # ValueError: main() checks it first
    if device is None:
        if options.limits is None:
            msg = "a device needs its pinned limits (at least max_epsilon)"
            raise ValueError(msg)
        device = _device_from_state(options.stream, options.limits, state)
    pipeline = _Pipeline(device, options.buffer, state)
    if state is not None:
        pipeline.input = _input_position(options.input, state.input)
    if pipeline.held or pipeline.outbox:
        log.info("continuing with %d readings held and %d reports unpublished by an earlier run",
                 len(pipeline.held), len(pipeline.outbox))
    status = 0
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_read_input(options.input, pipeline), name=f"tops-device[{options.stream}].input")
            conn = tg.create_task(_connection(options, pipeline), name=f"tops-device[{options.stream}].mqtt")
            background = [tg.create_task(_until_signal(), name="tops-device.signals")]
            if options.status_interval > 0:
                background.append(tg.create_task(_status(pipeline, options.status_interval), name="tops-device.status"))
            if options.control_timeout:
                dog = tg.create_task(_watchdog(pipeline, options.control_timeout), name="tops-device.watchdog")
                await asyncio.wait({conn, dog}, return_when=asyncio.FIRST_COMPLETED)
                if conn.done() and not dog.done():
                    dog.cancel()
            else:
                await asyncio.wait({conn})
            for task in background:
                task.cancel()
    except* _ControlTimeout as group:
        log.error("%s", group.exceptions[0])
        status = 3
    except* _Stopped:
        log.info("stopped by a signal")
    except* OSError as group:
        exc = group.exceptions[0]
        log.error("cannot read the input: %s", getattr(exc, "strerror", None) or type(exc).__name__)
        status = 1
    finally:
        pipeline.save_state()
        if pipeline.held or pipeline.outbox:
            where = "kept in the state file for the next run" if state is not None else "lost (no --state-file)"
            log.warning("%d readings held unreported and %d reports unpublished: %s", len(pipeline.held),
                        len(pipeline.outbox), where)
        log.info("%s; %d control messages refused", device.account.line(), device.refused)
    return status


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``tops device``."""
    parser.add_argument("--host", required=True, help="MQTT broker host")
    parser.add_argument("--port", type=int, default=1883, help="MQTT broker port (default 1883)")
    parser.add_argument("--stream", required=True, help="the stream this device reports to")
    parser.add_argument("--input", default="-", metavar="FILE|-", help="readings, one number a line (default stdin)")
    parser.add_argument("--report-topic", default=DEFAULT_REPORT_TOPIC, help="default %(default)s")
    parser.add_argument("--control-topic", default=DEFAULT_CONTROL_TOPIC, help="default %(default)s")
    parser.add_argument("--username", help="MQTT user name")
    parser.add_argument("--password-file", help="file whose first line is the MQTT password")
    parser.add_argument("--qos", type=int, choices=(0, 1), default=0, help="QoS of the reports (default 0)")
    parser.add_argument(
        "--buffer", type=int, default=1000, metavar="N", help="readings held before a control message (default 1000)"
    )
    parser.add_argument(
        "--control-timeout", type=float, default=None, metavar="S", help="give up (exit 3) without control after S s"
    )
    parser.add_argument("--client-id", help="MQTT client identifier (default: random)")
    parser.add_argument(
        "--max-epsilon", type=float, metavar="EPS",
        help="REQUIRED (here or in --limits): the largest epsilon this device reports at; a control message asking "
        "for more is refused",
    )
    parser.add_argument(
        "--max-threshold-epsilon", type=float, metavar="EPS",
        help="the largest threshold-phase (Square Wave) epsilon (default: --max-epsilon)",
    )
    parser.add_argument(
        "--bound", type=float, metavar="B",
        help="pin the bound B: a threshold control with another B, or theta above B, is refused (default: the "
        "first accepted B is pinned)",
    )
    parser.add_argument(
        "--categories", type=int, metavar="D",
        help="a categorical device: readings are categories 0 .. D-1, reported with the GRR or Hadamard Response "
        "control of a categorical stream (whose categories must equal D)",
    )
    parser.add_argument(
        "--limits", metavar="FILE",
        help="TOML file of pinned limits: max_epsilon, max_threshold_epsilon, bound, lower, mechanisms "
        "(options given on the command line win)",
    )
    parser.add_argument(
        "--state-file", metavar="FILE",
        help="JSON file the device keeps: its privacy account, refusals, the pinned bound and reserved seq numbers",
    )
    parser.add_argument(
        "--status-interval", type=float, default=60.0, metavar="S",
        help="log the account line and write the state file every S s (default 60; 0: only at exit)",
    )
    parser.add_argument(
        "--no-seq", action="store_true",
        help="omit seq from reports (only for several devices sharing one stream: the daemon checks seq per stream)",
    )
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


def _limits_from_args(args: argparse.Namespace) -> tuple[DeviceLimits | None, list[str]]:
    """The pinned limits from --limits FILE and the command line (which wins), and one line per problem."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    if args.limits:
        values, problems = load_limits_file(args.limits)
        problems = [f"--limits {args.limits}: {p}" for p in problems]
    for key in ("max_epsilon", "max_threshold_epsilon", "bound"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    if values.get("max_epsilon") is None:
        problems.append(
            "--max-epsilon is required (or max_epsilon in --limits FILE): the largest epsilon this device reports at"
        )
        return None, problems
    found = limits_problems(
        values.get("max_epsilon"),
        values.get("max_threshold_epsilon"),
        values.get("bound"),
        values.get("lower", 0.0),
        values.get("mechanisms"),
    )
    problems += [f"--{p.replace('_', '-', 2)}" if p.startswith("max_") or p.startswith("bound") else p for p in found]
    if problems:
        return None, problems
    mechanisms = values.get("mechanisms")
    limits = DeviceLimits(
        max_epsilon=values["max_epsilon"],
        max_threshold_epsilon=values.get("max_threshold_epsilon"),
        bound=values.get("bound"),
        lower=values.get("lower", 0.0),
        **({"mechanisms": tuple(mechanisms)} if mechanisms else {}),
    )
    return limits, []


def main(args: argparse.Namespace) -> int:
    """``tops device``: returns 0 when the input ended and all reports are published, 2 on bad options."""
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    password = None
    if args.password_file:
        try:
            with open(args.password_file, encoding="utf-8") as f:
                password = f.readline().strip()
        except OSError as exc:
            print(f"tops device: error: cannot read --password-file ({exc.strerror})", file=sys.stderr)
            return 2
    problems: list[str] = []
    if args.buffer < 1:
        problems.append("--buffer must be at least 1")
    if not 0 < args.port < 65536:
        problems.append("--port must be in 1..65535")
    if not (math.isfinite(args.status_interval) and args.status_interval >= 0):
        problems.append("--status-interval must be a number of seconds >= 0")
    if args.categories is not None and not 2 <= args.categories <= MAX_CATEGORIES:
        problems.append(f"--categories must be an integer in [2, {MAX_CATEGORIES}]")
    limits, found = _limits_from_args(args)
    problems += found
    try:
        Device(args.stream, limits or 1.0)
    except ValueError as exc:
        problems.append(f"--stream: {exc}")
    else:
        if args.state_file:
            try:
                DeviceState(args.state_file, args.stream).load()
            except ValueError as exc:
                problems.append(f"--state-file {args.state_file}: {exc}")
    if args.input != "-" and not os.path.exists(args.input):
        problems.append(f"--input {args.input} does not exist")
    if problems:
        for p in problems:
            print(f"tops device: error: {p}", file=sys.stderr)
        return 2
    options = DeviceOptions(
        host=args.host,
        port=args.port,
        stream=args.stream,
        input=args.input,
        report_topic=args.report_topic,
        control_topic=args.control_topic,
        username=args.username,
        password=password,
        qos=args.qos,
        buffer=args.buffer,
        control_timeout=args.control_timeout,
        client_id=args.client_id,
        limits=limits,
        state_file=args.state_file,
        status_interval=args.status_interval,
    )
    state = DeviceState(args.state_file, args.stream) if args.state_file else None
    if state is not None:
        state.load()
    assert limits is not None
    device = _device_from_state(args.stream, limits, state, sequence=not args.no_seq, categories=args.categories)
    return asyncio.run(run_device(options, device, state))

"""Releases as a consumer holds them: read from a file or a topic, one per ``(stream, tick)``, each known with the
configuration that made it, and answered as range sums with an interval for the true sum.

A release is one noisy value per tick; it means something summed over a range. A stream states what its releases
mean in its status (``params``: :func:`stream.core.sinks.release_params`): the retained status message on MQTT, or
a status line in the JSONL that ``tops run`` writes, before a stream's first release in it. :class:`Releases` reads
both kinds of lines, in order: the releases of a stream that follow a status belong to that status's configuration
(its identity, generation and parameters), and a status that differs starts a new one. A range that holds releases
of two configurations is refused (one line: :class:`QueryError`); ``generation=`` / ``identity=`` choose one.

Every answer (:class:`Answer`) carries a 95 % interval for the *true* sum of the range's readings
(:mod:`operators.error_bar`: the noise, the smoother's prediction on partly covered leaves, and what truncation at
theta took), or none with the reason; local-mode streams (ToPL) get an interval of their own
(:class:`operators.error_bar.LocalRangeError`).

>>> rel = Releases()
>>> rel.add_payload(b'{"stream":"a","phase":"releasing","theta":4.0,"identity":"0f","generation":1,'
...                 b'"params":{"mode":"central","mechanism":"tops","epsilon":1.0,"holdout":1,"query_range":16,'
...                 b'"fanout":4,"smoother_layers":1,"resolution":1.0,"bound":8.0,"truncation":null,'
...                 b'"truncation_note":"theta is public: nothing measured the readings above it"}}')
0
>>> rel.add_payload(b'[{"stream":"a","tick":3,"ts":0.0,"value":1.5,"epsilon":1.0,"theta":4.0},'
...                 b'{"stream":"a","tick":4,"ts":0.0,"value":2.0,"epsilon":1.0,"theta":4.0}]')
2
>>> rel.add_payload(b'{"stream":"a","tick":4,"ts":0.0,"value":2.0,"epsilon":1.0,"theta":4.0}')   # a repeat
0
>>> ans = rel.range_sum(0, 10)
>>> ans.total, ans.released, rel.duplicates, ans.low is not None and ans.low < ans.high
(3.5, 2, 1, True)
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from operators.config import ConfigError, ToPSConfig, check_parameter
from operators.error_bar import Interval, LocalRangeError, NoiseModel, RangeError
from operators.spread import Spread
from operators.truncation import Truncation
from stream.commands.inputs import JSONInputError, file_lines, load_json
from stream.core.payload import TS_MAX, TS_MIN

__all__ = ["Answer", "QueryError", "Releases"]

TICK_LIMIT = 1 << 63  # a tick is a non-negative 63-bit integer (the daemon's ticks are int64)
MODEL_LEAVES_MAX = 1 << 22  # the error model walks a tree's leaves in arrays: 32 MiB each at this many
MODEL_TICKS_MAX = 1 << 26  # the released ticks an error model holds in memory (512 MiB of float64)
_FLOAT_MAX = sys.float_info.max
_REAL = frozenset((int, float))  # the types of a JSON number (a bool is neither)
_MODEL_PARAMETERS = ("fanout", "query_range", "smoother_layers", "smoother", "alpha", "window", "resolution")
_DEFAULTS = ToPSConfig(epsilon=1.0, bound=1.0)


class QueryError(Exception):
    """A source or a query cannot be answered; the message says why (never a released value of another stream)."""


@dataclass
class Answer:
    """The sum of the releases of ``stream`` at ticks ``first..last`` (inclusive) that were received, and the 95 %
    (or the ``level`` asked for) interval ``[low, high]`` for the true sum of the readings of those ticks (None: no
    interval, ``note`` says why). ``noise_sd``, ``smoother_sd``, ``truncation_mean`` and ``truncation_sd`` are its parts
    (:class:`operators.error_bar.Interval`); ``clamped_to_theta``: the interval is for the readings clamped to theta
    (nothing measured the readings above it)."""

    stream: str
    first: int
    last: int
    total: float
    released: int  # releases summed
    missing: int  # ticks of the range after the holdout with no release received
    low: float | None = None
    high: float | None = None
    noise_sd: float | None = None
    smoother_sd: float | None = None
    truncation_mean: float | None = None
    truncation_sd: float | None = None
    clamped_to_theta: bool = False
    note: str = ""
    start: float | None = None  # window start time (seconds), for time windows

    @property
    def stderr(self) -> float | None:
        """The noise's standard deviation (the first part of the interval)."""
        return self.noise_sd

    def to_dict(self) -> dict[str, Any]:
        return {"stream": self.stream, "first": self.first, "last": self.last, "total": self.total,
                "low": self.low, "high": self.high, "released": self.released, "missing": self.missing,
                "noise_sd": self.noise_sd, "smoother_sd": self.smoother_sd, "truncation_mean": self.truncation_mean,
                "truncation_sd": self.truncation_sd, "clamped_to_theta": self.clamped_to_theta, "note": self.note,
                "start": self.start}


@dataclass
class Segment:
    """The releases of one stream under one configuration: its status (None: none seen), and the releases' epsilon
    and theta."""

    status: dict[str, Any] | None = None
    key: str | None = None  # the configuration's identity, generation and parameters, as text
    ticks: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    ts: list[float] = field(default_factory=list)
    seen: dict[int, float] = field(default_factory=dict)
    epsilon: float | None = None
    theta: float | None = None
    model: Any = None  # (error model or None, holdout, word), made once
    _sorted: Any = None  # (ticks, values, ts) sorted by tick, made once

    def sorted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ticks (sorted), values and times."""
        if self._sorted is None:
            ticks = np.asarray(self.ticks, dtype=np.int64)
            order = np.argsort(ticks, kind="stable")
            self._sorted = (ticks[order], np.asarray(self.values, dtype=np.float64)[order],
                            np.asarray(self.ts, dtype=np.float64)[order])
        return self._sorted

    @property
    def span(self) -> tuple[int, int]:
        t = self.sorted()[0]
        return int(t[0]), int(t[-1])

    @property
    def identity(self) -> str | None:
        v = (self.status or {}).get("identity")
        return v if isinstance(v, str) else None

    @property
    def generation(self) -> int | None:
        v = (self.status or {}).get("generation")
        return v if type(v) is int else None

    def describe(self) -> str:
        if self.status is None:
            return "releases without a status"
        return f"identity {str(self.identity)[:16]} generation {self.generation}"


def _status_key(obj: dict[str, Any]) -> str:
    """What tells two configurations apart: identity, generation, theta and the parameters."""
    return json.dumps([obj.get("identity"), obj.get("generation"), obj.get("theta"), obj.get("params")],
                      sort_keys=True, default=str)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Releases:
    """Releases of one or more streams, one per ``(stream, tick)`` and configuration.

    ``params``: public parameters given by hand for releases without a status (``--config`` or the options of
    ``tops query``); a status's parameters win over them. ``range_error``: the class that makes the intervals of
    central-mode streams (:class:`operators.error_bar.RangeError`, or a variant of it); ``level``: the intervals'
    coverage (default 0.95).
    """

    def __init__(self, params: dict[str, Any] | None = None, *, range_error: type[RangeError] = RangeError,
                 level: float = 0.95) -> None:
        if not 0.5 <= level < 1.0:
            msg = f"the level of an interval is in [0.5, 1) (got {_short(level)})"
            raise QueryError(msg)
        self.range_error = range_error
        self.level = level
        self._streams: dict[str, list[Segment]] = {}
        self.duplicates = 0  # repeats dropped (same stream, tick and configuration)
        self.conflicts = 0  # repeats with another value (never expected: releases are final)
        self.invalid = 0  # lines or objects that are not releases nor status
        self.overrides = dict(params or {})

    # -- input --------------------------------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path, params: dict[str, Any] | None = None, *, level: float = 0.95) -> Releases:
        """The releases of a file, a payload a line (lines longer than ``MAX_LINE_BYTES`` are counted invalid)."""
        rel = cls(params, level=level)
        p = Path(path)
        try:
            with p.open("rb") as f:
                for line in file_lines(f):
                    if line is None:
                        rel.invalid += 1
                    elif line.strip():
                        rel.add_payload(line)
        except OSError as exc:
            msg = f"{p}: {exc.strerror or 'cannot read'}"
            raise QueryError(msg) from None
        return rel

    @classmethod
    def from_topic(cls, host: str, port: int = 1883, *, topics: list[str] | None = None, seconds: float = 10.0,
                   releases: int | None = None, username: str | None = None, password: str | None = None,
                   ca_file: str | None = None, params: dict[str, Any] | None = None) -> Releases:
        """The releases (and retained status messages) on the broker's ``topics`` (default ``dp/#``), collected for
        ``seconds`` or until ``releases`` are in."""
        import asyncio

        from stream.query.live import collect_live

        rel = cls(params)
        try:
            asyncio.run(collect_live(rel, host=host, port=port, topics=topics or ["dp/#"], seconds=seconds,
                                     releases=releases, username=username, password=password, ca_file=ca_file))
        except Exception as exc:  # aiomqtt.MqttError and OS errors: one line
            msg = f"MQTT {host}:{port}: {type(exc).__name__}: {exc}"
            raise QueryError(msg) from None
        return rel

    @classmethod
    def from_arrays(cls, stream: str, ticks: Any, values: Any, status: dict[str, Any] | None = None, *,
                    range_error: type[RangeError] = RangeError) -> Releases:
        """Releases held in memory: stream ``stream``'s ``values`` at ``ticks`` (distinct), under ``status`` (the
        stream's status message, as the daemon publishes it; None: none)."""
        rel = cls(range_error=range_error)
        seg = Segment()
        if status is not None:
            seg.status, seg.key = status, _status_key(status)
        t = np.asarray(ticks, dtype=np.int64)
        v = np.asarray(values, dtype=np.float64)
        if t.shape != v.shape or t.ndim != 1 or not t.size or np.unique(t).size != t.size or t.min() < 0:
            msg = "ticks and values: two 1-D arrays of one length, distinct ticks >= 0"
            raise QueryError(msg)
        seg.ticks, seg.values, seg.ts = t.tolist(), v.tolist(), [0.0] * t.size
        seg.seen = dict.fromkeys(seg.ticks, 0.0)
        if status is not None:
            p = status.get("params", {})
            seg.epsilon = p.get("epsilon") if type(p.get("epsilon")) in _REAL else None
            seg.theta = status.get("theta") if type(status.get("theta")) in _REAL else None
        rel._streams[stream] = [seg]
        return rel

    def add_payload(self, payload: bytes | str) -> int:
        """One MQTT payload or file line: a release, a JSON array of releases, or a status message. Returns the
        releases added (0 for a repeat, a status or something invalid, which is counted). The payload is parsed
        within bounds (:func:`stream.commands.inputs.load_json`: size, nesting, digits)."""
        try:
            doc = load_json(payload)
        except JSONInputError:
            self.invalid += 1
            return 0
        items = doc if isinstance(doc, list) else [doc]
        return sum(self._add(obj) for obj in items)

    def _add(self, obj: Any) -> int:
        if not isinstance(obj, dict) or not isinstance(obj.get("stream"), str):
            self.invalid += 1
            return 0
        name = obj["stream"]
        if "tick" not in obj:
            if isinstance(obj.get("phase"), str):  # a status message
                if obj["phase"] == "releasing" and isinstance(obj.get("params"), dict):
                    self._status(name, obj)
                return 0
            self.invalid += 1
            return 0
        tick, value, ts = obj.get("tick"), obj.get("value"), obj.get("ts", 0.0)
        if not (type(tick) is int and 0 <= tick < TICK_LIMIT  # JSON numbers are int or float, never bool here
                and type(value) in _REAL and -_FLOAT_MAX <= value <= _FLOAT_MAX  # NaN fails too
                and type(ts) in _REAL and TS_MIN <= ts <= TS_MAX):
            self.invalid += 1
            return 0
        eps, theta = obj.get("epsilon"), obj.get("theta")
        eps = float(eps) if type(eps) in _REAL and 0 < eps <= _FLOAT_MAX else None
        theta = float(theta) if type(theta) in _REAL and 0 < theta <= _FLOAT_MAX else None
        segs = self._streams.setdefault(name, [])
        s = segs[-1] if segs else None
        if s is None or (s.ticks and ((eps is not None and s.epsilon not in (None, eps))
                                      or (theta is not None and s.theta not in (None, theta)))):
            s = Segment()  # releases of another epsilon or theta: another configuration
            segs.append(s)
        old = s.seen.get(tick)
        if old is not None:
            self.duplicates += 1
            if old != float(value):
                self.conflicts += 1
            return 0
        s.seen[tick] = float(value)
        s.ticks.append(tick)
        s.values.append(float(value))
        s.ts.append(float(ts))
        s.epsilon = eps if eps is not None else s.epsilon
        s.theta = theta if theta is not None else s.theta
        s.model = s._sorted = None
        return 1

    def _status(self, name: str, obj: dict[str, Any]) -> None:
        segs = self._streams.setdefault(name, [])
        key = _status_key(obj)
        s = segs[-1] if segs else None
        if s is not None and s.key == key:
            return
        if s is not None and s.status is None:  # releases that came before their status (MQTT orders topics apart)
            s.status, s.key, s.model = obj, key, None
            return
        segs.append(Segment(status=obj, key=key))

    # -- the series ---------------------------------------------------------------------------------------------
    @property
    def streams(self) -> list[str]:
        return sorted(n for n, segs in self._streams.items() if any(s.ticks for s in segs))

    def segments(self, stream: str | None = None) -> list[Segment]:
        """The configurations of a stream's releases, in the order they came."""
        name = self._name(stream)
        return [s for s in self._streams[name] if s.ticks]

    def _name(self, stream: str | None) -> str:
        names = self.streams
        if stream is None:
            if len(names) != 1:
                shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
                msg = (f"the releases hold {len(names)} streams ({shown}): choose one with --stream NAME"
                       if names else "no release in the source")
                raise QueryError(msg)
            return names[0]
        if stream not in names:
            msg = f"no release of stream {_short(stream)} ({len(names)} streams in the source)"
            raise QueryError(msg)
        return stream

    def segment(self, stream: str | None = None, *, first: int | None = None, last: int | None = None,
                generation: int | None = None, identity: str | None = None) -> tuple[str, Segment]:
        """The one configuration whose releases a range (``first..last``, default all) of a stream holds; a
        :class:`QueryError` when it holds two (choose with ``generation`` / ``identity``) or none."""
        name = self._name(stream)
        segs = [s for s in self._streams[name] if s.ticks]
        if generation is not None:
            segs = [s for s in segs if s.generation == generation]
        if identity is not None:
            segs = [s for s in segs if s.identity is not None and s.identity.startswith(identity)]
        lo = 0 if first is None else first
        hi = TICK_LIMIT if last is None else last
        hit = [s for s in segs if s.span[0] <= hi and s.span[1] >= lo]
        if not hit:
            msg = f"no release of stream {_short(name)} in ticks {lo}..{hi}" + (
                " of that configuration" if generation is not None or identity is not None else "")
            raise QueryError(msg)
        if len(hit) > 1:
            seen = "; ".join(s.describe() for s in hit[:3])
            msg = (f"stream {_short(name)}: the range holds releases of {len(hit)} configurations ({seen}); "
                   "choose one with --generation N or --identity ID (and --from/--to)")
            raise QueryError(msg)
        return name, hit[0]

    def series(self, stream: str | None = None, **choose: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ticks (sorted), values and times of one stream's releases (of its one configuration, or the one chosen
        with ``generation`` / ``identity``)."""
        _, s = self.segment(stream, **choose)
        return s.sorted()

    def as_array(self, length: int, stream: str | None = None) -> np.ndarray:
        """``length`` ticks from 0: the release of each tick, NaN where none (holdout ticks, lost releases)."""
        ticks, values, _ = self.series(stream)
        if ticks.size and ticks[-1] >= length:
            msg = f"a release is for tick {int(ticks[-1])} but the stream has {length} ticks"
            raise QueryError(msg)
        out = np.full(length, np.nan)
        out[ticks] = values
        return out

    # -- the parameters -----------------------------------------------------------------------------------------
    def params(self, stream: str | None = None, **choose: Any) -> dict[str, Any]:
        """The public parameters known for a stream: its status's (with theta), else the ones given by hand, and
        the releases' epsilon and theta."""
        _, s = self.segment(stream, **choose)
        return self._params(s)

    def _params(self, s: Segment) -> dict[str, Any]:
        p: dict[str, Any] = {}
        if s.status is not None:
            p.update(s.status["params"])
            if type(s.status.get("theta")) in _REAL:
                p["theta"] = s.status["theta"]
        else:
            p.update({k: v for k, v in self.overrides.items() if v is not None})
        if s.epsilon is not None and "epsilon" not in p:
            p["epsilon"] = s.epsilon
        if s.theta is not None:
            p["theta"] = s.theta
        return p

    def error_model(self, stream: str | None = None, **choose: Any) -> tuple[Any, int, str]:
        """The stream's error model (``RangeError`` or ``LocalRangeError``), its holdout (ticks before the first
        release) and a word on where the parameters came from; ``None`` when no interval can be computed (the
        word says why: a parameter out of the range ``operators.config`` holds every stream to is named with its
        range, as a status message may carry anything)."""
        _, s = self.segment(stream, **choose)
        if s.model is None:
            s.model = self._model(s)
        return s.model

    def _model(self, s: Segment) -> tuple[Any, int, str]:
        p = self._params(s)
        source = "the status" if s.status is not None else (
            "the command line" if self.overrides else "no status and no parameters")
        first, last_tick = s.span
        if s.status is None and not self.overrides:
            return None, first, ("the releases carry no status (the daemon's status line or retained message): "
                                 "give --config tops.toml")
        holdout = p.get("holdout", _DEFAULTS.holdout)
        try:
            check_parameter("holdout", holdout)
        except ConfigError as exc:
            return None, first, f"{exc} (from {source})"
        if p.get("holdout_scope") == "fleet":  # its hierarchy starts where the fleet holdout's readings of it end
            holdout = p.get("released_from")
            if type(holdout) is not int or not 0 <= holdout < 2**62:
                return None, first, f"a fleet stream's status without its released_from tick (from {source})"
        mode = p.get("mode", "central")
        mechanism = p.get("mechanism", p.get("method", "tops"))
        if mode == "local":
            return self._local_model(s, p, holdout, source)
        if mechanism != "tops":
            return None, holdout, f"no error model for mechanism {_short(mechanism)}"
        if "epsilon" not in p or "theta" not in p:
            return None, holdout, "no epsilon/theta in the releases"
        if first < holdout:
            return None, holdout, (f"a release at tick {first} precedes the holdout m = {holdout} "
                                   f"(from {source})")
        try:
            model = NoiseModel(**{k: p.get(k, getattr(_DEFAULTS, k)) for k in _MODEL_PARAMETERS},
                               epsilon=p["epsilon"], theta=p["theta"], start_sd=p.get("start_sd", 0.0))
        except (ConfigError, TypeError) as exc:
            return None, holdout, f"{exc} (from {source})"
        if not model.linear:
            return None, holdout, f"no error model for the {model.smoother} smoother"
        if model.leaves_per_tree > MODEL_LEAVES_MAX:
            return None, holdout, (f"a tree of {model.leaves_per_tree} leaves (r / b^s) is beyond the error model "
                                   f"(at most {MODEL_LEAVES_MAX})")
        span = last_tick - holdout + 1
        if span > MODEL_TICKS_MAX:
            return None, holdout, f"{span} ticks after the holdout: beyond the error model (at most 2^26)"
        extra = self._statistics(p)
        if isinstance(extra, str):
            return None, holdout, f"{extra} (from {source})"
        trunc, spread, nothing = extra
        x = np.full(span, np.nan)
        x[np.asarray(s.ticks, dtype=np.int64) - holdout] = s.values
        lower, bound = p.get("lower", 0.0), p.get("bound")
        if not (type(lower) in _REAL and math.isfinite(lower)):
            lower = 0.0
        if not (type(bound) in _REAL and math.isfinite(bound) and bound > lower):
            bound = None
        err = self.range_error(model, x, trunc, lower=float(lower), bound=bound, spread=spread,
                               nothing_truncated=nothing, level=self.level)
        return err, holdout, source.removeprefix("the ")

    @staticmethod
    def _statistics(p: dict[str, Any]) -> tuple[Truncation | None, Spread | None, bool] | str:
        """The status's truncation and spread statistics (None where absent), and whether nothing is truncated;
        a word when one is malformed."""
        try:
            trunc = Truncation.from_status(p["truncation"]) if p.get("truncation") is not None else None
            spread = Spread.from_status(p["spread"]) if p.get("spread") is not None else None
        except ValueError as exc:
            return str(exc)
        nothing = trunc is None and str(p.get("truncation_note", "")).startswith("theta is the bound")
        return trunc, spread, nothing

    def _local_model(self, s: Segment, p: dict[str, Any], holdout: int, source: str) -> tuple[Any, int, str]:
        eps, theta = p.get("epsilon"), p.get("theta")
        if not (type(eps) in _REAL and 0 < eps < 700 and type(theta) in _REAL and 0 < theta < _FLOAT_MAX):
            return None, holdout, f"no epsilon/theta for the local mode (from {source})"
        span = s.span[1] - holdout + 1
        if s.span[0] < holdout or span > MODEL_TICKS_MAX:
            return None, holdout, "the releases do not follow the holdout"
        extra = self._statistics(p)
        if isinstance(extra, str):
            return None, holdout, f"{extra} (from {source})"
        x = np.full(span, np.nan)
        x[np.asarray(s.ticks, dtype=np.int64) - holdout] = s.values
        bound = p.get("bound")
        bound = float(bound) if type(bound) in _REAL and math.isfinite(bound) and bound > 0 else None
        err = LocalRangeError(float(eps), float(theta), x, extra[0], bound=bound, level=self.level)
        return err, holdout, source.removeprefix("the ")

    # -- answers ------------------------------------------------------------------------------------------------
    def range_sum(self, first: int, last: int, *, stream: str | None = None, **choose: Any) -> Answer:
        """The sum of the releases at ticks ``first..last`` (inclusive), with its interval for the true sum."""
        if last < first:
            msg = f"empty tick range {first}..{last}"
            raise QueryError(msg)
        name, s = self.segment(stream, first=first, last=last, **choose)
        ticks, values, _ = s.sorted()
        lo, hi = np.searchsorted(ticks, first, "left"), np.searchsorted(ticks, last, "right")
        return self._answer(name, s, ticks[lo:hi], values[lo:hi], first, last)

    def _answer(self, name: str, s: Segment, ticks: np.ndarray, values: np.ndarray, first: int, last: int,
                start: float | None = None) -> Answer:
        if s.model is None:
            s.model = self._model(s)
        err, holdout, word = s.model
        expected = max(0, last - max(first, holdout) + 1)
        ans = Answer(name, int(first), int(last), float(values.sum()), int(ticks.size),
                     max(0, expected - int(ticks.size)), start=start)
        if err is None:
            ans.note = word
            return ans
        if not ticks.size:
            ans.note = "no release in the range"
            return ans
        iv: Interval = err.interval(int(ticks[0]) - holdout, int(ticks[-1]) - holdout)
        ans.low, ans.high = iv.low, iv.high
        ans.noise_sd, ans.smoother_sd = iv.noise_sd, iv.smoother_sd
        ans.truncation_mean, ans.truncation_sd = iv.truncation_mean, iv.truncation_sd
        ans.clamped_to_theta, ans.note = iv.clamped_to_theta, iv.note
        return ans

    def per(self, window: int | str | float, *, stream: str | None = None, first: int | None = None,
            last: int | None = None, **choose: Any) -> list[Answer]:
        """Totals per window: ``window`` ticks (an int, counted from tick 0), or ``"minute"``, ``"hour"``, ``"day"``
        or a number of seconds (a float: by the releases' times, aligned to multiples of it since the epoch, UTC)."""
        units = {"minute": 60.0, "hour": 3600.0, "day": 86400.0}
        if isinstance(window, str):
            if window not in units:
                msg = f"a window is minute, hour, day or a number (got {_short(window)})"
                raise QueryError(msg)
            return self.windows(stream, seconds=units[window], first=first, last=last, **choose)
        if isinstance(window, int):
            return self.windows(stream, ticks=window, first=first, last=last, **choose)
        return self.windows(stream, seconds=float(window), first=first, last=last, **choose)

    def windows(self, stream: str | None = None, *, ticks: int | None = None, seconds: float | None = None,
                first: int | None = None, last: int | None = None, **choose: Any) -> list[Answer]:
        """Totals per window: ``ticks`` per window counted from tick 0, or ``seconds`` per window of the releases'
        times (``ts``, aligned to multiples of ``seconds`` since the epoch, UTC)."""
        name, s = self.segment(stream, first=first, last=last, **choose)
        t, v, ts = s.sorted()
        keep = np.ones(t.size, dtype=bool)
        if first is not None:
            keep &= t >= first
        if last is not None:
            keep &= t <= last
        t, v, ts = t[keep], v[keep], ts[keep]
        if not t.size:
            return []
        if (ticks is None) == (seconds is None):
            msg = "give a window in ticks or in seconds"
            raise QueryError(msg)
        if ticks is not None:
            if ticks < 1:
                msg = "a window is at least 1 tick"
                raise QueryError(msg)
            key = t // ticks
        else:
            if not seconds or seconds <= 0 or not math.isfinite(seconds):
                msg = "a window is a positive number of seconds"
                raise QueryError(msg)
            if not np.any(ts):
                msg = "the releases carry no time (ts): give the window in ticks"
                raise QueryError(msg)
            key = np.floor(ts / seconds).astype(np.int64)
        out = []
        cuts = np.flatnonzero(np.diff(key)) + 1
        for lo, hi in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [t.size]]), strict=True):
            k = int(key[lo])
            if ticks is not None:
                a, b, start = k * ticks, k * ticks + ticks - 1, None
            else:
                a, b, start = int(t[lo]), int(t[hi - 1]), k * float(seconds)
            out.append(self._answer(name, s, t[lo:hi], v[lo:hi], a, b, start))
        return out

"""``tops query``: range sums and windowed totals of releases, with an error bar from the public parameters.

A release is one noisy value per tick; it means something summed over a range. This module reads releases as the
daemon writes them (its stdout JSONL, or MQTT payloads: one JSON object, or a JSON array of them with
``[output] batch``), keeps one release per ``(stream, tick)`` (QoS 1 may deliver a message twice; a release is final,
so a repeat is dropped), and answers sums over tick ranges or over windows of ticks or of time.

Every answer carries the standard deviation of its noise, :class:`operators.error_bar.NoiseModel` (Eq. 1 there),
from the stream's public parameters: ``epsilon`` and ``theta`` come with every release; the hierarchy (holdout, r,
b, s, smoother, resolution) from the stream's retained status message (``params``, published by the daemon) or from
the command line / ``--config tops.toml``. The bar is the noise only: truncation to theta and the smoother's
prediction inside partly covered leaves add a data-dependent bias that no public parameter bounds.

Python::

    from stream.commands.query import Releases
    rel = Releases.from_file("releases.jsonl")
    ans = rel.range_sum("meter-1", 65536, 69631)     # ticks 65536..69631 inclusive
    ans.total, ans.stderr
    per_hour = rel.windows("meter-1", seconds=3600)

>>> rel = Releases({"holdout": 1, "query_range": 16, "fanout": 4, "smoother_layers": 1})
>>> rel.add_payload(b'[{"stream":"a","tick":3,"ts":0.0,"value":1.5,"epsilon":1.0,"theta":4.0},'
...                 b'{"stream":"a","tick":4,"ts":0.0,"value":2.0,"epsilon":1.0,"theta":4.0}]')
2
>>> rel.add_payload(b'{"stream":"a","tick":4,"ts":0.0,"value":2.0,"epsilon":1.0,"theta":4.0}')   # a repeat
0
>>> ans = rel.range_sum("a", 0, 10)
>>> ans.total, ans.released, rel.duplicates, round(ans.stderr, 2)
(3.5, 2, 1, 5.64)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from operators.config import SMOOTHERS, ConfigError, ToPSConfig, check_parameter
from operators.error_bar import LINEAR_SMOOTHERS, NoiseModel
from stream.commands.failure import refuse
from stream.commands.inputs import JSONInputError, file_lines, load_json
from stream.core.payload import TS_MAX, TS_MIN

__all__ = ["Answer", "QueryError", "Releases", "add_arguments", "main"]

Z95 = 1.959963984540054  # two-sided 95 % of the normal
TICK_LIMIT = 1 << 63  # a tick is a non-negative 63-bit integer (the daemon's ticks are int64)
WINDOW_TICKS_MAX = 1 << 62  # the widest window in ticks (wider ones hold the same ticks)
MODEL_LEAVES_MAX = 1 << 22  # the error model walks a tree's leaves in arrays: 32 MiB each at this many
_FLOAT_MAX = sys.float_info.max
_REAL = frozenset((int, float))  # the types of a JSON number (a bool is neither)


class QueryError(Exception):
    """A source or a query cannot be answered; the message says why (never a released value of another stream)."""


@dataclass
class Answer:
    """The sum of the releases of ``stream`` at ticks ``first..last`` (inclusive) that were received."""

    stream: str
    first: int
    last: int
    total: float
    released: int  # releases summed
    missing: int  # ticks of the range after the holdout with no release received
    stderr: float | None  # standard deviation of the noise of ``total`` (None: no error model)
    start: float | None = None  # window start time (seconds), for time windows

    @property
    def half_width(self) -> float | None:
        """The 95 % half-width of the noise, normal approximation (``1.96 stderr``)."""
        return None if self.stderr is None else Z95 * self.stderr


@dataclass
class _Series:
    ticks: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    ts: list[float] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)
    epsilon: float | None = None
    theta: float | None = None
    params: dict[str, Any] | None = None  # from the status message


class Releases:
    """Releases of one or more streams, one per ``(stream, tick)``."""

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        self._series: dict[str, _Series] = {}
        self.duplicates = 0  # repeats dropped (same stream and tick)
        self.conflicts = 0  # repeats with another value (never expected: releases are final)
        self.invalid = 0  # lines or objects that are not releases nor status
        self.overrides = dict(params or {})  # public parameters given by the user (win over the status)

    # -- input --------------------------------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path, params: dict[str, Any] | None = None) -> Releases:
        """The releases of a file, a payload a line (lines longer than ``MAX_LINE_BYTES`` are counted invalid)."""
        rel = cls(params)
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
                if isinstance(obj.get("params"), dict):
                    self._series.setdefault(name, _Series()).params = obj["params"]
                return 0
            self.invalid += 1
            return 0
        tick, value, ts = obj.get("tick"), obj.get("value"), obj.get("ts", 0.0)
        if not (type(tick) is int and 0 <= tick < TICK_LIMIT  # JSON numbers are int or float, never bool here
                and type(value) in _REAL and -_FLOAT_MAX <= value <= _FLOAT_MAX  # NaN fails too
                and type(ts) in _REAL and TS_MIN <= ts <= TS_MAX):
            self.invalid += 1
            return 0
        s = self._series.setdefault(name, _Series())
        if tick in s.seen:
            self.duplicates += 1
            return 0
        s.seen.add(tick)
        s.ticks.append(tick)
        s.values.append(float(value))
        s.ts.append(float(ts))
        for key in ("epsilon", "theta"):
            v = obj.get(key)
            if type(v) in _REAL and 0 < v <= _FLOAT_MAX:  # the error model checks their ranges
                setattr(s, key, float(v))
        return 1

    # -- the series ---------------------------------------------------------------------------------------------
    @property
    def streams(self) -> list[str]:
        return sorted(n for n, s in self._series.items() if s.ticks)

    def _get(self, stream: str | None) -> tuple[str, _Series]:
        names = self.streams
        if stream is None:
            if len(names) != 1:
                shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
                msg = (f"the releases hold {len(names)} streams ({shown}): choose one with --stream NAME"
                       if names else "no release in the source")
                raise QueryError(msg)
            stream = names[0]
        if stream not in names:
            msg = f"no release of stream {stream!r} ({len(names)} streams in the source)"
            raise QueryError(msg)
        return stream, self._series[stream]

    def series(self, stream: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ticks (sorted), values and times of one stream."""
        _, s = self._get(stream)
        order = np.argsort(np.asarray(s.ticks, dtype=np.int64), kind="stable")
        return (
            np.asarray(s.ticks, dtype=np.int64)[order],
            np.asarray(s.values, dtype=np.float64)[order],
            np.asarray(s.ts, dtype=np.float64)[order],
        )

    def as_array(self, length: int, stream: str | None = None) -> np.ndarray:
        """``length`` ticks from 0: the release of each tick, NaN where none (holdout ticks, lost releases)."""
        ticks, values, _ = self.series(stream)
        if ticks.size and ticks[-1] >= length:
            msg = f"a release is for tick {int(ticks[-1])} but the stream has {length} ticks"
            raise QueryError(msg)
        out = np.full(length, np.nan)
        out[ticks] = values
        return out

    def params(self, stream: str | None = None) -> dict[str, Any]:
        """The public parameters known for a stream: the status message's, then the user's, then the releases'."""
        _, s = self._get(stream)
        p: dict[str, Any] = dict(s.params or {})
        p.update({k: v for k, v in self.overrides.items() if v is not None})
        if s.epsilon is not None and "epsilon" not in self.overrides:
            p["epsilon"] = s.epsilon
        if s.theta is not None:
            p["theta"] = s.theta
        return p

    def noise_model(self, stream: str | None = None) -> tuple[NoiseModel | None, int, str]:
        """The stream's noise model, its holdout (ticks before the first release) and a word on where the parameters
        came from; ``None`` when an error bar cannot be computed (the word says why: a parameter out of the range
        ``operators.config`` holds every stream to is named with its range, as a status message may carry anything).
        With a holdout out of range, the ticks before the first release count as the holdout."""
        name, s = self._get(stream)
        p = self.params(name)
        source = "the status message" if s.params else "the command line and defaults"
        defaults = _DEFAULTS
        holdout = p.get("holdout", defaults.holdout)
        try:
            check_parameter("holdout", holdout)
        except ConfigError as exc:
            return None, min(s.ticks), f"{exc} (from {source})"
        if p.get("method", "tops") != "tops":
            return None, holdout, f"no error model for method {_short(p['method'])}"
        if "epsilon" not in p or "theta" not in p:
            return None, holdout, "no epsilon/theta in the releases"
        if min(s.ticks) < holdout:
            return None, holdout, (f"a release at tick {min(s.ticks)} precedes the holdout m = {holdout}: "
                                   "give --holdout or --config")
        try:
            model = NoiseModel(**{k: p.get(k, getattr(defaults, k)) for k in _MODEL_PARAMETERS},
                               epsilon=p["epsilon"], theta=p["theta"])
        except ConfigError as exc:
            return None, holdout, f"{exc} (from {source})"
        if model.smoother not in LINEAR_SMOOTHERS:
            return None, holdout, f"no error model for the {model.smoother} smoother"
        if model.leaves_per_tree > MODEL_LEAVES_MAX:
            return None, holdout, (f"a tree of {model.leaves_per_tree} leaves (r / b^s) is beyond the error model "
                                   f"(at most {MODEL_LEAVES_MAX})")
        return model, holdout, source.removeprefix("the ")

    # -- answers ------------------------------------------------------------------------------------------------
    def range_sum(self, stream: str | None, first: int, last: int) -> Answer:
        """The sum of the releases at ticks ``first..last`` (inclusive), with its noise standard deviation."""
        name, _ = self._get(stream)
        if last < first:
            msg = f"empty tick range {first}..{last}"
            raise QueryError(msg)
        ticks, values, _ = self.series(name)
        lo, hi = np.searchsorted(ticks, first, "left"), np.searchsorted(ticks, last, "right")
        return self._answer(name, ticks[lo:hi], values[lo:hi], first, last)

    def _answer(self, name: str, ticks: np.ndarray, values: np.ndarray, first: int, last: int,
                start: float | None = None) -> Answer:
        model, holdout, _ = self.noise_model(name)
        expected = max(0, last - max(first, holdout) + 1)
        stderr = None
        if model is not None:
            stderr = model.stderr(ticks - holdout) if ticks.size else 0.0
        return Answer(name, int(first), int(last), float(values.sum()), int(ticks.size),
                      max(0, expected - int(ticks.size)), stderr, start)

    def windows(self, stream: str | None = None, *, ticks: int | None = None, seconds: float | None = None,
                first: int | None = None, last: int | None = None) -> list[Answer]:
        """Totals per window: ``ticks`` per window counted from tick 0, or ``seconds`` per window of the releases'
        times (``ts``, aligned to multiples of ``seconds`` since the epoch, UTC)."""
        name, _ = self._get(stream)
        t, v, ts = self.series(name)
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
            if not seconds or seconds <= 0:
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
            out.append(self._answer(name, t[lo:hi], v[lo:hi], a, b, start))
        return out


# -- the parameters -----------------------------------------------------------------------------------------------
_DEFAULTS = ToPSConfig(epsilon=1.0, bound=1.0)
_MODEL_PARAMETERS = ("fanout", "query_range", "smoother_layers", "smoother", "alpha", "window", "resolution")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# -- the command --------------------------------------------------------------------------------------------------
_UNITS = {"minute": 60.0, "hour": 3600.0, "day": 86400.0}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", nargs="?", help="a file of releases (the daemon's JSONL, or saved MQTT payloads)")
    p.add_argument("--stream", help="the stream to answer for (required when the source holds several)")
    p.add_argument("--from", dest="first", type=int, help="first tick of the range (default: the first release)")
    p.add_argument("--to", dest="last", type=int, help="last tick of the range, inclusive (default: the last)")
    p.add_argument("--per", help="totals per window: minute, hour, day (by the releases' ts) or a number of ticks")
    p.add_argument("--json", action="store_true", help="one JSON object per answer")
    live = p.add_argument_group("live, from the daemon's output topic (MQTT)")
    live.add_argument("--host", help="the broker: read releases live instead of from a file")
    live.add_argument("--port", type=int, default=1883, help="broker port (default 1883)")
    live.add_argument("--topic", action="append",
                      help="topic filter(s) of releases and status (default dp/#, the daemon's default topics)")
    live.add_argument("--seconds", type=float, default=10.0, help="how long to listen (default 10)")
    live.add_argument("--releases", type=int, help="stop as soon as this many releases are in")
    live.add_argument("--username", help="MQTT user")
    live.add_argument("--password-file", help="file whose first line is the MQTT password")
    live.add_argument("--ca-file", help="CA bundle: connect with TLS")
    params = p.add_argument_group("public parameters (default: from the status message, else tops's defaults)")
    params.add_argument("--config", help="a tops.toml whose [streams.template] the daemon runs")
    params.add_argument("--holdout", type=int, help="m (ticks before the first release)")
    params.add_argument("--range", dest="query_range", type=int, help="r")
    params.add_argument("--fanout", type=int, help="b")
    params.add_argument("--smoother", choices=SMOOTHERS, help="the smoother")
    params.add_argument("--smoother-layers", type=int, help="s (default: Eq. 7)")
    params.add_argument("--alpha", type=float, help="EMA weight")
    params.add_argument("--window", type=int, help="moving-average window")
    params.add_argument("--resolution", type=float, help="quantization step")
    params.add_argument("--epsilon", type=float, help="eps (default: from the releases)")


# the command line's parameters: option -> parameter of operators.config
_OPTIONS = {"holdout": "--holdout", "query_range": "--range", "fanout": "--fanout", "smoother": "--smoother",
            "smoother_layers": "--smoother-layers", "alpha": "--alpha", "window": "--window",
            "resolution": "--resolution", "epsilon": "--epsilon"}


def _config_params(path: str) -> dict[str, Any]:
    """The public parameters of the ``[streams.template]`` of a tops.toml, checked as the daemon checks them."""
    from stream.core.config import read_toml
    from stream.core.errors import ConfigFileError

    try:
        doc = read_toml(path)
    except ConfigFileError as exc:
        raise QueryError(str(exc)) from None
    streams = doc.get("streams", {})
    tpl = streams.get("template", {}) if isinstance(streams, dict) else None
    if not isinstance(tpl, dict):
        msg = f"{path}: [streams] and [streams.template] must be tables"
        raise QueryError(msg)
    try:
        cfg = ToPSConfig(**{"epsilon": 1.0, "bound": 1.0, **tpl})
    except ConfigError as exc:
        msg = f"{path} [streams.template] {exc}"
        raise QueryError(msg) from None
    except TypeError:
        known = ", ".join(f.name for f in fields(ToPSConfig))
        msg = f"{path} [streams.template]: an unknown key (known: {known})"
        raise QueryError(msg) from None
    p: dict[str, Any] = dict(holdout=cfg.holdout_ticks, query_range=cfg.query_range, fanout=cfg.fanout,
                             smoother=cfg.smoother, smoother_layers=cfg.smoother_layers, alpha=cfg.alpha,
                             window=cfg.window, resolution=cfg.resolution)
    if "epsilon" in tpl:
        p["epsilon"] = cfg.epsilon
    method = streams.get("method")
    if method:
        p["method"] = method
    return p


def _user_params(args: argparse.Namespace) -> dict[str, Any]:
    """The parameters given by ``--config`` and the options, each in the range ``operators.config`` holds every
    stream to (how they fit together with a status message's is checked when the error model is built)."""
    p = _config_params(args.config) if args.config else {}
    for key, option in _OPTIONS.items():
        v = getattr(args, key)
        if v is not None:
            try:
                check_parameter(key, v)
            except ConfigError as exc:
                msg = f"{option}: {exc}"
                raise QueryError(msg) from None
            p[key] = v
    return p


def _tick_option(option: str, value: int | None) -> int | None:
    if value is not None and not 0 <= value < TICK_LIMIT:
        msg = f"{option} must be a tick in [0, 2^63) (got {_short(value)})"
        raise QueryError(msg)
    return value


def _window_ticks(per: str) -> int:
    """``--per N``: a window of N ticks, 1 <= N <= 2^62."""
    try:
        width: int | None = int(per)
    except ValueError:  # not an integer, or more than Python's 4,300 digits
        width = None
    if width is None or not 1 <= width <= WINDOW_TICKS_MAX:
        msg = f"--per must be minute, hour, day or a number of ticks in [1, 2^62] (got {_short(per)})"
        raise QueryError(msg)
    return width


async def collect_live(rel: Releases, *, host: str, port: int, topics: list[str], seconds: float,
                       releases: int | None, username: str | None = None, password: str | None = None,
                       ca_file: str | None = None, on_ready: Any = None) -> int:
    """Subscribe to ``topics`` and add every payload to ``rel`` for ``seconds`` (or until ``releases`` are in);
    ``on_ready()`` is called once subscribed."""
    import ssl

    import aiomqtt

    tls = ssl.create_default_context(cafile=ca_file) if ca_file else None
    got = 0
    deadline = time.monotonic() + seconds
    async with aiomqtt.Client(host, port, username=username, password=password, tls_context=tls,
                              identifier=f"tops-query-{id(rel):x}") as client:
        for t in topics:
            await client.subscribe(t, qos=1)
        if on_ready is not None:
            on_ready()
        messages = client.messages.__aiter__()
        while releases is None or got < releases:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                msg = await asyncio.wait_for(anext(messages), timeout=left)
            except (TimeoutError, StopAsyncIteration):
                break
            payload = msg.payload
            got += rel.add_payload(payload if isinstance(payload, bytes | str) else bytes(payload))
    return got


def _fmt(a: Answer, per_time: bool) -> str:
    bar = "n/a" if a.stderr is None else f"{a.half_width:.4g}"
    sd = "n/a" if a.stderr is None else f"{a.stderr:.4g}"
    when = ""
    if per_time and a.start is not None:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(a.start)) + "  "
    return (f"{a.stream}  {when}ticks {a.first}..{a.last}  sum {a.total:.6g} +- {bar} (95%, noise sd {sd})  "
            f"releases {a.released}" + (f"  missing {a.missing}" if a.missing and not per_time else ""))


def main(args: argparse.Namespace) -> int:
    try:
        user = _user_params(args)
        _tick_option("--from", args.first)
        _tick_option("--to", args.last)
        if args.per and args.per not in _UNITS:
            _window_ticks(args.per)
        if args.host:
            if args.source:
                msg = "give a file or --host, not both"
                raise QueryError(msg)
            password = None
            if args.password_file:
                try:
                    password = Path(args.password_file).read_text().splitlines()[0].strip()
                except (OSError, IndexError, ValueError):  # ValueError: not UTF-8
                    msg = f"--password-file {args.password_file!r} cannot be read or is empty"
                    raise QueryError(msg) from None
            rel = Releases(user)
            try:
                asyncio.run(collect_live(rel, host=args.host, port=args.port, topics=args.topic or ["dp/#"],
                                         seconds=args.seconds, releases=args.releases, username=args.username,
                                         password=password, ca_file=args.ca_file,
                                         on_ready=lambda: print(f"listening on {args.host}:{args.port}",
                                                                file=sys.stderr, flush=True)))
            except Exception as exc:  # aiomqtt.MqttError and OS errors: one line
                msg = f"MQTT {args.host}:{args.port}: {type(exc).__name__}: {exc}"
                raise QueryError(msg) from None
        elif args.source:
            rel = Releases.from_file(args.source, user)
        else:
            msg = "give a file of releases or --host BROKER"
            raise QueryError(msg)
        name, _ = rel._get(args.stream)
        model, holdout, source = rel.noise_model(name)
        ticks, _, _ = rel.series(name)
        first = int(ticks[0]) if args.first is None else args.first
        last = int(ticks[-1]) if args.last is None else args.last
        if args.per:
            if args.per in _UNITS:
                answers = rel.windows(name, seconds=_UNITS[args.per], first=first, last=last)
            else:
                answers = rel.windows(name, ticks=_window_ticks(args.per), first=first, last=last)
        else:
            answers = [rel.range_sum(name, first, last)]
    except QueryError as exc:
        return refuse("query", exc)
    note = f"error bars from {source}" if model is not None else f"no error bar: {source}"
    if model is not None:
        note += (f" (eps {model.epsilon:g}, theta {model.theta:g}, holdout {holdout}, r {model.query_range}, "
                 f"b {model.fanout}, s {model.s}, {model.smoother})")
    extra = [f"{rel.duplicates} repeated releases dropped"] if rel.duplicates else []
    if rel.invalid:
        extra.append(f"{rel.invalid} lines that are not releases skipped")
    print("; ".join([note, *extra]), file=sys.stderr)
    for a in answers:
        if args.json:
            d = asdict(a)
            d["half_width_95"] = a.half_width
            print(json.dumps(d))
        else:
            print(_fmt(a, args.per in _UNITS if args.per else False))
    return 0

"""``tops query``: range sums and windowed totals of releases, each with a 95 % interval for the true sum.

It reads releases as the daemon writes them (its stdout JSONL, with a status line before each stream's first
release, or MQTT payloads with the retained status: one JSON object, or a JSON array of them with ``[output]
batch``) and needs no parameter: the status says what the releases mean (:mod:`stream.query.releases`). For
releases without a status (saved before status lines existed), ``--config tops.toml`` or the options give the
hierarchy; the interval then leaves out what only the status carries (the truncation statistic).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from operators.config import SMOOTHERS, ConfigError, ToPSConfig, check_parameter
from stream.commands.failure import refuse
from stream.query.releases import TICK_LIMIT, Answer, QueryError, Releases

__all__ = ["add_arguments", "main"]

WINDOW_TICKS_MAX = 1 << 62  # the widest window in ticks (wider ones hold the same ticks)
_UNITS = {"minute": 60.0, "hour": 3600.0, "day": 86400.0}
_PLOT_WINDOWS = 100  # --plot without --per: about this many windows of ticks


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", nargs="?", help="a file of releases (the daemon's JSONL, or saved MQTT payloads)")
    p.add_argument("--stream", help="the stream to answer for (required when the source holds several)")
    p.add_argument("--from", dest="first", type=int, help="first tick of the range (default: the first release)")
    p.add_argument("--to", dest="last", type=int, help="last tick of the range, inclusive (default: the last)")
    p.add_argument("--per", help="totals per window: minute, hour, day (by the releases' ts) or a number of ticks")
    p.add_argument("--json", action="store_true", help="one JSON object per answer (total, low, high, ...)")
    p.add_argument("--level", type=float, default=0.95,
                   help="how often the interval holds the true sum (default 0.95; in [0.5, 1))")
    p.add_argument("--generation", type=int,
                   help="the releases of this key generation only (a stream restarted as a new generation)")
    p.add_argument("--identity", help="the releases of this run or store identity only (a prefix is enough)")
    p.add_argument("--plot", metavar="FILE", help="draw the released totals per window with their intervals "
                   "(matplotlib; pip install -e '.[plot]')")
    p.add_argument("--truth", metavar="FILE", help="with --plot: the readings (.npy, .csv, .jsonl; tick t = line t) "
                   "drawn as the true totals")
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
    params = p.add_argument_group("public parameters of releases without a status (a status wins over them)")
    params.add_argument("--config", help="a tops.toml whose [streams.template] the daemon ran")
    params.add_argument("--holdout", type=int, help="m (ticks before the first release)")
    params.add_argument("--range", dest="query_range", type=int, help="r")
    params.add_argument("--fanout", type=int, help="b")
    params.add_argument("--smoother", choices=tuple(SMOOTHERS), help="the smoother")
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
                             window=cfg.window, resolution=cfg.resolution, lower=cfg.lower, bound=cfg.bound)
    if "epsilon" in tpl:
        p["epsilon"] = cfg.epsilon
    method = streams.get("method")
    if method:
        p["mechanism"] = method
    return p


def _user_params(args: argparse.Namespace) -> dict[str, Any]:
    """The parameters given by ``--config`` and the options, each in the range ``operators.config`` holds every
    stream to (how they fit together is checked when the error model is built)."""
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


def _fmt(a: Answer, per_time: bool, level: float = 0.95) -> str:
    when = ""
    if per_time and a.start is not None:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(a.start)) + "  "
    if a.low is None or a.high is None:
        bar = "no interval"
    else:
        of = "the sum clamped to theta" if a.clamped_to_theta else "the true sum"
        bar = f"in [{a.low:.6g}, {a.high:.6g}] ({100 * level:g}%, {of})"
    return (f"{a.stream}  {when}ticks {a.first}..{a.last}  sum {a.total:.6g}  {bar}  releases {a.released}"
            + (f"  missing {a.missing}" if a.missing and not per_time else ""))


def _header(rel: Releases, name: str, choose: dict[str, Any]) -> str:
    """The first line on stderr: where the parameters came from, and what the interval covers."""
    err, holdout, word = rel.error_model(name, **choose)
    if err is None:
        return f"no error bar: {word}"
    p = rel.params(name, **choose)
    mode = p.get("mode", "central")
    if mode == "local":
        text = (f"intervals from {word} (local topl, eps {p.get('epsilon', 0):g}, theta {p.get('theta', 0):g}, "
                f"holdout {holdout})")
    else:
        m = err.model
        text = (f"intervals from {word} (central tops, eps {m.epsilon:g}, theta {m.theta:g}, holdout {holdout}, "
                f"r {m.query_range}, b {m.fanout}, s {m.s}, {m.smoother})")
    note = p.get("truncation_note") if p.get("truncation") is None else None
    if note is None and p.get("truncation") is None and mode == "local":
        note = "local mode: nothing measured the readings above theta"
    if note is None and p.get("truncation") is None and word == "command line":
        note = "no status: nothing says how much truncation at theta took"
    return text + (f"; {note}" if note else "")


def _plot(path: str, rel: Releases, name: str, answers: list[Answer], truth: np.ndarray | None) -> None:
    """The released totals per window with their intervals and, where given, the true totals."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        msg = "--plot needs matplotlib (pip install -e '.[plot]')"
        raise QueryError(msg) from None
    x = np.array([(a.first + a.last) / 2.0 for a in answers])
    tot = np.array([a.total for a in answers])
    fig, ax = plt.subplots(figsize=(10, 4.5))
    has = np.array([a.low is not None for a in answers])
    if has.any():  # the interval is for the true total: it need not hold the released one
        lo = np.array([a.low for a in answers if a.low is not None])
        hi = np.array([a.high for a in answers if a.high is not None])
        ax.vlines(x[has], lo, hi, lw=2.5, alpha=0.35, label="95 % interval for the true total")
    ax.plot(x, tot, "o", ms=3, label="released total")
    if truth is not None:
        c = np.concatenate([[0.0], np.cumsum(truth)])
        ok = [a.last < truth.size for a in answers]
        tx = [xx for xx, k in zip(x, ok, strict=True) if k]
        ty = [c[a.last + 1] - c[a.first] for a, k in zip(answers, ok, strict=True) if k]
        ax.plot(tx, ty, "x", color="black", ms=4, label="true total")
    ax.set_xlabel("tick")
    ax.set_ylabel("total per window")
    ax.set_title(f"{name}: released totals per {answers[0].last - answers[0].first + 1 if answers else 0} ticks")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        msg = f"--plot {path}: {exc.strerror or 'cannot write'}"
        raise QueryError(msg) from None
    finally:
        plt.close(fig)


def _read_truth(path: str, stream: str | None) -> np.ndarray:
    from stream.commands.inputs import InputError, read_stream

    try:
        return read_stream(path, stream)
    except InputError as exc:
        raise QueryError(f"--truth: {exc}") from None


def main(args: argparse.Namespace) -> int:
    try:
        user = _user_params(args)
        _tick_option("--from", args.first)
        _tick_option("--to", args.last)
        if args.per and args.per not in _UNITS:
            _window_ticks(args.per)
        if args.truth and not args.plot:
            msg = "--truth is drawn with --plot FILE"
            raise QueryError(msg)
        if args.host:
            if args.source:
                msg = "give a file or --host, not both"
                raise QueryError(msg)
            rel = _live(args, user)
        elif args.source:
            rel = Releases.from_file(args.source, user, level=args.level)
        else:
            msg = "give a file of releases or --host BROKER"
            raise QueryError(msg)
        choose = {k: v for k, v in (("generation", args.generation), ("identity", args.identity)) if v is not None}
        name, s = rel.segment(args.stream, first=args.first, last=args.last, **choose)
        first = s.span[0] if args.first is None else args.first
        last = s.span[1] if args.last is None else args.last
        per = args.per
        if per is None and args.plot:
            per = str(max(1, -(-(last - first + 1) // _PLOT_WINDOWS)))
        if per:
            window: int | str = per if per in _UNITS else _window_ticks(per)
            answers = rel.per(window, stream=name, first=first, last=last, **choose)
        else:
            answers = [rel.range_sum(first, last, stream=name, **choose)]
        header = _header(rel, name, choose)
        if args.plot:
            truth = _read_truth(args.truth, args.stream) if args.truth else None
            _plot(args.plot, rel, name, answers, truth)
    except QueryError as exc:
        return refuse("query", exc)
    extra = [f"{rel.duplicates} repeated releases dropped"] if rel.duplicates else []
    if rel.invalid:
        extra.append(f"{rel.invalid} lines that are not releases skipped")
    print("; ".join([header, *extra]), file=sys.stderr)
    if args.plot:
        print(f"plot written to {args.plot}", file=sys.stderr)
    per_time = bool(per) and per in _UNITS
    for a in answers:
        print(json.dumps(a.to_dict()) if args.json else _fmt(a, per_time, args.level))
    return 0


def _live(args: argparse.Namespace, user: dict[str, Any]) -> Releases:
    import asyncio

    from stream.query.live import collect_live

    password = None
    if args.password_file:
        try:
            password = Path(args.password_file).read_text().splitlines()[0].strip()
        except (OSError, IndexError, ValueError):  # ValueError: not UTF-8
            msg = f"--password-file {args.password_file!r} cannot be read or is empty"
            raise QueryError(msg) from None
    rel = Releases(user, level=args.level)
    try:
        asyncio.run(collect_live(rel, host=args.host, port=args.port, topics=args.topic or ["dp/#"],
                                 seconds=args.seconds, releases=args.releases, username=args.username,
                                 password=password, ca_file=args.ca_file,
                                 on_ready=lambda: print(f"listening on {args.host}:{args.port}", file=sys.stderr,
                                                        flush=True)))
    except Exception as exc:  # aiomqtt.MqttError and OS errors: one line
        msg = f"MQTT {args.host}:{args.port}: {type(exc).__name__}: {exc}"
        raise QueryError(msg) from None
    return rel

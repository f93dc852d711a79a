"""``tops replay-categorical``: a categorical or range-counting stream from a file through the daemon's operator.

Contract::

    tops replay-categorical INPUT --config tops.toml [--stream NAME]
        [--key HEX | --key-file FILE --identity ID [--generation G]] [--first TS] [--last TS] [--out FILE|-]

INPUT holds the readings as the daemon takes them on stdin (one JSON object a line, ``{"stream", "value", "ts",
"seq"}``; ``ts`` required), or, for a local stream, the devices' reports (``{"report", "phase", "ts", "seq"}``, phase
``categorical`` or ``range``). The configuration's ``[ticks] period`` cuts them into periods exactly as the daemon's
event clock does; every period from ``--first`` (the ``ts`` of the daemon's tick 0, default the period of the first
reading) to ``--last`` (default the last reading's) is released, empty ones included, with the same encoder: with the
stream's key (central) the lines equal the daemon's releases byte for byte. A repeated or older ``seq`` is skipped, as
the daemon skips it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from types import SimpleNamespace
from typing import Any

from operators import ConfigError
from stream.commands.replay import key_from_args
from stream.core.config import histogram_operator, load_config
from stream.core.errors import ConfigFileError, PayloadError
from stream.core.payload import decode_line, decode_reports
from stream.core.router import ReleaseBatch
from stream.core.sinks import encode_releases
from stream.core.ticking import CategoryBins, PeriodClock

__all__ = ["add_arguments", "main", "replay_categorical"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="JSONL readings (central) or device reports (local), each with ts")
    p.add_argument("--config", required=True, help="the daemon's configuration ([streams] kind = \"categorical\")")
    p.add_argument("--stream", default=None, help="the stream to replay (and whose key to derive); default: all "
                   "lines, named by the first")
    p.add_argument("--key", help="the stream key, 64 hex digits (central; default: a fresh random key)")
    p.add_argument("--key-file", help="the daemon's master key file (with --stream and --identity)")
    p.add_argument("--identity", help="with --key-file: the identity the daemon printed at start")
    p.add_argument("--generation", type=int, default=1, help="the stream's key generation (default 1)")
    p.add_argument("--first", type=float, default=None, help="ts of the stream's tick 0 (the end of its first "
                   "period, as in its first release); default: the period of the first reading")
    p.add_argument("--last", type=float, default=None, help="ts of the last period to release (default: the last "
                   "reading's period)")
    p.add_argument("--out", default="-", help="JSONL output (default stdout)")


def _readings(lines: list[bytes], stream: str | None, local: str | None) -> tuple[str | None,
                                                                                 list[tuple[float, float, int | None]]]:
    """(stream name, [(value, ts, seq)]) of the lines that belong to ``stream``; ``local``: the phase of the
    reports kept (``categorical`` or ``range``), None for central readings."""
    out: list[tuple[float, float, int | None]] = []
    name = stream
    for raw in lines:
        if not raw.strip():
            continue
        try:
            if local:
                reports, _ = decode_reports(raw)
                items = [(None, y, ts, seq) for y, ts, seq, phase, _ in reports if phase == local]
            else:
                readings, _ = decode_line(raw)
                items = list(readings)
        except PayloadError:
            continue
        for s, v, ts, seq in items:
            if s is not None:
                if name is None:
                    name = s
                if s != name:
                    continue
            if ts is None:
                msg = "every reading needs its ts (the period it belongs to)"
                raise ValueError(msg)
            out.append((v, ts, seq))
    return name, out


def replay_categorical(readings: list[tuple[float, float, int | None]], op: Any, clock: PeriodClock,
                       first: float | None = None, last: float | None = None) -> tuple[list[int], list[float],
                                                                                       list[dict[str, Any]]]:
    """(ticks, ts, releases) of the periods ``first .. last`` (their end times) from ``readings``."""
    if not readings and (first is None or last is None):
        return [], [], []
    k0 = clock.index(readings[0][1]) if first is None else clock.index(first - clock.period / 2)
    k1 = max(clock.index(ts) for _, ts, _ in readings) if last is None else clock.index(last - clock.period / 2)
    bins = CategoryBins(k0)
    last_seq: int | None = None
    for value, ts, seq in readings:
        if seq is not None:
            if last_seq is not None and seq <= last_seq:
                continue
        k = clock.index(ts)
        if k > k1 or not op.valid(value) or k < bins.first or not bins.add(k, op.category_of(value)):
            continue
        if seq is not None:
            last_seq = seq
    tallies = bins.close_through(k1)
    return list(range(len(tallies))), [clock.end(k) for k in range(k0, k1 + 1)], op.process(tallies)


def main(args: argparse.Namespace) -> int:

    try:
        cfg = load_config(args.config)
    except ConfigFileError as exc:
        for p in exc.problems:
            print(f"tops replay-categorical: error: {p}", file=sys.stderr)
        return 2
    cat = cfg.category
    if cat is None:
        print("tops replay-categorical: error: the configuration is not [streams] kind = \"categorical\" or \"range\"",
              file=sys.stderr)
        return 2
    try:
        if cat.local:
            key, where = None, "none (local: the server holds no key)"
        else:
            key, where = key_from_args(args)
        with open(args.input, "rb") as f:
            lines = f.read().splitlines()
        phase = ("range" if hasattr(cat, "buckets") else "categorical") if cat.local else None
        name, readings = _readings(lines, args.stream, phase)
    except (ConfigError, OSError, ValueError) as exc:
        print(f"tops replay-categorical: error: {exc}", file=sys.stderr)
        return 2
    op = histogram_operator(cat, key)
    clock = PeriodClock(cfg.ticks.period)
    ticks, ts, rel = replay_categorical(readings, op, clock, args.first, args.last)
    rec = SimpleNamespace(name_json=json.dumps(name or cfg.input.default_stream))
    batch = ReleaseBatch(rec, ticks, ts, rel, math.nan)
    text = "".join(line + "\n" for line in encode_releases(batch, cfg.release_epsilon))
    if args.out == "-":
        sys.stdout.write(text)
    else:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    mech = getattr(cat, "mechanism", "countofcounts")
    print(f"tops replay-categorical: {len(rel)} periods released, mechanism {mech}, key {where}",
          file=sys.stderr)
    return 0

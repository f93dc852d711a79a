"""``tops state``: a read-only look at the state store: streams, phase, ticks released, theta, eps, and a fleet
holdout's progress or theta (no secrets);
and ``tops state retire NAME...``: an operator retires streams for good, on a stopped daemon.

The look writes nothing: the store is opened read-only. Theta is itself a DP output; holdout histograms, partial leaf
sums and keys are never shown.

Retiring deletes a stream's state from the store (its slot and memory with it) and closes its ledger entry; should
the name send again, it starts as the next generation, with a new key (a key never meets new data twice). It needs
the daemon stopped (the data directory's lock) and stopped cleanly (no journaled readings of the stream that the
last checkpoint does not cover).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

from stream.commands.failure import refuse
from stream.state.store import Store, StoreError

_FLOAT_MAX = sys.float_info.max

__all__ = ["add_arguments", "main", "summarize"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help="the daemon's data directory (holds state.db)")
    p.add_argument("--config", help="a tops.toml whose [state] data_dir to read")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--ledger", action="store_true", help="print the privacy ledger instead of the streams")
    p.add_argument("action", nargs="*", metavar="retire NAME",
                   help="retire the named streams for good (the daemon must be stopped)")


def _data_dir(args: argparse.Namespace) -> Path:
    if args.data_dir:
        return Path(args.data_dir)
    if args.config:
        from stream.core.config import read_toml
        from stream.core.errors import ConfigFileError

        try:
            cfg = read_toml(args.config)
        except ConfigFileError as exc:
            raise StoreError(str(exc)) from None
        section = cfg.get("state", {})
        d = section.get("data_dir", "auto") if isinstance(section, dict) else None
        if not isinstance(d, str):
            msg = f"{args.config}: [state] data_dir must be a string"
            raise StoreError(msg)
        if d == "auto":  # as `tops run --config` resolves it
            from stream.core.config import DEFAULT_DATA_DIR

            d = DEFAULT_DATA_DIR
        if d:
            return Path(d).expanduser()
        msg = f"{args.config} has no durable state ([state] data_dir = \"\")"
        raise StoreError(msg)
    msg = "give --data-dir DIR or --config tops.toml with [state] data_dir"
    raise StoreError(msg)


def _table(x: Any) -> dict:
    return x if isinstance(x, dict) else {}


def _count(x: Any) -> int | None:
    return x if type(x) is int and 0 <= x < 1 << 63 else None


def _real(x: Any) -> float | None:
    """A finite number of a stored row as a float, else None (shown as ``-``)."""
    if isinstance(x, int | float) and not isinstance(x, bool) and -_FLOAT_MAX <= x <= _FLOAT_MAX:
        return float(x)
    return None


def summarize(stream: dict) -> dict:
    """What may be shown of one stream. A field the row does not hold as it should (a store written by something
    else) is shown as missing, never trusted."""
    params = _table(stream["params"])
    state = _table(stream["state"])
    op = _table(state.get("operator"))
    ticks = _count(op.get("ticks", 0))
    theta_units = _real(op.get("theta_units"))
    resolution = _real(params.get("resolution", 1.0)) or 1.0
    holdout = 0 if params.get("theta") is not None else (_count(params.get("holdout", 0)) or 0)
    mode = params.get("mode", "central")
    if mode == "local":
        # the holdout of a local stream is reports, not ticks: every tick counted after theta is a release
        phase = op.get("phase", "holdout")
        theta = _real(op.get("theta"))
        released = ticks if theta is not None else 0
    else:
        phase = "holdout" if theta_units is None else "releasing"
        theta = None if theta_units is None else _real(theta_units * resolution)
        released = max(0, ticks - holdout) if phase != "holdout" and ticks is not None else 0
        if params.get("holdout_scope") == "fleet" and phase != "holdout":
            released = None  # its ticks count the readings the fleet holdout took of it, which it does not keep
    return {
        "stream": stream["name"],
        "generation": stream["generation"],
        "mode": mode if isinstance(mode, str) else None,
        "phase": phase if isinstance(phase, str) else None,
        "ticks": ticks,
        "released": released,
        "theta": theta,
        "epsilon": _real(params.get("epsilon")),
        "updated": stream["updated"],
    }


def retire(data_dir: Path, names: list[str]) -> list[str]:
    """Retire ``names`` in the store of ``data_dir``; returns one line per stream. :class:`StoreError` when the
    daemon runs, did not stop cleanly, or a name is unknown (then nothing is retired)."""
    from stream.daemon.preflight import DataDirLocked, lock_data_dir
    from stream.state.journal import Journal

    try:
        lock = lock_data_dir(data_dir)
    except DataDirLocked as exc:
        msg = f"{exc}: stop it first"
        raise StoreError(msg) from None
    if lock is None:
        msg = f"{data_dir} does not exist"
        raise StoreError(msg)
    try:
        store = Store.open(data_dir / "state.db", create=False)
        try:
            known = {s["name"]: s["generation"] for s in store.streams()}
            unknown = [n for n in names if n not in known]
            if unknown:
                msg = f"no stream {unknown[0]!r} in the store"
                raise StoreError(msg)
            jdir = data_dir / "journal"
            if jdir.is_dir():
                position = store.journal_position()
                for seg in Journal.segments_in(jdir):
                    if seg < position:
                        continue
                    path = jdir / f"seg-{seg:012d}.log"
                    try:
                        left = {r.stream for r in Journal._read_segment(path)}
                    except (OSError, ValueError):
                        left = set(names)
                    if left.intersection(names):
                        msg = ("the journal holds readings the last checkpoint does not cover (the daemon did not "
                               "stop cleanly): start and stop the daemon once, then retire")
                        raise StoreError(msg)
            lines = []
            for n in names:
                store.retire(n)
                lines.append(f"retired {n!r} (generation {known[n]}); should it send again, it starts as generation "
                             f"{known[n] + 1} with a new key")
            return lines
        finally:
            store.close()
    finally:
        lock.close()


def fleet_summary(text: str | None) -> str | None:
    """The line ``tops state`` shows of a stored fleet holdout (its progress, or the theta it chose: a DP output every
    stream's status states too); None without one. A stored value it cannot read is said so, never shown."""
    if text is None:
        return None
    try:
        d = json.loads(text)
    except ValueError:
        d = None
    d = _table(d)
    readings, taken, theta = _count(d.get("readings")), _count(d.get("taken")), _real(d.get("theta"))
    generation = _count(d.get("generation"))
    if readings is None or taken is None or generation is None:
        return "fleet holdout: stored in a form this tops cannot read"
    if theta is not None:
        return f"fleet holdout (generation {generation}): theta {theta:g}, chosen from {readings} readings"
    return (f"fleet holdout (generation {generation}): {taken} of {readings} readings taken, no theta yet (its "
            f"streams release none)")


def _read(data_dir: Path, ledger: bool) -> tuple[list[dict], str | None, str | None]:
    """The rows to show (streams or ledger) and the store's identity; :class:`StoreError` with one line when the
    store cannot be read (not SQLite, corrupt, rows that are not the JSON tops writes)."""
    path = data_dir / "state.db"
    store = Store.open(path, readonly=True)
    try:
        rows = store.ledger() if ledger else [summarize(s) for s in store.streams()]
        return rows, store.meta("identity"), fleet_summary(store.meta("fleet_holdout"))
    except (sqlite3.Error, ValueError, RecursionError) as exc:  # ValueError: JSON of a row, int() of a column
        msg = f"state store {path} holds rows this tops cannot read ({type(exc).__name__})"
        raise StoreError(msg) from None
    finally:
        store.close()


def main(args: argparse.Namespace) -> int:
    if args.action:
        if args.action[0] != "retire" or len(args.action) < 2:
            return refuse("state", "the only action is: retire NAME [NAME...]")
        try:
            for line in retire(_data_dir(args), args.action[1:]):
                print(line)
        except StoreError as exc:
            return refuse("state", exc)
        return 0
    try:
        rows, identity, fleet = _read(_data_dir(args), args.ledger)
    except StoreError as exc:
        return refuse("state", exc)
    if args.json:
        for r in rows:
            r["identity"] = identity
        print(json.dumps(rows, indent=2))
        return 0
    print(f"store identity {identity} (tops replay --identity; stream keys derive from it)")
    if fleet is not None:
        print(fleet)
    if not rows:
        print("no streams")
        return 0
    cols = list(rows[0])
    widths = {
        c: max(
            len(c), *(len("-" if r[c] is None else f"{r[c]:g}" if isinstance(r[c], float) else str(r[c])) for r in rows)
        )
        for c in cols
    }

    def fmt(v: object) -> str:
        return "-" if v is None else f"{v:g}" if isinstance(v, float) else str(v)

    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(fmt(r[c]).ljust(widths[c]) for c in cols))
    return 0

"""``tops state``: a read-only look at the state store: streams, phase, ticks released, theta, eps (no secrets);
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
import sys
import tomllib
from pathlib import Path

from stream.state.store import Store, StoreError

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
        try:
            cfg = tomllib.loads(Path(args.config).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            msg = f"cannot read {args.config}: {exc}"
            raise StoreError(msg) from None
        d = cfg.get("state", {}).get("data_dir", "auto")
        if d == "auto":  # as `tops run --config` resolves it
            from stream.core.config import DEFAULT_DATA_DIR

            d = DEFAULT_DATA_DIR
        if d:
            return Path(d).expanduser()
        msg = f"{args.config} has no durable state ([state] data_dir = \"\")"
        raise StoreError(msg)
    msg = "give --data-dir DIR or --config tops.toml with [state] data_dir"
    raise StoreError(msg)


def summarize(stream: dict) -> dict:
    """What may be shown of one stream."""
    params = stream["params"]
    state = stream["state"] or {}
    op = state.get("operator") or {}
    ticks = int(op.get("ticks", 0))
    theta_units = op.get("theta_units")
    resolution = float(params.get("resolution", 1.0))
    holdout = 0 if params.get("theta") is not None else int(params.get("holdout", 0))
    mode = params.get("mode", "central")
    if mode == "local":
        # the holdout of a local stream is reports, not ticks: every tick counted after theta is a release
        phase = op.get("phase", "holdout")
        theta = op.get("theta")
        released = ticks if theta is not None else 0
    else:
        phase = "holdout" if theta_units is None else "releasing"
        theta = None if theta_units is None else theta_units * resolution
        released = max(0, ticks - holdout) if phase != "holdout" else 0
    return {
        "stream": stream["name"],
        "generation": stream["generation"],
        "mode": mode,
        "phase": phase,
        "ticks": ticks,
        "released": released,
        "theta": theta,
        "epsilon": params.get("epsilon"),
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


def main(args: argparse.Namespace) -> int:
    if args.action:
        if args.action[0] != "retire" or len(args.action) < 2:
            print("tops state: error: the only action is: retire NAME [NAME...]", file=sys.stderr)
            return 2
        try:
            for line in retire(_data_dir(args), args.action[1:]):
                print(line)
        except StoreError as exc:
            print(f"tops state: error: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        store = Store.open(_data_dir(args) / "state.db", readonly=True)
        rows = store.ledger() if args.ledger else [summarize(s) for s in store.streams()]
        identity = store.meta("identity")
        store.close()
    except StoreError as exc:
        print(f"tops state: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        for r in rows:
            r["identity"] = identity
        print(json.dumps(rows, indent=2))
        return 0
    print(f"store identity {identity} (tops replay --identity; stream keys derive from it)")
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

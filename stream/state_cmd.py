"""``tops state``: a read-only look at the state store: streams, phase, ticks released, theta, eps (no secrets).

Nothing here writes: the store is opened read-only. Theta is itself a DP output; holdout histograms, partial leaf
sums and keys are never shown.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

from stream.store import Store, StoreError

__all__ = ["add_arguments", "main", "summarize"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help="the daemon's data directory (holds state.db)")
    p.add_argument("--config", help="a tops.toml whose [state] data_dir to read")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--ledger", action="store_true", help="print the privacy ledger instead of the streams")


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
            from stream.config import DEFAULT_DATA_DIR

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


def main(args: argparse.Namespace) -> int:
    try:
        store = Store.open(_data_dir(args) / "state.db", readonly=True)
        rows = store.ledger() if args.ledger else [summarize(s) for s in store.streams()]
        store.close()
    except StoreError as exc:
        print(f"tops state: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
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

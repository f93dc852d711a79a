"""A stream record's state as it is stored: what a record needs to continue exactly, and how it is put back.

Used by the daemon's checkpoints (:mod:`stream.daemon.durability`, SQLite) and by cluster workers
(:mod:`stream.cluster.worker`, the JetStream key-value store): the same JSON either way. No key and no raw reading is
in it (the holdout histogram while a stream is in its holdout: counts of readings per candidate cell).
"""

from __future__ import annotations

from itertools import compress
from typing import Any

from operators import ToPSConfig
from stream.core.router import StreamRecord
from stream.core.ticking import CategoryBins, PeriodBins

__all__ = ["STATE_VERSION", "apply_state", "operator_snapshot", "record_state"]

STATE_VERSION = 1


def record_state(rec: StreamRecord) -> dict[str, Any]:
    """What a stream record needs to continue exactly (no key, no raw reading; the holdout histogram while in it)."""
    bins = rec.bins
    return {
        "version": STATE_VERSION,
        "operator": _compact(rec.operator.snapshot()),
        "last_seq": rec.last_seq,
        "ticks": rec.ticks,
        "bins": None if bins is None else {"first": bins.first, "open": [
            [k, [[c, n] for c, n in v.items()] if isinstance(v, dict) else v] for k, v in bins.bins.items()]},
    }


def _compact(snap: dict[str, Any]) -> dict[str, Any]:
    """The operator snapshot as stored: without its ``config`` (the stream's parameters are stored beside it) and
    with the holdout histogram as its non-zero cells (at most ``m`` of them, against one cell per candidate)."""
    snap.pop("config", None)
    hist = snap.get("holdout_histogram")
    if isinstance(hist, list):
        idx = list(compress(range(len(hist)), hist))
        snap["holdout_histogram"] = {"cells": len(hist), "index": idx, "count": [hist[i] for i in idx]}
    return snap


def operator_snapshot(state: dict[str, Any], config: Any) -> dict[str, Any]:
    """The operator snapshot of a stored state, as the operator's ``restore`` takes it."""
    snap = dict(state["operator"])
    if "config" not in snap and isinstance(config, ToPSConfig):
        snap["config"] = config.to_dict()
    hist = snap.get("holdout_histogram")
    if isinstance(hist, dict):
        dense = [0] * int(hist["cells"])
        for i, c in zip(hist["index"], hist["count"], strict=True):
            dense[int(i)] = int(c)
        snap["holdout_histogram"] = dense
    return snap


def apply_state(rec: StreamRecord, state: dict[str, Any]) -> None:
    """Put the non-operator fields of a stored state back into a freshly created record."""
    rec.last_seq = state.get("last_seq")
    rec.ticks = int(state.get("ticks", rec.ticks))
    b = state.get("bins")
    if b is not None and isinstance(rec.bins, CategoryBins):
        rec.bins = CategoryBins(int(b["first"]))
        rec.bins.bins = {int(k): {int(c): int(n) for c, n in v} for k, v in b["open"]}
    elif b is not None and rec.bins is not None:
        rec.bins = PeriodBins(int(b["first"]))
        rec.bins.bins = {int(k): float(v) for k, v in b["open"]}

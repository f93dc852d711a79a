"""Where releases go: JSON encoding, the bounded publish queue (MQTT) and the stdout JSONL sink."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import deque
from collections.abc import Iterable
from typing import IO

from operators.tops import ToPS
from stream.router import ReleaseBatch, StreamRecord

__all__ = ["PublishQueue", "StdoutSink", "encode_releases", "encode_status"]


def encode_releases(batch: ReleaseBatch, epsilon: float) -> list[str]:
    """One JSON object per released tick: ``{"stream", "tick", "ts", "value", "epsilon", "theta"}``.

    >>> from types import SimpleNamespace
    >>> rec = SimpleNamespace(name_json='"m1"')
    >>> encode_releases(ReleaseBatch(rec, [5], [1.5], [2.0], 7.0), 1.0)
    ['{"stream":"m1","tick":5,"ts":1.5,"value":2.0,"epsilon":1.0,"theta":7.0}']
    """
    head = f'{{"stream":{batch.record.name_json},"tick":'
    tail = f',"epsilon":{float(epsilon)!r},"theta":{batch.theta!r}}}'
    ts = batch.ts
    if ts and ts[0] != 0.0 and ts.count(ts[0]) == len(ts):
        # one time for all (the readings of one step): formatted once. Equal floats other than +-0 have one repr.
        mid = f',"ts":{ts[0]!r},"value":'
        if len(batch.values) != len(ts) or len(batch.ticks) != len(ts):
            msg = "release batch columns differ in length"
            raise ValueError(msg)
        return [f'{head}{t}{mid}{v!r}{tail}' for t, v in zip(batch.ticks, batch.values, strict=True)]
    return [f'{head}{t},"ts":{ts!r},"value":{v!r}{tail}' for t, ts, v in zip(batch.ticks, batch.ts, batch.values,
                                                                           strict=True)]


def encode_status(rec: StreamRecord) -> bytes:
    """The retained status payload of a stream.

    A releasing ToPS stream also carries ``params``: the public parameters that, with the ``epsilon`` and ``theta``
    of every release, fix the noise of its releases (``tops query`` computes error bars from them; no secret, no
    data: theta is itself a DP output and already in every release).
    """
    status = rec.status()
    op = rec.operator
    if status.get("phase") == "releasing" and isinstance(op, ToPS) and op.smoother_layers is not None:
        cfg = op.config
        status["params"] = {
            "method": "tops",
            "epsilon": cfg.epsilon,
            "holdout": cfg.holdout_ticks,
            "query_range": cfg.query_range,
            "fanout": cfg.fanout,
            "smoother_layers": op.smoother_layers,
            "smoother": cfg.smoother,
            "alpha": cfg.alpha,
            "window": cfg.window,
            "resolution": cfg.resolution,
        }
    return json.dumps(status, separators=(",", ":")).encode()


class PublishQueue:
    """Messages ``(topic, payload, retain, n)`` waiting for the broker (``n``: releases carried, 0 for a status).

    Bounded: when full, the oldest message is dropped and its releases counted in ``dropped``.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: deque[tuple[str, bytes, bool, int]] = deque()
        self.dropped = 0  # releases dropped since the last take_dropped()
        self.nonempty = asyncio.Event()

    def __len__(self) -> int:
        return len(self.items)

    def put(self, topic: str, payload: bytes, retain: bool = False, n: int = 1) -> None:
        items = self.items
        if len(items) >= self.limit:
            self.dropped += items.popleft()[3]
        items.append((topic, payload, retain, n))
        self.nonempty.set()

    def put_many(self, messages: Iterable[tuple[str, bytes, bool, int]]) -> None:
        for m in messages:
            self.put(*m)

    def requeue(self, messages: list[tuple[str, bytes, bool, int]]) -> None:
        """Put unconfirmed messages back at the front, in their order (after a lost connection)."""
        self.items.extendleft(reversed(messages))
        if self.items:
            self.nonempty.set()

    def take_dropped(self) -> int:
        n, self.dropped = self.dropped, 0
        return n


class StdoutSink:
    """JSONL releases on a text stream (stdout by default), flushed after every processing step."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self.out = out if out is not None else sys.stdout

    def write(self, lines: list[str]) -> int:
        if lines:
            self.out.write("\n".join(lines) + "\n")
        return len(lines)

    def flush(self) -> None:
        try:
            self.out.flush()
        except (BrokenPipeError, ValueError):  # reader went away; nothing to do
            pass



"""Poison lines on stdin (10^400 in every field, a 5 MB line, hostile fuzz) and a stream whose operator raises: the
daemon exits 0, the other streams release everything, the failed stream is marked and counted, and no raw value
reaches the log."""

from __future__ import annotations

import json
import math
import random

from tests.support import HUGE, hostile_doc


# -- the daemon in-process: a poison line or a failing operator stops nothing else ----------------------------
class ExplodingOperator:
    """Raises on its third tick (a stand-in for an operator bug hit by one stream's data)."""

    phase = "holdout"
    holdout_left = 5

    def __init__(self) -> None:
        self.ticks = 0

    def process(self, values):
        for _ in values:
            self.process_one(0.0)
        return [math.nan] * len(values)

    def process_one(self, v: float) -> float:
        self.ticks += 1
        if self.ticks == 3:
            raise ZeroDivisionError
        return math.nan


def _metric(d, name: str) -> float:
    return {s.name + (str(s.labels) if s.labels else ""): s.value
            for f in d.metrics.registry.collect() for s in f.samples}[name]


def test_poison_lines_and_a_failing_operator_leave_the_other_streams_running(tmp_path) -> None:
    """Stdin: 10^400 in ts/seq/value, a 5 MB line (too_large, not "not UTF-8"), hostile fuzz lines and a stream
    whose operator raises: the daemon exits 0, `good` releases everything, `boom` is marked failed (status, gauge,
    readings counted `failed`), and no raw value reaches the log."""
    import asyncio
    import io
    import logging

    from stream.core.config import build_config
    from stream.daemon import service as daemon_mod
    from tests.support import FakeOperator

    cfg = build_config({"metrics": {"port": 0}, "input": {"max_payload_bytes": 1 << 20},
                        "streams": {"key_file": str(tmp_path / "k"), "template": {"epsilon": 1.0, "bound": 9.0}}})
    rng = random.Random(7)
    lines = [b'{"stream": "good", "value": 1}']
    lines += [b'{"stream": "good", "value": 1, "ts": %s}' % HUGE.encode(),
              b'{"stream": "good", "value": 1, "seq": %s}' % HUGE.encode(),
              b'{"stream": "good", "value": %s}' % HUGE.encode(),
              b'[{"stream": "good", "value": 1, "ts": %s}]' % HUGE.encode(),
              b"good,1,%s" % HUGE.encode(), b"7" * (5 << 20)]
    lines += [hostile_doc(rng).encode("utf-8", errors="surrogatepass") for _ in range(300)]
    lines += [b"boom,%d" % i for i in range(5)]
    lines += [b""] * 70_000  # the reader hands over 64 KiB at a time: what follows is processed after the failure
    lines += [b"boom,%d" % i for i in range(2)]
    lines += [b'{"stream": "good", "value": %d, "seq": %d}' % (i, i + 1) for i in range(2, 12)]
    out = io.StringIO()
    factory = {"good": lambda: FakeOperator(2), "boom": ExplodingOperator}
    d = daemon_mod.Daemon(cfg, stdin=io.BytesIO(b"\n".join(lines) + b"\n"), stdout=out,
                          operator_factory=lambda name: factory.get(name, lambda: FakeOperator(2))(),
                          install_signals=False)
    logs = io.StringIO()
    handler = logging.StreamHandler(logs)
    logging.getLogger("tops").addHandler(handler)
    try:
        assert asyncio.run(d.serve()) == 0
    finally:
        logging.getLogger("tops").removeHandler(handler)
    rel = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [r["tick"] for r in rel if r["stream"] == "good"] == list(range(2, 11))  # 11 readings, holdout 2
    boom = d.router.streams["boom"]
    assert boom.failed and boom.status() == {"stream": "boom", "phase": "failed", "identity": d.identity}
    assert _metric(d, "tops_streams_failed") == 1
    assert _metric(d, "tops_messages_total{'result': 'too_large'}") == 1
    assert _metric(d, "tops_messages_total{'result': 'failed'}") == 2  # the two lines after the failure
    assert _metric(d, "tops_readings_total{'result': 'failed'}") == 2
    text = logs.getvalue()
    assert "stream 'boom' failed" in text and "ZeroDivisionError" in text
    assert "1000000000" not in text and "7777777" not in text

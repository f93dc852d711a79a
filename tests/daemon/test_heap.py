"""The garbage collector's full passes stay short while a daemon holds many streams (stream/daemon/heap.py): what
lives is frozen as the daemon goes, a full pass walks only what was made since, a dropped stream is freed without the
collector (no cycle), and the rare sweep collects cyclic garbage that was frozen. Every part runs in a child process:
freezing pytest's own heap would hide its garbage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

_DAEMON = """
import gc, io, json, os, sys
from stream.core.config import build_config
from stream.daemon.heap import Heap
from stream.daemon.service import Daemon, settle_heap

cfg = build_config({
    "input": {"source": "stdin"}, "output": {"sinks": ["stdout"]},
    "streams": {"key_file": sys.argv[1], "max_streams": 10000,
                "template": {"epsilon": 1.0, "bound": 100.0, "holdout": HOLDOUT, "query_range": 256, "fanout": 4}},
    "state": {"data_dir": ""}, "metrics": {"port": 0}, "log": {"level": "warning"},
})
settle_heap()
d = Daemon(cfg, stdin=io.BytesIO(b""), stdout=open(os.devnull, "w"), install_signals=False, heap=HEAP)
d.startup()
"""


def _child(code: str, tmp: Path) -> dict:
    (tmp / "k").write_text("11" * 32 + "\n")
    (tmp / "k").chmod(0o600)
    out = subprocess.run([sys.executable, "-c", code, str(tmp / "k")], cwd=ROOT, capture_output=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    return json.loads(out.stdout.decode().splitlines()[-1])


@pytest.mark.parametrize("keeper", [False, True])
def test_a_full_pass_walks_only_what_was_made_since_the_last_freeze(tmp_path: Path, keeper: bool) -> None:
    """The attack: 3,000 streams in their holdout, then a full pass of the collector. Without the keeper the pass
    walks every stream's objects, about 8 each (a pause that grows with the streams);
    with it, once the accounting loop froze what lives, it walks fewer objects than there are streams."""
    code = _DAEMON.replace("HOLDOUT", "100").replace("HEAP", "Heap(freeze_every=0.0)" if keeper else "None") + """
for r in range(2):
    d.on_lines([f"s{k},{(7 * k + r) % 90}".encode() for k in range(3000)])
d.account()
print(json.dumps({"streams": len(d.router.streams), "holdout": d.router.in_holdout, "walked": len(gc.get_objects())}))
"""
    got = _child(code, tmp_path)
    assert got["streams"] == 3000 and got["holdout"] == 3000
    if keeper:
        assert got["walked"] < 1000, got
    else:  # the attack works without the keeper
        assert got["walked"] > 3000 * 4, got


def test_a_dropped_stream_is_freed_without_the_collector(tmp_path: Path) -> None:
    """Freezing is safe only if what the daemon drops is freed by reference counting: with the cyclic collector off,
    1,000 streams (half in their holdout, half releasing as rows) evicted leave none of their objects behind."""
    code = _DAEMON.replace("HOLDOUT", "3").replace("HEAP", "None") + """
gc.disable()
for r in range(4):
    d.on_lines([f"s{k},{(7 * k + r) % 90}".encode() for k in range(500)])
d.on_lines([f"h{k},{k % 90}".encode() for k in range(500)])
d.account()
kinds = ("ToPS", "StreamRecord", "BlockStats", "KeyedGenerator", "RowOperator", "HoldoutRow", "ConsistentNoise",
         "SmootherState")
def alive():
    return sum(type(o).__name__ in kinds for o in gc.get_objects())
held = alive()
phases = sorted({r.phase for r in d.router.streams.values()})
d.router.evict(list(d.router.streams))
print(json.dumps({"held": held, "left": alive(), "phases": phases}))
"""
    got = _child(code, tmp_path)
    assert got["phases"] == ["holdout", "releasing"]
    assert got["held"] >= 1000 * 2 and got["left"] == 0, got


def test_the_sweep_collects_cyclic_garbage_that_was_frozen(tmp_path: Path) -> None:
    """A freeze keeps whatever lives, cyclic garbage-to-be included (a library object that later forms a cycle):
    freezes alone never collect it, the sweep does (and freezes again). Young cyclic garbage is collected at each
    freeze, not frozen."""
    code = """
import gc, json
from stream.daemon.heap import Heap
now = [0.0]
h = Heap(freeze_every=2.0, sweep_every=100.0, clock=lambda: now[0])
class Node:
    live = 0
    def __init__(self):
        Node.live += 1
    def __del__(self):
        Node.live -= 1
def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a
gc.disable()                           # only the keeper collects
kept = [cycle() for _ in range(50)]    # alive at the freeze: 100 nodes
for _ in range(50):
    cycle()                            # cyclic garbage already: 100 nodes, collected by the freeze's young pass
now[0] = 1.0; h.tick(); early = h.freezes
now[0] = 2.5; h.tick(); at_freeze = Node.live
kept.clear()                           # now cyclic garbage, frozen
now[0] = 5.0; h.tick(); after_freeze = Node.live
now[0] = 101.0; h.tick()
print(json.dumps({"early": early, "at_freeze": at_freeze, "after_freeze": after_freeze, "freezes": h.freezes,
                  "sweeps": h.sweeps, "after_sweep": Node.live, "frozen": gc.get_freeze_count()}))
"""
    got = _child(code, tmp_path)
    assert got["early"] == 0 and got["at_freeze"] == 100, got
    assert got["after_freeze"] == 100 and got["freezes"] == 2, got  # freezes do not collect what they froze
    assert got["sweeps"] == 1 and got["after_sweep"] == 0 and got["frozen"] > 0, got


def test_tops_run_keeps_the_heap(tmp_path: Path) -> None:
    """`tops run` gives its daemon the keeper (tests that build a daemon in this process do not)."""
    from stream.cli import build_parser
    from stream.daemon import service
    from tests.support import write_toml

    (tmp_path / "k").write_text("11" * 32 + "\n")
    (tmp_path / "k").chmod(0o600)
    cfg = write_toml(tmp_path / "tops.toml", {
        "input": {"source": "stdin"}, "output": {"sinks": ["stdout"]},
        "streams": {"key_file": str(tmp_path / "k"), "template": {"epsilon": 1.0, "bound": 100.0, "holdout": 3}},
        "state": {"data_dir": ""}, "metrics": {"port": 0},
    })
    seen: dict = {}

    class Stub:
        def __init__(self, cfg, **kw) -> None:
            seen.update(kw)

        async def serve(self) -> int:
            return 0

    real_daemon, real_settle = service.Daemon, service.settle_heap
    service.Daemon, service.settle_heap = Stub, lambda: None
    try:
        code = service.main(build_parser("run").parse_args(["run", "--config", str(cfg)]))
    finally:
        service.Daemon, service.settle_heap = real_daemon, real_settle
    assert code == 0 and isinstance(seen.get("heap"), service.Heap)


def test_a_cluster_worker_keeps_the_heap_too(tmp_path: Path) -> None:
    """A cluster worker (`tops run` with `[input] source = "nats"`) holds its streams as objects too: it gets the
    keeper, and its main loop ticks it."""
    from stream.cli import build_parser
    from stream.cluster import worker
    from stream.daemon import service
    from tests.support import write_toml

    cfg = write_toml(tmp_path / "w.toml", {
        "input": {"source": "nats"}, "nats": {"servers": ["nats://127.0.0.1:1"]},
        "streams": {"key_file": str(tmp_path / "k"), "template": {"epsilon": 1.0, "bound": 100.0, "holdout": 3}},
        "metrics": {"port": 0},
    })
    seen: dict = {}
    real_run, real_settle = worker.run_worker, service.settle_heap
    worker.run_worker = lambda cfg, **kw: seen.update(kw) or 0
    service.settle_heap = lambda: None
    try:
        code = service.main(build_parser("run").parse_args(["run", "--config", str(cfg)]))
    finally:
        worker.run_worker, service.settle_heap = real_run, real_settle
    assert code == 0 and isinstance(seen.get("heap"), service.Heap)

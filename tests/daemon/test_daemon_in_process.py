"""The daemon in-process on stdin with a stand-in operator: ticks numbered per stream, bad lines counted,
releases as JSON lines; the defaults line without a configuration; status and idle-eviction passes that visit only the
streams concerned, never every stream."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

from stream.core.config import build_config
from stream.daemon import service as daemon_mod
from tests.support import FakeOperator

TPL = {"epsilon": 1.0, "bound": 100.0}


# -- the daemon in-process (stdin -> stdout) -----------------------------------------------------------------
def test_daemon_stdin_to_stdout_with_fake_operator(tmp_path: Path) -> None:
    """Mixed stdin lines: tick numbering per stream, bad lines counted, default stream, releases as JSONL."""
    cfg = build_config({"metrics": {"port": 0}, "streams": {"key_file": str(tmp_path / "k"), "template": TPL}})
    lines = b"\n".join([b"5", b"a,1", b"garbage", b"a,2", b'{"stream":"b","value":3}', b"6", b"a,nan", b"a,3",
                        b"7", b'[{"stream":"b","value":4}, {"stream":"b","value":5}]', b"nan"]) + b"\n"
    out = io.StringIO()
    d = daemon_mod.Daemon(cfg, stdin=io.BytesIO(lines), stdout=out, operator_factory=lambda _: FakeOperator(2),
                          install_signals=False)
    assert asyncio.run(d.serve()) == 0
    rel = [json.loads(x) for x in out.getvalue().splitlines()]
    got = {(r["stream"], r["tick"]): r["value"] for r in rel}
    assert got == {("default", 2): 7.5, ("a", 2): 3.5, ("b", 2): 5.5}
    assert all(r["epsilon"] == 1.0 and r["theta"] == 10.0 for r in rel)
    m = {s.name + str(s.labels): s.value for f in d.metrics.registry.collect() for s in f.samples}
    assert m["tops_messages_total{'result': 'invalid'}"] == 3
    assert m["tops_messages_total{'result': 'ok'}"] == 8
    assert m["tops_readings_total{'result': 'ok'}"] == 9
    assert m["tops_releases_total{'sink': 'stdout'}"] == 3
    assert not (tmp_path / "k").exists()  # the fake operator needs no key


def test_defaults_line_without_config() -> None:
    import argparse

    p = argparse.ArgumentParser()
    daemon_mod.add_arguments(p)
    cfg = daemon_mod.config_from_args(p.parse_args(["--bound", "300"]))
    line = daemon_mod.describe_defaults(cfg)
    assert "epsilon=1 bound=300 holdout=1000" in line and cfg.metrics.port == 0


class _NoWalk(dict):
    """A stream table that refuses to be walked (a walk of a million streams stops the event loop)."""

    def _refuse(self, *a, **k):
        raise AssertionError("a pass walked every stream")

    values = items = keys = __iter__ = _refuse


def test_a_status_pass_visits_the_streams_whose_status_is_due_not_all(tmp_path: Path) -> None:
    """The attack: 2,000 streams in their holdout, 3 of them take another reading; the status loop's pass must
    publish those 3 (each holdout reading makes a stream's status due) without walking the 2,000 (at a million
    streams a walk every `status_interval` would stop the event loop). A stream evicted after its status became due
    is skipped."""
    cfg = build_config({"metrics": {"port": 0}, "state": {"data_dir": ""}, "input": {"source": "stdin"},
                        "output": {"sinks": ["mqtt"], "status_topic": "dp/{stream}/status"},
                        "streams": {"key_file": str(tmp_path / "k"), "template": {**TPL, "holdout": 100}}})
    d = daemon_mod.Daemon(cfg, stdin=io.BytesIO(b""), install_signals=False)
    d.startup()  # no broker is needed: nothing is sent before serve() connects
    d.on_lines([f"s{k},{k % 50}".encode() for k in range(2000)])  # created: status published at once
    published: list[str] = []
    d.publish_status = lambda rec: (published.append(rec.name), setattr(rec, "status_due", False))  # type: ignore
    d.publish_statuses()  # the first readings' statuses went out with the creations: nothing due
    assert published == []
    d.on_lines([b"s7,1", b"s1999,2", b"s500,3", b"s3,4"])
    d.router.evict(["s3"])
    d.router.streams = _NoWalk(d.router.streams)
    d.publish_statuses()
    assert sorted(published) == ["s1999", "s500", "s7"]
    d.publish_statuses()
    assert sorted(published) == ["s1999", "s500", "s7"]  # once


def test_without_a_status_loop_no_stream_is_kept_pending(tmp_path: Path) -> None:
    """No status topic (or no MQTT output): nothing reads the pending names, so none are kept (a million holdout
    streams would otherwise hold a million names for nothing)."""
    cfg = build_config({"metrics": {"port": 0}, "state": {"data_dir": ""},
                        "streams": {"key_file": str(tmp_path / "k"), "template": {**TPL, "holdout": 100}}})
    d = daemon_mod.Daemon(cfg, stdin=io.BytesIO(b""), stdout=io.StringIO(), install_signals=False)
    d.startup()
    for r in range(2):
        d.on_lines([f"s{k},{(k + r) % 50}".encode() for k in range(500)])
    assert d.router.status_pending is None


def test_idle_eviction_finds_the_idle_streams_without_walking_every_stream(tmp_path: Path) -> None:
    """The attack: 2,000 streams, 3 of them take readings again; idle eviction must take the other 1,997 out of
    memory without walking the stream table (a walk of a million, every quarter of `idle_timeout`, stops the loop):
    the names are kept per window of last sight, and only old windows are visited. The 3 stay."""
    import time as _time

    cfg = build_config({"metrics": {"port": 0}, "state": {"data_dir": str(tmp_path / "state")},
                        "streams": {"key_file": str(tmp_path / "k"), "idle_timeout": 0.3,
                                    "template": {**TPL, "holdout": 100}}})
    d = daemon_mod.Daemon(cfg, stdin=io.BytesIO(b""), stdout=io.StringIO(), install_signals=False)
    d.startup()
    d.router.track_idle(0.075)  # what the evict loop does: windows of a quarter of idle_timeout
    d.on_lines([f"s{k},{k % 50}".encode() for k in range(2000)])
    _time.sleep(0.4)
    d.on_lines([b"s7,1", b"s1999,2", b"s500,3"])
    d.router.streams = _NoWalk(d.router.streams)
    gone = asyncio.run(d.evict_idle(0.3))
    assert gone == 1997
    assert sorted(dict.keys(d.router.streams)) == ["s1999", "s500", "s7"]
    d.durable.close()

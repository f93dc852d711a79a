"""Unit tests of the runtime parts: configuration checks, payload decoding, period ticks, routing, queues."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest

from stream.core.config import build_config
from stream.core.errors import ConfigFileError, PayloadError, StreamCapError
from stream.core.payload import decode_line, decode_payload, decode_payload_columns, decode_reports
from stream.core.router import Router
from stream.core.sinks import PublishQueue
from stream.core.ticking import PeriodBins, PeriodClock
from stream.daemon import service as daemon_mod
from stream.daemon.sources import TopicRouter, backoff_delay
from tests.support import NUMBER, ROOT, FakeOperator

TPL = {"epsilon": 1.0, "bound": 100.0}


# -- configuration -------------------------------------------------------------------------------------------
BAD_CONFIGS = [
    ({"mqtt": {"port": 0}}, "[mqtt] port must be an integer >= 1 and <= 65535 (got 0)"),
    ({"mqtt": {"hots": "x"}}, "[mqtt] unknown key 'hots'"),
    ({"input": {"source": "kafka"}}, "[input] source must be one of stdin, mqtt, nats (got 'kafka')"),
    ({"input": {"source": "mqtt", "topics": ["meters/#"]}}, "[input] topics: pattern 'meters/#' must have"),
    ({"input": {"qos": 2}}, "[input] qos must be an integer >= 0 and <= 1 (got 2)"),
    ({"output": {"topic": "dp/all"}}, "[output] topic must contain '{stream}'"),
    ({"output": {"sinks": ["kafka"]}}, "[output] sinks must be a list of mqtt, stdout"),
    ({"ticks": {"mode": "hourly"}}, "[ticks] mode must be one of reading, period (got 'hourly')"),
    ({"ticks": {"period": -1}}, "[ticks] period must be a number >= 0.01 (got -1)"),
    ({"streams": {"max_streams": "many"}}, "[streams] max_streams must be an integer >= 1 (got 'many')"),
    ({"metrics": {"port": 70000}}, "[metrics] port must be an integer >= 0 and <= 65535 (got 70000)"),
    ({"log": {"level": "loud"}}, "[log] level must be one of debug, info, warning, error (got 'loud')"),
    ({"streams": {"template": {"epsilon": 0, "bound": 5}}}, "[streams.template] epsilon must be a positive"),
    ({"streams": {"template": {"epsilon": 1, "bound": 5, "fanout": 1}}}, "[streams.template] fanout must be"),
    ({"streams": {"template": {"epsilon": 1, "bound": 5, "smoothr": "x"}}}, "[streams.template] unknown key"),
    ({"streams": {"template": {"bound": 5}}}, "[streams.template] epsilon required"),
    ({"nonsense": {}}, "unknown section [nonsense]"),
    ({"mqtt": {"tls": "yes"}}, "[mqtt] tls must be true or false (got 'yes')"),
    ({"mqtt": {"password_file": "/nonexistent/pw"}}, "[mqtt] password_file '/nonexistent/pw' cannot be read"),
]


@pytest.mark.parametrize(("doc", "line"), BAD_CONFIGS)
def test_each_bad_key_gives_one_clear_line(doc: dict, line: str) -> None:
    """One problem, one line that names the key and what is allowed."""
    doc = {k: dict(v) for k, v in doc.items()}
    doc.setdefault("streams", {}).setdefault("template", dict(TPL))
    with pytest.raises(ConfigFileError) as exc:
        build_config(doc)
    assert len(exc.value.problems) == 1, exc.value.problems
    assert exc.value.problems[0].startswith(line), exc.value.problems[0]
    assert "\n" not in exc.value.problems[0]


def test_all_problems_reported_and_exit_code_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`tops run --config` prints one line per problem and exits 2."""
    bad = tmp_path / "tops.toml"
    bad.write_text('[mqtt]\nport = "x"\n[ticks]\nmode = "hourly"\n[streams.template]\nepsilon = -1\nbound = 5\n')
    from stream.cli import main

    assert main(["run", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(x.startswith("tops run: [") for x in err), err
    assert main(["run", "--config", str(tmp_path / "missing.toml")]) == 2
    (tmp_path / "broken.toml").write_text("[mqtt\n")
    assert main(["run", "--config", str(tmp_path / "broken.toml")]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_deploy_example_config_is_valid(tmp_path: Path) -> None:
    """deploy/tops.toml passes the checks (with its password file present)."""
    import tomllib

    doc = tomllib.loads((ROOT / "deploy" / "tops.toml").read_text())
    pw = tmp_path / "pw"
    pw.write_text("secret\n")
    doc["mqtt"]["password_file"] = str(pw)
    cfg = build_config(doc)
    assert cfg.input.source == "mqtt" and cfg.ticks.mode == "period" and cfg.mqtt.password == "secret"  # noqa: S105 - a test value


def test_config_reference_documents_every_key() -> None:
    """The configuration reference (docs/configuration.md, its tables generated from the schema by the MkDocs hook
    docs/hooks/reference.py) has a table for every section and a row for every key of the schema and the template."""
    import importlib.util
    import re

    from stream.core.config import SCHEMA, TEMPLATE_DOCS

    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    page = reference.config_page((ROOT / "docs" / "configuration.md").read_text())

    def table(section: str) -> str:
        m = re.search(rf"^## \[{re.escape(section)}\]$(.*?)(?=^## |\Z)", page, flags=re.S | re.M)
        assert m, f"the configuration reference has no section [{section}]"
        return m.group(1)

    for section, fields in SCHEMA.items():
        body = table(section)
        for key in fields:
            assert f"| `{key}` |" in body, (section, key)
    body = table("streams.template")
    for key in TEMPLATE_DOCS:
        assert f"| `{key}` |" in body, key


# -- payloads ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("payload", [b"12", b" 12.5\n", b"0", b'{"value": 12}', b"1e3"])
def test_payload_numbers(payload: bytes) -> None:
    readings, bad = decode_payload(payload)
    assert bad == 0 and len(readings) == 1 and readings[0][1] >= 0


@pytest.mark.parametrize("payload", [b"nan", b"-inf", b"inf", b"\xff\xfe", b"", b"{", b'{"value": "1"}',
                                     b'{"value": true}', b'{"value": null}', b"[]", b'"5"', b"null",
                                     b'{"value": 1, "seq": -1}', b'{"value": 1, "seq": 1.5}',
                                     b'{"value": 1, "ts": "x"}', b'{"value": 1e400}', b"[" * 100000])
def test_payload_rejected_without_echo(payload: bytes) -> None:
    with pytest.raises(PayloadError) as exc:
        decode_payload(payload)
    shown = payload.decode(errors="ignore").strip()[:5]
    assert not shown or shown not in str(exc.value)  # the message never echoes the payload


READINGS = ("17.25", "4242")  # ordinary readings, as a device writes them
ECHO_CASES = [
    (decode_payload, b'{"value": 17.25, "ts": "x"}'), (decode_payload, b'{"value": 4242, "seq": -1}'),
    (decode_payload, b'{"value": 17.25, "seq": 1.5}'), (decode_payload, b'{"value": 4242, "ts": -17.25}'),
    (decode_payload, b'{"value": "17.25"}'), (decode_payload, b'"4242"'), (decode_payload, b'{"value": 17.25, "x'),
    (decode_payload, b"17.25 4242"), (decode_payload_columns, b'{"value": 4242, "ts": "x"}'),
    (decode_payload_columns, b'{"value": 17.25, "seq": "4242"}'), (decode_line, b"m,17.25,x"),
    (decode_line, b"m,4242,17.25,1"), (decode_line, b"m/4242,17.25"), (decode_line, b"m,17.25x"),
    (decode_line, b'{"stream": "m", "value": 4242, "ts": "x"}'), (decode_line, b'{"stream": 4242, "value": 17.25}'),
    (decode_reports, b'{"report": 17.25, "phase": "x"}'), (decode_reports, b'{"report": 4242, "phase": "stream", '
                                                                           b'"theta": -17.25}'),
    (decode_reports, b'{"report": 17.25, "phase": "stream", "seq": 4242.5}'), (decode_reports, b"17.25"),
]


def echoed(payload: bytes, message: str) -> list[str]:
    """The ordinary readings of ``payload`` that ``message`` carries as a whole number (however it prints them:
    4242 echoed from a parsed float reads 4242.0)."""
    shown = {float(t) for t in NUMBER.findall(message)}
    return [r for r in READINGS if r.encode() in payload and float(r) in shown]


@pytest.mark.parametrize(("decode", "payload"), ECHO_CASES, ids=[f"{f.__name__}-{i}" for i, (f, _) in
                                                                  enumerate(ECHO_CASES)])
def test_a_rejection_never_echoes_an_ordinary_reading(decode, payload: bytes) -> None:
    with pytest.raises(PayloadError) as exc:
        decode(payload)
    assert not echoed(payload, str(exc.value)), str(exc.value)


def test_payload_batch_partial() -> None:
    readings, bad = decode_payload(b'[1, {"value": 2, "seq": 3, "ts": 5}, -1, "x", {"value": false}]')
    assert readings == [(None, 1.0, None, None), (None, 2.0, 5.0, 3), (None, -1.0, None, None)] and bad == 2


def test_stdin_lines() -> None:
    assert decode_line(b"7\n") == ([(None, 7.0, None, None)], 0)
    assert decode_line(b"m1,7,100.5") == ([("m1", 7.0, 100.5, None)], 0)
    assert decode_line(b'{"stream": "m2", "value": 1, "seq": 0}') == ([("m2", 1.0, None, 0)], 0)
    assert decode_line(b"") == ([], 0)
    assert decode_line(b"m,-1") == ([("m", -1.0, None, None)], 0)  # clamped by the operator, never dropped
    for bad in (b"a/b,1", b"a#b,1", b"m,nan", b"m,x", b"a,b,c,d", b'{"stream": "a+b", "value": 1}',
                b'{"stream": 5, "value": 1}'):
        with pytest.raises(PayloadError):
            decode_line(bad)


def test_topic_router() -> None:
    r = TopicRouter(["meters/+/reading", "site/x/+"])
    assert r.stream("meters/m1/reading") == "m1" and r.stream("site/x/y") == "y"
    assert r.stream("meters//reading") is None and r.stream("meters/a/b/reading") is None
    assert r.stream("other/m1/reading") is None


# -- ticks and routing ---------------------------------------------------------------------------------------
def test_period_clock_and_bins() -> None:
    c = PeriodClock(60.0, lateness=5.0)
    assert c.index(119.9) == 1 and c.end(1) == 120.0
    assert c.last_closable(124.9) == 0 and c.last_closable(125.0) == 1
    assert c.next_close(100.0) == 125.0
    b = PeriodBins(first=3)
    assert b.add(3, 1.0) and b.add(5, 2.0) and not b.add(2, 1.0)
    assert b.close_through(6) == [1.0, 0.0, 2.0, 0.0] and b.first == 7


def test_router_periods_release_empty_periods_and_drop_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """Event-time periods: every period releases (0 when empty), late events are counted and dropped."""
    now = 1000.0
    monkeypatch.setattr("stream.core.router.time.time", lambda: now)
    ops: dict[str, FakeOperator] = {}

    def factory(name: str) -> FakeOperator:
        ops[name] = FakeOperator(holdout=0)
        ops[name].theta = 10.0
        return ops[name]

    r = Router(factory, 10, clock=PeriodClock(10.0, lateness=2.0), aggregate="sum", event_time=True)
    rec = r.record("s")
    assert rec.bins is not None and rec.bins.first == 99  # period 99 = [990, 1000) is still open (lateness)
    assert r.add(rec, 4.0, 995.0, None, now) == "ok"
    assert r.add(rec, 1.0, 1001.0, None, now) == "ok"
    assert r.add(rec, 2.0, 1005.0, None, now) == "ok"
    assert r.add(rec, 9.0, 985.0, None, now) == "late"
    assert r.add(rec, 9.0, 1500.0, None, now) == "invalid"  # far in the future
    batches = r.close_periods(1041.9)  # closes 99, 100, 101, 102 (103 closes at 1040 + lateness)
    assert len(batches) == 1
    assert ops["s"].seen == [4.0, 3.0, 0.0, 0.0]
    assert batches[0].ticks == [0, 1, 2, 3] and batches[0].ts == [1000.0, 1010.0, 1020.0, 1030.0]
    assert r.take_counts() == {"ok": 3, "late": 1, "duplicate": 0, "invalid": 1, "failed": 0}
    assert r.add(rec, 5.0, 1030.0, None, 1041.9) == "ok"  # period 103 = [1030, 1040) still open
    assert r.close_periods(1042.0)[0].ticks == [4]
    assert r.add(rec, 5.0, 1035.0, None, 1042.0) == "late"
    final = r.close_periods(1043.0, final=True)  # shutdown: the current period 104 closes too
    assert final[0].ticks == [5] and ops["s"].seen[-2:] == [5.0, 0.0]


def test_router_count_aggregate_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("stream.core.router.time.time", lambda: 100.0)
    op = FakeOperator(holdout=0)
    op.theta = 5.0
    r = Router(lambda _: op, 10, clock=PeriodClock(1.0), aggregate="count", event_time=False)
    rec = r.record("c")
    for v in (7.0, 8.0, 9.0):
        r.add(rec, v, 5.0, None, 100.2)  # ts ignored on the wall clock
    r.close_periods(102.0)
    assert op.seen == [3.0, 0.0]


def test_router_readings_seq_and_cap() -> None:
    r = Router(lambda _: FakeOperator(holdout=2), max_streams=2)
    a = r.record("a")
    for i, v in enumerate([1.0, 2.0, 3.0, 4.0]):
        assert r.add(a, v, 10.0 + i, i, 0.0) == "ok"
    assert r.add(a, 9.0, None, 3, 0.0) == "duplicate"
    batches = r.flush()
    assert batches[0].ticks == [2, 3] and batches[0].values == [3.5, 4.5] and batches[0].ts == [12.0, 13.0]
    assert a.ticks == 4 and a.last_seq == 3 and a.phase == "releasing" and r.in_holdout == 0
    assert [(x.name, phase) for x, phase in r.status_now] == [("a", "holdout"), ("a", "releasing")]
    r.record("b")
    with pytest.raises(StreamCapError):
        r.record("c")


def test_publish_queue_never_drops_and_spills_to_disk_while_disconnected(tmp_path: Path) -> None:
    """Nothing is dropped: past the limit the queue says "no room" (intake waits); while disconnected, with a spill,
    the rest goes to disk in order and comes back in order; the disk budget ends the room, never a message."""
    from stream.state.spill import Spill

    async def go() -> None:
        q = PublishQueue(limit=3)
        for i in range(5):
            q.put("t", str(i).encode(), False, 1)
        q.requeue([("t", b"x", False, 1)])
        assert [p for _, p, _, _ in q.items] == [b"x", b"0", b"1", b"2", b"3", b"4"] and q.take_dropped() == 0
        assert not q.has_room()
        q.items.clear()
        q.spill = Spill.open(tmp_path, max_bytes=70, fsync=False)
        q.set_connected(False)
        for i in range(8):
            q.put("t", f"m{i}".encode(), False, 1)
        assert len(q.items) == 3 and len(q.spill) == 5 and len(q) == 8
        assert not q.has_room()  # the disk budget (70 bytes) is reached: intake waits
        q.put("t", b"m8", False, 1)  # made anyway (a period tick): kept, in memory
        q.set_connected(True)
        out = []
        while len(q):
            while q.items:
                out.append(q.items.popleft()[1])
            q.taken()
        assert out[:3] == [b"m0", b"m1", b"m2"] and sorted(out) == [f"m{i}".encode() for i in range(9)]
        assert q.has_room()

    asyncio.run(go())


def test_spill_survives_a_restart_and_cuts_a_torn_tail(tmp_path: Path) -> None:
    """The unread part of the spill (from the position recorded after the last checkpoint) is read again after a
    restart; a torn last record is cut off; a spill read to its end is deleted at the next commit."""
    from stream.state.spill import Spill

    s = Spill.open(tmp_path, fsync=False)
    s.append([("a", b"1", False, 1), ("b", b"2", True, 0), ("c", b"3", False, 2)])
    s.sync()
    assert [m[1] for m in s.read(1)] == [b"1"]
    s.commit()
    s.append([("d", b"4", False, 1)])
    s.sync()
    s.close()
    with (tmp_path / "outbox-0.spill").open("ab") as f:
        f.write(b"\x00\x00\x00\x05tor")  # a record cut short by a crash
    s = Spill.open(tmp_path, fsync=False)
    assert len(s) == 3 and s.read(10) == [("b", b"2", True, 0), ("c", b"3", False, 2), ("d", b"4", False, 1)]
    s.commit()
    assert not (tmp_path / "outbox-0.spill").exists() and len(Spill.open(tmp_path)) == 0


def test_spill_messages_read_during_a_checkpoint_write_are_read_again_after_a_crash(tmp_path: Path) -> None:
    """The attack on the background checkpoint: the queue goes on reading the spill while a checkpoint's write runs.
    What it read after the cut is in no stored outbox, so the position the commit records must be the cut's; with
    the position of the moment of the commit, a kill -9 before the next checkpoint lost those messages (here 4 of
    them). Also: a spill read out after the cut is not deleted by that commit (its tail is still unconfirmed)."""
    from stream.state.spill import Spill

    msgs = [(f"t{i}", str(i).encode(), False, 1) for i in range(10)]
    s = Spill.open(tmp_path, fsync=False)
    s.append(msgs)
    s.sync()
    s.read(3)  # into memory before the cut: the cut's outbox holds them
    at_cut = s.read_pos
    s.read(4)  # read back while the checkpoint's write runs: in no stored outbox
    s.commit(at_cut)  # the checkpoint's commit
    s.close()  # kill -9 before the next checkpoint
    assert Spill.open(tmp_path, fsync=False).read(10) == msgs[3:]
    s = Spill.open(tmp_path, fsync=False)
    s.read(2)
    at_cut = s.read_pos
    s.read(10)  # read out after the cut
    s.commit(at_cut)
    s.close()
    assert (tmp_path / "outbox-0.spill").exists() and Spill.open(tmp_path, fsync=False).read(10) == msgs[5:]


def test_backoff_is_capped_with_jitter() -> None:
    delays = [backoff_delay(a, 0.5, 30.0) for a in range(40)]
    assert all(0.25 <= d <= 30.0 for d in delays) and max(delays[10:]) > 14.0
    assert delays[0] <= 0.5


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


def test_read_ahead_socket_serves_small_reads_from_one_recv() -> None:
    """paho's reads of 1, 1 and n bytes come from one system call; what is read ahead shows in pending(); a
    non-blocking "no data" and the end of the stream pass through unchanged."""
    from stream.daemon.sources import ReadAheadSocket

    class Sock:
        def __init__(self, chunks: list[bytes | type[Exception]]) -> None:
            self.chunks, self.calls = chunks, 0

        def recv(self, n: int) -> bytes:
            self.calls += 1
            c = self.chunks.pop(0)
            if isinstance(c, type):
                raise c
            return c

        def fileno(self) -> int:
            return 7

    inner = Sock([b"\x30\x03abc\x40\x02\x00", BlockingIOError, b"\x05", b""])
    s = ReadAheadSocket(inner)
    assert s.fileno() == 7
    assert [s.recv(1), s.recv(1), s.recv(3)] == [b"\x30", b"\x03", b"abc"] and inner.calls == 1
    assert s.pending() == 3 and s.recv(10) == b"\x40\x02\x00" and s.pending() == 0
    with pytest.raises(BlockingIOError):
        s.recv(1)
    assert s.recv(1) == b"\x05" and s.recv(1) == b"" and inner.calls == 4


def test_a_stream_created_by_a_reading_opens_its_periods_at_that_reading() -> None:
    """A big batch shares one arrival time: a stream created late in it (the wall clock already in the next period)
    still takes its first reading into the reading's period, not as late."""
    r = Router(lambda _: FakeOperator(), 10, clock=PeriodClock(1.0))
    rec = r.record("s", 99.9)  # created while processing a reading that arrived at 99.9
    assert rec.bins is not None and rec.bins.first == 99
    assert r.add_many(rec, [1.0, 2.0], None, None, 99.9) is None and rec.bins.bins == {99: 3.0}


class _NoWalk(dict):
    """A stream table that refuses to be walked (at a million streams a walk took 35-84 ms)."""

    def _refuse(self, *a, **k):
        raise AssertionError("a pass walked every stream")

    values = items = keys = __iter__ = _refuse


def test_a_status_pass_visits_the_streams_whose_status_is_due_not_all(tmp_path: Path) -> None:
    """The attack: 2,000 streams in their holdout, 3 of them take another reading; the status loop's pass must
    publish those 3 (each holdout reading makes a stream's status due) without walking the 2,000 (the pass used to
    visit every stream each `status_interval`: 35-50 ms at a million). A stream evicted after its status became due
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
    memory without walking the stream table (a walk of a million took 73-84 ms, every quarter of `idle_timeout`):
    the names are kept per window of last sight, and only old windows are visited. The 3 stay."""
    import time as _time

    cfg = build_config({"metrics": {"port": 0}, "state": {"data_dir": str(tmp_path / "state")},
                        "streams": {"key_file": str(tmp_path / "k"), "idle_timeout": 0.3,
                                    "template": {**TPL, "holdout": 100}}})
    d = daemon_mod.Daemon(cfg, stdin=io.BytesIO(b""), stdout=io.StringIO(), install_signals=False)
    d.startup()
    d.durable.begin_intake()
    d.router.track_idle(0.075)  # what the evict loop does: windows of a quarter of idle_timeout
    d.on_lines([f"s{k},{k % 50}".encode() for k in range(2000)])
    _time.sleep(0.4)
    d.on_lines([b"s7,1", b"s1999,2", b"s500,3"])
    d.router.streams = _NoWalk(d.router.streams)
    gone = asyncio.run(d.evict_idle(0.3))
    assert gone == 1997
    assert sorted(dict.keys(d.router.streams)) == ["s1999", "s500", "s7"]
    d.durable.close()

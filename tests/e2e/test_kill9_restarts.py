"""Durable state over MQTT QoS 1 with real parts: kill -9 cycles release what an uninterrupted run releases,
unsynced readings are not acknowledged and come back, a holdout survives a restart, readings sent while the daemon is
down arrive, and no secret or raw value is in the logs, metrics or state."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from operators import ToPS, ToPSConfig
from stream.core.keys import derive_stream_key, load_master_key
from stream.state.store import Store
from tests.support import (
    TEMPLATE,
    DaemonProcess,
    Feeder,
    PlainFeeder,
    Subscriber,
    check_against_replay,
    daemon_config,
    find_identity,
    free_port,
    publish,
    scrape,
    tops,
    wait_for,
)


def take_session_over(port: int, client_id: str) -> None:
    """Connect with ``client_id`` (persistent session, nothing acknowledged) and leave: the broker drops the client
    that had the session, keeps the session and redelivers its unacknowledged messages to the next connection."""
    import paho.mqtt.client as mqtt

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False)
    c.manual_ack_set(True)
    c.connect("127.0.0.1", port)
    c.loop_start()
    time.sleep(0.05)
    c.disconnect()
    c.loop_stop()


@pytest.mark.network
@pytest.mark.slow
def test_kill9_right_after_reconnect_never_counts_a_reading_without_seq_twice(mosquitto, tmp_path: Path) -> None:
    """Readings WITHOUT seq (nothing to drop a repeat by), QoS 1, persistent session: kill -9 at seeded worst moments
    (right after the restart connected, while the broker redelivers; and while readings flow). No stream gets more
    ticks than readings sent, and the union of all releases equals `tops replay` of the input, tick for tick."""
    rng = np.random.default_rng(31)
    values = {s: rng.integers(0, 120, size=300).astype(float) for s in ("p1", "p2", "p3")}
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, mqtt={"client_id": "tops-noseq-kill"},
                        state={"checkpoint_interval": 0.3, "checkpoint_every": 120, "fsync_interval": 5.0})
    sub = Subscriber(mosquitto.port, "dp/+")
    sub.wait_ready("dp/probe")
    feeder = PlainFeeder(mosquitto.port, values, rate=80)  # about 4 s of readings
    kills = random.Random(77)
    logs: list[str] = []
    try:
        for cycle in range(8):
            run_dir = tmp_path / f"run{cycle}"
            run_dir.mkdir()
            daemon = DaemonProcess(cfg, mport, run_dir)
            daemon.wait_connected()
            if cycle == 0:
                feeder.start()
            feeder.wait_sent(feeder.sent + kills.randint(25, 120))
            # the broker drops the daemon (a client takes its session over and leaves at once, acknowledging
            # nothing): the daemon reconnects, the broker redelivers what it had not seen acknowledged
            before = daemon.metrics().get("tops_mqtt_reconnects_total", 0.0)
            take_session_over(mosquitto.port, "tops-noseq-kill")
            wait_for(lambda d=daemon, b=before: d.metrics().get("tops_mqtt_reconnects_total", 0.0) > b, 10,
                     what="reconnect")
            feeder.wait_sent(feeder.sent + (kills.randint(0, 8) if cycle % 2 else kills.randint(15, 40)))
            daemon.kill()  # SIGKILL, right after the reconnect on odd cycles
            logs.append(daemon.stderr())
        n_release = sum(len(v) - TEMPLATE["holdout"] for v in values.values())
        daemon = final_run(cfg, mport, tmp_path, sub, feeder, n_release, settle=1.0)  # a duplicate: one more tick
        logs.append(daemon.stderr())
    finally:
        sub.close()
        daemon.kill()
    releases = unique_releases(sub)
    for s, v in values.items():
        ticks = {r["tick"] for r in releases if r["stream"] == s}
        assert max(ticks) < len(v), f"stream {s}: {max(ticks) + 1} ticks from {len(v)} readings"
    for s, v in values.items():
        assert check_against_replay(releases, v, tmp_path / "master.key", s, tmp_path) == len(v) - TEMPLATE["holdout"]
    # (a socket closed under asyncio's add_writer at the takeover is logged by asyncio; no traceback of ours)
    assert all("/stream/" not in x for x in logs), next(x for x in logs if "/stream/" in x)[-2000:]


def kill_cycles(cfg: Path, mport: int, tmp_path: Path, sub: Subscriber, feeder: Feeder, n_release: int,
                kills: random.Random, after_kill: Callable[[], None] = lambda: None) -> list[str]:
    """Five runs killed with SIGKILL at seeded random points of their progress (counts of readings processed) while
    ``feeder`` publishes (readings keep coming while the daemon is down; ``after_kill`` is called while it is), then
    a final run until ``n_release`` distinct releases arrived; the runs' logs."""
    logs: list[str] = []
    span = feeder.total // 8  # the five runs and their down times end within the first 5/8 of the input
    for cycle in range(5):
        run_dir = tmp_path / f"run{cycle}"
        run_dir.mkdir()
        daemon = DaemonProcess(cfg, mport, run_dir)
        daemon.wait_connected()
        feeder.flowing.set()
        if cycle == 0:
            feeder.start()
        processed_by_run(daemon, feeder, kills.randint(span // 4, span * 3 // 4))
        os.kill(daemon.proc.pid, signal.SIGKILL)
        daemon.kill()
        logs.append(daemon.stderr())
        after_kill()
        feeder.wait_sent(feeder.sent + kills.randint(0, span // 4))  # readings go on while the daemon is down
        feeder.flowing.clear()  # until the next run is up: the cycles end at the same points of the input
    logs.append(final_run(cfg, mport, tmp_path, sub, feeder, n_release).stderr())
    return logs


def processed_by_run(daemon: DaemonProcess, feeder: Feeder, count: int) -> None:
    """Wait until this run of the daemon processed ``count`` readings and took a checkpoint (or, once the feeder is
    done, took a checkpoint): a kill point in the daemon's own progress, the same on a slow machine as on a fast
    one."""
    def reached() -> bool:
        m = daemon.metrics()
        checkpointed = m.get("tops_checkpoint_seconds_count", 0.0) >= 1
        done = m.get("tops_readings_total{result=ok}", 0.0) >= count or not feeder.is_alive()
        return checkpointed and done

    wait_for(reached, 60, interval=0.01, what=f"{count} readings processed by this run")


def final_run(cfg: Path, mport: int, tmp_path: Path, sub: Subscriber, feeder: Feeder, n_release: int,
              settle: float = 0.0) -> DaemonProcess:
    """The run after the kills: until ``feeder`` is done and ``n_release`` distinct releases arrived (then ``settle``
    seconds more), stopped cleanly."""
    run_dir = tmp_path / "final"
    run_dir.mkdir()
    daemon = DaemonProcess(cfg, mport, run_dir)

    def keys() -> set[tuple[str, int]]:
        return {(p["stream"], p["tick"]) for p in sub.payloads() if "tick" in p}

    try:
        daemon.wait_connected()
        feeder.flowing.set()
        feeder.join(60)
        assert not feeder.is_alive()
        wait_for(lambda: len(keys()) >= n_release, 30, what="every release")
        time.sleep(settle)
        assert daemon.stop() == 0
    except BaseException:
        daemon.kill()  # a failing run leaves no daemon behind
        raise
    return daemon


def unique_releases(sub: Subscriber) -> list[dict]:
    """The releases received; a repeated one (re-processed journal, outbox) must be byte-identical."""
    releases = [p for p in sub.payloads() if "tick" in p]
    seen: dict[tuple[str, int], tuple[float, float]] = {}
    for r in releases:
        k = (r["stream"], r["tick"])
        assert seen.setdefault(k, (r["value"], r["theta"])) == (r["value"], r["theta"]), k
    return releases


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.parametrize(("fold_after", "grid"), [(100_000, "exact"), (1, "exact"), (100_000, "compact")],
                         ids=["appended", "folded-after-every-checkpoint", "holdouts-as-rows"])
def test_kill9_cycles_release_the_same_as_an_uninterrupted_run(mosquitto, tmp_path: Path, fold_after: int,
                                                               grid: str) -> None:
    """kill -9 at seeded random points while readings flow (QoS 1, persistent session): the union of the releases
    of all runs equals `tops replay` on all readings, tick for tick, value for value; repeats are identical. Three
    times: the states only appended, folded into the rows after every checkpoint (the kills land in either), and on
    the compact grid, where the holdouts are rows of a columnar store (the kills land in the holdouts: restored into
    rows, lent to the checkpoint's writer as rows)."""
    rng = np.random.default_rng(11)
    values = {s: rng.integers(0, 120, size=420).astype(float) for s in ("k1", "k2", "k3")}
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, mqtt={"client_id": "tops-kill-test"},
                        state={"checkpoint_interval": 0.4, "checkpoint_every": 150, "fold_after": fold_after},
                        streams={"template": {"holdout_grid": grid}})
    sub = Subscriber(mosquitto.port, "dp/+")
    sub.wait_ready("dp/probe")
    feeder = Feeder(mosquitto.port, values, rate=60)  # 7 s of readings
    n_release = sum(len(v) - TEMPLATE["holdout"] for v in values.values())
    try:
        logs = kill_cycles(cfg, mport, tmp_path, sub, feeder, n_release, random.Random(2024))
    finally:
        sub.close()
    releases = unique_releases(sub)
    for s, v in values.items():
        assert check_against_replay(releases, v, tmp_path / "master.key", s, tmp_path,
                                    grid=grid) == len(v) - TEMPLATE["holdout"]
    assert all("Traceback" not in x for x in logs)
    assert sum("journaled readings re-processed" in x for x in logs) == 6
    assert any("appended states folded" in x for x in logs) == (fold_after == 1)


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.parametrize("grid", ["exact", "compact"])
def test_kill9_cycles_with_holdouts_that_end_in_rows(mosquitto, tmp_path: Path, grid: str) -> None:
    """The same kill -9 cycles with holdouts of 7 readings, which are rows from a stream's first reading to its
    release row (``ends_in_rows``: a ``ShortHoldout`` row on the exact grid, a ``ColumnarHoldout`` row on the compact
    one). A new stream starts every round, so some streams are always inside their short holdout: the kills,
    checkpoints and the journal's re-processing land in rows that are born, take readings, and end in rows (the
    stores left by the kills are read: streams stored inside their holdout, restored into rows, are required). Every
    stream's releases equal its own ToPS operator's on all its readings (the object path, no rows), and two of them
    `tops replay`'s."""
    from operators.columnar_holdout import ends_in_rows

    holdout = 7
    template = {**TEMPLATE, "holdout": holdout, "holdout_grid": grid}
    config = ToPSConfig(epsilon=template["epsilon"], bound=template["bound"], holdout=holdout,
                        query_range=template["query_range"], fanout=template["fanout"], holdout_grid=grid)
    assert ends_in_rows(config)
    rng = np.random.default_rng(12)
    names = [f"r{j}" for j in range(180)]
    values = {s: rng.integers(0, 120, size=int(rng.integers(12, 24))).astype(float) for s in names}
    starts = {s: j for j, s in enumerate(names)}
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, mqtt={"client_id": "tops-kill-rows-test"},
                        state={"checkpoint_interval": 0.2, "checkpoint_every": 60},
                        streams={"template": template, "max_streams": 500})
    sub = Subscriber(mosquitto.port, "dp/+")
    sub.wait_ready("dp/probe")
    feeder = Feeder(mosquitto.port, values, rate=30, starts=starts)  # 7 s of readings, about 20 streams at a time
    n_release = sum(len(v) - holdout for v in values.values())
    in_holdout: list[int] = []  # streams stored inside their holdout when a run was killed

    def count_stored_holdouts() -> None:
        store = Store.open(tmp_path / "state" / "state.db", readonly=True)
        try:
            in_holdout.append(sum(0 < s["state"]["operator"]["ticks"] < holdout for s in store.streams()
                                  if s["state"] is not None))
        finally:
            store.close()

    try:
        logs = kill_cycles(cfg, mport, tmp_path, sub, feeder, n_release, random.Random(2025), count_stored_holdouts)
    finally:
        sub.close()
    assert sum(in_holdout) >= 8, in_holdout
    releases = unique_releases(sub)
    identity = find_identity(tmp_path)
    master = load_master_key(tmp_path / "master.key")
    got: dict[str, dict[int, float]] = {}
    for r in releases:
        got.setdefault(r["stream"], {})[r["tick"]] = r["value"]
    for s, v in values.items():
        want = ToPS(config, derive_stream_key(master, s, identity=identity)).process(v)
        assert {t: float(x) for t, x in enumerate(want) if not np.isnan(x)} == got.get(s), s
    for s in (names[0], names[-1]):
        assert check_against_replay(releases, values[s], tmp_path / "master.key", s, tmp_path, identity=identity,
                                    grid=grid, holdout=holdout) == len(values[s]) - holdout
    assert all("Traceback" not in x for x in logs)
    assert sum("journaled readings re-processed" in x for x in logs) >= 1


@pytest.mark.network
@pytest.mark.slow
def test_unsynced_readings_are_not_acknowledged_and_come_back(mosquitto, tmp_path: Path) -> None:
    """Readings received but not yet in the journal on disk are neither acknowledged nor released: after kill -9
    the broker redelivers them (manual acknowledgements, persistent session) and they are released once."""
    mport = free_port()
    tpl = {"theta": 50.0}
    slow = daemon_config(tmp_path, mosquitto.port, mport, mqtt={"client_id": "tops-ack-test"},
                         streams={"template": tpl}, state={"fsync_interval": 60_000.0, "fsync_batch": 10_000})
    sub = Subscriber(mosquitto.port, "dp/+")
    sub.wait_ready("dp/probe")
    daemon = DaemonProcess(slow, mport, tmp_path)
    try:
        daemon.wait_connected()
        publish(mosquitto.port, "meters/x/reading", ["5", "6", "7", "8", "9"])
        wait_for(lambda: daemon.metrics()["tops_readings_total{result=ok}"] == 5, 10, what="readings processed")
        time.sleep(0.3)
        assert not [p for p in sub.payloads() if "tick" in p]  # held: their readings are not on disk yet
    finally:
        daemon.kill()  # SIGKILL
    normal = daemon_config(tmp_path, mosquitto.port, mport, mqtt={"client_id": "tops-ack-test"},
                           streams={"template": tpl})
    daemon = DaemonProcess(normal, mport, tmp_path)
    try:
        daemon.wait_connected()
        wait_for(lambda: len([p for p in sub.payloads() if "tick" in p]) >= 5, 15, what="redelivered readings")
        wait_for(lambda: daemon.metrics()["tops_readings_total{result=ok}"] == 5, 5, what="counted once")
        assert daemon.stop() == 0
        assert "0 journaled readings re-processed" in daemon.stderr()  # they came back from the broker
    finally:
        sub.close()
        daemon.kill()
    assert sorted(p["tick"] for p in sub.payloads() if "tick" in p) == [0, 1, 2, 3, 4]


@pytest.mark.network
@pytest.mark.slow
def test_holdout_survives_a_restart(mosquitto, tmp_path: Path) -> None:
    """A stream stopped in its holdout continues it (holdout_left goes on, theta equals the uninterrupted run's);
    once theta is chosen the holdout histogram is gone from the store file."""
    values = np.random.default_rng(5).integers(0, 90, size=80).astype(float)
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, mqtt={"client_id": "tops-holdout-test"})
    sub = Subscriber(mosquitto.port, "dp/#")
    sub.wait_ready("dp/probe")
    lines = [json.dumps({"value": float(x), "seq": i}) for i, x in enumerate(values)]
    daemon = DaemonProcess(cfg, mport, tmp_path)
    try:
        daemon.wait_connected()
        publish(mosquitto.port, "meters/h/reading", lines[:30])
        wait_for(lambda: daemon.metrics()["tops_readings_total{result=ok}"] == 30, 10, what="30 readings")
        assert daemon.stop() == 0
        state = tops("state", "--data-dir", str(tmp_path / "state"), "--json")
        row = json.loads(state.stdout)[0]
        assert (row["stream"], row["phase"], row["ticks"], row["released"]) == ("h", "holdout", 30, 0)
        daemon = DaemonProcess(cfg, mport, tmp_path)
        daemon.wait_connected()

        def status() -> dict:
            return [json.loads(p) for t, p in sub.lines if t == "dp/h/status"][-1]

        wait_for(lambda: len([1 for t, _ in sub.lines if t == "dp/h/status"]) >= 2, 10, what="status after restart")
        assert status() == {"stream": "h", "phase": "holdout", "holdout_left": 20, "identity": find_identity(tmp_path),
                            "generation": 1}
        publish(mosquitto.port, "meters/h/reading", lines[30:])
        wait_for(lambda: len([p for p in sub.payloads() if "tick" in p]) >= 30, 15, what="releases")
        assert daemon.stop() == 0
    finally:
        sub.close()
        daemon.kill()
    releases = [p for p in sub.payloads() if "tick" in p]
    assert check_against_replay(releases, values, tmp_path / "master.key", "h", tmp_path) == 30
    key = derive_stream_key(load_master_key(tmp_path / "master.key"), "h", identity=find_identity(tmp_path))
    uninterrupted = ToPS(ToPSConfig(**TEMPLATE), key)
    uninterrupted.process(values)
    assert {r["theta"] for r in releases} == {uninterrupted.theta}
    stored = Store.open(tmp_path / "state" / "state.db", readonly=True).streams()[0]["state"]["operator"]
    assert "holdout_histogram" not in stored and stored["theta_units"] is not None
    assert b"holdout_histogram" not in (tmp_path / "state" / "state.db").read_bytes()
    assert not (tmp_path / "state" / "state.db-wal").exists() or \
        b"holdout_histogram" not in (tmp_path / "state" / "state.db-wal").read_bytes()


@pytest.mark.network
def test_no_secret_and_no_raw_value_in_logs_metrics_or_state(mosquitto, tmp_path: Path) -> None:
    raw = [41.987654 + i for i in range(60)]  # distinctive raw values (releases are on the integer grid)
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, log={"level": "debug"},
                        mqtt={"client_id": "tops-secret-test"})
    daemon = DaemonProcess(cfg, mport, tmp_path)
    try:
        daemon.wait_connected()
        publish(mosquitto.port, "meters/sec/reading", [repr(v) for v in raw[:30]])
        publish(mosquitto.port, "meters/sec/reading", [json.dumps({"value": v, "seq": i}) for i, v in
                                                       enumerate(raw[30:])])
        wait_for(lambda: daemon.metrics()["tops_readings_total{result=ok}"] == 60, 10, what="readings")
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5) as resp:
            metrics_text = resp.read().decode()
        assert scrape(mport)["tops_streams_active"] == 1
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    master = load_master_key(tmp_path / "master.key")
    ident = find_identity(tmp_path)
    secrets = [master.hex(), derive_stream_key(master, "sec", identity=ident).hex(),
               derive_stream_key(master, "sec", identity=ident, generation=2).hex()]
    outputs = {"log": daemon.stderr(), "metrics": metrics_text}
    for args in (("--json",), (), ("--ledger",), ("--ledger", "--json")):
        r = tops("state", "--data-dir", str(tmp_path / "state"), *args)
        assert r.returncode == 0
        outputs[f"state {args}"] = r.stdout.decode() + r.stderr.decode()
    assert "sec" in outputs["state ('--json',)"]
    for where, text in outputs.items():
        low = text.lower()
        for s in secrets:
            assert s not in low and s[:16] not in low, where
        for v in raw:
            assert f"{v:.6f}"[:8] not in text, (where, v)
    # the store holds no key either, and after a clean stop the journal holds no reading
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    dump = "\n".join(db.iterdump()).lower()
    assert all(s not in dump for s in secrets)
    leftover = b"".join(p.read_bytes() for p in (tmp_path / "state" / "journal").iterdir())
    assert b"41.98" not in leftover
    assert oct((tmp_path / "state" / "state.db").stat().st_mode & 0o777) == "0o600"


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
def test_readings_sent_while_the_daemon_is_down_are_delivered(mosquitto, tmp_path: Path, protocol: str) -> None:
    """Persistent session (MQTT 3.1.1 clean session off, or MQTT 5 clean start off + session expiry)."""
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, streams={"template": {"theta": 50.0}},
                        mqtt={"client_id": f"tops-session-{protocol}", "protocol": protocol, "session_expiry": 600})
    daemon = DaemonProcess(cfg, mport, tmp_path)
    try:
        daemon.wait_connected()
        publish(mosquitto.port, "meters/d/reading", ["1", "2"])
        wait_for(lambda: daemon.metrics()["tops_readings_total{result=ok}"] == 2, 10, what="first readings")
        assert daemon.stop() == 0
        publish(mosquitto.port, "meters/d/reading", ["3", "4", "5"])  # nobody subscribed right now
        daemon = DaemonProcess(cfg, mport, tmp_path)
        daemon.wait_connected()
        wait_for(lambda: daemon.metrics()["tops_readings_total{result=ok}"] == 3, 10, what="queued readings")
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    row = json.loads(tops("state", "--data-dir", str(tmp_path / "state"), "--json").stdout)[0]
    assert (row["stream"], row["ticks"], row["released"]) == ("d", 5, 5)


@pytest.mark.network
@pytest.mark.slow
def test_batches_journaled_one_line_per_message_survive_kill9(mosquitto, tmp_path: Path) -> None:
    """Batches (plain arrays, arrays of objects with seq and ts, a bad element) journal one line per message; after
    kill -9 the journal is re-processed into the same ticks: repeated releases are byte-identical and all of them
    equal `tops replay` of the accepted readings."""
    rng = np.random.default_rng(21)
    a = rng.integers(0, 120, size=300).astype(float)
    b = rng.integers(0, 90, size=160).astype(float)
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, mqtt={"client_id": "tops-batch-kill"},
                        state={"checkpoint_interval": 3600.0, "checkpoint_every": 1_000_000})
    sub = Subscriber(mosquitto.port, "dp/+")
    sub.wait_ready("dp/probe")
    lines_a = [json.dumps([float(x) for x in a[k:k + 60]]) for k in range(0, 200, 60)]
    lines_a[1] = lines_a[1][:-1] + ', NaN, "x"]'  # two bad elements: rejected, not journaled
    lines_b = [json.dumps([{"value": float(x), "seq": k + i, "ts": 1000.0 + k + i} for i, x in enumerate(b[k:k + 40])])
               for k in range(0, 120, 40)]
    daemon = DaemonProcess(cfg, mport, tmp_path)
    try:
        daemon.wait_connected()
        assert publish(mosquitto.port, "meters/a/reading", lines_a).returncode == 0
        assert publish(mosquitto.port, "meters/b/reading", lines_b).returncode == 0
        first = (240 - TEMPLATE["holdout"]) + (120 - TEMPLATE["holdout"])

        def releases() -> list[dict]:
            return [p for p in sub.payloads() if "tick" in p]

        wait_for(lambda: len(releases()) >= first, 15, what="releases before the kill")
        journal = b"".join(p.read_bytes() for p in sorted((tmp_path / "state" / "journal").iterdir()))
        lines = [x for x in map(json.loads, journal.splitlines()) if "v" in x]  # not the marks (format, syncs, acks)
        assert len(lines) == len(lines_a) + len(lines_b) and all(isinstance(x["v"], list) for x in lines)
        assert lines[0]["v"] == [float(x) for x in a[:60]]
        daemon.kill()  # SIGKILL: everything since the start checkpoint is in the journal only
        daemon = DaemonProcess(cfg, mport, tmp_path)
        daemon.wait_connected()
        wait_for(lambda: "360 journaled readings re-processed" in daemon.stderr(), 10, what="journal re-processed")
        publish(mosquitto.port, "meters/a/reading", [json.dumps([float(x) for x in a[240:]])])
        publish(mosquitto.port, "meters/b/reading",
                [json.dumps([{"value": float(x), "seq": 120 + i} for i, x in enumerate(b[120:])])])
        want = (len(a) - TEMPLATE["holdout"]) + (len(b) - TEMPLATE["holdout"])
        wait_for(lambda: len({(r["stream"], r["tick"]) for r in releases()}) >= want, 15, what="every release")
        assert daemon.stop() == 0
        assert "Traceback" not in daemon.stderr()
    finally:
        sub.close()
        daemon.kill()
    got = releases()
    assert len(got) > want  # the re-processed journal published its releases again
    seen: dict[tuple[str, int], dict] = {}
    for r in got:
        assert seen.setdefault((r["stream"], r["tick"]), r) == r
    assert check_against_replay(got, a, tmp_path / "master.key", "a", tmp_path) == len(a) - TEMPLATE["holdout"]
    assert check_against_replay(got, b, tmp_path / "master.key", "b", tmp_path) == len(b) - TEMPLATE["holdout"]

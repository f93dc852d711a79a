"""Stream slots: idle streams leave memory after ``[streams] idle_timeout``, so garbage topic
names cannot hold ``max_streams`` for good; an evicted stream continues exactly where it was (its releases equal
``tops replay`` of its whole input); ``tops state retire`` retires a stream on a stopped daemon."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support import (
    DaemonProcess,
    Subscriber,
    check_against_replay,
    daemon_config,
    free_port,
    publish,
    tops_text,
    wait_for,
)

pytestmark = [pytest.mark.network, pytest.mark.slow]


def test_garbage_names_are_evicted_and_an_evicted_stream_continues_exactly(mosquitto, tmp_path: Path) -> None:
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, streams={"max_streams": 5, "idle_timeout": 1.0})
    daemon = DaemonProcess(cfg, mport, tmp_path)
    sub = Subscriber(mosquitto.port, "dp/+")
    port = mosquitto.port
    real = np.random.default_rng(11).integers(0, 90, size=200).astype(float)
    late = np.random.default_rng(12).integers(0, 90, size=60).astype(float)

    def released(stream: str) -> int:
        return len({p["tick"] for p in sub.payloads() if p.get("stream") == stream and "tick" in p})

    try:
        daemon.wait_connected()
        sub.wait_ready("dp/probe")
        assert publish(port, "meters/real/reading", [f"{v:g}" for v in real[:100]]).returncode == 0
        wait_for(lambda: released("real") == 50, 20, what="first half of real released")
        for i in range(30):  # garbage names: at most max_streams of them get a slot, the rest are refused
            publish(port, f"meters/garbage-{i}/reading", ["1"])
        m = wait_for(lambda: (x := daemon.metrics())["tops_messages_total{result=stream_cap}"] >= 1 and x, 10,
                     what="stream cap reached")
        assert m["tops_streams_active"] <= 5
        m = wait_for(lambda: (x := daemon.metrics())["tops_streams_active"] == 0 and x, 20,
                     what="idle streams evicted")
        assert m["tops_streams_evicted_total"] >= 5
        # the slots are free again: the evicted stream returns (restored from the store), a new one gets a slot
        assert publish(port, "meters/real/reading", [f"{v:g}" for v in real[100:]]).returncode == 0
        assert publish(port, "meters/late/reading", [f"{v:g}" for v in late]).returncode == 0
        wait_for(lambda: released("real") == 150 and released("late") == 10, 20, what="releases after eviction")
        assert check_against_replay(sub.payloads(), real, tmp_path / "master.key", "real", tmp_path) == 150
        assert check_against_replay(sub.payloads(), late, tmp_path / "master.key", "late", tmp_path) == 10
        r = tops_text("state", "retire", "late", "--data-dir", str(tmp_path / "state"))
        assert r.returncode == 2 and "in use by a running daemon" in r.stderr, r.stderr
        assert daemon.stop() == 0
    finally:
        sub.close()
        daemon.kill()
    log = daemon.stderr()
    assert "Traceback" not in log and "left memory" in log
    # retiring on the stopped daemon: gone from the store; should it send again, a new generation (a new key)
    r = tops_text("state", "retire", "late", "--data-dir", str(tmp_path / "state"))
    assert r.returncode == 0 and "generation 2 with a new key" in r.stdout, r.stderr
    rows = json.loads(tops_text("state", "--data-dir", str(tmp_path / "state"), "--json").stdout)
    assert "late" not in {x["stream"] for x in rows} and "real" in {x["stream"] for x in rows}
    assert tops_text("state", "retire", "nosuch", "--data-dir", str(tmp_path / "state")).returncode == 2
    from stream.state.store import Store

    st = Store.open(tmp_path / "state" / "state.db")
    adm = st.admit("late", {"epsilon": 1.0})
    st.close()
    assert adm.generation == 2 and adm.state is None


def test_poison_messages_do_not_stop_the_daemon_nor_its_restart(mosquitto, tmp_path: Path) -> None:
    """Poison messages against a real broker: 10^400 in ts, seq and value, alone and in a batch, sent while the
    daemon runs and while it is down (queued by the broker, delivered at the start): the daemon stays up, counts
    them invalid and acknowledges them, the other stream releases everything, a restart does not die."""
    huge = "1" + "0" * 400
    poison = [f'{{"value": 1, "ts": {huge}}}', f'{{"value": 1, "seq": {huge}}}', f'{{"value": {huge}}}',
              f'[{{"value": 1, "ts": {huge}}}, 2]', '{"value": 1, "ts": 1e400}', "[" * 50000]
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, mqtt={"client_id": "tops-poison-test"})
    port = mosquitto.port
    good = np.random.default_rng(5).integers(0, 90, size=150).astype(float)
    sub = Subscriber(port, "dp/+")
    daemon = DaemonProcess(cfg, mport, tmp_path)
    try:
        daemon.wait_connected()
        sub.wait_ready("dp/probe")
        publish(port, "meters/p/reading", poison)
        publish(port, "meters/good/reading", [f"{v:g}" for v in good[:60]])
        wait_for(lambda: daemon.metrics()["tops_readings_total{result=ok}"] >= 61, 20, what="good readings")
        m = daemon.metrics()
        assert daemon.proc.poll() is None
        assert m["tops_messages_total{result=invalid}"] == len(poison) - 1  # the batch keeps its valid element
        assert m["tops_readings_total{result=invalid}"] == 1
        assert daemon.stop() == 0
        # while the daemon is down the broker queues poison and readings for its persistent session
        publish(port, "meters/p/reading", poison)
        publish(port, "meters/good/reading", [f"{v:g}" for v in good[60:]])
        daemon = DaemonProcess(cfg, mport, tmp_path)
        wait_for(lambda: len({p["tick"] for p in sub.payloads() if p.get("stream") == "good"}) == 100, 30,
                 what="all good releases after the restart")
        assert daemon.proc.poll() is None
        assert daemon.stop() == 0
        daemon = DaemonProcess(cfg, mport, tmp_path)  # nothing left to redeliver: it starts and stays up
        daemon.wait_connected()
        assert daemon.metrics()["tops_messages_total{result=invalid}"] == 0
        assert daemon.stop() == 0
    finally:
        sub.close()
        daemon.kill()
    assert check_against_replay(sub.payloads(), good, tmp_path / "master.key", "good", tmp_path) == 100
    assert "Traceback" not in daemon.stderr()

"""Categorical streams over a real Mosquitto: a kill -9 with durable state keeps every period whole and released
once; local mode with real `tops device` processes."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pytest

from operators.categorical.grr import grr_variance
from tests.support import DaemonProcess, Subscriber, free_port, run_devices, tops, wait_for, write_toml


# -- central, MQTT, kill -9 -----------------------------------------------------------------------------------------
class Feeder(threading.Thread):
    """Publishes categories with ts (event clock) and seq at QoS 1, at a steady pace."""

    def __init__(self, port: int, cats: list[int], rate: float) -> None:
        super().__init__(daemon=True)
        self.port, self.cats, self.rate = port, cats, rate
        self.sent: list[tuple[int, float, int]] = []

    def run(self) -> None:
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="cat-feeder")
        c.connect("127.0.0.1", self.port)
        c.loop_start()
        for i, cat in enumerate(self.cats):
            ts = round(time.time(), 3)
            self.sent.append((cat, ts, i))
            c.publish("meters/region/reading", json.dumps({"value": cat, "ts": ts, "seq": i}), qos=1).wait_for_publish()
            time.sleep(1.0 / self.rate)
        c.disconnect()
        c.loop_stop()


@pytest.mark.network
@pytest.mark.slow
def test_kill9_keeps_every_period_whole_and_released_once(mosquitto, tmp_path: Path) -> None:
    """kill -9 twice while categories flow: every released period equals the replay of all readings (nothing lost,
    nothing counted twice) and a period re-sent after a restart is byte-identical."""
    mport = free_port()
    doc = {
        "mqtt": {"host": "127.0.0.1", "port": mosquitto.port, "client_id": "tops-cat-kill", "reconnect_min": 0.1,
                 "reconnect_max": 1.0},
        "input": {"source": "mqtt", "topics": ["meters/+/reading"], "qos": 1},
        "output": {"sinks": ["mqtt"], "topic": "dp/{stream}", "qos": 1, "status_interval": 0.5},
        "ticks": {"mode": "period", "period": 1.0, "clock": "event", "lateness": 6.0},
        "streams": {"kind": "categorical", "key_file": str(tmp_path / "master.key")},
        "categorical": {"epsilon": 2.0, "categories": 4, "release": "full"},
        "metrics": {"port": mport},
        "state": {"data_dir": str(tmp_path / "state"), "checkpoint_interval": 0.3},
    }
    cfg = write_toml(tmp_path / "tops.toml", doc)
    rng = np.random.default_rng(5)
    cats = rng.choice(4, size=500, p=[0.4, 0.3, 0.2, 0.1]).tolist()
    sub = Subscriber(mosquitto.port, "dp/+")
    sub.wait_ready("dp/probe")
    feeder = Feeder(mosquitto.port, cats, rate=70)  # about 7 s
    logs = []
    try:
        for cycle in range(2):
            run = tmp_path / f"run{cycle}"
            run.mkdir()
            d = DaemonProcess(cfg, mport, run)
            d.wait_connected()
            if cycle == 0:
                feeder.start()
            time.sleep(1.5 + cycle)
            os.kill(d.proc.pid, signal.SIGKILL)
            d.kill()
            logs.append(d.stderr())
        run = tmp_path / "final"
        run.mkdir()
        d = DaemonProcess(cfg, mport, run)
        d.wait_connected()
        feeder.join(60)
        last_ts = feeder.sent[-1][1]
        wait_for(lambda: any(p.get("ts", 0) > last_ts for p in sub.payloads() if "tick" in p), 30,
                 what="the period of the last reading released")
        assert d.stop() == 0
        logs.append(d.stderr())
    finally:
        sub.close()
    assert all("Traceback" not in x for x in logs)
    rel: dict[int, str] = {}
    for p in sub.payloads():
        if "tick" not in p:
            continue
        line = json.dumps(p, sort_keys=True)
        assert rel.setdefault(p["tick"], line) == line, p["tick"]  # a repeat is identical
    ticks = sorted(rel)
    assert ticks == list(range(len(ticks)))
    first = json.loads(rel[0])["ts"]
    last = json.loads(rel[ticks[-1]])["ts"]
    inp = tmp_path / "sent.jsonl"
    inp.write_text("".join(json.dumps({"stream": "region", "value": c, "ts": t, "seq": q}) + "\n"
                           for c, t, q in feeder.sent))
    from stream.state.store import Store

    st = Store.open(tmp_path / "state" / "state.db", readonly=True)
    identity = st.identity
    st.close()
    rep = tops("replay-categorical", str(inp), "--config", str(cfg), "--stream", "region", "--key-file",
               str(tmp_path / "master.key"), "--identity", identity, "--first", str(first), "--last", str(last))
    assert rep.returncode == 0, rep.stderr.decode()
    replayed = [json.dumps(json.loads(x), sort_keys=True) for x in rep.stdout.decode().splitlines()]
    assert replayed == [rel[t] for t in ticks]
    assert sum(sum(json.loads(rel[t])["counts"]) > 0 for t in ticks) >= 5


# -- local mode: devices over Mosquitto -----------------------------------------------------------------------------
@pytest.mark.network
@pytest.mark.slow
def test_local_categorical_with_tops_device_processes(mosquitto, tmp_path: Path) -> None:
    """The daemon publishes the GRR control; three `tops device --categories 6` processes report; each period's
    release counts every report and the estimate over all periods is within 5 standard errors of the truth."""
    mport = free_port()
    eps, d = 2.0, 6
    doc = {
        "mqtt": {"host": "127.0.0.1", "port": mosquitto.port, "reconnect_min": 0.1, "reconnect_max": 1.0},
        "input": {"source": "mqtt", "topics": ["meters/+/report"], "qos": 1},
        "output": {"sinks": ["mqtt"], "topic": "dp/{stream}", "qos": 1, "status_interval": 0.5},
        "ticks": {"mode": "period", "period": 1.0},
        "streams": {"kind": "categorical", "mode": "local"},
        "local": {"streams": ["region"]},
        "categorical": {"epsilon": eps, "categories": d, "release": "full", "post": "base"},
        "metrics": {"port": mport},
        "state": {"data_dir": str(tmp_path / "state")},
    }
    cfg = write_toml(tmp_path / "tops.toml", doc)
    rng = np.random.default_rng(3)
    sub = Subscriber(mosquitto.port, "dp/+")
    sub.wait_ready("dp/probe")
    daemon = DaemonProcess(cfg, mport, tmp_path)
    truth = np.zeros(d)
    try:
        daemon.wait_connected()
        inputs = []
        for i in range(3):
            cats = rng.choice(d, size=1500, p=[0.35, 0.25, 0.2, 0.1, 0.1, 0.0])
            truth += np.bincount(cats, minlength=d)
            inputs.append(tmp_path / f"dev{i}.txt")
            inputs[-1].write_text("\n".join(map(str, cats.tolist())) + "\n")
        run_devices(mosquitto.port, "region", inputs, "--categories", str(d))
        n = int(truth.sum())
        wait_for(lambda: sum(r.get("reports", 0) for r in sub.payloads() if "tick" in r) >= n, 30,
                 what="every report in a release")
        assert daemon.stop() == 0
    finally:
        daemon.kill()
        sub.close()
    rel = [r for r in sub.payloads() if "tick" in r]
    assert sum(r["reports"] for r in rel) == n
    est = np.sum([r["counts"] for r in rel], axis=0)
    sd = np.sqrt(grr_variance(n, d, eps, truth))
    assert np.all(np.abs(est - truth) <= 5 * sd), (est, truth, sd)
    assert "Traceback" not in daemon.stderr()

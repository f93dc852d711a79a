"""Local mode end to end: a real Mosquitto, the daemon in mode local, 50 simulated devices (paho clients).

The daemon publishes the retained Square Wave control message, estimates theta from the devices' reports, publishes
the Hybrid control message; devices switch phase on it; per-period releases come out; the captured report topic
shows no raw reading.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pytest

from stream.device.client import Device
from tests.support import DaemonProcess, Subscriber, daemon_config, free_port, wait_for

pytestmark = [pytest.mark.network, pytest.mark.slow]

N_DEVICES = 50
HOLDOUT = 1000  # reports: 20 rounds of 50 devices
BOUND = 100.0


class SimDevice:
    """One device: its own MQTT connection, following the retained control message of its stream."""

    def __init__(self, i: int, port: int, stream: str) -> None:
        # 50 devices share one stream, and the daemon checks seq per stream: no seq here
        self.device = Device(stream, 1.0, sequence=False)
        self.lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"sim-device-{i}")
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.subscribe(f"tops/control/{stream}", qos=1)
        self.client.loop_start()
        self.topic = f"meters/{stream}/report"

    def _on_message(self, client, userdata, message) -> None:
        with self.lock:
            self.device.on_control(message.payload)

    @property
    def phase(self) -> str | None:
        return self.device.phase

    def report(self, reading: float) -> str | None:
        with self.lock:
            if self.device.phase is None or self.device.room == 0:  # nothing taken now (the round is full)
                return None
            rep = self.device.perturb([reading])[0]
        self.client.publish(self.topic, json.dumps(rep), qos=1)
        return rep["phase"]

    def close(self) -> None:
        self.client.disconnect()  # first: the network thread then ends at once


def test_fifty_devices_threshold_then_stream(mosquitto, tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    # readings with 6 decimals: a leaked raw reading would show up as an exact number in the capture
    readings = np.round(rng.gamma(2.0, 6.0, size=(200, N_DEVICES)) + 0.123457, 6)
    mport = free_port()
    cfg = daemon_config(
        tmp_path,
        mosquitto.port,
        mport,
        input={"topics": ["meters/+/report"]},
        streams={"mode": "local", "template": {"epsilon": 1.0, "bound": BOUND, "holdout": HOLDOUT}},
        local={"streams": ["zone-1"]},
        ticks={"mode": "period", "period": 0.25},
    )
    daemon = DaemonProcess(cfg, mport, tmp_path)
    capture = Subscriber(mosquitto.port, "meters/#")
    releases = Subscriber(mosquitto.port, "dp/#")
    devices: list[SimDevice] = []
    try:
        daemon.wait_connected()
        capture.wait_ready("meters/probe/x")
        devices = [SimDevice(i, mosquitto.port, "zone-1") for i in range(N_DEVICES)]
        wait_for(lambda: all(d.phase == "threshold" for d in devices), 20, what="devices got the SW control")
        sent_stream: list[float] = []
        round_ = 0
        # threshold phase: rounds until every device follows the stream control, then 60 more rounds
        while not all(d.phase == "stream" for d in devices):
            assert round_ < 150, "theta was never published"
            for k, d in enumerate(devices):
                d.report(float(readings[round_, k]))
            round_ += 1
            time.sleep(0.05)
        switched = round_
        theta = devices[0].device.control.theta
        assert 1.0 <= theta <= BOUND
        for r in range(switched, switched + 40):
            for k, d in enumerate(devices):
                if d.report(float(readings[r, k])) == "stream":
                    sent_stream.append(min(float(readings[r, k]), theta))
            time.sleep(0.05)
        time.sleep(1.0)
        m = daemon.metrics()
        wait_for(lambda: sum(1 for t, _ in releases.lines if t == "dp/zone-1") > 10, 20, what="releases")
        assert daemon.stop() == 0
        time.sleep(0.5)
    finally:
        for d in devices:
            d.close()
        for d in devices:
            d.client.loop_stop()
        daemon.kill()
        capture.close()
        releases.close()
    # a restart continues from the checkpoint: same theta, phase stream, no new holdout
    again = DaemonProcess(cfg, mport, tmp_path)
    control = Subscriber(mosquitto.port, "tops/control/zone-1")
    try:
        again.wait_connected()
        wait_for(lambda: any(json.loads(p).get("phase") == "stream" for _, p in control.lines), 20,
                 what="retained stream control after the restart")
        assert all(json.loads(p) == {"stream": "zone-1", "phase": "stream", "epsilon": 1.0, "theta": theta,
                                     "mechanism": "hybrid"} for _, p in control.lines)
        assert again.stop() == 0
    finally:
        again.kill()
        control.close()
    rel = [json.loads(p) for t, p in releases.lines if t == "dp/zone-1"]
    assert rel and all(r["theta"] == theta for r in rel)
    # the daemon saw each stream-phase report once: the released period sums add up to an unbiased estimate of the
    # truncated readings (Hybrid variance at eps = 1 is at most about (theta/2)^2 * 3.5 per report: 6 sigma bound)
    total = sum(r["value"] for r in rel)
    sd = np.sqrt(len(sent_stream) * 3.5) * theta / 2
    assert abs(total - sum(sent_stream)) < 6 * sd + theta, (total, sum(sent_stream), sd)
    assert m.get("tops_messages_total{result=ok}", 0) >= HOLDOUT
    # no raw reading in the captured report topic: every captured number differs from every reading
    captured = [json.loads(p) for t, p in capture.lines if t.startswith("meters/zone-1")]
    assert len(captured) >= HOLDOUT and all(set(c) <= {"report", "phase", "ts", "theta"} for c in captured)
    numbers = {c["report"] for c in captured} | {c.get("theta") for c in captured}
    leaked = numbers & {float(v) for v in readings[: switched + 40].ravel()}
    assert not leaked, f"{len(leaked)} raw readings found in the report capture"

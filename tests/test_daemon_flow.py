"""Floods and backpressure through a real Mosquitto (issue 10, items 2-4): bounded memory, ticks keep flowing, what
cannot be taken at QoS 0 is counted, no release is dropped while connected, nothing received is discarded on resume.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import (
    DaemonProcess,
    Subscriber,
    _broker,
    daemon_config,
    free_port,
    publish,
    publish_file,
    wait_for,
)

pytestmark = [pytest.mark.network, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def mosquitto_unbounded(tmp_path: Path):
    """A broker that never drops QoS 0 messages for a connected client (`max_queued_messages 0`): what the daemon
    does not count as processed or overload cannot have been lost in the broker."""
    yield from _broker(tmp_path, "allow_anonymous true\nmax_queued_messages 0\n")


def vm(pid: int, field: str) -> int:
    """A VmRSS/VmHWM line of /proc/<pid>/status, in kB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def run_flood(port: int, seconds: float, topics: list[str], rate: float = 0.0) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tests.flood", "--port", str(port), "--seconds", str(seconds),
           "--topics", ",".join(topics), "--rate", str(rate)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE)


def test_qos0_flood_bounded_memory_ticks_flow_and_overload_counted(mosquitto_unbounded, tmp_path: Path) -> None:
    """A 12 s QoS 0 flood at the publisher's maximum rate against a daemon with a small incoming queue: period
    releases keep coming during the flood, the connection survives (keepalive 5 s), memory stays bounded, and every
    message sent is either processed or counted as `overload`."""
    broker = mosquitto_unbounded
    mport = free_port()
    cfg = daemon_config(tmp_path, broker.port, mport, mqtt={"keepalive": 5},
                        input={"qos": 0, "max_queue": 2000},
                        ticks={"mode": "period", "period": 1.0}, streams={"template": {"theta": 50.0}},
                        output={"status_topic": ""})
    daemon = DaemonProcess(cfg, mport, tmp_path)
    sub = Subscriber(broker.port, "dp/+")
    try:
        daemon.wait_connected()
        sub.wait_ready("dp/probe")
        publish(broker.port, "meters/tick/reading", ["1"], qos=0)  # the stream whose periods we watch
        wait_for(lambda: any(p.get("stream") == "tick" for p in sub.payloads()), 10, what="first period")
        rss0 = vm(daemon.proc.pid, "VmRSS")
        seconds = 12.0
        flood = run_flood(broker.port, seconds, [f"meters/f{i}/reading" for i in range(4)])
        t0 = time.time()
        out, _ = flood.communicate(timeout=120)
        t1 = time.time()
        arrived = sub.payloads()  # releases that reached the consumer by the end of the flood
        sent = json.loads(out)["sent"]

        def settled() -> dict[str, float] | None:
            m = daemon.metrics()
            done = m["tops_messages_total{result=ok}"] + m.get("tops_messages_total{result=overload}", 0.0)
            return m if done >= sent + 1 else None

        m = wait_for(settled, 120, interval=0.5, what="every flood message processed or counted")
        hwm = vm(daemon.proc.pid, "VmHWM")
        during = [p for p in arrived if p.get("stream") == "tick" and t0 + 1 <= p["ts"] <= t1]
        print(f"flood: sent {sent} in {t1 - t0:.1f} s, processed {m['tops_messages_total{result=ok}'] - 1:.0f}, "
              f"overload {m.get('tops_messages_total{result=overload}', 0):.0f}, RSS {rss0 / 1024:.0f} -> peak "
              f"{hwm / 1024:.0f} MB, tick releases during the flood {len(during)}")
        assert m["tops_messages_total{result=ok}"] + m["tops_messages_total{result=overload}"] == sent + 1
        assert m["tops_messages_total{result=overload}"] > 0  # the bound was reached: counted, not queued
        assert m["tops_mqtt_reconnects_total"] == 0 and m["tops_mqtt_connected"] == 1  # no keepalive drop
        assert hwm - rss0 < 120 * 1024, "memory grew with the flood"
        # every period that ended during the flood released on time, give or take scheduling on a busy machine
        assert len(during) >= (t1 - t0) / 2
        assert daemon.stop() == 0
    finally:
        sub.close()
        daemon.kill()
    assert "Traceback" not in daemon.stderr()

"""deploy/ as shipped, on Debian's Mosquitto (stock mosquitto.conf + our drop-in + ACL): each role can do exactly
what it needs and nothing more.

Devices have one account each, named after their stream: a device writes only its own readings (or reports) and
reads only its own control topic; the daemon (svc/tops) reads input and writes output; a consumer (svc/consumer)
only reads output. Every forbidden publish is attempted and must not arrive.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import (
    ACL_USERS,
    ROOT,
    DaemonProcess,
    Subscriber,
    daemon_config,
    free_port,
    publish,
    wait_for,
)

pytestmark = [pytest.mark.network, pytest.mark.slow]

DEVICE_A = ("meter-a", ACL_USERS["meter-a"])
DEVICE_B = ("meter-b", ACL_USERS["meter-b"])
CONSUMER = ("svc/consumer", ACL_USERS["svc/consumer"])
DAEMON = ("svc/tops", ACL_USERS["svc/tops"])


def _daemon(tmp: Path, port: int, **sections: dict) -> DaemonProcess:
    pw = tmp / "mqtt-password"
    pw.write_text(ACL_USERS["svc/tops"] + "\n")
    mport = free_port()
    mqtt = {"username": "svc/tops", "password_file": str(pw)}
    cfg = daemon_config(tmp, port, mport, mqtt=mqtt, **sections)
    return DaemonProcess(cfg, mport, tmp)


def test_roles_are_kept_apart(mosquitto_acl, tmp_path: Path) -> None:
    """Central mode: devices feed only their own stream; nobody but the daemon writes releases; the consumer reads
    releases and nothing else; a device reads nothing."""
    port = mosquitto_acl.port
    daemon = _daemon(tmp_path, port, streams={"template": {"holdout": 5}})
    out_reader = Subscriber(port, "dp/#", user=CONSUMER)
    in_snooper = Subscriber(port, "meters/#", user=CONSUMER)
    device_reader = Subscriber(port, "#", user=DEVICE_A)
    try:
        daemon.wait_connected()
        out_reader.wait_ready("dp/probe", user=DAEMON)
        publish(port, "meters/meter-a/reading", [str(i) for i in range(20)], user=DEVICE_A)
        publish(port, "meters/meter-b/reading", ["1"] * 7, user=DEVICE_A)  # another device's stream: denied
        publish(port, "dp/meter-a", ['{"stream": "meter-a", "tick": 999, "value": -1}'], user=DEVICE_A)  # forged
        publish(port, "meters/meter-a/reading", ["1"] * 5, user=CONSUMER)  # consumers cannot feed the daemon
        publish(port, "meters/svc/reading", ["1"] * 3, user=CONSUMER)  # nor through the device pattern
        publish(port, "dp/meter-a", ['{"stream": "meter-a", "tick": 998, "value": -1}'], user=CONSUMER)
        publish(port, "meters/tops/reading", ["1"] * 4, user=DAEMON)  # the daemon writes no readings
        wait_for(lambda: len([p for p in out_reader.payloads() if "tick" in p]) >= 15, 15, what="releases")
        wait_for(lambda: daemon.metrics()["tops_readings_total{result=ok}"] >= 20, 5, what="counted")
        time.sleep(0.5)  # anything forbidden that got through would have arrived by now
        releases = [p for p in out_reader.payloads() if "tick" in p]
        assert sorted(p["tick"] for p in releases) == list(range(5, 20))  # no forged tick 999 / 998
        assert {p["stream"] for p in releases} == {"meter-a"}
        assert daemon.metrics()["tops_readings_total{result=ok}"] == 20  # nothing but meter-a's own 20
        assert daemon.metrics()["tops_streams_active"] == 1
        assert in_snooper.lines == []  # the consumer saw no reading
        assert device_reader.lines == []  # a device reads nothing (no control topic in central mode)
        assert daemon.stop() == 0
    finally:
        for s in (out_reader, in_snooper, device_reader):
            s.close()
        daemon.kill()
    assert "Traceback" not in daemon.stderr()


def test_local_mode_device_reads_its_control_and_reports_through_the_acl(mosquitto_acl, tmp_path: Path) -> None:
    """Local mode with the shipped ACL: the daemon publishes the control message, `tops device` as meter-a reads it
    and reports; meter-b cannot read meter-a's control topic nor report for it."""
    port = mosquitto_acl.port
    daemon = _daemon(tmp_path, port, streams={"mode": "local", "template": {"holdout": 20, "bound": 100.0}},
                     input={"topics": ["meters/+/report"]}, local={"streams": ["meter-a"]}, state={"data_dir": ""})
    b_snoop = Subscriber(port, "tops/control/#", user=DEVICE_B)
    pw = tmp_path / "device-password"
    pw.write_text(ACL_USERS["meter-a"] + "\n")
    try:
        daemon.wait_connected()
        readings = "".join(f"{i % 50}\n" for i in range(40)).encode()
        dev = subprocess.run(
            [sys.executable, "-m", "stream.cli", "device", "--host", "127.0.0.1", "--port", str(port),
             "--stream", "meter-a", "--max-epsilon", "1", "--username", "meter-a", "--password-file", str(pw)],
            input=readings, capture_output=True, timeout=60, cwd=ROOT, check=False)
        assert dev.returncode == 0, dev.stderr.decode()[-2000:]
        publish(port, "meters/meter-a/report", ['{"x": 1}'] * 3, user=DEVICE_B)  # not its stream: denied
        wait_for(lambda: daemon.metrics().get("tops_messages_total{result=ok}", 0) >= 20, 15, what="reports")
        time.sleep(0.5)
        m = daemon.metrics()
        assert m["tops_messages_total{result=invalid}"] == 0  # meter-b's forged reports never arrived
        assert b_snoop.lines == []  # meter-b cannot read meter-a's control message
        assert daemon.stop() == 0
    finally:
        b_snoop.close()
        daemon.kill()

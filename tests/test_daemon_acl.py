"""The deploy/ users and ACLs on a real Mosquitto: devices only publish input, consumers only read output."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import (
    ACL_USERS,
    DaemonProcess,
    Subscriber,
    daemon_config,
    free_port,
    publish,
    wait_for,
)

pytestmark = [pytest.mark.network, pytest.mark.slow]

DEVICE = ("device", ACL_USERS["device"])
CONSUMER = ("consumer", ACL_USERS["consumer"])
DAEMON = ("tops", ACL_USERS["tops"])


def test_deploy_acls(mosquitto_acl, tmp_path: Path) -> None:
    """The daemon works through the ACLs; a consumer cannot read input; a device cannot publish output."""
    port = mosquitto_acl.port
    pw = tmp_path / "mqtt-password"
    pw.write_text(ACL_USERS["tops"] + "\n")
    mport = free_port()
    cfg = daemon_config(tmp_path, port, mport, mqtt={"username": "tops", "password_file": str(pw)},
                        streams={"template": {"holdout": 5}})
    daemon = DaemonProcess(cfg, mport, tmp_path)
    out_reader = Subscriber(port, "dp/#", user=CONSUMER)
    in_snooper = Subscriber(port, "meters/#", user=CONSUMER)
    device_reader = Subscriber(port, "dp/#", user=DEVICE)
    try:
        daemon.wait_connected()
        out_reader.wait_ready("dp/probe", user=DAEMON)
        publish(port, "meters/a/reading", [str(i) for i in range(20)], user=DEVICE)
        publish(port, "dp/a", ['{"stream": "a", "tick": 999, "value": -1}'], user=DEVICE)  # forged release
        publish(port, "meters/a/reading", ["1"] * 5, user=CONSUMER)  # consumers cannot feed the daemon
        wait_for(lambda: len([p for p in out_reader.payloads() if "tick" in p]) >= 15, 15, what="releases")
        wait_for(lambda: daemon.metrics()["tops_readings_total{result=ok}"] >= 20, 5, what="counted")
        releases = [p for p in out_reader.payloads() if "tick" in p]
        assert sorted(p["tick"] for p in releases) == list(range(5, 20))  # no forged tick 999
        assert daemon.metrics()["tops_readings_total{result=ok}"] == 20  # the consumer's 5 never arrived
        assert in_snooper.lines == []  # the consumer saw no reading
        assert device_reader.lines == []  # devices read nothing
        assert daemon.stop() == 0
    finally:
        for s in (out_reader, in_snooper, device_reader):
            s.close()
        daemon.kill()
    assert "Traceback" not in daemon.stderr()

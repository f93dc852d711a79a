"""The MQTT adapter (stream/daemon/mqtt_paho.py) runs only on the paho-mqtt and aiomqtt it was written for: the
installed versions and every internal it relies on are checked, in the test suite and by ``tops run`` before it
starts, each difference named in one line."""

from __future__ import annotations

import os
import shutil
from importlib import metadata
from pathlib import Path

import pytest
from paho.mqtt import client as paho_client

from stream.daemon import mqtt_paho
from tests.support import ROOT, free_port, tops_text, write_toml


def test_the_mqtt_adapter_runs_on_the_paho_and_aiomqtt_it_was_written_for() -> None:
    assert {d: metadata.version(d) for d in mqtt_paho.TESTED} == mqtt_paho.TESTED
    assert mqtt_paho.adapter_problems() == []


def test_a_changed_version_or_private_is_named_in_one_line_each(monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.version
    monkeypatch.setattr(mqtt_paho.metadata, "version", lambda d: "2.3.0" if d == "paho-mqtt" else real(d))
    monkeypatch.delattr(paho_client.Client, "loop_read")

    def changed(self, command, packet, mid, qos, info=None, *, more=False):
        return None

    monkeypatch.setattr(paho_client.Client, "_packet_queue", changed)
    problems = mqtt_paho.adapter_problems()
    assert len(problems) == 3, problems
    assert problems[0].startswith("paho-mqtt 2.3.0 is installed; the MQTT adapter (stream/daemon/mqtt_paho.py) was "
                                  "written and tested for 2.2.0")
    assert "paho-mqtt Client._packet_queue now takes (self, command, packet, mid, qos, info, more)" in problems[1]
    assert problems[2] == "paho-mqtt Client.loop_read is gone (the MQTT adapter relies on it)"
    assert all("\n" not in p for p in problems)


def _shadow_paho(tmp: Path) -> Path:
    """A copy of the installed paho-mqtt, on a folder put first on PYTHONPATH, claiming version 2.3.0 and with
    ``Client._packet_queue`` renamed: what an upgrade that changed it would look like."""
    installed = Path(paho_client.__file__).parents[1]
    shadow = tmp / "shadow"
    shutil.copytree(installed, shadow / "paho")
    client_py = shadow / "paho" / "mqtt" / "client.py"
    client_py.write_text(client_py.read_text().replace("def _packet_queue(", "def _queue_packet("))
    dist = shadow / "paho_mqtt-2.3.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: paho-mqtt\nVersion: 2.3.0\n")
    return shadow


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_tops_run_with_mqtt_refuses_to_start_on_another_paho(tmp_path: Path, check: bool) -> None:
    """Exit 2 before connecting, one line per difference, no traceback (the broker's port is never tried)."""
    shadow = _shadow_paho(tmp_path)
    cfg = write_toml(tmp_path / "tops.toml", {
        "mqtt": {"host": "127.0.0.1", "port": free_port()},
        "input": {"source": "mqtt", "topics": ["meters/+/reading"], "qos": 1},
        "output": {"sinks": ["mqtt"], "topic": "dp/{stream}"},
        "streams": {"key_file": str(tmp_path / "master.key"),
                    "template": {"epsilon": 1.0, "bound": 100.0, "holdout": 50, "query_range": 256, "fanout": 4}},
        "metrics": {"port": 0}})
    env = {**os.environ, "PYTHONPATH": f"{shadow}{os.pathsep}{ROOT}"}
    r = tops_text("run", "--config", cfg, *(["--check"] if check else []), env=env, timeout=60, stdin="")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert lines == [
        "tops run: paho-mqtt 2.3.0 is installed; the MQTT adapter (stream/daemon/mqtt_paho.py) was written and tested "
        "for 2.2.0: install paho-mqtt==2.2.0",
        "tops run: paho-mqtt Client._packet_queue is gone (the MQTT adapter relies on it)"], lines


def test_stdin_without_mqtt_does_not_look_at_paho(tmp_path: Path) -> None:
    shadow = _shadow_paho(tmp_path)
    env = {**os.environ, "PYTHONPATH": f"{shadow}{os.pathsep}{ROOT}"}
    r = tops_text("run", "--check", "--key-file", tmp_path / "master.key", env=env, timeout=60, stdin="")
    assert r.returncode == 0, r.stderr


def test_pyproject_pins_exactly_the_versions_the_adapter_accepts() -> None:
    """An install resolves to the versions ``tops run`` accepts: a range in pyproject.toml would let pip install a
    version that the daemon then refuses."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dist, version in mqtt_paho.TESTED.items():
        assert [d for d in deps if d.startswith(dist)] == [f"{dist}=={version}"]

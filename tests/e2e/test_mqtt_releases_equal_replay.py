"""End to end through a real Mosquitto: releases of `tops run` equal `tops replay` on the same readings and key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support import (
    TEMPLATE,
    DaemonProcess,
    Subscriber,
    check_against_replay,
    daemon_config,
    free_port,
    publish,
    wait_for,
)

pytestmark = [pytest.mark.network, pytest.mark.slow]



def test_mqtt_releases_equal_replay_and_metrics_match(mosquitto, tmp_path: Path) -> None:
    """Two streams (plain numbers; JSON objects and a batch) over MQTT QoS 1: releases == replay, counters match."""
    rng = np.random.default_rng(7)
    a = rng.integers(0, 150, size=300).astype(float)  # some above the bound: clamped inside the operator
    b = rng.integers(0, 80, size=240).astype(float)
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport)
    daemon = DaemonProcess(cfg, mport, tmp_path)
    sub = Subscriber(mosquitto.port, "dp/#")
    try:
        daemon.wait_connected()
        sub.wait_ready("dp/probe")
        lines_a = [f"{v:g}" for v in a]
        lines_b = [json.dumps({"value": float(v), "seq": i}) for i, v in enumerate(b[:200])]
        lines_b.append(json.dumps([{"value": float(v), "seq": 200 + i} for i, v in enumerate(b[200:])]))
        assert publish(mosquitto.port, "meters/a/reading", lines_a).returncode == 0
        assert publish(mosquitto.port, "meters/b/reading", lines_b).returncode == 0
        n_expected = (len(a) - TEMPLATE["holdout"]) + (len(b) - TEMPLATE["holdout"])

        def releases() -> list[dict]:
            return [p for p in sub.payloads() if "tick" in p]

        wait_for(lambda: len(releases()) >= n_expected, 30, what="all releases")
        rel = releases()
        assert all(set(r) == {"stream", "tick", "ts", "value", "epsilon", "theta"} for r in rel)
        assert check_against_replay(rel, a, tmp_path / "master.key", "a", tmp_path) == len(a) - 50
        assert check_against_replay(rel, b, tmp_path / "master.key", "b", tmp_path) == len(b) - 50
        status = {t: json.loads(p) for t, p in sub.lines if t.endswith("/status")}
        wait_for(lambda: {t: json.loads(p) for t, p in sub.lines if t.endswith("/status")}.get("dp/a/status", {})
                 .get("phase") == "releasing", 10, what="releasing status")
        status = {t: json.loads(p) for t, p in sub.lines if t.endswith("/status")}
        assert status["dp/b/status"]["phase"] == "releasing" and status["dp/b/status"]["theta"] > 0

        def settled() -> dict[str, float] | None:
            m = daemon.metrics()
            return m if m["tops_releases_total{sink=mqtt}"] >= n_expected else None

        m = wait_for(settled, 10, what="metrics")
        assert m['tops_messages_total{result=ok}'] == len(lines_a) + len(lines_b)
        assert m['tops_readings_total{result=ok}'] == len(a) + len(b)
        assert m['tops_ticks_total'] == len(a) + len(b)
        assert m['tops_releases_total{sink=mqtt}'] == n_expected
        assert m['tops_streams_active'] == 2 and m['tops_streams_holdout'] == 0
        assert m['tops_mqtt_connected'] == 1 and m['tops_mqtt_reconnects_total'] == 0
        assert m['tops_messages_total{result=invalid}'] == 0
        assert m['tops_tick_latency_seconds_count'] >= 2
        assert daemon.stop() == 0
    finally:
        sub.close()
        daemon.kill()
    log = daemon.stderr()
    assert "Traceback" not in log

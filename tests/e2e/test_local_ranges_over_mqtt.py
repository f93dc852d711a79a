"""Local range counting over a real Mosquitto: hostile reports are counted invalid, three real `tops device`
processes report, every honest report is in exactly one release, and each range is within five standard errors of
the truth."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support import write_toml


@pytest.mark.network
def test_local_range_with_tops_device_processes_and_hostile_reports(mosquitto, tmp_path: Path) -> None:
    """Local tree (16 buckets of 0.5, b = 4, eps 2: GRR on both levels). Hostile reports first (out of range,
    negative, fractional, another phase, 1e400, not JSON): each counted invalid, none in a release. Then three real
    `tops device` processes send 1,200 readings each. Every honest report is in exactly one release, and each range
    summed over the periods is within 5 standard errors (LocalTree's exact variance) of the truth."""
    from operators.ranges.local import LocalTree, answer_from_levels
    from tests.support import DaemonProcess, Subscriber, free_port, publish, run_devices, wait_for

    mport = free_port()
    eps, d = 2.0, 16
    doc = {
        "mqtt": {"host": "127.0.0.1", "port": mosquitto.port, "reconnect_min": 0.1, "reconnect_max": 1.0},
        "input": {"source": "mqtt", "topics": ["meters/+/report"], "qos": 1},
        "output": {"sinks": ["mqtt"], "topic": "dp/{stream}", "qos": 1, "status_interval": 0.5},
        "ticks": {"mode": "period", "period": 1.0},
        "streams": {"kind": "range", "mode": "local"},
        "local": {"streams": ["kwh"]},
        "ranges": {"epsilon": eps, "lower": 0.0, "width": 0.5, "buckets": d, "mechanism": "tree", "fanout": 4},
        "metrics": {"port": mport},
        "state": {"data_dir": str(tmp_path / "state")},
    }
    cfg = write_toml(tmp_path / "tops.toml", doc)
    rng = np.random.default_rng(5)
    sub = Subscriber(mosquitto.port, "dp/+")
    sub.wait_ready("dp/probe")
    daemon = DaemonProcess(cfg, mport, tmp_path)
    counts = np.zeros(d, dtype=np.int64)
    try:
        daemon.wait_connected()
        now = time.time()
        hostile = [json.dumps({"report": r, "phase": "range", "ts": now}) for r in (36, 10_000, -1, 3.5)]
        hostile += [json.dumps({"report": 2, "phase": "categorical", "ts": now}),
                    '{"report": 1e400, "phase": "range"}', "not json"]
        assert publish(mosquitto.port, "meters/kwh/report", hostile).returncode == 0

        def rejected() -> float:
            m = daemon.metrics()
            return m.get("tops_readings_total{result=invalid}", 0.0) + m.get("tops_messages_total{result=invalid}", 0.0)

        wait_for(lambda: rejected() >= len(hostile), 15, what="hostile reports counted")
        inputs = []
        for i in range(3):
            values = np.clip(rng.gamma(2.0, 1.5, size=1200), 0, None)
            counts += np.bincount(np.clip(np.floor(values / 0.5).astype(np.int64), 0, d - 1), minlength=d)
            inputs.append(tmp_path / f"dev{i}.txt")
            inputs[-1].write_text("\n".join(f"{v:.3f}" for v in values) + "\n")
        run_devices(mosquitto.port, "kwh", inputs)
        n = int(counts.sum())
        wait_for(lambda: sum(r.get("reports", 0) for r in sub.payloads() if "tick" in r) >= n, 30,
                 what="every report in a release")
        assert daemon.stop() == 0
    finally:
        daemon.kill()
        sub.close()
    rel = [r for r in sub.payloads() if "tick" in r]
    assert sum(r["reports"] for r in rel) == n
    assert all(r["mechanism"] == "tree" and r["oracles"] == ["grr", "grr"] for r in rel)
    levels = [np.sum([r["levels"][j] for r in rel], axis=0) for j in range(2)]
    tree = LocalTree(d, 4, eps)
    for lo, hi in [(0, 3), (2, 9), (5, 5), (0, 15), (8, 15)]:
        truth = int(counts[lo : hi + 1].sum())
        sd = math.sqrt(tree.range_variance(counts, lo, hi))
        assert abs(answer_from_levels(levels, 4, lo, hi) - truth) <= 5 * sd, (lo, hi, truth, sd)
    log = daemon.stderr()
    assert "Traceback" not in log

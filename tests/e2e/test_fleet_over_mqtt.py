"""A fleet holdout over a real Mosquitto, QoS 1 in and out, durable state: one publisher sends the meters' readings
interleaved (one global order), the daemon is killed with SIGKILL right after the fleet's choice and started again,
and every meter's releases are those of the fleet's operators on the readings in the order they were published:
the readings that came back from the broker after the kill (unacknowledged, or sent while the daemon was down) take
their places in that order, and the ones already journaled are dropped by their seq, not held twice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support import (
    FLEET_TEMPLATE,
    DaemonProcess,
    Feeder,
    Subscriber,
    daemon_config,
    find_identity,
    fleet_releases,
    free_port,
    wait_for,
)

TEMPLATE = FLEET_TEMPLATE


@pytest.mark.network
@pytest.mark.slow
def test_kill9_after_the_fleet_choice_over_mqtt_releases_what_the_published_order_gives(mosquitto,
                                                                                       tmp_path: Path) -> None:
    rng = np.random.default_rng(21)
    values = {f"meter-{i}": rng.integers(0, 50, 25).astype(float) for i in range(8)}
    values |= {f"late-{i}": rng.integers(0, 50, 6).astype(float) for i in range(2)}
    starts = dict.fromkeys(values, 0) | {"late-0": 12, "late-1": 18}  # they appear after the choice
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, mqtt={"client_id": "tops-fleet-kill"},
                        streams={"template": TEMPLATE})
    sub = Subscriber(mosquitto.port, "dp/+")
    sub.wait_ready("dp/probe")
    daemon = DaemonProcess(cfg, mport, tmp_path)
    daemon.wait_connected()
    feeder = Feeder(mosquitto.port, values, rate=200.0, starts=starts)
    feeder.start()
    feeder.wait_sent(TEMPLATE["holdout"] + 12)  # the fleet holdout is full: kill right after its choice
    daemon.kill()
    daemon = DaemonProcess(cfg, mport, tmp_path)
    total = feeder.total
    want_released = total - TEMPLATE["holdout"]

    def releases() -> dict[str, dict[int, float]]:
        got: dict[str, dict[int, float]] = {}
        for r in sub.payloads():
            if "tick" in r:
                seen = got.setdefault(r["stream"], {})
                assert seen.setdefault(r["tick"], r["value"]) == r["value"], r  # again after the kill: the same
        return got

    try:
        wait_for(lambda: sum(map(len, releases().values())) >= want_released, 90, what="every release")
        feeder.join(30)
    finally:
        assert daemon.stop() == 0
        sub.close()
    order = []
    for i in range(max(starts[s] + len(v) for s, v in values.items())):
        for s, v in values.items():
            if 0 <= i - starts[s] < len(v):
                order.append((s, float(v[i - starts[s]])))
    want = fleet_releases(tmp_path / "master.key", find_identity(tmp_path), {}, order)
    assert releases() == want
    assert all(0 in want[f"late-{i}"] for i in range(2))  # a stream after the choice: its first reading released

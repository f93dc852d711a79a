"""Readings counted twice after a broker crash, with and without ``seq``: Debian's Mosquitto with deploy/'s drop-in
and ACL (persistence, ``autosave_interval 1``), a daemon with durable state and the deploy example's persistent
session, two devices sending QoS 1 readings at a steady pace; the broker is killed (SIGKILL) and restarted
``--kills`` times once readings flow. Every reading carries a distinct ``ts`` and the daemon also writes its
releases on stdout (theta fixed: one release per tick), so each release names its reading: one released under two
ticks was counted twice, one never released was lost (the broker's last second). One JSON line per run.

    python bench/bench_broker_crash.py [--runs 6] [--kills 2] [--rate 200] [--readings 2000] [--seq]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support import (
    ACL_USERS,
    Broker,
    DaemonProcess,
    DeviceFeeder,
    daemon_config,
    deploy_broker_conf,
    free_port,
    wait_for,
)

DEVICES = ("meter-a", "meter-b")


def settle(daemon: DaemonProcess, quiet: float = 5.0, timeout: float = 120.0) -> dict[str, float]:
    """The daemon's metrics once no tick was made for ``quiet`` seconds with nothing waiting."""
    last, still, end = None, 0.0, time.monotonic() + timeout
    while time.monotonic() < end:
        m = daemon.metrics()
        key = (m["tops_ticks_total"], m["tops_readings_total{result=duplicate}"])
        still = still + 0.5 if key == last and m["tops_incoming_queue_depth"] == 0 else 0.0
        if still >= quiet:
            break
        last = key
        time.sleep(0.5)
    return daemon.metrics()


def run(seed: int, kills: int, rate: float, n: int, seq: bool) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="tops-broker-crash-"))
    port = free_port()
    broker = Broker(port, deploy_broker_conf(tmp / "broker", port))
    broker.start()
    pw = tmp / "mqtt-password"
    pw.write_text(ACL_USERS["svc/tops"] + "\n")
    mport = free_port()
    cfg = daemon_config(tmp, port, mport, mqtt={"username": "svc/tops", "password_file": str(pw),
                                                "client_id": "tops-bench"},
                        output={"sinks": ["mqtt", "stdout"], "status_topic": ""}, streams={"template": {"theta": 50.0}},
                        log={"level": "warning"})
    out = tmp / "out.jsonl"
    daemon = DaemonProcess(cfg, mport, tmp, stdout=out.open("wb"))
    devices = [DeviceFeeder(port, (d, ACL_USERS[d]), n, rate, seq=seq) for d in DEVICES]
    pick = random.Random(seed)
    try:
        daemon.wait_connected()
        for d in devices:
            d.start()
        wait_for(lambda: daemon.metrics()["tops_ticks_total"] >= 400, 60, what="readings flowing")
        for _ in range(kills):
            time.sleep(pick.uniform(1.5, 3.0))
            assert broker.proc is not None
            broker.proc.kill()
            broker.proc.wait()
            broker.proc = None
            time.sleep(pick.uniform(0.05, 0.3))
            broker.start()
        for d in devices:
            d.join(120)
        wait_for(lambda: all(d.confirmed() for d in devices), 120, what="every reading taken by the broker")
        m = settle(daemon)
        daemon.stop()
    finally:
        for d in devices:
            d.close()
        daemon.kill()
        broker.stop()
    ticks_of: dict[tuple[str, float], set[int]] = {}
    for line in out.read_text().splitlines():
        r = json.loads(line)
        ticks_of.setdefault((r["stream"], float(r["ts"])), set()).add(r["tick"])
    sent = len(DEVICES) * n
    return {"seq": seq, "readings": sent, "ticks": int(m["tops_ticks_total"]),
            "counted_twice": sum(len(t) - 1 for t in ticks_of.values()),
            "lost": sum(1 for d in DEVICES for i in range(n) if (d, float(DeviceFeeder.T0 + i)) not in ticks_of),
            "repeats_dropped_by_seq": int(m["tops_readings_total{result=duplicate}"]),
            "repeats_dropped_by_packet_id": int(m.get("tops_redeliveries_dropped_total", 0))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--kills", type=int, default=2, help="broker SIGKILLs a run")
    p.add_argument("--rate", type=float, default=200.0, help="readings a second per device")
    p.add_argument("--readings", type=int, default=2000, help="readings per device")
    p.add_argument("--seq", action="store_true", help="the devices send seq")
    a = p.parse_args()
    for seed in range(a.runs):
        print(json.dumps(run(seed, a.kills, a.rate, a.readings, a.seq)), flush=True)


if __name__ == "__main__":
    main()

"""A QoS 0 flood at the publisher's maximum rate against `tops run`; prints figures.

Run: ``python bench/bench_flood.py [--seconds 60] [--qos 0|1] [--max-queue N]``. Starts Mosquitto on a free
loopback port (no queue limit: the broker never drops, so whatever the daemon does not process it must count), the
daemon with durable state and 1 s period ticks on a watched stream, a consumer, and ``tests/flood.py`` (raw QoS 0
PUBLISH packets, 4 topics). Prints: messages sent, processed, counted as overload; the daemon's RSS before and its
peak (VmHWM); the largest gap between consecutive period releases at the consumer during the flood; reconnections.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import Broker, free_port, scrape, wait_for, write_toml  # noqa: E402


def vm(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--qos", type=int, default=0, help="QoS of the daemon's subscription")
    p.add_argument("--max-queue", type=int, default=10_000)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tops-flood-"))
    port = free_port()
    conf = tmp / "mosquitto.conf"
    user = "user root\n" if os.geteuid() == 0 else ""
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 0\n"
                    f"max_inflight_messages 1000\n{user}")
    broker = Broker(port, conf)
    broker.start()
    mport = free_port()
    cfg = write_toml(tmp / "tops.toml", {
        "mqtt": {"port": port, "keepalive": 10},
        "input": {"source": "mqtt", "topics": ["meters/+/reading"], "qos": a.qos, "max_queue": a.max_queue},
        "output": {"sinks": ["mqtt"], "qos": 1, "status_topic": ""},
        "ticks": {"mode": "period", "period": 1.0},
        "streams": {"key_file": str(tmp / "master.key"),
                    "template": {"epsilon": 1.0, "bound": 100.0, "theta": 50.0, "query_range": 1 << 16}},
        "metrics": {"port": mport}, "log": {"level": "warning"}, "state": {"data_dir": str(tmp / "state")},
    })
    daemon = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config", str(cfg)], cwd=ROOT,
                              stderr=(tmp / "daemon.log").open("wb"))
    arrivals: list[float] = []
    sub = subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-t", "dp/tick", "-q", "1"],
                           stdout=subprocess.PIPE)

    def read() -> None:
        assert sub.stdout is not None
        for _ in sub.stdout:
            arrivals.append(time.monotonic())

    threading.Thread(target=read, daemon=True).start()
    try:
        wait_for(lambda: scrape(mport).get("tops_mqtt_connected") == 1.0, 30, what="daemon")
        subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-t", "meters/tick/reading", "-m", "1"],
                       check=True)
        wait_for(lambda: len(arrivals) >= 2, 10, what="period releases")
        rss0 = vm(daemon.pid, "VmRSS")
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "tests.flood", "--port", str(port), "--seconds", str(a.seconds),
                              "--topics", ",".join(f"meters/f{i}/reading" for i in range(4))],
                             cwd=ROOT, capture_output=True, check=True, timeout=a.seconds * 5 + 60)
        t1 = time.monotonic()
        sent = json.loads(out.stdout)["sent"]

        def done() -> dict[str, float] | None:
            m = scrape(mport)
            n = m["tops_messages_total{result=ok}"] + m["tops_messages_total{result=overload}"]
            return m if n >= sent + 1 else None

        m = wait_for(done, 600, interval=0.5, what="flood processed or counted")
        t2 = time.monotonic()
        hwm = vm(daemon.pid, "VmHWM")
        during = [x for x in arrivals if t0 <= x <= t1]
        gaps = [b - a for a, b in zip([t0, *during], [*during, t1], strict=True)]
        print(json.dumps({
            "seconds": round(t1 - t0, 1), "sent": sent, "rate_sent": round(sent / (t1 - t0)),
            "processed": int(m["tops_messages_total{result=ok}"]) - 1,
            "overload": int(m["tops_messages_total{result=overload}"]),
            "settled_after_flood_s": round(t2 - t1, 1),
            "rss_before_mb": round(rss0 / 1024, 1), "rss_peak_mb": round(hwm / 1024, 1),
            "period_releases_during_flood": len(during), "max_release_gap_s": round(max(gaps), 2),
            "reconnects": int(m["tops_mqtt_reconnects_total"]), "connected": int(m["tops_mqtt_connected"]),
        }))
    finally:
        daemon.terminate()
        daemon.wait(60)
        sub.terminate()
        broker.stop()


if __name__ == "__main__":
    main()

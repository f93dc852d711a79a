"""Throughput of `tops run` through a real Mosquitto (single readings, batches, 10,000 streams); prints figures.

``--only held [--held 1000000]``: single readings (QoS 1 in) before and while the daemon holds a million other streams
in their holdout (the aim: no slower while holding them).

Run: ``python bench/bench_daemon.py [--messages N]``. Starts a broker on a free loopback port, the daemon as a
subprocess (one process), and publishers (``mosquitto_pub -l``, C, or paho for many topics). The rate is the
daemon's: readings counted by its metrics endpoint divided by the time from the first to the last one counted.
Memory per stream: growth of the daemon's resident set (VmRSS) over 10,000 streams divided by 10,000.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import Broker, free_port, scrape, wait_for, write_toml  # noqa: E402

STATE = True  # --no-state: without durable state
BROKER_INFLIGHT = 0  # --broker-inflight: Mosquitto's max_inflight_messages (0: no limit; Mosquitto's default is 20)
TEMPLATE = {"epsilon": 1.0, "bound": 1000.0, "holdout": 100, "query_range": 1 << 16, "fanout": 16}


def start_broker(tmp: Path) -> Broker:
    port = free_port()
    conf = tmp / "mosquitto.conf"
    user = "user root\n" if os.geteuid() == 0 else ""
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                    f"max_queued_messages 0\nmax_inflight_messages {BROKER_INFLIGHT}\n{user}")
    b = Broker(port, conf)
    b.start()
    return b


def start_daemon(tmp: Path, port: int, **sections: dict) -> tuple[subprocess.Popen[bytes], int]:
    mport = free_port()
    doc: dict = {
        "mqtt": {"port": port},
        "input": {"source": "mqtt", "topics": ["meters/+/reading"], "qos": 1,
                  "max_payload_bytes": 4 << 20},
        "output": {"sinks": ["mqtt"], "qos": 0, "status_topic": "", "publish_queue": 2_000_000},
        "streams": {"key_file": str(tmp / "master.key"), "max_streams": 20_000, "template": dict(TEMPLATE)},
        "metrics": {"port": mport},
        "log": {"level": "warning"},
        # durable state on (journal, fsync, acknowledgements after the journal), a fresh store per start
        "state": {"data_dir": tempfile.mkdtemp(dir=tmp, prefix="state-") if STATE else ""},
    }
    for name, d in sections.items():
        doc.setdefault(name, {}).update(d)
    cfg = write_toml(tmp / "tops.toml", doc)
    proc = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config", str(cfg)], cwd=ROOT,
                            stderr=(tmp / "daemon.log").open("ab"))
    wait_for(lambda: scrape(mport).get("tops_mqtt_connected") == 1.0, 30, what="daemon")
    return proc, mport


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def measure(mport: int, total: int, releases: float = 0, timeout: float = 300.0, *,
            before: dict[str, float] | None = None) -> tuple[float, dict[str, float]]:
    """Seconds from the first of ``total`` readings counted by the daemon until all are in and ``releases``
    releases are confirmed by the broker (end to end); ``before``: the metrics before these readings."""
    b = before or {}
    t_first = None
    deadline = time.monotonic() + timeout
    last = 0.0
    while time.monotonic() < deadline:
        m = scrape(mport)
        m = {k: v - b.get(k, 0.0) for k, v in m.items()}
        ok = m["tops_readings_total{result=ok}"]
        over = m.get("tops_messages_total{result=overload}", 0.0)  # QoS 0 past [input] max_queue: counted, not kept
        n = ok + over
        now = time.monotonic()
        if n > 0 and t_first is None:
            t_first = now - 0.1  # upper bound of when the first one arrived (polling every 0.1 s)
        if n >= total and m["tops_releases_total{sink=mqtt}"] >= releases - over:
            return now - (t_first or now), m
        last = n
        time.sleep(0.1)
    msg = f"only {last} of {total} readings arrived"
    raise TimeoutError(msg)


def pub_lines(port: int, topic: str, lines: list[str], qos: int) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-t", topic, "-q", str(qos), "-l"],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    return p


def bench_single(tmp: Path, port: int, messages: int, streams: int, qos: int, out_qos: int = 0) -> None:
    proc, mport = start_daemon(tmp, port, output={"qos": out_qos})
    try:
        single_readings(port, mport, messages, streams, qos, out_qos)
    finally:
        proc.terminate()
        proc.wait(60)


def single_readings(port: int, mport: int, messages: int, streams: int, qos: int, out_qos: int, prefix: str = "s",
                    note: str = "") -> None:
    """``messages`` single-reading messages over ``streams`` new streams, one ``mosquitto_pub -l`` each."""
    before = scrape(mport)
    per = messages // streams
    payload = "".join(f"{i % 700}\n" for i in range(per)).encode()
    pubs = [pub_lines(port, f"meters/{prefix}{k}/reading", [], qos) for k in range(streams)]
    for p in pubs:
        assert p.stdin is not None
        p.stdin.write(payload)
    for p in pubs:
        assert p.stdin is not None
        p.stdin.close()
    rel = per * streams - streams * TEMPLATE["holdout"]
    secs, m = measure(mport, per * streams, rel, before=before)
    for p in pubs:
        p.wait()
    ok = m["tops_readings_total{result=ok}"]
    over = m.get("tops_messages_total{result=overload}", 0.0)
    print(f"single readings: {per * streams} messages over {streams} streams (input QoS {qos}, output QoS "
          f"{out_qos}){note}: {ok / secs:,.0f} msg/s processed end to end, {over:,.0f} QoS 0 messages counted as "
          f"overload ({rel:,} releases expected)")


def bench_held(tmp: Path, port: int, messages: int, held: int) -> None:
    """Single readings (QoS 1 in, QoS 0 out) while the daemon holds ``held`` other streams in their holdout
    (one reading each, sent first with paho), against the same daemon before it holds them."""
    import paho.mqtt.client as mqtt

    proc, mport = start_daemon(tmp, port, streams={"max_streams": held + 100})
    try:
        single_readings(port, mport, messages, 8, 1, 0, prefix="a", note=" holding no other stream")
        base = rss_kib(proc.pid)
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        client.max_queued_messages_set(0)
        client.max_inflight_messages_set(0)  # no window: each acknowledgement waits for the daemon's fsync
        client.connect("127.0.0.1", port)
        client.loop_start()
        t0 = time.monotonic()
        before = scrape(mport)["tops_readings_total{result=ok}"]
        for lo in range(0, held, 5000):  # in chunks, each confirmed by the broker (paho dropped some unthrottled)
            infos = [client.publish(f"meters/h{k}/reading", str(k % 500), qos=1)
                     for k in range(lo, min(held, lo + 5000))]
            infos[-1].wait_for_publish(120)
            if not all(i.rc == mqtt.MQTT_ERR_SUCCESS and i.is_published() for i in infos):
                raise SystemExit("the publisher lost messages")
        wait_for(lambda: scrape(mport)["tops_readings_total{result=ok}"] - before >= held, 1800,
                 interval=1.0, what="every held stream")
        secs = time.monotonic() - t0
        client.loop_stop()
        client.disconnect()
        m = scrape(mport)
        print(f"{int(m['tops_streams_active']):,} streams held ({held:,} new ones made in {secs:.0f} s, "
              f"{held / secs:,.0f} msg/s incl. stream creation; RSS +{(rss_kib(proc.pid) - base) / 1024:.0f} MiB)")
        done = scrape(mport)["tops_checkpoint_seconds_count"]  # the new streams' checkpoints finish first
        wait_for(lambda: scrape(mport)["tops_checkpoint_seconds_count"] >= done + 2, 1800, interval=1.0,
                 what="two checkpoints after the new streams")
        single_readings(port, mport, messages, 8, 1, 0, prefix="b", note=f" holding {held:,} other streams")
    finally:
        proc.terminate()
        proc.wait(120)


def bench_batches(tmp: Path, port: int, readings: int, batch: int, streams: int, mode: str) -> None:
    ticks = {"mode": "period", "period": 1.0} if mode == "period" else {"mode": "reading"}
    proc, mport = start_daemon(tmp, port, ticks=ticks, output={"batch": True})
    try:
        per = readings // streams // batch
        line = json.dumps([i % 700 for i in range(batch)], separators=(",", ":"))
        pubs = [pub_lines(port, f"meters/b{k}/reading", [], 1) for k in range(streams)]
        data = ((line + "\n") * per).encode()
        for p in pubs:
            assert p.stdin is not None
            p.stdin.write(data)
            p.stdin.close()
        total = per * batch * streams
        secs, _ = measure(mport, total, total - streams * TEMPLATE["holdout"] if mode == "reading" else 0)
        for p in pubs:
            p.wait()
        what = "one tick per reading, releases published as one array per stream and step" if mode == "reading" \
            else "1 s period ticks (sum)"
        print(f"batched payloads ({batch} readings each, {streams} streams, {what}): "
              f"{total / secs:,.0f} readings/s")
    finally:
        proc.terminate()
        proc.wait(60)


def bench_streams(tmp: Path, port: int, n_streams: int) -> None:
    import paho.mqtt.client as mqtt

    proc, mport = start_daemon(tmp, port)
    try:
        base = rss_kib(proc.pid)
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        client.max_queued_messages_set(0)
        client.connect("127.0.0.1", port)
        client.loop_start()
        rounds = 3
        t0 = time.monotonic()
        for r in range(rounds):
            for k in range(n_streams):
                client.publish(f"meters/m{k}/reading", str((k + r) % 500), qos=1)
        wait_for(lambda: scrape(mport)["tops_readings_total{result=ok}"] >= rounds * n_streams, 120,
                 what="all streams")
        secs = time.monotonic() - t0
        m = scrape(mport)
        grown = rss_kib(proc.pid) - base
        print(f"{int(m['tops_streams_active']):,} concurrent streams ({rounds} readings each, "
              f"{rounds * n_streams / secs:,.0f} msg/s incl. stream creation), all in holdout: daemon RSS "
              f"{base / 1024:.0f} MiB before, +{grown / 1024:.1f} MiB = {grown / n_streams:.1f} KiB per stream")
        batch = json.dumps([(7 * i) % 500 for i in range(TEMPLATE["holdout"])])
        for k in range(n_streams):  # one batch each: every stream past its holdout, releasing
            client.publish(f"meters/m{k}/reading", batch, qos=1)
        want = rounds * n_streams + TEMPLATE["holdout"] * n_streams
        wait_for(lambda: scrape(mport)["tops_readings_total{result=ok}"] >= want, 300, what="all streams releasing")
        m = scrape(mport)
        grown = rss_kib(proc.pid) - base
        client.loop_stop()
        client.disconnect()
        print(f"{int(m['tops_streams_active']):,} streams releasing ({int(m['tops_streams_holdout'])} in holdout): "
              f"+{grown / 1024:.1f} MiB = {grown / n_streams:.1f} KiB per stream")
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--readings", type=int, default=5_000_000)
    ap.add_argument("--streams", type=int, default=10_000)
    ap.add_argument("--only", choices=("single", "batch", "streams", "held"))
    ap.add_argument("--held", type=int, default=1_000_000, help="streams held by --only held")
    ap.add_argument("--no-state", action="store_true", help="run the daemon without durable state")
    ap.add_argument("--broker-inflight", type=int, default=0, help="Mosquitto max_inflight_messages (0: no limit)")
    args = ap.parse_args()
    global STATE, BROKER_INFLIGHT
    STATE = not args.no_state
    BROKER_INFLIGHT = args.broker_inflight
    if not shutil.which("mosquitto_pub"):
        print("mosquitto-clients is not installed", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="tops-bench-"))
    broker = start_broker(tmp)
    print(f"machine: {os.cpu_count()} cores; broker mosquitto on 127.0.0.1:{broker.port}; one daemon process; "
          f"durable state {'on' if STATE else 'off'}; broker max_inflight_messages {BROKER_INFLIGHT}")
    try:
        if args.only in (None, "single"):
            bench_single(tmp, broker.port, args.messages, 8, qos=0)
            bench_single(tmp, broker.port, args.messages, 8, qos=1)
            bench_single(tmp, broker.port, args.messages, 8, qos=1, out_qos=1)
        if args.only in (None, "batch"):
            bench_batches(tmp, broker.port, args.readings, 1000, 4, "reading")
            bench_batches(tmp, broker.port, args.readings, 1000, 4, "period")
        if args.only in (None, "streams"):
            bench_streams(tmp, broker.port, args.streams)
        if args.only == "held":  # minutes: a million streams made first
            bench_held(tmp, broker.port, args.messages, args.held)
    finally:
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Floods and backpressure through a real Mosquitto: bounded memory, ticks keep flowing, what cannot be taken at QoS 0
is counted, no release is dropped while connected or while the broker is down, the readings a broker dropped come
once, and a hung broker is given up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import (
    ROOT,
    Broker,
    DaemonProcess,
    Subscriber,
    TricklingRelay,
    daemon_config,
    free_port,
    publish,
    publish_file,
    running_broker,
    wait_for,
    wait_while_progressing,
)

# floods load the machine and these tests measure progress under them: one at a time (see pyproject.toml)
pytestmark = [pytest.mark.network, pytest.mark.slow, pytest.mark.xdist_group("heavy")]


@pytest.fixture
def mosquitto_unbounded(tmp_path: Path):
    """A broker that never drops QoS 0 messages for a connected client (`max_queued_messages 0`): what the daemon
    does not count as processed or overload cannot have been lost in the broker."""
    yield from running_broker(tmp_path, "allow_anonymous true\nmax_queued_messages 0\n")


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


def wait_until_processed_or_counted(daemon: DaemonProcess, messages: int) -> None:
    """Wait while the daemon works through a flood the broker holds, until ``messages`` are processed or counted as
    `overload`; fails if that count stops moving (:func:`tests.support.wait_while_progressing`)."""

    def done() -> float:
        m = daemon.metrics()
        return m["tops_messages_total{result=ok}"] + m.get("tops_messages_total{result=overload}", 0.0)

    wait_while_progressing(done, messages, what="flood messages processed or counted")


def test_qos0_flood_bounded_memory_ticks_flow_and_overload_counted(mosquitto_unbounded, tmp_path: Path) -> None:
    """An 8 s QoS 0 flood at the publisher's maximum rate against a daemon with a small incoming queue: period
    releases keep coming during the flood, the connection survives (keepalive 10 s; the broker's answers come
    seconds late behind the flood it holds, past `[mqtt] timeout = 2`, and late is not lost: no reconnect, which
    would throw the broker's backlog away), memory stays bounded, and every message sent is either processed or
    counted as `overload`."""
    broker = mosquitto_unbounded
    mport = free_port()
    cfg = daemon_config(tmp_path, broker.port, mport, mqtt={"keepalive": 10, "timeout": 2.0},
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
        seconds = 8.0
        flood = run_flood(broker.port, seconds, [f"meters/f{i}/reading" for i in range(4)])
        t0 = time.time()
        out, _ = flood.communicate(timeout=120)
        t1 = time.time()
        arrived = sub.payloads()  # releases that reached the consumer by the end of the flood
        sent = json.loads(out)["sent"]
        # the broker holds what the daemon has not read yet: draining it takes as long as the machine is busy
        wait_until_processed_or_counted(daemon, sent + 1)
        m = daemon.metrics()
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


def test_a_broker_short_of_cpu_sending_its_backlog_in_bursts_is_not_given_up(mosquitto_unbounded,
                                                                            tmp_path: Path) -> None:
    """A broker short of CPU: after a QoS 0 flood it holds a backlog for the daemon and sends it in small bursts
    (4 KiB every 50 ms, through a relay), so the daemon finds its socket drained between them. The answers to the
    daemon's releases and probes come behind that backlog, seconds past `[mqtt] timeout = 2`. The broker keeps
    sending, so it is not given up: no reconnect (which would throw the backlog away), and once it sends at full
    speed again every message sent is processed or counted as `overload`."""
    broker = mosquitto_unbounded
    relay = TricklingRelay(broker.port)
    mport = free_port()
    cfg = daemon_config(tmp_path, relay.port, mport, mqtt={"keepalive": 60, "timeout": 2.0},
                        input={"qos": 0, "max_queue": 2000},
                        ticks={"mode": "period", "period": 0.5}, streams={"template": {"theta": 50.0}},
                        output={"status_topic": ""})
    daemon = DaemonProcess(cfg, mport, tmp_path)
    try:
        daemon.wait_connected()
        publish(broker.port, "meters/tick/reading", ["1"], qos=0)  # a stream releasing every period: in flight
        wait_for(lambda: daemon.metrics()["tops_releases_total{sink=mqtt}"] >= 1, 20, what="a first release")
        flood = run_flood(broker.port, 3.0, [f"meters/f{i}/reading" for i in range(4)])
        out, _ = flood.communicate(timeout=120)
        sent = json.loads(out)["sent"]
        relay.trickle.set()
        deadline = time.monotonic() + 8.0  # eight seconds of bursts, unless the broker is given up before
        while time.monotonic() < deadline and daemon.metrics()["tops_mqtt_ack_timeouts_total"] == 0:
            time.sleep(0.5)
        relay.trickle.clear()
        m = daemon.metrics()
        assert m["tops_mqtt_ack_timeouts_total"] == 0 and m["tops_mqtt_reconnects_total"] == 0
        wait_until_processed_or_counted(daemon, sent + 1)
        m = daemon.metrics()
        assert m["tops_mqtt_reconnects_total"] == 0 and m["tops_mqtt_connected"] == 1
        assert m["tops_messages_total{result=ok}"] + m["tops_messages_total{result=overload}"] == sent + 1
        assert daemon.stop() == 0
    finally:
        relay.trickle.clear()
        daemon.kill()
        relay.close()
    assert "Traceback" not in daemon.stderr()


def test_one_release_per_tick_with_a_small_publish_queue_while_connected(mosquitto, tmp_path: Path) -> None:
    """One legal batch of 20,000 readings with `publish_queue = 100`: every tick is released exactly once at the
    consumer (a publish queue that dropped would lose all but the last 100, the broker up)."""
    n = 20_000
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, output={"publish_queue": 100, "status_topic": ""},
                        streams={"template": {"theta": 50.0}})
    daemon = DaemonProcess(cfg, mport, tmp_path)
    sub = Subscriber(mosquitto.port, "dp/+")
    try:
        daemon.wait_connected()
        sub.wait_ready("dp/probe")
        batch = tmp_path / "batch.json"
        batch.write_text("[" + ",".join(str(i % 90) for i in range(n)) + "]")
        assert publish_file(mosquitto.port, "meters/big/reading", batch).returncode == 0
        wait_while_progressing(lambda: daemon.metrics()["tops_releases_total{sink=mqtt}"], n,
                               what="releases confirmed")
        wait_for(lambda: len(sub.payloads()) >= n, 60, what="every release at the consumer")
        ticks = sorted(p["tick"] for p in sub.payloads() if p.get("stream") == "big")
        assert ticks == list(range(n))
        assert daemon.metrics()["tops_releases_dropped_total"] == 0
        assert daemon.stop() == 0
    finally:
        sub.close()
        daemon.kill()


class SessionSubscriber(Subscriber):
    """``mosquitto_sub`` with a persistent session (`-c -i`): what is published while it is away is queued."""

    def __init__(self, port: int, topic: str, client_id: str, lines: list | None = None) -> None:
        import threading

        self.port, self.user = port, None
        self.lines = lines if lines is not None else []
        cmd = ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-t", topic, "-q", "1", "-v", "-c",
               "-i", client_id]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()


def test_releases_made_while_the_broker_is_down_spill_to_disk_and_all_arrive(mosquitto_persistent,
                                                                              tmp_path: Path) -> None:
    """Readings keep coming on stdin while the broker is down; the releases that do not fit in
    `publish_queue = 50` go to the outbox on disk (durable state) and every one arrives after the restart, once per
    tick (a queue that dropped would keep only the last 50)."""
    broker = mosquitto_persistent
    mport = free_port()
    cfg = daemon_config(tmp_path, broker.port, mport, input={"source": "stdin"},
                        output={"publish_queue": 50, "status_topic": ""}, streams={"template": {"theta": 50.0}})
    proc = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config", str(cfg)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=(tmp_path / "daemon.log").open("wb"))
    metrics = DaemonProcess.metrics.__get__(SimpleNamespace(metrics_port=mport))
    sub = SessionSubscriber(broker.port, "dp/+", "consumer-spill")
    assert proc.stdin is not None
    try:
        wait_for(lambda: metrics()["tops_mqtt_connected"] == 1.0, 20, what="daemon connected")
        sub.wait_ready("dp/probe")
        proc.stdin.write(b"".join(f"s,{i % 90}\n".encode() for i in range(200)))
        proc.stdin.flush()
        wait_for(lambda: len(sub.payloads()) >= 200, 30, what="first releases")
        sub.close()
        broker.stop()
        wait_for(lambda: metrics()["tops_mqtt_connected"] == 0, 10, what="daemon disconnected")
        proc.stdin.write(b"".join(f"s,{i % 90}\n".encode() for i in range(200, 3000)))
        proc.stdin.flush()
        wait_for(lambda: metrics()["tops_publish_queue_depth"] >= 2800, 30, what="releases kept")
        spilled = sum(p.stat().st_size for p in (tmp_path / "state").glob("outbox-*.spill"))
        assert spilled > 0  # past the 50 in memory: on disk
        broker.start()
        sub = SessionSubscriber(broker.port, "dp/+", "consumer-spill", lines=sub.lines)
        wait_for(lambda: len({p["tick"] for p in sub.payloads() if p.get("stream") == "s"}) >= 3000, 60,
                 what="every release after the restart")
        ticks = {p["tick"] for p in sub.payloads() if p.get("stream") == "s"}
        assert ticks == set(range(3000))
        assert metrics()["tops_releases_dropped_total"] == 0
        proc.stdin.close()
        assert proc.wait(30) == 0
    finally:
        sub.close()
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in (tmp_path / "daemon.log").read_text()


BROKER_DROPS = "Outgoing messages are being dropped for client"  # Mosquitto's notice, once per client


def flood_until_the_broker_drops(port: int, broker_log: Path, topic: str, payload: str, meanwhile: Callable[[], object],
                                 user: tuple[str, Path] | None = None) -> None:
    """``tests/flood.py``: QoS 0 publishes of ``payload`` on ``topic`` as fast as the socket takes them (``user``: name
    and the file holding its password), until the broker says it drops what it owes the daemon; then ``meanwhile()``
    runs while the flood goes on, and the flood stops. Called again, it waits for the broker to say it anew. The
    payloads are a few hundred bytes, so that the sockets' buffers hold fewer of them and the broker's queue fills
    soon."""
    cmd = [sys.executable, "-m", "tests.flood", "--port", str(port), "--seconds", "120", "--topics", topic,
           "--payload", payload]
    if user:
        cmd += ["--username", user[0], "--password-file", str(user[1])]
    notices = broker_log.read_text().count(BROKER_DROPS)  # Mosquitto says it again once its queue had room
    flood = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: broker_log.read_text().count(BROKER_DROPS) > notices, 100,
                 what="the broker dropping what it owes")
        meanwhile()
    finally:
        flood.terminate()
        flood.wait(10)


def shipped_broker_daemon(broker: Broker, tmp_path: Path, *, input_qos: int,
                          timeout: float = 10.0) -> tuple[DaemonProcess, Path]:
    """A daemon on the shipped broker (``mosquitto_acl``) as the deploy example runs it (account ``svc/tops``,
    persistent session, QoS 1 releases, durable state), with small queues (the same stall, less to process and publish
    afterwards) and readings at ``input_qos``; and the file holding the password of the flooding device ``meter-a``."""
    from tests.support import ACL_USERS

    pw = tmp_path / "mqtt-password"
    pw.write_text(ACL_USERS["svc/tops"] + "\n")
    device_pw = tmp_path / "device-password"
    device_pw.write_text(ACL_USERS["meter-a"] + "\n")
    mport = free_port()
    cfg = daemon_config(tmp_path, broker.port, mport, mqtt={"username": "svc/tops", "password_file": str(pw),
                                                            "client_id": "tops-flood", "keepalive": 30,
                                                            "timeout": timeout},
                        input={"qos": input_qos, "max_queue": 2000}, output={"status_topic": "", "publish_queue": 5000},
                        streams={"template": {"holdout": 50}})
    return DaemonProcess(cfg, mport, tmp_path), device_pw


def test_a_qos0_flood_through_the_shipped_broker_never_stalls_the_releases(mosquitto_acl, tmp_path: Path) -> None:
    """Debian's Mosquitto with deploy/mosquitto.conf as shipped (`max_queued_messages 100000`,
    `max_inflight_messages 1000`) and the deploy example's session (persistent, QoS 1 in and out, durable state),
    one release per reading. A device floods its stream at QoS 0 as fast as it can write: the broker's queue for the
    daemon fills, and from then on Mosquitto drops every packet it owes the daemon, the QoS 1 readings of a second
    device sent meanwhile included, and now and then the PUBACKs of its releases. After each of two floods every tick
    the daemon made is confirmed by the broker and every reading of the second device is released: the daemon saw the
    flood and reconnected once it was over, so the broker resent what it dropped (otherwise those readings never
    arrive, and when a PUBACK was dropped too the publish window stays full until the watchdog gives the connection
    up)."""
    from tests.support import ACL_USERS

    broker = mosquitto_acl
    broker_log = broker.conf.with_suffix(".log")
    daemon, device_pw = shipped_broker_daemon(broker, tmp_path, input_qos=1)
    consumer = ("svc/consumer", ACL_USERS["svc/consumer"])
    sub = Subscriber(broker.port, "dp/meter-b", user=consumer)
    try:
        daemon.wait_connected()
        sub.wait_ready("dp/meter-b", user=("svc/tops", ACL_USERS["svc/tops"]))
        meter_b = ("meter-b", ACL_USERS["meter-b"])
        for rounds in (1, 2):
            readings = [f'{{"value": {i % 90}, "seq": {i}}}' for i in range(100 * (rounds - 1), 100 * rounds)]
            reconnects = daemon.metrics()["tops_mqtt_reconnects_total"]
            flood_until_the_broker_drops(broker.port, broker_log, "meters/meter-a/reading", " " * 200 + "5",
                                         lambda readings=readings: publish(broker.port, "meters/meter-b/reading",
                                                                           readings, user=meter_b),
                                         user=("meter-a", device_pw))

            def all_confirmed(rounds: int = rounds) -> dict[str, float] | None:
                m = daemon.metrics()
                made = m["tops_ticks_total"] - 2 * 50  # the holdout ticks of the two streams release nothing
                done = m["tops_releases_total{sink=mqtt}"] >= made and m["tops_publish_queue_depth"] == 0
                return m if done and len([p for p in sub.payloads() if "tick" in p]) >= 100 * rounds - 50 else None

            m = wait_for(all_confirmed, 180, interval=0.5, what="every tick confirmed, the second device released")
            print(f"flood {rounds}: processed {m['tops_messages_total{result=ok}']:.0f}, overload "
                  f"{m['tops_messages_total{result=overload}']:.0f}, answers awaited in vain "
                  f"{m['tops_mqtt_ack_timeouts_total']:.0f}, reconnects after the flood "
                  f"{m['tops_mqtt_resyncs_total']:.0f}, reconnects {m['tops_mqtt_reconnects_total']:.0f}")
            assert sorted(p["tick"] for p in sub.payloads() if "tick" in p) == list(range(50, 100 * rounds))
            # a reconnect after the flood, or after a dropped acknowledgement during it (the next one, if the broker
            # drops again, comes once the flood is over)
            wait_for(lambda reconnects=reconnects: daemon.metrics()["tops_mqtt_reconnects_total"] > reconnects, 60,
                     what="a reconnect")
        m = daemon.metrics()
        assert daemon.stop() == 0
    finally:
        sub.close()
        daemon.kill()
    log = daemon.stderr()
    assert "Traceback" not in log
    given_up = log.count("the broker has answered none of") + log.count("it dropped the acknowledgement")
    assert given_up == m["tops_mqtt_ack_timeouts_total"]  # one line each
    assert log.count("reconnecting, so that it resends") == m["tops_mqtt_resyncs_total"]


def test_a_qos0_flood_into_a_qos0_subscription_through_the_shipped_broker_leaves_no_release_unconfirmed(
        mosquitto_acl, tmp_path: Path) -> None:
    """The shipped broker, readings at QoS 0 (nothing the broker could resend, so no reconnect after the flood), one
    QoS 1 release per reading: the flood makes Mosquitto drop PUBACKs of releases in flight, while the probes the
    daemon sends after the flood are answered. A release published before an answered probe and unconfirmed
    `[mqtt] timeout` seconds later lost its PUBACK: the daemon reconnects and every tick it made is confirmed
    (counting answered probes as progress, the publish window stays full for good whenever a PUBACK was dropped)."""
    broker = mosquitto_acl
    broker_log = broker.conf.with_suffix(".log")
    daemon, device_pw = shipped_broker_daemon(broker, tmp_path, input_qos=0, timeout=3.0)
    try:
        daemon.wait_connected()
        flood_until_the_broker_drops(broker.port, broker_log, "meters/meter-a/reading", " " * 200 + "5",
                                     lambda: time.sleep(0.5), user=("meter-a", device_pw))

        def all_confirmed() -> dict[str, float] | None:
            m = daemon.metrics()
            done = m["tops_releases_total{sink=mqtt}"] >= m["tops_ticks_total"] - 50
            return m if done and m["tops_publish_queue_depth"] == 0 else None

        m = wait_for(all_confirmed, 120, interval=0.5, what="every tick confirmed")
        print(f"processed {m['tops_messages_total{result=ok}']:.0f}, acknowledgements given up "
              f"{m['tops_mqtt_ack_timeouts_total']:.0f}")
        assert m["tops_mqtt_resyncs_total"] == 0
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert "Traceback" not in daemon.stderr()


@pytest.fixture
def mosquitto_shipped_queue(tmp_path: Path):
    """A broker whose queue for a connected client is the shipped one (deploy/mosquitto.conf's
    `max_queued_messages`): a burst it holds while the daemon is busy is delivered, not dropped."""
    conf = (Path(__file__).resolve().parents[2] / "deploy" / "mosquitto.conf").read_text()
    queue = next(line.split()[1] for line in conf.splitlines() if line.startswith("max_queued_messages "))
    yield from running_broker(tmp_path, f"allow_anonymous true\nmax_queued_messages {queue}\n")


def test_bursts_of_qos0_readings_the_daemon_keeps_up_with_cause_no_reconnect(mosquitto_shipped_queue,
                                                                             tmp_path: Path) -> None:
    """Ordinary traffic on the default QoS 1 subscription, persistent session, the shipped broker queue: devices
    publishing at QoS 0 in bursts (2,000 readings each, with pauses between) that the daemon reads as they come. A
    few readings waiting on the socket at a look are not a flood: no reconnect after any burst, and every reading is
    processed. (Mosquitto's default queue of 1,000 packets drops part of a burst whenever the machine is busy enough
    that the daemon reads 1,000 behind the publisher: readings lost in the broker, not in the daemon.)"""
    mosquitto = mosquitto_shipped_queue
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, output={"status_topic": ""},
                        streams={"template": {"theta": 50.0}})
    daemon = DaemonProcess(cfg, mport, tmp_path)
    try:
        daemon.wait_connected()
        for burst in range(10):
            publish(mosquitto.port, f"meters/m{burst % 3}/reading", [str(i % 90) for i in range(2000)], qos=0)
            time.sleep(0.5)  # a pause between bursts: the looks at which the broker sent nothing
        m = wait_for(lambda: (m := daemon.metrics())["tops_ticks_total"] >= 20_000 and m, 60,
                     what="every reading processed")
        assert m["tops_ticks_total"] == 20_000
        assert m["tops_mqtt_resyncs_total"] == 0 and m["tops_mqtt_reconnects_total"] == 0
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert "Traceback" not in daemon.stderr()


@pytest.fixture
def mosquitto_small_queue(tmp_path: Path):
    """A broker whose queue for a client holds 1,000 packets (`max_queued_messages 1000`): full within
    milliseconds of a flood, after which it drops whatever it owes that client, as the shipped broker does at
    100,000."""
    yield from running_broker(tmp_path, "allow_anonymous true\nmax_queued_messages 1000\nmax_inflight_messages 1000\n")


def test_readings_the_broker_dropped_during_a_flood_come_once_nothing_is_in_flight(mosquitto_small_queue,
                                                                                 tmp_path: Path) -> None:
    """A flood of garbage (every message invalid: nothing is released, so no PUBACK is ever awaited) fills the
    broker's queue for the daemon; a device's 100 QoS 1 readings sent meanwhile are dropped by the broker and
    counted by it as in flight to the daemon, which MQTT sends again only on a new connection. The daemon saw QoS 0
    messages come faster than it read them, and reconnects once the flood is over: every reading is processed and
    released (without that reconnect, none of them ever is)."""
    broker = mosquitto_small_queue
    broker_log = broker.conf.with_suffix(".log")
    mport = free_port()
    cfg = daemon_config(tmp_path, broker.port, mport, output={"status_topic": ""}, mqtt={"timeout": 3.0},
                        input={"max_queue": 500})  # most of the flood counted `overload`: read, not decoded
    daemon = DaemonProcess(cfg, mport, tmp_path)
    sub = Subscriber(broker.port, "dp/b")
    try:
        daemon.wait_connected()
        sub.wait_ready("dp/b")
        readings = [f'{{"value": {i % 90}, "seq": {i}}}' for i in range(100)]
        flood_until_the_broker_drops(broker.port, broker_log, "meters/garbage/reading", "x" * 200,
                                     lambda: publish(broker.port, "meters/b/reading", readings))
        m = wait_for(lambda: (m := daemon.metrics())["tops_ticks_total"] >= 100 and m, 120, interval=0.5,
                     what="every reading of the device processed")
        wait_for(lambda: len([p for p in sub.payloads() if "tick" in p]) >= 50, 60, what="its releases")
        assert m["tops_ticks_total"] == 100
        assert sorted(p["tick"] for p in sub.payloads() if "tick" in p) == list(range(50, 100))
        wait_for(lambda: daemon.metrics()["tops_mqtt_resyncs_total"] >= 1, 30, what="the reconnect after the flood")
        assert daemon.stop() == 0
    finally:
        sub.close()
        daemon.kill()
    assert "Traceback" not in daemon.stderr()


def test_a_hung_broker_is_given_up_and_every_release_goes_out_once_it_answers(mosquitto, tmp_path: Path) -> None:
    """The broker hangs (SIGSTOP: its socket stays open, it reads and answers nothing) while the daemon publishes
    the releases of readings arriving on stdin. Nothing comes back, so the daemon's socket is drained and the
    releases in flight wait for PUBACKs that never come: after `[mqtt] timeout` seconds the daemon gives the
    connection up, counts it, and keeps trying to connect; once the broker runs again every release arrives (the MQTT
    keepalive alone would notice the hang only 1.5 to 2 keepalive periods later)."""
    import signal

    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, input={"source": "stdin"}, output={"status_topic": ""},
                        mqtt={"timeout": 3.0, "keepalive": 60})
    proc = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config", str(cfg)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=(tmp_path / "daemon.log").open("wb"))
    metrics = DaemonProcess.metrics.__get__(SimpleNamespace(metrics_port=mport))
    sub = Subscriber(mosquitto.port, "dp/+")
    assert proc.stdin is not None and mosquitto.proc is not None
    broker_pid = mosquitto.proc.pid
    try:
        wait_for(lambda: metrics()["tops_mqtt_connected"] == 1.0, 20, what="daemon connected")
        sub.wait_ready("dp/probe")
        os.kill(broker_pid, signal.SIGSTOP)
        proc.stdin.write(b"".join(f"h,{i % 90}\n".encode() for i in range(300)))
        proc.stdin.flush()
        wait_for(lambda: metrics()["tops_mqtt_ack_timeouts_total"] >= 1, 40, what="the hang noticed")
        os.kill(broker_pid, signal.SIGCONT)
        wait_for(lambda: len({p["tick"] for p in sub.payloads() if p.get("stream") == "h"}) >= 250, 60,
                 what="every release after the broker came back")
        assert {p["tick"] for p in sub.payloads() if p.get("stream") == "h"} == set(range(50, 300))
        proc.stdin.close()
        assert proc.wait(30) == 0
    finally:
        os.kill(broker_pid, signal.SIGCONT)
        sub.close()
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "daemon.log").read_text()
    assert "Traceback" not in log
    assert "has answered none of 250 messages in flight" in log

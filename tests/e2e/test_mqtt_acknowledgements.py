"""When the daemon acknowledges a QoS 1 reading, seen from the broker: with durable state only once the journal on
disk holds it, and only on the connection it came on (an earlier connection's readings are the broker's to
redeliver)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from stream.core.metrics import Metrics
from stream.core.sinks import PublishQueue
from stream.daemon.mqtt_source import MqttSource
from stream.daemon.sources import MqttLink, TopicRouter
from tests.support import DaemonProcess, daemon_config, free_port, publish, running_broker, wait_for

pytestmark = [pytest.mark.network, pytest.mark.slow]


@pytest.fixture
def talkative_broker(tmp_path: Path):
    """A broker that logs every packet it receives (its PUBACKs among them)."""
    yield from running_broker(tmp_path, "allow_anonymous true\nlog_type all\nlog_dest stderr\n")


def pubacks_from(broker, client_id: str) -> list[int]:
    """The packet ids of the PUBACKs the broker received from ``client_id``, in order."""
    text = broker.conf.with_suffix(".log").read_text(errors="replace")
    return [int(m) for m in re.findall(rf"Received PUBACK from {re.escape(client_id)} \(Mid: (\d+)", text)]


def journaled_readings(data_dir: Path, stream: str) -> int:
    """Readings of ``stream`` in the journal files on disk (a line per message: its values)."""
    n = 0
    for f in (data_dir / "journal").iterdir():
        for line in f.read_bytes().splitlines():
            if f'"s":"{stream}"'.encode() in line:
                n += 1
    return n


def test_a_qos1_reading_is_acknowledged_only_once_the_journal_on_disk_holds_it(talkative_broker,
                                                                              tmp_path: Path) -> None:
    """The journal syncs 2 s after a reading arrives: a PUBACK the broker receives before that would leave a reading
    acknowledged that a kill -9 loses. At the moment the broker logs each PUBACK, the journal on disk already holds
    the reading."""
    mport = free_port()
    cfg = daemon_config(tmp_path, talkative_broker.port, mport, mqtt={"client_id": "tops-ack-order"},
                        state={"fsync_interval": 2000.0, "fsync_batch": 10_000})
    daemon = DaemonProcess(cfg, mport, tmp_path)
    try:
        daemon.wait_connected()
        for k, value in enumerate(["5", "6", "7"], 1):
            publish(talkative_broker.port, "meters/x/reading", [value])
            wait_for(lambda k=k: len(pubacks_from(talkative_broker, "tops-ack-order")) >= k, 20, interval=0.005,
                     what="the daemon's PUBACK")
            assert journaled_readings(tmp_path / "state", "x") >= k  # on disk before the PUBACK left
        assert daemon.stop() == 0
    finally:
        daemon.kill()


def test_an_earlier_connections_readings_are_never_acknowledged_on_the_next_one(talkative_broker) -> None:
    """A chunk taken on one connection and acknowledged after the link reconnected sends no PUBACK (its packet ids
    may name other messages on the new connection); the broker redelivers its readings on the new connection, and
    those are acknowledged there."""
    settings = SimpleNamespace(host="127.0.0.1", port=talkative_broker.port, username="", password="",
                               client_id="tops-two-connections", keepalive=30, timeout=10.0, tls=False,
                               tls_insecure=False, protocol="3.1.1", session="persistent", session_expiry=3600,
                               reconnect_min=0.05, reconnect_max=0.2)
    pubq = PublishQueue(100)

    async def go() -> None:
        link = MqttLink(settings, topics=["meters/+/reading"], in_qos=1, out_qos=1, pubq=pubq, metrics=Metrics(),
                        max_batch=100, inflight=10)
        source = MqttSource(link, TopicRouter(["meters/+/reading"]))
        task = asyncio.create_task(link.run())
        await asyncio.wait_for(link.connected.wait(), 20)
        chunks = source.chunks()
        await asyncio.to_thread(publish, talkative_broker.port, "meters/a/reading", ["1", "2", "3"])
        first = await asyncio.wait_for(anext(chunks), 20)
        taken = list(first.payloads)
        while len(taken) < 3:
            taken += (await asyncio.wait_for(anext(chunks), 20)).payloads
        old = first.ack
        assert old.connection == 1 and old.mids
        # the broker drops the connection (a client with the same id connects): the link reconnects
        await asyncio.to_thread(_connect_and_leave, talkative_broker.port, "tops-two-connections")
        await asyncio.wait_for(_until(lambda: link.connection >= 2 and link.connected.is_set()), 20)
        source.acknowledge([old])
        redelivered = await asyncio.wait_for(anext(chunks), 20)
        assert redelivered.ack.connection == link.connection
        await asyncio.sleep(0)  # nothing was queued for the old chunk: the log has no PUBACK yet
        assert pubacks_from(talkative_broker, "tops-two-connections") == []
        source.acknowledge([redelivered.ack])
        await asyncio.wait_for(_until(lambda: pubacks_from(talkative_broker, "tops-two-connections")), 20)
        assert sorted(pubacks_from(talkative_broker, "tops-two-connections")) == sorted(redelivered.ack.mids)
        source.stop_intake()
        link.close()
        await asyncio.wait_for(task, 20)

    asyncio.run(go())


async def _until(predicate) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


def _connect_and_leave(port: int, client_id: str) -> None:
    """Connect with ``client_id`` (persistent session, nothing acknowledged) and leave: the broker drops the client
    that had the session and keeps the session."""
    import paho.mqtt.client as mqtt

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False)
    c.manual_ack_set(True)
    c.connect("127.0.0.1", port)
    c.loop_start()
    wait_for(c.is_connected, 10, what="the second client connected")
    c.disconnect()
    c.loop_stop()

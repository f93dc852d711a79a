"""The MQTT input's QoS 1 readings seen from the broker: acknowledged with durable state only once the journal on disk
holds them, and only on the connection they came on (an earlier connection's readings are the broker's to
redeliver); read no further than ``[input] max_queue`` ahead of the engine that takes them."""

from __future__ import annotations

import asyncio
import io
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from stream.core.config import build_config
from stream.core.metrics import Metrics
from stream.core.sinks import PublishQueue
from stream.daemon.mqtt_source import MqttSource
from stream.daemon.service import Daemon
from stream.daemon.sources import READ_BUDGET, MqttLink, TopicRouter
from tests.support import (
    TEMPLATE,
    DaemonProcess,
    FakeOperator,
    daemon_config,
    free_port,
    publish,
    running_broker,
    wait_for,
)

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


class SlowOperator(FakeOperator):
    """A stand-in operator that takes 0.2 ms a reading: an engine slower than the broker sends."""

    def process(self, values):
        time.sleep(2e-4 * len(values))
        return super().process(values)


@pytest.fixture
def windowless_broker(tmp_path: Path):
    """A broker that sends a client every QoS 1 message at once (no in-flight window) and never drops one."""
    yield from running_broker(tmp_path, "allow_anonymous true\nmax_inflight_messages 0\nmax_queued_messages 0\n")


def test_a_qos1_flood_is_read_no_further_than_max_queue_ahead_of_the_engine(windowless_broker,
                                                                            tmp_path: Path) -> None:
    """The broker sends a QoS 1 flood without a window (``max_inflight_messages 0``): the link stops reading the
    socket once ``max_queue`` messages wait (the broker holds the rest: they are not acknowledged), and reads on as
    the engine (slower than the broker sends) takes them. At its peak the queue holds ``max_queue`` plus what one
    read takes (at most two ``READ_BUDGET`` of PUBLISH packets of 25 bytes or more), never the flood."""
    broker = windowless_broker
    flood, max_queue = 30_000, 500
    cfg = build_config({"mqtt": {"host": "127.0.0.1", "port": broker.port}, "metrics": {"port": 0},
                        "input": {"source": "mqtt", "topics": ["meters/+/reading"], "qos": 1,
                                  "max_queue": max_queue, "max_batch": 100},
                        "output": {"sinks": ["stdout"]},
                        "streams": {"key_file": str(tmp_path / "k"), "template": dict(TEMPLATE)}})
    ops: list[SlowOperator] = []

    def make(_: str) -> SlowOperator:
        ops.append(SlowOperator(2))
        return ops[-1]

    d = Daemon(cfg, stdout=io.StringIO(), operator_factory=make, install_signals=False)
    peak = 0

    async def go() -> None:
        nonlocal peak
        serving = asyncio.create_task(d.serve())
        await asyncio.wait_for(_until(lambda: d.link is not None and d.link._receiver is not None), 20)
        lines = [str(k % 90) for k in range(flood)]
        sending = asyncio.create_task(asyncio.to_thread(publish, broker.port, "meters/x/reading", lines))
        while sum(op.ticks for op in ops) < flood:
            peak = max(peak, d.link.queue.qos1 if d.link.queue is not None else 0)
            await asyncio.sleep(0)
        await sending
        d.stopping.set()
        assert await asyncio.wait_for(serving, 30) == 0

    asyncio.run(asyncio.wait_for(go(), 120))
    assert max_queue <= peak <= max_queue + 2 * READ_BUDGET // 25, peak

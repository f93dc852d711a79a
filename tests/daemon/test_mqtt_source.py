"""The MQTT source's parts: the topic router, the capped reconnect backoff with jitter, the read-ahead socket, and
the incoming queue (QoS 0 overload counted, QoS 1 never dropped, nothing received thrown away when the connection
ends)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from stream.core.sinks import PublishQueue
from stream.daemon.sources import TopicRouter, backoff_delay


def test_topic_router() -> None:
    r = TopicRouter(["meters/+/reading", "site/x/+"])
    assert r.stream("meters/m1/reading") == "m1" and r.stream("site/x/y") == "y"
    assert r.stream("meters//reading") is None and r.stream("meters/a/b/reading") is None
    assert r.stream("other/m1/reading") is None


def test_backoff_is_capped_with_jitter() -> None:
    delays = [backoff_delay(a, 0.5, 30.0) for a in range(40)]
    assert all(0.25 <= d <= 30.0 for d in delays) and max(delays[10:]) > 14.0
    assert delays[0] <= 0.5


def test_read_ahead_socket_serves_small_reads_from_one_recv() -> None:
    """paho's reads of 1, 1 and n bytes come from one system call; what is read ahead shows in pending(); a
    non-blocking "no data" and the end of the stream pass through unchanged."""
    from stream.daemon.sources import ReadAheadSocket

    class Sock:
        def __init__(self, chunks: list[bytes | type[Exception]]) -> None:
            self.chunks, self.calls = chunks, 0

        def recv(self, n: int) -> bytes:
            self.calls += 1
            c = self.chunks.pop(0)
            if isinstance(c, type):
                raise c
            return c

        def fileno(self) -> int:
            return 7

    inner = Sock([b"\x30\x03abc\x40\x02\x00", BlockingIOError, b"\x05", b""])
    s = ReadAheadSocket(inner)
    assert s.fileno() == 7
    assert [s.recv(1), s.recv(1), s.recv(3)] == [b"\x30", b"\x03", b"abc"] and inner.calls == 1
    assert s.pending() == 3 and s.recv(10) == b"\x40\x02\x00" and s.pending() == 0
    with pytest.raises(BlockingIOError):
        s.recv(1)
    assert s.recv(1) == b"\x05" and s.recv(1) == b"" and inner.calls == 4


def test_qos0_messages_received_before_a_lost_connection_are_processed_on_resume() -> None:
    """Messages still in the incoming queue when the connection ends. QoS 1 ones (not acknowledged) wait
    for the CONNACK: the broker redelivers them if it kept the session. QoS 0 ones are never redelivered: they are
    processed at once, never thrown away by the backlog settling (even when the broker kept the session)."""
    import aiomqtt

    from stream.core.metrics import Metrics
    from stream.daemon.sources import IncomingQueue, MqttLink

    settings = SimpleNamespace(session="persistent", host="127.0.0.1", port=1)
    processed: list[aiomqtt.Message] = []

    async def go() -> None:
        link = MqttLink(settings, topics=["meters/+/reading"], in_qos=1, out_qos=1, pubq=PublishQueue(10),
                        metrics=Metrics(), max_batch=7, inflight=10, max_queue=100)

        def handed_over() -> None:  # what the input source takes from the link
            while (received := link.inbox.take()) is not None:
                assert received.connection is None  # an ended connection's: never acknowledged
                processed.extend(received.messages)

        q = IncomingQueue(100)
        for i in range(40):
            q.put_nowait(aiomqtt.Message("meters/a/reading", str(i).encode(), i % 4 == 0, False, i + 1, None))
        link._after_connection(q)
        handed_over()
        assert [int(m.payload) for m in processed] == [i for i in range(40) if i % 4]  # QoS 0: processed now
        link.session_present = True
        link._settle_backlog()  # the broker kept the session: it redelivers the 10 QoS 1 messages
        handed_over()
        assert len(processed) == 30
        link._after_connection(IncomingQueue(100))
        link._backlog = [aiomqtt.Message("meters/a/reading", b"7", 1, False, 5, None)]
        link.session_present = False
        link._settle_backlog()  # the broker lost the session: processed now
        handed_over()
        assert len(processed) == 31

    asyncio.run(go())


def test_incoming_queue_bound_counts_qos0_overload_and_keeps_qos1() -> None:
    import aiomqtt

    from stream.daemon.sources import IncomingQueue

    async def go() -> None:
        q = IncomingQueue(3)
        for i in range(6):
            q.put_nowait(aiomqtt.Message("t/a/r", b"1", i % 2, False, i + 1, None))
        assert q.qsize() == 5 and q.overload == 1 and q.qos1 == 3  # QoS 1 is never dropped
        q.get_nowait()  # a QoS 0 message
        q.get_nowait()
        assert q.qos1 == 2

    asyncio.run(go())

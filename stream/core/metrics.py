"""Operational Prometheus metrics: aggregated over streams, never a raw value, never a per-stream label."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["EVENT_RESULTS", "MESSAGE_RESULTS", "READING_RESULTS", "Metrics"]

# Fixed label values: the label sets are bounded by construction.
MESSAGE_RESULTS = ("ok", "invalid", "too_large", "invalid_topic", "stream_cap", "failed", "overload")
READING_RESULTS = ("ok", "invalid", "late", "duplicate", "stream_cap", "failed")
SINKS = ("mqtt", "stdout")

# Time to turn one stream's batch of ticks into releases: tens of microseconds to a few hundred milliseconds.
CHECKPOINT_BUCKETS = (1e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LATENCY_BUCKETS = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 0.1, 0.25, 1.0)


# Results that count accepted events. With period ticks that count events (``aggregate = "count"``) the number of
# events IS the protected value, so these are never exported in that mode (``counts_protected``).
EVENT_RESULTS = ("ok", "late", "duplicate")


class Metrics:
    """All metrics of one daemon in their own registry (several daemons can live in one test process).

    ``counts_protected`` (count aggregation): no metric that moves with accepted events exists: the ``ok``, ``late``
    and ``duplicate`` results of messages and readings, the journal's synced readings and the incoming queue depth.
    What remains (rejected malformed input, ticks, releases, queues of releases) does not depend on the count.
    """

    def __init__(self, *, counts_protected: bool = False) -> None:
        r = self.registry = CollectorRegistry()
        self.counts_protected = counts_protected
        self.messages = Counter("tops_messages", "Input messages by result.", ["result"], registry=r)
        self.readings = Counter("tops_readings", "Input readings (elements of messages) by result.", ["result"],
                                registry=r)
        for res in MESSAGE_RESULTS:
            if not (counts_protected and res in EVENT_RESULTS):
                self.messages.labels(res)
        for res in READING_RESULTS:
            if not (counts_protected and res in EVENT_RESULTS):
                self.readings.labels(res)
        self.ticks = Counter("tops_ticks", "Ticks processed (holdout ticks included).", registry=r)
        self.releases = Counter("tops_releases", "Releases written or confirmed by the broker, by sink.", ["sink"],
                                registry=r)
        for s in SINKS:
            self.releases.labels(s)
        self.releases_dropped = Counter("tops_releases_dropped", "Releases dropped by the publish queue "
                                        "(none since it never drops: kept for dashboards).", registry=r)
        self.streams_active = Gauge("tops_streams_active", "Streams known to the daemon.", registry=r)
        self.streams_holdout = Gauge("tops_streams_holdout", "Streams still in their holdout.", registry=r)
        self.streams_failed = Gauge("tops_streams_failed", "Streams marked failed (their operator raised): they "
                                    "take no readings until the daemon restarts.", registry=r)
        self.streams_evicted = Counter("tops_streams_evicted", "Streams that left memory after `[streams] "
                                       "idle_timeout` without a reading (their state stays in the store).",
                                       registry=r)
        self.mqtt_connected = Gauge("tops_mqtt_connected", "1 while connected to the broker.", registry=r)
        self.mqtt_reconnects = Counter("tops_mqtt_reconnects", "Successful reconnections after a lost or "
                                       "failed connection.", registry=r)
        self.mqtt_ack_timeouts = Counter("tops_mqtt_ack_timeouts", "Connections given up because the broker "
                                         "stopped answering: no acknowledgement of the messages in flight, or no "
                                         "answer to a ping, for `[mqtt] timeout` seconds (the link reconnects and "
                                         "sends them again).", registry=r)
        self.mqtt_resyncs = Counter("tops_mqtt_resyncs", "Reconnections after the broker sent QoS 0 messages faster "
                                    "than they were read (QoS 1 input, persistent session): the broker resends on "
                                    "the new connection the QoS 1 readings it may have dropped.", registry=r)
        self.incoming_queue = Gauge("tops_incoming_queue_depth", "Messages received and not yet processed.",
                                    registry=r)
        self.publish_queue = Gauge("tops_publish_queue_depth", "Messages waiting to be published.", registry=r)
        self.tick_latency = Histogram("tops_tick_latency_seconds", "Time to turn one stream's batch of ticks "
                                      "into releases.", buckets=LATENCY_BUCKETS, registry=r)
        self.checkpoint_seconds = Histogram("tops_checkpoint_seconds", "Duration of a checkpoint of the durable "
                                            "state (its write runs in a worker thread while intake goes on).",
                                            buckets=CHECKPOINT_BUCKETS, registry=r)
        self.checkpoint_pause = Histogram("tops_checkpoint_pause_seconds", "The share of a checkpoint spent in the "
                                          "event loop (its cut and its end): intake waits for it.",
                                          buckets=CHECKPOINT_BUCKETS, registry=r)
        self.journal_synced = Counter("tops_journal_synced_readings", "Readings made durable in the input journal "
                                      "(accepted).", registry=None if counts_protected else r)
        self._server: Any = None

    def watch(self, gauge: Gauge, fn: Callable[[], float]) -> None:
        """Read a gauge from ``fn`` at scrape time (the incoming queue stays unset when counts are protected)."""
        if self.counts_protected and gauge is self.incoming_queue:
            self.registry.unregister(gauge)
            return
        gauge.set_function(fn)

    def count(self, counter: Counter, result: str, n: int) -> None:
        """Add ``n`` to ``counter{result}``, unless that result counts events whose number is protected."""
        if n and not (self.counts_protected and result in EVENT_RESULTS):
            counter.labels(result).inc(n)

    def serve(self, host: str, port: int) -> None:
        """Start the HTTP endpoint (a daemon thread); port 0 means off."""
        if port:
            self._server, _ = start_http_server(port, addr=host, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

"""The MQTT adapter: the one module that touches paho-mqtt's and aiomqtt's internals, pinned to the versions it was
written for.

aiomqtt 2.x runs paho-mqtt 2.x's client on asyncio. The daemon needs four things neither offers as an API, and this
module reaches into their internals for them, on the client instance it is given and nowhere else:

- **Manual acknowledgements** (aiomqtt 2.x has no API for application-controlled acknowledgements): QoS 1 readings are
  acknowledged only once taken (with durable state: once the journal on disk holds them). paho's
  ``manual_ack_set`` before connecting; the PUBACKs of a batch go as one write through paho's ``_packet_queue``.
- **The CONNACK's session-present flag and each PUBLISH's DUP flag**, which aiomqtt 2.x drops: paho's
  ``on_connect`` and ``on_message`` callbacks, wrapped around aiomqtt's.
- **Bounded reading**: paho's ``on_socket_open`` wrapped, so that aiomqtt's reader callback (which reads as long as
  data keeps coming) is replaced by the daemon's, which reads a bounded amount through ``loop_read`` and can pause;
  paho's ``_create_socket`` wrapped to read through :class:`ReadAheadSocket` (one ``recv`` per read instead of three
  per packet), and ``_packet_queue`` to write large packets through a ``memoryview``; aiomqtt's ``_disconnected``
  future to end the connection from the reader and the watchdog.
- **Light publishes**: paho makes an ``MQTTMessageInfo`` per publish, each with its own ``threading.Condition``;
  :func:`light_message_info` makes them share one (the daemon polls, never blocks on one).

Every one of these is in :data:`PRIVATES` and checked by :func:`adapter_problems` against the installed packages
(``tops run`` makes that check before it starts when MQTT is used; ``tests/daemon/test_mqtt_adapter_pins.py`` runs it
too). pyproject.toml pins exactly the versions in :data:`TESTED`. The way out of this module: an aiomqtt with
application-controlled acknowledgements, or aiomqtt 3, which drops paho.
"""

from __future__ import annotations

import asyncio
import fcntl
import inspect
import struct
import termios
import threading
from collections.abc import Callable
from importlib import metadata
from typing import Any

import aiomqtt
from paho.mqtt import client as paho_client

__all__ = ["PRIVATES", "TESTED", "PahoSession", "ReadAheadSocket", "adapter_problems", "light_message_info",
           "published"]

# The versions this module was written for and tested with; pyproject.toml pins their series.
TESTED = {"aiomqtt": "2.5.1", "paho-mqtt": "2.2.0"}

# Every private (or callback) of paho-mqtt's ``Client`` relied on, with the parameter names relied on (None: an
# attribute of an instance, or a callback property that must be set by aiomqtt).
PAHO_CLIENT = {
    "_packet_queue": ("self", "command", "packet", "mid", "qos", "info"),
    "_create_socket": ("self",),
    "loop_read": ("self", "max_packets"),
    "manual_ack_set": ("self", "on"),
    "ack": ("self", "mid", "qos"),
    "publish": ("self", "topic", "payload", "qos", "retain", "properties"),
    "_sock": None,
    "_manual_ack": None,
    "on_socket_open": None,
    "on_connect": None,
    "on_message": None,
    "on_publish": None,
}
# paho's per-publish message info, which light_message_info() replaces in place: its slots, and what is replaced.
MESSAGE_INFO_SLOTS = ("_condition", "_iterpos", "_published", "mid", "rc")
MESSAGE_INFO = {"__init__": ("self", "mid"), "_set_as_published": ("self",), "is_published": ("self",)}
# aiomqtt's Client: the constructor's queue_type (called with maxsize), and the instance's paho client and future.
AIOMQTT_CLIENT = {"_client": None, "_disconnected": None}
PRIVATES = ({f"paho-mqtt Client.{n}" for n in PAHO_CLIENT} | {f"paho-mqtt MQTTMessageInfo.{n}" for n in MESSAGE_INFO}
            | {f"aiomqtt Client.{n}" for n in AIOMQTT_CLIENT} | {"aiomqtt Client(queue_type=)",
                                                                  "paho-mqtt ConnectFlags.session_present"})

_PUBACK = 0x40  # MQTT control packet type PUBACK (as paho's PUBACK), remaining length 2, then the message id
_PUBACK_HEAD = ((_PUBACK << 8) | 2) << 16


# -- the pin ------------------------------------------------------------------------------------------------------
def _params(func: Any) -> tuple[str, ...] | None:
    try:
        return tuple(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return None


def _version_problems() -> list[str]:
    out = []
    for dist, tested in TESTED.items():
        try:
            installed = metadata.version(dist)
        except metadata.PackageNotFoundError:
            installed = "none"
        if installed != tested:
            out.append(f"{dist} {installed} is installed; the MQTT adapter (stream/daemon/mqtt_paho.py) was written "
                       f"and tested for {tested}: install {dist}=={tested}")
    return out


def _member_problems(owner: str, cls: type, wanted: dict[str, tuple[str, ...] | None], instance: Any) -> list[str]:
    out = []
    for name, params in wanted.items():
        where = f"{owner}.{name}"
        if params is None:
            if not hasattr(instance, name):
                out.append(f"{where} is gone (the MQTT adapter relies on it)")
            continue
        member = getattr(cls, name, None)
        if member is None:
            out.append(f"{where} is gone (the MQTT adapter relies on it)")
        elif _params(member) != params:
            out.append(f"{where} now takes ({', '.join(_params(member) or ('?',))}), not ({', '.join(params)}) as "
                       f"the MQTT adapter relies on")
    return out


async def _aiomqtt_client() -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", queue_type=asyncio.Queue)


def _private_problems() -> list[str]:
    out = []
    try:
        client = asyncio.run(_aiomqtt_client())  # made, never connected
    except Exception as exc:
        return [f"aiomqtt.Client cannot be made as the MQTT adapter makes it ({type(exc).__name__}: {exc})"]
    out += _member_problems("aiomqtt Client", aiomqtt.Client, AIOMQTT_CLIENT, client)
    paho = getattr(client, "_client", None)
    if paho is not None:
        out += _member_problems("paho-mqtt Client", paho_client.Client, PAHO_CLIENT, paho)
        for name in ("on_socket_open", "on_connect", "on_message"):  # the callbacks the adapter wraps: aiomqtt's
            if hasattr(paho, name) and getattr(paho, name) is None:
                out.append(f"aiomqtt no longer sets paho-mqtt Client.{name} (the MQTT adapter wraps it)")
    info = paho_client.MQTTMessageInfo
    if not getattr(info, "_tops_light", False):
        slots = tuple(sorted(getattr(info, "__slots__", ())))
        if slots != MESSAGE_INFO_SLOTS:
            out.append(f"paho-mqtt MQTTMessageInfo now has the slots ({', '.join(slots)}), not "
                       f"({', '.join(MESSAGE_INFO_SLOTS)}) as the MQTT adapter relies on")
        out += _member_problems("paho-mqtt MQTTMessageInfo", info, MESSAGE_INFO, None)
    flags = getattr(paho_client, "ConnectFlags", None)
    if flags is None or "session_present" not in getattr(flags, "_fields", ()):
        out.append("paho-mqtt ConnectFlags.session_present is gone (the MQTT adapter relies on it)")
    return out


def adapter_problems() -> list[str]:
    """What differs from the paho-mqtt and aiomqtt this module was written for, one line each (empty: none): the
    installed versions against :data:`TESTED`, and every private relied on, with its parameters."""
    return _version_problems() + _private_problems()


# -- light publishes ----------------------------------------------------------------------------------------------
def light_message_info() -> None:
    """paho-mqtt makes an ``MQTTMessageInfo`` per publish, each with its own ``threading.Condition`` (about a quarter
    of the daemon's time at QoS 1 in and out, one release per message). We never block on one (the publish loop
    polls ``is_published``), so every info shares one condition, and ``_set_as_published`` wakes all its waiters,
    each of which checks its own flag: ``wait_for_publish`` keeps its meaning for any other caller. Idempotent;
    applied when the first client is made (after ``tops run`` has checked the pin)."""
    cls = paho_client.MQTTMessageInfo
    if getattr(cls, "_tops_light", False):
        return
    shared = threading.Condition()
    ok = paho_client.MQTTErrorCode.MQTT_ERR_SUCCESS

    def __init__(self: Any, mid: int) -> None:
        self.mid = mid
        self._published = False
        self._condition = shared
        self.rc = ok
        self._iterpos = 0

    def _set_as_published(self: Any) -> None:
        with self._condition:
            self._published = True
            self._condition.notify_all()

    cls.__init__ = __init__
    cls._set_as_published = _set_as_published
    cls._tops_light = True


def published(info: Any) -> bool:
    """paho's ``is_published``, but False instead of an exception for a message that could not go out (paho raises
    when its publish failed, e.g. the connection dropped while it was queued): it is then not confirmed, and is
    published again after the reconnect like any other unconfirmed message."""
    try:
        return bool(info.is_published())
    except (RuntimeError, ValueError):
        return False


# -- reading ------------------------------------------------------------------------------------------------------
class ReadAheadSocket:
    """The broker socket as paho-mqtt sees it, reading ahead: paho reads a packet in three ``recv`` calls (type,
    length, rest), one system call each; this takes what the kernel has in one call and serves paho from it.

    ``pending()`` counts the bytes read ahead, so aiomqtt's reader callback keeps calling ``loop_read`` until they
    are consumed (as it does for TLS sockets); everything else is the wrapped socket's."""

    def __init__(self, sock: Any, chunk: int = 1 << 16) -> None:
        self._sock = sock
        self._chunk = chunk
        self._data = b""
        self._pos = 0
        self.budget: int | None = None  # bytes the current reader callback may still take from the kernel

    def recv(self, n: int) -> bytes:
        data, pos = self._data, self._pos
        if pos < len(data):
            out = data[pos:pos + n]
            self._pos = pos + len(out)
            return out
        budget = self.budget
        if budget is not None:
            if budget <= 0:  # this callback's share is used: paho keeps its partial packet, the loop runs others
                raise BlockingIOError
            self.budget = budget - self._chunk
        data = self._sock.recv(max(n, self._chunk))  # BlockingIOError, TLS "want read", b"" at EOF: as they are
        if len(data) <= n:
            self._data, self._pos = b"", 0
            return data
        self._data, self._pos = data, n
        return data[:n]

    def pending(self) -> int:
        inner = getattr(self._sock, "pending", None)
        return len(self._data) - self._pos + (inner() if inner is not None else 0)

    def buffered(self) -> int:
        """Bytes read ahead and not yet served (no system call needed to serve them)."""
        return len(self._data) - self._pos

    def unread(self) -> int:
        """Bytes received and not yet served: read ahead, decrypted ahead (TLS) and waiting in the kernel."""
        waiting = struct.unpack("i", fcntl.ioctl(self._sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
        return self.pending() + waiting

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


# -- one connection's client --------------------------------------------------------------------------------------
class PahoSession:
    """One aiomqtt client and what the daemon does with its paho client beyond aiomqtt's API.

    Made by :meth:`make` (the client wired for read-ahead, view writes and manual acknowledgements); the link uses
    ``client`` for aiomqtt's public API (connect, subscribe, messages) and this object for everything else."""

    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        self._paho = client._client  # private (aiomqtt 2.x): paho's client under aiomqtt's

    @classmethod
    def make(cls, queue: asyncio.Queue[Any], *, manual_acks: bool, **kwargs: Any) -> PahoSession:
        """An aiomqtt client with ``kwargs`` whose incoming messages go into ``queue`` (aiomqtt 2.x makes its queue
        from ``queue_type``: a handle on it is kept), reading through :class:`ReadAheadSocket`, writing large packets
        through a view, not building a reason code per publish, and (``manual_acks``) acknowledging QoS 1 messages
        only through :meth:`acknowledge`."""
        light_message_info()
        client = aiomqtt.Client(queue_type=lambda maxsize=0: queue, **kwargs)  # type: ignore[arg-type,misc]
        self = cls(client)
        paho = self._paho
        create_socket = paho._create_socket
        paho._create_socket = lambda: ReadAheadSocket(create_socket())
        packet_queue = paho._packet_queue

        def queue_packet(command: int, packet: bytes | bytearray, mid: int, qos: int, info: Any = None) -> Any:
            # paho writes the rest of a packet as packet[pos:], a copy on every partial write (quadratic for the
            # large payloads of batched releases); a view of the same bytes is sliced without copying.
            return packet_queue(command, memoryview(packet) if len(packet) > 4096 else packet, mid, qos, info)

        paho._packet_queue = queue_packet
        # Releases are published through paho directly (never aiomqtt's publish(), which waits on this callback):
        # without it paho skips building a reason code and properties for every message written.
        paho.on_publish = None
        if manual_acks:
            paho.manual_ack_set(True)  # before connecting
        return self

    # -- callbacks, wrapped around aiomqtt's ----------------------------------------------------------------------
    def after_socket_opens(self, then: Callable[[Any], None]) -> None:
        """Call ``then(sock)`` in the event loop after aiomqtt has registered its reader for a new socket."""
        paho = self._paho
        aiomqtt_open = paho.on_socket_open
        loop = asyncio.get_running_loop()

        def on_socket_open(c: Any, userdata: Any, sock: Any) -> None:
            aiomqtt_open(c, userdata, sock)  # registers aiomqtt's reader callback and its keepalive task
            loop.call_soon_threadsafe(then, sock)  # runs after aiomqtt's add_reader

        paho.on_socket_open = on_socket_open

    def on_connack(self, then: Callable[[bool], None]) -> None:
        """Call ``then(session_present)`` at each CONNACK, after aiomqtt has seen it."""
        paho = self._paho
        aiomqtt_on_connect = paho.on_connect

        def on_connect(c: Any, userdata: Any, flags: Any, *args: Any) -> None:
            aiomqtt_on_connect(c, userdata, flags, *args)
            then(bool(getattr(flags, "session_present", False)))

        paho.on_connect = on_connect

    def on_dup_flags(self, dups: set[int]) -> None:
        """Keep in ``dups`` the QoS 1 packet ids whose last PUBLISH had the DUP flag set, as paho parses each."""
        paho = self._paho
        deliver = paho.on_message

        def on_message(c: Any, userdata: Any, msg: Any) -> None:
            if msg.qos:
                (dups.add if msg.dup else dups.discard)(msg.mid)
            deliver(c, userdata, msg)

        paho.on_message = on_message

    # -- the socket ------------------------------------------------------------------------------------------------
    def owns(self, sock: Any) -> bool:
        """Whether ``sock`` is still the connection's socket (not closed or replaced)."""
        return self._paho._sock is sock

    def read(self) -> None:
        """Let paho read and handle one packet from its socket (raises what the read raises)."""
        self._paho.loop_read()

    @property
    def disconnected(self) -> asyncio.Future[None]:
        """aiomqtt's future of the connection's end (raises ``MqttError`` when the link is lost)."""
        return self.client._disconnected

    def end(self, exc: BaseException) -> None:
        """End the connection with ``exc`` (as aiomqtt's reader does on a read error)."""
        if not self.client._disconnected.done():
            self.client._disconnected.set_exception(exc)

    # -- writing ---------------------------------------------------------------------------------------------------
    def acknowledge(self, mids: list[int]) -> None:
        """The PUBACKs of received QoS 1 messages, in their order."""
        paho = self._paho
        queue = getattr(paho, "_packet_queue", None)
        if queue is None or not getattr(paho, "_manual_ack", False):
            for mid in mids:
                paho.ack(mid, 1)
        else:
            # The PUBACKs paho's ack(mid, 1) would queue one by one (4 bytes each: 0x40, 2, mid), in their order,
            # queued as one write.
            queue(_PUBACK, struct.pack(f"!{len(mids)}I", *[_PUBACK_HEAD | mid for mid in mids]), 0, 1)

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool) -> Any:
        """Hand paho a message without awaiting its confirmation; returns its message info (see :func:`published`)."""
        return self._paho.publish(topic, payload, qos, retain)

"""A flood publisher for tests and bench/: raw MQTT 3.1.1 QoS 0 PUBLISH packets written as fast as the socket takes
them (no client library in the way), for a given time; prints the number of messages written as JSON.

Run: ``python -m tests.flood --port P --seconds S [--topics meters/f0/reading,...] [--rate N] [--username U
--password-file F]``. Every message written before DISCONNECT reaches the broker (TCP); QoS 0, so nothing is
acknowledged.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import time


def _remaining(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n % 128, n // 128
        out.append(b | (128 if n else 0))
        if not n:
            return bytes(out)


def packet(kind: int, body: bytes) -> bytes:
    return bytes([kind]) + _remaining(len(body)) + body


def _str(s: bytes) -> bytes:
    return struct.pack("!H", len(s)) + s


def connect_packet(client_id: str, keepalive: int = 60, username: str = "", password: str = "") -> bytes:
    """MQTT 3.1.1 CONNECT, clean session; with a user name (and its password) when given."""
    flags = 0x02 | (0x80 if username else 0) | (0x40 if username and password else 0)
    body = _str(b"MQTT") + bytes([4, flags]) + struct.pack("!H", keepalive) + _str(client_id.encode())
    if username:
        body += _str(username.encode())
        if password:
            body += _str(password.encode())
    return packet(0x10, body)


def publish_packet(topic: str, payload: bytes) -> bytes:
    return packet(0x30, _str(topic.encode()) + payload)  # QoS 0, no packet id


def flood(port: int, seconds: float, topics: list[str], rate: float = 0.0, host: str = "127.0.0.1",
          username: str = "", password: str = "", payload: bytes = b"") -> int:
    """Write QoS 0 publishes for ``seconds`` (at most ``rate`` per second when > 0); returns how many were written.
    ``payload``: every message's payload (default: the digits "1".."9" in turn)."""
    sock = socket.create_connection((host, port))
    sock.sendall(connect_packet(f"flood-{time.monotonic_ns()}", username=username, password=password))
    ack = b""
    while len(ack) < 4:
        ack += sock.recv(4 - len(ack))
    if ack[3] != 0:
        msg = f"connection refused (code {ack[3]})"
        raise RuntimeError(msg)
    # One chunk: 1,000 messages cycling through the topics, payloads "1".."9" (a sum is easy to check).
    per_chunk = 1000
    chunk = b"".join(publish_packet(topics[i % len(topics)], payload or str(1 + i % 9).encode())
                     for i in range(per_chunk))
    sent = 0
    t0 = time.monotonic()
    end = t0 + seconds
    while True:
        now = time.monotonic()
        if now >= end:
            break
        if rate > 0 and sent >= rate * (now - t0):
            time.sleep(min(0.005, end - now))
            continue
        sock.sendall(chunk)
        sent += per_chunk
    sock.sendall(packet(0xE0, b""))  # DISCONNECT
    sock.shutdown(socket.SHUT_WR)
    with_timeout = sock.recv(16)  # the broker closes after DISCONNECT: everything before it was read
    del with_timeout
    sock.close()
    return sent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--topics", default="meters/flood/reading")
    p.add_argument("--rate", type=float, default=0.0, help="messages per second (0: as fast as possible)")
    p.add_argument("--username", default="", help="MQTT user name (empty: anonymous)")
    p.add_argument("--password-file", default="", help="file whose first line is the user's password")
    p.add_argument("--payload", default="", help="every message's payload (default: the digits 1-9 in turn)")
    a = p.parse_args()
    password = ""
    if a.password_file:
        with open(a.password_file) as f:
            password = f.readline().rstrip("\n")
    t0 = time.monotonic()
    n = flood(a.port, a.seconds, a.topics.split(","), a.rate, username=a.username, password=password,
              payload=a.payload.encode())
    print(json.dumps({"sent": n, "seconds": round(time.monotonic() - t0, 3)}))


if __name__ == "__main__":
    main()

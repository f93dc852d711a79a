"""Releases and status messages live from the daemon's MQTT topics (``tops query --host``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

__all__ = ["collect_live"]


async def collect_live(rel: Any, *, host: str, port: int, topics: list[str], seconds: float,
                       releases: int | None, username: str | None = None, password: str | None = None,
                       ca_file: str | None = None, on_ready: Any = None) -> int:
    """Subscribe to ``topics`` and add every payload to ``rel`` (a :class:`stream.query.Releases`) for ``seconds``
    (or until ``releases`` are in); ``on_ready()`` is called once subscribed."""
    import ssl

    import aiomqtt

    tls = ssl.create_default_context(cafile=ca_file) if ca_file else None
    got = 0
    deadline = time.monotonic() + seconds
    async with aiomqtt.Client(host, port, username=username, password=password, tls_context=tls,
                              identifier=f"tops-query-{id(rel):x}") as client:
        for t in topics:
            await client.subscribe(t, qos=1)
        if on_ready is not None:
            on_ready()
        messages = client.messages.__aiter__()
        while releases is None or got < releases:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                msg = await asyncio.wait_for(anext(messages), timeout=left)
            except (TimeoutError, StopAsyncIteration):
                break
            payload = msg.payload
            got += rel.add_payload(payload if isinstance(payload, bytes | str) else bytes(payload))
    return got

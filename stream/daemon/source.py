"""What every input of the daemon is: a :class:`Source` of :class:`Chunk` objects.

A source hands the daemon's engine loop messages in chunks, in arrival order; the engine enters the source, takes
every chunk it yields, acknowledges chunks once what they carry is durable, asks it to stop taking input, and exits
it::

    async with source:
        async for chunk in source.chunks():
            ...  # backpressure first, then the chunk goes to the intake
            source.acknowledge([chunk.ack])  # with durable state only once the journal holds the chunk

The engine knows no source but through this interface (stdin: stream/daemon/stdin.py). A source never acknowledges
by itself: what it received and was not acknowledged comes back next time (from the broker), or was never seen
accepted by any producer (stdin).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, Self, TypeAlias

__all__ = ["NO_REFUSALS", "AckToken", "Chunk", "ChunkKind", "Source", "lines_of"]

AckToken: TypeAlias = Any  # what a source needs to acknowledge one chunk: its own kind of object (stdin: none)
NO_REFUSALS: Mapping[str, int] = MappingProxyType({})


class ChunkKind(enum.IntEnum):
    """How a chunk's messages name their streams."""

    LINES = 0  # bytes of whole lines; each line names its stream (stdin)
    ADDRESSED = 1  # one payload per message, its stream named by the topic or subject it came on (MQTT, NATS)


@dataclass(frozen=True, slots=True)
class Chunk:
    """Messages taken from a source in one go, in arrival order.

    ``refused`` counts what the source took and will never hand over, by the result it is counted as
    (``too_large``: a line longer than ``[input] max_payload_bytes``, skipped to its end and never decoded)."""

    kind: ChunkKind
    data: bytes = b""  # LINES: whole lines, each ending with a newline
    names: Sequence[str | None] = ()  # ADDRESSED: the stream of each message (None: its topic names none)
    payloads: Sequence[bytes] = ()  # ADDRESSED: each message's payload
    arrival: float = 0.0  # when the source received the chunk (seconds since the epoch)
    ack: AckToken | None = None  # what to acknowledge once the chunk is durable (None: nothing)
    marks: Sequence[dict[str, Any]] = ()  # journal marks that must be durable with this chunk
    refused: Mapping[str, int] = field(default_factory=lambda: NO_REFUSALS)  # counted by the source, never decoded


class Source(Protocol):
    """A stream of chunks; the engine enters it, iterates, acknowledges, stops it, exits it."""

    async def __aenter__(self) -> Self:
        """Open: connect, start the readers."""
        ...

    async def __aexit__(self, *exc: object) -> None:
        """Close; what was not acknowledged comes back next time (where the source can give it back)."""
        ...

    def chunks(self) -> AsyncIterator[Chunk]:
        """The chunks in arrival order; ends at the end of input, or after :meth:`stop_intake` once everything
        already received was yielded."""
        ...

    def acknowledge(self, tokens: Sequence[AckToken]) -> None:
        """The engine's call once the chunks these tokens came with are durable (or, without durable state, taken)."""
        ...

    def stop_intake(self) -> None:
        """Take no new input; what was received is still yielded."""
        ...


def lines_of(chunk: Chunk) -> list[bytes]:
    """A LINES chunk's lines, without their newlines.

    >>> lines_of(Chunk(ChunkKind.LINES, b"a,1\\n\\nb,2\\n"))
    [b'a,1', b'', b'b,2']
    >>> lines_of(Chunk(ChunkKind.LINES))
    []
    """
    data = chunk.data
    return data[:-1].split(b"\n") if data else []

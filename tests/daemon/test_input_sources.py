"""Every input is a Source of chunks. stdin hands over whole lines however its reads are cut, skips a line longer than
the limit to its end (counted once, never kept) and, once told to stop, yields what it read and ends. The daemon's
engine loop knows sources only through the interface: a source written here runs it to the end of input, with the
releases and counts stdin gives for the same lines; it is acknowledged chunk by chunk after the chunk was taken,
and with durable state only once the journal on disk holds the chunk's readings."""

from __future__ import annotations

import asyncio
import inspect
import io
import json
import random
import signal
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Self

from stream.core.config import build_config
from stream.daemon.mqtt_source import MqttSource
from stream.daemon.service import Daemon
from stream.daemon.source import Chunk, ChunkKind, Source, lines_of
from stream.daemon.stdin import StdinSource
from tests.support import TEMPLATE, FakeOperator, watchdog

TPL = {"epsilon": 1.0, "bound": 100.0}
LIMIT = 64  # [input] max_payload_bytes of these tests


class ListSource:
    """A source of given chunks, standing in for any input the daemon may get: it records what it is asked to
    acknowledge, calling ``on_ack`` with each token as it comes."""

    def __init__(self, chunks: list[Chunk], on_ack: Callable[[Any], None] = lambda token: None,
                 before: Callable[[int], None] = lambda k: None) -> None:
        self._chunks = chunks
        self.on_ack = on_ack
        self.before = before  # called before the k-th chunk is yielded
        self.yielded = 0
        self.acked: list[Any] = []
        self.entered = self.exited = 0
        self.stopped = False

    async def __aenter__(self) -> Self:
        self.entered += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.exited += 1

    async def chunks(self) -> AsyncIterator[Chunk]:
        for k, chunk in enumerate(self._chunks):
            if self.stopped:
                return
            self.before(k)
            self.yielded += 1
            yield chunk

    def acknowledge(self, tokens: Sequence[Any]) -> None:
        for token in tokens:
            self.on_ack(token)
            self.acked.append(token)

    def stop_intake(self) -> None:
        self.stopped = True


def _members(cls: type) -> dict[str, tuple[str, list[tuple[str, Any]]]]:
    """Each member :class:`Source` declares, as ``cls`` defines it: whether it is awaited, and its parameters."""
    out = {}
    for name, declared in vars(Source).items():
        if not inspect.isfunction(declared) or (name.startswith("_") and name not in ("__aenter__", "__aexit__")):
            continue
        f = getattr(cls, name)
        awaited = "awaited" if inspect.iscoroutinefunction(f) else "called"
        out[name] = (awaited, [(p.name, p.kind) for p in inspect.signature(f).parameters.values()])
    return out


def test_stdin_and_any_other_source_implement_every_member_of_the_source_interface() -> None:
    want = _members(Source)
    assert set(want) == {"__aenter__", "__aexit__", "chunks", "acknowledge", "stop_intake"}
    for cls in (StdinSource, MqttSource, ListSource):
        assert _members(cls) == want, cls.__name__


# -- stdin ----------------------------------------------------------------------------------------------------
class CutReads(io.RawIOBase):
    """A byte stream whose ``read1`` returns pieces of random length (a pipe under a producer that writes in bursts)."""

    def __init__(self, data: bytes, rng: random.Random) -> None:
        self.data, self.pos, self.rng = data, 0, rng

    def read1(self, n: int = -1) -> bytes:
        take = min(n, self.rng.randint(1, 300))
        out = self.data[self.pos:self.pos + take]
        self.pos += len(out)
        return out


async def _all_chunks(source: StdinSource) -> list[Chunk]:
    async with source:
        return [chunk async for chunk in source.chunks()]


def test_stdin_hands_whole_lines_however_reads_cut_them_and_skips_an_overlong_line_counted_once() -> None:
    rng = random.Random(5)
    for trial in range(40):
        lines = [b"x" * rng.randint(LIMIT + 1, 900) if rng.random() < 0.1  # alone in a read, or over many
                 else f"s{rng.randint(0, 9)},{rng.randint(0, 99)}".encode() * rng.randint(0, 3)
                 for _ in range(rng.randint(1, 60))]
        ended = rng.random() < 0.5  # else the last line has no newline
        data = b"\n".join(lines) + (b"\n" if ended else b"")
        if not ended and not lines[-1]:
            lines.pop()  # nothing after the last newline: no last line
        overlong = sum(len(x) > LIMIT for x in lines)
        source = StdinSource(CutReads(data, rng), chunk_bytes=256, max_line=LIMIT)
        chunks = asyncio.run(_all_chunks(source))
        assert all(c.kind == ChunkKind.LINES and c.ack is None for c in chunks)
        assert all(c.data == b"" or c.data.endswith(b"\n") for c in chunks), trial
        got = [line for c in chunks for line in lines_of(c)]
        refused = sum(c.refused.get("too_large", 0) for c in chunks)
        # an overlong line the reader saw whole in one read goes on (the intake counts it); any other is refused
        assert [x for x in got if len(x) <= LIMIT] == [x for x in lines if len(x) <= LIMIT], trial
        assert refused + sum(len(x) > LIMIT for x in got) == overlong, trial
        assert all(len(x) <= LIMIT or x == b"x" * len(x) for x in got)


class OpenPipe(io.RawIOBase):
    """A producer that wrote ``data`` and keeps the pipe open: once it is read, the next read (``reading`` set while
    it waits) returns only when ``done`` is set."""

    def __init__(self, data: bytes) -> None:
        self.data, self.served = data, False
        self.reading, self.done = threading.Event(), threading.Event()

    def read1(self, n: int = -1) -> bytes:
        if not self.served:
            self.served = True
            return self.data
        self.reading.set()
        self.done.wait(30)
        return b""


def test_stdin_told_to_stop_yields_what_it_read_then_ends_while_the_producer_keeps_the_pipe_open() -> None:
    pipe = OpenPipe(b"a,1\nb,2\n")

    async def stop_while_the_reader_waits(source: StdinSource) -> None:
        await asyncio.to_thread(pipe.reading.wait, 10)
        source.stop_intake()

    async def run() -> list[bytes]:
        got: list[bytes] = []
        async with StdinSource(pipe) as source, asyncio.TaskGroup() as tg:
            async for chunk in source.chunks():
                got += lines_of(chunk)
                tg.create_task(stop_while_the_reader_waits(source))  # (the drain of a daemon on an idle pipe)
        return got

    try:
        with watchdog(15):  # the producer holds the pipe open for 30 s
            assert asyncio.run(run()) == [b"a,1", b"b,2"]
    finally:
        pipe.done.set()


# -- the engine loop --------------------------------------------------------------------------------------------
LINES = [b"a,1", b"5", b"garbage", b"a,2", b'{"stream":"b","value":3}', b"b,nan", b"a,3", b"x" * (LIMIT + 5),
         b"6", b"b,4", b'[{"stream":"b","value":5},{"stream":"a","value":6}]', b"7", b"b,6"]


def _cfg(tmp: Path, **sections: Any) -> Any:
    return build_config({"metrics": {"port": 0}, "input": {"max_payload_bytes": LIMIT},
                         "streams": {"key_file": str(tmp / "k"), "template": TPL}, **sections})


def _chunked(lines: list[bytes], rng: random.Random) -> list[Chunk]:
    """``lines`` cut into LINES chunks at random line ends, each with its index as ack token; the third chunk also
    carries two lines its source refused as too large."""
    cuts = sorted(rng.sample(range(1, len(lines)), 4))
    parts = [lines[a:b] for a, b in zip([0, *cuts], [*cuts, len(lines)], strict=True)]
    return [Chunk(ChunkKind.LINES, b"".join(x + b"\n" for x in part), ack=k,
                  refused={"too_large": 2} if k == 2 else {}) for k, part in enumerate(parts)]


def _counts(d: Daemon) -> dict[str, float]:
    return {s.name + str(s.labels): s.value for f in d.metrics.registry.collect() for s in f.samples
            if s.name in ("tops_messages_total", "tops_readings_total")}


def test_the_engine_runs_any_source_to_its_end_as_it_runs_stdin_acknowledging_each_chunk_once_taken(
        tmp_path: Path) -> None:
    ops: list[FakeOperator] = []

    def make(_: str) -> FakeOperator:
        ops.append(FakeOperator(2))
        return ops[-1]

    chunks = _chunked(LINES, random.Random(3))
    readings_through = [0]
    for c in chunks:  # the readings each chunk carries (a JSON array line carries two)
        readings_through.append(readings_through[-1] + sum(
            2 if x.startswith(b"[") else x not in (b"garbage", b"b,nan") and len(x) <= LIMIT for x in lines_of(c)))
    ticks_at_ack: list[int] = []
    source = ListSource(chunks, on_ack=lambda token: ticks_at_ack.append(sum(op.ticks for op in ops)))
    out = io.StringIO()
    d = Daemon(_cfg(tmp_path), source=source, stdout=out, operator_factory=make, install_signals=False)
    assert asyncio.run(d.serve()) == 0  # the source's end is the end of input: the daemon drains and exits

    # stdin with the same lines, and the two lines the source refused as one too long for its reader to keep
    data = b"".join(x + b"\n" for x in LINES) + b"y" * (2 * LIMIT) + b"\n" + b"z" * (LIMIT + 1) + b"\n"
    out_stdin = io.StringIO()
    d_stdin = Daemon(_cfg(tmp_path), stdin=io.BytesIO(data), stdout=out_stdin,
                     operator_factory=lambda _: FakeOperator(2), install_signals=False)
    assert asyncio.run(d_stdin.serve()) == 0

    def releases(text: str) -> list[tuple[str, int, float]]:  # each stream's in order (steps differ across streams)
        return sorted((r["stream"], r["tick"], r["value"]) for r in map(json.loads, text.splitlines()))

    assert releases(out.getvalue()) and releases(out.getvalue()) == releases(out_stdin.getvalue())
    assert _counts(d) == _counts(d_stdin)
    assert _counts(d)["tops_messages_total{'result': 'too_large'}"] == 3
    assert (source.entered, source.exited) == (1, 1)
    assert source.acked == list(range(len(chunks)))  # every chunk, in order
    assert ticks_at_ack == readings_through[1:]  # each once its readings were taken, before the next was


def test_with_durable_state_a_chunk_is_acknowledged_only_once_the_journal_on_disk_holds_it(tmp_path: Path) -> None:
    lines = [f"s{k % 7},{(5 * k) % 90}".encode() for k in range(400)]
    chunks = [Chunk(ChunkKind.LINES, b"".join(x + b"\n" for x in lines[k:k + 40]), ack=k // 40)
              for k in range(0, len(lines), 40)]
    synced_at_ack: list[int] = []
    source = ListSource(chunks, on_ack=lambda token: synced_at_ack.append(d.durable.synced_readings))
    d = Daemon(_durable_cfg(tmp_path), source=source, stdout=io.StringIO(), install_signals=False)
    assert asyncio.run(d.serve()) == 0
    assert source.acked == list(range(len(chunks)))
    assert all(synced >= 40 * (k + 1) for k, synced in enumerate(synced_at_ack)), synced_at_ack


def _durable_cfg(tmp: Path) -> Any:
    return build_config({"metrics": {"port": 0}, "output": {"sinks": ["stdout"]},
                         "streams": {"key_file": str(tmp / "k"), "template": dict(TEMPLATE)},
                         "state": {"data_dir": str(tmp / "state"), "fsync_interval": 50}})


def test_a_stop_while_intake_waits_for_a_disk_that_refuses_writes_ends_the_wait_and_the_daemon_drains(
        tmp_path: Path) -> None:
    chunks = [Chunk(ChunkKind.LINES, b"".join(f"s,{k % 90}\n".encode() for k in range(40)))] * 3

    def before(k: int) -> None:
        if k == 0:  # the journal cannot be written (what a full disk does), and SIGTERM comes while intake waits
            d.durable.writable.clear()
            asyncio.get_running_loop().call_soon(d.on_signal, signal.SIGTERM)

    source = ListSource(chunks, before=before)
    d = Daemon(_durable_cfg(tmp_path), source=source, stdout=io.StringIO(), install_signals=False)
    with watchdog(30):
        assert asyncio.run(d.serve()) == 0
    assert source.stopped and source.yielded == 1 and (source.entered, source.exited) == (1, 1)

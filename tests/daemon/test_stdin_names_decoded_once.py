"""The stdin intake's common line: a ``stream,value`` line of a stream already seen skips the decoding of
its name (the name's bytes, as lines give them, map to the name the full decoder checked once). Whatever a line holds,
the daemon must do exactly what the full decoder makes of it: the same releases, the same counts of messages and
readings, the same failed streams. The attack: lines that look like the common line but are not (JSON with one comma,
whitespace, names that only differ by what decoding strips, values that are not finite numbers, timestamps, overlong
lines, a stream that fails), interleaved with streams already seen."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest

from stream.core._line_scan import NameTable
from stream.core.config import build_config
from stream.daemon import service as daemon_mod
from tests.support import FakeOperator


class _Forgetful(NameTable):
    """A name table that keeps nothing: every line's name is decoded and checked (the reference)."""

    def add(self, names: list[bytes], values: list[object] | None = None) -> None:
        pass


LINES = [b"a,1", b" a,2", b"a ,3", b"a,4 ", b"a,5\r", b"\ta,6", b"a,nan", b"a,inf", b"a,-inf", b"a,", b"a,x",
         b"a,1e999", b"a,7,", b"a,8,1700000000", b"a,,9", b'{"stream":"a","value":10}', b' {"stream":"a",1}',
         b'["a",11]', b"[a,12", b"{a,13", b"b,14", b"b,15", b"\xff,16", b"\xffa,17", b"a/x,18", b"a+,19", b"c,20",
         b"c,21", b"a," + b"9" * 300, b"a,22", b"d\x00,23", b"b, 24", b"b,25.5e0", b"b,0x10", b"b,1_000", b"B,26",
         b"boom,1", b"boom,2", b"boom,3", b"a,27", b"", b",28", b"a\xc3\xa9,29", b"a\xc3\xa9,30", b"e,31"]


class _Boom(FakeOperator):
    """Raises at its third reading (a stream whose operator fails)."""

    def process(self, values: object) -> object:
        if self.ticks + len(values) >= 3:  # type: ignore[arg-type]
            raise RuntimeError("boom")
        return super().process(values)


def run(tmp_path: Path, lines: list[bytes], forget: bool) -> tuple[list[dict], dict[str, float], list[str]]:
    cfg = build_config({"metrics": {"port": 0}, "input": {"max_payload_bytes": 200},
                        "streams": {"key_file": str(tmp_path / "k"), "template": {"epsilon": 1.0, "bound": 100.0}}})
    out = io.StringIO()
    d = daemon_mod.Daemon(cfg, stdin=io.BytesIO(b"\n".join(lines) + b"\n"), stdout=out,
                          operator_factory=lambda name: _Boom(2) if name == "boom" else FakeOperator(2),
                          install_signals=False)
    if forget:
        d._names = _Forgetful()
    assert asyncio.run(d.serve()) == 0
    metrics = {s.name + str(s.labels): s.value for f in d.metrics.registry.collect() for s in f.samples
               if s.name.startswith(("tops_messages_total", "tops_readings_total"))}
    failed = sorted(rec.name for rec in d.router.streams.values() if rec.failed)
    releases = [json.loads(x) for x in out.getvalue().splitlines()]
    for r in releases:  # the arrival time differs between runs; a reading's own ts does not
        r["ts"] = r["ts"] if r["ts"] < 1.75e9 else "now"
    return releases, metrics, failed


@pytest.mark.parametrize("rounds", [1, 3])
def test_known_names_do_what_the_full_decoder_does(tmp_path: Path, rounds: int) -> None:
    lines = LINES * rounds
    fast = run(tmp_path, lines, forget=False)
    slow = run(tmp_path, lines, forget=True)
    assert fast == slow
    releases, metrics, failed = fast
    assert failed == ["boom"] and releases
    assert metrics["tops_messages_total{'result': 'ok'}"] > 10 * rounds
    assert metrics["tops_messages_total{'result': 'invalid'}"] > 10 * rounds
    assert metrics["tops_messages_total{'result': 'too_large'}"] == rounds


def test_a_flood_of_new_names_keeps_the_table_bounded(tmp_path: Path) -> None:
    cfg = build_config({"metrics": {"port": 0}, "streams": {"key_file": str(tmp_path / "k"), "max_streams": 10,
                                                            "template": {"epsilon": 1.0, "bound": 100.0}}})
    d = daemon_mod.Daemon(cfg, stdin=io.BytesIO(b""), stdout=io.StringIO(), operator_factory=lambda _: FakeOperator(2),
                          install_signals=False)
    d.startup()
    d._csv_names_max = 1000
    for r in range(5):
        d.on_lines([f"n{r}-{k},1".encode() for k in range(700)])
        assert len(d._names) <= 1000
    assert len(d.router.streams) == 10

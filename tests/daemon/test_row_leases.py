"""Streams that are release rows take a stdin chunk's lines by row: the daemon keeps, per name, the row and a lease
the router gave it (stream/core/row_leases.py), and a chunk whose lines all hold one is released in one pass without
visiting a record. The attacks: a stream that fails while its row holds a lease, a stream that leaves memory and
whose row goes to another stream, readings that wait for the step between lines taken by row, and durable state,
whose journal must hold every reading taken by row. Each must keep every stream's releases exactly what its own
operator releases of its own readings, and every count right."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from stream.core.config import build_config
from stream.daemon import service as daemon_mod
from tests.support import own_releases, release_lines

PUBLIC = {"epsilon": 1.0, "bound": 20.0, "theta": 10.0, "fanout": 2, "query_range": 64}
HELD = {"epsilon": 1.0, "bound": 20.0, "holdout": 4, "fanout": 2, "query_range": 64}


def _daemon(tmp_path: Path, template: dict, data_dir: str = "") -> tuple[daemon_mod.Daemon, io.StringIO]:
    cfg = build_config({"metrics": {"port": 0}, "state": {"data_dir": data_dir}, "input": {"source": "stdin"},
                        "streams": {"key_file": str(tmp_path / "k"), "template": template}})
    out = io.StringIO()
    d = daemon_mod.Daemon(cfg, stdin=io.BytesIO(b""), stdout=out, install_signals=False)
    d.startup()
    return d, out


def _releases(text: io.StringIO, made_anew: str = "") -> dict[str, dict[int, float]]:
    """Each stream's releases by tick (a tick released twice fails, but in the streams ``made_anew``)."""
    out: dict[str, dict[int, float]] = {}
    for r in release_lines(text.getvalue()):
        assert r["stream"] in made_anew or r["tick"] not in out.get(r["stream"], {}), "a tick released twice"
        out.setdefault(r["stream"], {})[r["tick"]] = r["value"]
    return out


def _round(names: str, rng: np.random.Generator, want: dict[str, list[float]]) -> list[bytes]:
    chunk = []
    for name in names:
        v = float(rng.integers(0, 20))
        want.setdefault(name, []).append(v)
        chunk.append(f"{name},{v:g}".encode())
    return chunk


def _taken_by_row(d: daemon_mod.Daemon, names: str) -> bool:
    """Whether every stream of ``names`` holds a lease on its row (its next lines are taken by row)."""
    slots = np.array([d._names.slot(n.encode()) for n in names], dtype=np.int64)
    return bool((d._slot_rows.of(slots, d.router.leases) >= 0).all())


def test_lines_of_release_rows_are_taken_by_row_and_release_what_each_stream_releases(tmp_path: Path) -> None:
    for template in (PUBLIC, HELD):
        d, text = _daemon(tmp_path, template)
        rng = np.random.default_rng(1)
        want: dict[str, list[float]] = {}
        for r in range(12):
            d.on_lines(_round("abcdef" * 3 if r % 2 else "fedcba", rng, want))
        assert _taken_by_row(d, "abcdef")
        got = _releases(text)
        for name, values in want.items():
            assert got[name] == own_releases(d, tmp_path / "k", name, values), name
            assert d.router.streams[name].ticks == len(values)
        assert d.msg_counts["ok"] == sum(map(len, want.values()))


def test_a_stream_that_fails_while_its_row_holds_a_lease_takes_no_more_readings(tmp_path: Path) -> None:
    """Without the lease ended at the failure, the failed stream's lines would still be released by row."""
    d, text = _daemon(tmp_path, PUBLIC)
    rng = np.random.default_rng(2)
    want: dict[str, list[float]] = {}
    for _ in range(3):
        d.on_lines(_round("ab", rng, want))
    assert _taken_by_row(d, "ab")
    b = d.router.streams["b"]
    d.router.fail(b, "a test")
    ok, failed = d.msg_counts["ok"], d.msg_counts["failed"]
    d.on_lines(_round("ab" * 10, rng, {}))
    assert d.msg_counts["failed"] - failed == 10 and d.msg_counts["ok"] - ok == 10
    assert b.ticks == 3 and len(_releases(text)["b"]) == 3


def test_a_row_that_passes_to_another_stream_never_takes_the_former_streams_lines(tmp_path: Path) -> None:
    """``a`` leaves memory and ``c`` gets its row: ``a``'s next lines must make ``a`` anew, not go into ``c``'s row
    under the lease ``a`` held (``c``'s releases would then hold ``a``'s readings)."""
    d, text = _daemon(tmp_path, PUBLIC)
    rng = np.random.default_rng(3)
    want: dict[str, list[float]] = {}
    for _ in range(3):
        d.on_lines(_round("ab", rng, want))
    row_of_a = d.router.streams["a"].operator.row
    assert _taken_by_row(d, "ab")
    assert d.router.evict(["a"]) == 1
    d.on_lines(_round("c", rng, want))
    assert d.router.streams["c"].operator.row == row_of_a  # the freed row, reused
    later: dict[str, list[float]] = {}
    for _ in range(4):
        d.on_lines(_round("acb", rng, later))
    got = _releases(text, made_anew="a")
    assert got["c"] == own_releases(d, tmp_path / "k", "c", want["c"] + later["c"])
    assert got["b"] == own_releases(d, tmp_path / "k", "b", want["b"] + later["b"])
    assert d.router.streams["a"].ticks == 4  # made anew (no durable state): its own readings only
    assert d.router.streams["c"].ticks == 5


def test_readings_waiting_for_the_step_go_before_lines_taken_by_row(tmp_path: Path) -> None:
    """Chunks that mix full-decode lines (JSON with a seq) into plain lines of streams taken by row, and plain
    chunks between them: each stream's releases stay in its order."""
    d, text = _daemon(tmp_path, HELD)
    rng = np.random.default_rng(4)
    want: dict[str, list[float]] = {}
    for r in range(16):
        chunk = []
        for i in range(12):
            name, v = "abc"[i % 3], float(rng.integers(0, 20))
            want.setdefault(name, []).append(v)
            if r % 3 == 2 and i % 4 == 1:
                chunk.append(json.dumps({"stream": name, "value": v, "seq": 100 * r + i}).encode())
            else:
                chunk.append(f"{name},{v:g}".encode())
        d.on_lines(chunk)
    assert _taken_by_row(d, "abc")
    got = _releases(text)
    for name, values in want.items():
        assert got[name] == own_releases(d, tmp_path / "k", name, values), name


def test_with_durable_state_every_reading_taken_by_row_is_in_the_journal(tmp_path: Path) -> None:
    """What a restart replays: every reading a stream took by row, in its order."""
    d, _ = _daemon(tmp_path, PUBLIC, str(tmp_path / "state"))
    rng = np.random.default_rng(5)
    want: dict[str, list[float]] = {}
    for _ in range(6):
        d.on_lines(_round("abcd", rng, want))
    assert _taken_by_row(d, "abcd")
    journal = d.durable.journal
    journal.sync(fsync=False)
    journal.rotate(fsync=False)
    taken: dict[str, list[float]] = {}
    for rec in journal.replay(0):
        taken.setdefault(rec.stream, []).append(rec.value)
    assert taken == want


def test_a_lease_ends_when_its_stream_has_readings_waiting_and_is_granted_again_after_the_step(tmp_path: Path) -> None:
    """A reading that waits for the step (one that came another way: a message with a seq) must go before any later
    reading, so the row may not be taken by row until the step took it."""
    d, _ = _daemon(tmp_path, PUBLIC)
    d.on_lines([b"a,1", b"a,2"])
    d.on_lines([b"a,3"])
    assert _taken_by_row(d, "a")
    rec = d.router.streams["a"]
    assert d.intake.add(rec, 4.0, None, 7, 0.0) == "ok" and rec.pending == [4.0]
    assert not _taken_by_row(d, "a")
    d.safe_step()
    d.on_lines([b"a,5"])
    d.on_lines([b"a,6"])
    assert _taken_by_row(d, "a") and rec.ticks == 6

"""The ``stream,value`` lines of a stdin chunk are routed together (``Router.add_values``), a new stream's first line
too (its record made on the way, ``Daemon.first_line_of_new_stream``); every other line, one at a time. The attacks: a
chunk that mixes both kinds for one stream must keep that stream's order (a batch taken after the other lines would
reorder its readings), a failed stream's lines inside a batch are refused and counted, a local holdout's plain lines
still go to its reports, a batch whose routing raises fails its own streams only, and a new stream's line that is not
a clean ``stream,value`` (a bad name, a bad value, space around the name, past the stream cap, a stored stream that
cannot be restored) is decided and counted exactly as one line at a time decides it."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from stream.core.config import build_config
from stream.daemon import service as daemon_mod
from tests.support import own_releases, release_lines

TPL = {"epsilon": 1.0, "bound": 20.0, "holdout": 6, "fanout": 2, "query_range": 64}


def _daemon(tmp_path: Path, template: dict | None = None, **streams: object) -> tuple[daemon_mod.Daemon, io.StringIO]:
    cfg = build_config({"metrics": {"port": 0}, "state": {"data_dir": ""}, "input": {"source": "stdin"},
                        "streams": {"key_file": str(tmp_path / "k"), "template": template or TPL, **streams}})
    out = io.StringIO()
    d = daemon_mod.Daemon(cfg, stdin=io.BytesIO(b""), stdout=out, install_signals=False)
    d.startup()
    return d, out


def _releases(text: io.StringIO) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for r in release_lines(text.getvalue()):
        out.setdefault(r["stream"], {})[r["tick"]] = r["value"]
    return out


def test_a_chunk_that_mixes_plain_and_other_lines_keeps_each_streams_order(tmp_path: Path) -> None:
    d, text = _daemon(tmp_path)
    rng = np.random.default_rng(5)
    want: dict[str, list[float]] = {"a": [], "b": [], "c": []}
    chunks = []
    for r in range(4):
        chunk = []
        for i in range(40):
            v = float(rng.integers(0, 20))
            name = "abc"[i % 3] if r or i > 20 else "ab"[i % 2]  # c is first seen inside a chunk
            if i % 7 == 3:  # a line that is not ``stream,value``: JSON with a seq, between plain lines of its stream
                chunk.append(json.dumps({"stream": name, "value": v, "seq": 1000 * r + i}).encode())
            elif i % 11 == 5:
                chunk.append(f"{name},inf".encode())  # not a reading (invalid): the others go on
                continue
            else:
                chunk.append(f"{name},{v:g}".encode())
            want[name].append(v)
        chunks.append(chunk)
    for chunk in chunks:
        d.on_lines(chunk)
    got = _releases(text)
    for name, values in want.items():
        assert len(values) > TPL["holdout"] + 10
        assert got[name] == own_releases(d, tmp_path / "k", name, values), name
    assert d.msg_counts["ok"] == sum(map(len, want.values()))
    assert d.msg_counts["invalid"] == sum(line.endswith(b",inf") for c in chunks for line in c) > 5


def test_a_failed_streams_plain_lines_are_refused_and_the_others_go_on(tmp_path: Path) -> None:
    d, _ = _daemon(tmp_path)
    d.on_lines([b"a,1", b"b,2"])
    d.router.fail(d.router.streams["b"], "a test")
    ok, failed = d.msg_counts["ok"], d.msg_counts["failed"]
    d.on_lines([f"{'ab'[i % 2]},{i % 20}".encode() for i in range(30)])
    assert d.msg_counts["failed"] - failed == 15 and d.msg_counts["ok"] - ok == 15
    assert d.router.streams["a"].ticks == 16 and d.router.streams["b"].ticks == 1
    assert d.router.streams["b"].pending is None


def test_a_local_holdouts_plain_lines_are_reports_not_ticks(tmp_path: Path) -> None:
    """Local mode on stdin: a ``stream,value`` line of a stream in its threshold phase is a device's report, which the
    threshold estimate observes (``Router.add`` sends it there); routed as a plain reading it would become a tick."""
    cfg = build_config({"metrics": {"port": 0}, "state": {"data_dir": ""}, "input": {"source": "stdin"},
                        "streams": {"key_file": str(tmp_path / "k"), "mode": "local",
                                    "template": {"epsilon": 1.0, "bound": 20.0, "holdout": 200}},
                        "local": {"streams": ["zone"]}})
    d = daemon_mod.Daemon(cfg, stdin=io.BytesIO(b""), stdout=io.StringIO(), install_signals=False)
    d.startup()
    d.on_lines([b"zone,0.5"])
    rec = d.router.streams["zone"]
    left = rec.operator.holdout_left
    d.on_lines([f"zone,{(i % 10) / 10}".encode() for i in range(60)])
    assert rec.operator.holdout_left == left - 60 and rec.ticks == 0 and rec.phase == "holdout"
    assert d.msg_counts["ok"] == 61


class _BatchBug:
    """An intake whose batch path raises while ``broken`` is set (a bug injected at construction)."""

    def __init__(self, inner: object) -> None:
        self.inner, self.broken = inner, False
        self.add, self.add_many = inner.add, inner.add_many

    def add_values(self, recs: list, values: list[float], now: float) -> list[int]:
        if self.broken:
            raise RuntimeError("injected")
        return self.inner.add_values(recs, values, now)


class _DaemonWithBatchBug(daemon_mod.Daemon):
    def intake_of(self, router: object) -> _BatchBug:
        return _BatchBug(super().intake_of(router))


def test_a_batch_whose_routing_raises_fails_its_streams_and_the_daemon_goes_on(tmp_path: Path) -> None:
    """The attack (a bug injected into the batch path): the streams of the batch are failed and its lines counted
    ``failed``, as a line whose handling raises is; the daemon does not stop, and the next chunk's streams go on."""
    cfg = build_config({"metrics": {"port": 0}, "state": {"data_dir": ""}, "input": {"source": "stdin"},
                        "streams": {"key_file": str(tmp_path / "k"), "template": TPL}})
    text = io.StringIO()
    d = _DaemonWithBatchBug(cfg, stdin=io.BytesIO(b""), stdout=text, install_signals=False)
    d.startup()
    d.on_lines([b"a,1", b"b,2", b"c,3"])
    d.intake.broken = True
    failed = d.msg_counts["failed"]
    d.on_lines([b"a,1", b"b,2", b"a,3"])
    assert d.msg_counts["failed"] - failed == 3
    assert d.router.streams["a"].failed and d.router.streams["b"].failed and not d.router.streams["c"].failed
    d.intake.broken = False
    d.on_lines([f"c,{i % 20}".encode() for i in range(20)])
    assert d.router.streams["c"].ticks == 21 and len(_releases(text)["c"]) == 21 - TPL["holdout"]


def _hostile_new_lines() -> list[list[bytes]]:
    """Chunks of new streams' ``stream,value`` lines mixed with every way such a line can be wrong."""
    bad = [b"a/b,1", b"+,2", b"x#,3", b"\xff\xfe,4", b"n" * 129 + b",5", b"m9,nan", b"m9,1e999", b"m10,abc",
           b" m11 ,3", b"m12 ,4", b"\tm13,5", b",6", b"m14,", b"{m15,1", b"[m16,2", b"m17,3,", b"caf\xc3\xa9,7"]
    rng = np.random.default_rng(13)
    chunks = []
    for r in range(3):
        chunk = [f"s{r}-{i},{int(rng.integers(0, 20))}".encode() for i in range(12)]
        for j, line in enumerate(bad):
            chunk.insert(int(rng.integers(0, len(chunk) + 1)), line)
            chunk.append(f"s{r}-{j % 12},{int(rng.integers(0, 20))}".encode())  # a second reading: now a known line
        chunk += [f"s{r}-{i % 12},{int(rng.integers(0, 20))}".encode() for i in range(96)]  # past the holdout
        chunks.append(chunk)
    return chunks


PUBLIC_THETA = {"epsilon": 1.0, "bound": 20.0, "theta": 10.0, "fanout": 2, "query_range": 64}


@pytest.mark.parametrize("template", [TPL, {**TPL, "holdout": 3}, {**TPL, "holdout": 3, "holdout_grid": "compact"},
                                      PUBLIC_THETA], ids=["operators", "exact rows", "compact rows", "release rows"])
def test_new_streams_first_lines_are_decided_as_one_line_at_a_time_decides_them(tmp_path: Path, monkeypatch,
                                                                                template: dict) -> None:
    """Three daemons on one key file and one identity, the same hostile chunks (and a stream cap that the chunks
    cross): one takes a new stream's line with the chunk's plain lines, its record made with the chunk's other new
    streams' where they are holdout rows or release rows (``make_new_streams``), one makes each record as its line
    is met, the third goes line by line (``first_line_of_new_stream`` off). The same streams (in their order, with
    their identity), counts, rejections and releases."""
    runs = []
    # new streams are holdout rows (operators.columnar_holdout.born_in_rows) or release rows (a public theta)
    together = template.get("holdout") == 3 or "theta" in template
    for mode in ("together", "one by one", "line by line"):
        d, text = _daemon(tmp_path, template, max_streams=40)
        d.identity = "0" * 32
        made = []
        if mode == "together":
            assert d.new_streams_in_bulk() == together
            real = d.make_new_streams
            monkeypatch.setattr(d, "make_new_streams",
                                lambda names, real=real, made=made: made.append(names) or real(names))
        elif mode == "one by one":  # each new stream's record made as its line is met (Daemon.first_line_of_new_stream)
            monkeypatch.setattr(d, "new_streams_in_bulk", lambda: False)
        else:
            monkeypatch.setattr(d, "first_line_of_new_stream", lambda raw, value, now, born: None)
        for chunk in _hostile_new_lines():
            d.on_lines(chunk)
        if mode == "together" and together:  # the new streams were made together, between the other lines
            together_made = [name for names in made for name in names]  # all but those of lines take_line decides
            assert together_made == [n for n in d.router.streams if n[0] == "s" or n == "café"]
            assert max(map(len, made)) > 1
        runs.append((list(d.router.streams), dict(d.msg_counts), d.cap_readings, dict(d.router.counts),
                     _releases(text), d.router.in_holdout,
                     [(r.name_json, r.phase, r.identity, r.ticks) for r in d.router.streams.values()]))
    assert runs[0] == runs[1] == runs[2]
    streams, counts, cap, _, releases, *_ = runs[0]
    assert "café" in streams and "m11" in streams and "m12" in streams  # a valid name, and names stripped of space
    assert not any(n in streams for n in ("a/b", "+", "x#", "m9", "m10", "m14", "n" * 129))
    assert len(streams) == 40 and cap > 0 and counts["invalid"] >= 24 and releases



def test_new_streams_whose_making_raises_fail_their_lines_and_the_others_go_on(tmp_path: Path, monkeypatch) -> None:
    """The attack (a bug injected where a chunk's new streams are made together): their lines are counted ``failed``,
    as a line whose handling raises is, no such stream is left half made, the known streams' lines of the same chunk
    are taken, and the next chunk's new streams are made."""
    d, text = _daemon(tmp_path, {**TPL, "holdout": 3})
    d.on_lines([b"k,1", b"k,2"])
    real = d.make_new_streams

    def broken(names):
        raise RuntimeError("injected")

    monkeypatch.setattr(d, "make_new_streams", broken)
    ok, failed = d.msg_counts["ok"], d.msg_counts["failed"]
    d.on_lines([b"n1,1", b"k,3", b"n2,2", b"n1,3", b"k,4"])
    assert d.msg_counts["failed"] - failed == 3 and d.msg_counts["ok"] - ok == 2
    assert set(d.router.streams) == {"k"} and d.router.streams["k"].ticks == 4
    monkeypatch.setattr(d, "make_new_streams", real)
    d.on_lines([b"n1,5", b"n1,6", b"n1,7", b"n1,8"])
    assert d.router.streams["n1"].ticks == 4 and len(_releases(text)["n1"]) == 1

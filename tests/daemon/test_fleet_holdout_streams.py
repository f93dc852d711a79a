"""A template with ``holdout_scope = "fleet"``: the first ``holdout`` readings of its streams, in their order of
arrival, choose one threshold for all of them; a stream that appears after the choice releases from its first
reading, and the streams whose readings the fleet holdout took release from their next one.

The attacks: chunks that interleave the streams (a fleet that took each stream's pending readings together, per
stream, would hold other readings than the ones that arrived first, and its choice would depend on how stdin was cut
into chunks); a reading that is both held and released, or neither; a new stream refused for the fleet's sake; the
same input cut differently; and configurations the fleet does not run, refused in one line each."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np
import pytest

from stream.core.config import build_config
from stream.core.errors import ConfigFileError
from stream.daemon import service as daemon_mod
from tests.support import FLEET_TEMPLATE, fleet_releases, identity_from_log, release_lines, tops_text, write_toml

TPL = FLEET_TEMPLATE


def _doc(tmp: Path, **template: object) -> dict:
    return {"metrics": {"port": 0}, "state": {"data_dir": ""}, "input": {"source": "stdin"},
            "output": {"sinks": ["stdout"]},
            "streams": {"key_file": str(tmp / "master.key"), "template": {**TPL, **template}}}


def _daemon(tmp: Path, **template: object) -> tuple[daemon_mod.Daemon, io.StringIO]:
    out = io.StringIO()
    d = daemon_mod.Daemon(build_config(_doc(tmp, **template)), stdin=io.BytesIO(b""), stdout=out,
                          install_signals=False)
    d.startup()
    return d, out


def _by_stream(text: str) -> dict[str, dict[int, float]]:
    got: dict[str, dict[int, float]] = {}
    for r in release_lines(text):
        assert r["tick"] not in got.setdefault(r["stream"], {}), r  # one release per tick
        got[r["stream"]][r["tick"]] = r["value"]
    return got


def _interleaved(rng: np.random.Generator, streams: int, rounds: int) -> list[tuple[str, float]]:
    return [(f"meter-{i}", float(rng.integers(0, 50))) for _ in range(rounds) for i in range(streams)]


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000], ids=["by-line", "7", "64", "one-chunk"])
def test_the_fleet_takes_the_first_readings_in_arrival_order_whatever_the_chunks(tmp_path: Path, chunk: int) -> None:
    """Eight streams, interleaved; the holdout fills in the middle of a chunk. Every stream's releases are those of the
    fleet's operators on the lines in their order: the same for every cut of the input into chunks."""
    lines = _interleaved(np.random.default_rng(1), 8, 12)
    d, out = _daemon(tmp_path)
    encoded = [f"{n},{v:g}".encode() for n, v in lines]
    for i in range(0, len(encoded), chunk):
        d.on_lines(encoded[i:i + chunk])
    got = _by_stream(out.getvalue())
    assert got == fleet_releases(tmp_path / "master.key", d.identity, {}, lines)
    released = sum(map(len, got.values()))
    assert released == len(lines) - TPL["holdout"]  # each reading held once or released once
    assert d.fleet is not None and d.fleet.choice is not None
    assert {rec.operator.theta for rec in d.router.streams.values()} == {d.fleet.choice.theta_units * 1.0}


def test_a_stream_that_appears_after_the_choice_releases_its_first_reading(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    lines = _interleaved(rng, 5, 8)  # 40 readings: the holdout, exactly
    d, out = _daemon(tmp_path)
    d.on_lines([f"{n},{v:g}".encode() for n, v in lines])
    assert d.fleet.choice is not None and not release_lines(out.getvalue())  # nothing released yet
    late = [("late-meter", 7.0), ("meter-0", 3.0), ("late-meter", 9.0)]
    d.on_lines([f"{n},{v:g}".encode() for n, v in late])
    got = _by_stream(out.getvalue())
    assert sorted(got["late-meter"]) == [0, 1] and sorted(got["meter-0"]) == [8]  # its 8 readings before: held
    assert got == fleet_releases(tmp_path / "master.key", d.identity, {}, lines + late)
    statuses = [json.loads(x) for x in out.getvalue().splitlines() if '"phase"' in x]
    late_status = next(s for s in statuses if s["stream"] == "late-meter")
    assert late_status["phase"] == "releasing" and late_status["params"]["holdout_scope"] == "fleet"
    assert late_status["theta"] == d.fleet.choice.theta_units
    assert late_status["params"]["truncation"] is not None  # the fleet's error statistics, stated by every stream


def test_a_stream_in_the_fleet_holdout_says_so_and_counts_the_fleets_readings(tmp_path: Path) -> None:
    d, _ = _daemon(tmp_path)
    d.on_lines([b"a,1", b"b,2", b"a,3"])
    status = d.router.streams["a"].status()
    assert status["phase"] == "holdout" and status["holdout_scope"] == "fleet"
    assert status["holdout_left"] == TPL["holdout"] - 3 == d.router.streams["b"].status()["holdout_left"]
    assert d.msg_counts["ok"] == 3


def test_json_lines_with_seq_and_bad_lines_around_the_fleet(tmp_path: Path) -> None:
    """Readings with a seq (a duplicate is refused, not held twice) and invalid lines between them: the fleet holds
    each accepted reading once, the bad ones are counted and never reach it."""
    d, out = _daemon(tmp_path)
    lines = []
    accepted = []
    for i in range(60):
        name = f"s{i % 3}"
        lines.append(json.dumps({"stream": name, "value": i % 50, "seq": i}).encode())
        accepted.append((name, float(i % 50)))
        if i % 9 == 4:
            lines.append(json.dumps({"stream": name, "value": 1, "seq": i}).encode())  # the same seq again
            lines.append(f"{name},nan".encode())
    d.on_lines(lines)
    assert d.router.counts["duplicate"] == 7 and d.msg_counts["invalid"] == 7
    assert _by_stream(out.getvalue()) == fleet_releases(tmp_path / "master.key", d.identity, {}, accepted)


@pytest.mark.parametrize(("sections", "line"), [
    ({"streams": {"mode": "local", "template": {"holdout_scope": "fleet"}}, "local": {"streams": ["z"]}},
     'holdout_scope = "fleet" is for numeric central ToPS streams'),
    ({"streams": {"method": "h16c", "template": {"holdout_scope": "fleet"}}},
     'holdout_scope = "fleet" is for numeric central ToPS streams'),
    ({"streams": {"template": {"theta": 10.0, "holdout": 0}}}, "holdout_scope must be"),
], ids=["local", "baseline", "public-theta"])
def test_what_the_fleet_does_not_run_is_refused_in_one_line(tmp_path: Path, sections: dict, line: str) -> None:
    doc = _doc(tmp_path)
    for name, values in sections.items():
        for k, v in values.items():
            if isinstance(v, dict):
                doc[name].setdefault(k, {}).update(v)
            else:
                doc.setdefault(name, {})[k] = v
    with pytest.raises(ConfigFileError) as exc:
        build_config(doc)
    assert len([p for p in exc.value.problems if "holdout_scope" in p]) == 1, exc.value.problems
    assert any(line in p for p in exc.value.problems), exc.value.problems
    rc = tops_text("run", "--check", "--config", write_toml(tmp_path / "tops.toml", doc), timeout=60)
    assert rc.returncode == 2 and "Traceback" not in rc.stderr and line in rc.stderr


def test_tops_run_on_stdin_releases_a_fleet_as_its_operators_do(tmp_path: Path) -> None:
    """The whole process: `tops run` on a pipe, 30 streams of 10 readings and 5 latecomers, one identity; the output is
    the fleet's operators' on the same lines, and the holdout took exactly its ``holdout`` readings."""
    rng = np.random.default_rng(3)
    lines = _interleaved(rng, 30, 10) + [(f"new-{i}", float(rng.integers(0, 50))) for i in range(5)]
    cfg = write_toml(tmp_path / "tops.toml", _doc(tmp_path, holdout=100))
    r = tops_text("run", "--config", cfg, stdin="".join(f"{n},{v:g}\n" for n, v in lines), timeout=120)
    assert r.returncode == 0, r.stderr
    got = _by_stream(r.stdout)
    want = fleet_releases(tmp_path / "master.key", identity_from_log(r.stderr), {"holdout": 100}, lines)
    assert got == want
    assert sum(map(len, got.values())) == len(lines) - 100
    assert all(got[f"new-{i}"] == want[f"new-{i}"] and 0 in got[f"new-{i}"] for i in range(5))
    data = tmp_path / "fleet.csv"
    data.write_text("".join(f"{n},{v:g}\n" for n, v in lines))
    identity = identity_from_log(r.stderr)
    for name in ("meter-4", "new-2"):
        out = tmp_path / f"{name}.npy"
        rep = tops_text("replay", data, "--holdout-scope", "fleet", "--key-file", tmp_path / "master.key",
                        "--identity", identity, "--stream", name, "--epsilon", 1, "--bound", 50, "--holdout", 100,
                        "--fanout", 2, "--range", 64, "--out", out, timeout=120)
        assert rep.returncode == 0, rep.stderr
        replayed = np.load(out)
        assert {t: float(v) for t, v in enumerate(replayed) if not np.isnan(v)} == got[name]


def test_replaying_a_fleet_needs_the_daemons_keys_and_a_fleets_file(tmp_path: Path) -> None:
    """Without --key-file the fleet's key is unknown; a file whose lines name no stream is not a fleet's: one line
    each, exit 2, never a traceback."""
    named = tmp_path / "fleet.csv"
    named.write_text("a,1\nb,2\n")
    bare = tmp_path / "bare.csv"
    bare.write_text("1\n2\n")
    (tmp_path / "master.key").write_text("ab" * 32 + "\n")
    (tmp_path / "master.key").chmod(0o600)
    common = ("--holdout-scope", "fleet", "--epsilon", 1, "--bound", 50, "--holdout", 1, "--out", tmp_path / "o.npy")
    keys = ("--key-file", tmp_path / "master.key", "--identity", "0" * 32, "--stream", "a")
    for args, says in (((named, "--stream", "a"), "needs --key-file"), ((bare, *keys), "names no stream"),
                       ((named, *keys[:-1], "zz"), "no stream 'zz'")):
        r = tops_text("replay", *args, *common, timeout=60)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and says in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_with_period_ticks_the_fleet_takes_period_values_when_they_close(tmp_path: Path) -> None:
    """A tick is a period's sum: readings are binned (the fleet takes none at intake), and the periods' values reach
    the fleet holdout when the periods close, in the order of the streams' names within each period."""
    doc = _doc(tmp_path, holdout=6)
    doc["ticks"] = {"mode": "period", "period": 60.0}
    out = io.StringIO()
    d = daemon_mod.Daemon(build_config(doc), stdin=io.BytesIO(b""), stdout=out, install_signals=False)
    d.startup()
    d.on_lines([f"m{i % 4},{i % 7}".encode() for i in range(40)])
    assert d.fleet.taken == 0 and all(r.phase == "holdout" for r in d.router.streams.values())
    now = time.time()
    d.emit(d.router.close_periods(now + 60.0))  # this period closes: one value a stream (4 of the 6)
    assert d.fleet.taken == 4 and d.fleet.choice is None
    d.emit(d.router.close_periods(now + 180.0))  # two more: the holdout fills, the rest is released
    assert d.fleet.choice is not None
    got = _by_stream(out.getvalue())
    assert sorted(got) == ["m0", "m1", "m2", "m3"] and sum(map(len, got.values())) == 12 - 6
    assert {r.operator.theta for r in d.router.streams.values()} == {float(d.fleet.choice.theta_units)}


def test_tops_query_reads_a_fleet_streams_intervals_from_where_its_hierarchy_starts(tmp_path: Path) -> None:
    """A fleet stream's hierarchy starts at its first release, not at the template's ``holdout``: its status states
    ``released_from``, and `tops query` places its error model there. Read from ``holdout`` (the fleet's m), a range
    would be refused, or its noise put in the wrong tree nodes. 40 streams, 95 % intervals: at least 32 hold the
    true sum (a correct model misses 9 or more with probability below 1e-4)."""
    rng = np.random.default_rng(8)
    lines = _interleaved(rng, 40, 120)
    cfg = write_toml(tmp_path / "tops.toml", _doc(tmp_path, holdout=200, query_range=4096, fanout=16))
    r = tops_text("run", "--config", cfg, stdin="".join(f"{n},{v:g}\n" for n, v in lines), timeout=120)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out.jsonl"
    out.write_text(r.stdout)
    starts = {s["stream"]: s["params"]["released_from"] for s in map(json.loads, r.stdout.splitlines())
              if s.get("phase") == "releasing"}
    firsts = {n: min(t) for n, t in _by_stream(r.stdout).items()}
    assert starts == firsts and set(starts.values()) == {5}  # 200 readings of 40 streams: 5 each
    held = 0
    for i in range(40):
        name = f"meter-{i}"
        truth = sum(v for k, (_, v) in enumerate(x for x in lines if x[0] == name) if 20 <= k <= 119)
        q = tops_text("query", out, "--stream", name, "--from", "20", "--to", "119", "--json", timeout=60)
        assert q.returncode == 0, q.stderr
        row = json.loads(q.stdout)
        held += row["low"] <= truth <= row["high"]
    assert held >= 32, held

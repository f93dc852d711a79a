"""A fleet holdout with durable state: the holdout, its choice and each stream's share of it continue across
restarts and kill -9, and the releases are those of one uninterrupted run of the same readings.

The attacks: a restart in the middle of the fleet holdout (the holdout as stored by the last checkpoint, in the same
transaction as its streams); kill -9 right after the choice, before any checkpoint holds it (the journal alone must
bring the holdout, the choice and the streams back, in the readings' order); a stream that was in the holdout and
comes back only after the choice (restored from its stored share, it releases from its next reading with its tick
count); and a stored fleet holdout that does not fit the configuration (one line, no traceback)."""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

import numpy as np

from tests.support import (
    FLEET_TEMPLATE,
    StdinRun,
    fleet_releases,
    identity_from_log,
    release_lines,
    tops,
    wait_for,
    write_toml,
)

TPL = FLEET_TEMPLATE


def _config(tmp: Path, **template: object) -> Path:
    return write_toml(tmp / "tops.toml", {
        "input": {"source": "stdin"}, "output": {"sinks": ["stdout"]}, "metrics": {"port": 0},
        "streams": {"key_file": str(tmp / "master.key"), "template": {**TPL, **template}},
        "state": {"data_dir": str(tmp / "state")}})


def _text(lines: list[tuple[str, float]]) -> bytes:
    return b"".join(f"{n},{v:g}\n".encode() for n, v in lines)


def _collect(got: dict[str, dict[int, float]], releases: list[dict]) -> None:
    """Releases by stream and tick; a tick released again (after kill -9) must carry the same value."""
    for r in releases:
        seen = got.setdefault(r["stream"], {})
        assert seen.setdefault(r["tick"], r["value"]) == r["value"], r


def test_restarts_and_kill9_around_the_fleet_choice_release_what_one_run_releases(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    streams = [f"m{i}" for i in range(6)]
    feed = [(s, float(rng.integers(0, 50))) for _ in range(14) for s in streams]
    part1 = feed[:25]  # the fleet holdout (40) is not full: stored mid-holdout by the last checkpoint
    part2 = [x for x in feed[25:52] if x[0] != "m5"]  # it fills at reading 40, then releases; killed before any
    # checkpoint
    # m5 sends nothing after part 1: it comes back in part 3, after the choice, from its stored share
    part3 = [x for x in feed[52:] if x[0] != "m5"] + [("m5", 7.0), ("m5", 9.0), ("late", 3.0)]
    cfg = _config(tmp_path)
    got: dict[str, dict[int, float]] = {}
    r = tops("run", "--config", str(cfg), stdin=_text(part1))
    assert r.returncode == 0, r.stderr.decode()
    assert not release_lines(r.stdout)
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    stored = json.loads(db.execute("SELECT value FROM meta WHERE key = 'fleet_holdout'").fetchone()[0])
    db.close()
    assert stored["choice"] is None and stored["holdout"]["ticks"] == 25
    shown = tops("state", "--data-dir", str(tmp_path / "state")).stdout.decode()
    assert "fleet holdout (generation 1): 25 of 40 readings taken, no theta yet" in shown, shown
    run = StdinRun(cfg, tmp_path / "run2.log")
    run.proc.stdin.write(_text(part2))
    run.proc.stdin.flush()
    last = part2[-1][0]
    # the last line's release is out: every line before it is in the journal (releases wait for the sync)
    wait_for(lambda: any(x["stream"] == last for x in run.releases), what="a release of the last line")
    run.proc.send_signal(signal.SIGKILL)
    run.proc.wait(timeout=30)
    _collect(got, run.releases)
    r = tops("run", "--config", str(cfg), stdin=_text(part3))
    err = r.stderr.decode()
    assert r.returncode == 0 and "Traceback" not in err, err
    _collect(got, release_lines(r.stdout))
    want = fleet_releases(tmp_path / "master.key", identity_from_log(err), {}, part1 + part2 + part3)
    assert got == want
    theta = next(iter(release_lines(r.stdout)))["theta"]
    shown = tops("state", "--data-dir", str(tmp_path / "state")).stdout.decode()
    assert f"fleet holdout (generation 1): theta {theta:g}, chosen from 40 readings" in shown, shown
    assert sum(map(len, got.values())) == len(part1 + part2 + part3) - TPL["holdout"]
    assert sorted(got["m5"]) == [4, 5] and min(got["late"]) == 0  # m5's first 4 readings were the fleet's
    # each stream's status states where its hierarchy starts, kept across the kill and the restarts
    statuses = [json.loads(x) for x in r.stdout.decode().splitlines() if '"phase":"releasing"' in x]
    assert statuses and all(s["params"]["released_from"] == min(got[s["stream"]]) for s in statuses), \
        [(s["stream"], s["params"]["released_from"], min(got[s["stream"]])) for s in statuses]


def test_a_stored_fleet_holdout_that_does_not_fit_stops_the_start_in_one_line(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    r = tops("run", "--config", str(cfg), stdin=b"a,1\nb,2\n")
    assert r.returncode == 0, r.stderr.decode()
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    db.execute("UPDATE meta SET value = ? WHERE key = 'fleet_holdout'", (json.dumps({"version": 7}),))
    db.commit()
    db.close()
    r = tops("run", "--config", str(cfg), stdin=b"a,1\n")
    err = r.stderr.decode()
    lines = [x for x in err.splitlines() if "fleet holdout" in x]
    assert r.returncode == 2 and "Traceback" not in err and len(lines) == 1, err


def test_a_new_fleet_generation_chooses_again_from_new_readings_only(tmp_path: Path) -> None:
    """``fleet_generation`` raised: without ``--new-generation-all`` the start stops with one line per stream; with
    it, every stream starts its next generation (a new key, ticks from 0), the next ``holdout`` readings form the new
    fleet holdout (none of them released, none of the first generation's readings in it), and the releases are the
    new generation's operators' on the new readings."""
    rng = np.random.default_rng(12)
    streams = [f"m{i}" for i in range(6)]
    first = [(s, float(rng.integers(0, 50))) for _ in range(10) for s in streams]
    second = [(s, float(rng.integers(0, 50))) for _ in range(12) for s in streams]
    r = tops("run", "--config", str(_config(tmp_path)), stdin=_text(first))
    assert r.returncode == 0, r.stderr.decode()
    cfg2 = _config(tmp_path, fleet_generation=2)
    r = tops("run", "--config", str(cfg2), stdin=_text(second))
    err = [x for x in r.stderr.decode().splitlines() if x.strip()]
    assert r.returncode == 2 and len(err) == 6 and all("fleet_generation None -> 2" in x and "--new-generation-all" in x
                                                                 for x in err), err
    r = tops("run", "--config", str(cfg2), "--new-generation-all", stdin=_text(second))
    text = r.stderr.decode()
    assert r.returncode == 0 and "fleet holdout generation 2 starts" in text, text
    got: dict[str, dict[int, float]] = {}
    _collect(got, release_lines(r.stdout))
    want = fleet_releases(tmp_path / "master.key", identity_from_log(text), {"fleet_generation": 2}, second,
                          generation=2)
    assert got == want and sum(map(len, got.values())) == len(second) - TPL["holdout"]
    statuses = [json.loads(x) for x in r.stdout.decode().splitlines() if '"phase"' in x]
    assert {s["generation"] for s in statuses} == {2}
    shown = tops("state", "--data-dir", str(tmp_path / "state")).stdout.decode()
    assert "fleet holdout (generation 2): theta" in shown, shown


def test_a_checkpoint_that_failed_leaves_the_fleet_holdout_to_the_next_one(tmp_path: Path, monkeypatch) -> None:
    """The disk refuses one checkpoint after the fleet holdout took readings: the next checkpoint must still write
    the holdout (the streams' states go to the next one too), or a restart would find it older than its streams."""
    import io

    from stream.core.config import build_config
    from stream.daemon.service import Daemon

    cfg = build_config({"input": {"source": "stdin"}, "output": {"sinks": ["stdout"]}, "metrics": {"port": 0},
                        "streams": {"key_file": str(tmp_path / "master.key"), "template": dict(TPL)},
                        "state": {"data_dir": str(tmp_path / "state")}})
    d = Daemon(cfg, stdin=io.BytesIO(b""), stdout=io.StringIO(), install_signals=False)
    d.startup()
    d.on_lines([f"m{i % 4},{i % 9}".encode() for i in range(25)])
    store = d.durable.store
    real = store.commit_checkpoint
    calls = []

    def refuse_once(*args, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise sqlite3.OperationalError("database or disk is full")
        return real(*args, **kw)

    monkeypatch.setattr(store, "commit_checkpoint", refuse_once)
    assert not d.durable.try_checkpoint()
    assert d.durable.try_checkpoint() and len(calls) == 2
    stored = json.loads(store.meta("fleet_holdout"))
    assert stored["taken"] == 25 and stored["holdout"]["ticks"] == 25
    d.shutdown()

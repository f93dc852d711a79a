"""Every command, on any file or parameter a user can hand it, answers or prints one line and exits 2: never a
traceback, never a hang. The attacks of each input (a status message out of range, a field of 400 digits, a NaN
time, 100,000 nested brackets, 2 MB of digits, a huge window) one by one, then a seeded fuzz over the inputs of
``replay``, ``evaluate``, ``query``, ``compare`` and ``state``. The commands run in-process (``stream.cli.main``)
under a watchdog that stops a hang."""

from __future__ import annotations

import io
import json
import random
import re
import warnings
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stream import cli
from tests.support import HOSTILE_SCALARS, HUGE, short_id, watchdog

KEY = "5a" * 32
T0 = 1_767_225_600.0  # 1 January 2026, 00:00 UTC


def run_cli(*argv: object, seconds: int = 60) -> tuple[int, str, str]:
    """``tops ARGV`` in this process: (exit code, stdout, stderr). An exception escaping the command is what the
    user would see as a traceback: it fails the test, as does a hang (stopped after ``seconds``)."""
    out, err = io.StringIO(), io.StringIO()
    with watchdog(seconds), redirect_stdout(out), redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's overflow warnings would be lines on stderr
        try:
            rc = cli.main([str(a) for a in argv])
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


def refused_in_one_line(command: str, rc: int, err: str) -> str:
    """A refusal: exit 2 and exactly one line on stderr, the command's own error line (no usage, no traceback)."""
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1, (rc, err[:2000])
    assert lines[0].startswith(f"tops {command}: error: ") or lines[0].startswith("tops: error: "), lines[0][:300]
    assert len(lines[0]) < 400, lines[0][:400]
    return lines[0]


def releases(ticks: range, stream: str = "s", theta: float = 4.0) -> list[str]:
    return [json.dumps({"stream": stream, "tick": i, "ts": T0 + 60 * i, "value": 1.0, "epsilon": 1.0,
                        "theta": theta}) for i in ticks]


def status(params: dict[str, Any], stream: str = "s") -> str:
    return json.dumps({"stream": stream, "phase": "releasing", "params": params})


@pytest.fixture
def release_file(tmp_path: Path) -> Path:
    p = tmp_path / "rel.jsonl"
    p.write_text("\n".join(releases(range(10, 40))) + "\n")
    return p


# -- tops query: the public parameters ----------------------------------------------------------------------------
HOSTILE_STATUS = [
    ("fanout", 0), ("fanout", 1), ("fanout", -4), ("fanout", 2**40), ("fanout", "x"),
    ("query_range", 0), ("query_range", 1), ("query_range", -256), ("query_range", 2**62),
    ("smoother_layers", 100), ("smoother_layers", 2**40), ("resolution", 0), ("window", 0),
    ("holdout", -5), ("holdout", "x"), ("holdout", 2**40), ("alpha", 7),
]


@pytest.mark.parametrize(("name", "value"), HOSTILE_STATUS)
def test_query_with_a_status_out_of_range_sums_and_says_why_there_is_no_error_bar(
        tmp_path: Path, release_file: Path, name: str, value: Any) -> None:
    """A status line (a retained status message saved, or received live) with a parameter out of range: the sums
    are still answered, the error bar is refused with the parameter's range; no hang (a fanout below 2 never grows a
    tree), no 2 EiB allocation (r = 2^62), no traceback."""
    src = tmp_path / "st.jsonl"
    params = {"holdout": 10, "query_range": 16, "fanout": 4, "smoother": "moving", name: value}
    src.write_text(status(params) + "\n" + release_file.read_text())
    rc, out, err = run_cli("query", src)
    assert rc == 0, err
    assert "sum 30 +- n/a" in out
    assert f"no error bar: {name} must" in err, err


def test_query_refuses_an_error_model_beyond_its_tree_limit(tmp_path: Path, release_file: Path) -> None:
    """A valid stream whose trees have more leaves than the error model walks (r = 2^23, b = 2, s = 0: 2^23 leaves;
    r = 2^32 with s = 0 would ask 32 GiB an array): the sums, and no error bar, with the reason."""
    src = tmp_path / "big.jsonl"
    src.write_text(status({"holdout": 10, "query_range": 1 << 23, "fanout": 2, "smoother_layers": 0}) + "\n"
                   + release_file.read_text())
    rc, out, err = run_cli("query", src)
    assert rc == 0 and "sum 30 +- n/a" in out, err
    assert "no error bar: a tree of 8388608 leaves" in err, err


@pytest.mark.network
@pytest.mark.parametrize("fanout", [0, 1])
def test_query_live_with_a_retained_status_out_of_range_returns(mosquitto, fanout: int) -> None:
    """A retained status on the daemon's topic says fanout 0 or 1 (a tree whose height never grows): listening
    live, the releases are summed and the error bar refused with the range, and the command returns."""
    import subprocess
    import sys

    from tests.support import ROOT, publish

    retained = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(mosquitto.port), "-t", "dp/s/status",
                               "-q", "1", "-r", "-m", status({"holdout": 10, "query_range": 16, "fanout": fanout})],
                              capture_output=True, timeout=60, check=False)
    assert retained.returncode == 0, retained.stderr
    query = subprocess.Popen(
        [sys.executable, "-m", "stream.cli", "query", "--host", "127.0.0.1", "--port", str(mosquitto.port),
         "--releases", "30", "--seconds", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert query.stderr is not None and "listening on" in query.stderr.readline()
        assert publish(mosquitto.port, "dp/s", releases(range(10, 40))).returncode == 0
        out, err = query.communicate(timeout=60)
    finally:
        if query.poll() is None:
            query.kill()
    assert query.returncode == 0, err
    assert "sum 30 +- n/a" in out and "no error bar: fanout must be an integer >= 2" in err, (out, err)


@pytest.mark.parametrize("status_fanout", [0, 1], ids=short_id)
def test_query_a_status_message_and_releases_in_a_json_batch(tmp_path: Path, status_fanout: int) -> None:
    """The same status arriving in a batch (a JSON array) with the releases: the same answer."""
    src = tmp_path / "b.jsonl"
    batch = [json.loads(status({"holdout": 10, "query_range": 16, "fanout": status_fanout}))]
    batch += [json.loads(r) for r in releases(range(10, 20))]
    src.write_text(json.dumps(batch) + "\n")
    rc, out, err = run_cli("query", src)
    assert rc == 0 and "no error bar: fanout must" in err and "sum 10 +- n/a" in out, err


@pytest.mark.parametrize(("option", "value", "name"), [
    ("--range", 0, "query_range"), ("--range", 1, "query_range"), ("--range", 2**62, "query_range"),
    ("--fanout", 0, "fanout"), ("--fanout", 1, "fanout"), ("--fanout", 2**40, "fanout"),
    ("--window", 0, "window"), ("--resolution", 0, "resolution"), ("--resolution", "nan", "resolution"),
    ("--epsilon", 0, "epsilon"), ("--epsilon", "nan", "epsilon"), ("--epsilon", "inf", "epsilon"),
    ("--alpha", "nan", "alpha"), ("--holdout", -3, "holdout"), ("--smoother-layers", 100, "smoother_layers"),
], ids=short_id)
def test_query_refuses_a_parameter_out_of_range_on_the_command_line(release_file: Path, option: str, value: Any,
                                                                    name: str) -> None:
    rc, _, err = run_cli("query", release_file, "--holdout", 10, "--range", 16, "--fanout", 4,
                         "--smoother", "ema", option, value)
    line = refused_in_one_line("query", rc, err)
    assert f"{option}: {name} must" in line, line


def test_query_refuses_a_config_file_out_of_range(tmp_path: Path, release_file: Path) -> None:
    cfg = tmp_path / "tops.toml"
    cfg.write_text("[streams.template]\nepsilon = 1.0\nbound = 10.0\nfanout = 1\n")
    line = refused_in_one_line("query", *run_cli("query", release_file, "--config", cfg)[::2])
    assert "[streams.template] fanout must" in line


@pytest.mark.parametrize("config", ["a = " + "[" * 100_000, "a = 1" + "0" * 5000, "streams = 5",
                                    "[streams]\ntemplate = 5", "\udcff"], ids=short_id)
def test_query_and_state_refuse_a_config_file_they_cannot_read_in_one_line(tmp_path: Path, release_file: Path,
                                                                          config: str) -> None:
    """A TOML file nested 100,000 deep (tomllib recurses), an integer of 5,000 digits, tables that are not tables,
    bytes that are not UTF-8."""
    cfg = tmp_path / "tops.toml"
    cfg.write_bytes(config.encode("utf-8", errors="surrogateescape"))
    refused_in_one_line("query", *run_cli("query", release_file, "--config", cfg)[::2])
    rc, _, err = run_cli("state", "--config", cfg)
    refused_in_one_line("state", rc, err)


# -- tops query: the releases ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [
    '{"stream": "s", "tick": ' + HUGE + ', "value": 1}',
    '{"stream": "s", "tick": 41, "value": ' + HUGE + '}',
    '{"stream": "s", "tick": 41, "value": 1, "ts": ' + HUGE + '}',
    '{"stream": "s", "tick": 41, "value": 1, "epsilon": ' + HUGE + ', "theta": ' + HUGE + '}',
    '{"stream": "s", "tick": ' + str(2**63) + ', "value": 1}',
    '{"stream": "s", "tick": 41, "value": 1, "ts": NaN}',
    '{"stream": "s", "tick": 41, "value": 1, "ts": 1e300}',
    '{"stream": "s", "tick": 41, "value": 1, "ts": -1e300}',
    "[" * 100_000,
    "[" * 100_000 + "]" * 100_000,
    '{"stream": "s", "phase": "releasing", "params": ' + "[" * 100_000 + "}",
    "7" * (2 << 20),
    "\xff\xfe garbage",
], ids=short_id)
@pytest.mark.parametrize("per", [None, "hour", "7"], ids=short_id)
def test_query_skips_a_hostile_line_and_answers_from_the_others(tmp_path: Path, release_file: Path, bad: str,
                                                                per: str | None) -> None:
    """A line with a 400-digit field, a tick beyond 2^63, a NaN or out-of-range time (with --per hour), 100,000
    nested brackets or 2 MB of digits is not a release: counted and skipped, the other lines answered."""
    src = tmp_path / "bad.jsonl"
    src.write_bytes(release_file.read_bytes() + bad.encode("utf-8", errors="surrogateescape") + b"\n")
    rc, out, err = run_cli("query", src, "--holdout", 10, "--range", 16, "--fanout", 4,
                           *(["--per", per] if per else []))
    assert rc == 0, err
    assert "1 lines that are not releases skipped" in err, err
    if per is None:
        assert "ticks 10..39  sum 30 +- " in out and "+- nan" not in out


@pytest.mark.parametrize("content", ["[" * 100_000, "7" * (2 << 20), "", "\x00" * 100], ids=short_id)
def test_query_a_file_of_nothing_but_garbage_is_refused_in_one_line(tmp_path: Path, content: str) -> None:
    src = tmp_path / "g.jsonl"
    src.write_text(content)
    line = refused_in_one_line("query", *run_cli("query", src)[::2])
    assert "no release in the source" in line


@pytest.mark.parametrize("per", [str(10**30), str(2**63), "-5", "0", "nan", "1e30", HUGE], ids=short_id)
def test_query_refuses_a_window_out_of_range(release_file: Path, per: str) -> None:
    line = refused_in_one_line("query", *run_cli("query", release_file, "--per", per)[::2])
    assert "--per must be" in line or "window" in line


def test_query_a_window_as_wide_as_allowed_holds_every_tick(release_file: Path) -> None:
    rc, out, err = run_cli("query", release_file, "--holdout", 10, "--per", 2**62)
    assert rc == 0 and out.count("sum 30 ") == 1, err


@pytest.mark.parametrize(("first", "last"), [(-(10**30), 10**30), (0, 2**63), (2**70, 2**71)], ids=short_id)
def test_query_a_range_beyond_every_tick_is_answered_or_refused_in_one_line(release_file: Path, first: int,
                                                                            last: int) -> None:
    rc, out, err = run_cli("query", release_file, "--holdout", 10, "--from", first, "--to", last)
    if rc:
        refused_in_one_line("query", rc, err)
    else:
        assert "sum 30 " in out or "sum 0 " in out


def test_query_an_ema_error_bar_is_a_number(release_file: Path) -> None:
    """The EMA smoother's bar at a valid alpha is a finite number (``--alpha nan`` is refused: see above)."""
    rc, out, err = run_cli("query", release_file, "--holdout", 10, "--range", 16, "--fanout", 4,
                           "--smoother", "ema", "--alpha", 0.5)
    assert rc == 0 and re.search(r"\+- \d", out), (out, err)


# -- tops replay / evaluate: the stream files ---------------------------------------------------------------------
@pytest.mark.parametrize(("content", "suffix", "word"), [
    ("[" * 100_000, ".jsonl", "nested"),
    ("[" * 100_000 + "]" * 100_000, ".jsonl", "nested"),
    ('{"value": ' + "9" * 5000 + "}", ".jsonl", "digits"),
    ("7" * (2 << 20), ".jsonl", "digits"),
    ('{"value": 1}\n{"value": NaN}', ".jsonl", "finite"),
    ("1\n" + "9" * 5000, ".csv", "finite"),
], ids=short_id)
def test_replay_and_evaluate_refuse_a_hostile_stream_file_in_one_line(tmp_path: Path, content: str, suffix: str,
                                                                      word: str) -> None:
    src = tmp_path / f"in{suffix}"
    src.write_text(content)
    rc, _, err = run_cli("replay", src, "--epsilon", 1, "--bound", 10, "--holdout", 5, "--range", 16, "--fanout", 4,
                         "--key", KEY, "--out", tmp_path / "o.npy")
    assert word in refused_in_one_line("replay", rc, err)
    good = tmp_path / "good.csv"
    good.write_text("1\n" * 20)
    for truth, rel in ((src, good), (good, src)):
        rc, _, err = run_cli("evaluate", truth, rel)
        refused_in_one_line("evaluate", rc, err)


CLAIMS_8_TB = (b"\x93NUMPY\x01\x00\x76\x00{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }"
               + b" " * 60 + b"\n")


@pytest.mark.parametrize("npy", [b"", b"\x93NUMPY", CLAIMS_8_TB], ids=short_id)
def test_replay_and_evaluate_refuse_a_broken_npy_in_one_line(tmp_path: Path, npy: bytes) -> None:
    """An empty .npy, a truncated header, a header that claims 8 TB: refused, nothing allocated."""
    src = tmp_path / "x.npy"
    src.write_bytes(npy)
    rc, _, err = run_cli("replay", src, "--epsilon", 1, "--bound", 10, "--key", KEY, "--out", tmp_path / "o.npy")
    refused_in_one_line("replay", rc, err)
    good = tmp_path / "good.csv"
    good.write_text("1\n" * 20)
    refused_in_one_line("evaluate", *run_cli("evaluate", good, src)[::2])


# -- the small ones ------------------------------------------------------------------------------------------------
def test_an_unknown_option_before_the_command_is_named() -> None:
    rc, _, err = run_cli("--bogus")
    assert rc == 2 and "--bogus" in err and len(err.splitlines()) == 1, err
    rc, _, err = run_cli("--bogus", "replay")
    assert rc == 2 and "--bogus" in err, err


def test_replay_of_a_short_stream_prints_a_rate_that_is_not_zero(tmp_path: Path) -> None:
    src = tmp_path / "s.csv"
    src.write_text("1\n" * 20)
    rc, _, err = run_cli("replay", src, "--epsilon", 1, "--bound", 10, "--holdout", 5, "--range", 16, "--fanout", 4,
                         "--key", KEY, "--out", tmp_path / "o.npy")
    assert rc == 0, err
    rate = re.search(r"([\d.]+) (k |M )?ticks/s", err)
    assert rate and float(rate.group(1)) > 0, err


def test_the_help_of_state_tells_that_retire_writes() -> None:
    rc, out, _ = run_cli("--help")
    entry = re.search(r"\n\s+state\s+(.*?)\n\s+compare\s", out, re.S)
    assert entry and "read-only" in entry.group(1) and "retire" in entry.group(1), out
    rc, out, _ = run_cli("state", "--help")
    assert rc == 0 and "retire" in out.split("positional arguments")[0], out


# -- tops state: the store's rows ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("params", "state"), [
    ("[1, 2]", '{"operator": {"ticks": 9}}'),
    ('{"epsilon": "x", "holdout": "many"}', '{"operator": {"ticks": "9", "theta_units": 4}}'),
    ('{"resolution": 1e308}', '{"operator": {"ticks": 9, "theta_units": 1e308}}'),
    ('{"epsilon": ' + "9" * 400 + "}", '{"operator": [1]}'),
    ('{"mode": "local"}', '{"operator": {"ticks": -5, "theta": "x", "phase": [1]}}'),
    ('{"holdout": [5]}', '{"operator": {"ticks": [9], "theta_units": "4"}}'),
], ids=short_id)
def test_state_shows_a_row_of_unexpected_types_as_missing_fields(tmp_path: Path, params: str, state: str) -> None:
    """A store copied from elsewhere may hold rows of any JSON: what is not what tops writes is shown as "-" (a
    product that overflows too: no "inf" shown as a threshold)."""
    import sqlite3

    db = _store(tmp_path)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE streams SET params = ?, state = ? WHERE name = 'b'", (params, state))
    conn.commit()
    conn.close()
    rc, out, err = run_cli("state", "--data-dir", db.parent)
    assert rc == 0 and re.search(r"^b\s+1\s", out, re.M) and "inf" not in out, (rc, err)
    rc, out, err = run_cli("state", "--data-dir", db.parent, "--json")
    assert rc == 0 and [r["stream"] for r in json.loads(out)] == ["a", "b"] and "Infinity" not in out, (rc, err)


@pytest.mark.parametrize("row", ["{", "[" * 100_000, '{"x": ' + "9" * 5000 + "}"], ids=short_id)
def test_state_refuses_a_row_that_is_not_json_in_one_line(tmp_path: Path, row: str) -> None:
    import sqlite3

    db = _store(tmp_path)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE streams SET params = ? WHERE name = 'a'", (row,))
    conn.commit()
    conn.close()
    line = refused_in_one_line("state", *run_cli("state", "--data-dir", db.parent)[::2])
    assert "cannot read" in line


# -- the seeded fuzz -----------------------------------------------------------------------------------------------
def mutate(rng: random.Random, data: bytes) -> bytes:
    """One hostile change of a valid file: a byte flipped, a hostile JSON scalar or deep nesting spliced in, a cut,
    a line of garbage, a long digit run."""
    k = rng.randrange(7)
    i = rng.randrange(len(data) + 1)
    if k == 0 and data:
        j = min(i, len(data) - 1)
        return data[:j] + bytes([rng.randrange(256)]) + data[j + 1:]
    if k == 1:
        return data[:i] + rng.choice(HOSTILE_SCALARS).encode("utf-8", errors="surrogatepass") + data[i:]
    if k == 2:
        n = rng.choice([100, 5000, 100_000])
        return data[:i] + b"[" * n + data[i:]
    if k == 3:
        return data[:i]
    if k == 4:
        return data + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))) + b"\n"
    if k == 5:
        return data[:i] + b"9" * rng.choice([400, 5000, 1 << 20]) + data[i:]
    return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 500)))


def _store(tmp_path: Path) -> Path:
    """A real state store (the daemon's own Store) with two streams, one past its holdout, to be mutated."""
    from stream.state.store import Store

    p = tmp_path / "store" / "state.db"
    st = Store.open(p)
    params = {"mode": "central", "epsilon": 1.0, "bound": 10.0, "holdout": 5, "resolution": 1.0}
    for name in ("a", "b"):
        st.admit(name, params)
    st.checkpoint({"a": {"operator": {"ticks": 3}}, "b": {"operator": {"ticks": 9, "theta_units": 4}}},
                  journal_position=1)
    st.fold()
    st.close()
    return p


def _hostile_rows(rng: random.Random, db: Path) -> None:
    """The store's rows rewritten with hostile JSON (what a store copied from elsewhere may hold)."""
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        for (name, params, state) in conn.execute("SELECT name, params, state FROM streams").fetchall():
            sql, text = rng.choice([("UPDATE streams SET params = ? WHERE name = ?", params),
                                    ("UPDATE streams SET state = ? WHERE name = ?", state or "{}")])
            conn.execute(sql, (mutate(rng, text.encode()).decode("utf-8", errors="replace"), name))
        conn.commit()
    finally:
        conn.close()


def test_seeded_fuzz_of_every_commands_inputs_answers_or_refuses_in_one_line(tmp_path: Path) -> None:
    """60 mutated or garbage inputs (12 per command): each run either succeeds or exits 2 with one line on stderr
    that is the command's own error; no traceback, no hang. Both outcomes occur (the fuzz reaches the parsers)."""
    rng = random.Random(20250611)
    rel_lines = [*releases(range(5, 40)), status({"holdout": 5, "query_range": 16, "fanout": 4})]
    valid = {
        ".jsonl": ("\n".join(json.dumps({"value": i % 7}) for i in range(40)) + "\n").encode(),
        ".csv": "".join(f"{i % 7}\n" for i in range(40)).encode(),
        "rel": ("\n".join(rel_lines) + "\n").encode(),
        "toml": b'[state]\ndata_dir = "DIR"\n[streams.template]\nepsilon = 1.0\nbound = 10.0\nfanout = 4\n',
    }
    buf = io.BytesIO()
    np.save(buf, np.arange(40.0) % 7)
    valid[".npy"] = buf.getvalue()
    db = _store(tmp_path).read_bytes()
    outcomes = {"ok": 0, "refused": 0}
    for case in range(60):
        command = ["replay", "evaluate", "query", "compare", "state"][case % 5]
        d = tmp_path / f"c{case}"
        d.mkdir()
        suffix = rng.choice([".jsonl", ".csv", ".npy"])
        f = d / f"in{suffix}"
        f.write_bytes(mutate(rng, valid[suffix]))
        good = d / "good.csv"
        good.write_bytes(valid[".csv"])
        if command == "replay":
            argv = ["replay", f, "--epsilon", 1, "--bound", 10, "--holdout", 5, "--range", 16, "--fanout", 4,
                    "--key", KEY, "--out", d / "o.npy"]
        elif command == "evaluate":
            rel = d / "rel.jsonl"
            rel.write_bytes(mutate(rng, valid["rel"]))
            argv = ["evaluate", f, rel] if rng.random() < 0.5 else ["evaluate", good, rel]
        elif command == "query":
            rel = d / "rel.jsonl"
            rel.write_bytes(mutate(rng, valid["rel"]))
            argv = ["query", rel, *rng.choice([[], ["--per", "hour"], ["--per", "7"], ["--from", 0, "--to", 20]])]
        elif command == "compare":
            argv = ["compare", f, "--methods", "tops,zero", "--eps", 1, "--repetitions", 1, "--queries", 5,
                    "--range", 16, "--holdout", 5, "--bound", 10, "--no-plot", "--out-dir", d]
        else:
            store_dir = d / "data"
            store_dir.mkdir()
            (store_dir / "state.db").write_bytes(db)
            if rng.random() < 0.5:
                _hostile_rows(rng, store_dir / "state.db")
            else:
                (store_dir / "state.db").write_bytes(mutate(rng, db))
            cfg = d / "tops.toml"
            # the path goes in after the mutation: the draws must not depend on where pytest puts tmp_path
            cfg.write_bytes(mutate(rng, valid["toml"]).replace(b"DIR", str(store_dir).encode()))
            argv = ["state", "--data-dir", store_dir] if rng.random() < 0.5 else ["state", "--config", cfg]
        try:
            rc, _, err = run_cli(*argv)
        except Exception as exc:
            pytest.fail(f"case {case} ({command}): {type(exc).__name__}: {str(exc)[:200]}")
        if rc == 0:
            outcomes["ok"] += 1
            assert "Traceback" not in err
        else:
            outcomes["refused"] += 1
            refused_in_one_line(command, rc, err)
    assert outcomes["ok"] >= 5 and outcomes["refused"] >= 5, outcomes

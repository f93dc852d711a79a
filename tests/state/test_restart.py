"""Restarts on stdin with durable state: changed privacy parameters are refused unless a new generation is asked
for, a corrupt store or another master key is refused, open periods are kept and not released twice, and loose
folder modes are tightened."""

from __future__ import annotations

import json
import os
from pathlib import Path

from stream.state.store import Store
from tests.support import (
    TEMPLATE,
    stdin_config,
    tops,
    write_toml,
)


def test_changed_privacy_parameters_refused_new_generation_accepted(tmp_path: Path) -> None:
    """epsilon or bound changed for a stored stream: one clear line, exit 2; --new-generation NAME starts it anew."""
    cfg = stdin_config(tmp_path)
    first = tops("run", "--config", str(cfg), stdin=b"p,5\np,6\nq,1\n")
    assert first.returncode == 0, first.stderr.decode()
    for flag, value, what in (("--epsilon", "2", "epsilon 1.0 -> 2.0"), ("--bound", "50", "bound 100.0 -> 50.0")):
        r = tops("run", "--config", str(cfg), flag, value, stdin=b"p,7\n")
        assert r.returncode == 2
        err = r.stderr.decode().strip().splitlines()
        assert len(err) == 2 and all("other privacy parameters" in x and what in x for x in err), err
        assert "--new-generation p" in err[0] and "--new-generation q" in err[1]  # every stream, at once
    r = tops("run", "--config", str(cfg), "--epsilon", "2", "--new-generation", "p", "--new-generation", "q",
             stdin=b"p,7\n")
    assert r.returncode == 0, r.stderr.decode()
    ledger = json.loads(tops("state", "--config", str(cfg), "--json", "--ledger").stdout)
    p = [e for e in ledger if e["stream"] == "p"]
    assert [(e["generation"], e["epsilon"], e["retired"] is None) for e in p] == [(1, 1.0, False), (2, 2.0, True)]
    rows = {r["stream"]: r for r in json.loads(tops("state", "--config", str(cfg), "--json").stdout)}
    assert rows["p"]["generation"] == 2 and rows["p"]["ticks"] == 1 and rows["p"]["epsilon"] == 2.0
    assert tops("run", "--config", str(cfg), "--epsilon", "2", stdin=b"p,8\n").returncode == 0  # no change now


def test_a_corrupt_store_or_another_master_key_is_refused(tmp_path: Path) -> None:
    cfg = stdin_config(tmp_path)
    assert tops("run", "--config", str(cfg), stdin=b"a,1\n").returncode == 0
    other = tmp_path / "other.key"
    r = tops("run", "--config", str(cfg), "--key-file", str(other), stdin=b"a,1\n")
    assert r.returncode == 2 and "another master key" in r.stderr.decode()
    db = tmp_path / "state" / "state.db"
    for extra in ("-wal", "-shm"):
        Path(f"{db}{extra}").unlink(missing_ok=True)
    data = bytearray(db.read_bytes())
    data[100:4096] = os.urandom(3996)  # the header survives, the schema page does not
    db.write_bytes(bytes(data))
    r = tops("run", "--config", str(cfg), stdin=b"a,1\n")
    err = r.stderr.decode().strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and "refusing to start" in err[0], err
    assert db.read_bytes() == bytes(data)  # never replaced
    db.write_bytes(b"not a database at all" * 100)
    r = tops("run", "--config", str(cfg), stdin=b"a,1\n")
    assert r.returncode == 2 and "refusing to start" in r.stderr.decode()
    db.chmod(0o644)
    r = tops("run", "--config", str(cfg), stdin=b"a,1\n")
    assert r.returncode == 2 and "chmod 600" in r.stderr.decode()


def test_open_periods_are_kept_across_a_restart_not_released_twice(tmp_path: Path) -> None:
    """Period ticks with durable state: SIGTERM checkpoints the open period instead of closing it early; the
    next run adds to it."""
    cfg = write_toml(tmp_path / "tops.toml", {
        "input": {"source": "stdin"},
        "output": {"sinks": ["stdout"]},
        # periods of 2^31 s align to the epoch: the open one ends in 2038, never between the two runs
        "ticks": {"mode": "period", "period": float(1 << 31), "aggregate": "count"},
        "streams": {"key_file": str(tmp_path / "k"), "template": {"epsilon": 1.0, "bound": 100.0, "theta": 50.0}},
        "metrics": {"port": 0},
        "state": {"data_dir": str(tmp_path / "state")},
    })
    r1 = tops("run", "--config", str(cfg), stdin=b"".join(f"m{i % 3},{i}\n".encode() for i in range(30)))
    r2 = tops("run", "--config", str(cfg), stdin=b"m0,1\nm0,2\n")
    assert r1.returncode == 0 and r2.returncode == 0, r2.stderr.decode()
    assert r1.stdout == b"" and r2.stdout == b""  # the period is not over: nothing released early
    st = {s["name"]: s["state"] for s in Store.open(tmp_path / "state" / "state.db", readonly=True).streams()}
    counts = {n: sum(v for _, v in s["bins"]["open"]) for n, s in st.items()}
    assert counts == {"m0": 12.0, "m1": 10.0, "m2": 10.0}


def test_loose_folder_modes_are_tightened_and_an_unwritable_key_folder_is_refused(tmp_path: Path) -> None:
    """An existing data_dir and journal folder of mode 0755 are set to 0700 (logged); a key file whose folder cannot
    be written stops the start with one line and exit code 2 (no traceback)."""
    (tmp_path / "state" / "journal").mkdir(parents=True)
    os.chmod(tmp_path / "state", 0o755)  # noqa: S103  (the loose mode under test)
    os.chmod(tmp_path / "state" / "journal", 0o755)  # noqa: S103
    res = tops("run", "--config", str(stdin_config(tmp_path)), stdin=b"a,1\n")
    assert res.returncode == 0, res.stderr.decode()
    assert oct((tmp_path / "state").stat().st_mode & 0o777) == "0o700"
    assert oct((tmp_path / "state" / "journal").stat().st_mode & 0o777) == "0o700"
    assert res.stderr.decode().count("set to 0700") == 2
    (tmp_path / "not-a-folder").write_text("")
    cfg = write_toml(tmp_path / "bad.toml", {
        "input": {"source": "stdin"}, "output": {"sinks": ["stdout"]}, "metrics": {"port": 0},
        "streams": {"key_file": str(tmp_path / "not-a-folder" / "master.key"), "template": dict(TEMPLATE)},
        "state": {"data_dir": str(tmp_path / "state2")},
    })
    res = tops("run", "--config", str(cfg), stdin=b"")
    err = res.stderr.decode().strip().splitlines()
    assert res.returncode == 2 and len(err) == 1 and "cannot be created" in err[0] and "Traceback" not in err[0], err

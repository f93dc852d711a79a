"""What a new user hit (issue 11 item 4): each as the user ran it, through the real command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from operators.topl import ToPLConfig
from operators.topl_server import LocalServer
from stream.commands.state_cmd import summarize
from tests.support import tops_text

KEY = "5a" * 32


def _two_streams(tmp_path: Path, fmt: str = "jsonl") -> Path:
    out = tmp_path / f"two.{fmt}"
    res = tops_text("simulate", "--streams", 2, "--ticks", 10, "--format", fmt, "--out", out)
    assert res.returncode == 0, res.stderr
    return out


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_replay_of_two_streams_selects_the_named_one(tmp_path: Path, fmt: str) -> None:
    src = _two_streams(tmp_path, fmt)
    common = ("--epsilon", 1, "--bound", 5000, "--theta", 100, "--range", 16, "--fanout", 4, "--key", KEY)
    res = tops_text("replay", src, *common, "--stream", "meter-2", "--out", tmp_path / "m2.npy")
    assert res.returncode == 0, res.stderr
    assert np.load(tmp_path / "m2.npy").shape == (10,)
    # the very same releases as the stream alone in a file
    if fmt == "jsonl":
        alone = tmp_path / "alone.jsonl"
        alone.write_text("".join(s + "\n" for s in src.read_text().splitlines() if '"meter-2"' in s))
        assert tops_text("replay", alone, *common, "--out", tmp_path / "a.npy").returncode == 0
        assert np.array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "m2.npy"))


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_replay_of_two_streams_without_a_choice_refuses(tmp_path: Path, fmt: str) -> None:
    src = _two_streams(tmp_path, fmt)
    res = tops_text("replay", src, "--epsilon", 1, "--bound", 5000, "--out", tmp_path / "o.npy")
    assert res.returncode == 2
    assert "holds 2 streams (meter-1, meter-2): choose one with --stream NAME" in res.stderr, res.stderr
    assert not (tmp_path / "o.npy").exists()
    res = tops_text("replay", src, "--epsilon", 1, "--bound", 5000, "--stream", "meter-9", "--out", tmp_path / "o.npy")
    assert res.returncode == 2 and "no stream 'meter-9'" in res.stderr, res.stderr


def test_state_counts_the_releases_of_a_local_stream() -> None:
    cfg = ToPLConfig(epsilon=1.0, bound=64.0, holdout=200)
    srv = LocalServer(cfg)
    rng = np.random.default_rng(0)
    while srv.phase != "releasing":
        srv.observe_threshold(rng.uniform(-10, 70, size=50))
    out = srv.process(np.full(5, 3.0))
    assert not np.isnan(out).any()
    row = summarize({"name": "m", "generation": 1, "params": {"mode": "local", **cfg.to_dict()},
                     "state": {"operator": srv.snapshot()}, "updated": "now"})
    assert row["released"] == 5 and row["ticks"] == 5


def test_version() -> None:
    res = tops_text("--version")
    assert res.returncode == 0 and res.stdout.startswith("tops ") and res.stdout.split()[1][0].isdigit()


@pytest.mark.parametrize("holdout", ["-3", "0"])
def test_holdout_below_one_gives_one_message(tmp_path: Path, holdout: str) -> None:
    np.save(tmp_path / "in.npy", np.ones(10))
    res = tops_text("replay", tmp_path / "in.npy", "--epsilon", 1, "--bound", 10, "--holdout", holdout,
               "--out", tmp_path / "o.npy")
    assert res.returncode == 2
    assert f"holdout must be an integer >= 1 unless theta is given (got {holdout})" in res.stderr, res.stderr


def test_out_writes_exactly_the_named_file(tmp_path: Path) -> None:
    np.save(tmp_path / "in.npy", np.ones(40))
    out = tmp_path / "x.txt"
    res = tops_text("replay", tmp_path / "in.npy", "--epsilon", 1, "--bound", 10, "--theta", 2, "--range", 16,
               "--fanout", 4, "--out", out)
    assert res.returncode == 0, res.stderr
    assert out.is_file() and not (tmp_path / "x.txt.npy").exists()
    assert np.load(out).shape == (40,)


def test_evaluate_reports_the_query_lengths_it_used(tmp_path: Path) -> None:
    x = np.full(3000, 2.0)
    np.save(tmp_path / "t.npy", x)
    res = tops_text("replay", tmp_path / "t.npy", "--epsilon", 1, "--bound", 10, "--holdout", 1000, "--range", 4096,
               "--key", KEY, "--out", tmp_path / "r.npy")
    assert res.returncode == 0, res.stderr
    res = tops_text("evaluate", tmp_path / "t.npy", tmp_path / "r.npy", "--repetitions", 1)
    assert res.returncode == 0, res.stderr
    assert "length 1..2000, over 2000 released ticks" in res.stdout, res.stdout


def test_evaluate_reads_the_daemons_jsonl(tmp_path: Path) -> None:
    """The daemon's stdout (one JSON release per line, holdout ticks absent) against the same releases as .npy."""
    x = (np.arange(3000) % 7).astype(float)
    np.save(tmp_path / "t.npy", x)
    res = tops_text("replay", tmp_path / "t.npy", "--epsilon", 1, "--bound", 10, "--holdout", 1000, "--range", 4096,
               "--key", KEY, "--out", tmp_path / "r.npy")
    assert res.returncode == 0, res.stderr
    rel = np.load(tmp_path / "r.npy")
    lines = [json.dumps({"stream": "s", "tick": i, "ts": 0.0, "value": float(v), "epsilon": 1.0, "theta": 6.0})
             for i, v in enumerate(rel) if not np.isnan(v)]
    lines.insert(5, lines[3])  # a duplicate (QoS 1 redelivery) is counted once
    (tmp_path / "r.jsonl").write_text("\n".join(lines) + "\n")
    a = tops_text("evaluate", tmp_path / "t.npy", tmp_path / "r.npy", "--repetitions", 2)
    b = tops_text("evaluate", tmp_path / "t.npy", tmp_path / "r.jsonl", "--repetitions", 2)
    assert a.returncode == 0 and b.returncode == 0, b.stderr
    assert a.stdout == b.stdout

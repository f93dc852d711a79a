"""``tops replay`` / ``evaluate`` / ``simulate`` as a user runs them: the contract, text inputs, bad input and wrong
arguments refused in one line, a file of several streams, the named output file, the query lengths ``evaluate`` uses
and the daemon's JSON lines it reads, ``--method`` for every baseline, ``--version``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from operators import ToPS, ToPSConfig
from operators.baselines import METHODS
from tests.support import tops_text

KEY_HEX = "5a" * 32


def test_replay_contract_matches_the_operator(tmp_path: Path) -> None:
    x = np.random.default_rng(0).gamma(2.0, 4.0, 3000).round()
    np.save(tmp_path / "in.npy", x)
    res = tops_text(
        "replay",
        tmp_path / "in.npy",
        "--epsilon",
        0.5,
        "--bound",
        80,
        "--holdout",
        400,
        "--range",
        1024,
        "--fanout",
        4,
        "--smoother",
        "ema",
        "--key",
        KEY_HEX,
        "--out",
        tmp_path / "out.npy",
    )
    assert res.returncode == 0, res.stderr
    out = np.load(tmp_path / "out.npy")
    assert out.dtype == np.float64 and out.shape == x.shape
    assert np.isnan(out[:400]).all() and not np.isnan(out[400:]).any()
    cfg = ToPSConfig(epsilon=0.5, bound=80, holdout=400, query_range=1024, fanout=4, smoother="ema")
    op = ToPS(cfg, bytes.fromhex(KEY_HEX))
    assert np.array_equal(out, op.process(x), equal_nan=True)
    assert f"theta = {op.theta:g}" in res.stderr and f"s = {op.smoother_layers}" in res.stderr
    assert KEY_HEX not in res.stderr + res.stdout


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_text_inputs_equal_npy(tmp_path: Path, fmt: str) -> None:
    x = np.random.default_rng(1).integers(0, 50, 600).astype(float)
    if fmt == "csv":
        (tmp_path / "in.csv").write_text("value\n" + "\n".join(f"{v:g}" for v in x) + "\n")
    else:
        (tmp_path / "in.jsonl").write_text("".join(json.dumps({"value": v}) + "\n" for v in x))
    np.save(tmp_path / "in.npy", x)
    common = ["--epsilon", 1, "--bound", 60, "--holdout", 100, "--range", 256, "--key", KEY_HEX]
    assert tops_text("replay", tmp_path / f"in.{fmt}", *common, "--out", tmp_path / "a.npy").returncode == 0
    assert tops_text("replay", tmp_path / "in.npy", *common, "--out", tmp_path / "b.npy").returncode == 0
    assert np.array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"), equal_nan=True)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("1\n2\nabc\n4\n", "in.csv line 3: not a number"),
        ("1\n\n2\nnan\n", "in.csv line 4: not a finite number"),
        ("1\ninf\n", "in.csv line 2: not a finite number"),
        ("1\n2\n-inf\n", "in.csv line 3: not a finite number (NaN or infinite)"),
    ],
)
def test_bad_csv_is_refused_naming_the_first_bad_line(tmp_path: Path, content: str, expected: str) -> None:
    (tmp_path / "in.csv").write_text(content)
    res = tops_text("replay", tmp_path / "in.csv", "--epsilon", 1, "--bound", 10, "--out", tmp_path / "o.npy")
    assert res.returncode == 2
    assert expected in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "-inf" not in res.stderr  # the value itself is never echoed


def test_bad_jsonl_and_npy(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"value": 1}\n{"value": "7"}\n')
    res = tops_text("replay", tmp_path / "a.jsonl", "--epsilon", 1, "--bound", 10, "--out", tmp_path / "o.npy")
    assert res.returncode == 2 and 'a.jsonl line 2: "value" must be a number' in res.stderr
    np.save(tmp_path / "b.npy", np.array([1.0, np.nan]))
    res = tops_text("replay", tmp_path / "b.npy", "--epsilon", 1, "--bound", 10, "--out", tmp_path / "o.npy")
    assert res.returncode == 2 and "b.npy element 1: not a finite number" in res.stderr


def test_values_above_bound_are_clamped_and_counted(tmp_path: Path) -> None:
    np.save(tmp_path / "in.npy", np.array([1.0, 50.0, 3.0, 999.0] * 100))
    res = tops_text(
        "replay",
        tmp_path / "in.npy",
        "--epsilon",
        1,
        "--bound",
        10,
        "--holdout",
        50,
        "--range",
        256,
        "--out",
        tmp_path / "o.npy",
    )
    assert res.returncode == 0, res.stderr
    assert "clamped to bound = 200" in res.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--smoother", "fancy"], "argument --smoother: invalid choice: 'fancy' (choose from"),
        (["--fanout", "1"], "fanout must be an integer >= 2 and <= 65536 (got 1)"),
        (["--epsilon", "-1"], "epsilon must be a positive number (got -1.0)"),
        (["--range", "1000"], "query_range must be a multiple of fanout^(h-1)"),
        (["--key", "abc"], "--key must be 64 hex digits"),
        (["--holdout", "x"], "argument --holdout: invalid int value"),
    ],
)
def test_wrong_arguments_print_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    np.save(tmp_path / "in.npy", np.ones(10))
    base = {"--epsilon": "1", "--bound": "10"}
    for k, v in zip(args[::2], args[1::2], strict=True):
        base[k] = v
    flat = [t for kv in base.items() for t in kv]
    res = tops_text("replay", tmp_path / "in.npy", *flat, "--out", tmp_path / "o.npy")
    assert res.returncode == 2
    assert expected in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_key_file_derivation_matches_stream_keys(tmp_path: Path) -> None:
    from stream.core.keys import derive_stream_key, load_master_key

    kf = tmp_path / "master.key"
    master = load_master_key(kf, create=True)
    assert (kf.stat().st_mode & 0o777) == 0o600
    x = np.random.default_rng(2).integers(0, 9, 500).astype(float)
    np.save(tmp_path / "in.npy", x)
    res = tops_text(
        "replay",
        tmp_path / "in.npy",
        "--epsilon",
        1,
        "--bound",
        10,
        "--holdout",
        100,
        "--range",
        256,
        "--key-file",
        kf,
        "--identity",
        "ab" * 16,
        "--stream",
        "meter-7",
        "--out",
        tmp_path / "o.npy",
    )
    assert res.returncode == 0, res.stderr
    cfg = ToPSConfig(epsilon=1, bound=10, holdout=100, query_range=256)
    expected = ToPS(cfg, derive_stream_key(master, "meter-7", identity="ab" * 16)).process(x)
    assert np.array_equal(np.load(tmp_path / "o.npy"), expected, equal_nan=True)
    assert master.hex() not in res.stderr


def test_simulate_then_replay_then_evaluate(tmp_path: Path) -> None:
    assert tops_text("simulate", "--ticks", 5000, "--format", "npy", "--out", tmp_path / "sim.npy").returncode == 0
    res = tops_text(
        "replay",
        tmp_path / "sim.npy",
        "--epsilon",
        1,
        "--bound",
        5000,
        "--holdout",
        1000,
        "--range",
        4096,
        "--out",
        tmp_path / "rel.npy",
    )
    assert res.returncode == 0, res.stderr
    res = tops_text("evaluate", tmp_path / "sim.npy", tmp_path / "rel.npy", "--range", 4096, "--repetitions", 3)
    assert res.returncode == 0, res.stderr
    rows = {line.split()[0]: line.split() for line in res.stdout.splitlines()[2:]}
    mse_rel, mse_zero = float(rows["releases"][1]), float(rows["always"][2])
    assert mse_rel < mse_zero / 10


def test_evaluate_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    x = np.random.default_rng(3).integers(0, 9, 3000).astype(float)
    np.save(tmp_path / "t.npy", x)
    rel = x + 0.5
    rel[:100] = np.nan
    np.save(tmp_path / "r.npy", rel)
    res = tops_text(
        "evaluate", tmp_path / "t.npy", tmp_path / "r.npy", "--plot", tmp_path / "fig.png", "--range", 100
    )
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "fig.png").stat().st_size > 1000


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


def test_replay_method_option_runs_every_baseline(tmp_path) -> None:
    """`tops replay --method NAME` builds the registry's operator; the choices are exactly the registry."""
    import subprocess
    import sys

    from stream.commands.replay import METHOD_NAMES

    assert set(METHOD_NAMES) == set(METHODS)
    x = np.random.default_rng(0).integers(0, 20, 600).astype(float)
    np.save(tmp_path / "in.npy", x)
    for name in ("h2", "flat", "zero"):
        res = subprocess.run(
            [sys.executable, "-m", "stream.cli", "replay", str(tmp_path / "in.npy"), "--epsilon", "1", "--bound", "30",
             "--holdout", "100", "--range", "256", "--method", name, "--key", "ab" * 32, "--out",
             str(tmp_path / f"{name}.npy")],
            capture_output=True, text=True, timeout=60,
        )
        assert res.returncode == 0, res.stderr
        out = np.load(tmp_path / f"{name}.npy")
        assert out.shape == x.shape
        cfg = ToPSConfig(epsilon=1, bound=30, holdout=100, query_range=256)
        expected = METHODS[name](cfg, bytes.fromhex("ab" * 32))
        assert np.array_equal(out, expected.process(x), equal_nan=True)

"""Signed readings: clamped to the public [lower, bound], never dropped.

The attack: if ``5, 7, -3, 4, -1, 9`` made 4 ticks, the missing ticks would show which readings were negative. Every
finite reading must make its tick, whatever its value.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from operators import ToPS, ToPSConfig
from operators.config import ConfigError
from tests.support import ROOT


def _run(args: list[str], lines: list[str]) -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "stream.cli", "run", *args], input="".join(x + "\n" for x in lines),
                       capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert r.returncode == 0, r.stderr
    return [json.loads(x) for x in r.stdout.splitlines()]


def test_negative_readings_make_their_ticks(tmp_path: Path) -> None:
    base = ["--holdout", "2", "--bound", "10", "--range", "16", "--fanout", "4", "--key-file", str(tmp_path / "k")]
    rel = _run(base, ["5", "7", "-3", "4", "-1", "9"])
    # ticks 0-1 are the holdout; every reading after it makes its tick, the negative ones too
    assert [r["tick"] for r in rel] == [2, 3, 4, 5]
    # a negative reading is indistinguishable from 0 (clamped to lower = 0): same release as with 0 there
    key = bytes(range(32))
    cfg = ToPSConfig(epsilon=1.0, bound=10, theta=8, query_range=16, fanout=4)
    a = ToPS(cfg, key).process(np.array([5, 7, -3, 4, -1, 9.0]))
    b = ToPS(cfg, key).process(np.array([5, 7, 0, 4, 0, 9.0]))
    assert np.array_equal(a, b)


def test_lower_shifts_the_range_and_is_added_back() -> None:
    """With lower = -40 the stream works on value + 40 in [0, 100]: the release of x equals the release of x + 40
    with lower 0, minus 40 (post-processing), tick for tick, in the holdout and after."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-40, 60, 2000).round(1)
    key = bytes(range(32))
    shifted = ToPSConfig(epsilon=1.0, lower=-40.0, bound=60.0, holdout=200, query_range=256, fanout=4,
                         resolution=0.5)
    plain = ToPSConfig(epsilon=1.0, bound=100.0, holdout=200, query_range=256, fanout=4, resolution=0.5)
    op_s, op_p = ToPS(shifted, key), ToPS(plain, key)
    a, b = op_s.process(x), op_p.process(x + 40.0)
    assert np.allclose(a, b - 40.0, equal_nan=True, atol=1e-9)
    assert op_s.theta == op_p.theta - 40.0
    # clamping below lower: counted, never dropped
    op = ToPS(shifted, key)
    out = op.process(np.array([-100.0] * 300))
    assert len(out) == 300 and op.clamped == 300
    # process_one agrees with process when lower is set
    one = ToPS(shifted, key)
    assert np.array_equal(np.array([one.process_one(v) for v in x]), a, equal_nan=True)


@pytest.mark.parametrize(("kw", "word"), [({"lower": 5.0, "bound": 5.0}, "above lower"),
                                          ({"lower": float("nan"), "bound": 5.0}, "lower"),
                                          ({"lower": -5.0, "bound": 5.0, "theta": -6.0}, "theta")])
def test_bad_lower_refused(kw: dict, word: str) -> None:
    with pytest.raises(ConfigError, match=word):
        ToPSConfig(epsilon=1.0, holdout=10, **kw)


def test_daemon_lower_and_replay_agree(tmp_path: Path) -> None:
    """`tops run --lower -20` releases what `tops replay --lower -20` gives with the run's identity."""
    from tests.support import identity_from_log

    x = np.random.default_rng(9).uniform(-30, 30, 600).round(2)
    args = ["--lower", "-20", "--bound", "20", "--holdout", "100", "--range", "256", "--fanout", "4",
            "--epsilon", "1", "--resolution", "0.01"]
    r = subprocess.run([sys.executable, "-m", "stream.cli", "run", *args, "--key-file", str(tmp_path / "k")],
                       input="".join(f"m,{v}\n" for v in x), capture_output=True, text=True, timeout=60, cwd=ROOT,
                       check=False)
    assert r.returncode == 0, r.stderr
    got = {d["tick"]: d["value"] for d in map(json.loads, r.stdout.splitlines())}
    assert len(got) == 500
    np.save(tmp_path / "x.npy", x)
    rep = subprocess.run([sys.executable, "-m", "stream.cli", "replay", str(tmp_path / "x.npy"), *args,
                          "--key-file", str(tmp_path / "k"), "--identity", identity_from_log(r.stderr),
                          "--stream", "m", "--out", str(tmp_path / "o.npy")], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, check=False)
    assert rep.returncode == 0, rep.stderr
    want = {t: float(v) for t, v in enumerate(np.load(tmp_path / "o.npy")) if not np.isnan(v)}
    assert got == want


@pytest.mark.parametrize("method", ["flat", "counter", "h16c"])
def test_baselines_clamp_negative_readings_to_zero(method: str) -> None:
    """The daemon's baselines take no `lower`: a negative reading counts as 0 (sensitivity stays theta)."""
    from operators.baselines import make

    cfg = ToPSConfig(epsilon=1.0, bound=10, theta=4, query_range=16, fanout=4)
    x = np.array([3.0, -5.0, 2.0, -1e9, 7.0, 1.0])
    a = make(method, cfg, bytes(range(32))).process(x)
    b = make(method, cfg, bytes(range(32))).process(np.maximum(x, 0.0))
    assert np.array_equal(a, b, equal_nan=True)

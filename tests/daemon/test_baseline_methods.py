"""Baselines selectable in the daemon (`[streams] method`): the same releases as `tops replay --method`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support import ROOT, identity_from_log, tops_text, write_toml

TEMPLATE = {"epsilon": 1.0, "bound": 50.0, "holdout": 100, "query_range": 256}


def _run(tmp: Path, method: str, data_dir: str, values: np.ndarray) -> subprocess.CompletedProcess[str]:
    cfg = write_toml(tmp / f"{method}.toml", {
        "input": {"source": "stdin"},
        "output": {"sinks": ["stdout"]},
        "streams": {"key_file": str(tmp / "master.key"), "method": method, "template": dict(TEMPLATE)},
        "state": {"data_dir": data_dir},
        "metrics": {"port": 0},
    })
    data = "".join(f"m,{v:g}\n" for v in values)
    return tops_text("run", "--config", cfg, stdin=data, timeout=60)


@pytest.mark.parametrize("method", ["flat", "counter", "h16c"])
def test_daemon_method_equals_replay_method(tmp_path: Path, method: str) -> None:
    values = np.random.default_rng(5).integers(0, 40, 700).astype(float)
    res = _run(tmp_path, method, "", values)
    assert res.returncode == 0, res.stderr
    got = {r["tick"]: r["value"] for r in map(json.loads, res.stdout.splitlines())}
    np.save(tmp_path / "in.npy", values)
    rep = subprocess.run([sys.executable, "-m", "stream.cli", "replay", str(tmp_path / "in.npy"), "--epsilon", "1",
                          "--bound", "50", "--holdout", "100", "--range", "256", "--method", method,
                          "--key-file", str(tmp_path / "master.key"), "--identity", identity_from_log(res.stderr),
                          "--stream", "m", "--out",
                          str(tmp_path / "out.npy")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert rep.returncode == 0, rep.stderr
    want = {t: float(v) for t, v in enumerate(np.load(tmp_path / "out.npy")) if not np.isnan(v)}
    assert got == want


def test_a_baseline_without_checkpoints_needs_state_off(tmp_path: Path) -> None:
    res = _run(tmp_path, "flat", str(tmp_path / "state"), np.ones(3))
    assert res.returncode == 2
    assert "[streams] method 'flat' has no checkpoints" in res.stderr and "Traceback" not in res.stderr

"""`tops state`: it only reads, shows no secret, and counts the releases of a local stream."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from operators.topl import ToPLConfig
from operators.topl_server import LocalServer
from stream.commands.state_cmd import summarize
from stream.state.store import Store

PARAMS = {"mode": "central", "epsilon": 1.0, "bound": 100.0, "holdout": 500, "query_range": 4096, "fanout": 16}


def test_tops_state_is_read_only_and_shows_no_secret(tmp_path: Path) -> None:
    st = Store.open(tmp_path / "state.db")
    st.admit("meter-1", {**PARAMS, "resolution": 1.0})
    st.checkpoint({"meter-1": {"operator": {"ticks": 900, "theta_units": 17, "holdout_histogram": None}}}, 2)
    st.close()
    before = (tmp_path / "state.db").read_bytes()
    res = subprocess.run(
        [sys.executable, "-m", "stream.cli", "state", "--data-dir", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert rows[0]["stream"] == "meter-1" and rows[0]["phase"] == "releasing" and rows[0]["released"] == 400
    assert rows[0]["theta"] == 17.0 and rows[0]["epsilon"] == 1.0
    assert (tmp_path / "state.db").read_bytes() == before
    table = subprocess.run(
        [sys.executable, "-m", "stream.cli", "state", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "meter-1" in table.stdout and "releasing" in table.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "stream.cli", "state", "--data-dir", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr


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

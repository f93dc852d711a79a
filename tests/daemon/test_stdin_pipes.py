"""`tops simulate | tops run` on pipes: releases equal `tops replay`; SIGTERM finishes what was accepted."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support import ROOT, free_port, identity_from_log, scrape, wait_for, write_toml

pytestmark = pytest.mark.slow

PARAMS = ["--holdout", "100", "--range", "256", "--fanout", "4", "--bound", "500"]


def test_simulate_pipe_releases_equal_replay(tmp_path: Path) -> None:
    """The default stdin pipeline with two meters; every stream's releases equal replay with the same key file."""
    key = tmp_path / "master.key"
    sim = subprocess.run([sys.executable, "-m", "stream.cli", "simulate", "--streams", "2", "--ticks", "400"],
                         cwd=ROOT, capture_output=True, check=True).stdout
    run = subprocess.run([sys.executable, "-m", "stream.cli", "run", *PARAMS, "--key-file", str(key)],
                         input=sim, cwd=ROOT, capture_output=True, check=True, timeout=60)
    assert b"no --config" in run.stderr and b"holdout=100" in run.stderr
    releases = [json.loads(x) for x in run.stdout.splitlines()]
    readings: dict[str, list[float]] = {}
    for line in sim.splitlines():
        r = json.loads(line)
        readings.setdefault(r["stream"], []).append(float(r["value"]))
    assert set(readings) == {"meter-1", "meter-2"}
    for name, values in readings.items():
        src, out = tmp_path / f"{name}.npy", tmp_path / f"{name}.out.npy"
        np.save(src, np.array(values))
        subprocess.run([sys.executable, "-m", "stream.cli", "replay", str(src), "--epsilon", "1", *PARAMS,
                        "--key-file", str(key), "--identity", identity_from_log(run.stderr.decode()),
                        "--stream", name, "--out", str(out)], cwd=ROOT, check=True,
                       capture_output=True)
        want = np.load(out)
        got = {r["tick"]: r["value"] for r in releases if r["stream"] == name}
        assert got == {t: float(v) for t, v in enumerate(want) if not np.isnan(v)}
        assert len(got) == 300


def test_sigterm_releases_open_periods_and_exits_0(tmp_path: Path) -> None:
    """Period ticks (1 h): readings accepted in the open period are released at SIGTERM; exit code 0."""
    mport = free_port()
    cfg = write_toml(tmp_path / "tops.toml", {
        "input": {"source": "stdin"},
        "output": {"sinks": ["stdout"]},
        "ticks": {"mode": "period", "period": 3600.0, "aggregate": "sum"},  # count: no metric counts readings
        "streams": {"key_file": str(tmp_path / "k"), "template": {"epsilon": 1.0, "bound": 100.0, "theta": 50.0}},
        "metrics": {"port": mport},
        "state": {"data_dir": ""},  # no durable state: open periods close at shutdown (test_state_restart: kept)
    })
    proc = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config", str(cfg)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"".join(f"m{i % 3},{i}\n".encode() for i in range(30)))
        proc.stdin.flush()  # stdin stays open: only the signal ends the run
        wait_for(lambda: scrape(mport)["tops_readings_total{result=ok}"] == 30, 20, what="readings accepted")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()
    rel = [json.loads(x) for x in out.splitlines()]
    assert sorted(r["stream"] for r in rel) == ["m0", "m1", "m2"]
    assert all(r["tick"] == 0 and r["theta"] == 50.0 for r in rel)
    assert b"SIGTERM received" in err


def test_second_signal_forces_exit(tmp_path: Path) -> None:
    """Draining waits for an unreachable broker; a second SIGTERM exits at once with code 1."""
    mport = free_port()
    cfg = write_toml(tmp_path / "tops.toml", {
        "mqtt": {"port": free_port(), "reconnect_min": 0.05, "reconnect_max": 0.2},  # nothing listens there
        "input": {"source": "stdin"},
        "output": {"sinks": ["mqtt"], "drain_timeout": 60.0},
        "streams": {"key_file": str(tmp_path / "k"), "template": {"epsilon": 1.0, "bound": 100.0, "theta": 50.0}},
        "metrics": {"port": mport},
        "state": {"data_dir": str(tmp_path / "state")},
    })
    proc = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config", str(cfg)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"5\n6\n")
        proc.stdin.flush()
        wait_for(lambda: scrape(mport)["tops_publish_queue_depth"] >= 2, 20, what="releases queued")
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # two signals sent back to back would reach the process as one
        assert proc.poll() is None  # still draining: the broker is unreachable
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert b"exiting without draining" in err

"""The compact holdout grid (``holdout_grid = "compact"``): a holdout in O(log B) cells, the same
operator otherwise; what it stores can not be continued under the other grid; the pending readings keep any unit."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from operators.config import ConfigError, ToPSConfig
from operators.threshold import COMPACT_INTEGERS, COMPACT_STEP, candidate_grid
from operators.tops import ToPS
from stream.core.config import build_config
from stream.core.errors import ConfigFileError
from stream.state.store import PrivacyParametersChanged, Store

KEY = bytes(range(32))


@pytest.mark.parametrize("bound", [20.0, 100.0, 5000.0, 16470.0, 1e6, 2.0**36])
def test_compact_grid_is_logarithmic_in_the_bound(bound: float) -> None:
    """Every step up to the 32nd, then neighbours at most 3% apart (plus the rounding of a step), up to B itself;
    the number of cells grows with log B (204 at B = 5,000), never with B."""
    grid = candidate_grid(bound, 1.0, compact=True)
    top = math.floor(bound)
    assert grid[0] == 1 and grid[-1] == top and (np.diff(grid) > 0).all()
    n_int = min(COMPACT_INTEGERS, top)
    assert grid[:n_int].tolist() == list(range(1, n_int + 1))
    if top > COMPACT_INTEGERS:
        after = grid[COMPACT_INTEGERS - 1:].astype(float)
        assert (after[1:] / after[:-1] <= COMPACT_STEP * (1 + 1.0 / after[:-1]) + 1e-12).all()
    steps = math.ceil(math.log(max(top / COMPACT_INTEGERS, 1)) / math.log(COMPACT_STEP))
    assert grid.size <= COMPACT_INTEGERS + steps + 2
    assert not grid.flags.writeable


@pytest.mark.parametrize("cut", [1, 250, 399])
def test_compact_holdout_is_small_and_continues_exactly(cut: int) -> None:
    """A holdout over 3,000 distinct values at B = 5,000: 204 cells (the exact grid's dense histogram is 4,297); the
    scalar path equals the batch path, a snapshot anywhere in the holdout continues bit for bit, and the snapshot
    can not be continued under the exact grid (its cells are others)."""
    cfg = ToPSConfig(epsilon=1.0, bound=5000, holdout=400, query_range=1024, fanout=4, holdout_grid="compact")
    values = np.random.default_rng(3).integers(0, 3000, 1500).astype(float)
    whole = ToPS(cfg, KEY).process(values)
    op = ToPS(cfg, KEY)
    first = [op.process_one(v) for v in values[:cut]]
    if cut == 399:
        assert len(op._dense_hist()) == 204
        exact = ToPS(cfg.replace(holdout_grid="exact"), KEY)
        for v in values[:cut]:
            exact.process_one(v)
        assert op.state_nbytes() < 2100 < 17000 < exact.state_nbytes()
    snap = json.loads(json.dumps(op.snapshot()))
    assert snap["config"]["holdout_grid"] == "compact"
    again = ToPS.restore(cfg, KEY, snap)
    rest = again.process(values[cut:])
    assert np.array_equal(np.concatenate([first, rest]), whole, equal_nan=True)
    with pytest.raises(ValueError, match="other parameters"):
        ToPS.restore(cfg.replace(holdout_grid="exact"), KEY, snap)
    assert ToPS(cfg, KEY).process(values)[400:].tolist() == whole[400:].tolist()


def test_the_default_grid_is_left_out_of_what_is_stored() -> None:
    """``to_dict`` leaves out ``holdout_grid = "exact"``: a snapshot or ledger entry made before the parameter
    existed (without the key) still matches the default configuration; the compact grid is always written."""
    cfg = ToPSConfig(epsilon=1.0, bound=50, holdout=40, query_range=256, fanout=4)
    assert "holdout_grid" not in cfg.to_dict()
    assert cfg.replace(holdout_grid="compact").to_dict()["holdout_grid"] == "compact"
    op = ToPS(cfg, KEY)
    for v in range(20):
        op.process_one(float(v))
    snap = json.loads(json.dumps(op.snapshot()))
    assert "holdout_grid" not in snap["config"]
    snap["config"].pop("holdout_grid", None)  # as every snapshot made before this parameter
    again = ToPS.restore(cfg, KEY, snap)
    assert np.array_equal(again.process(np.arange(20.0, 60.0)), op.process(np.arange(20.0, 60.0)), equal_nan=True)
    with pytest.raises(ConfigError, match="holdout_grid must be one of exact, compact"):
        cfg.replace(holdout_grid="coarse")


@pytest.mark.parametrize(("bound", "query_range"), [(300.0, 256), (70_000.0, 256), (2.0**34, 4)])
def test_pending_readings_keep_every_unit(bound: float, query_range: int) -> None:
    """A holdout's readings wait for the block statistics in 2, 4 or 8 bytes each, by the bound: a reading near B
    (above 2^16 units, above 2^32) is kept whole (the scalar path equals the batch path, also across a snapshot)."""
    cfg = ToPSConfig(epsilon=1.0, bound=bound, holdout=300, query_range=query_range, fanout=2)
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.uniform(0.5, 1.0, 200) * bound, rng.uniform(0, 0.1, 200) * bound]).round()
    whole = ToPS(cfg, KEY).process(values)
    op = ToPS(cfg, KEY)
    first = [op.process_one(v) for v in values[:130]]  # 64 + 64 flushed, 2 pending
    assert len(op._pending) == 2
    again = ToPS.restore(cfg, KEY, json.loads(json.dumps(op.snapshot())))
    rest = [again.process_one(v) for v in values[130:]]
    assert np.array_equal(np.array(first + rest), whole, equal_nan=True)


def test_a_changed_grid_is_refused_for_a_stream_already_started(tmp_path) -> None:
    """The ledger keeps the grid of each stream: a restart with the other grid is refused (a holdout kept in one
    grid can not continue in the other) unless the stream starts a new generation; exact stays absent (matches)."""
    base = {"mode": "central", "method": "tops",
            **ToPSConfig(epsilon=1.0, bound=100.0, holdout=500, query_range=4096).to_dict()}
    st = Store.open(tmp_path / "state.db")
    st.admit("m", base)
    st.admit("m", dict(base))  # the same parameters: admitted
    with pytest.raises(PrivacyParametersChanged, match="holdout_grid None -> compact"):
        st.admit("m", {**base, "holdout_grid": "compact"})
    assert st.admit("m", {**base, "holdout_grid": "compact"}, new_generation=True).generation == 2
    st.close()


def test_the_template_takes_the_grid_and_names_a_wrong_one() -> None:
    tpl = {"epsilon": 1.0, "bound": 5000.0, "holdout": 100, "query_range": 4096}
    cfg = build_config({"metrics": {"port": 0}, "streams": {"template": {**tpl, "holdout_grid": "compact"}}})
    assert cfg.template.holdout_grid == "compact"
    with pytest.raises(ConfigFileError) as exc:
        build_config({"metrics": {"port": 0}, "streams": {"template": {**tpl, "holdout_grid": "fine"}}})
    assert len(exc.value.problems) == 1 and "holdout_grid must be one of exact, compact" in exc.value.problems[0]


@pytest.mark.parametrize("grid", ["exact", "compact"])
def test_a_short_holdout_keeps_no_pending_readings_and_the_same_state(grid: str) -> None:
    """A holdout too short for any leaf width (m = 3) keeps no pending readings; fed one reading at a time its
    snapshot is the batch path's, block statistics included."""
    cfg = ToPSConfig(epsilon=1.0, bound=5000, holdout=3, query_range=1 << 16, holdout_grid=grid)
    one, batch = ToPS(cfg, KEY), ToPS(cfg, KEY)
    for v in (7.0, 4321.0):
        one.process_one(v)
    batch.process(np.array([7.0, 4321.0]))
    assert len(one._pending) == 0
    assert one.snapshot() == batch.snapshot()


@pytest.mark.slow
def test_the_daemon_and_replay_run_the_compact_grid_alike(tmp_path) -> None:
    """`tops run --holdout-grid compact` on stdin and `tops replay --holdout-grid compact` with the same key file
    release the same values, bit for bit, for readings spread over [1000, B) (theta among the geometric cells); a
    replay on the exact grid releases others (the flag is not ignored). The same on the exact grid. The lines go in
    small pieces once the daemon has started, as readings come: a holdout takes many processing steps (on the compact
    grid, as a row of a columnar holdout)."""
    import subprocess
    import sys
    import time

    from tests.support import ROOT, identity_from_log

    params = ["--epsilon", "1", "--holdout", "1000", "--range", "256", "--fanout", "4", "--bound", "5000"]
    rng = np.random.default_rng(13)
    values = {name: rng.integers(1000, 5000, 1200).astype(float) for name in ("m1", "m2")}
    lines = "".join(f"{name},{v:g}\n" for i in range(1200) for name, vals in values.items() for v in [vals[i]])
    key = tmp_path / "master.key"
    for grid in ("compact", "exact"):
        proc = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", *params, "--holdout-grid", grid,
                                 "--key-file", str(key)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=ROOT)
        assert proc.stderr is not None and proc.stdin is not None
        head = []
        while not any(b"started" in x for x in head):  # its input is read from here on: no backlog in the pipe
            head.append(proc.stderr.readline())
            assert head[-1], b"".join(head)
        feed = lines.encode().splitlines(keepends=True)
        for at in range(0, len(feed), 40):  # in small pieces, as readings come: a holdout takes many steps
            proc.stdin.write(b"".join(feed[at : at + 40]))
            proc.stdin.flush()
            time.sleep(0.005)
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0
        releases = [json.loads(x) for x in stdout.splitlines()]
        identity = identity_from_log((b"".join(head) + stderr).decode())
        for name, vals in values.items():
            src = tmp_path / f"{name}.npy"
            np.save(src, vals)
            outs = {}
            for replay_grid in ("compact", "exact"):
                out = tmp_path / f"{name}.{replay_grid}.npy"
                subprocess.run([sys.executable, "-m", "stream.cli", "replay", str(src), *params, "--holdout-grid",
                                replay_grid, "--key-file", str(key), "--identity", identity, "--stream", name,
                                "--out", str(out)], cwd=ROOT, check=True, capture_output=True, timeout=120)
                outs[replay_grid] = {t: float(v) for t, v in enumerate(np.load(out)) if not np.isnan(v)}
            got = {r["tick"]: r["value"] for r in releases if r["stream"] == name}
            assert len(got) == 200 and got == outs[grid], grid
            assert outs["exact"] != outs["compact"]

"""``tops query`` and the noise model of a range sum: the formula against the dense tree and against
the empirical error of ``tops replay`` on shipped data; answers from a file and live from the daemon's topic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from operators import ToPSConfig
from operators.error_bar import NoiseModel, consistent_leaf_variance_weights
from operators.hierarchy import _combine, _top_down, layer_weight
from stream.commands import datasets
from stream.commands.query import Releases
from stream.commands.replay import replay
from tests.support import (
    ROOT,
    TEMPLATE,
    DaemonProcess,
    Subscriber,
    daemon_config,
    find_identity,
    free_port,
    publish,
    wait_for,
)
from tests.support import tops_text as tops

KEY = "5a" * 32


def _forward(noise: list[np.ndarray], b: int) -> np.ndarray:
    """Hay et al.'s two passes on one tree's node noises, with the operator's own arithmetic."""
    z = [noise[0].astype(float)]
    for j in range(1, len(noise)):
        z.append(_combine(noise[j], z[-1], b, layer_weight(j + 1, b)))
    c = z[-1]
    for j in range(len(noise) - 2, -1, -1):
        c = _top_down(z[j], c, b)
    return c


@pytest.mark.parametrize(("b", "layers", "top"), [(3, 4, 2), (4, 3, 1), (2, 5, 3), (16, 2, 4), (5, 1, 7)])
def test_adjoint_equals_the_dense_consistent_tree(b: int, layers: int, top: int) -> None:
    """||M^T g||^2 from the backward passes equals the one of the explicit matrix M of the two passes."""
    sizes = [top * b ** (layers - 1 - j) for j in range(layers)]
    cols = []
    for idx in range(sum(sizes)):
        unit = np.zeros(sum(sizes))
        unit[idx] = 1.0
        cols.append(_forward(np.split(unit, np.cumsum(sizes)[:-1]), b))
    m = np.array(cols).T  # leaves x nodes
    rng = np.random.default_rng(b * 100 + layers)
    for g in [rng.normal(size=sizes[0]), np.ones(sizes[0]), np.eye(sizes[0])[0], (np.arange(sizes[0]) < 5) * 1.0]:
        want = float(np.sum((m.T @ g) ** 2))
        assert consistent_leaf_variance_weights(g, fanout=b, layers=layers) == pytest.approx(want, rel=1e-12)


QUERIES = [(0, 16), (15, 16), (5, 300), (37, 38), (100, 3000), (4000, 4200), (4095, 4097), (0, 8192)]


@pytest.mark.slow
@pytest.mark.parametrize("smoother", ["recent", "ema", "mean", "moving"])
def test_error_bar_matches_the_spread_of_replay_on_dns(smoother: str) -> None:
    """Over 400 keys, the variance of the released sum of each fixed range on the shipped DNS stream equals
    Eq. (1) of operators/error_bar.py. theta is fixed (public), so the bias is the same for every key and the spread
    is the noise alone. Tolerance: the sample variance of 400 draws of a (at worst Laplace-tailed) sum has a relative
    standard deviation of at most sqrt(5 / 400) = 11 %; we accept ratios in [0.70, 1.40] (about 3 of them)."""
    eps, theta, r, b, s = 0.5, 10.0, 4096, 4, 2
    x = datasets.load("dns")[:8192].astype(float)
    cfg = ToPSConfig(epsilon=eps, bound=500, theta=theta, query_range=r, fanout=b, smoother_layers=s, smoother=smoother)
    model = NoiseModel(epsilon=eps, theta=theta, fanout=b, query_range=r, smoother_layers=s, smoother=smoother)
    k = 400
    sums = np.empty((k, len(QUERIES)))
    for i in range(k):
        rel, _ = replay(x, cfg, i.to_bytes(4, "little") * 8)
        c = np.concatenate([[0.0], np.cumsum(rel)])
        sums[i] = [c[hi] - c[lo] for lo, hi in QUERIES]
    for q, (lo, hi) in enumerate(QUERIES):
        ratio = sums[:, q].var(ddof=1) / model.variance(np.arange(lo, hi))
        assert 0.70 < ratio < 1.40, (smoother, lo, hi, ratio)


def test_eq7_s_and_the_first_leaf() -> None:
    """s from Eq. 7 as the operator picks it; ticks of the first leaf before its end release the public prior."""
    cfg = ToPSConfig(epsilon=1.0, bound=500, theta=10.0)
    from operators import ToPS

    op = ToPS(cfg, bytes(32))
    op.process(np.ones(10))
    model = NoiseModel(epsilon=1.0, theta=10.0)
    assert model.s == op.smoother_layers and model.layers == cfg.height - op.smoother_layers
    assert model.variance(np.arange(model.leaf_ticks - 1)) == 0.0
    assert model.variance(np.arange(model.leaf_ticks)) > 0.0
    assert NoiseModel(epsilon=1.0, theta=10.0, smoother="median").variance(np.arange(5)) is None


def _daemon_jsonl(rel: np.ndarray, stream: str, theta: float, batch: int = 1) -> list[str]:
    objs = [{"stream": stream, "tick": i, "ts": 1_767_225_600.0 + 60 * i, "value": float(v), "epsilon": 1.0,
             "theta": theta} for i, v in enumerate(rel) if not np.isnan(v)]
    if batch == 1:
        return [json.dumps(o) for o in objs]
    return [json.dumps(objs[i : i + batch]) for i in range(0, len(objs), batch)]


def test_query_a_file_sums_windows_dedups_and_errs(tmp_path: Path) -> None:
    x = datasets.load("dns")[:6000].astype(float)
    cfg = ToPSConfig(epsilon=1.0, bound=500, holdout=1000, query_range=4096, fanout=4)
    rel, op = replay(x, cfg, bytes.fromhex(KEY))
    lines = _daemon_jsonl(rel, "dns", op.theta, batch=7) + _daemon_jsonl(rel[:3000], "dns", op.theta)[:50]  # repeats
    lines += _daemon_jsonl(np.ones(5), "other", 1.0)
    src = tmp_path / "rel.jsonl"
    src.write_text("\n".join(lines) + "\nnot json\n")
    params = ("--holdout", 1000, "--range", 4096, "--fanout", 4)
    res = tops("query", src, *params)
    assert res.returncode == 2 and "hold 2 streams (dns, other): choose one with --stream NAME" in res.stderr
    res = tops("query", src, "--stream", "dns", "--from", 1500, "--to", 2999, *params, "--json")
    assert res.returncode == 0, res.stderr
    ans = json.loads(res.stdout)
    assert ans["total"] == pytest.approx(float(np.nansum(rel[1500:3000])), abs=1e-6)
    assert ans["released"] == 1500 and ans["missing"] == 0
    model = NoiseModel(epsilon=1.0, theta=op.theta, fanout=4, query_range=4096)
    assert ans["stderr"] == pytest.approx(model.stderr(np.arange(500, 2000)))
    assert "50 repeated releases dropped" in res.stderr and "1 lines that are not releases" in res.stderr
    # per hour (60 ticks of a minute): every window's total, the windows tile the released ticks
    res = tops("query", src, "--stream", "dns", "--per", "hour", *params, "--json")
    hours = [json.loads(s) for s in res.stdout.splitlines()]
    assert sum(h["released"] for h in hours) == 5000
    assert len(hours) == 84 and hours[0]["released"] == 20  # ticks 1000..5999 are hours 16..99 of the first day
    assert sum(h["total"] for h in hours) == pytest.approx(float(np.nansum(rel)), abs=1e-6)
    # per 512 ticks, in the Python API; a window of ticks is aligned to tick 0
    r = Releases.from_file(src, {"holdout": 1000, "query_range": 4096, "fanout": 4})
    w = r.windows("dns", ticks=512)
    assert w[0].first == 512 and w[0].released == 24 and w[1].first == 1024
    assert r.duplicates == 50 and r.invalid == 1


def test_query_without_the_hierarchy_says_why_there_is_no_bar(tmp_path: Path) -> None:
    src = tmp_path / "r.jsonl"
    src.write_text("\n".join(_daemon_jsonl(np.array([np.nan] * 10 + [1.0] * 10), "s", 4.0)) + "\n")
    res = tops("query", src)  # default holdout 65536 cannot be: tick 10 is released
    assert res.returncode == 0, res.stderr
    assert "no error bar: a release at tick 10 precedes the holdout m = 65536" in res.stderr
    assert "sum 10 +- n/a" in res.stdout


@pytest.mark.network
@pytest.mark.slow
def test_query_live_from_the_daemon_topic(mosquitto, tmp_path: Path) -> None:
    """The daemon publishes; `tops query --host` listens to dp/#: the retained status gives the hierarchy, the sum
    equals the replay of the same readings with the same key, and the error bar is Eq. (1) of those parameters."""
    values = (np.arange(400) % 13).astype(float)
    mport = free_port()
    daemon = DaemonProcess(daemon_config(tmp_path, mosquitto.port, mport), mport, tmp_path)
    sub = Subscriber(mosquitto.port, "dp/#")
    query = None
    try:
        daemon.wait_connected()
        assert publish(mosquitto.port, "meters/a/reading", [f"{v:g}" for v in values[:100]]).returncode == 0
        wait_for(lambda: any(t == "dp/a/status" and '"releasing"' in p for t, p in sub.lines), 20,
                 what="releasing status")
        # the status can come before the releases of ticks 50..99: the query must subscribe after the last of them
        wait_for(lambda: any(p.get("tick") == 99 for p in sub.payloads()), 20, what="the release of tick 99")
        query = subprocess.Popen(
            [sys.executable, "-m", "stream.cli", "query", "--host", "127.0.0.1", "--port", str(mosquitto.port),
             "--stream", "a", "--releases", "300", "--seconds", "60", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        assert query.stderr is not None
        assert "listening on" in query.stderr.readline()
        assert publish(mosquitto.port, "meters/a/reading", [f"{v:g}" for v in values[100:]]).returncode == 0
        out, err = query.communicate(timeout=60)
        assert query.returncode == 0, err
        ans = json.loads(out)
        key = tmp_path / "master.key"
        np.save(tmp_path / "a_in.npy", values)
        res = tops("replay", tmp_path / "a_in.npy", "--epsilon", TEMPLATE["epsilon"], "--bound", TEMPLATE["bound"],
                   "--holdout", TEMPLATE["holdout"], "--range", TEMPLATE["query_range"],
                   "--fanout", TEMPLATE["fanout"], "--key-file", key, "--identity", find_identity(tmp_path),
                   "--stream", "a", "--out", tmp_path / "a.npy")
        assert res.returncode == 0, res.stderr
        expected = np.load(tmp_path / "a.npy")
        assert (ans["first"], ans["last"], ans["released"]) == (100, 399, 300)
        assert ans["total"] == pytest.approx(float(expected[100:].sum()), abs=1e-6)
        status = next(json.loads(p) for t, p in reversed(sub.lines) if t == "dp/a/status" and "params" in p)
        p = status["params"]
        model = NoiseModel(epsilon=p["epsilon"], theta=status["theta"], fanout=p["fanout"],
                           query_range=p["query_range"], smoother_layers=p["smoother_layers"])
        assert p["holdout"] == 50 and p["fanout"] == 4 and p["query_range"] == 256
        assert ans["stderr"] == pytest.approx(model.stderr(np.arange(50, 350)))
        assert "error bars from status message" in err
        assert daemon.stop() == 0
    finally:
        if query is not None and query.poll() is None:
            query.kill()
        sub.close()
        daemon.kill()

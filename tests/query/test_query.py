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
from stream.commands.replay import replay
from stream.query import Releases
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
    assert ans["noise_sd"] == pytest.approx(model.stderr(np.arange(500, 2000)))
    assert ans["low"] < ans["total"] < ans["high"] and ans["clamped_to_theta"]  # no status: no truncation statistic
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


def test_query_of_releases_without_a_status_says_why_there_is_no_interval(tmp_path: Path) -> None:
    """Releases saved without their status (an older daemon's output): the sum, no interval, and the reason; a
    holdout given by hand that the releases contradict is named."""
    src = tmp_path / "r.jsonl"
    src.write_text("\n".join(_daemon_jsonl(np.array([np.nan] * 10 + [1.0] * 10), "s", 4.0)) + "\n")
    res = tops("query", src)
    assert res.returncode == 0, res.stderr
    assert "no error bar: the releases carry no status" in res.stderr
    assert "sum 10  no interval" in res.stdout
    res = tops("query", src, "--holdout", 65536)
    assert "no error bar: a release at tick 10 precedes the holdout m = 65536" in res.stderr, res.stderr


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
             "--stream", "a", "--releases", "300", "--seconds", "60", "--json", "--level", "0.9999"],
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
                           query_range=p["query_range"], smoother_layers=p["smoother_layers"], start_sd=p["start_sd"])
        assert p["holdout"] == 50 and p["fanout"] == 4 and p["query_range"] == 256
        assert ans["noise_sd"] == pytest.approx(model.stderr(np.arange(50, 350)))
        # a run's noise is fresh (its identity is random, so the run is not seeded): at 95 % this misses in 1 run of
        # 20, at 99.99 % only with a bar far too narrow (coverage itself: tests/query/test_coverage.py, seeded)
        assert ans["low"] <= float(values[100:].sum()) <= ans["high"]
        assert "intervals from status" in err
        for key in ("mode", "mechanism", "epsilon", "holdout", "query_range", "fanout", "smoother_layers", "smoother",
                    "resolution", "bound", "truncation", "spread", "start_sd"):
            assert key in p, key
        assert status["generation"] == 1 and len(status["identity"]) == 32
        assert daemon.stop() == 0
    finally:
        if query is not None and query.poll() is None:
            query.kill()
        sub.close()
        daemon.kill()


# -- what the daemon publishes, read without a parameter -----------------------------------------------------------
def test_tops_query_on_the_quickstart_output_needs_no_parameter_and_holds_the_true_sum(tmp_path: Path) -> None:
    """The Quickstart (``tops simulate --streams 1 --ticks 5000 | tops run``): its stdout starts with the stream's
    status line, and ``tops query`` on it, with no parameter, gives a 95 % interval of the truncation term's kind.
    The daemon's key is new every run, so the intervals are checked at 99.9 % (``--level``): they hold the true sums
    of the whole range, of ticks 1000..1999 and of the 10 windows of 400 ticks (a miss in a correct run has a
    probability of about 1 %)."""
    sim = tops("simulate", "--streams", "1", "--ticks", "5000", "--seq-start", "0")
    assert sim.returncode == 0, sim.stderr
    run = subprocess.run([sys.executable, "-m", "stream.cli", "run", "--key-file", str(tmp_path / "k")],
                         input=sim.stdout, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    first = json.loads(run.stdout.splitlines()[0])
    assert first["phase"] == "releasing" and first["params"]["holdout"] == 1000 and "tick" not in first
    src = tmp_path / "rel.jsonl"
    src.write_text(run.stdout)
    res = tops("query", src)
    assert res.returncode == 0 and "in [" in res.stdout and "(95%, the true sum)" in res.stdout, res.stdout
    assert res.stderr.startswith("intervals from status (central tops, eps 1, ")
    truth = np.array([json.loads(x)["value"] for x in sim.stdout.splitlines()], dtype=float)
    for extra, lo, hi in [((), 1000, 4999), (("--from", 1000, "--to", 1999), 1000, 1999)]:
        res = tops("query", src, *extra, "--json", "--level", 0.9999)
        assert res.returncode == 0, res.stderr
        ans = json.loads(res.stdout)
        assert ans["low"] <= truth[lo:hi + 1].sum() <= ans["high"], (ans, truth[lo:hi + 1].sum())
        assert not ans["clamped_to_theta"] and ans["truncation_mean"] is not None
    res = tops("query", src, "--per", 400, "--json", "--level", 0.9999)
    windows = [json.loads(x) for x in res.stdout.splitlines() if json.loads(x)["first"] >= 1000]
    held = [w["low"] <= truth[w["first"]:w["last"] + 1].sum() <= w["high"] for w in windows]
    assert len(held) == 10 and all(held), windows


def _status(stream: str, generation: int, params: dict, theta: float = 4.0) -> str:
    return json.dumps({"stream": stream, "phase": "releasing", "theta": theta, "identity": "ab" * 16,
                       "generation": generation, "params": params})


PUBLIC = {"mode": "central", "mechanism": "tops", "epsilon": 1.0, "holdout": 0, "query_range": 16, "fanout": 4,
          "smoother_layers": 1, "smoother": "recent", "resolution": 1.0, "lower": 0.0, "bound": 8.0,
          "start_sd": 0.0, "truncation": None, "spread": None,
          "truncation_note": "theta is public: nothing measured the readings above it"}


def test_query_refuses_a_range_that_holds_releases_of_two_configurations(tmp_path: Path) -> None:
    """A file with a stream's releases under generation 1, then again from tick 0 under generation 2 (a new key): a
    range over both is refused in one line that says how to choose; ``--generation`` answers for one."""
    lines = [_status("s", 1, PUBLIC), *_daemon_jsonl(np.full(32, 2.0), "s", 4.0)]
    lines += [_status("s", 2, PUBLIC), *_daemon_jsonl(np.full(32, 3.0), "s", 4.0)]
    src = tmp_path / "two.jsonl"
    src.write_text("\n".join(lines) + "\n")
    res = tops("query", src)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, res.stderr
    assert "2 configurations" in res.stderr and "--generation" in res.stderr
    res = tops("query", src, "--generation", 2, "--json")
    ans = json.loads(res.stdout)
    assert (ans["total"], ans["released"]) == (96.0, 32) and ans["low"] < 96.0 < ans["high"], res.stderr
    assert Releases.from_file(src).range_sum(0, 31, generation=1).total == 64.0


def test_a_window_inside_the_first_leaf_gets_an_interval_of_nonzero_width(tmp_path: Path) -> None:
    """Releases of a stream whose first leaf (64 ticks) is not complete yet: every tick releases the start, and no
    leaf says how the readings vary. The interval is not a point: it spans the readings' bound [lower, theta]."""
    params = dict(PUBLIC, query_range=256, smoother_layers=3, bound=100.0)
    src = tmp_path / "early.jsonl"
    src.write_text("\n".join([_status("m", 1, params, theta=50.0), *_daemon_jsonl(np.full(5, 25.0), "m", 50.0)]))
    ans = Releases.from_file(src).range_sum(1, 4)
    assert ans.total == 100.0 and ans.low is not None and ans.high - ans.low >= 0.9 * 4 * 50.0, ans
    assert ans.low <= 0.03 * 200 and ans.high >= 0.97 * 200 and "bounded by theta" in ans.note  # 95 % of [0, 200]


def test_local_mode_releases_get_an_interval_without_parameters(tmp_path: Path) -> None:
    """A local-mode (ToPL) stream's status line and its releases (one unbiased Hybrid report a tick): ``tops query``
    needs no parameter, and the intervals (for the readings clamped to theta, which is what the reports estimate)
    hold the clamped sums of at least 90 % of 300 windows (each at 95 %)."""
    from operators.local.hybrid import hybrid_report
    from operators.noise import Domain, KeyedGenerator
    from operators.topl import ToPLConfig
    from stream.commands.simulate import simulate_values
    from stream.core.sinks import local_params

    theta, eps, n = 400.0, 1.0, 20_000
    x = simulate_values(n, seed=5)
    gen = KeyedGenerator(bytes(range(32)))
    u = gen.uniforms(int(Domain.LOCAL), 9, 0, 2 * n)
    rel = hybrid_report(x, theta, eps, u[:n], u[n:])
    params = local_params(ToPLConfig(epsilon=eps, bound=5000.0, holdout=1000))
    lines = [json.dumps({"stream": "m", "phase": "releasing", "theta": theta, "identity": "cd" * 16,
                         "generation": 1, "params": params})]
    lines += [json.dumps({"stream": "m", "tick": 1000 + i, "ts": 1.8e9, "value": float(v), "epsilon": eps,
                          "theta": theta}) for i, v in enumerate(rel)]
    src = tmp_path / "local.jsonl"
    src.write_text("\n".join(lines) + "\n")
    res = tops("query", src, "--json")
    assert res.returncode == 0 and res.stderr.startswith("intervals from status (local topl"), res.stderr
    assert json.loads(res.stdout)["clamped_to_theta"]
    releases = Releases.from_file(src)
    c = np.concatenate([[0.0], np.cumsum(np.minimum(x, theta))])
    rng = np.random.default_rng(2)
    held = 0
    for length in np.exp(rng.uniform(0, np.log(n), 300)).astype(int).tolist():
        a = int(rng.integers(0, n - length + 1))
        ans = releases.range_sum(1000 + a, 1000 + a + length - 1)
        held += ans.low <= c[a + length] - c[a] <= ans.high
    assert held >= 270, held


def test_query_plot_draws_the_released_totals_with_their_intervals_and_the_truth(tmp_path: Path) -> None:
    """``--plot FILE --truth READINGS`` writes a PNG of the totals per window (about 100 windows by default)."""
    pytest.importorskip("matplotlib")
    x = datasets.load("dns")[:6000].astype(float)
    cfg = ToPSConfig(epsilon=1.0, bound=500, theta=30.0, query_range=4096, fanout=4)
    rel, op = replay(x, cfg, bytes.fromhex(KEY))
    params = dict(PUBLIC, query_range=4096, smoother_layers=op.smoother_layers, bound=500.0)
    src, truth, png = tmp_path / "r.jsonl", tmp_path / "truth.npy", tmp_path / "r.png"
    src.write_text("\n".join([_status("dns", 1, params, theta=30.0), *_daemon_jsonl(rel, "dns", 30.0)]) + "\n")
    np.save(truth, x)
    res = tops("query", src, "--plot", png, "--truth", truth)
    assert res.returncode == 0, res.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"plot written to {png}" in res.stderr
    assert len(res.stdout.splitlines()) == 100


def test_the_python_api_answers_range_sums_and_windows_with_intervals(tmp_path: Path) -> None:
    x = datasets.load("dns")[:8192].astype(float)
    cfg = ToPSConfig(epsilon=1.0, bound=500, theta=30.0, query_range=4096, fanout=4)
    rel, op = replay(x, cfg, bytes.fromhex(KEY))
    params = dict(PUBLIC, query_range=4096, smoother_layers=op.smoother_layers, bound=500.0)
    src = tmp_path / "r.jsonl"
    src.write_text("\n".join([_status("dns", 1, params, theta=30.0), *_daemon_jsonl(rel, "dns", 30.0)]) + "\n")
    releases = Releases.from_file(src)
    ans = releases.range_sum(100, 5099)
    assert ans.total == pytest.approx(float(rel[100:5100].sum())) and ans.low < ans.total < ans.high
    hours = releases.per("hour")
    assert len(hours) == 137 and all(h.low is not None and h.low < h.high for h in hours)
    assert sum(h.released for h in hours) == 8192
    assert [a.released for a in releases.per(4096)] == [4096, 4096]


def test_a_local_mode_streams_status_line_says_what_its_releases_are() -> None:
    """A releasing local-mode stream's status (the line before its first release on stdout, the retained message on
    MQTT) states its mode and mechanism, epsilon, theta and holdout: what tops query reads it with."""
    from operators.topl import ToPLConfig
    from operators.topl_server import LocalServer
    from stream.core.router import StreamRecord
    from stream.core.sinks import status_line

    srv = LocalServer(ToPLConfig(epsilon=1.0, bound=64.0, holdout=3))
    rec = StreamRecord(name="d", operator=srv, name_json='"d"', identity="ef" * 16)
    assert status_line(rec) is None  # in its holdout: nothing released yet
    srv.observe_threshold(np.array([10.0, 20.0, 30.0]))
    rec.phase = srv.phase
    line = json.loads(status_line(rec))
    assert line["phase"] == "releasing" and line["theta"] == srv.theta and line["generation"] == 1
    assert {k: line["params"][k] for k in ("mode", "mechanism", "epsilon", "holdout")} == {
        "mode": "local", "mechanism": "topl-hybrid", "epsilon": 1.0, "holdout": 3}

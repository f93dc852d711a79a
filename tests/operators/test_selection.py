"""The calibrated choice of (theta, s) and the smoother's start (operators.selection).

Each test can fail: the noise constant against the operator's own noise, the accounting of the split, an empirical
privacy check on neighbouring holdouts, and accuracy against the paper's selection on streams where Eq. 7's bias
term is wrong.
"""

from __future__ import annotations

import hashlib
import itertools
import math

import numpy as np
import pytest

import operators.selection as sel
from operators.config import ConfigError, ToPSConfig, tree_height
from operators.evaluation import range_query_errors
from operators.threshold import candidate_grid, holdout_histogram
from operators.tops import ToPS


def _key(*parts: object) -> bytes:
    return hashlib.sha256("/".join(map(str, parts)).encode()).digest()


@pytest.mark.parametrize("s", [0, 1, 2])
def test_noise_constant_is_the_operators_own_noise(s: int) -> None:
    """G_s theta^2 / eps^2 is the variance of a random range's answer of the real operator (zero data).

    Tolerance: 80 keys x 400 ranges; the estimate's relative sd is about 6% at s = 2 (few top nodes), so 25%.
    """
    b, r, theta, eps = 4, 1024, 200.0, 1.0
    cfg = ToPSConfig(epsilon=eps, bound=1e6, holdout=0, theta=theta, query_range=r, fanout=b, smoother_layers=s)
    sq = []
    for k in range(80):
        op = ToPS(cfg, _key("g", s, k), start=0.0)
        rel = op.process(np.zeros(r))
        err = range_query_errors(np.zeros(r), rel, max_length=r, queries=400, rng=np.random.default_rng(k))
        sq.append(np.mean(err**2))
    measured = float(np.mean(sq))
    model = sel.noise_constant(b, r, s) * theta**2 / eps**2
    assert measured == pytest.approx(model, rel=0.25)
    # ... and it is not Eq. 6's constant with log_b r levels whatever s is (the paper) or log_b r + 1 (the reference)
    levels = math.log(r, b)
    for eq6 in (2 * (b - 1) * levels**3, 2 * (b - 1) * (levels + 1) ** 3):
        assert abs(eq6 * theta**2 - measured) > 0.5 * measured


def test_the_default_table_is_the_simulation() -> None:
    for s, g in enumerate(sel._DEFAULT_GAINS[(16, 1 << 20)]):
        assert sel.simulate_noise_gain(16, 1 << 20, s) == g


def test_noise_constant_falls_with_the_smoothed_layers() -> None:
    g = [sel.noise_constant(16, 1 << 20, s) for s in range(tree_height(1 << 20, 16))]
    assert all(a > b for a, b in itertools.pairwise(g))


def _holdout(rng: np.random.Generator, m: int) -> np.ndarray:
    return np.minimum(rng.poisson(3.0, size=m), 40).astype(np.float64)


def _choose(values: np.ndarray, key: bytes, eps_t: float, *, b=4, r=4096, bound=40):
    cands = candidate_grid(bound, 1.0)
    hist = holdout_histogram(values.astype(np.int64), cands)
    blocks = sel.BlockStats(b, values.size, bound, r)
    blocks.add(values.astype(np.int64))
    return sel.choose(hist, cands, blocks, gen=sel.KeyedGenerator(key), epsilon=1.0, threshold_epsilon=eps_t,
                      holdout=values.size, query_range=r, fanout=b)


def test_the_split_spends_exactly_the_threshold_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every private step is recorded with its epsilon; they add up to threshold_epsilon (sequential composition),
    the non-monotone percentile counted at twice its noise's rate."""
    rnm_eps: list[float] = []
    dlap_eps: list[float] = []
    real_rnm, real_dlap = sel.report_noisy_max, sel._dlap

    def rnm(score, uniforms, epsilon):
        rnm_eps.append(epsilon)
        return real_rnm(score, uniforms, epsilon)

    def dlap(gen, address, index, epsilon, sensitivity):
        dlap_eps.append(epsilon)
        return real_dlap(gen, address, index, epsilon, sensitivity)

    monkeypatch.setattr(sel, "report_noisy_max", rnm)
    monkeypatch.setattr(sel, "_dlap", dlap)
    values = _holdout(np.random.default_rng(0), 20000)
    out = _choose(values, _key("split"), 0.8)
    assert not out.fallback
    assert len(rnm_eps) == 2 and len(dlap_eps) >= 2
    assert 2 * rnm_eps[0] + rnm_eps[1] + sum(dlap_eps) == pytest.approx(0.8, rel=1e-12)
    assert sum(sel.BUDGET_SPLIT.values()) == pytest.approx(1.0)


def test_same_key_same_choice_other_key_other_noise() -> None:
    values = _holdout(np.random.default_rng(1), 8000)
    a = _choose(values, _key("det", 1), 0.05)
    assert _choose(values, _key("det", 1), 0.05) == a
    others = {_choose(values, _key("det", k), 0.05) for k in range(2, 12)}
    assert len(others) > 1


def test_neighbouring_holdouts_are_indistinguishable() -> None:
    """Empirical eps-DP of the whole choice (theta, s): one holdout value moved from 0 to the bound (and the block
    it sits in changed most). Over 1,500 keys per side, every outcome seen at least 60 times on one side has a
    frequency ratio below e^eps x 1.5 (the slack covers sampling error: at 60 counts the ratio's sd is ~ 18%)."""
    eps_t = 0.5
    rng = np.random.default_rng(7)
    base = _holdout(rng, 2048)
    base[1000] = 0.0
    other = base.copy()
    other[1000] = 40.0
    from collections import Counter

    def outcomes(values: np.ndarray) -> Counter:
        c: Counter = Counter()
        for k in range(1500):
            out = _choose(values, _key("dp", k), eps_t, r=1024, b=4)
            c[(out.theta_units, out.smoother_layers)] += 1
        return c

    a, b = outcomes(base), outcomes(other)
    for o in set(a) | set(b):
        hi, lo = max(a[o], b[o]), min(a[o], b[o])
        if hi >= 60:
            assert hi / max(lo, 1) <= math.exp(eps_t) * 1.5, (o, a[o], b[o])


def test_the_calibrated_choice_beats_the_papers_where_eq7_is_pessimistic() -> None:
    """A stationary stream (Poisson(3) per tick): Eq. 7's bias term ``b^(2s) theta^2 / 36`` says that big leaves
    predict badly, but here they predict well, and Eq. 6's c = 60 guesses the excess above theta 60x too high. The
    calibrated choice measures both: over 10 keys its mean MSE is below 0.7x the paper's (the issue's goal;
    measured here about 0.5x), with a larger s."""
    rng = np.random.default_rng(3)
    m, r = 65536, 1 << 20
    x = rng.poisson(3.0, size=m + r).astype(np.float64)
    base = ToPSConfig(epsilon=0.05, bound=500.0, holdout=m, query_range=r, fanout=16)
    mse = {"calibrated": [], "paper": []}
    layers = {"calibrated": [], "paper": []}
    for k in range(10):
        q = np.random.default_rng([9, k])
        for mode in mse:
            op = ToPS(base.replace(selection=mode), _key("acc", k))
            rel = op.process(x)[m:]
            err = range_query_errors(x[m:], rel, max_length=r, queries=1000, rng=q)
            mse[mode].append(float(np.mean(err**2)))
            layers[mode].append(op.smoother_layers)
    assert np.mean(mse["calibrated"]) < 0.7 * np.mean(mse["paper"])
    assert np.median(layers["calibrated"]) > np.median(layers["paper"])


def test_restart_in_the_holdout_gives_the_same_releases() -> None:
    """The block statistics are part of the holdout snapshot: a stop in the middle of a block changes nothing."""
    rng = np.random.default_rng(5)
    x = _holdout(rng, 3000)
    cfg = ToPSConfig(epsilon=0.5, bound=40.0, holdout=2000, query_range=1024, fanout=4)
    whole = ToPS(cfg, _key("restart")).process(x)
    op = ToPS(cfg, _key("restart"))
    first = op.process(x[:1234])
    snap = op.snapshot()
    assert "holdout_blocks" in snap
    again = ToPS.restore(cfg, _key("restart"), snap)
    one_by_one = [again.process_one(v) for v in x[1234:1300]]
    got = np.concatenate([first, one_by_one, again.process(x[1300:])])
    np.testing.assert_array_equal(got, whole)


def test_selection_is_checked() -> None:
    with pytest.raises(ConfigError, match="selection must be one of calibrated, paper"):
        ToPSConfig(epsilon=1.0, bound=10.0, selection="magic")


def test_old_snapshots_need_the_papers_selection_to_finish_their_holdout() -> None:
    cfg = ToPSConfig(epsilon=1.0, bound=10.0, holdout=100, query_range=256, fanout=4, selection="paper")
    op = ToPS(cfg, _key("old"))
    op.process(np.full(50, 3.0))
    snap = op.snapshot()
    del snap["config"]["selection"]  # as written before the calibrated selection existed
    ToPS.restore(cfg, _key("old"), snap)  # fine with selection = "paper"
    with pytest.raises(ValueError, match='set selection = "paper"'):
        ToPS.restore(cfg.replace(selection="calibrated"), _key("old"), snap)


def test_block_statistics_are_exact_however_the_holdout_arrives() -> None:
    """Sum of |differences of consecutive leaf sums|, per width and cap: all at once, in random pieces and one by
    one give the brute-force value."""
    rng = np.random.default_rng(8)
    units = rng.integers(0, 50, size=3000)
    whole = sel.BlockStats(4, 3000, 50, 1024)
    whole.add(units)
    pieces = sel.BlockStats(4, 3000, 50, 1024)
    cuts = np.sort(rng.choice(np.arange(1, 3000), size=40, replace=False))
    for part in np.split(units, cuts):
        pieces.add(part)
    single = sel.BlockStats(4, 3000, 50, 1024)
    for u in units[:700]:
        single.add(np.array([u]))
    single.add(units[700:])
    few = sel.BlockStats(4, 3000, 50, 1024)  # pieces of 1 to 12 readings: both of add's paths, interleaved
    start = 0
    while start < units.size:
        k = int(rng.integers(1, 13))
        few.add(units[start : start + k])
        start += k
    for i, w in enumerate(whole.widths):
        for j, cap in enumerate(whole.caps.tolist()):
            sums = np.minimum(units, cap)[: units.size // w * w].reshape(-1, w).sum(axis=1)
            brute = np.abs(np.diff(sums)).sum()
            for stats in (whole, pieces, single, few):
                assert stats.acc[i, j] == brute
                assert stats.pairs[i] == sums.size - 1
    for stats in (pieces, single, few):  # the whole state, not only the differences
        assert stats.pos == whole.pos
        for a, b in ((stats.partial, whole.partial), (stats.prev, whole.prev), (stats.acc, whole.acc)):
            assert np.array_equal(a, b) and a.dtype == b.dtype


def test_one_reading_at_a_time_with_checkpoints_gives_the_batch_releases() -> None:
    """The daemon's path: one reading per call (the block statistics buffer them) and checkpoints at odd moments in
    the holdout and after it; the releases equal one batch over the whole stream, bit for bit."""
    import json

    cfg = ToPSConfig(epsilon=0.5, bound=100.0, holdout=3000, query_range=4096, fanout=4)
    x = np.random.default_rng(3).integers(0, 60, 9000).astype(float)
    whole = ToPS(cfg, _key("one")).process(x)
    op, got = ToPS(cfg, _key("one")), []
    for i, v in enumerate(x):
        got.append(op.process_one(v))
        if i in (63, 777, 2998, 2999, 3500):
            op = ToPS.restore(cfg, _key("one"), json.loads(json.dumps(op.snapshot())))
    np.testing.assert_array_equal(np.array(got), whole)


def test_the_vectorised_model_is_the_scalar_model_bit_for_bit() -> None:
    """``_best_model`` (one array pass instead of a Python call per theta and s) must pick exactly what the
    scalar model picks: the same float64 at every theta, random parameters included."""
    from operators.selection import _best_model

    rng = np.random.default_rng(13)
    for _ in range(200):
        fanout = int(rng.integers(2, 9))
        query_range = int(fanout ** rng.integers(2, 9))
        s_options = list(range(int(rng.integers(1, 8))))
        G = {s: float(rng.uniform(0.01, 50)) for s in s_options}
        sm = {s: float(rng.uniform(0, 1e4)) for s in s_options}
        eps, eps_s, m = float(rng.uniform(0.01, 5)), float(rng.uniform(0.001, 1)), int(rng.integers(1, 10**5))
        thetas = np.unique(rng.uniform(0.5, 1e5, 80).round())

        def model(theta: float, s: int, b: int, r: int, e: float, es: float, mm: int, g: dict, sms: dict) -> float:
            w = b**s
            start_var = 2.0 * (theta / (es * mm)) ** 2
            first_leaf = min(1.0, w / r) * w * w / 3.0 * start_var
            return g[s] * theta * theta / (e * e) + sms[s] + first_leaf

        want = np.array([min(model(t, s, fanout, query_range, eps, eps_s, m, G, sm) for s in s_options)
                         for t in thetas.tolist()])
        got = _best_model(thetas, s_options, G, sm, epsilon=eps, eps_s=eps_s, m=m, fanout=fanout,
                          query_range=query_range)
        assert np.array_equal(got, want)

"""The holdout's statistics for error bars (operators/truncation.py, operators/spread.py, operators/error_stats.py)
and the pieces of the interval (operators/error_bar.py): what they measure, that every path to them gives the same
numbers, that a status may carry anything without breaking a consumer, and the quantile engine against exact
distributions."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
from scipy import stats

from operators import ToPS, ToPSConfig
from operators.columnar_holdout import holdout_store
from operators.error_bar import NoiseModel, consistent_leaf_variance_weights, quantiles
from operators.error_stats import budgets
from operators.noise import KeyedGenerator, KeyRows
from operators.spread import SPREAD_SHARE, Spread
from operators.threshold import candidate_grid, holdout_histogram
from operators.truncation import (
    TRUNCATION_SHARE,
    Truncation,
    excess_counts,
    excess_edges,
    histogram_measured,
    noisy_statistic,
    noisy_statistics_table,
    sum_noise,
)
from stream.core.sinks import central_params


def key(i: int) -> bytes:
    return hashlib.sha256(f"error-stats/{i}".encode()).digest()


def test_the_budgets_of_the_holdout_add_up_to_the_threshold_budget() -> None:
    for eps in (0.1, 1.0, 3.7):
        assert sum(budgets(eps)) == pytest.approx(eps, rel=1e-15)
        assert budgets(eps)[1:] == pytest.approx((TRUNCATION_SHARE * eps, SPREAD_SHARE * eps))


def test_excess_counts_and_sum_are_the_holdouts_readings_above_theta() -> None:
    rng = np.random.default_rng(1)
    values = rng.integers(0, 300, size=5000)
    cands = candidate_grid(300.0, 1.0)
    hist = holdout_histogram(values, cands)
    counts, total = excess_counts(hist, cands, theta_units=120, bound_units=300)
    edges = excess_edges(180)
    x = values[values > 120] - 120
    want = np.histogram(x, bins=edges)[0]
    assert counts.tolist() == want.tolist() and total == int(x.sum())


def test_many_streams_draw_the_same_statistics_as_each_alone() -> None:
    """The columnar path (noisy_statistics_table, one draw per bin for all streams) gives each stream the very
    numbers its own operator draws (noisy_statistic), whatever its theta."""
    rng = np.random.default_rng(2)
    stats_, tops_, keys = [], [], []
    for i in range(7):
        theta = int(rng.integers(1, 60))
        c, s = excess_counts(holdout_histogram(rng.integers(0, 64, 500), candidate_grid(64.0, 1.0)),
                             candidate_grid(64.0, 1.0), theta_units=theta, bound_units=64)
        stats_.append((c, s))
        tops_.append(64 - theta)
        keys.append(np.frombuffer(key(i), dtype=np.uint8))
    keys_arr = np.stack(keys)
    for holdout in (500, 10):  # with the excess histogram, and too short for it (the sum alone)
        nbins = np.array([len(c) for c, _ in stats_])
        counts = np.zeros((len(stats_), nbins.max()), dtype=np.int64)
        for i, (c, _) in enumerate(stats_):
            counts[i, :len(c)] = c
        table, sizes = noisy_statistics_table(counts, nbins, [t for _, t in stats_], keys_arr, 0.3, tops_, holdout)
        many = [table[i, :n].astype("<f8").tobytes() for i, n in enumerate(sizes.tolist())]
        for (c, s), t, k, got in zip(stats_, tops_, keys_arr, many, strict=True):
            assert got == noisy_statistic(c, s, KeyedGenerator(k.tobytes()), 0.3, t, holdout)
            assert len(got) == (8 * (1 + len(c)) if holdout == 500 else 8)
    assert len(KeyRows(keys_arr)) == 7


def test_the_excess_counts_of_many_streams_are_each_streams_own_whatever_its_theta() -> None:
    """One histogram over the largest top's edges, cut at each stream's bins, gives every stream the counts and sum of
    its own histogram: thetas from 0 to the bound (tops from the bound down to nothing, below and above the unit
    bins), readings below, at and above theta."""
    from operators.error_stats import _excess_rows

    rng = np.random.default_rng(5)
    bound = 300
    thetas = np.array([0, 1, 2, 5, 8, 9, 10, 17, 150, 292, 293, 299, 300, *rng.integers(0, bound + 1, 40)])
    values = rng.integers(0, bound + 1, size=(len(thetas), 30))
    values[:, 0] = bound  # the largest excess each stream can have
    grid = np.arange(bound + 1)
    counts_table, nbins, totals = _excess_rows(values, thetas, bound - thetas)
    got = [(counts_table[k, :nbins[k]], totals[k]) for k in range(len(thetas))]
    for row, theta, (counts, total) in zip(values, thetas.tolist(), got, strict=True):
        want_counts, want_total = excess_counts(np.bincount(row, minlength=bound + 1), grid, theta_units=theta,
                                                bound_units=bound)
        assert counts.tolist() == want_counts.tolist() and total == want_total, theta


def test_a_stream_that_ends_its_holdout_in_rows_states_what_its_own_operator_measures(compiled_kernels: None) -> None:
    """A short holdout that ends in rows (no operator object on the way) gets the error statistics the stream's own
    ToPS measures when its holdout ends: the same bytes."""
    from operators.columnar_holdout import ends_in_rows

    cfg = ToPSConfig(epsilon=1.0, bound=50.0, holdout=12, query_range=256, fanout=16)
    assert ends_in_rows(cfg)
    store = holdout_store(cfg)
    rng = np.random.default_rng(3)
    keys = [key(100 + i) for i in range(20)]
    rows = store.add_new_many(keys)
    values = rng.integers(0, 60, size=(20, 12)).astype(float)
    store.process(np.repeat(rows, 12), values.reshape(-1), end=True)
    chosen = store.choose_ends(rows)
    assert chosen is not None  # the rows' own choice: the compiled kernels are loaded
    thetas = chosen[0]
    got = store.error_stats(rows, thetas)
    for i, k in enumerate(keys):
        op = ToPS(cfg, k)
        op.process(values[i])
        assert op.theta_units == thetas[i]
        assert got[i] == op.error_stats, i


def test_the_excess_sum_is_unbiased_and_its_noise_is_as_stated() -> None:
    """Over 4,000 keys, the noisy excess sum's mean is the true sum within 4 standard errors and its spread is the
    stated variance within 10 % (the sample variance of 4,000 Laplace draws has a relative sd of about 3.5 %)."""
    counts, total = np.array([40, 7, 3], dtype=np.int64), 120
    draws = np.array([np.frombuffer(noisy_statistic(counts, total, KeyedGenerator(key(i)), 0.5, 40, 1000),
                                    "<f8")[0] for i in range(4000)])
    var = sum_noise(0.5, 40, histogram_measured(0.5, 1000)).variance
    assert abs(draws.mean() - total) < 4 * math.sqrt(var / draws.size)
    assert draws.var() == pytest.approx(var, rel=0.1)


def test_a_bound_beyond_the_samplers_range_leaves_the_statistic_out_and_says_so() -> None:
    """(B - theta) / eps_s beyond 2^36 (a tiny threshold budget; beyond it for every theta under 9,175): the excess
    sum's noise would be beyond the exact sampler's range. The holdout still ends (theta chosen, releases start) and
    the status says the statistic was not measured."""
    cfg = ToPSConfig(epsilon=1.0, bound=10_000.0, holdout=200, query_range=256, fanout=4, threshold_epsilon=1e-7)
    op = ToPS(cfg, key(7))
    out = op.process(np.full(300, 5.0))
    assert np.isfinite(out[200:]).all()
    p = central_params(cfg, op.theta_units, op.smoother_layers, op.error_stats)
    assert p["truncation"] is None and "beyond the exact sampler's range" in p["truncation_note"]


@pytest.mark.parametrize("bad", [
    None, [], {"edges": [1.0], "counts": [1]}, {"edges": [2.0, 1.0], "counts": [1]},
    {"edges": [1.0, 2.0], "counts": [1.5]}, {"edges": [1.0, float("inf")], "counts": [1]},
    {"edges": [1.0, 2.0], "counts": [1], "holdout": 0}, {"edges": [1.0, 2.0], "counts": [True]},
    {"edges": [1.0, 2.0], "counts": [1], "holdout": 10, "count_variance": -1.0, "sum_variance": 1.0,
     "excess_sum": 3.0},
    {"edges": [1.0, 2.0], "counts": [1], "holdout": 10, "count_variance": 1.0, "sum_variance": 1.0,
     "excess_sum": "x"},
    {"edges": list(range(1, 5000)), "counts": [1] * 4998, "holdout": 10},
])
def test_a_malformed_truncation_statistic_is_refused_with_a_reason(bad) -> None:
    with pytest.raises(ValueError, match="truncation"):
        Truncation.from_status(bad)


@pytest.mark.parametrize("bad", [
    None, {"holdout": 0, "sum": 1.0, "squares": 1.0, "sum_variance": 0.0, "squares_variance": 0.0},
    {"holdout": 5, "sum": float("nan"), "squares": 1.0, "sum_variance": 0.0, "squares_variance": 0.0},
    {"holdout": 5, "sum": 1.0, "squares": 1.0, "sum_variance": -1.0, "squares_variance": 0.0},
    {"holdout": 5, "sum": 1.0, "squares": 1.0, "sum_variance": 0.0, "squares_variance": 0.0, "widths": [4, 2],
     "mean_abs": [1.0, 1.0], "abs_variance": [0.0, 0.0]},
    {"holdout": 5, "sum": 1.0, "squares": 1.0, "sum_variance": 0.0, "squares_variance": 0.0, "widths": [4],
     "mean_abs": [], "abs_variance": []},
])
def test_a_malformed_spread_statistic_is_refused_with_a_reason(bad) -> None:
    with pytest.raises(ValueError, match="spread"):
        Spread.from_status(bad)


def test_the_shape_keeps_pools_of_bins_above_their_noise_and_drops_noise_alone() -> None:
    """Empty bins with noise (sd 10) above two real ones: the real bins are kept, the noise pools are not."""
    rng = np.random.default_rng(5)
    counts = [400, 200, *rng.laplace(0.0, 10.0 / math.sqrt(2), size=12).round().astype(int).tolist()]
    edges = tuple(float(e) for e in excess_edges(200)[: len(counts) + 1])
    t = Truncation(edges=edges, counts=tuple(counts), count_variance=100.0, excess_sum=800.0, sum_variance=0.0,
                   holdout=10_000)
    _, p = t.shape()
    assert p[0] == pytest.approx(0.04) and p[1] == pytest.approx(0.02)
    assert p[2:].sum() < 0.1 * p[:2].sum()


# -- the quantiles of Eq. (4) --------------------------------------------------------------------------------------
def test_quantiles_of_one_laplace_term_are_laplaces_not_the_normals() -> None:
    lo, hi = quantiles(laplace=np.array([2.0]), normal=0.0)
    want = stats.laplace.ppf(0.975, scale=1.0)  # variance 2 b^2 = 2
    assert hi == pytest.approx(want, rel=1e-3) and lo == pytest.approx(-want, rel=1e-3)
    assert hi > 1.96 * math.sqrt(2.0) * 1.05


def test_quantiles_of_a_sum_of_laplace_uniform_and_normal_parts_match_their_exact_distribution() -> None:
    """Against 2 million draws of the same sum (the sample quantile is within 0.2 %)."""
    rng = np.random.default_rng(6)
    n = 2_000_000
    y = rng.laplace(0, 1.0, n) + rng.laplace(0, 0.5, n) + rng.normal(0, 0.7, n) + rng.uniform(-3.0, 3.0, n)
    lo, hi = quantiles(laplace=np.array([2.0, 0.5]), normal=0.49, uniform=np.array([3.0]))
    q = np.quantile(y, [0.025, 0.975])
    assert lo == pytest.approx(q[0], rel=0.01) and hi == pytest.approx(q[1], rel=0.01)


@pytest.mark.parametrize("n", [1, 5, 40])
def test_quantiles_of_a_compound_of_rare_large_values_are_skewed_as_its_sum_is(n: int) -> None:
    """n draws of 0, 10 (p 0.01) or 300 (p 0.005) less their mean, plus a normal: the upper quantile reaches the
    large values once they are likely enough (against 2 million draws)."""
    rng = np.random.default_rng(7)
    x, p = np.array([10.0, 300.0]), np.array([0.01, 0.005])
    m = 1_000_000
    draws = rng.choice([0.0, 10.0, 300.0], size=(m, n), p=[1 - p.sum(), *p]).sum(axis=1)
    y = draws - n * float(p @ x) + rng.normal(0, 2.0, m)
    lo, hi = quantiles(laplace=np.zeros(0), normal=4.0, compound=(n, x, p))
    q = np.quantile(y, [0.025, 0.975])
    assert lo == pytest.approx(q[0], abs=0.02 * (q[1] - q[0]) + 0.1)
    assert hi == pytest.approx(q[1], abs=0.02 * (q[1] - q[0]) + 0.1)


def test_the_pair_variance_by_common_ancestor_is_the_dense_trees() -> None:
    """Var[Z_{k+1} - Z_k] from the layer where the two leaves meet equals the dense computation for every k."""
    m = NoiseModel(epsilon=1.0, theta=10.0, fanout=4, query_range=256, smoother_layers=1)
    lpt = m.leaves_per_tree
    want = []
    for k in range(2 * lpt - 1):
        if k // lpt != (k + 1) // lpt:
            want.append(2 * m.leaf_variance)
            continue
        g = np.zeros(lpt)
        g[k % lpt], g[(k + 1) % lpt] = -1.0, 1.0
        want.append(consistent_leaf_variance_weights(g, fanout=4, layers=m.layers) * m.node_variance)
    assert m.pair_variance(np.arange(2 * lpt - 1)) == pytest.approx(np.array(want), rel=1e-12)


# -- kept with the stream, stated in its status --------------------------------------------------------------------
@pytest.mark.parametrize("step", [1, 40])
def test_a_stream_states_its_statistics_by_every_path_and_after_a_restore(step: int) -> None:
    """Streams of a router with rows end their holdout one by one (step 1: each operator's own path) or many in a
    step (rows): each record keeps what its own operator measures, its status states it, and a record restored from
    the stored state states the same."""
    from stream.core.router import Router
    from stream.core.sinks import encode_status, release_params, status_line
    from stream.state.records import apply_state, record_state

    cfg = ToPSConfig(epsilon=1.0, bound=100, holdout=20, query_range=256, fanout=4)
    router = Router(lambda name: ToPS(cfg, hashlib.sha256(name.encode()).digest()), 100)
    router.use_columns(capacity=8, ahead=3)
    rng = np.random.default_rng(step)
    names = [f"m{i}" for i in range(12)]
    values = {n: rng.uniform(0, 120, 40).tolist() for n in names}
    feed = [(n, v) for i in range(40) for n in names for v in [values[n][i]]]
    for i, (name, v) in enumerate(feed):
        assert router.add(router.record(name), v, None, None, 0.0) == "ok"
        if (i + 1) % step == 0:
            router.flush()
    router.flush()
    for name in names:
        rec = router.streams[name]
        alone = ToPS(cfg, hashlib.sha256(name.encode()).digest())
        alone.process(np.array(values[name]))
        assert rec.error_stats == alone.error_stats is not None, name
        status = json.loads(encode_status(rec))
        assert status["params"]["truncation"]["holdout"] == 20 and status["params"]["spread"] is not None
        # the text a status is sent as (the template's part encoded once) is the whole object's encoding
        whole = {**rec.status(), "params": release_params(rec)}
        assert encode_status(rec) == json.dumps(whole, separators=(",", ":")).encode() == status_line(rec).encode()
        other = Router(lambda n: ToPS(cfg, hashlib.sha256(n.encode()).digest()), 100).record(name)
        apply_state(other, json.loads(json.dumps(record_state(rec))))
        assert other.error_stats == rec.error_stats

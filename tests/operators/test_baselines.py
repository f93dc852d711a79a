"""Baselines: PAK's smooth sensitivity against brute force, noise laws against closed forms, node answers against an
independent decomposition, shared checks over every method, the paper's ordering on real data."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from operators import ToPS, ToPSConfig
from operators.baselines import LABELS, METHODS, Counter, Flat, Hierarchy, make
from operators.baselines.pak import percentile_rank, smooth_percentile_threshold, smooth_sensitivity
from operators.noise import KeyedGenerator
from stream.commands import datasets
from stream.commands.scoring import repetition_key

KEY = bytes(range(32))


def _key(i: int) -> bytes:
    return repetition_key(12345, i)


# -- PAK: smooth sensitivity (Appendix B) -------------------------------------------------------------------------
def _brute_force_ss(x: list[int], rank: int, b: float, upper: int) -> float:
    """max over every dataset y in {0..upper}^m of LS(y) e^(-b d(x, y)), LS by changing one entry every way."""
    m = len(x)
    ys = np.array(list(itertools.product(range(upper + 1), repeat=m)))
    f = np.sort(ys, axis=1)[:, rank - 1]
    ls = np.zeros(len(ys))
    for i in range(m):
        for v in range(upper + 1):
            y2 = ys.copy()
            y2[:, i] = v
            ls = np.maximum(ls, np.abs(np.sort(y2, axis=1)[:, rank - 1] - f))
    d = (ys != np.array(x)).sum(axis=1)
    return float((ls * np.exp(-b * d)).max())


def _formula_ss(x: np.ndarray, rank: int, b: float, upper: float) -> float:
    """Appendix B's formula evaluated literally, O(m^2)."""
    v = np.sort(x)
    m = v.size

    def V(i: int) -> float:
        return 0.0 if i < 1 else (float(upper) if i > m else float(v[i - 1]))

    return max(math.exp(-b * k) * max(V(rank + t) - V(rank + t - k - 1) for t in range(k + 2)) for k in range(m + 2))


@pytest.mark.parametrize("seed", range(8))
def test_smooth_sensitivity_matches_brute_force_on_small_inputs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(5):
        m, upper = int(rng.integers(2, 6)), int(rng.integers(2, 6))
        x = rng.integers(0, upper + 1, m)
        rank = int(rng.integers(1, m + 1))
        b = float(rng.choice([0.05, 0.3, 1.0, 2.0]))
        expected = _brute_force_ss(list(x), rank, b, upper)
        assert smooth_sensitivity(np.sort(x), rank=rank, b=b, upper=upper) == pytest.approx(expected, abs=1e-12)
        assert _formula_ss(x, rank, b, upper) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_smooth_sensitivity_fast_path_equals_the_formula_on_larger_inputs(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    m = 300
    x = np.minimum(rng.geometric(0.05, m), 400)  # heavy ties, a long tail
    for p in (50.0, 95.0, 99.5):
        rank = percentile_rank(m, p)
        for b in (1e-3, 0.02, 0.5):
            assert smooth_sensitivity(np.sort(x), rank=rank, b=b, upper=500) == pytest.approx(
                _formula_ss(x, rank, b, 500), rel=1e-12
            )


def test_percentile_rank_is_the_reference_index() -> None:
    assert percentile_rank(65536, 99.5) == int(65536 * 0.995) + 1
    assert percentile_rank(10, 100.0) == 10
    assert percentile_rank(10, 0.0) == 1


def test_s_pak_rarely_falls_below_the_percentile_and_s_p_is_centred() -> None:
    """S-PAK's shift keeps P(theta < x_p) near beta = 0.006; S-P is centred on x_p (discrete Laplace, P(0) ~ 4%).

    4,000 keys each: under H0 the S-PAK count is Binomial(4000, <= 0.006) with mean <= 24, so <= 60 has a margin of
    more than 7 standard deviations; the S-P fraction below x_p is 0.48 with sd 0.008.
    """
    x = np.sort(np.random.default_rng(7).integers(0, 1001, 2000))
    rank = percentile_rank(x.size, 99.5)
    x_p = int(x[rank - 1])
    below = {True: 0, False: 0}
    n = 4000
    for shifted in (True, False):
        for i in range(n):
            theta = smooth_percentile_threshold(
                x, epsilon=1.0, delta=1e-8, upper=1000, shifted=shifted, gen=KeyedGenerator(_key(i)), domain=7
            )
            below[shifted] += theta < x_p
    assert below[True] <= 60
    assert 0.42 <= below[False] / n <= 0.54


# -- hierarchies: node answers and noise law ----------------------------------------------------------------------
def _reference_range(nodes: list[np.ndarray], b: int, lo: int, hi: int) -> float:
    """Top-down search like the reference code: take a node fully inside [lo, hi), else look at its children."""
    top = len(nodes) - 1
    result = 0.0
    frontier = [(top, i) for i in range(nodes[top].size)]
    while frontier:
        nxt = []
        for j, i in frontier:
            a, z = i * b**j, (i + 1) * b**j
            if z <= lo or a >= hi:
                continue
            if lo <= a and z <= hi:
                result += nodes[j][i]
            elif j > 0:
                nxt += [(j - 1, c) for c in range(i * b, (i + 1) * b)]
        frontier = nxt
    return result


@pytest.mark.parametrize(("fanout", "r"), [(2, 64), (4, 64), (16, 256)])
def test_hierarchy_range_queries_use_the_canonical_nodes(fanout: int, r: int) -> None:
    """range_queries equals an independent top-down decomposition over the released nodes, across tree borders."""
    x = np.random.default_rng(3).poisson(4.0, 5 * r).astype(float)  # whole trees: the reference starts at the tops
    op = Hierarchy(ToPSConfig(epsilon=0.5, bound=50, theta=6, query_range=r), KEY, fanout=fanout)
    op.process(x[:100])
    op.process(x[100:])
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, r + 1, 300)
    starts = (rng.random(300) * (x.size - lengths + 1)).astype(np.int64)
    got = op.range_queries(starts, lengths)
    nodes = op.node_values()
    for s, ln, g in zip(starts, lengths, got, strict=True):
        assert g == pytest.approx(_reference_range(nodes, fanout, int(s), int(s + ln)), abs=1e-6)
    assert op.range_query(5, 5) == pytest.approx(nodes[0][5])


def test_hierarchy_node_noise_law() -> None:
    """Every layer's node noise has the discrete Laplace variance at eps / h (sensitivity theta), within 3%."""
    cfg = ToPSConfig(epsilon=0.8, bound=20, theta=4, query_range=2**10)
    x = np.random.default_rng(5).integers(0, 9, 2**18).astype(float)
    op = Hierarchy(cfg, KEY, fanout=2)
    op.process(x)
    assert op.layers == 10
    assert op.noise.a == pytest.approx(math.exp(-(0.8 / 10) / 4))
    t = np.minimum(x, 4)
    for j, nodes in enumerate(op.node_values()[:5]):
        truth = t.reshape(-1, 2**j).sum(axis=1)
        assert np.var(nodes - truth) == pytest.approx(op.node_variance, rel=0.03), f"layer {j}"


def test_flat_noise_variance() -> None:
    op = Flat(ToPSConfig(epsilon=0.5, bound=10, theta=3), KEY)
    x = np.full(200_000, 2.0)
    noise = op.process(x) - 2.0
    assert noise.var() == pytest.approx(op.tick_variance, rel=0.03)
    assert abs(noise.mean()) < 4 * math.sqrt(op.tick_variance / x.size)


# -- the counter ---------------------------------------------------------------------------------------------------
def test_counter_noise_variance_matches_its_closed_form() -> None:
    """Over 20,000 independent trees of 16 ticks: Var(noisy prefix after c ticks) = popcount(c) * 2a/(1-a)^2 for
    every c (within 6%: the relative standard error of a variance with kurtosis <= 6 is <= 1.7% here), and the
    counter's range answer S(j) - S(i-1) has variance |S(j) xor S(i-1)| * Var (nodes shared by both cancel)."""
    cfg = ToPSConfig(epsilon=1.0, bound=10, theta=3, query_range=16)
    op = Counter(cfg, KEY)
    assert (op.levels, op.tree_ticks) == (5, 16)
    assert op.noise.a == pytest.approx(math.exp(-(1.0 / 5) / 3))
    trees = 20_000
    x = np.random.default_rng(6).integers(0, 4, trees * 16).astype(float)
    rel = op.process(x).reshape(trees, 16)
    prefix_noise = np.cumsum(rel, axis=1) - np.cumsum(np.minimum(x, 3).reshape(trees, 16), axis=1)
    for c in range(1, 17):
        assert prefix_noise[:, c - 1].var() == pytest.approx(op.prefix_variance(c), rel=0.06), f"c = {c}"
    # ranges [i, j] (1-based counts): S(j) - S(i-1). 7 = 111b vs 4 = 100b share the level-2 node: 2 nodes remain
    for i, j, nodes in ((5, 7, 2), (2, 8, 2), (9, 16, 2), (4, 13, 5)):
        diff = prefix_noise[:, j - 1] - (prefix_noise[:, i - 2] if i > 1 else 0)
        assert diff.var() == pytest.approx(nodes * op.node_variance, rel=0.06), (i, j)


def test_counter_tree_total_is_true_total_plus_root_noise_only() -> None:
    """The releases of a whole tree add up to its true sum plus one node (the root): popcount(T) = 1."""
    cfg = ToPSConfig(epsilon=1.0, bound=10, theta=3, query_range=8)
    op = Counter(cfg, KEY)
    rel = op.process(np.full(8 * 4000, 2.0)).reshape(-1, 8)
    assert (rel.sum(axis=1) - 16).var() == pytest.approx(op.node_variance, rel=0.1)


# -- one set of checks over every method ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_shared_checks(name: str) -> None:
    """NaN exactly on the holdout; batching never changes a release; same key same output, other key other output;
    the repr never shows the key; a label for the plots."""
    cfg = ToPSConfig(epsilon=0.5, bound=40, holdout=300, query_range=256, fanout=16)
    x = np.random.default_rng(8).poisson(5.0, 1500).astype(float)
    whole = make(name, cfg, KEY).process(x)
    assert np.isnan(whole[:300]).all() and np.isfinite(whole[300:]).all()
    op = make(name, cfg, KEY)
    parts = np.concatenate([op.process(p) for p in np.split(x, [1, 299, 300, 301, 777, 1024])])
    assert np.array_equal(whole, parts, equal_nan=True)
    other = make(name, cfg, bytes(32)).process(x)
    if name == "zero":
        assert np.array_equal(whole, other, equal_nan=True)
    else:
        assert not np.array_equal(whole[300:], other[300:])
    assert (KEY.hex() not in repr(op) and "secret" in repr(op)) or name == "zero"
    assert name in LABELS
    if getattr(op, "answers_from_nodes", False):
        ans = op.range_queries(np.array([0, 10]), np.array([1, 100]))
        assert ans.shape == (2,) and np.isfinite(ans).all()


def test_h16c_is_tops_without_smoother_and_tops_is_tops() -> None:
    cfg = ToPSConfig(epsilon=0.5, bound=40, theta=6, query_range=256)
    x = np.random.default_rng(9).poisson(5.0, 1000).astype(float)
    h16c = make("h16c", cfg, KEY).process(x)
    assert np.array_equal(h16c, ToPS(cfg.replace(smoother_layers=0), KEY).process(x))
    assert np.array_equal(make("tops", cfg, KEY).process(x), ToPS(cfg, KEY).process(x))


def test_unknown_method_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        make("nope", ToPSConfig(epsilon=1.0, bound=10), KEY)


# -- the paper's ordering on real data -----------------------------------------------------------------------------
def _paired_mse(values, truth, cfg, methods, reps, hold):
    """MSE of each method per repetition, all methods on the same 200 queries of that repetition."""
    n = values.size - hold
    ct = np.concatenate([[0.0], np.cumsum(truth[hold:])])
    out = {m: [] for m in methods}
    for rep in range(reps):
        rng = np.random.default_rng(rep)
        lengths = rng.integers(1, min(cfg.query_range, n) + 1, 200)
        starts = (rng.random(200) * (n - lengths + 1)).astype(np.int64)
        exact = ct[starts + lengths] - ct[starts]
        for m in methods:
            op = make(m, cfg, _key(rep))
            rel = op.process(values)
            if getattr(op, "answers_from_nodes", False):
                ans = op.range_queries(starts, lengths)
            else:
                cr = np.concatenate([[0.0], np.cumsum(rel[hold:])])
                ans = cr[starts + lengths] - cr[starts]
            out[m].append(np.mean((ans - exact) ** 2))
    return {m: np.array(v) for m, v in out.items()}


def _significantly_below(a: np.ndarray, b: np.ndarray) -> float:
    """Mean of log(b / a) over paired repetitions; asserts it exceeds 3 standard errors. Returns the ratio."""
    d = np.log(b / a)
    assert d.mean() > 3 * d.std(ddof=1) / math.sqrt(d.size), (d.mean(), d.std(ddof=1))
    return float(math.exp(d.mean()))


@pytest.mark.slow
def test_stream_phase_ordering_on_dns_h16c_below_h16_below_h2() -> None:
    """Figure 5's ordering at a fixed theta (p95 of a prefix), 2^15 DNS ticks, r = 4096, eps = 0.1, 20 keys: H16c <
    H16 < H2 with 3-standard-error margins; the ratios are near the paper's (5x fan-out, 2x consistency)."""
    x = datasets.load("dns").astype(float)
    theta = float(np.percentile(x[:4096], 95))
    values = x[4096 : 4096 + 2**15]
    cfg = ToPSConfig(epsilon=0.1, bound=500, theta=theta, query_range=4096)
    mse = _paired_mse(values, np.minimum(values, theta), cfg, ["h2", "h16", "h16c"], reps=20, hold=0)
    fanout = _significantly_below(mse["h16"], mse["h2"])
    consistency = _significantly_below(mse["h16c"], mse["h16"])
    assert 2.0 < fanout < 10.0
    assert 1.3 < consistency < 4.0


@pytest.mark.slow
def test_end_to_end_tops_far_below_pak_on_dns() -> None:
    """Figure 3's headline on 4,096 + 2^15 DNS ticks (B = 500, eps = 0.1, 10 keys): ToPS below PAK by > 100x."""
    x = datasets.load("dns").astype(float)[: 4096 + 2**15]
    cfg = ToPSConfig(epsilon=0.1, bound=500, holdout=4096, query_range=4096)
    mse = _paired_mse(x, x, cfg, ["tops", "pak"], reps=10, hold=4096)
    assert _significantly_below(mse["tops"], mse["pak"]) > 100

"""ToPS end to end on arrays: noise law, leaf sums, tree boundaries, reproducibility, checkpoints, utility."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from operators import SMOOTHERS, ToPS, ToPSConfig
from operators.evaluation import range_query_errors, summarize
from operators.hierarchy import ConsistentNoise
from operators.noise import DiscreteLaplace, Domain, KeyedGenerator, discrete_laplace_variance
from stream.commands import datasets
from tests.reference import hay_offline, whole_tree_noise

KEY = bytes(range(32))


def _batches(x: np.ndarray, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, x.size), size=min(40, x.size - 1), replace=False))
    return np.split(x, cuts)


@pytest.mark.slow
def test_noise_variance_per_layer_matches_discrete_laplace() -> None:
    """Each layer's node noise has variance 2a/(1-a)^2, a = exp(-eps_layer / theta_units), within 2%.

    400,000 samples per layer; the sample variance of a discrete Laplace (kurtosis about 6) has a relative standard
    error of about sqrt(5 / n) = 0.35%, so 2% is more than 5 standard errors. P(X = 0) = (1-a)/(1+a) within 0.005.
    """
    cfg = ToPSConfig(epsilon=0.5, bound=100, theta=20, query_range=2**16, fanout=16)
    op = ToPS(cfg, KEY)
    layers = cfg.height - op.smoother_layers
    a = math.exp(-(cfg.epsilon / layers) / 20)
    assert op._noise.noise == DiscreteLaplace(epsilon=cfg.epsilon / layers, sensitivity=20)
    assert op._noise.noise.a == pytest.approx(a, rel=1e-6)
    gen = KeyedGenerator(KEY)
    expected = discrete_laplace_variance(a)
    for j in range(layers):
        x = gen.discrete_laplace((int(Domain.HIERARCHY) << 16) | j, 0, 0, 400_000, op._noise.noise)
        assert x.var() == pytest.approx(expected, rel=0.02), f"layer {j}"
        assert abs(x.mean()) < 4 * math.sqrt(expected / x.size)
        assert np.mean(x == 0) == pytest.approx((1 - a) / (1 + a), abs=0.005)


def test_same_key_same_releases_other_key_other_releases() -> None:
    x = np.random.default_rng(0).gamma(2.0, 3.0, 3000).round()
    cfg = ToPSConfig(epsilon=1.0, bound=60, holdout=500, query_range=4096, fanout=16)
    a = ToPS(cfg, KEY).process(x)
    b = ToPS(cfg, KEY).process(x)
    c = ToPS(cfg, bytes(32)).process(x)
    assert np.array_equal(a, b, equal_nan=True)
    assert not np.array_equal(a[500:], c[500:])


@pytest.mark.parametrize("smoother", SMOOTHERS)
def test_batching_never_changes_a_release(smoother: str) -> None:
    """The daemon feeds ticks one by one or in bursts; replay feeds them all at once: same bits."""
    x = np.random.default_rng(1).gamma(2.0, 3.0, 6000).round()
    cfg = ToPSConfig(
        epsilon=0.7, bound=60, holdout=300, query_range=1024, fanout=4, smoother=smoother, window=3
    )
    whole = ToPS(cfg, KEY).process(x)
    op = ToPS(cfg, KEY)
    parts = np.concatenate([op.process(p) for p in _batches(x, seed=2)])
    op1 = ToPS(cfg, KEY)
    ones = np.array([op1.process_one(v) for v in x[:700]])
    assert np.array_equal(whole, parts, equal_nan=True)
    assert np.array_equal(whole[:700], ones, equal_nan=True)


@pytest.mark.parametrize("smoother", SMOOTHERS)
def test_leaves_sum_to_their_consistent_noisy_sum_across_trees(smoother: str) -> None:
    """Released ticks of each complete leaf add up to true leaf sum + consistent leaf noise (Appendix C/D), over
    three trees; each tree's noise is the offline two passes of that tree's own (fresh) noise."""
    theta, b, s, r = 9, 4, 2, 256
    cfg = ToPSConfig(
        epsilon=0.8, bound=30, theta=theta, fanout=b, smoother_layers=s, query_range=r, smoother=smoother
    )
    x = np.random.default_rng(3).integers(0, 20, size=3 * r).astype(float)
    op = ToPS(cfg, KEY)
    rel = np.concatenate([op.process(p) for p in _batches(x, seed=4)])
    w = b**s
    leaf_rel = rel.reshape(-1, w).sum(axis=1)
    truth = np.minimum(x, theta).reshape(-1, w).sum(axis=1)
    layers = cfg.height - s
    a = DiscreteLaplace(epsilon=cfg.epsilon / layers, sensitivity=theta)
    gen = KeyedGenerator(KEY)
    offline = [
        hay_offline(
            whole_tree_noise(gen, tree=t, fanout=b, layers=layers, top_nodes=r // b ** (cfg.height - 1), noise=a),
            b,
        )
        for t in range(3)
    ]
    expected = truth + np.rint(np.concatenate(offline) * 1024) / 1024
    assert np.array_equal(leaf_rel, expected)
    assert not np.allclose(offline[0], offline[1])
    # and the online walker reproduces the same, tree after tree
    walk = ConsistentNoise(gen, fanout=b, layers=layers, top_nodes=r // b ** (cfg.height - 1), noise=a)
    assert np.array_equal(walk.next_leaves(leaf_rel.size), expected - truth)


@pytest.mark.parametrize("cut", [10, 299, 300, 301, 1500, 2049])
def test_snapshot_restore_continues_exactly(cut: int) -> None:
    """A checkpoint (JSON, no key) taken anywhere, in the holdout or not, continues bit for bit."""
    x = np.random.default_rng(5).gamma(2.0, 3.0, 4000).round()
    cfg = ToPSConfig(epsilon=0.7, bound=60, holdout=300, query_range=1024, fanout=4, smoother="ema")
    whole = ToPS(cfg, KEY).process(x)
    op = ToPS(cfg, KEY)
    first = op.process(x[:cut])
    snap = json.loads(json.dumps(op.snapshot()))
    assert KEY.hex() not in json.dumps(snap)
    again = ToPS.restore(cfg, KEY, snap)
    rest = again.process(x[cut:])
    assert np.array_equal(whole, np.concatenate([first, rest]), equal_nan=True)
    with pytest.raises(ValueError, match="other parameters"):
        ToPS.restore(cfg.replace(epsilon=0.8), KEY, snap)


def test_clamping_is_counted_and_theta_is_on_the_resolution_grid() -> None:
    x = np.array([0.26, 0.5, 7.0, 100.0, 0.1] * 100)
    cfg = ToPSConfig(epsilon=1.0, bound=5.0, holdout=100, resolution=0.25, query_range=256, fanout=4)
    op = ToPS(cfg, KEY)
    op.process(x)
    assert op.clamped == 200
    assert op.theta is not None and (op.theta / 0.25) == round(op.theta / 0.25) and 1.0 <= op.theta <= 5.0


@pytest.mark.slow
def test_utility_on_dns_at_eps_005() -> None:
    """Range-query MSE (Eq. 9) at eps = 0.05 on the DNS stream: at least 100x below the always-zero baseline and
    below a flat (discrete) Laplace release of the same truncated values at the same theta."""
    m, r = 65536, 2**20
    x = datasets.extended("dns", m + r)
    cfg = ToPSConfig(epsilon=0.05, bound=500)
    op = ToPS(cfg, KEY)
    rel = op.process(x)[m:]
    truth = x[m:]
    theta = int(op.theta)
    flat_noise = KeyedGenerator(KEY).discrete_laplace(
        int(Domain.BASELINE), 0, 0, r, DiscreteLaplace(epsilon=0.05, sensitivity=theta)
    )
    flat = np.minimum(truth, theta) + flat_noise
    rng_seed = 11
    mse = {}
    for name, est in (("tops", rel), ("zero", np.zeros(r)), ("flat", flat)):
        errs = range_query_errors(truth, est, max_length=r, queries=1000, rng=np.random.default_rng(rng_seed))
        mse[name] = summarize(errs)[0]
    assert mse["tops"] * 100 < mse["zero"], mse
    assert mse["tops"] < mse["flat"], mse


@pytest.mark.parametrize("distinct", [5, 3000])
def test_holdout_histogram_sparse_or_dense_restores_exactly(distinct: int) -> None:
    """A holdout over few values keeps a sparse histogram (and snapshots its non-zero cells), over many a dense one;
    either way a restore in the middle of the holdout continues bit for bit, and the snapshot is JSON."""
    import json

    cfg = ToPSConfig(epsilon=1.0, bound=5000, holdout=400, query_range=1024, fanout=4)
    values = np.random.default_rng(distinct).integers(0, distinct, 1500).astype(float)
    whole = ToPS(cfg, bytes(32)).process(values)
    op = ToPS(cfg, bytes(32))
    first = [op.process_one(v) for v in values[:250]]
    snap = json.loads(json.dumps(op.snapshot()))
    assert isinstance(snap["holdout_histogram"], dict if distinct == 5 else list)
    again = ToPS.restore(cfg, bytes(32), snap)
    rest = again.process(values[250:])
    assert np.array_equal(np.concatenate([first, rest]), whole, equal_nan=True)

"""Frequency oracles, post-processing and central histograms (operators/categorical) against their closed forms.

Every randomized test is seeded (the keyed generator under a fixed key) and states its tolerance: the empirical MSE
over ``TRIALS`` runs and all cells is within 10% of the mean closed-form variance (RMSE within 5%), the mean
estimate of every cell is within 4.5 standard errors of its true count, on a heavy-tailed histogram (a cell with
half the users next to empty cells: where a hash family that is not pairwise independent shows its bias).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from operators.categorical import (
    base_cut,
    base_pro,
    fourier_estimate,
    fourier_g,
    fourier_perturb,
    fourier_seeds,
    fourier_support,
    fourier_support_brute,
    fourier_variance,
    fwht,
    grr_estimate,
    grr_perturb,
    grr_variance,
    hm_estimate,
    hm_perturb,
    hm_tally,
    hm_variance,
    hr_estimate,
    hr_layout,
    hr_perturb,
    hr_variance,
    laplace_histogram,
    norm_sub,
    olh_estimate,
    olh_g,
    olh_hash,
    olh_perturb,
    olh_seeds,
    olh_support,
    olh_variance,
    project_simplex,
    sparse_counts,
    stability_delta,
    stability_histogram,
    stability_threshold,
    sylvester,
    unary_estimate,
    unary_perturb_many,
    unary_simulate_support,
    unary_variance,
)
from operators.categorical.release import CategoricalConfig, CategoricalRelease
from operators.noise import DiscreteLaplace, KeyedGenerator

GEN = KeyedGenerator(bytes(range(32)))
TRIALS = 120


def heavy_tailed(d: int, n: int) -> np.ndarray:
    """Half the users in cell 0, the rest Zipf-like over the first half of the domain; the second half empty."""
    w = 1.0 / np.arange(1, d // 2 + 1) ** 1.2
    rest = np.floor(w / w.sum() * (n // 2)).astype(np.int64)
    c = np.zeros(d, dtype=np.int64)
    c[: d // 2] = rest
    c[0] += n - c.sum()
    return c


def _check(estimates: np.ndarray, counts: np.ndarray, variance: np.ndarray) -> None:
    err = estimates - counts[None, :]
    mse, expected = float((err**2).mean()), float(np.mean(variance))
    assert abs(math.sqrt(mse / expected) - 1) < 0.05, (mse, expected)
    z = err.mean(axis=0) / np.sqrt(variance / estimates.shape[0])
    assert float(np.abs(z).max()) < 4.5, float(np.abs(z).max())


def _values(counts: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(counts.size), counts)


@pytest.mark.slow
@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_grr_is_unbiased_with_its_closed_form_variance(eps: float) -> None:
    d, n = 32, 20_000
    c = heavy_tailed(d, n)
    x = _values(c)
    est = np.array([
        grr_estimate(np.bincount(grr_perturb(x, d, eps, GEN.uniforms(5, t, 0, 2 * n)), minlength=d), n, d, eps)
        for t in range(TRIALS)
    ])
    assert np.allclose(est.sum(axis=1), n)  # GRR's estimates sum to n exactly
    _check(est, c, grr_variance(n, d, eps, c))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["oue", "sue"])
def test_unary_encoding_devices_are_unbiased_with_their_closed_form_variance(kind: str) -> None:
    d, n, eps = 32, 3000, 1.5
    c = heavy_tailed(d, n)
    x = _values(c)
    est = np.array([
        unary_estimate(unary_perturb_many(x, d, eps, GEN.uniforms(6, t, 0, n * d), kind).sum(axis=0), n, eps, kind)
        for t in range(TRIALS)
    ])
    _check(est, c, unary_variance(n, eps, kind, c))


def test_unary_simulation_draws_the_devices_column_sums() -> None:
    d, n, eps = 32, 3000, 1.5
    c = heavy_tailed(d, n)
    rng = np.random.default_rng(1)
    est = np.array([unary_estimate(unary_simulate_support(c, eps, rng), n, eps) for _ in range(400)])
    _check(est, c, unary_variance(n, eps, "oue", c))


@pytest.mark.slow
@pytest.mark.parametrize("eps", [1.0, 3.0])
def test_olh_is_unbiased_on_heavy_tailed_data_with_its_closed_form_variance(eps: float) -> None:
    d, n = 40, 20_000
    g = olh_g(eps)
    c = heavy_tailed(d, n)
    x = _values(c)
    est = []
    for t in range(TRIALS):
        a, b = olh_seeds(GEN.words(7, t, 0, 4 * n))
        r = olh_perturb(x, g, eps, a, b, GEN.uniforms(7, t, 1 << 30, 2 * n))
        est.append(olh_estimate(olh_support(a, b, r, g, d), n, g, eps))
    _check(np.array(est), c, olh_variance(n, g, eps, c))


def test_olh_integer_g_and_its_variance_match_the_thesis_table() -> None:
    # Finnegan, table 12.2: g = round(e^eps) + 1 and Var*/n at that g; the real optimum gives OUE's 4e^eps/(e^eps-1)^2
    table = {0.5: (3, 15.8174), 1.0: (4, 3.69165), 2.0: (8, 0.724591), 3.0: (21, 0.220565), 5.0: (149, 0.0273187)}
    for eps, (g, var) in table.items():
        assert olh_g(eps) == g
        assert olh_variance(1, g, eps) == pytest.approx(var, rel=1e-4)
    assert unary_variance(1, 1.0) == pytest.approx(3.68269, rel=1e-5)


def test_olh_decoding_is_every_report_hashed_against_every_category() -> None:
    n, d, g = 300, 57, 5
    a, b = olh_seeds(GEN.words(8, 0, 0, 4 * n))
    r = (GEN.words(8, 1, 0, n) % np.uint64(g)).astype(np.int64)
    brute = np.array([(olh_hash(a, b, np.full(n, y), g) == r).sum() for y in range(d)])
    assert (olh_support(a, b, r, g, d) == brute).all()
    assert (olh_support(a, b, r, g, d, threads=1) == brute).all()


def test_olh_hash_is_pinned() -> None:
    """No library computes it: these values may never change (a changed hash would silently break decoding of
    reports made by older devices)."""
    a = np.array([0, 1, 2**61 - 2, 123456789012345], dtype=np.uint64)
    b = np.array([5, 2**60, 7, 987654321], dtype=np.uint64)
    got = [olh_hash(a, b, np.array([x] * 4), 149).tolist() for x in (0, 1, 2**31 - 1)]
    assert got == [[0, 74, 0, 0], [0, 74, 0, 0], [0, 74, 148, 14]]  # = Python big-integer arithmetic


def test_olh_hash_collides_with_probability_one_over_g() -> None:
    n, g = 200_000, 5
    a, b = olh_seeds(GEN.words(9, 0, 0, 4 * n))
    for x, y in ((0, 1), (1, 2**31 - 1), (3, 4)):
        rate = float((olh_hash(a, b, np.full(n, x), g) == olh_hash(a, b, np.full(n, y), g)).mean())
        assert abs(rate - 1 / g) < 4.5 * math.sqrt(0.2 * 0.8 / n)


@pytest.mark.parametrize(("g", "k", "d"), [(2, 6, 50), (3, 4, 81), (7, 2, 40), (13, 3, 2000)])
def test_fourier_decoding_equals_brute_force(g: int, k: int, d: int) -> None:
    n = 500
    a = fourier_seeds(GEN.uniforms(10, g, 0, n * k), g, k)
    r = (GEN.words(10, g, 1 << 30, n) % np.uint64(g)).astype(np.int64)
    assert (fourier_support(a, r, g, d) == fourier_support_brute(a, r, g, d)).all()


def test_fourier_g_choice() -> None:
    assert fourier_g(5.0, 9_796_900) == (223, 3)
    assert fourier_g(1.0, 9_796_900) == (3, 15)
    assert fourier_g(5.0, 1085) == (149, 2)


@pytest.mark.slow
def test_fourier_olh_is_unbiased_with_its_closed_form_variance() -> None:
    eps, d, n = 2.0, 60, 20_000
    g, k = fourier_g(eps, d)
    c = heavy_tailed(d, n)
    x = _values(c)
    est = []
    for t in range(TRIALS):
        a = fourier_seeds(GEN.uniforms(11, t, 0, n * k), g, k)
        r = fourier_perturb(x, g, eps, a, GEN.uniforms(11, t, 1 << 30, 2 * n))
        est.append(fourier_estimate(fourier_support(a, r, g, d), n, g, eps))
    _check(np.array(est), c, fourier_variance(n, g, eps, c))


def test_sylvester_and_fwht() -> None:
    h = sylvester(4)
    assert set(np.unique(h).tolist()) == {-1, 1}
    assert (h @ h.T == 16 * np.eye(16, dtype=np.int64)).all()
    v = GEN.uniforms(12, 0, 0, 16)
    assert np.allclose(fwht(v.copy()), h @ v)


@pytest.mark.slow
def test_hm_is_unbiased_with_its_closed_form_variance() -> None:
    eps, d, n = 1.0, 31, 20_000
    c = heavy_tailed(d, n)
    x = _values(c)
    est = []
    for t in range(TRIALS):
        col, bit = hm_perturb(x, d, eps, GEN.uniforms(13, t, 0, 2 * n))
        est.append(hm_estimate(hm_tally(col, bit, d), d, eps))
    _check(np.array(est), c, hm_variance(n, eps, c))


@pytest.mark.slow
@pytest.mark.parametrize(("eps", "b"), [(3.0, None), (1.0, 8), (4.0, 128)])
def test_hr_is_unbiased_with_its_closed_form_variance(eps: float, b: int | None) -> None:
    d, n = 100, 20_000
    c = heavy_tailed(d, n)
    x = _values(c)
    est = [hr_estimate(hr_perturb(x, d, eps, GEN.uniforms(14, t, 0, 2 * n), b), d, eps, b) for t in range(TRIALS)]
    _check(np.array(est), c, hr_variance(n, d, eps, c, b))


def test_hr_output_probabilities_are_e_eps_on_the_set_and_one_elsewhere() -> None:
    eps, d, b = 1.0, 20, 8
    b, blocks, z = hr_layout(eps, d, b)
    n = 400_000
    out = hr_perturb(np.full(n, 9), d, eps, GEN.uniforms(15, 0, 0, 2 * n), b)
    freq = np.bincount(out, minlength=blocks * b) / n
    beta, row = divmod(9, b - 1)
    in_set = np.zeros(blocks * b, dtype=bool)
    in_set[beta * b : beta * b + b] = sylvester(3)[row + 1] == 1
    expected = np.where(in_set, math.exp(eps) / z, 1 / z)
    assert np.abs(freq - expected).max() < 4.5 * math.sqrt(expected.max() / n)


# -- post-processing --------------------------------------------------------------------------------------------
def test_post_processing_properties() -> None:
    rng = np.random.default_rng(3)
    c = heavy_tailed(200, 5000).astype(float) + rng.normal(0, 40, 200)
    n = 5000
    assert (base_pro(c) >= 0).all()
    cut = base_cut(c, n)
    assert (cut >= 0).all()
    order = np.argsort(-np.maximum(c, 0), kind="stable")
    kept = np.flatnonzero(cut[order] > 0)
    last = int(kept[-1])
    assert cut[order][: last + 1].sum() >= n or last == c.size - 1
    assert (cut[order][last + 1 :] == 0).all()
    assert cut[order][:last].sum() < n
    ns, proj = norm_sub(c, n), project_simplex(c, n)
    assert np.allclose(ns, proj, atol=1e-6)
    assert proj.sum() == pytest.approx(n) and (proj >= 0).all()
    for _ in range(200):  # the projection is the closest point of the simplex
        other = rng.dirichlet(np.ones(200)) * n
        assert np.linalg.norm(other - c) >= np.linalg.norm(proj - c) - 1e-9


@pytest.mark.slow
def test_post_processing_rmse_order_on_heavy_tailed_data() -> None:
    """Thesis section 5.3 on a sparse histogram: Base-Cut < Base-Pro < Base in RMSE (OUE, eps = 2)."""
    d, n, eps = 1000, 50_000, 2.0
    c = heavy_tailed(d, n)
    rng = np.random.default_rng(5)
    err = {"base": 0.0, "base-pro": 0.0, "base-cut": 0.0}
    for _ in range(40):
        est = unary_estimate(unary_simulate_support(c, eps, rng), n, eps)
        err["base"] += float(((est - c) ** 2).mean())
        err["base-pro"] += float(((base_pro(est) - c) ** 2).mean())
        err["base-cut"] += float(((base_cut(est, n) - c) ** 2).mean())
    assert err["base-cut"] < err["base-pro"] < err["base"]


# -- central ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("neighbours", "sens"), [("add-remove", 1), ("substitute", 2)])
def test_laplace_histogram_scale_follows_the_neighbouring_relation(neighbours: str, sens: int) -> None:
    d, eps = 200_000, 1.0
    counts = np.arange(d) % 7
    noisy = laplace_histogram(counts, eps, GEN, neighbours=neighbours, address=3)
    noise = noisy - counts
    var = DiscreteLaplace(eps, sens).variance
    assert abs(float(noise.mean())) < 4.5 * math.sqrt(var / d)
    assert abs(float(noise.var()) / var - 1) < 0.05
    assert (laplace_histogram(counts, eps, GEN, neighbours=neighbours, address=3) == noisy).all()


def test_laplace_histogram_in_chunks_is_one_draw() -> None:
    d = (1 << 20) + 77
    counts = np.zeros(d, dtype=np.int64)
    from operators.categorical._common import categorical_domain

    noisy = laplace_histogram(counts, 2.0, GEN, address=1)
    one = GEN.discrete_laplace(categorical_domain("laplace"), 1, 0, d, DiscreteLaplace(2.0, 1))
    assert (noisy == one).all()


def test_stability_threshold_meets_delta_and_the_thesis_threshold_does_not() -> None:
    n = 2_750_238
    delta = 1 / (2 * n)
    assert stability_threshold(5.0, delta) == pytest.approx(7.4854, abs=1e-4)  # Finnegan, table 12.4 (+1)
    for eps in np.arange(0.5, 5.01, 0.5):
        assert stability_delta(eps, delta) <= delta
        assert stability_delta(eps, delta, "add-remove") <= delta
    thesis = {eps: stability_delta(eps, delta, threshold=stability_threshold(eps, delta) - 1) for eps in (3.0, 5.0)}
    assert all(v > delta for v in thesis.values()), thesis


def test_stability_histogram_releases_only_non_empty_cells_above_the_threshold() -> None:
    eps, delta = 1.0, 0.2  # a large delta, so that the rare release of a one-user cell can be counted
    tau = stability_threshold(eps, delta)
    cells = np.arange(0, 10**12, 10**7, dtype=np.int64)  # a domain of 10^12 cells, 10^5 of them non-empty
    counts = np.ones(cells.size, dtype=np.int64)
    counts[:10] = 1000
    out_cells, noisy = stability_histogram(cells, counts, eps, delta, GEN, address=2)
    assert set(out_cells.tolist()) <= set(cells.tolist())
    assert set(cells[:10].tolist()) <= set(out_cells.tolist())
    assert (noisy >= tau).all()
    rate = (out_cells.size - 10) / (cells.size - 10)
    per_cell = stability_delta(eps, delta) / 2
    assert abs(rate - per_cell) < 4.5 * math.sqrt(per_cell / cells.size)
    c2, n2 = stability_histogram(cells[::-1], counts[::-1], eps, delta, GEN, address=2)
    assert (c2 == out_cells).all() and (n2 == noisy).all()  # the order of the input does not matter


def test_sparse_counts() -> None:
    cells, counts = sparse_counts(np.array([5, 9_796_899, 5, 0]))
    assert cells.tolist() == [0, 5, 9_796_899] and counts.tolist() == [1, 2, 1]


def test_the_checks_catch_olh_with_a_few_shared_hashes() -> None:
    """Negative control: the "fast" OLH of a small shared family (here 2 hashes) is biased on heavy-tailed data."""
    eps, d, n = 3.0, 40, 20_000
    g = olh_g(eps)
    c = heavy_tailed(d, n)
    x = _values(c)
    fam_a, fam_b = olh_seeds(GEN.words(16, 0, 0, 8))
    est = []
    for t in range(TRIALS):
        pick = (GEN.words(16, 1 + t, 0, n) & np.uint64(1)).astype(np.int64)
        a, b = fam_a[pick], fam_b[pick]
        r = olh_perturb(x, g, eps, a, b, GEN.uniforms(16, 1 + t, 1 << 30, 2 * n))
        est.append(olh_estimate(olh_support(a, b, r, g, d), n, g, eps))
    with pytest.raises(AssertionError):
        _check(np.array(est), c, olh_variance(n, g, eps, c))


def test_counters_split_their_budget_only_when_one_report_moves_two_and_old_states_do_not_continue() -> None:
    """Each counter runs at counter.epsilon / 2 under substitute neighbours with two or more counters, at
    counter.epsilon otherwise; a state saved by counters at the full budget (before the split) is refused, not
    continued at another noise scale, and a state of the split counters restores."""
    from operators.categorical.release import CategoricalConfig, CategoricalRelease
    from operators.config import ToPSConfig

    counter = ToPSConfig(epsilon=0.8, bound=5.0, holdout=3, query_range=16, fanout=4)

    def cfg(neighbours: str, counters: tuple[int, ...]) -> CategoricalConfig:
        return CategoricalConfig(epsilon=1.0, categories=4, neighbours=neighbours, counters=counters, counter=counter)

    assert cfg("substitute", (0, 2)).counter_each.epsilon == 0.4
    assert cfg("substitute", (1,)).counter_each.epsilon == 0.8
    assert cfg("add-remove", (0, 2)).counter_each.epsilon == 0.8
    assert cfg("substitute", (0, 2)).report_epsilon == cfg("add-remove", (0, 2)).report_epsilon == 1.8
    c = cfg("substitute", (0, 2))
    op = CategoricalRelease(c, key=bytes(32))
    op.process([{0: 2, 2: 1}] * 5)
    snap = op.snapshot()
    again = CategoricalRelease.restore(c, bytes(32), snap)
    assert again.process([{0: 1}]) == op.process([{0: 1}])
    for saved in snap["counters"].values():
        saved["config"] = counter.to_dict()  # what the counters at the full budget saved
    with pytest.raises(ValueError, match="other parameters"):
        CategoricalRelease.restore(c, bytes(32), snap)


def test_operator_snapshot_restores_the_tick_and_refuses_other_parameters() -> None:
    cfg = CategoricalConfig(epsilon=1.0, categories=4)
    op = CategoricalRelease(cfg, bytes(32))
    first = op.process([{0: 3}, {1: 2}])
    again = CategoricalRelease.restore(cfg, bytes(32), op.snapshot())
    assert again.ticks == 2
    assert again.process([{2: 1}]) == CategoricalRelease(cfg, bytes(32)).process([{0: 3}, {1: 2}, {2: 1}])[2:]
    assert first[0] != first[1]
    with pytest.raises(ValueError, match="other parameters"):
        CategoricalRelease.restore(CategoricalConfig(epsilon=2.0, categories=4), bytes(32), op.snapshot())

"""Square Wave (Wang et al., CCS 2021, Eq. 16, Section 4.1): the density, its transition matrix, EM and SW-W pruning."""

from __future__ import annotations

import math

import numpy as np
import pytest

from operators.local import (
    estimate_density,
    square_wave_density,
    square_wave_em,
    square_wave_histogram,
    square_wave_parameters,
    square_wave_perturb,
    square_wave_report,
    square_wave_transition_matrix,
    sww_prune,
)
from tests.support import uniforms

EPSILONS = (0.2, 0.5, 1.0, 2.0, 4.0)


@pytest.mark.parametrize("eps", EPSILONS)
def test_parameters_follow_eq16(eps: float) -> None:
    b, p, q = square_wave_parameters(eps)
    e = math.exp(eps)
    assert b == pytest.approx((eps * e - e + 1) / (2 * e * (e - 1 - eps)), rel=1e-12)
    assert p == pytest.approx(e / (2 * b * e + 1)) and q == pytest.approx(1 / (2 * b * e + 1))
    assert 0 < b < 0.5


@pytest.mark.parametrize("eps", EPSILONS)
def test_density_integrates_to_one_and_ratio_is_bounded(eps: float) -> None:
    b, _, _ = square_wave_parameters(eps)
    y = np.linspace(-b, 1 + b, 400_001)
    dy = y[1] - y[0]
    inputs = np.linspace(0, 1, 11)
    dens = np.array([square_wave_density(y, x, eps) for x in inputs])
    integrals = (dens[:, 1:] + dens[:, :-1]).sum(axis=1) * dy / 2  # trapezoid
    np.testing.assert_allclose(integrals, 1.0, atol=1e-4)  # the grid cuts the two jumps of each density
    assert square_wave_density([-b - 1e-9, 1 + b + 1e-9], 0.5, eps).tolist() == [0.0, 0.0]
    ratio = dens.max(axis=0) / dens.min(axis=0)
    assert ratio.max() <= math.exp(eps) * (1 + 1e-12)
    assert ratio.max() == pytest.approx(math.exp(eps))  # the budget is used, not wasted


@pytest.mark.parametrize("eps", EPSILONS)
def test_transition_matrix_columns_are_distributions_with_bounded_ratio(eps: float) -> None:
    m = square_wave_transition_matrix(eps, buckets=256, report_buckets=300)
    assert m.shape == (300, 256) and (m > 0).all()
    np.testing.assert_allclose(m.sum(axis=0), 1.0, atol=1e-12)
    assert (m.max(axis=1) / m.min(axis=1)).max() <= math.exp(eps) * (1 + 1e-9)


def test_transition_matrix_matches_simulation() -> None:
    eps, buckets, report_buckets, n = 1.0, 8, 12, 400_000
    b, _, _ = square_wave_parameters(eps)
    m = square_wave_transition_matrix(eps, buckets, report_buckets)
    i = 5  # a reading uniform in bucket 5 of 8
    x = (i + uniforms(1, n)) / buckets
    y = square_wave_perturb(x, eps, uniforms(2, n))
    freq = square_wave_histogram(y, b, report_buckets) / n
    np.testing.assert_allclose(freq, m[:, i], atol=5 * math.sqrt(0.25 / n))


def test_reports_stay_in_range_and_scale_to_reading_units() -> None:
    eps, bound = 1.0, 250.0
    b, _, _ = square_wave_parameters(eps)
    v = np.linspace(-10, 300, 5000)  # clamped to [0, bound]
    u = uniforms(3, v.size)
    y = square_wave_report(v, bound, eps, u)
    assert y.min() >= -b * bound and y.max() <= (1 + b) * bound
    np.testing.assert_allclose(y, square_wave_perturb(np.clip(v / bound, 0, 1), eps, u) * bound)


def _dense_em(counts: np.ndarray, m: np.ndarray, max_iterations: int = 10_000, tol: float = 1e-3):
    """The textbook EM with the dense matrix (the reference code's loop, without smoothing)."""
    rows = counts > 0
    mm, n = m[rows], counts[rows].astype(float)
    total = n.sum()
    f = np.full(m.shape[1], 1.0 / m.shape[1])
    pred = mm @ f
    ll = n @ np.log(pred)
    it = 0
    while it < max_iterations:
        it += 1
        new = f * ((n / pred) @ mm)
        new /= new.sum()
        pred = mm @ new
        new_ll = n @ np.log(pred)
        moved = np.abs(new - f).sum()
        f = new
        if moved <= 1 / total or (it > 1 and abs(new_ll - ll) < tol):
            break
        ll = new_ll
    return f, it


@pytest.mark.parametrize(("eps", "buckets", "report_buckets"), [(0.5, 64, 128), (2.0, 200, 150), (1.0, 512, 512)])
def test_fast_em_equals_dense_em(eps: float, buckets: int, report_buckets: int) -> None:
    rng = np.random.default_rng(3)
    x = rng.beta(1.3, 6.0, 30_000)
    b, _, _ = square_wave_parameters(eps)
    counts = square_wave_histogram(square_wave_perturb(x, eps, uniforms(4, x.size)), b, report_buckets)
    fast, it_fast = square_wave_em(counts, eps, buckets)
    dense, it_dense = _dense_em(counts, square_wave_transition_matrix(eps, buckets, report_buckets))
    assert it_fast == it_dense
    np.testing.assert_allclose(fast, dense, atol=1e-9)


def _wasserstein(density: np.ndarray, sample: np.ndarray) -> float:
    """W1 on [0, 1] between a density over equal buckets (mass at the bucket's right edge for the CDF) and a sample."""
    edges = np.linspace(0, 1, density.size + 1)[1:]
    cdf_true = np.searchsorted(np.sort(sample), edges, side="right") / sample.size
    return float(np.abs(np.cumsum(density) - cdf_true).sum() / density.size)


# W1 of the unsmoothed EM estimate from 65,536 reports (Beta(1.5, 8): mean 0.16, a long right tail). Measured
# here: 0.0143 at eps = 0.5, 0.0091 at eps = 1 and 0.0056 at eps = 2; the tolerances leave a factor of about 2.
# For scale: the uniform density is at W1 = 0.34 from this sample.
EM_W1_TOLERANCE = {0.5: 0.03, 1.0: 0.018, 2.0: 0.011}


@pytest.mark.slow
@pytest.mark.parametrize("eps", sorted(EM_W1_TOLERANCE))
def test_em_recovers_a_skewed_distribution(eps: float) -> None:
    x = np.random.default_rng(11).beta(1.5, 8.0, 65_536)
    y = square_wave_perturb(x, eps, uniforms(5, x.size))
    est = estimate_density(y, eps, buckets=1024, prune=False)
    assert est.density.shape == (1024,) and est.density.sum() == pytest.approx(1.0)
    assert 1 < est.iterations <= 10_000
    assert _wasserstein(est.density, x) <= EM_W1_TOLERANCE[eps]
    assert _wasserstein(np.full(1024, 1 / 1024), x) > 0.3


def test_sww_prunes_after_the_first_point_followed_by_five_small_estimates() -> None:
    f = np.array([0.4, 0.3, 0.2, 5e-5, 0.0, 0.0, 0.0, 1e-5, 0.09, 0.00994, 0.0, 0.0])
    pruned, w = sww_prune(f)
    assert w == 2
    np.testing.assert_allclose(pruned[:3], f[:3] / f[:3].sum())
    assert (pruned[3:] == 0).all()


def test_sww_needs_five_in_a_row_below_a_hundredth_of_a_percent() -> None:
    four = np.array([0.5, 0.2, 0.0, 0.0, 0.0, 0.0, 0.3, 0.0, 0.0, 0.0, 0.0])  # runs of four only
    pruned, w = sww_prune(four)
    assert w is None
    np.testing.assert_allclose(pruned, four / four.sum())
    above = np.array([0.9, 0.1, 1.01e-4, 1.01e-4, 1.01e-4, 1.01e-4, 1.01e-4, 0.0])
    assert sww_prune(above / above.sum())[1] is None  # each just above 0.01 % of the total
    below = np.array([0.9, 0.1, 0.99e-4, 0.99e-4, 0.99e-4, 0.99e-4, 0.99e-4, 0.0])
    assert sww_prune(below / below.sum())[1] == 1
    # the level is relative to the total mass: scaling the density changes nothing
    scaled, w_scaled = sww_prune(np.array([0.4, 0.3, 0.2, 5e-5, 0, 0, 0, 1e-5, 0.09, 0.00994]) * 1e6)
    assert w_scaled == 2 and scaled.sum() == pytest.approx(1.0)


def test_sww_first_point_can_be_the_first_bucket() -> None:
    f = np.array([0.6, 0.0, 0.0, 0.0, 0.0, 0.0, 0.4])
    pruned, w = sww_prune(f)
    assert w == 0
    assert pruned.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_sww_on_an_em_estimate_drops_the_far_tail_only() -> None:
    """Readings in [0, 0.3] at eps = 2: the pruned estimate keeps the bulk and nothing beyond the data."""
    x = np.random.default_rng(5).uniform(0, 0.3, 65_536) ** 2 / 0.3
    est = estimate_density(square_wave_perturb(x, 2.0, uniforms(6, x.size)), 2.0, buckets=1024)
    assert est.cut is not None
    assert est.density[est.cut + 1 :].sum() == 0.0
    assert est.density[:308].sum() == pytest.approx(1.0)  # nothing is left far above 0.3


def test_histogram_and_em_input_checks() -> None:
    b, _, _ = square_wave_parameters(1.0)
    counts = square_wave_histogram([-b, -b - 0.1, 0.2, 1 + b, 9.0], b, 4)  # the ends belong to the end buckets
    assert counts.tolist() == [2, 1, 0, 2]
    with pytest.raises(ValueError, match="counts"):
        square_wave_em([1, -1, 3], 1.0)
    f, it = square_wave_em(np.zeros(16), 1.0, buckets=8)
    assert it == 0 and f.tolist() == [0.125] * 8
    with pytest.raises(ValueError, match="sw_b"):
        square_wave_parameters(1.0, b=-0.2)

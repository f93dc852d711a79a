"""The ToPL threshold (Wang et al., CCS 2021, Eq. 8 with Var from Eq. 22; the bias coefficient r^2/6, the average
squared range length, where the paper's text has r^2/24)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from operators.local import (
    hybrid_worst_case_variance,
    optimal_threshold,
    square_wave_histogram,
    square_wave_parameters,
    square_wave_report,
    threshold_candidates,
    threshold_from_reports,
    threshold_objective,
)
from operators.noise import Domain, KeyedGenerator


def brute_force_eq8(density: list[float], bound: float, eps: float, r: int) -> list[float]:
    """Eq. 8 written out with loops: every candidate, every value above it."""
    k = len(density)
    total = sum(density)
    width = bound / k
    var22 = hybrid_worst_case_variance(eps)
    scores = []
    for c in range(k):
        theta = (c + 1) * width
        bias = 0.0
        for i in range(k):
            t = (i + 0.5) * width
            if theta < t < bound:
                bias += density[i] / total * (t - theta)
        scores.append(r / 3 * (theta / 2) ** 2 * var22 + r * r / 6 * bias * bias)
    return scores


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(("eps", "r"), [(0.5, 1000), (1.0, 2**20), (3.0, 64)])
def test_eq8_matches_brute_force(seed: int, eps: float, r: int) -> None:
    rng = np.random.default_rng(seed)
    density = (rng.pareto(1.5, 24) * (rng.random(24) < 0.6)).tolist()
    density[0] += 0.1
    bound = 48.0
    scores = threshold_objective(density, bound, eps, r)
    expected = brute_force_eq8(density, bound, eps, r)
    np.testing.assert_allclose(scores, expected, rtol=1e-10, atol=1e-9)
    best = int(np.argmin(expected))
    assert optimal_threshold(density, bound, eps, r) == pytest.approx((best + 1) * bound / 24)


def test_bias_coefficient_is_r_squared_over_six() -> None:
    """With no noise term (theta -> B is free of bias) the score at the smallest candidate is r^2/6 bias^2 plus
    the noise term: not r^2/24 (the paper's typo)."""
    density = [0.5, 0.0, 0.0, 0.5]
    r, eps, bound = 1000, 1.0, 4.0
    scores = threshold_objective(density, bound, eps, r)
    bias = 0.5 * (3.5 - 1.0)
    noise = r / 3 * (1.0 / 2) ** 2 * hybrid_worst_case_variance(eps)
    assert scores[0] == pytest.approx(noise + r * r / 6 * bias * bias)
    assert scores[-1] == pytest.approx(r / 3 * (4.0 / 2) ** 2 * hybrid_worst_case_variance(eps))


def test_candidates_are_1024_bucket_edges() -> None:
    c = threshold_candidates(500.0)
    assert c.size == 1024 and c[0] == pytest.approx(500 / 1024) and c[-1] == 500.0


def test_tradeoff_moves_with_the_query_range() -> None:
    """Long ranges pay bias squared (r^2), noise only linearly (r): the threshold grows with r."""
    density = np.zeros(1024)
    density[[10, 100, 600]] = [0.9, 0.0999, 0.0001]
    thetas = [optimal_threshold(density, 1024.0, 1.0, r) for r in (16, 64, 1024, 2**20)]
    assert thetas == sorted(thetas) and thetas[0] < thetas[-1]
    assert thetas[-1] == 101.0  # at r = 2^20 only the 0.01 % at 600 is cut


def test_threshold_from_sw_reports_on_a_known_distribution() -> None:
    """Readings mostly below 20 with a thin tail to 60 (B = 500): theta lands at the end of the bulk."""
    rng = np.random.default_rng(9)
    readings = np.minimum(rng.exponential(5.0, 65_536), 60.0)
    u = KeyedGenerator(bytes(32)).uniforms(Domain.LOCAL, 1, 0, readings.size)
    reports = square_wave_report(readings, 500.0, 1.0, u)
    est = threshold_from_reports(reports, 500.0, threshold_epsilon=1.0, epsilon=1.0)
    assert np.quantile(readings, 0.9) <= est.theta <= 80.0
    assert est.estimate.density.sum() == pytest.approx(1.0)
    # the same from the report counts
    sw_b = square_wave_parameters(1.0)[0]
    counts = square_wave_histogram(reports / 500.0, sw_b, 1024)
    again = threshold_from_reports(None, 500.0, 1.0, 1.0, counts=counts)
    assert again.theta == est.theta


def test_objective_input_checks() -> None:
    with pytest.raises(ValueError, match="density"):
        threshold_objective([0.0, 0.0], 10.0, 1.0, 100)
    with pytest.raises(ValueError, match="density"):
        threshold_objective([0.5, -0.1], 10.0, 1.0, 100)
    with pytest.raises(ValueError, match="epsilon"):
        threshold_objective([1.0], 10.0, 0.0, 100)
    assert math.isfinite(optimal_threshold([1.0], 10.0, 1.0, 1))

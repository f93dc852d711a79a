"""Le Cam's two-point bound (operators/local/lower_bound.py), checked against Eq. 8 written out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from operators.local import hybrid_worst_case_variance
from operators.local.lower_bound import tail_bias, two_point_bound


def eq8(values: np.ndarray, theta: float, eps: float, r: int) -> float:
    bias = float(np.mean(np.maximum(values - theta, 0.0)))
    return r / 3 * theta**2 / 4 * hybrid_worst_case_variance(eps) + r * r / 6 * bias**2


@pytest.fixture(scope="module")
def skewed() -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.minimum(np.floor(rng.pareto(2.5, 20_000) * 4), 60.0)


def test_tail_bias_is_the_mean_excess(skewed: np.ndarray) -> None:
    thetas = np.array([0.0, 0.5, 3.0, 17.0, 60.0, 100.0])
    want = [float(np.mean(np.maximum(skewed - t, 0.0))) for t in thetas]
    assert np.allclose(tail_bias(skewed, thetas), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("eps", [0.2, 1.0, 2.0])
def test_interval_and_alternative_agree_with_eq8_by_hand(skewed: np.ndarray, eps: float) -> None:
    r, m, bound, step = 1 << 20, 65_536, 400.0, 0.5
    tb = two_point_bound(skewed, bound, eps, m, query_range=r, step=step)
    grid = np.arange(step, bound + step / 2, step)
    scores = np.array([eq8(skewed, t, eps, r) for t in grid])
    inside = grid[scores <= 1.5 * scores.min()]
    assert tb.interval == (inside.min(), inside.max())
    assert tb.best == grid[int(np.argmin(scores))]
    # the alternative: a share of the readings moved to one value (Eq. 8 of the mixture, by hand)
    assert 0 < tb.share <= 0.1
    alt_scores = np.array([
        r / 3 * t**2 / 4 * hybrid_worst_case_variance(eps)
        + r * r / 6 * ((1 - tb.share) * np.mean(np.maximum(skewed - t, 0)) + tb.share * max(tb.value - t, 0)) ** 2
        for t in grid])
    alt_inside = grid[alt_scores <= 1.5 * alt_scores.min()]
    assert not set(inside) & set(alt_inside), "the two intervals must be disjoint"
    assert tb.alt_theta > tb.interval[1]
    assert tb.kl == pytest.approx(4 * math.expm1(eps) ** 2 * m * tb.share**2)
    assert tb.miss_probability == pytest.approx(math.exp(-tb.kl) / 4)


def test_more_budget_means_a_weaker_bound(skewed: np.ndarray) -> None:
    p = [two_point_bound(skewed, 400.0, e, 65_536).miss_probability for e in (0.2, 0.6, 1.0, 2.0, 4.0)]
    assert p == sorted(p, reverse=True)
    assert p[0] > 0.1 and p[-1] < 1e-6


def test_bad_arguments_are_refused(skewed: np.ndarray) -> None:
    for kwargs in ({"bound": 0.0}, {"reports": 0}, {"factor": 1.0}, {"epsilon": -1.0}):
        args = {"values": skewed, "bound": 400.0, "epsilon": 1.0, "reports": 100} | kwargs
        with pytest.raises(ValueError):
            two_point_bound(**args)

"""NM-E threshold optimizer (Eq. 5-6) and the choice of s (Eq. 7) against brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest

from operators import ToPS, ToPSConfig
from operators.threshold import (
    candidate_grid,
    eq7_error,
    holdout_histogram,
    integer_run,
    m_theta,
    report_noisy_max,
    scores,
    smoother_layers,
)


def test_m_theta_and_scores_match_brute_force() -> None:
    rng = np.random.default_rng(3)
    values = np.minimum(rng.pareto(1.2, size=5000) * 20, 800).round().astype(np.int64)
    cands = candidate_grid(800, 1.0)
    hist = holdout_histogram(values[:2000], cands)
    hist = holdout_histogram(values[2000:], cands, hist)  # in two parts, as ticks arrive
    got = m_theta(hist)
    brute = np.array([(values > t).sum() for t in cands])
    assert np.array_equal(got, brute)
    m, eps, r, b = values.size, 0.3, 2**20, 16
    q = scores(got, cands.astype(float), m=m, epsilon=eps, query_range=r, fanout=b)
    brute_q = [
        -(3 * m * t) / (60 * r * eps) * math.sqrt(2 * (b - 1) * math.log(r, b) ** 3) - mt
        for t, mt in zip(cands, brute, strict=True)
    ]
    np.testing.assert_allclose(q, brute_q, rtol=1e-12)


def test_huge_epsilon_picks_the_argmax() -> None:
    """With eps = 1e9 the noise is negligible: the reported index is the true argmax of Eq. 6 (paper selection)."""
    rng = np.random.default_rng(4)
    values = np.minimum(rng.gamma(2.0, 5.0, size=65536), 500).round()
    cfg = ToPSConfig(epsilon=0.1, threshold_epsilon=1e9, bound=500, holdout=values.size, selection="paper")
    op = ToPS(cfg, key=bytes(32))
    op.process(values)
    cands = candidate_grid(500, 1.0)
    mt = np.array([(values > t).sum() for t in cands])
    q = scores(mt, cands.astype(float), m=values.size, epsilon=0.1, query_range=2**20, fanout=16)
    assert op.theta == float(cands[int(np.argmax(q))])


def test_report_noisy_max_is_a_selection_with_exponential_noise() -> None:
    """Small gaps: the top candidate wins most often, but not always (the noise matters)."""
    score = np.array([0.0, -1.0, -2.0])
    rng = np.random.default_rng(5)
    wins = np.bincount([report_noisy_max(score, rng.random(3), 1.0) for _ in range(4000)], minlength=3)
    assert wins[0] > wins[1] > wins[2] > 0


def test_candidate_grid_all_integers_then_geometric() -> None:
    small = candidate_grid(500, 1.0)
    assert small[0] == 1 and small[-1] == 500 and len(small) == 500
    big = candidate_grid(10**6, 1.0)
    assert big[0] == 1 and big[-1] == 10**6
    assert np.array_equal(big[:4096], np.arange(1, 4097))
    steps = big[4097:] / big[4096:-1]
    assert steps.max() < 1.0013 and np.all(np.diff(big) > 0)  # 0.1% steps, rounded to integers
    fine = candidate_grid(5, 0.01)  # units of 0.01: theta from 1.00 to 5.00
    assert fine[0] == 100 and fine[-1] == 500


@pytest.mark.parametrize("eps", [0.01, 0.05, 0.1, 0.5, 1.0, 4.0])
@pytest.mark.parametrize("theta", [1.0, 37.0])
@pytest.mark.parametrize(("r", "b"), [(2**20, 16), (2**16, 16), (2**20, 4), (2**12, 2)])
def test_eq7_s_matches_brute_force(eps: float, theta: float, r: int, b: int) -> None:
    """s = round(argmin over real s of Eq. 7), capped at h - 1, against a dense grid search."""
    levels = math.log(r, b)
    grid = np.linspace(0.0, levels, 400_001)
    f = eq7_error(grid, epsilon=eps, theta=theta, query_range=r, fanout=b)
    s_star = grid[int(np.argmin(f))]
    expected = min(round(s_star), math.ceil(levels) - 1)
    assert smoother_layers(eps, r, b, theta=theta) == expected


def test_eq7_rounded_continuous_not_integer_argmin() -> None:
    """At eps = 0.05, r = 2^20, b = 16 the integer argmin is 2 but the reference code rounds x* to 3 (as tops does)."""
    f_int = [float(eq7_error(s, epsilon=0.05, theta=1.0, query_range=2**20, fanout=16)) for s in range(5)]
    assert int(np.argmin(f_int)) == 2
    assert smoother_layers(0.05, 2**20, 16) == 3


@pytest.mark.parametrize(("bound", "resolution"), [(5000.0, 1.0), (100.0, 1.0), (1e6, 1.0), (50.0, 0.1), (0.5, 0.25),
                                                    (7.0, 3.0)])
def test_a_readings_bin_by_the_integer_run_is_searchsorteds(bound: float, resolution: float) -> None:
    """``ToPS.process_one`` finds a holdout reading's bin as ``v - low`` on the grid's integer run (no search): the
    bin ``np.searchsorted`` gives for every value from below the grid to past its end, and a holdout fed one
    reading at a time keeps the histogram of the same readings fed at once, across the run's end (B = 5,000)."""
    cands = candidate_grid(bound, resolution)
    low, top = integer_run(cands)
    assert np.array_equal(cands[: top - low + 1], np.arange(low, top + 1))
    assert top - low + 1 == cands.size or cands[top - low + 1] != top + 1
    for v in range(-3, min(int(cands[-1]) + 4, 20_000)):
        cell = 0 if v <= low else v - low if v <= top else int(np.searchsorted(cands, v, side="left"))
        assert cell == int(np.searchsorted(cands, v, side="left")), v
    if bound == 5000.0:
        x = np.random.default_rng(3).choice(np.array([0.0, 1.0, 2.0, 4095.0, 4096.0, 4097.0, 4200.0, 5000.0]), 200)
        cfg = ToPSConfig(epsilon=1.0, bound=bound, holdout=400)
        one, whole = ToPS(cfg, bytes(32)), ToPS(cfg, bytes(32))
        for v in x:
            one.process_one(float(v))
        whole.process(x)
        assert one.snapshot() == whole.snapshot()

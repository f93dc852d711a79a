"""Audit of the holdout's statistics for error bars (operators/truncation.py, operators/spread.py): on neighbouring
holdouts they stay within their shares of the threshold budget, and with the choice of theta the holdout's outputs
together stay within ``threshold_epsilon``.

**Neighbouring holdouts.** D0 and D1 differ in one reading: 0 in D0, B in D1 (the largest change of the excess sum,
``B - theta``, and of the truncated sum of squares, ``theta^2``; the excess histogram's top bin moves by one).

**Events**, fixed before sampling: "the statistic is at least t" for a grid of t around both sides' true values (the
Neyman-Pearson tests of a shifted discrete Laplace are such thresholds); Clopper-Pearson bounds with Bonferroni over
the events and both directions (``_audit.eps_lower_bound``, confidence ``1 - 1e-3`` per test).

**Broken variants** (drawn through ``_audit.discrete_laplace``, the one place that knows the sampler): the excess sum
with noise for a quarter of its sensitivity, and the squares with noise for theta instead of theta^2. Each must be
flagged (``eps_lb`` above the budget of the statistic).
"""

from __future__ import annotations

import numpy as np

from operators import ToPS, ToPSConfig
from operators.error_stats import budgets
from operators.noise import Domain, KeyedGenerator
from operators.spread import noisy_spread, truncated_moments
from operators.threshold import candidate_grid, holdout_histogram
from operators.truncation import excess_counts, histogram_measured, noisy_statistic
from tests.audit._audit import audit_key, discrete_laplace, eps_lower_bound, event_hits

EPS_T = 5.0  # a large threshold budget: each statistic's share is then large enough for a broken one to show
THETA, BOUND, M = 12, 40, 256


def holdouts() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(21)
    d0 = np.minimum(rng.poisson(6.0, size=M), BOUND).astype(np.int64)
    d0[100] = 0
    d1 = d0.copy()
    d1[100] = BOUND
    return d0, d1


def excess_sums(values: np.ndarray, label: str, n: int, *, broken: bool = False) -> np.ndarray:
    """The noisy excess sum of ``n`` keys (the product's draw, or a broken one at a quarter of the sensitivity)."""
    cands = candidate_grid(float(BOUND), 1.0)
    counts, total = excess_counts(holdout_histogram(values, cands), cands, theta_units=THETA, bound_units=BOUND)
    eps = budgets(EPS_T)[1]
    out = np.empty(n)
    for i in range(n):
        gen = KeyedGenerator(audit_key(label, i))
        if broken:
            z = discrete_laplace(gen, int(Domain.TRUNCATION) << 16, 1, 0, 1, epsilon=eps / 2,
                                 sensitivity=(BOUND - THETA) / 4)[0]
            out[i] = total + z
        else:
            out[i] = np.frombuffer(noisy_statistic(counts, total, gen, eps, BOUND - THETA, M), "<f8")[0]
    return out


def squares(values: np.ndarray, label: str, n: int, *, broken: bool = False) -> np.ndarray:
    """The noisy truncated sum of squares of ``n`` keys (the product's, or a broken one at sensitivity theta)."""
    cands = candidate_grid(float(BOUND), 1.0)
    moments = truncated_moments(holdout_histogram(values, cands), cands, THETA)
    eps = budgets(EPS_T)[2]
    out = np.empty(n)
    for i in range(n):
        gen = KeyedGenerator(audit_key(label, i))
        if broken:
            out[i] = moments[1] + discrete_laplace(gen, int(Domain.TRUNCATION) << 16, 2, 1, 1,
                                                   epsilon=3 * eps / 8, sensitivity=THETA)[0]
        else:
            out[i] = noisy_spread(moments, None, theta_units=THETA, leaf_ticks=1, gen=gen, epsilon=eps)[2]
    return out


def audit(s0: np.ndarray, s1: np.ndarray, centre: float, scale: float) -> float:
    thresholds = centre + scale * np.linspace(-3.0, 4.0, 15)
    return eps_lower_bound(event_hits(s0, thresholds), event_hits(s1, thresholds), s0.size, s1.size)


def test_the_excess_sum_stays_within_its_share_of_the_threshold_budget() -> None:
    assert histogram_measured(budgets(EPS_T)[1], M)  # the sum's share is then half the statistic's
    d0, d1 = holdouts()
    n = 6000
    s0, s1 = excess_sums(d0, "xs-0", n), excess_sums(d1, "xs-1", n)
    assert audit(s0, s1, float(np.median(s0)), BOUND - THETA) <= budgets(EPS_T)[1] / 2


def test_an_excess_sum_noised_for_a_quarter_of_its_sensitivity_is_flagged() -> None:
    d0, d1 = holdouts()
    n = 6000
    s0, s1 = excess_sums(d0, "xb-0", n, broken=True), excess_sums(d1, "xb-1", n, broken=True)
    assert audit(s0, s1, float(np.median(s0)), (BOUND - THETA) / 4) > budgets(EPS_T)[1] / 2


def test_the_sum_of_squares_stays_within_its_share_of_the_threshold_budget() -> None:
    d0, d1 = holdouts()
    n = 6000
    s0, s1 = squares(d0, "sq-0", n), squares(d1, "sq-1", n)
    assert audit(s0, s1, float(np.median(s0)), THETA * THETA) <= 3 * budgets(EPS_T)[2] / 8


def test_a_sum_of_squares_noised_for_theta_instead_of_theta_squared_is_flagged() -> None:
    d0, d1 = holdouts()
    n = 6000
    s0, s1 = squares(d0, "sb-0", n, broken=True), squares(d1, "sb-1", n, broken=True)
    assert audit(s0, s1, float(np.median(s0)), THETA) > 3 * budgets(EPS_T)[2] / 8


def test_the_holdouts_outputs_together_stay_within_the_threshold_budget() -> None:
    """The whole end of the holdout through the operator (theta, s and the start chosen, then both statistics
    measured at that theta), on the neighbouring holdouts: events on theta jointly with the excess sum and the sum
    of squares (each thresholded at its median on D0) stay below ``threshold_epsilon``."""
    d0, d1 = holdouts()
    cfg = ToPSConfig(epsilon=EPS_T, bound=float(BOUND), holdout=M, query_range=256, fanout=4)
    n = 3000

    def outcomes(values: np.ndarray, label: str) -> np.ndarray:
        rows = []
        for i in range(n):
            op = ToPS(cfg, audit_key(label, i))
            op.process(values.astype(float))
            stats = np.frombuffer(op.error_stats, "<f8")
            k = int(stats[0])
            rows.append((op.theta_units, stats[3], stats[1 + k]))  # theta, sum of squares, excess sum
        return np.array(rows)

    o0, o1 = outcomes(d0, "all-0"), outcomes(d1, "all-1")
    sq_mid, ex_mid = np.median(o0[:, 1]), np.median(o0[:, 2])
    codes0 = o0[:, 0] * 4 + (o0[:, 1] >= sq_mid) * 2 + (o0[:, 2] >= ex_mid)
    codes1 = o1[:, 0] * 4 + (o1[:, 1] >= sq_mid) * 2 + (o1[:, 2] >= ex_mid)
    events = np.array(sorted(set(codes0.tolist()) | set(codes1.tolist())))
    hits0 = np.array([(codes0 == e).sum() for e in events])
    hits1 = np.array([(codes1 == e).sum() for e in events])
    assert eps_lower_bound(hits0, hits1, n, n) <= EPS_T

"""Audit of the threshold selection NM-E (Eq. 5-6, by permute-and-flip) on neighbouring holdouts.

Holdout D0 has 98 zeros and two 2s, D1 moves one zero to 2 (B = 2, candidates theta = 1, 2). With m = 100, r = 4,
b = 2, eps = 1 the Eq. 6 slope is 5, so ``q(2) - q(1) = -3`` on D0 and ``-2`` on D1: permute-and-flip reports
theta = 2 when it comes first in the order and is accepted, ``P(theta = 2) = e^(-eps gap) / 2``, and the ratio is
exactly ``e^eps``. The event "theta = 2" is the extremal one.
The same neighbours through the ``ToPS`` operator, with and without ``threshold_epsilon``: test_audit_tops.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from operators import ToPSConfig
from operators._chacha_kernel import keystream_many
from operators._selection_kernel import gaps_permute_and_flip_many
from operators.baselines import baseline_domain
from operators.noise import KeyedGenerator
from operators.permute_and_flip import flip_grid, keyed_permute_and_flip, quantized_scores
from operators.threshold import candidate_grid, holdout_histogram, m_theta, score_bound, scores
from tests.audit._audit import audit_key, eps_lower_bound

EPS = 1.0
CFG = ToPSConfig(epsilon=EPS, bound=2, holdout=100, query_range=4, fanout=2)
_PARAMS = {"m": CFG.holdout, "epsilon": CFG.epsilon, "query_range": CFG.query_range, "fanout": CFG.fanout}


def _holdout(twos: int) -> np.ndarray:
    x = np.zeros(CFG.holdout)
    x[:twos] = 2.0
    return x


def _scores(holdout: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cands = candidate_grid(CFG.bound, CFG.resolution)
    q = scores(m_theta(holdout_histogram(holdout.astype(np.int64), cands)), cands.astype(float), **_PARAMS)
    return cands, q


def _sample_choices(q: np.ndarray, n: int, noise_eps: float, label: str) -> np.ndarray:
    """``n`` permute-and-flip choices by the compiled walk, row k under its own key; checked against the operator's
    ``keyed_permute_and_flip`` (the Python walk) on the first rows."""
    domain = baseline_domain("audit", 1)
    bound = score_bound(candidate_grid(CFG.bound, CFG.resolution).astype(float), **_PARAMS)
    grid = flip_grid(noise_eps, bound)
    quantized = quantized_scores(q, grid)
    gens = [KeyedGenerator(audit_key(label, k)) for k in range(n)]
    words = keystream_many(np.stack([g.key_words() for g in gens]), 0, domain, 0, 0, 2)
    choice = gaps_permute_and_flip_many(words, quantized.max() - quantized, grid.shift)
    assert (choice >= 0).all()  # two candidates: a few bits a walk
    for k in range(50):
        assert choice[k] == keyed_permute_and_flip(q, noise_eps, bound, gens[k], domain, 0, budgets=())
    return choice


def test_scores_of_the_neighbouring_holdouts() -> None:
    _, q0 = _scores(_holdout(2))
    _, q1 = _scores(_holdout(3))
    assert q0[1] - q0[0] == pytest.approx(-3.0)
    assert q1[1] - q1[0] == pytest.approx(-2.0)


@pytest.mark.parametrize(("noise_eps", "flagged"), [(EPS, False), (2 * EPS, True)])
def test_nm_e_audit(noise_eps: float, flagged: bool) -> None:
    """Correct: eps_lb in [0.85 eps, eps]; the acceptance exponent doubled (run at 2 eps): eps_lb > eps."""
    n = 200_000
    c0 = _sample_choices(_scores(_holdout(2))[1], n, noise_eps, f"nme-0-{noise_eps}")
    c1 = _sample_choices(_scores(_holdout(3))[1], n, noise_eps, f"nme-1-{noise_eps}")
    events = np.array([[np.sum(c0 == 1)], [np.sum(c1 == 1)]])
    lb = eps_lower_bound(events[0], events[1], n, n)
    if flagged:
        assert lb > EPS
    else:
        assert 0.85 * EPS <= lb <= EPS

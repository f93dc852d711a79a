"""Report-noisy-max drawn from the largest noise down (operators/noisy_max.py) reports with report-noisy-max's law.

The threshold's choice over every candidate is eps-DP because its index has the distribution of the first index of
``max_k u_k + Exp(eps)``. Drawing the noise lazily must not change that law: a wrong order-statistics step (the
uniforms' minimum drawn as if every candidate were still there), a stop that forgets a candidate could still win,
or a shuffle that gives one candidate two noises would each skew it. Here the exact law (one integral per
candidate) against 25,000 keyed draws per score vector, by a chi-square test at a stated level, for scores close
together, far apart, all equal, and over many candidates where only a few can win.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from operators import noisy_max
from operators.noise import Domain, KeyedGenerator
from operators.noisy_max import WordStream, report_noisy_max_drawn

_DRAWS = 25_000
# the chi-square distribution's 1e-4 upper point, by degrees of freedom
_CRITICAL = {3: 21.11, 4: 23.51}


def _exact_law(util: np.ndarray, eps: float, which: list[int]) -> np.ndarray:
    """P(k wins) for k in ``which``: int eps e^(-eps (x - u_k)) prod_(j != k) (1 - e^(-eps (x - u_j)))_+ dx over
    x >= u_k (the density of candidate k's noisy score times the others' distribution functions), by the trapezoid
    rule on a fine grid."""
    x = np.linspace(util.max() - 1.0 / eps, util.max() + 40.0 / eps, 200_001)  # below it: the top's CDF is tiny
    log_cdf_sum = np.zeros_like(x)
    for u in util:  # sum over the candidates of log F_j(x), F_j(x) = (1 - e^(-eps (x - u_j)))_+
        log_cdf_sum += np.log(np.maximum(-np.expm1(-eps * (x - u)), 1e-300))
    law = []
    for k in which:
        dens = np.where(x >= util[k], eps * np.exp(-eps * (x - util[k])), 0.0)
        own = np.log(np.maximum(-np.expm1(-eps * (x - util[k])), 1e-300))
        law.append(np.trapezoid(dens * np.exp(log_cdf_sum - own), x))
    return np.array(law)


def _draws(util: np.ndarray, eps: float, seed: int) -> np.ndarray:
    """The index of ``_DRAWS`` draws, each under a key of its own (a seeded generator's bytes)."""
    rng = np.random.default_rng(seed)
    out = np.empty(_DRAWS, dtype=np.int64)
    for i in range(_DRAWS):
        gen = KeyedGenerator(rng.bytes(32))
        out[i] = report_noisy_max_drawn(util, eps, WordStream(partial(gen.words, int(Domain.THRESHOLD), 4)))
    return out


def _chi_square(picks: np.ndarray, util: np.ndarray, eps: float, singles: list[int]) -> tuple[float, int]:
    """The counts of each candidate of ``singles`` and of all the others together, against the law."""
    expected = list(_exact_law(util, eps, singles))
    expected.append(1.0 - sum(expected))
    observed = [int(np.sum(picks == k)) for k in singles]
    observed.append(picks.size - sum(observed))
    obs, exp = np.array(observed, dtype=np.float64), np.array(expected) * picks.size
    assert exp.min() >= 50  # the test's approximation holds
    return float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1


_CASES = {  # scores, eps, the candidates counted one by one
    "close": (np.array([0.0, -0.3, -1.0, -2.0, -4.0, -8.0]), 1.0, [0, 1, 2, 3]),
    "far for the noise": (np.array([-1.0, 0.0, -0.2, -3.0, -0.5, -6.0, -1.5]), 3.0, [0, 1, 2, 4]),
    "many near the top": (np.linspace(0.0, -2.0, 300), 2.0, [0, 1, 5, 20]),
    "few of many can win": (np.concatenate([[-0.4, 0.0, -0.1, -1.2], np.linspace(-9.0, -30.0, 996)]), 1.0,
                            [0, 1, 2]),
}


@pytest.mark.parametrize(("name", "near_most"), [("close", 64), ("close", 0), ("far for the noise", 64),
                                                 ("far for the noise", 0), ("many near the top", 64),
                                                 ("few of many can win", 64)])
def test_the_index_has_report_noisy_maxs_law(name: str, near_most: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each candidate of the case's list on its own, the others together: chi-square below its 1e-4 point. With
    ``near_most = 0`` no candidate gets a noise apart: all are drawn from the largest down, to the last one."""
    monkeypatch.setattr(noisy_max, "NEAR_MOST", near_most)
    util, eps, singles = _CASES[name]
    picks = _draws(util, eps, seed=len(name))
    stat, df = _chi_square(picks, util, eps, singles)
    assert stat < _CRITICAL[df], (name, stat)


def test_equal_scores_are_won_alike() -> None:
    """A hundred equal scores (too many to be near the top apart: all drawn from the largest down): each candidate
    wins one draw in a hundred (the shuffle gives no candidate two noises and leaves none out)."""
    picks = _draws(np.zeros(100), 0.7, seed=50)
    counts = np.bincount(picks, minlength=100).reshape(10, 10).sum(axis=1)  # ten groups of ten, 2,500 expected each
    stat = float(((counts - 2500.0) ** 2 / 2500.0).sum())
    assert stat < 33.72  # chi-square, 9 degrees of freedom, 1e-4 point


def test_few_words_are_read_where_few_candidates_can_win() -> None:
    """The point of drawing from the largest noise down: over 1,000 candidates of which a handful can win, a few
    blocks of words, not a word a candidate."""
    util = np.concatenate([[-0.4, 0.0, -0.1, -1.2], np.linspace(-9.0, -30.0, 996)])
    rng = np.random.default_rng(3)
    read = []
    for _ in range(2000):
        gen = KeyedGenerator(rng.bytes(32))
        words = WordStream(partial(gen.words, int(Domain.THRESHOLD), 4))
        report_noisy_max_drawn(util, 1.0, words)
        read.append(words.read)
    assert np.mean(read) < 40 and max(read) < 1000

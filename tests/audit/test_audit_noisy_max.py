"""Audit of the small holdout's report-noisy-max as the daemon runs it (operators/noisy_max.py, compiled) on
neighbouring holdouts.

The choice scores every candidate ``u_k = -sqrt(base_k + m_theta_k^2)`` (``operators.selection``, the fallback) and
draws its exponential noise where it can matter: a noise each for the few candidates near the top, the others' from
the largest down. Here ``base = 0``, so ``u_k = -m_theta_k``, and the holdouts differ in one reading:

* two candidates: D0 has its 3 readings in bin 1 (``u = (-3, 0)``), D1 one of them in bin 0 (``u = (-2, 0)``);
  candidate 0 is drawn among "the others" on D0 and near the top on D1. ``P(candidate 0) = e^(-eps gap) / 2``: the
  ratio between the neighbours is exactly ``e^eps``;
* eighty candidates: the 3 readings in bin 20 (``u = -3`` for candidates 0-19, 0 for the other 60), on D1 one of
  them in bin 0 (``u = -2`` for 0-19): too many near the top to treat apart, so every noise is drawn from the largest
  down, with the shuffle. The event "a candidate below 20" has probabilities 0.0161 and 0.0426 (log ratio 0.974, one
  integral each).

The Clopper-Pearson lower bound on eps (200,000 draws a side) must land in [0.85 eps, eps] for the first (exact
ratio) and in [0.8 eps, eps] for the second (log ratio 0.974: the bound's margin at that count is about 0.13), and a
choice whose noise is half as large (drawn at 2 eps) must be flagged in both.
"""

from __future__ import annotations

import numpy as np
import pytest

from operators._chacha_kernel import keystream_many
from operators._selection_kernel import cells_drawn_max_many
from operators.noise import Domain, KeyedGenerator
from operators.noisy_max import WordStream, report_noisy_max_drawn
from tests.audit._audit import audit_key, eps_lower_bound

EPS = 1.0
N = 200_000


def _choices(candidates: int, moved: int, noise_eps: float, label: str) -> np.ndarray:
    """``N`` choices of the compiled kernel, each under its own key, for 3 readings in bin ``1`` (two candidates) or
    ``20`` (eighty), ``moved`` of them in bin 0 instead."""
    keys = [audit_key(label, i) for i in range(N)]
    words = keystream_many(np.stack([KeyedGenerator(k).key_words() for k in keys]), 0, int(Domain.THRESHOLD), 4, 0, 2)
    at = 1 if candidates == 2 else 20
    cells = np.array([0, at] if moved else [at], dtype=np.int64)
    counts = np.array([moved, 3 - moved] if moved else [3], dtype=np.int64)
    base = np.zeros(candidates)
    points = np.arange(candidates + 1, dtype=np.int64)  # the bins' values (for the truncated sums, unused here)
    offsets = np.arange(N + 1, dtype=np.int64) * cells.size
    picks, _ = cells_drawn_max_many(words, np.tile(cells, N), np.tile(counts, N), offsets, base, noise_eps, points)
    util = np.where(np.arange(candidates) < at, -(3.0 - moved), 0.0)
    for i in np.flatnonzero(picks < 0).tolist():  # the rare draw that needs more than two blocks of words
        gen = KeyedGenerator(keys[i])
        picks[i] = report_noisy_max_drawn(util, noise_eps, WordStream(lambda s, c, g=gen: g.words(
            int(Domain.THRESHOLD), 4, s, c)))
    return picks


@pytest.mark.parametrize("candidates", [2, 80])
@pytest.mark.parametrize(("noise_eps", "flagged"), [(EPS, False), (2 * EPS, True)])
def test_the_small_holdouts_choice_reaches_its_epsilon(candidates: int, noise_eps: float, flagged: bool) -> None:
    c0 = _choices(candidates, 0, noise_eps, f"drawn-{candidates}-0-{noise_eps}")
    c1 = _choices(candidates, 1, noise_eps, f"drawn-{candidates}-1-{noise_eps}")
    low = 1 if candidates == 2 else 20  # the event: a candidate whose score moved
    lb = eps_lower_bound(np.array([np.sum(c0 < low)]), np.array([np.sum(c1 < low)]), N, N)
    if flagged:
        assert lb > EPS, lb
    else:
        assert (0.85 if candidates == 2 else 0.8) * EPS <= lb <= EPS, lb

"""Audit of the small holdout's permute-and-flip as the daemon runs it (operators/permute_and_flip.py, compiled) on
neighbouring holdouts.

The choice scores every candidate ``u_k = -sqrt(base_k + m_theta_k^2)`` (``operators.selection``, the fallback),
puts the scores on its integer grid and walks the candidates in a random order, accepting each with probability
``exp(eps (u_k - u*))`` (exactly, on the grid). Here ``base = 0``, so ``u_k = -m_theta_k``, and the holdouts differ
in one reading:

* two candidates: D0 has its 3 readings in bin 1 (``u = (-3, 0)``), D1 one of them in bin 0 (``u = (-2, 0)``).
  ``P(candidate 0) = e^(-eps gap) / 2`` (first in the order and accepted): the ratio between the neighbours is
  exactly ``e^eps``;
* eighty candidates: the 3 readings in bin 20 (``u = -3`` for candidates 0-19, 0 for the other 60), on D1 one of
  them in bin 0 (``u = -2`` for 0-19): long walks (a position among 80, then among 79, ...). The event "a candidate
  below 20" has probabilities 0.0161 and 0.0426 (log ratio 0.974; permute-and-flip's law is report-noisy-max's with
  exponential noise, one integral each).

The Clopper-Pearson lower bound on eps (200,000 draws a side) must land in [0.85 eps, eps] for the first (exact
ratio) and in [0.8 eps, eps] for the second (log ratio 0.974: the bound's margin at that count is about 0.13), and a
choice whose acceptance exponent is twice as large (run at 2 eps) must be flagged in both.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from operators._chacha_kernel import keystream_many
from operators._selection_kernel import cells_permute_and_flip_many
from operators.noise import Domain, KeyedGenerator
from operators.permute_and_flip import KeyBits, flip_grid, flip_walk, quantized_scores
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
    grid = flip_grid(noise_eps, 3.0)  # |u| <= m = 3, as the choice bounds it (selection._fallback_grid)
    picks, _ = cells_permute_and_flip_many(words, np.tile(cells, N), np.tile(counts, N), offsets, base, grid.scale,
                                           grid.shift, points)
    q = quantized_scores(np.where(np.arange(candidates) < at, -(3.0 - moved), 0.0), grid)
    for i in np.flatnonzero(picks < 0).tolist():  # the rare draw that needs more than two blocks of words
        bits = KeyBits(partial(KeyedGenerator(keys[i]).words, int(Domain.THRESHOLD), 4))
        picks[i] = flip_walk((q.max() - q).tolist(), grid.shift, bits)
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

"""The compiled report-noisy-max (operators/_selection_kernel.py) picks exactly what the numpy path picks.

The kernel skips the candidates that cannot reach the maximum without computing their logarithm; a skip that is
wrong by one rounding, or a tie resolved to another index, would make a daemon (which loads the compiled kernels)
release other values than `tops replay` (which does not). Here: random scores at every scale, ties of scores and of
uniforms, the holdout's real fallback scores, and whole streams under both kernels in separate processes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from operators._selection_kernel import cells_noisy_max, counts_noisy_max, noisy_argmax
from operators.noise import _words_to_uniform
from operators.selection import _grids, noise_constant, range_length_moment
from operators.threshold import candidate_grid, holdout_histogram, m_theta, report_noisy_max


def _numpy_pick(util: np.ndarray, words: np.ndarray, eps: float) -> int:
    return report_noisy_max(util, _words_to_uniform(words), eps)


def test_random_scores_at_every_scale_and_budget() -> None:
    rng = np.random.default_rng(20261126)
    for trial in range(3000):
        n = int(rng.integers(1, 5000))
        eps = float(10 ** rng.uniform(-3, 1.5))
        util = -np.abs(rng.standard_normal(n)) * 10 ** rng.uniform(-3, 4)
        if trial % 3 == 0:
            util = np.round(util)  # many equal scores
        words = rng.integers(0, 2**64, n, dtype=np.uint64)
        assert noisy_argmax(util, words, eps) == _numpy_pick(util, words, eps), trial


def test_ties_go_to_the_first_index_as_numpy_argmax() -> None:
    rng = np.random.default_rng(7)
    for trial in range(500):
        n = int(rng.integers(2, 300))
        util = np.zeros(n) if trial % 2 else -rng.integers(0, 3, n).astype(np.float64)
        words = np.full(n, rng.integers(0, 2**64, dtype=np.uint64), dtype=np.uint64)  # every uniform the same
        if trial % 5 == 0:
            words[rng.integers(0, n, 3)] = np.uint64(0)  # the smallest uniform, three times
        eps = float(10 ** rng.uniform(-2, 1))
        assert noisy_argmax(util, words, eps) == _numpy_pick(util, words, eps), trial
    # the largest noisy score first reached late, after a candidate with the largest noise and a lower score
    util = np.array([-5.0, 0.0, 0.0, -1.0])
    words = np.array([0, 2**62, 2**62, 2**62], dtype=np.uint64)
    assert noisy_argmax(util, words, 1.0) == _numpy_pick(util, words, 1.0)


@pytest.mark.parametrize("bound", [100.0, 5000.0, 1e6])
def test_the_holdouts_fallback_scores(bound: float) -> None:
    """The scores of the calibrated choice's small-holdout branch (``choose``: theta from counts over every
    candidate), from real histograms: the kernel's running Eq. 5 and one pass give the numpy index."""
    rng = np.random.default_rng(int(bound))
    cands = candidate_grid(bound, 1.0)
    grid = _grids(cands)
    moment = range_length_moment(1 << 20)
    for trial in range(400):
        m = int(rng.integers(1, 400))
        eps = float(10 ** rng.uniform(-1.5, 1))
        units = np.minimum(rng.gamma(1.0, 10 ** rng.uniform(0, np.log10(bound)), m).round(), bound).astype(np.int64)
        hist = holdout_histogram(units, cands).astype(np.int32 if trial % 2 else np.int64)
        base = grid.noise_term(m * m * noise_constant(16, 1 << 20, int(rng.integers(0, 5))), eps**2, moment)
        util = -np.sqrt(base + m_theta(hist.astype(np.int64)).astype(np.float64) ** 2)
        words = rng.integers(0, 2**64, cands.size, dtype=np.uint64)
        assert counts_noisy_max(hist, base, words, eps) == _numpy_pick(util, words, eps), trial


_STREAMS = """
import sys, numpy as np
from operators.config import ToPSConfig
from operators.tops import ToPS
out = []
for i, (holdout, bound, eps) in enumerate([(3, 5000.0, 1.0), (40, 5000.0, 0.3), (200, 800.0, 2.0), (3, 1e5, 0.1),
                                            (2000, 500.0, 1.0)] * 12):
    cfg = ToPSConfig(epsilon=eps, bound=bound, holdout=holdout, query_range=4096, fanout=4)
    rng = np.random.default_rng(i)
    x = np.minimum(rng.gamma(1.0, bound / 20, holdout + 50).round(), bound)
    op = ToPS(cfg, bytes([i]) * 32)
    out.append([op.process_one(v) for v in x])
    out.append(ToPS(cfg, bytes([i]) * 32).process(x))
np.save(sys.argv[1], np.nan_to_num(np.concatenate([np.asarray(o, dtype=np.float64) for o in out]), nan=-1.0))
"""


def test_streams_release_the_same_with_either_kernel(tmp_path) -> None:
    """Whole streams (holdouts that take the small-holdout branch and the calibrated one, thetas over big grids) in
    a process on the numpy paths and in one on the compiled kernels: the same releases, bit for bit."""
    runs = {}
    for kind in ("numpy", "numba"):
        out = tmp_path / f"{kind}.npy"
        r = subprocess.run([sys.executable, "-c", _STREAMS, str(out)], env={**os.environ, "TOPS_NOISE_KERNEL": kind},
                           capture_output=True, text=True, timeout=600, check=False)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[kind] = np.load(out)
    assert runs["numpy"].size > 20_000 and np.array_equal(runs["numpy"], runs["numba"])


@pytest.mark.parametrize("bound", [100.0, 5000.0, 1e6])
def test_the_occupied_cells_give_the_dense_index(bound: float) -> None:
    """``cells_noisy_max`` (a small holdout's histogram by its occupied cells, as ToPS keeps it) picks what the dense
    kernel and numpy pick: holdouts of 1 to 130 values, cells at the grid's two ends and side by side, uniforms with
    the smallest one anywhere (in a run, at its ends), many budgets."""
    rng = np.random.default_rng(int(bound) + 1)
    cands = candidate_grid(bound, 1.0)
    grid = _grids(cands)
    moment = range_length_moment(1 << 20)
    n = cands.size
    for trial in range(1500):
        m = int(rng.integers(1, 130))
        eps = float(10 ** rng.uniform(-1.5, 1.5))
        kind = trial % 5
        if kind == 0:  # values at the grid's ends (bin 0: at or below the first candidate; bin n: above every one)
            units = rng.choice(np.array([0, 1, int(cands[-1]), int(cands[-1]) + 1, int(cands[1])]), m)
        elif kind == 1:  # a few neighbouring cells
            units = int(rng.integers(0, n)) + rng.integers(0, 3, m)
        else:
            units = np.minimum(rng.gamma(1.0, 10 ** rng.uniform(0, np.log10(bound)), m).round(), bound + 1)
        hist = holdout_histogram(np.asarray(units, dtype=np.int64), cands)
        index = np.flatnonzero(hist).astype(np.int64)
        base = grid.noise_term(m * m * noise_constant(16, 1 << 20, int(rng.integers(0, 5))), eps**2, moment)
        assert np.all(np.diff(base) >= 0)  # what the kernel relies on
        words = rng.integers(0, 2**64, n, dtype=np.uint64)
        if trial % 3 == 0:  # the largest noise at a run's start or end, or in bin 0's run
            at = int(rng.choice(np.concatenate([index, index - 1, [0, n - 1]]).clip(0, n - 1)))
            words[at] = np.uint64(int(rng.integers(0, 1 << 20)))
        util = -np.sqrt(base + m_theta(hist).astype(np.float64) ** 2)
        want = _numpy_pick(util, words, eps)
        assert counts_noisy_max(hist, base, words, eps) == want, trial
        assert cells_noisy_max(index, hist[index], base, words, eps) == want, trial

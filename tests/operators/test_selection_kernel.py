"""The compiled report-noisy-max (operators/_selection_kernel.py) picks exactly what the Python path picks.

Both draw the exponential noise from the largest down (operators/noisy_max.py) from the same keystream words; a
stopping rule that is wrong by one rounding, a shuffle position read differently or a tie resolved to another index
would make a daemon (which loads the compiled kernels) release other values than `tops replay` (which does not).
Here: the holdout's real fallback scores by dense histograms and by occupied cells, scores far apart for the noise
(many steps: the shuffle kept whole), and whole streams under both kernels in separate processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial

import numpy as np
import pytest

from operators._selection_kernel import cells_drawn_max, counts_drawn_max
from operators.noise import Domain, KeyedGenerator
from operators.noisy_max import WordStream, report_noisy_max_drawn
from operators.selection import _grids, noise_constant, range_length_moment
from operators.threshold import candidate_grid, holdout_histogram, m_theta


def _python_pick(util: np.ndarray, gen: KeyedGenerator, eps: float) -> tuple[int, int]:
    """The Python path's index, and how many words it read."""
    words = WordStream(partial(gen.words, int(Domain.THRESHOLD), 4))
    k = report_noisy_max_drawn(util, eps, words)
    return k, words.read


def _kernel_picks(hist: np.ndarray, base: np.ndarray, gen: KeyedGenerator, eps: float, read: int) -> tuple[int, int]:
    """The kernels' indexes given exactly the words the Python path read (and -1 from both with one word less)."""
    index = np.flatnonzero(hist).astype(np.int64)
    words = gen.words(int(Domain.THRESHOLD), 4, 0, read)
    picks = (counts_drawn_max(hist.astype(np.int64), base, words, eps),
             cells_drawn_max(index, hist[index].astype(np.int64), base, words, eps))
    short = words[:-1]
    assert counts_drawn_max(hist.astype(np.int64), base, short, eps) == -1
    assert cells_drawn_max(index, hist[index].astype(np.int64), base, short, eps) == -1
    return picks


@pytest.mark.parametrize("bound", [100.0, 5000.0, 1e6])
def test_the_holdouts_fallback_scores(bound: float) -> None:
    """The scores of the calibrated choice's small-holdout branch (``choose``: theta from counts over every
    candidate), from real histograms, by the dense kernel and by the occupied cells: the Python path's index. Some
    trials take thousands of steps (a few candidates far above the others for the noise), past the kernel's short
    list of moved positions."""
    rng = np.random.default_rng(int(bound))
    cands = candidate_grid(bound, 1.0)
    grid = _grids(cands)
    moment = range_length_moment(1 << 20)
    n = cands.size
    words_read = []
    for trial in range(400):
        m = int(rng.integers(1, 400))
        eps = float(10 ** rng.uniform(-1.5, 1.5))
        kind = trial % 4
        if kind == 0:  # values at the grid's ends (bin 0: at or below the first candidate; bin n: above every one)
            units = rng.choice(np.array([0, 1, int(cands[-1]), int(cands[-1]) + 1, int(cands[1])]), m)
        elif kind == 1:  # a few neighbouring cells
            units = int(rng.integers(0, n)) + rng.integers(0, 3, m)
        else:
            units = np.minimum(rng.gamma(1.0, 10 ** rng.uniform(0, np.log10(bound)), m).round(), bound + 1)
        hist = holdout_histogram(np.asarray(units, dtype=np.int64), cands)
        hist = hist.astype(np.int32 if trial % 2 else np.int64)
        base = grid.noise_term(m * m * noise_constant(16, 1 << 20, int(rng.integers(0, 5))), eps**2, moment)
        assert np.all(np.diff(base) >= 0)  # what the cells kernel relies on
        util = -np.sqrt(base + m_theta(hist.astype(np.int64)).astype(np.float64) ** 2)
        gen = KeyedGenerator(rng.bytes(32))
        want, read = _python_pick(util, gen, eps)
        words_read.append(read)
        assert _kernel_picks(hist, base, gen, eps, read) == (want, want), trial
    assert max(words_read) > 2 * 32 + 16  # some trials went past the short list of moved positions


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

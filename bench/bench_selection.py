"""The small holdout's threshold choice by permute-and-flip: its expected score against the exponential mechanism's,
and what a choice costs.

    python bench/bench_selection.py [--holdouts 100] [--keys 200] [--bound 5000]

Random holdouts of 3 to 150 readings (gamma-distributed over [0, B], in half of them a quarter of the readings at the
bound, as clamped meters give), eps 0.1 to 20, on the exact grid (4,296 candidates at B = 5,000), where
``operators.selection`` chooses theta from counts alone (the fallback; holdouts that take the calibrated branch are
skipped): scores ``u_k = -sqrt(base_k + m_theta_k^2)``. For each holdout, in units of the score (the model's RMSE
over ``sqrt(E[l^2])``):

* the expected loss ``u* - E[u_chosen]`` of permute-and-flip on its grid (closed form, McKenna and Sheldon: the
  first accepted of a random order is uniform among the accepted), and of the exponential mechanism at the same
  budget (``P(k) ~ exp(eps u_k)``, monotone scores);
* the mean loss of ``--keys`` compiled draws (the implementation, against its closed form: a pooled z-score);
* the compiled walk's time (process CPU time, median of the holdout's keys; 4,096 words given) and the keystream
  words a walk reads (on 20 keys a holdout).

Prints the mean and the worst ratio of the two mechanisms' losses and the cost's quantiles. Not a test: nothing
here asserts.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from operators import noise, selection
from operators._selection_kernel import cells_permute_and_flip
from operators.config import ToPSConfig
from operators.noise import Domain, KeyedGenerator
from operators.permute_and_flip import KeyBits, flip_walk, quantized_scores
from operators.threshold import holdout_histogram, m_theta
from operators.tops import ToPS

_NEGLIGIBLE = 1e-9


def flip_law(gaps: np.ndarray, shift: int) -> np.ndarray:
    """P(k) of permute-and-flip: ``p_k int_0^1 prod_(j != k) (1 - p_j (1 - t)) dt`` (Gauss-Legendre, exact)."""
    p = np.exp(-gaps.astype(np.float64) / 2.0**shift)
    live = np.flatnonzero(p > 1e-300)
    nodes, weights = np.polynomial.legendre.leggauss(live.size // 2 + 2)
    t, w = (nodes + 1.0) / 2.0, weights / 2.0
    logs = np.log1p(-p[live, None] * (1.0 - t[None, :]))
    out = np.zeros(p.size)
    out[live] = p[live] * (np.exp(logs.sum(axis=0)[None, :] - logs) @ w)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--holdouts", type=int, default=100)
    ap.add_argument("--keys", type=int, default=200)
    ap.add_argument("--bound", type=float, default=5000.0)
    a = ap.parse_args()
    noise._kernel(1 << 16)
    rng = np.random.default_rng(0)
    ratios, implementation, cpu, words = [], [], [], []
    n_fallback = 0
    for _ in range(a.holdouts):
        m = int(rng.integers(3, 151))
        eps = float(10 ** rng.uniform(-1, math.log10(20)))
        cfg = ToPSConfig(epsilon=eps, bound=a.bound, holdout=m)
        cands = ToPS(cfg, bytes(32))._candidates
        grid = selection._grids(cands)
        fallback, _, eps_t = selection._threshold_budgets(m, eps, grid.geo.size)
        if not fallback:
            continue
        base = selection._counts_base(grid, list(range(cfg.height)), selection._noise_constants(16, cfg.query_range),
                                      m, eps, selection.range_length_moment(cfg.query_range))
        flip = selection._fallback_grid(base, m, eps_t)
        x = np.minimum(rng.gamma(1.0, a.bound / float(rng.choice([50, 10, 3])), m).round(), a.bound)
        if rng.random() < 0.5:
            x[rng.random(m) < 0.25] = a.bound
        hist = holdout_histogram(x.astype(np.int64), cands)
        util = -np.sqrt(base + m_theta(hist).astype(np.float64) ** 2)
        q = quantized_scores(util, flip)
        gaps = q.max() - q
        law = flip_law(gaps, flip.shift)
        loss_pf = float(util.max() - law @ util)
        n_fallback += 1
        em = np.exp(eps_t * (util - util.max()))
        loss_em = float(util.max() - (em / em.sum()) @ util)
        if loss_em > _NEGLIGIBLE:  # below it both choose the best with probability 1 - 1e-9 (float noise)
            ratios.append(loss_pf / loss_em)
        cells = np.flatnonzero(hist).astype(np.int64)
        counts = hist[cells].astype(np.int64)
        picks, spent = [], []
        for k in range(a.keys):
            gen = KeyedGenerator(rng.bytes(32))
            w = np.require(gen.words(int(Domain.THRESHOLD), 4, 0, 4096), np.uint64, ["C", "W"])
            t0 = time.process_time()
            pick = cells_permute_and_flip(cells, counts, base, w, flip.scale, flip.shift)
            spent.append(time.process_time() - t0)
            if pick < 0 or k < 20:  # the words a walk reads (the Python walk: the same draws), on a few keys
                bits = KeyBits(partial(gen.words, int(Domain.THRESHOLD), 4))
                pick = flip_walk(gaps.tolist(), flip.shift, bits)
                words.append(bits.read)
            picks.append(pick)
        spread = float(np.sqrt(law @ (util.max() - util - loss_pf) ** 2 / a.keys))  # the mean's standard error
        implementation.append((float(util.max() - util[np.array(picks)].mean()), loss_pf, spread))
        cpu.append(float(np.median(spent)))
    r = np.array(ratios)
    print(f"{n_fallback} fallback holdouts of 3 to 150 readings at B = {a.bound:g} (exact grid), eps 0.1 to 20")
    print(f"expected score loss, permute-and-flip / exponential mechanism ({r.size} holdouts whose loss is above "
          f"{_NEGLIGIBLE:g}): mean {r.mean():.3f}, median {np.median(r):.3f}, worst {r.max():.3f}, best {r.min():.3f}")
    imp = np.array(implementation)
    z = float(np.sum(imp[:, 0] - imp[:, 1]) / np.sqrt(np.sum(imp[:, 2] ** 2)))
    print(f"the implementation's mean loss over {a.keys} keys a holdout against its closed form: pooled z = {z:+.2f} "
          f"(mean loss {imp[:, 1].mean():.4f})")
    c, wd = np.array(cpu) * 1e6, np.array(words)
    print(f"compiled walk (CPU time, median per holdout): median {np.median(c):.1f} us, 90% {np.quantile(c, 0.9):.1f} "
          f"us, max {c.max():.1f} us; keystream words read: mean {wd.mean():.1f}, 99% {np.quantile(wd, 0.99):.0f}, "
          f"max {wd.max()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

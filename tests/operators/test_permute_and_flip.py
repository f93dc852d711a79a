"""Permute-and-flip (operators/permute_and_flip.py, compiled in operators/_selection_kernel.py) reports with its
exact law, on a grid that never spends more than its epsilon.

The threshold's choice is eps-DP because its index has permute-and-flip's law for the quantized scores: candidate
``r`` (gap ``g_r = Q* - Q_r`` grid steps below the best) accepted with probability ``p_r = exp(-g_r / 2^m)`` in a
uniformly random order. That law in closed form (McKenna and Sheldon, "Permute-and-Flip: A new mechanism for
differentially private selection", NeurIPS 2020: the first accepted in a random order is uniform among the accepted)::

    P(r) = p_r E[1 / (1 + #accepted others)] = p_r int_0^1 prod_(j != r) (1 - p_j (1 - t)) dt

(a polynomial in t of degree n - 1: Gauss-Legendre with n / 2 + 1 nodes is exact), checked against the sum over
all orders for small n. A biased order (a position taken modulo), a wrong acceptance exponent, or a walk that stops
early would each skew it: chi-square tests of 25,000 keyed draws a profile at the 1e-4 level, for scores close
together, far apart, all equal, and a few among a thousand.
"""

from __future__ import annotations

import itertools
import math
from functools import partial

import numpy as np
import pytest
from scipy.special import roots_legendre

from operators import noise
from operators._chacha_kernel import keystream_many
from operators._dlap_kernel import _bernoulli_exp
from operators._selection_kernel import _accepts, gaps_permute_and_flip, gaps_permute_and_flip_many
from operators.noise import Domain, KeyedGenerator
from operators.permute_and_flip import (
    FlipGrid,
    KeyBits,
    flip_grid,
    flip_walk,
    keyed_permute_and_flip,
    permute_and_flip,
    quantized_scores,
)

_DRAWS = 25_000
_CRITICAL = {3: 21.11, 4: 23.51, 9: 33.72}  # the chi-square distribution's 1e-4 upper point, by degrees of freedom


def exact_law(gaps: np.ndarray, shift: int) -> np.ndarray:
    """P(r) for every candidate: the integral of the module docstring by Gauss-Legendre (exact for the polynomial)."""
    p = np.exp(-np.asarray(gaps, dtype=np.float64) / 2.0**shift)
    nodes, weights = roots_legendre(p.size // 2 + 2)  # Gauss-Legendre nodes and weights on [-1, 1]
    t, w = (nodes + 1.0) / 2.0, weights / 2.0  # on [0, 1]
    factors = 1.0 - p[:, None] * (1.0 - t[None, :])  # (candidate, node); the best's factor is t > 0
    logs = np.log(factors)
    others = logs.sum(axis=0)[None, :] - logs
    return p * (np.exp(others) @ w)


def law_by_orders(gaps: np.ndarray, shift: int) -> np.ndarray:
    """P(r) by the definition: over all n! orders, the first accepted (small n only)."""
    p = np.exp(-np.asarray(gaps, dtype=np.float64) / 2.0**shift)
    out = np.zeros(p.size)
    orders = list(itertools.permutations(range(p.size)))
    for order in orders:
        none_yet = 1.0
        for r in order:
            out[r] += none_yet * p[r]
            none_yet *= 1.0 - p[r]
    return out / len(orders)


def grid_gaps(scores: np.ndarray, eps: float, bound: float) -> tuple[np.ndarray, FlipGrid]:
    grid = flip_grid(eps, bound)
    q = quantized_scores(scores, grid)
    return q.max() - q, grid


def draws(gaps: np.ndarray, shift: int, seed: int, count: int = _DRAWS) -> np.ndarray:
    """``count`` compiled draws, each under a key of its own (a seeded generator's bytes), given 64 blocks of words;
    the few that need more are drawn by the Python walk."""
    rng = np.random.default_rng(seed)
    keys = [rng.bytes(32) for _ in range(count)]
    picks = np.empty(count, dtype=np.int64)
    for lo in range(0, count, 5000):
        kw = np.stack([KeyedGenerator(k).key_words() for k in keys[lo : lo + 5000]])
        words = keystream_many(kw, 0, int(Domain.THRESHOLD), 4, 0, 64)
        picks[lo : lo + 5000] = gaps_permute_and_flip_many(words, gaps, shift)
    for i in np.flatnonzero(picks < 0).tolist():
        picks[i] = flip_walk(gaps.tolist(), shift, KeyBits(partial(KeyedGenerator(keys[i]).words,
                                                                    int(Domain.THRESHOLD), 4)))
    return picks


def chi_square(picks: np.ndarray, law: np.ndarray, groups: list) -> tuple[float, int]:
    """The counts of each group of ``groups`` (a candidate, or a range of them) and of all the others together,
    against the law."""
    members = [np.atleast_1d(np.arange(law.size)[g]) for g in groups]
    expected = [law[g].sum() for g in members]
    expected.append(1.0 - sum(expected))
    observed = [int(np.isin(picks, g).sum()) for g in members]
    observed.append(picks.size - sum(observed))
    obs, exp = np.array(observed, dtype=np.float64), np.array(expected) * picks.size
    assert exp.min() >= 50  # the test's approximation holds
    return float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1


_PROFILES = {  # scores, eps, the candidates counted one by one (or by ranges)
    "close together": (np.array([0.0, -0.3, -1.0, -2.0, -4.0, -8.0]), 1.0, [0, 1, 2, 3]),
    "far apart": (np.array([-1.0, 0.0, -0.2, -3.0, -0.5, -6.0, -1.5]), 3.0, [0, 1, 2, 4]),
    "many near the top": (np.linspace(0.0, -2.0, 300), 2.0, [0, 1, 5, 20]),
    "a few among a thousand": (np.concatenate([[-0.4, 0.0, -0.1, -1.2], np.linspace(-9.0, -30.0, 996)]), 1.0,
                               [0, 1, 2]),
    "fallback at holdout 3": (-np.sqrt(3.4e-8 * np.arange(1.0, 4297.0) ** 2
                                       + np.repeat([3.0, 2.0, 1.0, 0.0], [100, 640, 1500, 2056]) ** 2), 0.75,
                              [slice(0, 100), slice(100, 740), slice(740, 2240)]),
}


def test_the_closed_form_is_the_law_by_orders() -> None:
    for gaps, shift in (([0, 3, 10, 1], 2), ([5, 0, 0, 9, 2], 3), ([0, 0, 0], 0)):
        g = np.array(gaps)
        assert np.allclose(exact_law(g, shift), law_by_orders(g, shift), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", list(_PROFILES))
def test_the_index_has_permute_and_flips_law(name: str) -> None:
    """Each candidate (or range) of the profile's list on its own, the others together: chi-square below its 1e-4
    point."""
    scores, eps, singles = _PROFILES[name]
    gaps, grid = grid_gaps(scores, eps, float(np.abs(scores).max()))
    picks = draws(gaps, grid.shift, seed=len(name))
    stat, df = chi_square(picks, exact_law(gaps, grid.shift), singles)
    assert stat < _CRITICAL[df], (name, stat)


def test_equal_scores_are_won_alike() -> None:
    """A hundred equal scores: each candidate wins one draw in a hundred (the order favours none)."""
    gaps, grid = grid_gaps(np.zeros(100), 0.7, 1.0)
    assert not gaps.any()
    picks = draws(gaps, grid.shift, seed=50)
    counts = np.bincount(picks, minlength=100).reshape(10, 10).sum(axis=1)  # ten groups of ten, 2,500 expected each
    stat = float(((counts - 2500.0) ** 2 / 2500.0).sum())
    assert stat < _CRITICAL[9]


def test_the_grid_is_the_scores_law() -> None:
    """The quantized gaps stand for ``eps (q* - q_r)`` to within a grid step and the budget's 2^-18: the law on the
    grid is the real scores' law to 1e-5 (a wrong exponent, e.g. the factor 2 of a non-monotone score applied
    twice, or the scale forgotten, is far off)."""
    for scores, eps, _ in _PROFILES.values():
        gaps, grid = grid_gaps(scores, eps, float(np.abs(scores).max()))
        real = eps * (scores.max() - scores)
        assert np.all(np.abs(gaps / 2.0**grid.shift - real) <= real * 2.0**-18 + 2.0 / 2.0**grid.shift)
        on_grid = exact_law(gaps, grid.shift)
        ideal = exact_law(real * 2.0**40, 40)
        assert np.abs(on_grid - ideal).max() < 1e-5


@pytest.mark.parametrize("seed", range(4))
def test_the_grid_never_spends_more_than_its_epsilon(seed: int) -> None:
    """For budgets from 1e-6 to 1e9 and score bounds from 1 to 2^60: neighbours move the quantized scores by at most
    ``D`` steps with ``D / 2^m <= eps``; the scale keeps 2^-18 of the budget while ``S <= 2^27``; past ``E = 1``
    the choice is uniform."""
    rng = np.random.default_rng(seed)
    for _ in range(2000):
        eps = float(10 ** rng.uniform(-6, 9))
        bound = float(2 ** rng.uniform(0, 60))
        grid = flip_grid(eps, bound)
        room = eps * 2.0**grid.shift
        if grid.scale:
            assert grid.sensitivity(bound) <= room
            assert grid.scale * bound <= 2.0**61
        if bound <= 2**27 and eps * 2.0**56 >= 2**21:
            assert grid.scale / 2.0**grid.shift >= eps * (1 - 2.0**-18)


def test_neighbouring_holdouts_move_the_quantized_scores_as_the_grid_says() -> None:
    """The fallback's real scores ``-sqrt(base + m_theta^2)`` on holdouts that differ in one reading (m_theta moves
    by one, every candidate the same way): every quantized score moves up by at most ``D - c`` and down by at most
    ``c`` (``c = ceil(2 E S 2^-49)``), what the privacy argument takes."""
    rng = np.random.default_rng(7)
    thetas = np.arange(1.0, 4297.0)
    for _ in range(300):
        m = int(rng.integers(1, 400))
        a = float(10 ** rng.uniform(-12, 4))
        base = a * thetas**2
        eps = float(10 ** rng.uniform(-2, 1.5))
        bound = math.sqrt(base[-1] + m * m)
        grid = flip_grid(eps, bound)
        c = (grid.sensitivity(bound) - grid.scale) // 2
        above = np.sort(rng.integers(0, m, thetas.size))[::-1].astype(np.float64)  # m_theta falls with theta
        more = np.minimum(above + (thetas <= rng.integers(1, 4297)), m)  # one reading higher
        low = quantized_scores(-np.sqrt(base + above**2), grid)
        high = quantized_scores(-np.sqrt(base + more**2), grid)
        moved = low - high  # the scores fall as m_theta grows
        assert moved.min() >= -c and moved.max() <= grid.scale + c


@pytest.mark.parametrize(("base", "m", "eps"), [(4.4741465866291786e-15, 5, 0.10734155079330872),
                                               (2.090112701107672e-11, 362, 4.850841264266038)])
def test_a_rounding_past_the_sensitivity_stays_inside_the_grids_margin(base: float, m: int, eps: float) -> None:
    """Neighbouring scores ``-sqrt(base + m^2)`` and ``-sqrt(base + (m + 1)^2)`` (exactly less than 1 apart) whose
    computed floats are a little more than 1 apart: their quantized scores move by ``E + 1``, past what exact
    arithmetic allows, and the grid's margin (``D = E + 2c``, shifted by ``c``) still holds them."""
    bound = math.sqrt(base + (m + 1) ** 2) * (1 + 2.0**-40)
    grid = flip_grid(eps, bound)
    c = (grid.sensitivity(bound) - grid.scale) // 2
    low, high = quantized_scores(np.array([-math.sqrt(base + m * m), -math.sqrt(base + (m + 1) ** 2)]), grid)
    assert low - high == grid.scale + 1
    assert 0 <= low - high + c <= grid.sensitivity(bound)


def _sampler_accepts(padded: np.ndarray, nbits: int, gap: int, shift: int) -> tuple[bool, int]:
    """Bernoulli(exp(-gap / 2^shift)) by the discrete Laplace kernel's own ``_bernoulli_exp``: floor(x) draws at
    gamma = 1, then one at frac(x) (Canonne, Kamath and Steinke): (result, bits read; -1 when they ran out)."""
    cur = 0
    if gap == 0:
        return True, 0
    for _ in range(gap >> shift):
        ok, cur = _bernoulli_exp(padded, 0, nbits, cur, np.uint64(0), False, shift)
        if cur < 0 or not ok:
            return bool(ok), int(cur)
    frac = gap & ((1 << shift) - 1)
    if frac:
        ok, cur = _bernoulli_exp(padded, 0, nbits, cur, np.uint64(frac), True, shift)
        return bool(ok), int(cur)
    return True, int(cur)


def test_the_walks_bernoulli_draws_are_the_discrete_laplace_samplers() -> None:
    """Bernoulli(exp(-x)) of the walk, compiled (``_accepts``) and in Python (``KeyBits.accepts``), is the discrete
    Laplace sampler's ``_bernoulli_exp`` on the same bits: the same result after the same bits, for gaps near and
    far, every shift, and bit sequences that run out."""
    rng = np.random.default_rng(21)
    for _ in range(5000):
        shift = int(rng.integers(0, 57))
        gap = int(min(rng.exponential(float(rng.choice([0.3, 3.0, 30.0]))) * 2.0**shift, 2.0**62))
        nwords = int(rng.integers(1, 6))
        words = np.frombuffer(rng.bytes(8 * nwords), dtype=np.uint64)
        padded = np.append(words, np.uint64(0))
        want = _sampler_accepts(padded, 64 * nwords, gap, shift)
        ok, cur = _accepts(padded, 64 * nwords, 0, gap, shift)
        assert (bool(ok), int(cur)) == want or (cur == -1 and want[1] == -1)
        if want[1] >= 0:
            tail = np.append(words, np.zeros(8, dtype=np.uint64))
            bits = KeyBits(lambda start, count, w=tail: w[start : start + count])
            assert bits.accepts(gap, shift) == want[0]
            assert bits.position == want[1]


def test_the_python_walk_and_the_compiled_one_agree() -> None:
    """On random gaps (near, far, huge, all zero), the compiled walk given exactly the words the Python walk read
    reports its index, and -1 with one word less; the keyed entry point gives the same on either path."""
    rng = np.random.default_rng(11)
    for trial in range(3000):
        n = int(rng.integers(1, 300))
        shift = int(rng.integers(0, 57))
        spread = float(rng.choice([0.01, 1.0, 30.0, 1e6]))
        gaps = np.minimum(rng.exponential(spread, n) * 2.0**shift, 2.0**62).astype(np.int64)
        gaps[rng.integers(n)] = 0
        if trial % 50 == 0:
            gaps[:] = 0
        gen = KeyedGenerator(rng.bytes(32))
        bits = KeyBits(partial(gen.words, int(Domain.THRESHOLD), 4))
        want = flip_walk(gaps.tolist(), shift, bits)
        words = gen.words(int(Domain.THRESHOLD), 4, 0, bits.read)
        assert gaps_permute_and_flip(words, gaps, shift) == want, trial
        if bits.read:
            assert gaps_permute_and_flip(words[:-1], gaps, shift) == -1
    noise._kernel(1 << 16)  # the compiled kernels, as a daemon has them: the keyed entry point takes the compiled walk
    assert noise.compiled_loaded()
    scores = np.concatenate([[0.0, -0.5], np.linspace(-40.0, -80.0, 3000)])
    for i in range(30):
        gen = KeyedGenerator(bytes([i]) * 32)
        python = permute_and_flip(scores, 2.0, 80.0, KeyBits(partial(gen.words, int(Domain.THRESHOLD), 9)))
        assert keyed_permute_and_flip(scores, 2.0, 80.0, gen, int(Domain.THRESHOLD), 9, budgets=(1, 16)) == python
        assert keyed_permute_and_flip(scores, 2.0, 80.0, gen, int(Domain.THRESHOLD), 9) == python


def test_the_holdouts_walk_ends_within_the_first_words() -> None:
    """Where the daemon spends its holdout ends (holdout 3 at B = 5,000: scores within a few noise scales), the walk
    nearly always ends within the compiled kernel's first two blocks."""
    scores, eps, _ = _PROFILES["fallback at holdout 3"]
    gaps, grid = grid_gaps(scores, eps, float(np.abs(scores).max()))
    rng = np.random.default_rng(3)
    read = []
    for _ in range(2000):
        bits = KeyBits(partial(KeyedGenerator(rng.bytes(32)).words, int(Domain.THRESHOLD), 4))
        flip_walk(gaps.tolist(), grid.shift, bits)
        read.append(bits.read)
    assert np.mean(np.array(read) <= 16) > 0.99 and np.mean(read) < 4

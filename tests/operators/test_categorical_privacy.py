"""Empirical eps-LDP check of every categorical randomizer (as tests/operators/test_local_privacy.py does for the
numeric ones): the outputs of two different categories, binned by a statistic that determines the likelihood ratio
(so the ratio on a bin is the ratio on each of its outputs); no bin's lower-confidence ratio may exceed e^eps, and the
largest point estimate comes close to e^eps (the check is not vacuous). A randomizer run at twice its budget is caught.

Statistics: GRR, the output itself (d = 4); OUE/SUE, the two bits of the two categories (the other bits have the same
law under both); OLH, whether the report equals the hash of each category; HM, whether the bit agrees with each
category's Hadamard entry; HR, whether the output lies in each category's set.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from operators.categorical import (
    fourier_g,
    fourier_hash,
    fourier_perturb,
    fourier_seeds,
    grr_perturb,
    hm_perturb,
    hr_layout,
    hr_perturb,
    olh_g,
    olh_hash,
    olh_perturb,
    olh_seeds,
    unary_perturb_many,
)
from operators.noise import KeyedGenerator
from tests.support import worst_ratio

N = 300_000
X0, X1 = 1, 2


def _grr(x, eps, gen, addr):
    return grr_perturb(np.full(N, x), 4, eps, gen.uniforms(5, addr, 0, 2 * N))


def _unary(kind):
    def run(x, eps, gen, addr):
        bits = unary_perturb_many(np.full(N, x), 3, eps, gen.uniforms(5, addr, 0, 3 * N), kind)
        return 2 * bits[:, X0] + bits[:, X1]
    return run


def _olh(x, eps, gen, addr):
    g = olh_g(eps)
    a, b = olh_seeds(gen.words(5, addr, 0, 4 * N))
    r = olh_perturb(np.full(N, x), g, eps, a, b, gen.uniforms(5, addr, 1 << 30, 2 * N))
    return 2 * (r == olh_hash(a, b, np.full(N, X0), g)) + (r == olh_hash(a, b, np.full(N, X1), g))


def _fourier(x, eps, gen, addr):
    g, k = fourier_g(eps, 50)
    a = fourier_seeds(gen.uniforms(5, addr, 0, k * N), g, k)
    r = fourier_perturb(np.full(N, x), g, eps, a, gen.uniforms(5, addr, 1 << 30, 2 * N))
    return 2 * (r == fourier_hash(a, np.full(N, X0), g)) + (r == fourier_hash(a, np.full(N, X1), g))


def _hm(x, eps, gen, addr):
    col, bit = hm_perturb(np.full(N, x), 7, eps, gen.uniforms(5, addr, 0, 2 * N))
    sign = [1 - 2 * (np.bitwise_count(((v + 1) & col).astype(np.uint64)) & 1).astype(np.int64) for v in (X0, X1)]
    return 2 * (bit == sign[0]) + (bit == sign[1])


def _hr(x, eps, gen, addr):
    d = 20
    b, _, _ = hr_layout(eps, d, 8)
    out = hr_perturb(np.full(N, x), d, eps, gen.uniforms(5, addr, 0, 2 * N), b)
    blk, col = np.divmod(out, b)

    def in_set(v):
        beta, row = divmod(v, b - 1)
        return (blk == beta) & ((np.bitwise_count((col & (row + 1)).astype(np.uint64)) & 1) == 0)

    return 2 * in_set(X0) + in_set(X1)


RANDOMIZERS = {"grr": _grr, "oue": _unary("oue"), "sue": _unary("sue"), "olh": _olh, "olh-fourier": _fourier,
               "hm": _hm, "hr": _hr}


@pytest.mark.slow
@pytest.mark.parametrize("eps", [0.5, 2.0])
@pytest.mark.parametrize("name", sorted(RANDOMIZERS))
def test_likelihood_ratio_of_two_categories_is_at_most_e_eps(name: str, eps: float) -> None:
    gen = KeyedGenerator(bytes([len(name)]) * 32)
    run = RANDOMIZERS[name]
    edges = np.arange(-0.5, 4.5)  # 4 statistics (GRR: 4 outputs)
    bound, point = worst_ratio(run(X0, eps, gen, 1), run(X1, eps, gen, 2), edges)
    assert bound <= math.exp(eps), (bound, math.exp(eps))
    assert point >= math.exp(eps) * 0.85


def test_the_check_catches_grr_at_twice_its_budget() -> None:
    gen = KeyedGenerator(bytes(32))
    eps = 1.0
    bound, _ = worst_ratio(_grr(X0, 2 * eps, gen, 1), _grr(X1, 2 * eps, gen, 2), np.arange(-0.5, 4.5))
    assert bound > math.exp(eps)

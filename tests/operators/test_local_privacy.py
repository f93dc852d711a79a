"""Empirical eps-LDP check of every randomizer: outputs for the two extreme readings (0 and theta, or 0 and B),
binned; no bin's likelihood ratio may exceed e^eps beyond sampling error.

For each bin the counts ``k0`` and ``k1`` out of ``N`` give a lower confidence bound for one probability and an upper
one for the other (Chernoff-Hoeffding in its relative-entropy form, ``P(p_hat <= k/N) <= exp(-N KL(k/N || p))``,
at ``delta = 1e-6`` each: valid at any N, a little wider than Clopper-Pearson). The check fails when
``lower(p0) / upper(p1) > e^eps`` (or the other way round) in any bin. A randomizer that spent twice its budget is
caught (the negative control below), and the largest point estimate comes close to e^eps (the check is not vacuous).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from operators.local import (
    hybrid_report,
    hybrid_scale,
    piecewise_report,
    piecewise_scale,
    square_wave_parameters,
    square_wave_report,
    stochastic_rounding_report,
    stochastic_rounding_scale,
)
from operators.noise import Domain, KeyedGenerator
from tests.support import chernoff_bounds, worst_ratio

N = 400_000
BINS = 40
THETA = 10.0


def _sr(v: np.ndarray, eps: float, gen: KeyedGenerator, addr: int) -> np.ndarray:
    return stochastic_rounding_report(v, THETA, eps, gen.uniforms(Domain.LOCAL, addr, 0, v.size))


def _pm(v: np.ndarray, eps: float, gen: KeyedGenerator, addr: int) -> np.ndarray:
    return piecewise_report(v, THETA, eps, gen.uniforms(Domain.LOCAL, addr, 0, v.size))


def _hm(v: np.ndarray, eps: float, gen: KeyedGenerator, addr: int) -> np.ndarray:
    u = gen.uniforms(Domain.LOCAL, addr, 0, 2 * v.size)
    return hybrid_report(v, THETA, eps, u[0::2], u[1::2])


def _sw(v: np.ndarray, eps: float, gen: KeyedGenerator, addr: int) -> np.ndarray:
    return square_wave_report(v, THETA, eps, gen.uniforms(Domain.LOCAL, addr, 0, v.size))


def _edges(name: str, eps: float) -> np.ndarray:
    if name == "sw":
        b = square_wave_parameters(eps)[0]
        lo, hi = -b * THETA, (1 + b) * THETA
    else:
        s = {"sr": stochastic_rounding_scale, "pm": piecewise_scale, "hm": hybrid_scale}[name](eps)
        lo, hi = THETA * (1 - s) / 2, THETA * (1 + s) / 2
    pad = 1e-9 * (hi - lo)
    return np.linspace(lo - pad, hi + pad, BINS + 1)


RANDOMIZERS: dict[str, Callable[[np.ndarray, float, KeyedGenerator, int], np.ndarray]] = {
    "sr": _sr,
    "pm": _pm,
    "hm": _hm,
    "sw": _sw,
}


@pytest.mark.slow
@pytest.mark.parametrize("eps", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("name", sorted(RANDOMIZERS))
def test_likelihood_ratio_of_extreme_inputs_is_at_most_e_eps(name: str, eps: float) -> None:
    gen = KeyedGenerator(bytes([len(name)]) * 32)
    perturb = RANDOMIZERS[name]
    low = perturb(np.zeros(N), eps, gen, 1)
    high = perturb(np.full(N, THETA), eps, gen, 2)
    bound, point = worst_ratio(low, high, _edges(name, eps))
    assert bound <= math.exp(eps), (bound, math.exp(eps))
    assert point >= math.exp(eps) * 0.85  # the mechanism uses its budget: a leak above e^eps would show


def test_the_check_catches_a_mechanism_that_spends_twice_its_budget() -> None:
    gen = KeyedGenerator(bytes(32))
    eps = 1.0
    # SR run at 2 eps but scored at eps (its outputs are +-s(2 eps): bin on that range)
    leaky_low = stochastic_rounding_report(np.zeros(N), THETA, 2 * eps, gen.uniforms(Domain.LOCAL, 1, 0, N))
    leaky_high = stochastic_rounding_report(np.full(N, THETA), THETA, 2 * eps, gen.uniforms(Domain.LOCAL, 2, 0, N))
    s = stochastic_rounding_scale(2 * eps)
    edges = np.linspace(THETA * (1 - s) / 2 - 1e-6, THETA * (1 + s) / 2 + 1e-6, 3)
    bound, _ = worst_ratio(leaky_low, leaky_high, edges)
    assert bound > math.exp(eps)


def test_chernoff_bounds_bracket_the_estimate() -> None:
    lo, up = chernoff_bounds(500, 10_000)
    assert lo < 0.05 < up
    assert 0.038 < lo and up < 0.063  # about 4.9-5.5 standard errors each side at delta = 1e-6
    assert chernoff_bounds(0, 1000)[0] == 0.0

"""Audit of the discrete Laplace noise (KeyedGenerator) and of a mechanism built on it (flat Laplace).

Neighbours differ by the sensitivity; the events "output >= t" for t fixed in advance. For the discrete Laplace with
``a = e^(-eps)`` the ratio ``P(X + 1 >= t) / P(X >= t)`` is exactly ``e^eps`` for every ``t >= 1``, so a correct
generator gives a lower bound close to (and below) eps, and one with half the noise scale is flagged.
"""

from __future__ import annotations

import numpy as np
import pytest

from operators.baselines import Flat, baseline_domain
from operators.config import ToPSConfig
from operators.noise import DiscreteLaplace, KeyedGenerator
from tests.audit._audit import audit_key, eps_lower_bound, event_hits

EPS = 1.0
N = 200_000
THRESHOLDS = np.array([1, 2, 3])


def _shifted_noise(shift: int, *, eps_noise: float, label: str) -> np.ndarray:
    gen = KeyedGenerator(audit_key(label, 0))
    noise = DiscreteLaplace(epsilon=eps_noise, sensitivity=1)
    return shift + gen.discrete_laplace(baseline_domain("audit", 0), 0, 0, N, noise)


def test_discrete_laplace_lower_bound_below_eps_and_close_to_it() -> None:
    """eps_lb <= eps at confidence 1 - 1e-3, and >= 0.85 eps (the events are the extremal ones, so it is tight)."""
    x0 = _shifted_noise(0, eps_noise=EPS, label="dl-0")
    x1 = _shifted_noise(1, eps_noise=EPS, label="dl-1")
    lb = eps_lower_bound(event_hits(x0, THRESHOLDS), event_hits(x1, THRESHOLDS), N, N)
    assert lb <= EPS
    assert lb >= 0.85 * EPS


def test_audit_flags_half_the_noise_scale() -> None:
    """The same audit on a generator with half the noise scale (true eps = 2) must exceed the claimed eps = 1."""
    x0 = _shifted_noise(0, eps_noise=2 * EPS, label="broken-0")
    x1 = _shifted_noise(1, eps_noise=2 * EPS, label="broken-1")
    lb = eps_lower_bound(event_hits(x0, THRESHOLDS), event_hits(x1, THRESHOLDS), N, N)
    assert lb > EPS


@pytest.mark.parametrize("theta", [1, 3])
def test_flat_operator_on_neighbouring_ticks(theta: int) -> None:
    """Flat Laplace on ticks at 0 vs theta (every tick an independent sample): eps_lb <= eps and near it."""
    cfg = ToPSConfig(epsilon=EPS, bound=10, theta=theta)
    r0 = Flat(cfg, audit_key("flat-0", theta)).process(np.zeros(N))
    r1 = Flat(cfg, audit_key("flat-1", theta)).process(np.full(N, float(theta)))
    t = theta + np.array([0, 2, 5])
    lb = eps_lower_bound(event_hits(r0, t), event_hits(r1, t), N, N)
    assert 0.75 * EPS <= lb <= EPS

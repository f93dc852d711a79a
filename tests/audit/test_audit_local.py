"""Audit of the local randomizers of ToPL (SR, PM, HM, SW; operators/local): readings 0 vs theta (the extremes).

Each report is an independent sample (its own uniforms). Events fixed in advance: the report lies on the side of
the high reading (SR: above theta/2; PM and HM: at least theta; SW: at least (1 - b) B, the start of the
high-probability window of the reading B). For each mechanism that event's likelihood ratio is exactly ``e^eps``,
so a correct randomizer gives eps_lb close to and below eps.
"""

from __future__ import annotations

import numpy as np
import pytest

from operators.baselines import baseline_domain
from operators.noise import KeyedGenerator
from tests.audit._audit import audit_key, eps_lower_bound, event_hits

local = pytest.importorskip("operators.local")

N = 200_000
THETA = 10.0


def _u(label: str, k: int = 0) -> np.ndarray:
    return KeyedGenerator(audit_key(label, k)).uniforms(baseline_domain("audit", 2), 0, 0, N)


def _reports(mech: str, reading: float, eps: float, label: str) -> np.ndarray:
    x = np.full(N, reading)
    if mech == "sr":
        return local.stochastic_rounding_report(x, THETA, eps, _u(label))
    if mech == "pm":
        return local.piecewise_report(x, THETA, eps, _u(label))
    if mech == "hm":
        return local.hybrid_report(x, THETA, eps, _u(label, 1), _u(label, 2))
    return local.square_wave_report(x, THETA, eps, _u(label))


def _events(mech: str, eps: float) -> np.ndarray:
    if mech == "sr":
        return np.array([THETA / 2])
    if mech in ("pm", "hm"):
        return np.array([THETA, THETA * 1.2])
    b = local.square_wave_parameters(eps)[0]
    return np.array([(1 - b) * THETA, THETA])


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("mech", ["sr", "pm", "hm", "sw"])
def test_local_randomizer_audit(mech: str, eps: float) -> None:
    t = _events(mech, eps)
    lo = _reports(mech, 0.0, eps, f"{mech}-lo-{eps}")
    hi = _reports(mech, THETA, eps, f"{mech}-hi-{eps}")
    lb = eps_lower_bound(event_hits(lo, t), event_hits(hi, t), N, N)
    assert lb <= eps
    assert lb >= 0.8 * eps


def test_local_audit_flags_a_randomizer_run_at_twice_its_eps() -> None:
    """SR reports made at 2 eps while eps is claimed (the noise of a 'halved scale' bug) are flagged."""
    eps = 1.0
    lo = _reports("sr", 0.0, 2 * eps, "sr-broken-lo")
    hi = _reports("sr", THETA, 2 * eps, "sr-broken-hi")
    t = _events("sr", eps)
    assert eps_lower_bound(event_hits(lo, t), event_hits(hi, t), N, N) > eps

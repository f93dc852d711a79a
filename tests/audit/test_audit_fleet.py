"""Audit of the fleet holdout (operators/fleet_holdout.py) on neighbouring fleets.

**Neighbours.** Four streams of one template send 25 readings each, interleaved, into a fleet holdout of m = 100
readings. Fleet D0 holds 98 zeros and two 2s (streams 0 and 1); fleet D1 is D0 with one reading of stream 2 moved
from 0 to 2: one event of one stream. The choice is Eq. 6 by permute-and-flip (``selection = "paper"``, B = 2,
candidates theta = 1, 2, r = 4, b = 2, eps = 1), as in test_audit_threshold.py: the event "theta = 2" is the
extremal one, its probabilities on D0 and D1 differ by exactly ``e^eps_choice``, where ``eps_choice`` is the
choice's share of the threshold budget (``operators.error_stats.budgets``; ``threshold_epsilon = 0.25`` keeps the
event frequent). The fleet's choice must be ``eps_choice``-DP whichever stream sent the reading that moved.

**Broken variant.** A fleet fed every reading three times (a reading replayed to the holdout by three intake paths):
the choice then moves three times as far for one event, and the audit must flag it (``eps_lb > eps_choice`` at
confidence ``1 - 1e-3``).
"""

from __future__ import annotations

import numpy as np
import pytest

from operators import ToPSConfig
from operators.error_stats import budgets
from operators.fleet_holdout import FleetHoldout
from tests.audit._audit import audit_key, eps_lower_bound

CFG = ToPSConfig(epsilon=1.0, threshold_epsilon=0.25, bound=2, holdout=100, query_range=4, fanout=2,
                 selection="paper", holdout_scope="fleet")
EPS_CHOICE = budgets(0.25)[0]
STREAMS, EACH = 4, 25
SAMPLES = 6000


def _fleet_readings(moved: bool) -> np.ndarray:
    """The readings in their order of arrival: round k brings reading k of every stream."""
    per_stream = np.zeros((STREAMS, EACH))
    per_stream[0, 3] = per_stream[1, 11] = 2.0
    if moved:
        per_stream[2, 7] = 2.0
    return per_stream.T.reshape(-1)


class ReplayedThreeTimes(FleetHoldout):
    """Broken: every reading reaches the holdout three times."""

    def take(self, values):  # type: ignore[no-untyped-def]
        v = np.repeat(np.asarray(values, dtype=np.float64), 3)
        return super().take(v) // 3


def _thetas(fleet_type: type[FleetHoldout], moved: bool, label: str) -> np.ndarray:
    x = _fleet_readings(moved)
    out = np.empty(SAMPLES, dtype=np.int64)
    for i in range(SAMPLES):
        fleet = fleet_type(CFG, audit_key(label, i))
        for k in range(EACH):  # as a daemon hands them over: one round of the streams at a time
            fleet.take(x[k * STREAMS:(k + 1) * STREAMS])
        assert fleet.choice is not None
        out[i] = fleet.choice.theta_units
    return out


@pytest.mark.parametrize(("fleet_type", "flagged"), [(FleetHoldout, False), (ReplayedThreeTimes, True)],
                         ids=["fleet", "replayed-three-times"])
def test_the_fleet_choice_on_neighbouring_fleets(fleet_type: type[FleetHoldout], flagged: bool) -> None:
    name = fleet_type.__name__
    d0 = _thetas(fleet_type, moved=False, label=f"fleet-d0-{name}")
    d1 = _thetas(fleet_type, moved=True, label=f"fleet-d1-{name}")
    hits0, hits1 = np.array([(d0 == 2).sum()]), np.array([(d1 == 2).sum()])
    assert 0 < hits0[0] < hits1[0]  # the event is met on both sides
    eps_lb = eps_lower_bound(hits0, hits1, SAMPLES, SAMPLES)
    assert (eps_lb > EPS_CHOICE) is flagged, (eps_lb, EPS_CHOICE, hits0, hits1)

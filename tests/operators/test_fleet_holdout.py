"""The fleet holdout (operators/fleet_holdout.py): its choice is the one a stream's own holdout of the same readings
makes, every stream of the template releases with it from its next reading, and each reading is used once."""

from __future__ import annotations

import numpy as np
import pytest

from operators import ToPS, ToPSConfig
from operators.fleet_holdout import FleetChoice, FleetHoldout, FleetMember

CFG = ToPSConfig(epsilon=1.0, bound=200, holdout=300, query_range=1 << 10, fanout=4)
FLEET_KEY = bytes(range(32))


def _key(i: int) -> bytes:
    return bytes([i + 1]) * 32


def _readings(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).gamma(2.0, 20.0, n).round()


@pytest.mark.parametrize("cfg", [CFG, CFG.replace(selection="paper"), CFG.replace(holdout_grid="compact"),
                                 CFG.replace(holdout=12)], ids=["calibrated", "paper", "compact", "short"])
def test_the_choice_is_a_stream_holdouts_choice_of_the_same_readings(cfg: ToPSConfig) -> None:
    """Fed in pieces of any size, the fleet makes the very choice (theta, s, start, error statistics) that one ToPS
    stream under the fleet's key makes of the same readings in the same order."""
    x = _readings(cfg.holdout + 50)
    own = ToPS(cfg, FLEET_KEY)
    own.process(x)
    fleet = FleetHoldout(cfg, FLEET_KEY)
    taken = sum(fleet.take(piece) for piece in np.array_split(x, 7))
    assert taken == cfg.holdout and fleet.holdout_left == 0 and fleet.take(x[:5]) == 0
    assert fleet.choice is not None
    member = fleet.member(_key(0))
    assert (member.theta_units, member.smoother_layers) == (own.theta_units, own.smoother_layers)
    assert member.start_units == own.start_units
    assert fleet.choice.error_stats == own.error_stats


def test_a_member_releases_as_a_stream_started_with_the_choice_and_is_its_own_noise() -> None:
    fleet = FleetHoldout(CFG, FLEET_KEY)
    fleet.take(_readings(CFG.holdout))
    x = _readings(400, seed=1)
    a, b = fleet.member(_key(0)), fleet.member(_key(1))
    ra, rb = a.process(x), b.process(x)
    assert np.isfinite(ra).all() and np.isfinite(rb).all()  # every reading of a stream is released
    assert a.theta_units == fleet.choice.theta_units and a.error_stats == fleet.choice.error_stats
    assert not np.array_equal(ra, rb)  # streams' keys draw their own noise
    again = fleet.member(_key(0))
    assert np.array_equal(again.process(x), ra)  # same key, same readings: same releases


def test_members_feed_the_fleet_in_arrival_order_then_release_from_their_next_reading() -> None:
    """Three streams before the choice: their readings fill the fleet holdout in the order they arrive (the stream
    that sent the last one is no different); each stream's later readings are all released, through its own ToPS."""
    fleet = FleetHoldout(CFG, FLEET_KEY)
    members = [FleetMember(fleet, _key(i)) for i in range(3)]
    x = _readings(CFG.holdout + 30, seed=2)
    for i, v in enumerate(x[: CFG.holdout]):
        m = members[i % 3]
        assert m.takes_reports and m.phase == "holdout"
        assert m.observe_threshold(np.array([v])) == 1
    assert fleet.choice is not None and not any(m.takes_reports for m in members)
    assert all(m.phase == "holdout" for m in members)  # until its next reading
    out = members[1].process(x[CFG.holdout:])
    assert np.isfinite(out).all() and members[1].phase == "releasing"
    assert isinstance(members[1].successor, ToPS) and members[1].successor.theta == members[1].theta
    expected = fleet.member(_key(1)).process(x[CFG.holdout:])
    assert np.array_equal(out, expected)
    own = ToPS(CFG, FLEET_KEY)
    own.process(x[: CFG.holdout])
    assert fleet.choice.theta_units == own.theta_units


def test_a_member_in_the_holdout_gives_each_reading_once() -> None:
    """A batch that crosses the end of the fleet holdout: the readings the holdout took are NaN (never released), the
    rest released; nothing is both held and released, nothing is dropped."""
    fleet = FleetHoldout(CFG, FLEET_KEY)
    fleet.take(_readings(CFG.holdout - 5))
    m = FleetMember(fleet, _key(4))
    out = m.process(_readings(20, seed=3))
    assert np.isnan(out[:5]).all() and np.isfinite(out[5:]).all()
    assert fleet.taken == CFG.holdout


def test_a_snapshot_mid_holdout_continues_to_the_same_choice() -> None:
    x = _readings(CFG.holdout)
    whole = FleetHoldout(CFG, FLEET_KEY)
    whole.take(x)
    half = FleetHoldout(CFG, FLEET_KEY)
    half.take(x[:100])
    resumed = FleetHoldout.restore(CFG, FLEET_KEY, half.snapshot())
    assert resumed.holdout_left == CFG.holdout - 100
    resumed.take(x[100:])
    assert resumed.choice == whole.choice
    chosen = FleetHoldout.restore(CFG, FLEET_KEY, whole.snapshot())
    assert chosen.choice == whole.choice and chosen.holdout_left == 0


_CHOICE = {"theta_units": 3, "smoother_layers": 1, "start_units": 1.0, "fallback": False, "error_stats": [1.0]}


@pytest.mark.parametrize("bad", [
    {"version": 9}, "x", {"version": 1, "generation": 2, "choice": None},
    {"version": 1, "generation": 1, "choice": {**_CHOICE, "theta_units": 0}},
    {"version": 1, "generation": 1, "choice": {**_CHOICE, "error_stats": [float("nan")]}},
], ids=["version", "not-a-dict", "generation", "theta-0", "nan-stats"])
def test_a_hostile_snapshot_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        FleetHoldout.restore(CFG, FLEET_KEY, bad)  # type: ignore[arg-type]


def test_a_public_theta_has_no_fleet_holdout() -> None:
    with pytest.raises(ValueError, match="must not fix"):
        FleetHoldout(CFG.replace(holdout=0, theta=10.0), FLEET_KEY)
    with pytest.raises(Exception, match="holdout_scope"):
        CFG.replace(holdout=0, theta=10.0, holdout_scope="fleet")
    with pytest.raises(Exception, match="holdout_scope"):
        CFG.replace(holdout_scope="fleets")
    assert "holdout_scope" not in CFG.to_dict() and CFG.replace(holdout_scope="fleet").to_dict()["holdout_scope"]


def test_the_choice_round_trips_through_json() -> None:
    fleet = FleetHoldout(CFG, FLEET_KEY)
    fleet.take(_readings(CFG.holdout))
    assert FleetChoice.from_dict(fleet.choice.to_dict()) == fleet.choice

"""ToPL as one operator (Wang et al., CCS 2021, Section 4): configuration, the DNS stream, determinism, snapshot and
restore."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from operators.config import ConfigError
from operators.local import (
    hybrid_report,
    hybrid_worst_case_variance,
    square_wave_histogram,
    square_wave_perturb,
    square_wave_report,
)
from operators.noise import Domain, KeyedGenerator
from operators.topl import LOCAL_ADDRESS_HYBRID, LOCAL_ADDRESS_SQUARE_WAVE, ToPL, ToPLConfig, choose_threshold
from stream.commands import datasets

KEY = bytes(range(32))


@pytest.fixture(scope="module")
def dns() -> np.ndarray:
    return datasets.load("dns").astype(np.float64)


def test_config_defaults_and_derived_values() -> None:
    cfg = ToPLConfig(epsilon=1.0, bound=500.0)
    assert (cfg.holdout, cfg.query_range, cfg.buckets, cfg.threshold_budget) == (65536, 1 << 20, 1024, 1.0)
    assert cfg.density_buckets == 500  # integer readings below 1024: one bucket per possible value
    assert ToPLConfig(epsilon=1.0, bound=5000.0).density_buckets == 1024
    assert ToPLConfig(epsilon=1.0, bound=5.0, resolution=None).density_buckets == 1024
    assert ToPLConfig(epsilon=1.0, bound=5.0, threshold_epsilon=0.5).threshold_budget == 0.5
    assert ToPLConfig(epsilon=1.0, bound=5.0, theta=2.0).holdout_ticks == 0
    assert json.loads(json.dumps(cfg.to_dict()))["bound"] == 500.0
    assert cfg.replace(epsilon=2.0).epsilon == 2.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"epsilon": 0}, "epsilon must be a positive number (got 0)"),
        ({"epsilon": float("nan")}, "epsilon must be a positive number"),
        ({"bound": -1}, "bound must be a positive number"),
        ({"threshold_epsilon": 0.0}, "threshold_epsilon must be a positive number"),
        ({"holdout": 0}, "holdout must be an integer >= 1 unless theta is given"),
        ({"holdout": 1.5}, "holdout must be an integer >= 1 unless theta is given (got 1.5)"),
        ({"buckets": 1}, "buckets must be an integer >= 2"),
        ({"query_range": 0}, "query_range must be an integer >= 1"),
        ({"theta": 600.0}, "theta must be at most bound"),
        ({"resolution": 400.0}, "bound must be at least two resolution steps"),
        ({"prune": "yes"}, "prune must be true or false"),
    ],
)
def test_config_errors_are_one_line(changes: dict, message: str) -> None:
    args = {"epsilon": 1.0, "bound": 500.0, **changes}
    with pytest.raises(ConfigError) as info:
        ToPLConfig(**args)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow
def test_dns_stream_theta_and_unbiased_releases(dns: np.ndarray) -> None:
    """B = 500 as the reference code uses for this stream; eps = 1 for both phases."""
    cfg = ToPLConfig(epsilon=1.0, bound=500.0)
    topl = ToPL(cfg, KEY)
    out = topl.process(dns)
    m = cfg.holdout
    assert out.shape == dns.shape and np.isnan(out[:m]).all() and np.isfinite(out[m:]).all()
    assert topl.phase == "releasing" and topl.ticks == dns.size and topl.holdout_left == 0
    # theta is reasonable: above the 90th percentile of the holdout, far below B, cuts at most 1 % of the ticks
    assert np.quantile(dns[:m], 0.9) <= topl.theta <= 60.0
    assert np.mean(dns[m:] > topl.theta) <= 0.01
    # releases are unbiased for the truncated stream: the mean, and the sums of 16 blocks of 2^14 ticks, within
    # 4.5 standard deviations (Var per tick <= theta^2 / 4 x Eq. 22)
    truncated = np.minimum(dns[m:], topl.theta)
    sd_tick = topl.theta / 2 * math.sqrt(hybrid_worst_case_variance(1.0))
    n = truncated.size
    assert abs(out[m:].mean() - truncated.mean()) <= 4.5 * sd_tick / math.sqrt(n)
    block = 1 << 14
    for i in range(16):
        seg = slice(m + i * block, m + (i + 1) * block)
        assert abs(out[seg].sum() - np.minimum(dns[seg], topl.theta).sum()) <= 4.5 * sd_tick * math.sqrt(block)
    # the empirical spread matches the per-tick variance (Eq. 22 is input-free at eps = 1 > 0.61)
    assert np.var(out[m:] - truncated) == pytest.approx(sd_tick**2, rel=0.03)


def test_simulated_devices_use_the_documented_addresses() -> None:
    cfg = ToPLConfig(epsilon=1.0, bound=100.0, holdout=1000, buckets=64, refine=False)
    values = np.arange(1500) % 50.0
    out = ToPL(cfg, KEY).process(values)
    gen = KeyedGenerator(KEY)
    b = ToPL(cfg, KEY)._sw_b
    y = square_wave_perturb(values[:1000] / 100.0, 1.0, gen.uniforms(Domain.LOCAL, LOCAL_ADDRESS_SQUARE_WAVE, 0, 1000))
    probe = ToPL(cfg, KEY)
    probe.process(values[:1000])
    np.testing.assert_array_equal(probe._rounds.counts, square_wave_histogram(y, b, 64))
    u = gen.uniforms(Domain.LOCAL, LOCAL_ADDRESS_HYBRID, 2000, 1000)
    np.testing.assert_array_equal(out[1000:], hybrid_report(values[1000:], probe.theta, 1.0, u[0::2], u[1::2]))


@pytest.mark.slow
def test_chunking_does_not_change_anything(dns: np.ndarray) -> None:
    cfg = ToPLConfig(epsilon=0.8, bound=64.0, holdout=20_000)
    x = dns[:60_000]
    whole = ToPL(cfg, KEY).process(x)
    topl = ToPL(cfg, KEY)
    cuts = [0, 7, 19_999, 20_001, 33_333, 60_000]
    parts = [topl.process(x[a:b]) for a, b in itertools.pairwise(cuts)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_snapshot_restore_continues_exactly(dns: np.ndarray) -> None:
    cfg = ToPLConfig(epsilon=1.0, bound=64.0, holdout=10_000)
    x = dns[:30_000]
    whole = ToPL(cfg, KEY).process(x)
    for cut in (4_000, 10_000, 17_000):
        first = ToPL(cfg, KEY)
        head = first.process(x[:cut])
        snap = json.loads(json.dumps(first.snapshot()))  # JSON round trip, as the state store does
        assert "key" not in json.dumps(snap)
        second = ToPL.restore(cfg, KEY, snap)
        tail = second.process(x[cut:])
        np.testing.assert_array_equal(np.concatenate([head, tail]), whole)
        assert second.theta is not None and second.ticks == x.size


def test_restore_rejects_a_foreign_snapshot() -> None:
    cfg = ToPLConfig(epsilon=1.0, bound=64.0, holdout=100, buckets=32)
    snap = ToPL(cfg, KEY).snapshot()
    with pytest.raises(ValueError, match="holdout rounds"):
        ToPL.restore(cfg.replace(buckets=64), KEY, snap)
    with pytest.raises(ValueError, match="ToPL snapshot"):
        ToPL.restore(cfg, KEY, {**snap, "operator": "tops"})
    with pytest.raises(ValueError, match="ticks"):
        ToPL.restore(cfg, KEY, {**snap, "ticks": 500})  # past the holdout without a theta


def test_fixed_theta_releases_from_the_first_tick_and_clamps() -> None:
    cfg = ToPLConfig(epsilon=2.0, bound=10.0, theta=4.0)
    topl = ToPL(cfg, KEY)
    out = topl.process(np.array([0.0, 3.0, 12.0, 9.0]))
    assert np.isfinite(out).all() and topl.clamped == 1 and topl.phase == "releasing"
    assert topl.privacy == {
        "model": "local",
        "unit": "one reading (one tick of one device)",
        "epsilon_holdout": None,
        "epsilon_release": 2.0,
    }


def test_negative_values_are_clamped_to_zero_not_dropped() -> None:
    """Like the device: a negative reading makes its tick, as 0 (a missing tick would reveal it)."""
    a = ToPL(ToPLConfig(epsilon=1.0, bound=10.0, holdout=4), KEY)
    b = ToPL(ToPLConfig(epsilon=1.0, bound=10.0, holdout=4), KEY)
    x = np.array([1.0, -0.5, 3.0, -2.0, 5.0, -1.0, 2.0])
    assert np.array_equal(a.process(x), b.process(np.maximum(x, 0.0)), equal_nan=True)
    assert a.ticks == x.size and a.clamped == 3


@pytest.mark.parametrize("bad", [[1.0, float("-inf")], [float("nan")], [float("inf")], [[1.0]]])
def test_bad_values_are_rejected_without_echo(bad) -> None:
    topl = ToPL(ToPLConfig(epsilon=1.0, bound=10.0, holdout=4), KEY)
    with pytest.raises(ValueError) as info:
        topl.process(np.array(bad))
    assert "0.5" not in str(info.value)
    assert topl.ticks == 0


def test_key_is_required_and_not_printed() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        ToPL(ToPLConfig(epsilon=1.0, bound=10.0), b"short")
    assert KEY.hex() not in repr(ToPL(ToPLConfig(epsilon=1.0, bound=10.0), KEY))


def test_the_daemon_path_picks_the_same_theta_as_replay(dns: np.ndarray) -> None:
    """choose_threshold on the SW reports (reading units, as devices publish them) = ToPL's theta, in one round
    (tests/operators/test_local_refine.py checks the server half against replay when the holdout zooms in)."""
    cfg = ToPLConfig(epsilon=1.0, bound=500.0, holdout=30_000, refine=False)
    topl = ToPL(cfg, KEY)
    topl.process(dns[:30_000])
    u = KeyedGenerator(KEY).uniforms(Domain.LOCAL, LOCAL_ADDRESS_SQUARE_WAVE, 0, 30_000)
    reports = square_wave_report(dns[:30_000], 500.0, 1.0, u)
    assert choose_threshold(cfg, reports=reports).theta == topl.theta

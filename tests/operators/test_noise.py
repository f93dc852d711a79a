"""The exact discrete Laplace sampler: pmf, addressability, determinism, overflow path.

Statistical tests use fixed keys (so they are deterministic) and state their tolerance: a chi-square goodness of
fit against the closed form ``P(X = k) = (1 - a) / (1 + a) a^|k|`` must not reject at level 1e-4, and the same
test must reject a 3% wrong scale (its power check), so it is not vacuous.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from operators.noise import DiscreteLaplace, Domain, KeyedGenerator

KEY = bytes(range(32))
N = 120_000


def _cdf(k: np.ndarray, x: float) -> np.ndarray:
    """P(X <= k) of the discrete Laplace with a = exp(-x), k integer (float array)."""
    a = math.exp(-x)
    k = np.asarray(k, dtype=np.float64)
    neg = np.exp(x * np.minimum(k, 0.0)) / (1.0 + a)  # a^(-k) / (1 + a) for k < 0
    pos = 1.0 - np.exp(-x * (np.maximum(k, 0.0) + 1.0)) / (1.0 + a)  # 1 - a^(k+1) / (1 + a) for k >= 0
    return np.where(k < 0, neg, pos)


def _chi2_pvalue(samples: np.ndarray, x: float, bins: int = 40) -> float:
    """Chi-square p-value of ``samples`` against the discrete Laplace exp(-x), on bins of about equal mass."""
    lo, hi = np.quantile(samples, [0.002, 0.998])
    inner = np.unique(np.linspace(lo, hi, bins).round().astype(np.int64))
    cdf = np.concatenate([[0.0], _cdf(inner, x), [1.0]])
    expected = np.diff(cdf) * samples.size
    observed = np.histogram(samples, bins=np.concatenate([[-np.inf], inner + 0.5, [np.inf]]))[0]
    keep = expected > 5
    obs, exp = observed[keep], expected[keep]
    exp = exp * obs.sum() / exp.sum()
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.mark.parametrize(("epsilon", "sensitivity"), [(1.0, 1000), (0.05, 38), (1.0, 3), (1.0, 1), (1.0, 0.3)])
def test_pmf_matches_the_closed_form(epsilon: float, sensitivity: float) -> None:
    """Scale 20,000 and 1,000 (a close to 1), 3, 1 and 0.3 (mostly zeros, the sign-rejection path): the chi-square
    does not reject at 1e-4; P(X = 0) = (1 - a)/(1 + a) within 4 standard errors."""
    dl = DiscreteLaplace(epsilon=epsilon, sensitivity=sensitivity)
    x = dl.s / 2**dl.log2_t
    samples = KeyedGenerator(KEY).discrete_laplace(int(Domain.BASELINE), 7, 0, N, dl)
    assert samples.dtype == np.int64
    assert _chi2_pvalue(samples, x) > 1e-4
    p0 = float(dl.pmf(0))
    assert abs(np.mean(samples == 0) - p0) < 4 * math.sqrt(p0 * (1 - p0) / N)
    assert samples.var() == pytest.approx(dl.variance, rel=0.05)


@pytest.mark.parametrize(("epsilon", "sensitivity"), [(1.0, 1000), (1.0, 0.3)])
def test_chi_square_sees_a_three_percent_wrong_scale(epsilon: float, sensitivity: float) -> None:
    """Power check: the same samples against a scale 3% off are rejected (so the test above can fail)."""
    dl = DiscreteLaplace(epsilon=epsilon, sensitivity=sensitivity)
    samples = KeyedGenerator(KEY).discrete_laplace(int(Domain.BASELINE), 7, 0, N, dl)
    assert _chi2_pvalue(samples, dl.s / 2**dl.log2_t * 1.03) < 1e-4


def test_overflow_path_is_exact() -> None:
    """With a budget of one 64-bit word per sample almost every sample continues on its overflow keystream; the
    pmf is still the closed form (chi-square at 1e-4), and sub-ranges still give the same samples."""
    dl = DiscreteLaplace(epsilon=1.0, sensitivity=50)
    gen = KeyedGenerator(KEY)
    samples = gen.discrete_laplace(int(Domain.BASELINE), 3, 0, 40_000, dl, _budget=1)
    assert _chi2_pvalue(samples, dl.s / 2**dl.log2_t) > 1e-4
    assert np.array_equal(samples[1234:1300], gen.discrete_laplace(int(Domain.BASELINE), 3, 1234, 66, dl, _budget=1))
    # the overflow continues the main words: the samples that fit in one word are those of the full budget
    full = gen.discrete_laplace(int(Domain.BASELINE), 3, 0, 40_000, dl)
    assert 0 < np.mean(samples == full) < 1


def test_addressable_over_random_splits() -> None:
    """Sample i depends only on (key, domain, address, i): random start/count splits give the same bits."""
    dl = DiscreteLaplace(epsilon=0.3, sensitivity=20)
    gen = KeyedGenerator(KEY)
    whole = gen.discrete_laplace(int(Domain.HIERARCHY) << 16, 5, 0, 20_000, dl)
    rng = np.random.default_rng(8)
    cuts = np.sort(rng.choice(np.arange(1, 20_000), size=60, replace=False))
    parts = [
        gen.discrete_laplace(int(Domain.HIERARCHY) << 16, 5, int(a), int(b - a), dl)
        for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [20_000]]), strict=True)
    ]
    assert np.array_equal(np.concatenate(parts), whole)
    for _ in range(20):
        s = int(rng.integers(0, 19_000))
        c = int(rng.integers(1, 1000))
        assert np.array_equal(gen.discrete_laplace(int(Domain.HIERARCHY) << 16, 5, s, c, dl), whole[s : s + c])


def test_deterministic_and_pinned() -> None:
    """Same key and address, same samples (restarts and replays reproduce releases); the values are pinned so a
    change of the keystream layout cannot pass unnoticed."""
    dl = DiscreteLaplace(epsilon=1.0, sensitivity=10)
    gen = KeyedGenerator(bytes(32))
    x = gen.discrete_laplace(1, 0, 0, 10, dl)
    assert np.array_equal(x, KeyedGenerator(bytes(32)).discrete_laplace(1, 0, 0, 10, dl))
    assert x.tolist() == PINNED


PINNED = [13, -9, -7, -1, -10, 1, -4, 11, -4, -6]  # key 0^32, domain 1, address 0, scale 10


def test_keys_domains_and_addresses_differ() -> None:
    dl = DiscreteLaplace(epsilon=1.0, sensitivity=10)
    base = KeyedGenerator(KEY).discrete_laplace(1, 0, 0, 1000, dl)
    others = [
        KeyedGenerator(bytes(32)).discrete_laplace(1, 0, 0, 1000, dl),
        KeyedGenerator(KEY).discrete_laplace(2, 0, 0, 1000, dl),
        KeyedGenerator(KEY).discrete_laplace(1, 1, 0, 1000, dl),
    ]
    for o in others:
        assert np.mean(o == base) < 0.2  # P(two independent draws agree) is about 0.05 at this scale


@pytest.mark.parametrize("seed", range(5))
def test_effective_epsilon_is_at_most_the_configured_one(seed: int) -> None:
    """The scale is rounded up (more noise, never less): eps (1 - 2^-20) <= effective eps <= eps, exactly."""
    rng = np.random.default_rng(seed)
    for _ in range(200):
        eps = float(10 ** rng.uniform(-4, 1.5))
        sens = float(rng.integers(1, 1 << 24)) if rng.random() < 0.5 else float(10 ** rng.uniform(-2, 6))
        if not 2**-10 <= sens / eps <= 2**36:
            continue
        dl = DiscreteLaplace(epsilon=eps, sensitivity=sens)
        exact = Fraction(sens) * dl.s / 2**dl.log2_t
        assert exact <= Fraction(eps)
        assert exact >= Fraction(eps) * (1 - Fraction(1, 2**20))
        assert dl.effective_epsilon <= eps


def test_parameters_out_of_range_are_refused() -> None:
    for eps, sens in [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (math.nan, 1.0), (1.0, math.inf), (1e-12, 1e3), (2e4, 1.0)]:
        with pytest.raises(ValueError, match=r"epsilon|scale"):
            DiscreteLaplace(epsilon=eps, sensitivity=sens)
    with pytest.raises(TypeError, match="DiscreteLaplace"):
        KeyedGenerator(KEY).discrete_laplace(1, 0, 0, 3, 0.5)  # the old float parameter is not accepted


_BOTH = """
import sys, numpy as np
from operators.noise import KeyedGenerator, DiscreteLaplace
g = KeyedGenerator(bytes(range(32)))
out = []
for eps, sens in [(0.5, 1), (1 / 3, 3), (0.1, 20), (40.0, 1), (1e-3, 1e6)]:
    dl = DiscreteLaplace(eps, sens)
    out.append(g.discrete_laplace(7, 3, 0, 4000, dl))
    out.append(np.concatenate([g.discrete_laplace(7, 5, i * 8, 8, dl) for i in range(50)]))
    out.append(g.discrete_laplace(7, 9, 0, 500, dl, _budget=1))  # the overflow path
# a scale whose samples now and then need more than their 512 bits: their own overflow keystream, in either path
out.append(g.discrete_laplace(7, 11, 2**31, 3000, DiscreteLaplace(1e-3, 6.8e7)))
np.save(sys.argv[1], np.concatenate(out))
from operators import noise
print("compiled run" if noise._kernel_state["run"] is not None else "numpy", file=sys.stderr)
"""


def test_compiled_and_numpy_samplers_draw_the_same_samples(tmp_path) -> None:
    """The compiled kernels (loaded once a process draws often; a draw of up to 4,096 samples is then one compiled
    call, keystream and sampler) and the numpy version read the same bits in the same order: the same samples, bit
    for bit, in every regime (small and large scales, the slow geometric, overflow)."""
    import subprocess
    import sys

    runs = {}
    for kind in ("numpy", "numba"):
        out = tmp_path / f"{kind}.npy"
        r = subprocess.run([sys.executable, "-c", _BOTH, str(out)], env={**os.environ, "TOPS_NOISE_KERNEL": kind},
                           capture_output=True, text=True, timeout=300, check=False)
        assert r.returncode == 0, r.stderr
        assert r.stderr.strip().endswith("compiled run" if kind == "numba" else "numpy")
        runs[kind] = np.load(out)
    assert runs["numpy"].size > 20_000 and np.array_equal(runs["numpy"], runs["numba"])


def test_one_compiled_draw_is_the_general_paths_sample() -> None:
    """``discrete_laplace_one`` (one compiled call: the sample's ChaCha20 block and the sampler, used by the holdout's
    choice) gives sample ``index`` of ``discrete_laplace``, bit for bit, in every regime; a sample that needs more
    than its 512 bits goes on through the general path's overflow keystream."""
    from operators import noise

    noise._kernel(1 << 16)  # load the compiled kernels, as a process that draws often does
    assert noise.compiled_loaded()
    rng = np.random.default_rng(11)
    g = KeyedGenerator(bytes(range(32)))
    seen = 0
    for eps, sens in [(0.5, 1), (1 / 3, 3), (0.1, 20), (40.0, 1), (1e-3, 1e6), (1e-3, 6.8e7)]:
        dl = DiscreteLaplace(eps, sens)
        address = int(rng.integers(0, 2**63)) + (2**63 if eps == 0.1 else 0)  # the nonce's high words too
        start = int(rng.integers(0, 2**31))
        many = g.discrete_laplace(7, address, start, 3000, dl)
        one = [g.discrete_laplace_one(7, address, start + i, dl) for i in range(3000)]
        assert one == many.tolist()
        seen += len(one)
    assert seen == 18_000


def test_a_cached_scale_never_lets_a_bool_or_bad_number_through() -> None:
    """The parameters of a discrete Laplace are cached per (epsilon, sensitivity); ``True == 1`` and ``1 == 1.0`` are
    equal keys, so a bool must be refused before the cache is asked (and nothing invalid is ever cached)."""
    DiscreteLaplace(epsilon=1.0, sensitivity=1)
    DiscreteLaplace(epsilon=1, sensitivity=1.0)
    for eps, sens in [(True, 1), (1.0, True), (1.0, math.nan), (math.inf, 1), (-1.0, 1), (1.0, 0)]:
        with pytest.raises(ValueError, match="positive finite"):
            DiscreteLaplace(epsilon=eps, sensitivity=sens)
    # the shared instances the holdout's end asks for: the same refusals after an equal valid pair was cached
    from operators.noise import shared_laplace

    assert shared_laplace(1.0, 1) is shared_laplace(1.0, 1)
    assert shared_laplace(1, 1.0).scale_fraction == DiscreteLaplace(1.0, 1).scale_fraction
    for eps, sens in [(True, 1), (1.0, True), (1.0, math.nan), (math.inf, 1), (-1.0, 1), (1.0, 0)]:
        with pytest.raises(ValueError, match="positive finite"):
            shared_laplace(eps, sens)


def test_a_discrete_laplace_made_from_the_parameter_cache_is_the_one_computed() -> None:
    """The second ``DiscreteLaplace`` of a pair takes its parameters from the cache the first filled: every attribute
    equal, with its type, to a fresh computation's (a cache that put one attribute in another's place would change
    every draw made with it)."""
    from operators import noise

    for eps, sens in [(1.0, 3), (0.125, 2500), (0.375, 2500 * 2500), (1e-3, 0.5), (2.0, 7.25)]:
        first = noise.DiscreteLaplace(eps, sens)
        again = noise.DiscreteLaplace(eps, sens)
        fresh = object.__new__(noise.DiscreteLaplace)
        fresh._compute(eps, sens)
        assert (eps, sens) in noise._DL_PARAMETERS
        for name in noise.DiscreteLaplace.__slots__:
            for made in (first, again):
                got, want = getattr(made, name), getattr(fresh, name)
                assert type(got) is type(want) and got == want, name

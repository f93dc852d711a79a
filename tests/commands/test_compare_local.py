"""``tops compare --mode local`` and the reference ToPL it compares against.

The reference baseline must be the authors' pipeline with its Piecewise bug fixed: its stream phase unbiased (the
bug mapped reports back with a sample's piece bound instead of the domain's), its threshold rule the one of its code.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from operators.local.reference import PM_ABOVE, ReferenceToPL, _remove_trailing_zero, reference_threshold
from operators.local.threshold import threshold_candidates, threshold_objective
from stream.commands.compare_local import LOCAL_METHODS, run_compare_local, true_density_theta
from tests.support import tops_text


def test_remove_trailing_zero_is_the_references() -> None:
    h = np.array([0.5, 0.3, 0.19, 0.00001, 0.0, 0.0, 0.0, 0.0, 0.00999])
    out = _remove_trailing_zero(h / h.sum())
    assert out[3:].sum() == 0.0  # zeroed below 1/10,000, then cut at the first run of 5 zeros
    assert out.sum() == pytest.approx(1.0)
    assert out[:3] == pytest.approx(h[:3] / h.sum() + (1 - (h[:3] / h.sum()).sum()) / 3)


@pytest.mark.parametrize("eps", [1.0, 2.0])  # SR below 1.29, PM above
def test_reference_stream_phase_is_unbiased(eps: float) -> None:
    """200,000 released ticks of a constant 3: the mean release is min(3, theta) within 5 standard errors. The
    reference's bug (every PM report mapped back with the last sample's piece bound) fails this by far."""
    rng = np.random.default_rng(2)
    hold = rng.integers(0, 8, size=4000).astype(float)
    ref = ReferenceToPL(epsilon=eps, bound=64.0, holdout=hold.size, key=bytes([7]) * 32)
    out = ref.process(np.concatenate([hold, np.full(200_000, 3.0)]))[hold.size :]
    assert (eps > PM_ABOVE) == (len(np.unique(out)) > 2)  # SR reports take two values, PM a continuum
    target = min(3.0, ref.theta)
    assert abs(out.mean() - target) < 5 * out.std() / np.sqrt(out.size)


def test_reference_threshold_uses_its_constants() -> None:
    """With the exact SW report distribution of readings uniform on [0, 10] (B = 100) and ample reports, the
    reference's score (noise (std theta)^2 n/3, bias n^2/24) picks a theta inside the data. (Its post-processing cuts
    the density at the first run of 5 empty buckets wherever it is: data that do not start near 0 lose everything,
    and theta is 0. That is the reference's behaviour, kept.)"""
    from operators.local.square_wave import square_wave_parameters, square_wave_transition_matrix

    eps = 2.0
    b = square_wave_parameters(eps)[0]
    m = square_wave_transition_matrix(eps, 1024, 1024, b)
    f = np.zeros(1024)
    f[:103] = 1.0 / 103  # readings uniform on [0, 10] of [0, 100]
    counts = np.round(m @ f * 1e7)
    theta = reference_threshold(counts, 100.0, eps, eps, 1 << 20)
    assert 0.0 < theta <= 10.2
    f[:50] = 0.0  # nothing below 5: the reference cuts it all
    f /= f.sum()
    assert reference_threshold(np.round(m @ f * 1e7), 100.0, eps, eps, 1 << 20) == 0.0


def test_true_density_theta_is_eq8_on_the_exact_density() -> None:
    rng = np.random.default_rng(4)
    hold = np.minimum(rng.exponential(3.0, size=20_000), 40.0).round()
    got = true_density_theta(hold, 40.0, 1.0, 1 << 16)
    dens = np.bincount(np.minimum((hold / 40.0 * 40).astype(int), 39), minlength=40).astype(float)
    want = threshold_candidates(40.0, 40)[int(np.argmin(threshold_objective(dens, 40.0, 1.0, 1 << 16)))]
    assert got == want


def test_run_compare_local_orders_the_rows() -> None:
    """A skewed stream, eps 1: every row measured, always-zero far behind the others, the true density's theta no
    worse than tops's private choice by more than sampling noise (3 keys)."""
    from operators.topl import ToPLConfig

    rng = np.random.default_rng(6)
    x = np.minimum(rng.exponential(4.0, size=6096), 200.0).round()
    base = ToPLConfig(epsilon=1.0, bound=200.0, holdout=2000, query_range=4096)
    res = run_compare_local(x, methods=list(LOCAL_METHODS), grid=[(1.0, 1.0)], base=base, repetitions=3,
                            queries=300, seed=0, show_progress=False)
    mse = {r.method: np.mean(r.mse) for r in res}
    assert set(mse) == set(LOCAL_METHODS)
    assert mse["zero"] > 10 * max(mse["topl"], mse["reference"], mse["true-density"])
    assert all(len(r.mse_class) >= 2 for r in res)


def _cli(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    return tops_text("compare", *args, "--out-dir", tmp, timeout=300)


def test_cli_local_mode(tmp_path: Path) -> None:
    data = tmp_path / "x.npy"
    np.save(data, np.minimum(np.random.default_rng(1).exponential(4.0, size=5000), 100.0).round())
    r = _cli(str(data), "--mode", "local", "--bound", "100", "--holdout", "1000", "--range", "1024", "--eps", "1",
             "--repetitions", "2", "--queries", "100", "--no-plot", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    for label in ("tops local (ToPL)", "reference ToPL, PM fixed", "theta of true density (NOT private)",
                  "always zero"):
        assert label in r.stdout
    assert (tmp_path / "x_local.csv").exists()
    bad = _cli(str(data), "--mode", "local", "--bound", "100", "--methods", "pak", "--no-plot", tmp=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "unknown local method 'pak'" in bad.stderr

"""Every entry of the smoother registry (operators.smoothers.SMOOTHERS) holds what it claims, by one shared check
run over each: the configuration accepts it and documents it, the status publishes exactly the keys it reads and
those keys change its releases, a ToPS snapshot round-trips with it, a linear one's error bar has the noise variance
a seeded Monte Carlo run measures, the columnar rows take it exactly when it says they do and then release what
ToPS releases, the hindsight reference (and so the hindsight row of ``tops compare``) models it exactly when it
says so, and the daemon releases what replay recomputes with it. An entry added without one of its pieces
(coefficients for a linear smoother, a compiled row step, a reference line) fails here."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from operators.columnar import ColumnarRelease, columnar_eligible, rows_hold
from operators.config import SMOOTHERS, ConfigError, ToPSConfig, smoother
from operators.error_bar import NoiseModel
from operators.hindsight import deterministic_release
from operators.smoother import SmootherState, release_ticks
from operators.smoothers import SmootherSpec
from operators.tops import ToPS
from stream.commands.compare import run_compare
from stream.commands.inputs import InputError
from stream.commands.scoring import HINDSIGHT
from stream.core.config import TEMPLATE_DOCS
from stream.core.sinks import central_params
from tests.support import identity_from_log, tops_text, write_toml

NAMES = list(SMOOTHERS)
KEY = bytes(range(32))
SMOOTHER_KEYS = ("alpha", "window")  # the configuration keys that belong to smoothers, read by some, not by others
# a hierarchy small enough that a few thousand ticks cross several trees: b = 4, r = 256, s = 1 (leaves of 4 ticks)
PUBLIC = {"epsilon": 1.0, "bound": 60.0, "theta": 40.0, "holdout": 0, "query_range": 256, "fanout": 4,
          "smoother_layers": 1, "alpha": 0.3, "window": 2}


def _config(name: str, **changes: object) -> ToPSConfig:
    return ToPSConfig(**{**PUBLIC, "smoother": name, **changes})


def _readings(seed: int, n: int) -> np.ndarray:
    """Readings whose level drifts (so every smoother predicts something different) with spikes above theta."""
    rng = np.random.default_rng(seed)
    return np.clip(20 + 10 * np.sin(np.arange(n) / 37) + rng.gamma(2.0, 4.0, n), 0, 60)


@pytest.mark.parametrize("name", NAMES)
def test_the_configuration_accepts_the_smoother_and_documents_it(name: str) -> None:
    spec = smoother(name)
    assert isinstance(spec, SmootherSpec) and spec.name == name and spec.summary
    cfg = _config(name)
    assert cfg.smoother == name and ToPSConfig(**cfg.to_dict()) == cfg
    fields = {f.name for f in dataclasses.fields(ToPSConfig)}
    assert set(spec.reads) <= set(SMOOTHER_KEYS) <= fields, spec.reads
    assert f"`{name}`, {spec.summary}" in TEMPLATE_DOCS["smoother"]
    for key in SMOOTHER_KEYS:
        assert (f"`{name}`" in TEMPLATE_DOCS[key]) == (key in spec.reads), key


def test_an_unknown_smoother_is_refused_with_the_allowed_ones() -> None:
    for bad in ("best", "Recent", "", 3, None):
        with pytest.raises(ConfigError, match="smoother must be one of recent, ema, mean, median, moving") as info:
            smoother(bad)
        assert info.value.param == "smoother"
        with pytest.raises(ConfigError, match="smoother must be one of"):
            _config(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", NAMES)
def test_the_keys_the_smoother_reads_change_its_releases_and_only_those_are_published(name: str) -> None:
    spec = smoother(name)
    x = _readings(1, 1500)
    base = ToPS(_config(name), KEY).process(x)
    for key, other in (("alpha", 0.7), ("window", 6)):
        changed = ToPS(_config(name, **{key: other}), KEY).process(x)
        assert (not np.array_equal(changed, base)) == (key in spec.reads), key
    params = central_params(_config(name), 40, 1, None)
    assert {k for k in SMOOTHER_KEYS if k in params} == set(spec.reads)


@pytest.mark.parametrize("name", NAMES)
def test_a_snapshot_round_trips_with_the_smoother(name: str) -> None:
    """Cut inside the holdout (its ticks release NaN), inside a leaf and after a tree: the restored stream goes on bit
    for bit, from a snapshot through JSON and from one as the state store keeps it (its configuration put back beside
    it, as stream.state.records does)."""
    cfg = _config(name, theta=None, holdout=300, smoother_layers=None)
    x = _readings(2, 3000)
    whole = ToPS(cfg, KEY).process(x)
    for cut in (150, 301, 1111, 2049):
        op = ToPS(cfg, KEY)
        first = op.process(x[:cut])
        for snap in (op.snapshot(), {**op.snapshot(stored=True), "config": cfg.to_dict()}):
            again = ToPS.restore(cfg, KEY, json.loads(json.dumps(snap)))
            assert np.array_equal(np.concatenate([first, again.process(x[cut:])]), whole, equal_nan=True), cut


@pytest.mark.parametrize("name", NAMES)
def test_a_linear_smoother_has_coefficients_that_reproduce_its_predictions(name: str) -> None:
    """``linear`` and ``coefficients`` go together, and the coefficients are the smoother's: ``w p_k`` equals
    ``sum_i weight_i u_i`` plus the prior's share, on random leaf sums (up to the release grid's rounding)."""
    spec = smoother(name)
    assert (spec.coefficients is not None) == spec.linear
    if not spec.linear:
        return
    assert spec.coefficients is not None
    w, u0, alpha, window = 4, 100.0, 0.3, 5
    u = np.random.default_rng(3).normal(100.0, 30.0, 40)
    st = SmootherState.initial(name, leaf_ticks=w, theta_units=1, window=window, start=u0 / w)
    preds = spec.predictions(st, u.copy(), alpha)  # p_1, ..., p_40
    # the prior's share: what the prediction is when every leaf sum is 0 (linear: the rest is the coefficients')
    st0 = SmootherState.initial(name, leaf_ticks=w, theta_units=1, window=window, start=u0 / w)
    prior = spec.predictions(st0, np.zeros(u.size), alpha)
    for k in range(1, u.size + 1):
        i, weight = spec.coefficients(k, alpha, window)
        assert np.all((0 <= i) & (i < k))
        assert w * (preds[k - 1] - prior[k - 1]) == pytest.approx(float(weight @ u[i]), abs=w / 64), k


def _monte_carlo_sums(name: str, ranges: list[tuple[int, int]], runs: int) -> np.ndarray:
    """The released sums of ``ranges`` over ``runs`` independently keyed streams of one fixed input: with a public
    theta only the noise differs between them."""
    cfg = _config(name)
    x = _readings(4, max(b for _, b in ranges) + 1)
    rng = np.random.default_rng(5)
    out = np.empty((runs, len(ranges)))
    for r in range(runs):
        rel = ToPS(cfg, rng.bytes(32)).process(x)
        c = np.concatenate([[0.0], np.cumsum(rel)])
        out[r] = [c[b + 1] - c[a] for a, b in ranges]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_a_linear_smoothers_error_bar_has_the_variance_monte_carlo_measures(name: str) -> None:
    """Eq. 1 of operators.error_bar against 1000 seeded runs, for two ranges inside one leaf (the second only
    predicted ticks: the variance is the prediction's), one cutting leaves at both ends and one across two tree
    boundaries. A window of 2 leaves makes a moving average that leaves one leaf out have half the variance. Tolerance:
    5 standard errors of the sample variance,
    ``var sqrt((kurtosis - 1) / n)`` with the kurtosis measured on the same sample (Laplace-like sums are heavier
    tailed than normal ones)."""
    spec = smoother(name)
    model = NoiseModel(epsilon=PUBLIC["epsilon"], theta=PUBLIC["theta"], fanout=PUBLIC["fanout"],
                       query_range=PUBLIC["query_range"], smoother_layers=PUBLIC["smoother_layers"], smoother=name,
                       alpha=PUBLIC["alpha"], window=PUBLIC["window"])
    assert model.linear == spec.linear
    ranges = [(41, 42), (240, 242), (13, 230), (130, 700)]
    if not spec.linear:
        assert model.variance(np.arange(13, 231)) is None
        return
    sums = _monte_carlo_sums(name, ranges, runs=1000)
    for (a, b), col in zip(ranges, sums.T, strict=True):
        want = model.variance(np.arange(a, b + 1))
        dev = col - col.mean()
        var = float(dev @ dev) / (col.size - 1)
        kurtosis = float(np.mean(dev**4)) / float(np.mean(dev**2)) ** 2
        tolerance = 5 * var * math.sqrt((kurtosis - 1) / col.size)
        assert abs(var - want) <= tolerance, (a, b, var, want, tolerance)


@pytest.mark.parametrize("name", NAMES)
def test_the_rows_take_the_smoother_exactly_when_it_says_and_release_what_tops_releases(name: str) -> None:
    spec = smoother(name)
    cfg = _config(name)
    assert rows_hold(cfg) == spec.in_rows
    x = _readings(6, 2000)
    op = ToPS(cfg, KEY)
    assert columnar_eligible(op) == spec.in_rows
    cols = ColumnarRelease(ahead=4)
    if not spec.in_rows:
        with pytest.raises(ValueError, match="become rows"):
            cols.add(op)
        return
    r = cols.add(op)
    got = np.concatenate([cols.process(np.full(777, r), x[:777]), cols.process(np.full(1223, r), x[777:])])
    assert np.array_equal(got, ToPS(cfg, KEY).process(x))


@pytest.mark.parametrize("name", NAMES)
def test_the_hindsight_reference_models_the_smoother_exactly_when_it_says(name: str) -> None:
    """``in_hindsight``: the noiseless release operators.hindsight computes is the smoother's release with zero
    noise; a smoother it does not model releases something else."""
    spec = smoother(name)
    w = 4
    units = np.round(_readings(7, 803)).astype(np.int64)
    start = 17.3
    st = SmootherState.initial(name, leaf_ticks=w, theta_units=40, window=PUBLIC["window"], start=start)
    noiseless = release_ticks(units, np.zeros(units.size // w), st, alpha=PUBLIC["alpha"])
    assert np.array_equal(deterministic_release(units, start, w), noiseless) == spec.in_hindsight


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_the_daemon_releases_what_replay_recomputes_with_the_smoother(name: str, tmp_path: Path) -> None:
    """``tops run`` on stdin with the smoother in its template, then ``tops replay`` with the printed identity and
    the same parameters: the same released ticks, bit for bit."""
    template = {**{k: v for k, v in PUBLIC.items() if k != "theta"}, "holdout": 200, "smoother": name}
    cfg = write_toml(tmp_path / "tops.toml", {
        "input": {"source": "stdin"}, "output": {"sinks": ["stdout"]}, "metrics": {"port": 0},
        "state": {"data_dir": ""},  # no store: the run leaves nothing behind
        "streams": {"key_file": str(tmp_path / "master.key"), "template": template},
    })
    x = np.round(_readings(8, 1500), 2)
    run = tops_text("run", "--config", cfg, stdin="".join(f"m,{v:g}\n" for v in x))
    assert run.returncode == 0, run.stderr
    got = {r["tick"]: r["value"] for r in map(json.loads, run.stdout.splitlines()) if "tick" in r}
    np.save(tmp_path / "x.npy", x)
    options = [f"--{key.replace('_', '-')}" if key != "query_range" else "--range" for key in template]
    args = [a for option, value in zip(options, template.values(), strict=True) for a in (option, value)]
    replayed = tops_text("replay", tmp_path / "x.npy", *args, "--key-file", tmp_path / "master.key",
                         "--identity", identity_from_log(run.stderr), "--stream", "m", "--out", tmp_path / "r.npy")
    assert replayed.returncode == 0, replayed.stderr
    want = {t: float(v) for t, v in enumerate(np.load(tmp_path / "r.npy")) if not np.isnan(v)}
    assert len(want) == x.size - 200 and got == want


@pytest.mark.parametrize("name", NAMES)
def test_the_hindsight_row_of_compare_runs_only_for_a_smoother_it_models(name: str) -> None:
    x = np.round(_readings(9, 600))
    base = ToPSConfig(epsilon=1.0, bound=60.0, holdout=100, query_range=64, smoother=name)
    compare = dict(methods=[HINDSIGHT], grid=[(1.0, 1.0)], base=base, repetitions=1, queries=50, seed=0,
                   show_progress=False)
    if smoother(name).in_hindsight:
        assert len(run_compare(x, **compare)) == 1
    else:
        with pytest.raises(InputError, match=r"the hindsight row needs a holdout, the .* smoother"):
            run_compare(x, **compare)

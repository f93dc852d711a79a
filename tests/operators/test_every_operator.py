"""One set of checks run over every stream operator (style: river's shared estimator checks)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from operators import ToPS, ToPSConfig
from operators.noise import KeyedGenerator
from operators.topl import ToPL, ToPLConfig

KEY = bytes(range(32))


def _cases():
    yield "tops", lambda: ToPS(ToPSConfig(epsilon=0.5, bound=40, holdout=200, query_range=1024, fanout=4), KEY)
    yield "tops-fixed-theta", lambda: ToPS(ToPSConfig(epsilon=0.5, bound=40, theta=12, query_range=256), KEY)
    yield "topl", lambda: ToPL(ToPLConfig(epsilon=1.0, bound=40, holdout=300, query_range=1024), KEY)


CASES = dict(_cases())


@pytest.fixture(params=sorted(CASES))
def make(request):
    return CASES[request.param]


def _data(n: int = 1500) -> np.ndarray:
    return np.random.default_rng(0).gamma(2.0, 5.0, n).round()


def test_has_a_docstring_with_an_example(make) -> None:
    op = make()
    doc = type(op).__doc__ or ""
    module_doc = __import__(type(op).__module__, fromlist=["_"]).__doc__ or ""
    assert doc.strip() and ">>>" in module_doc


def test_one_release_per_tick_nan_only_in_the_holdout(make) -> None:
    op = make()
    out = op.process(_data())
    assert out.shape == (1500,) and out.dtype == np.float64
    nan = np.isnan(out)
    k = int(nan.sum())
    assert not nan[k:].any(), "NaN only for the first (holdout) ticks"


def test_same_key_same_output_and_input_not_mutated(make) -> None:
    x = _data()
    copy = x.copy()
    a, b = make().process(x), make().process(x)
    assert np.array_equal(a, b, equal_nan=True)
    assert np.array_equal(x, copy)


def test_snapshot_is_json_without_the_key_and_restores(make) -> None:
    x = _data()
    op = make()
    op.process(x[:700])
    snap = op.snapshot()
    text = json.dumps(snap)
    assert KEY.hex() not in text and str(list(KEY)) not in text
    again = type(op).restore(op.config, KEY, json.loads(text))
    assert np.array_equal(again.process(x[700:]), make().process(x)[700:], equal_nan=True)


def test_repr_and_pickle_never_carry_the_key(make) -> None:
    op = make()
    assert KEY.hex() not in repr(op)
    with pytest.raises(TypeError, match="secret"):
        pickle.dumps(KeyedGenerator(KEY))


def test_the_scalar_grid_is_numpys_grid() -> None:
    """A new or restored stream's first prediction is put on the 1/1024 grid without numpy (``grid_scalar``): the
    same float, sign of zero included, as ``np.rint(x * 1024) / 1024`` on ties, tiny and huge values."""
    import math

    from operators.smoothers import grid, grid_scalar

    rng = np.random.default_rng(1126)
    xs = list(rng.normal(0, 1, 3000) * 10.0 ** rng.integers(-8, 12, 3000))
    xs += [k / 2048 for k in range(-50, 51)]  # exact ties at half a grid step
    xs += [0.0, -0.0, 1e-300, -1e-300, 2.0**60 + 0.5, 1e308, -1e308, math.inf, -math.inf]
    for x in xs:
        with np.errstate(over="ignore"):
            want = float(grid(x))
            got = grid_scalar(x)
        assert got == want and math.copysign(1, got) == math.copysign(1, want), x

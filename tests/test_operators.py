"""One set of checks run over every stream operator (style: river's shared estimator checks)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from operators import ToPS, ToPSConfig
from operators.noise import KeyedGenerator

KEY = bytes(range(32))


def _cases():
    yield "tops", lambda: ToPS(ToPSConfig(epsilon=0.5, bound=40, holdout=200, query_range=1024, fanout=4), KEY)
    yield "tops-fixed-theta", lambda: ToPS(ToPSConfig(epsilon=0.5, bound=40, theta=12, query_range=256), KEY)
    try:
        from operators.topl import ToPL, ToPLConfig
    except ImportError:
        return
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

"""Every parameter that reaches ``operators/config.py`` is range-checked there, whoever builds the configuration: the
stream configuration (``ToPSConfig``, the daemon's template and ``tops replay``), the error model of ``tops query``
(``NoiseModel``, fed by a status message or the command line) and the hierarchy's height itself. A value out of range
is a :class:`ConfigError` naming the parameter and what is allowed, on one short line; nothing loops, allocates
without bound or raises anything else."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from operators.config import FANOUT_MAX, QUERY_RANGE_MAX, WINDOW_MAX, ConfigError, ToPSConfig, tree_height
from operators.error_bar import NoiseModel
from stream.core.config import build_config
from stream.core.errors import ConfigFileError
from tests.support import short_id, watchdog

HUGE = 10**400  # an integer Python parses from a 401-digit JSON number


def refused(make: Callable[[], Any], name: str) -> ConfigError:
    """``make()`` raises a ConfigError that names ``name``, on one line of bounded length."""
    with watchdog(), pytest.raises(ConfigError) as info:
        make()
    msg = str(info.value)
    assert msg.startswith(f"{name} must"), msg
    assert "\n" not in msg and len(msg) < 200, msg
    assert info.value.param == name
    return info.value


@pytest.mark.parametrize("fanout", [0, 1, -4, 0.5, math.nan])
def test_the_height_of_a_hierarchy_that_cannot_grow_is_refused_not_looped_on(fanout: Any) -> None:
    refused(lambda: tree_height(1 << 20, fanout), "fanout")


@pytest.mark.parametrize("query_range", [0, -256, math.nan])
def test_the_height_of_an_empty_range_is_refused(query_range: Any) -> None:
    refused(lambda: tree_height(query_range, 16), "query_range")


BAD = [
    ("fanout", 0), ("fanout", 1), ("fanout", -4), ("fanout", 2**40), ("fanout", HUGE), ("fanout", 4.0),
    ("fanout", "16"), ("fanout", True),
    ("query_range", 0), ("query_range", 1), ("query_range", -256), ("query_range", 2**62), ("query_range", HUGE),
    ("smoother_layers", 100), ("smoother_layers", 2**40), ("smoother_layers", -1),
    ("window", 0), ("window", 2**40), ("window", -3),
    ("resolution", 0), ("resolution", math.nan), ("resolution", math.inf), ("resolution", -1.0),
    ("alpha", math.nan), ("alpha", 1.5), ("alpha", math.inf),
    ("epsilon", 0), ("epsilon", math.nan), ("epsilon", math.inf), ("epsilon", HUGE),
    ("smoother", "x" * 10_000),
]


@pytest.mark.parametrize(("name", "value"), BAD, ids=short_id)
def test_a_stream_configuration_out_of_range_is_refused_naming_the_parameter(name: str, value: Any) -> None:
    kw = {"epsilon": 1.0, "bound": 100.0, "holdout": 10, "query_range": 256, "fanout": 4, name: value}
    refused(lambda: ToPSConfig(**kw), name)


@pytest.mark.parametrize(("name", "value"), BAD, ids=short_id)
def test_the_error_model_refuses_what_the_stream_configuration_refuses(name: str, value: Any) -> None:
    """``tops query`` builds a NoiseModel from a status message: the same ranges, the same messages."""
    kw = {"epsilon": 1.0, "theta": 10.0, "query_range": 256, "fanout": 4, name: value}
    refused(lambda: NoiseModel(**kw), name)


@pytest.mark.parametrize(("name", "value"), [("theta", 0), ("theta", math.nan), ("theta", -1.0), ("theta", HUGE)],
                         ids=short_id)
def test_the_error_model_refuses_a_threshold_out_of_range(name: str, value: Any) -> None:
    refused(lambda: NoiseModel(epsilon=1.0, theta=value), name)


def test_the_error_model_refuses_a_noise_beyond_the_exact_sampler() -> None:
    """theta / resolution so large that the node noise leaves the sampler's range: the stream could not have released
    with it, so no error bar is computed from it."""
    with pytest.raises(ConfigError, match=r"exceeds 2\^36"):
        NoiseModel(epsilon=1.0, theta=1e300, resolution=1e-300)
    with pytest.raises(ConfigError, match="noise scale"):
        NoiseModel(epsilon=1e-12, theta=10.0)


@pytest.mark.parametrize("holdout", [-1, 2**31, HUGE, 1.5], ids=short_id)
def test_a_holdout_out_of_range_is_refused(holdout: Any) -> None:
    refused(lambda: ToPSConfig(epsilon=1.0, bound=10.0, holdout=holdout), "holdout")


def test_the_limits_admit_their_ends() -> None:
    """The largest fanout, range and window are accepted, and the smallest: the limits are where they say."""
    ToPSConfig(epsilon=1.0, bound=10.0, fanout=FANOUT_MAX, query_range=FANOUT_MAX)
    ToPSConfig(epsilon=1.0, bound=10.0, fanout=2, query_range=QUERY_RANGE_MAX, smoother_layers=31)
    ToPSConfig(epsilon=1.0, bound=10.0, fanout=2, query_range=2, window=WINDOW_MAX, alpha=0, smoother_layers=0)
    NoiseModel(epsilon=1.0, theta=10.0, fanout=2, query_range=QUERY_RANGE_MAX, smoother_layers=31)
    for name, value in [("fanout", FANOUT_MAX + 1), ("query_range", QUERY_RANGE_MAX + 1),
                        ("window", WINDOW_MAX + 1)]:
        kw = {"epsilon": 1.0, "bound": 10.0, "fanout": 2, "query_range": 2, name: value}
        refused(lambda kw=kw: ToPSConfig(**kw), name)


@pytest.mark.parametrize(("name", "value"), [("fanout", 1), ("query_range", 2**62), ("window", 0),
                                             ("smoother_layers", 100), ("resolution", 0)])
def test_the_daemon_reports_the_operator_configurations_message_under_its_section(name: str, value: Any) -> None:
    """The daemon's template is checked by ToPSConfig alone: its line is that message under [streams.template]."""
    with pytest.raises(ConfigFileError) as info:
        build_config({"streams": {"template": {"epsilon": 1.0, "bound": 100.0, name: value}}})
    assert any(p.startswith(f"[streams.template] {name} must") for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(("key", "value"), [("counter_holdout", 0), ("counter_holdout", 2**31),
                                            ("counter_query_range", 1), ("counter_query_range", 2**62)])
def test_the_daemons_counter_keys_are_checked_by_the_operator_configuration(key: str, value: int) -> None:
    """A categorical stream's counters are ToPS streams: their holdout and range are checked once, by ToPSConfig,
    and the line names the daemon's key."""
    with pytest.raises(ConfigFileError) as info:
        build_config({"ticks": {"mode": "period"},
                      "streams": {"kind": "categorical"},
                      "categorical": {"epsilon": 1.0, "categories": 3, "counters": ["0"], "counter_bound": 10.0,
                                      key: value}})
    assert any(p.startswith(f"[categorical] {key} must") for p in info.value.problems), info.value.problems

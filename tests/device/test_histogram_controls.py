"""Devices under the controls of histogram streams: a device follows a categorical or a range control within its
pinned limits, refuses one outside them (more epsilon, other categories, an oracle it does not run, malformed
fields) and reports nothing after a refusal."""

from __future__ import annotations

import pytest

from stream.device.client import ControlError, Device, categorical_control, parse_control


def test_device_refuses_a_categorical_control_outside_its_limits() -> None:
    """The server proposes; a device with --categories 6 and --max-epsilon 1 refuses more epsilon, another d,
    a numeric phase and an unknown mechanism, and reports nothing after a refusal."""
    dev = Device("region", 1.0, categories=6, key=bytes(32))
    assert dev.on_control(categorical_control("region", 1.0, "grr", 6)) == "categorical"
    reps = dev.perturb([0, 5, 3])
    assert all(r["phase"] == "categorical" and type(r["report"]) is int and 0 <= r["report"] < 6 for r in reps)
    bad = [
        ({"stream": "region", "phase": "categorical", "epsilon": 5.0, "mechanism": "grr", "categories": 6}, "epsilon"),
        ({"stream": "region", "phase": "categorical", "epsilon": 1.0, "mechanism": "grr", "categories": 7},
         "categories"),
        ({"stream": "region", "phase": "categorical", "epsilon": 1.0, "mechanism": "oue", "categories": 6},
         "mechanism"),
        ({"stream": "region", "phase": "stream", "epsilon": 1.0, "theta": 3.0, "mechanism": "hybrid"}, "kind"),
    ]
    for msg, reason in bad:
        with pytest.raises(ControlError) as err:
            dev.on_control(msg)
        assert err.value.reason == reason, (msg, err.value.reason)
        with pytest.raises(RuntimeError):
            dev.perturb([1])
    numeric = Device("region", 1.0, key=bytes(32))
    with pytest.raises(ControlError) as err:
        numeric.on_control(categorical_control("region", 1.0, "grr", 6))
    assert err.value.reason == "kind"
    with pytest.raises(ControlError):
        parse_control({"stream": "region", "phase": "categorical", "epsilon": 1.0, "mechanism": "grr",
                       "categories": 1e300})
    dev.on_control(categorical_control("region", 1.0, "hr", 6))
    with pytest.raises(ValueError, match="categories must be integers"):
        dev.perturb([6])


def test_device_follows_a_range_control_and_refuses_what_it_must() -> None:
    """A numeric device takes the range control (its readings are bucketed on the device; every report is an integer
    in the layout's range, its level chosen by the device); it refuses more epsilon than its limit, an oracle it does
    not run, malformed controls (buckets 1, fanout 99, NaN width, mechanism oue); a categorical device refuses it."""
    from stream.core.control import parse_control, range_control
    from stream.device.client import ControlError, Device
    from stream.device.policy import DeviceLimits

    dev = Device("kwh", 2.0, key=bytes(32))
    ctl = range_control("kwh", 2.0, "tree", 0.0, 0.5, 16, 4)
    assert dev.on_control(ctl) == "range"
    total = parse_control(ctl).layout().total
    reps = dev.perturb([0.1, 3.3, 7.9, 1e9, -5.0])
    assert all(r["phase"] == "range" and type(r["report"]) is int and 0 <= r["report"] < total for r in reps)
    assert dev.account.phases["range"].readings == 5
    bad = [
        (range_control("kwh", 3.0, "tree", 0.0, 0.5, 16, 4), "epsilon"),
        ({"stream": "kwh", "phase": "range", "epsilon": 1.0, "mechanism": "tree", "lower": 0, "width": 0.5,
          "buckets": 1, "fanout": 4}, "buckets"),
        ({"stream": "kwh", "phase": "range", "epsilon": 1.0, "mechanism": "tree", "lower": 0, "width": 0.5,
          "buckets": 16, "fanout": 99}, "fanout"),
        ('{"stream": "kwh", "phase": "range", "epsilon": 1.0, "mechanism": "flat", "lower": 0, "width": NaN, '
         '"buckets": 16, "fanout": 4}', "malformed"),
        ({"stream": "kwh", "phase": "range", "epsilon": 1.0, "mechanism": "oue", "lower": 0, "width": 0.5,
          "buckets": 16, "fanout": 4}, "mechanism"),
    ]
    for msg, reason in bad:
        with pytest.raises(ControlError) as err:
            dev.on_control(msg)
        assert err.value.reason == reason, (msg, err.value.reason)
        with pytest.raises(RuntimeError):
            dev.perturb([1.0])
    grr_only = Device("kwh", DeviceLimits(max_epsilon=1.0, mechanisms=("grr",)), key=bytes(32))
    with pytest.raises(ControlError) as err:  # 1,024 buckets at eps 1 need Hadamard Response at the leaves
        grr_only.on_control(range_control("kwh", 1.0, "flat", 0.0, 1.0, 1024, 4))
    assert err.value.reason == "mechanism"
    cat = Device("kwh", 2.0, categories=6, key=bytes(32))
    with pytest.raises(ControlError) as err:
        cat.on_control(ctl)
    assert err.value.reason == "kind"

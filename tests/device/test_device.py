"""The Device API of local mode: the control protocol, the pinned limits, the privacy account, ``seq`` numbers,
reports from the device's own keystream, and the pipeline that holds readings for the phase that uses them."""

from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from operators.local import hybrid_report, hybrid_worst_case_variance, square_wave_parameters, square_wave_report
from operators.noise import Domain, KeyedGenerator
from stream.device.client import (
    ADDRESS_HYBRID,
    ADDRESS_SQUARE_WAVE,
    ControlError,
    Device,
    DeviceLimits,
    SpentAccount,
    parse_control,
    stream_control,
    threshold_control,
)
from tests.support import wait_for

KEY = bytes(range(32))


def test_control_messages_follow_the_protocol() -> None:
    t = threshold_control("s1", epsilon=0.5, bound=200.0)
    assert t == {
        "stream": "s1",
        "phase": "threshold",
        "epsilon": 0.5,
        "bound": 200.0,
        "mechanism": "square_wave",
        "sw_b": square_wave_parameters(0.5)[0],
    }
    s = stream_control("s1", epsilon=1.0, theta=12.0)
    assert s == {"stream": "s1", "phase": "stream", "epsilon": 1.0, "theta": 12.0, "mechanism": "hybrid"}
    assert parse_control(json.dumps(t).encode()).sw_b == t["sw_b"]
    # sw_b may be omitted: the device derives it from Eq. 16
    no_b = {k: v for k, v in t.items() if k != "sw_b"}
    assert parse_control(no_b).sw_b == pytest.approx(square_wave_parameters(0.5)[0])


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (b"not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        ({"stream": "other", "phase": "stream", "epsilon": 1.0, "theta": 3.0}, "another stream"),
        ({"stream": "s1", "phase": "warmup", "epsilon": 1.0}, "'phase'"),
        ({"stream": "s1", "phase": "stream", "epsilon": 0, "theta": 3.0}, "'epsilon'"),
        ({"stream": "s1", "phase": "stream", "epsilon": 1.0, "theta": -3.0}, "'theta'"),
        ({"stream": "s1", "phase": "stream", "epsilon": 1.0, "theta": 3.0, "mechanism": "pm"}, "'mechanism'"),
        ({"stream": "s1", "phase": "threshold", "epsilon": 1.0}, "'bound'"),
        ({"stream": "s1", "phase": "threshold", "epsilon": 1.0, "bound": 9.0, "sw_b": "x"}, "'sw_b'"),
        ({"stream": "s1", "phase": "stream", "epsilon": True, "theta": 3.0}, "'epsilon'"),
    ],
)
def test_bad_control_is_refused_and_nothing_is_reported_until_a_good_one(message, match: str) -> None:
    dev = Device("s1", 5.0, key=KEY)
    dev.on_control(stream_control("s1", 1.0, 5.0))
    with pytest.raises(ControlError, match=match):
        dev.on_control(message)
    assert dev.phase is None and dev.refused == 1
    with pytest.raises(RuntimeError, match="no acceptable control"):
        dev.perturb([1.0])
    assert dev.on_control(stream_control("s1", 1.0, 5.0)) == "stream" and len(dev.perturb([1.0])) == 1


LIMITS = DeviceLimits(max_epsilon=1.0, max_threshold_epsilon=0.5, bound=100.0)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (stream_control("s1", epsilon=60.0, theta=50.0), "epsilon"),
        (stream_control("s1", epsilon=1.0000001, theta=50.0), "epsilon"),
        (threshold_control("s1", epsilon=0.6, bound=100.0), "threshold_epsilon"),
        (threshold_control("s1", epsilon=0.5, bound=100.5), "bound"),
        (stream_control("s1", epsilon=1.0, theta=100.01), "theta"),
        ({**threshold_control("s1", 0.5, 100.0), "lower": -50}, "lower"),
        ({**stream_control("s1", 1.0, 50.0), "mechanism": "identity"}, "mechanism"),
        (b'{"stream": "s1", "phase": "stream", "epsilon": 1e400, "theta": 10}', "malformed"),
        (b'{"stream": "s1", "phase": "stream", "epsilon": NaN, "theta": 10}', "malformed"),
        (b'{"stream": "s1", "phase": "stream", "epsilon": -Infinity, "theta": 10}', "malformed"),
        (b'{"stream": "s1", "phase": "threshold", "epsilon": 0.5, "bound": 1' + b"0" * 400 + b"}", "malformed"),
        ({"stream": "s1", "phase": "stream", "epsilon": 1, "theta": 10**400}, "malformed"),
        (b"[" * 3000 + b"]" * 3000, "malformed"),
        (b"\xff\xfe garbage", "malformed"),
        (b"x" * 5000, "malformed"),
        (threshold_control("s2", epsilon=0.5, bound=100.0), "stream"),
    ],
)
def test_controls_outside_the_pinned_limits_are_refused(message, reason: str) -> None:
    dev = Device("s1", LIMITS, key=KEY)
    assert dev.on_control(threshold_control("s1", 0.5, 100.0)) == "threshold"
    dev.perturb([1.0, 2.0])
    with pytest.raises(ControlError) as info:
        dev.on_control(message)
    assert info.value.reason == reason and dev.refusals == {reason: 1}
    assert dev.phase is None
    with pytest.raises(RuntimeError):
        dev.perturb([3.0])
    assert dev.account.readings == 2  # nothing spent under the refused message
    text = str(info.value)
    assert len(text) < 200 and "garbage" not in text


def test_the_first_accepted_bound_is_pinned_when_none_is_given() -> None:
    dev = Device("s1", 1.0, key=KEY)
    dev.on_control(stream_control("s1", 1.0, 1e6))  # no bound known yet: theta is taken
    dev.on_control(threshold_control("s1", 1.0, 200.0))
    assert dev.pinned_bound == 200.0
    with pytest.raises(ControlError, match="bound pinned"):
        dev.on_control(threshold_control("s1", 1.0, 400.0))
    with pytest.raises(ControlError, match="theta"):
        dev.on_control(stream_control("s1", 1.0, 201.0))
    assert dev.on_control(stream_control("s1", 0.25, 200.0)) == "stream"  # a lower epsilon is fine
    only_hybrid = Device("s1", DeviceLimits(max_epsilon=1.0, mechanisms=("hybrid",)), key=KEY)
    with pytest.raises(ControlError, match="mechanism"):
        only_hybrid.on_control(threshold_control("s1", 1.0, 200.0))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_epsilon": 0}, "max_epsilon"),
        ({"max_epsilon": math.nan}, "max_epsilon"),
        ({"max_epsilon": 1e400}, "max_epsilon"),
        ({"max_epsilon": 51}, "max_epsilon"),
        ({"max_epsilon": 1, "max_threshold_epsilon": -1}, "max_threshold_epsilon"),
        ({"max_epsilon": 1, "bound": math.inf}, "bound"),
        ({"max_epsilon": 1, "lower": 5}, "lower"),
        ({"max_epsilon": 1, "mechanisms": ("laplace",)}, "mechanisms"),
    ],
)
def test_bad_limits_are_refused(kwargs, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DeviceLimits(**kwargs)


def test_the_account_counts_each_reading_once_at_the_epsilon_used() -> None:
    dev = Device("s1", DeviceLimits(max_epsilon=2.0, max_threshold_epsilon=1.0), key=KEY)
    dev.on_control(threshold_control("s1", 0.5, 100.0))
    dev.perturb_values(np.arange(10.0))
    dev.on_control(threshold_control("s1", 1.0, 100.0))
    dev.perturb([1.0, 2.0, 3.0])
    with pytest.raises(ControlError):
        dev.on_control(stream_control("s1", 3.0, 50.0))
    dev.on_control(stream_control("s1", 2.0, 50.0))
    dev.perturb_values(np.arange(7.0))
    assert dev.account.to_dict() == {
        "threshold": {"readings": 13, "max_epsilon": 1.0, "total_epsilon": 8.0},
        "stream": {"readings": 7, "max_epsilon": 2.0, "total_epsilon": 14.0},
        "readings": 20,
        "max_epsilon_per_reading": 2.0,
        "total_epsilon": 22.0,
    }
    assert dev.reports == 20
    line = dev.account.line()
    assert "20 readings, each reported once" in line and "at most 2" in line
    assert SpentAccount.from_dict(json.loads(json.dumps(dev.account.to_dict()))) == dev.account


def test_seq_increases_and_starts_above_the_floor() -> None:
    dev = Device("s1", 1.0, key=KEY, seq_floor=(1 << 62))
    dev.on_control(stream_control("s1", 1.0, 5.0))
    a = [m["seq"] for m in dev.perturb([1.0, 2.0, 3.0])]
    b = [m["seq"] for m in dev.perturb([1.0])]
    assert a == [(1 << 62), (1 << 62) + 1, (1 << 62) + 2] and b == [(1 << 62) + 3]
    # time-based without a floor: a second device (a restart) starts above the first one's numbers
    first = Device("s1", 1.0)
    first.on_control(stream_control("s1", 1.0, 5.0))
    used = [m["seq"] for m in first.perturb(np.ones(1000))]
    # a restart comes later than the 1,000 microseconds this batch ran ahead of the clock
    wait_for(lambda: time.time_ns() // 1000 > used[-1], what="the clock passing the last seq")
    again = Device("s1", 1.0)
    again.on_control(stream_control("s1", 1.0, 5.0))
    assert again.perturb([1.0])[0]["seq"] > used[-1]
    assert used[0] > 1_700_000_000 * 10**6 and used[-1] < (1 << 63)
    quiet = Device("s1", 1.0, sequence=False)
    quiet.on_control(stream_control("s1", 1.0, 5.0))
    assert "seq" not in quiet.perturb([1.0])[0]


def test_no_reports_before_a_control_message_and_after_it_is_withdrawn() -> None:
    dev = Device("s1", 5.0, key=KEY)
    with pytest.raises(RuntimeError, match="no acceptable control"):
        dev.perturb([1.0])
    dev.on_control(threshold_control("s1", 1.0, 10.0))
    assert len(dev.perturb([1.0, 2.0])) == 2
    assert dev.on_control(b"") is None and dev.phase is None
    with pytest.raises(RuntimeError):
        dev.perturb([1.0])


def test_reports_use_the_devices_keystream_and_never_reuse_it() -> None:
    dev = Device("s1", 5.0, key=KEY)
    gen = KeyedGenerator(KEY)
    dev.on_control(threshold_control("s1", 1.0, 50.0))
    first = dev.perturb_values([7.0, 8.0, 9.0])
    second = dev.perturb_values([7.0, 8.0, 9.0])
    u = gen.uniforms(Domain.LOCAL, ADDRESS_SQUARE_WAVE, 0, 6)
    np.testing.assert_array_equal(first, square_wave_report([7.0, 8.0, 9.0], 50.0, 1.0, u[:3]))
    np.testing.assert_array_equal(second, square_wave_report([7.0, 8.0, 9.0], 50.0, 1.0, u[3:]))
    dev.on_control(stream_control("s1", 2.0, 20.0))
    third = dev.perturb_values([7.0, 30.0])
    u = gen.uniforms(Domain.LOCAL, ADDRESS_HYBRID, 0, 4)
    np.testing.assert_array_equal(third, hybrid_report([7.0, 30.0], 20.0, 2.0, u[0::2], u[1::2]))
    assert dev.reports == 8


def test_devices_have_private_random_keys() -> None:
    a, b = Device("s1", 1.0), Device("s1", 1.0)
    for dev in (a, b):
        dev.on_control(stream_control("s1", 1.0, 10.0))
    x = np.full(64, 5.0)
    assert not np.array_equal(a.perturb_values(x), b.perturb_values(x))
    assert "secret" in repr(a._gen) and KEY.hex() not in repr(a)


@pytest.mark.slow
def test_stream_reports_are_unbiased_for_the_truncated_readings() -> None:
    dev = Device("s1", 5.0, key=KEY)
    dev.on_control(stream_control("s1", 1.0, 10.0))
    readings = np.random.default_rng(1).exponential(4.0, 200_000)
    reports = dev.perturb_values(readings)
    sd = 10.0 / 2 * math.sqrt(hybrid_worst_case_variance(1.0) / readings.size)
    assert abs(reports.mean() - np.minimum(readings, 10.0).mean()) <= 4.5 * sd


def test_report_messages() -> None:
    dev = Device("s1", 5.0, key=KEY)
    dev.on_control(threshold_control("s1", 1.0, 10.0))
    r = dev.perturb([3.0, 4.0], ts=[1.5, 2.5])
    assert [set(m) for m in r] == [{"report", "phase", "ts", "seq"}] * 2
    assert [m["ts"] for m in r] == [1.5, 2.5] and {m["phase"] for m in r} == {"threshold"}
    dev.on_control(stream_control("s1", 1.0, 6.0))
    (m,) = dev.perturb([3.0], ts=9.0)
    assert set(m) == {"report", "phase", "ts", "theta", "seq"} and m["theta"] == 6.0 and m["phase"] == "stream"
    json.dumps(m)  # JSON-ready
    dev = Device("s1", 5.0, key=KEY)  # a new device: the bound of the first one is pinned at 10
    for control in (threshold_control("s1", 0.7, 30.0), stream_control("s1", 3.0, 6.0)):
        dev.on_control(control)
        lo, hi = parse_control(control).report_range()
        values = dev.perturb_values(np.linspace(0, 50, 5000))
        assert lo <= values.min() and values.max() <= hi
    with pytest.raises(ValueError, match="finite"):
        dev.perturb([float("nan")])
    # a negative reading is reported (clamped to 0), never skipped: a missing report would reveal it
    neg = Device("s2", 5.0, key=KEY, sequence=False)
    zero = Device("s2", 5.0, key=KEY, sequence=False)
    for d in (neg, zero):
        d.on_control(stream_control("s2", 3.0, 6.0))
    assert neg.perturb_values([-1.0, -7.5, 2.0]).tolist() == zero.perturb_values([0.0, 0.0, 2.0]).tolist()
    with pytest.raises(ValueError, match="stream name"):
        Device("a/#", 1.0)


def test_the_state_file_reserves_seq_numbers_before_use(tmp_path: Path) -> None:
    """With a state file a restart starts above every number used, even when the clock went back."""
    from stream.device.client import _Pipeline
    from stream.device.policy import DeviceState

    path = str(tmp_path / "state.json")
    state = DeviceState(path, "s1")
    dev = Device("s1", DeviceLimits(max_epsilon=1.0), key=KEY)
    dev.seq.next = int(time.time() * 1e6) + 10**12  # this device's clock ran far ahead, then goes back
    pipe = _Pipeline(dev, 100, state)
    dev.on_control(threshold_control("s1", 1.0, 50.0))
    sent = [m["seq"] for m in pipe._perturb([1.0] * 5, [1.0] * 5)]
    on_disk = json.loads(Path(path).read_text())
    assert on_disk["seq_reserved"] > sent[-1] and on_disk["stream"] == "s1" and on_disk["bound"] == 50.0
    pipe.save_state()
    again = DeviceState(path, "s1")
    again.load()
    assert again.account == dev.account and again.bound == 50.0
    restarted = Device("s1", 1.0, seq_floor=again.seq_reserved, account=again.account, bound=again.bound)
    restarted.on_control(stream_control("s1", 1.0, 50.0))
    assert restarted.perturb([1.0])[0]["seq"] > sent[-1]
    with pytest.raises(ControlError, match="bound pinned"):  # the pinned bound survives the restart
        restarted.on_control(threshold_control("s1", 1.0, 60.0))
    assert restarted.account.readings == 6
    with pytest.raises(ValueError, match="another stream"):
        DeviceState(path, "s2").load()
    Path(path).write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        DeviceState(path, "s1").load()


def test_a_threshold_control_limits_the_reports_to_what_the_round_takes() -> None:
    """``take`` bounds the threshold-phase reports; a republished message (older ``received``, the device's reports
    still in flight) grants nothing more; the next round grants its own share; a stream control takes everything."""
    dev = Device("s1", 1.0, key=KEY)
    assert dev.on_control(threshold_control("s1", 1.0, 100.0, received=0, take=13)) == "threshold" and dev.room == 13
    assert len(dev.perturb(np.ones(13))) == 13 and dev.room == 0
    with pytest.raises(RuntimeError, match="takes 0 more"):
        dev.perturb([1.0])
    dev.on_control(threshold_control("s1", 1.0, 100.0, received=0, take=13))  # the retained message again
    assert dev.room == 0
    dev.on_control(threshold_control("s1", 1.0, 100.0, received=7, take=6))  # a periodic status mid-flight
    assert dev.room == 0
    dev.on_control(threshold_control("s1", 1.0, 100.0, domain=40.0, received=13, take=12))  # the next round
    assert dev.room == 12
    with pytest.raises(RuntimeError, match="takes 12 more"):
        dev.perturb(np.ones(13))
    assert dev.account.readings == 13  # a refused batch spends nothing
    dev.perturb(np.ones(5))
    dev.on_control(threshold_control("s1", 1.0, 100.0, domain=40.0, received=16, take=9))  # 2 of mine in flight
    assert dev.room == 7
    dev.on_control(threshold_control("s1", 1.0, 100.0, received=0, take=13))  # the server lost its state
    assert dev.room == 13
    dev.on_control(stream_control("s1", 1.0, 30.0))
    assert dev.room is None and len(dev.perturb(np.ones(500))) == 500
    old = Device("s1", 1.0, key=KEY)  # a daemon that does not say take: no limit, as before
    old.on_control(threshold_control("s1", 1.0, 100.0))
    assert old.room is None and len(old.perturb(np.ones(500))) == 500
    assert "take" not in threshold_control("s1", 1.0, 100.0)


@pytest.mark.parametrize(
    "counts",
    [{"received": 0, "take": -1}, {"received": 0, "take": "5"}, {"received": 0, "take": 1e400},
     {"received": 0, "take": True}, {"received": 0, "take": 2**60}, {"received": 5}, {"take": 5},
     {"received": -3, "take": 5}, {"received": 2.5, "take": 5}, {"received": 0, "take": None}],
    ids=["negative", "text", "1e400", "bool", "huge", "received alone", "take alone", "negative received",
         "fractional", "null"],
)
def test_a_threshold_control_with_bad_counts_is_refused(counts: dict) -> None:
    dev = Device("s1", 1.0, key=KEY)
    with pytest.raises(ControlError, match=r"'received'|'take'") as info:
        dev.on_control({**threshold_control("s1", 1.0, 100.0), **counts})
    assert info.value.reason == "malformed" and dev.phase is None


def test_the_pipeline_reports_in_the_phase_that_uses_each_reading_and_holds_the_rest() -> None:
    """Readings come before and between control messages: the threshold phase takes its share, oldest first; the
    others wait unperturbed, whatever is republished meanwhile; the stream phase takes them all, in order."""
    import asyncio

    from stream.device.client import _Pipeline

    async def run() -> tuple[_Pipeline, list[dict]]:
        pipe = _Pipeline(Device("s1", 1.0, key=KEY), 1000)
        await pipe.add([float(i) for i in range(30)], [float(i) for i in range(30)])
        assert len(pipe.held) == 30 and not pipe.outbox  # no control: nothing is spent
        await pipe.control(json.dumps(threshold_control("s1", 1.0, 100.0, received=0, take=8)).encode())
        assert len(pipe.outbox) == 8 and len(pipe.held) == 22
        await pipe.control(json.dumps(threshold_control("s1", 1.0, 100.0, received=3, take=5)).encode())
        await pipe.add([30.0], [30.0])
        assert len(pipe.outbox) == 8 and len(pipe.held) == 23  # republished: nothing more
        await pipe.control(json.dumps(threshold_control("s1", 1.0, 100.0, received=8, take=2)).encode())
        assert len(pipe.outbox) == 10 and len(pipe.held) == 21
        await pipe.control(json.dumps(stream_control("s1", 1.0, 50.0)).encode())
        await pipe.add([31.0], [31.0])
        await pipe.finish()
        sent = []
        while (r := await pipe.next_report()) is not None:
            sent.append(r)
            await pipe.published_one()
        return pipe, sent

    pipe, sent = asyncio.run(run())
    assert [r["phase"] for r in sent] == ["threshold"] * 10 + ["stream"] * 22
    assert [r["ts"] for r in sent] == [float(i) for i in range(32)]  # each reading once, in input order
    acc = pipe.device.account.to_dict()
    assert acc["threshold"]["readings"] == 10 and acc["stream"]["readings"] == 22


@pytest.mark.parametrize("refine", [True, False])
def test_the_server_says_what_each_round_takes_and_tells_the_devices_when_a_round_ends(refine: bool) -> None:
    """The daemon's half: ``holdout_take`` is what the current round still takes (the control message says it), and
    the end of every round but the last sets ``control_changed`` (the router then republishes the control at once),
    zoom or not; the last one ends with theta, a change of phase, which the router publishes as well."""
    from operators.topl import ToPLConfig
    from operators.topl_server import LocalServer

    srv = LocalServer(ToPLConfig(epsilon=1.0, bound=100.0, holdout=100, refine=refine))
    takes, ends = [], []
    while srv.theta is None:
        takes.append(srv.holdout_take)
        srv.observe_threshold(np.array([5.0]))
        if srv.control_changed:
            srv.control_changed = False
            ends.append(srv.received)
    assert ends == ([13, 25, 38] if refine else [])  # the round ends: 1/8, 1/4 and 3/8 of the holdout
    bounds = [0, *ends, 100]
    assert takes == [end - i for a, end in itertools.pairwise(bounds) for i in range(a, end)]
    assert srv.holdout_take == 0


def test_the_state_file_holds_the_account_and_the_reports_before_any_is_published(tmp_path: Path) -> None:
    """Write-ahead: once readings are perturbed, the file has the account, the reports (the outbox) and what is
    still held, before the publisher sees any report; a device killed then publishes the same reports after its
    restart (same seq, no new randomness) and reports the held readings once."""
    import asyncio

    from stream.device.client import _device_from_state, _Pipeline
    from stream.device.policy import DeviceState

    path = str(tmp_path / "state.json")
    control = json.dumps(threshold_control("s1", 1.0, 100.0, received=0, take=5)).encode()

    async def first() -> list[dict]:
        pipe = _Pipeline(Device("s1", 1.0, key=KEY), 100, DeviceState(path, "s1"))
        await pipe.add([float(i) for i in range(12)], [100.0 + i for i in range(12)])
        await pipe.control(control)
        return list(pipe.outbox)  # made, not yet published: the publisher has not run

    made = asyncio.run(first())
    disk = json.loads(Path(path).read_text())
    assert disk["account"]["threshold"]["readings"] == 5 and disk["outbox"] == made
    assert [ts for _, ts in disk["pending"]] == [105.0 + i for i in range(7)]
    assert disk["holdout"] == {"seen": 0, "mark": 5}

    async def after_restart() -> tuple[list[dict], DeviceState]:
        state = DeviceState(path, "s1")
        state.load()
        pipe = _Pipeline(_device_from_state("s1", DeviceLimits(max_epsilon=1.0), state), 100, state)
        await pipe.control(control)  # the retained message again: its 5 are this device's, already made
        await pipe.control(json.dumps(stream_control("s1", 1.0, 50.0)).encode())
        await pipe.finish()
        sent = []
        while (r := await pipe.next_report()) is not None:
            sent.append(r)
            await pipe.published_one()
        return sent, state

    sent, state = asyncio.run(after_restart())
    assert sent[:5] == made and [r["phase"] for r in sent[5:]] == ["stream"] * 7
    assert [r["ts"] for r in sent] == [100.0 + i for i in range(12)]
    assert state.account.to_dict()["readings"] == 12
    disk = json.loads(Path(path).read_text())
    assert disk["outbox"] == [] and disk["pending"] == [] and disk["account"]["readings"] == 12

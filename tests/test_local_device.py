"""The device side of local mode: the Device API, the control protocol, and `tops device` against a real Mosquitto."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
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
from tests.support import ROOT, DaemonProcess, Subscriber, daemon_config, free_port, leaked, tops_text, wait_for

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


# --------------------------------------------------------------------------------------------------------------
# `tops device` end to end against a real broker


def _pub(port: int, topic: str, message: dict | str) -> None:
    payload = message if isinstance(message, str) else json.dumps(message)
    args = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-t", topic, "-r", "-q", "1"]
    subprocess.run([*args, "-m", payload] if payload else [*args, "-n"], check=True, timeout=10)


def _device(port: int, stream: str, input_file: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "stream.cli", "device", "--host", "127.0.0.1", "--port", str(port)]
    return subprocess.Popen(
        [*cmd, "--stream", stream, "--input", str(input_file), "--qos", "1", "--max-epsilon", "2", *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.network
@pytest.mark.slow
def test_tops_device_follows_the_retained_control_and_never_publishes_readings(mosquitto, tmp_path: Path) -> None:
    port, stream = mosquitto.port, "meter-7"
    topic = f"meters/{stream}/report"
    rng = np.random.default_rng(4)
    first = np.round(rng.uniform(10, 90, 300), 6) + 0.000123  # distinctive decimals, easy to search for
    second = np.round(rng.uniform(10, 90, 200), 6) + 0.000456
    (tmp_path / "a.txt").write_text("".join(f"{v:.6f}\n" for v in first) + "oops\nnan\n")
    (tmp_path / "b.txt").write_text("".join(f"{v:.6f}\n" for v in second))
    total = first.size + second.size
    sub = Subscriber(port, topic)
    dev: _DeviceProc | None = None
    try:
        sub.wait_ready(topic)
        # the device starts before the daemon has published anything: it holds 50 readings and stops reading
        dev = _DeviceProc(port, stream, "--input", str(tmp_path / "a.txt"), "--max-epsilon", "2", "--buffer", "50")
        wait_for(lambda: "holding 50 readings (--buffer) until an acceptable control message" in dev.stderr(),
              what="the device holding its buffer")
        assert dev.proc.poll() is None  # still waiting for a control message
        assert sub.payloads(topic) == []
        # a threshold control of a daemon that does not say what it takes: every reading is reported in it
        _pub(port, f"tops/control/{stream}", threshold_control(stream, epsilon=1.0, bound=100.0))
        rc, out_a, err_a = dev.finish()
        assert rc == 0, err_a
        assert "does not say how many reports the server takes" in err_a
        _pub(port, f"tops/control/{stream}", stream_control(stream, epsilon=2.0, theta=40.0))
        dev = _DeviceProc(port, stream, "--input", str(tmp_path / "b.txt"), "--max-epsilon", "2")
        rc, out_b, err_b = dev.finish()
        assert rc == 0, err_b
        sub.wait_ready(topic)  # the marker: every report the devices published before it has arrived
        messages = sub.payloads(topic)
        captured = "".join(p for _, p in sub.lines)
    finally:
        if dev is not None:
            dev.kill()
        sub.close()
    assert len(messages) == total
    assert [m["phase"] for m in messages] == ["threshold"] * first.size + ["stream"] * second.size
    b = square_wave_parameters(1.0)[0]
    for m in messages[: first.size]:
        assert set(m) == {"report", "phase", "ts", "seq"} and -b * 100 <= m["report"] <= (1 + b) * 100
    for m in messages[first.size :]:
        assert set(m) == {"report", "phase", "ts", "theta", "seq"} and m["theta"] == 40.0
    # seq increases across both runs of the device (a restart does not reuse a number)
    seqs = [m["seq"] for m in messages]
    assert all(a < b for a, b in itertools.pairwise(seqs))
    # no raw reading anywhere: not in the report payloads, not in the device's output or logs
    text = captured + out_a + err_a + out_b + err_b
    assert not leaked(np.concatenate([first, second]), text)
    reports = np.array([m["report"] for m in messages])
    assert not np.isin(reports, np.concatenate([first, second])).any()
    assert "skipped 2 input lines" in err_a and "oops" not in err_a


@pytest.mark.network
def test_tops_device_gives_up_without_control_when_asked(mosquitto, tmp_path: Path) -> None:
    (tmp_path / "r.txt").write_text("1.5\n2.5\n")
    dev = _device(mosquitto.port, "silent", tmp_path / "r.txt", "--control-timeout", "1")
    _, err = dev.communicate(timeout=30)
    assert dev.returncode == 3 and "no control message within 1 s" in err
    assert "1.5" not in err and "2.5" not in err


@pytest.mark.network
def test_a_device_that_gives_up_after_a_refusal_says_why_on_one_line(mosquitto, tmp_path: Path) -> None:
    """The control message it got was refused (epsilon above the pinned limit): the exit line says so and why,
    not that no control message came."""
    (tmp_path / "r.txt").write_text("1.5\n2.5\n")
    _pub(mosquitto.port, "tops/control/greedy", stream_control("greedy", epsilon=8.0, theta=10.0))
    dev = _device(mosquitto.port, "greedy", tmp_path / "r.txt", "--control-timeout", "1",
                  "--password-file", str(_password(tmp_path)))
    _, err = dev.communicate(timeout=30)
    assert dev.returncode == 3
    (line,) = [x for x in err.splitlines() if " ERROR " in x]
    assert line.endswith("refused the control message (epsilon: control epsilon 8 is above this device's limit 2 "
                         "(--max-epsilon)); no acceptable one within 1 s"), line
    assert "no control message" not in err and "1.5" not in err and "2.5" not in err and "pw-secret" not in err


def _password(tmp_path: Path) -> Path:
    path = tmp_path / "pw"
    path.write_text("pw-secret\n")
    return path


# --------------------------------------------------------------------------------------------------------------
# the device obeys its own pinned limits, never the server (issue 9 item 2)


class _DeviceProc:
    """`tops device` reading stdin (fed by the test), stderr collected by a thread."""

    def __init__(self, port: int, stream: str, *extra: str) -> None:
        import threading

        cmd = [sys.executable, "-m", "stream.cli", "device", "--host", "127.0.0.1", "--port", str(port)]
        self.proc = subprocess.Popen(
            [*cmd, "--stream", stream, "--qos", "1", *extra],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.err: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line)

    def feed(self, values) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("".join(f"{v}\n" for v in values))
        self.proc.stdin.flush()

    def stderr(self) -> str:
        return "".join(self.err)

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        out = self.proc.stdout.read() if self.proc.stdout else ""
        rc = self.proc.wait(timeout)
        self._thread.join(5)
        return rc, out, self.stderr()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


MALICIOUS = [
    ("epsilon 60", lambda s: stream_control(s, epsilon=60.0, theta=1000.0)),
    ("threshold epsilon too high", lambda s: threshold_control(s, epsilon=5.0, bound=1000.0)),
    ("bound changed", lambda s: threshold_control(s, epsilon=1.0, bound=5000.0)),
    ("bound changed, pinned on first use", lambda s: threshold_control(s, epsilon=1.0, bound=999.0)),
    ("theta outside the bound", lambda s: stream_control(s, epsilon=1.0, theta=5000.0)),
    ("unknown mechanism", lambda s: {**stream_control(s, 1.0, 100.0), "mechanism": "identity"}),
    ("garbage", lambda s: f'{{"stream": "{s}", "phase": "stream", "epsilon": 1e400, "theta": 10}}'),
    ("NaN", lambda s: f'{{"stream": "{s}", "phase": "stream", "epsilon": NaN, "theta": 10}}'),
    ("not JSON", lambda s: "}{ not json at all"),
    ("huge integer", lambda s: f'{{"stream": "{s}", "phase": "threshold", "epsilon": 1, "bound": 1{"0" * 400}}}'),
]


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.parametrize(("name", "make"), MALICIOUS, ids=[m[0] for m in MALICIOUS])
def test_a_control_above_the_pinned_limits_gets_no_report(mosquitto, tmp_path: Path, name: str, make) -> None:
    """The retained control message is the attacker's: the device sends nothing until an acceptable one comes."""
    port, stream = mosquitto.port, "meter-9"
    report_topic = f"meters/{stream}/report"
    sub = Subscriber(port, "meters/#")
    sub.wait_ready("meters/probe")
    state = tmp_path / "device.json"
    secret = [123.456789, 777.654321, 42.424242, *(round(500.000123 + 1.000001 * i, 6) for i in range(30))]
    limits = ["--max-epsilon", "1", "--max-threshold-epsilon", "1", "--state-file", str(state),
              "--buffer", str(len(secret))]
    if "first use" not in name:
        limits += ["--bound", "1000"]
    dev = _DeviceProc(port, stream, *limits)
    try:
        # an honest threshold phase first: the device reports, then the server turns malicious mid-stream
        _pub(port, f"tops/control/{stream}", threshold_control(stream, epsilon=1.0, bound=1000.0))
        honest = [round(12.345678 + 1.000001 * i, 6) for i in range(20)]
        dev.feed(f"{v:.6f}" for v in honest)
        wait_for(lambda: len(sub.payloads(report_topic)) == 20, what="the honest reports")
        bad = make(stream)
        _pub(port, f"tops/control/{stream}", bad if isinstance(bad, str) else json.dumps(bad))
        wait_for(lambda: "refusing control message" in dev.stderr(), what="the refusal")
        dev.feed(f"{v:.6f}" for v in secret)
        # the device has taken every secret reading and holds them (none perturbed, so none can be published);
        # then a marker on the report topic: whatever the device published before it has arrived
        wait_for(lambda: f"holding {len(secret)} readings (--buffer) until an acceptable control" in dev.stderr(),
              what="the device holding the readings")
        sub.wait_ready(report_topic)
        assert len(sub.payloads(report_topic)) == 20, "a report went out under a refused control message"
        doc = json.loads(state.read_text()) if state.exists() else {}
        assert doc.get("refused", 0) >= 1
        # an acceptable control message: the held readings are reported under it, once each
        _pub(port, f"tops/control/{stream}", stream_control(stream, epsilon=0.5, theta=600.0))
        total = 20 + len(secret)
        wait_for(lambda: len(sub.payloads(report_topic)) == total, what="the reports under the acceptable control")
        rc, out, err = dev.finish()
        assert rc == 0, err
        sub.wait_ready(report_topic)  # the marker: nothing the device published is still on its way
        msgs = sub.payloads(report_topic)
        assert len(msgs) == total
        assert [m["phase"] for m in msgs] == ["threshold"] * 20 + ["stream"] * len(secret)
        assert all(m["theta"] == 600.0 for m in msgs[20:])
        seqs = [m["seq"] for m in msgs]
        assert seqs == sorted(seqs) and len(set(seqs)) == total
        text = out + err + "".join(p for _, p in sub.lines)
        assert not leaked([*honest, *secret], text)
        assert not {m["report"] for m in msgs} & {*honest, *secret}
        # the device's own account: every reading reported once, at the epsilon actually used
        doc = json.loads(state.read_text())
        acc = doc["account"]
        assert acc["threshold"] == {"readings": 20, "max_epsilon": 1.0, "total_epsilon": 20.0}
        assert acc["stream"] == {"readings": len(secret), "max_epsilon": 0.5, "total_epsilon": 0.5 * len(secret)}
        assert acc["readings"] == total and acc["max_epsilon_per_reading"] == 1.0
        assert "account:" in err and f"{total} readings" in err
    finally:
        dev.kill()
        sub.close()


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


def _tops_device(*args: str) -> subprocess.CompletedProcess[str]:
    return tops_text("device", "--host", "127.0.0.1", "--port", "1", "--stream", "m1", *args, timeout=60, stdin="")


def test_tops_device_without_max_epsilon_refuses_to_start_with_one_line(tmp_path: Path) -> None:
    r = _tops_device()
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "--max-epsilon is required" in r.stderr
    bad = _tops_device("--max-epsilon", "nan", "--max-threshold-epsilon", "100", "--bound", "-1", "--buffer", "0")
    lines = bad.stderr.splitlines()
    assert bad.returncode == 2 and len(lines) == 4, bad.stderr
    assert all(line.startswith("tops device: error: ") for line in lines)
    assert any("--max-epsilon must be" in x for x in lines) and any("--max-threshold-epsilon" in x for x in lines)
    assert any("--bound" in x for x in lines) and any("--buffer" in x for x in lines)
    # the limits may come from a file; the file's problems are one line each
    (tmp_path / "limits.toml").write_text('max_epsilon = 0.5\nbound = 100.0\nmechanisms = ["hybrid", "x"]\nfoo = 1\n')
    r = _tops_device("--limits", str(tmp_path / "limits.toml"))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 2, r.stderr
    assert "unknown key 'foo'" in r.stderr and "mechanisms must be" in r.stderr
    (tmp_path / "state.json").write_text('{"stream": "other"}')
    r = _tops_device("--max-epsilon", "1", "--state-file", str(tmp_path / "state.json"))
    assert r.returncode == 2 and "another stream" in r.stderr and len(r.stderr.splitlines()) == 1


@pytest.mark.network
def test_tops_device_with_a_limits_file_refuses_a_threshold_control_above_it(mosquitto, tmp_path: Path) -> None:
    port, stream = mosquitto.port, "meter-5"
    (tmp_path / "limits.toml").write_text("max_epsilon = 2.0\nmax_threshold_epsilon = 0.5\nbound = 100.0\n")
    sub = Subscriber(port, "meters/#")
    sub.wait_ready("meters/probe")
    state = tmp_path / "s.json"
    dev = _DeviceProc(port, stream, "--limits", str(tmp_path / "limits.toml"), "--state-file", str(state),
                      "--buffer", "3")
    try:
        _pub(port, f"tops/control/{stream}", threshold_control(stream, epsilon=1.0, bound=100.0))
        dev.feed(["11.123457", "22.234568", "33.345679"])
        wait_for(lambda: "refusing control message (threshold_epsilon)" in dev.stderr(), what="the refusal")
        wait_for(lambda: "holding 3 readings (--buffer) until an acceptable control" in dev.stderr(),
              what="the device holding the readings")
        sub.wait_ready(f"meters/{stream}/report")  # the marker: whatever the device published has arrived
        assert sub.payloads(f"meters/{stream}/report") == []
        _pub(port, f"tops/control/{stream}", threshold_control(stream, epsilon=0.5, bound=100.0))
        wait_for(lambda: len(sub.payloads(f"meters/{stream}/report")) == 3, what="reports at the allowed epsilon")
        rc, _, err = dev.finish()
        assert rc == 0, err
        doc = json.loads(state.read_text())
        assert doc["refused"] == 1 and doc["account"]["threshold"]["max_epsilon"] == 0.5
        assert doc["limits"]["max_threshold_epsilon"] == 0.5 and doc["bound"] == 100.0
        assert len([x for x in err.splitlines() if "refusing control message" in x]) == 1
        assert "11.123457" not in err and "22.234568" not in err and "33.345679" not in err
    finally:
        dev.kill()
        sub.close()


# --------------------------------------------------------------------------------------------------------------
# the device consumes its readings phase by phase: what the holdout takes, then the rest in the stream phase


@pytest.mark.network
def test_a_device_fed_from_a_file_spends_only_on_reports_the_daemon_uses(mosquitto, tmp_path: Path) -> None:
    """400 readings from a file, a real daemon in local mode with a holdout of 100: the device reports 100 in the
    threshold phase (round by round, as the control message says), holds the other 300 unspent until theta is
    chosen, then reports them in the stream phase. The account equals the readings used, no report is stale, and
    the 300 stream reports are 300 releases."""
    port, stream, holdout, n = mosquitto.port, "meter-3", 100, 400
    readings = np.round(np.random.default_rng(8).gamma(2.0, 6.0, n) + 0.123457, 6)
    source = tmp_path / "readings.txt"
    source.write_text("".join(f"{v:.6f}\n" for v in readings))
    mport = free_port()
    cfg = daemon_config(
        tmp_path, port, mport, input={"topics": ["meters/+/report"]},
        streams={"mode": "local", "template": {"epsilon": 1.0, "bound": 100.0, "holdout": holdout}},
        local={"streams": [stream]},
    )
    daemon = DaemonProcess(cfg, mport, tmp_path)
    releases = Subscriber(port, "dp/#")
    controls = Subscriber(port, f"tops/control/{stream}")
    state = tmp_path / "device.json"
    dev: subprocess.Popen[str] | None = None
    try:
        daemon.wait_connected()
        releases.wait_ready("dp/probe")
        dev = _device(port, stream, source, "--state-file", str(state), "--status-interval", "0")
        out, err = dev.communicate(timeout=120)
        assert dev.returncode == 0, err
        acc = json.loads(state.read_text())["account"]
        assert acc["threshold"]["readings"] == holdout and acc["stream"]["readings"] == n - holdout
        assert acc["readings"] == n
        wait_for(lambda: len(releases.payloads(f"dp/{stream}")) >= n - holdout, 60, what="the stream releases")
        m = daemon.metrics()
        assert daemon.stop() == 0
    finally:
        if dev is not None and dev.poll() is None:
            dev.kill()
            dev.wait(10)
        daemon.kill()
        releases.close()
        controls.close()
    # the control messages said what each round takes: rounds end after 13, 25 and 100 reports (refine's 1/8, 1/4)
    said = [json.loads(p) for _, p in controls.lines]
    assert said[0]["phase"] == "threshold" and (said[0]["received"], said[0]["take"]) == (0, 13)
    assert {c["received"] + c["take"] for c in said if c["phase"] == "threshold"} == {13, 25, 100}
    assert said[-1]["phase"] == "stream"
    assert m.get("tops_readings_total{result=invalid}", 0) == 0
    assert "stale report" not in daemon.stderr()
    assert len([p for p in releases.payloads(f"dp/{stream}") if "value" in p]) == n - holdout
    assert not leaked(readings, out + err)


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


def _held_run(port: int, stream: str, source: Path, state: Path) -> tuple[_DeviceProc, Subscriber]:
    """A device on ``source`` (12 readings) under a threshold control that takes 5: it reports 5 and holds 7."""
    sub = Subscriber(port, f"meters/{stream}/report")
    sub.wait_ready(f"meters/{stream}/report")
    _pub(port, f"tops/control/{stream}", {**threshold_control(stream, 1.0, 100.0), "received": 0, "take": 5})
    dev = _DeviceProc(port, stream, "--input", str(source), "--max-epsilon", "2", "--state-file", str(state),
                      "--buffer", "7", "--status-interval", "0")
    try:
        wait_for(lambda: len(sub.payloads(f"meters/{stream}/report")) >= 5, what="the threshold reports")
        wait_for(lambda: "holding 7 readings" in dev.stderr(), what="the device holding the other 7")
        sub.wait_ready(f"meters/{stream}/report")  # the marker: nothing more is on its way
        assert len(sub.payloads(f"meters/{stream}/report")) == 5
    except BaseException:
        dev.kill()
        sub.close()
        raise
    return dev, sub


def _continue_run(port: int, stream: str, source: Path, state: Path, sub) -> tuple[int, str]:
    """The device again on the same file and state: the retained control still takes 5 from received 0 (its 5 are
    counted by its holdout share: it sends none), then the stream control takes what it holds."""
    dev = _DeviceProc(port, stream, "--input", str(source), "--max-epsilon", "2", "--state-file", str(state),
                      "--status-interval", "0")
    try:
        wait_for(lambda: "phase threshold" in dev.stderr(), what="the restarted device following the retained control")
        assert "sends up to 0 reports now" in dev.stderr()
        _pub(port, f"tops/control/{stream}", stream_control(stream, 1.0, 40.0))
        rc, _, err = dev.finish()
    finally:
        dev.kill()
    return rc, err


@pytest.mark.network
@pytest.mark.parametrize("stop", ["SIGTERM", "kill -9"])
def test_a_restarted_device_reports_each_reading_of_its_file_once(mosquitto, tmp_path: Path, stop: str) -> None:
    """Stopped while it holds readings for the stream phase (SIGTERM, or kill -9 after its reports went out), a
    device restarted on the same file and state file reports the held readings once, in the stream phase, and
    does not read the file's readings again: 12 readings, 12 distinct reports, an account of 12."""
    import signal

    port, stream = mosquitto.port, "meter-4"
    readings = [round(31.000123 + 1.000001 * i, 6) for i in range(12)]
    source, state = tmp_path / "r.txt", tmp_path / "device.json"
    source.write_text("".join(f"{v:.6f}\n" for v in readings))
    dev, sub = _held_run(port, stream, source, state)
    try:
        if stop == "SIGTERM":
            dev.proc.send_signal(signal.SIGTERM)
            assert dev.proc.wait(30) == 0
            assert "7 readings held unreported and 0 reports unpublished: kept in the state file" in dev.stderr()
            saved = json.loads(state.read_text())
            held, unpublished = len(saved["pending"]), len(saved["outbox"])  # counts only: never print a reading
            assert (held, unpublished) == (7, 0)
            assert saved["input"]["offset"] == source.stat().st_size
        else:
            dev.proc.kill()
            dev.proc.wait(10)
        first_err = dev.stderr()
        rc, err = _continue_run(port, stream, source, state, sub)
        assert rc == 0, err
        assert "continuing the input file at byte" in err
        sub.wait_ready(f"meters/{stream}/report")  # the marker: every report published before it has arrived
        msgs = sub.payloads(f"meters/{stream}/report")
    finally:
        dev.kill()
        sub.close()
    by_seq = {m["seq"]: m for m in msgs}
    assert len(by_seq) == 12, "a reading was lost or reported twice"
    assert all(by_seq[m["seq"]] == m for m in msgs)  # a report republished after kill -9 is the same report
    assert [m["phase"] for m in sorted(by_seq.values(), key=lambda m: m["seq"])] == ["threshold"] * 5 + ["stream"] * 7
    acc = json.loads(state.read_text())["account"]
    assert acc["threshold"]["readings"] == 5 and acc["stream"]["readings"] == 7 and acc["readings"] == 12
    assert not leaked(readings, first_err + err)


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
    assert ends == ([13, 25] if refine else [])
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

"""The device side of local mode: the Device API, the control protocol, and `tops device` against a real Mosquitto."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
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

REPO = Path(__file__).resolve().parents[1]
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
    time.sleep(0.002)  # a restart takes longer than the 1,000 microseconds this batch ran ahead of the clock
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


MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def device_broker(tmp_path: Path) -> Iterator[int]:
    """An open Mosquitto on a free loopback port (`listener PORT 127.0.0.1`, `allow_anonymous true`)."""
    if not Path(MOSQUITTO).exists() or not shutil.which("mosquitto_pub"):
        pytest.skip("mosquitto and mosquitto-clients are not installed (.ci/run installs them)")
    port = _free_port()
    conf = tmp_path / "mosquitto.conf"
    user = "user root\n" if os.geteuid() == 0 else ""
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n{user}")
    log = (tmp_path / "mosquitto.log").open("wb")
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def leaked(values, text: str) -> list[str]:
    """The raw readings written whole anywhere in `text` (as `%.6f` or as Python prints them).

    Whole numbers only: a noisy report such as 16.94269895 starts with the digits of the reading 16.94269 by
    chance (it did once in CI: roughly one run in a hundred), and that is not a leak.
    """
    numbers = set(NUMBER.findall(text))
    return [s for v in values for s in (f"{v:.6f}", repr(float(v))) if s in numbers]


SUB_ARGS = ("-q", "1", "-W", "60", "-C")  # QoS 1, give up after 60 s, exit after this many messages:


def _pub(port: int, topic: str, message: dict | str) -> None:
    payload = message if isinstance(message, str) else json.dumps(message)
    args = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-t", topic, "-r", "-q", "1"]
    subprocess.run([*args, "-m", payload] if payload else [*args, "-n"], check=True, timeout=10)


def _device(port: int, stream: str, input_file: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "stream.cli", "device", "--host", "127.0.0.1", "--port", str(port)]
    return subprocess.Popen(
        [*cmd, "--stream", stream, "--input", str(input_file), "--qos", "1", "--max-epsilon", "2", *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.network
@pytest.mark.slow
def test_tops_device_follows_the_retained_control_and_never_publishes_readings(
    device_broker: int, tmp_path: Path
) -> None:
    port, stream = device_broker, "meter-7"
    rng = np.random.default_rng(4)
    first = np.round(rng.uniform(10, 90, 300), 6) + 0.000123  # distinctive decimals, easy to search for
    second = np.round(rng.uniform(10, 90, 200), 6) + 0.000456
    (tmp_path / "a.txt").write_text("".join(f"{v:.6f}\n" for v in first) + "oops\nnan\n")
    (tmp_path / "b.txt").write_text("".join(f"{v:.6f}\n" for v in second))
    total = first.size + second.size
    sub = subprocess.Popen(
        ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-t", f"meters/{stream}/report", *SUB_ARGS, str(total)],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.3)
    # the device starts before the daemon has published anything: it holds 50 readings and stops reading
    dev = _device(port, stream, tmp_path / "a.txt", "--buffer", "50")
    time.sleep(1.5)
    assert dev.poll() is None  # still waiting for a control message
    _pub(port, f"tops/control/{stream}", threshold_control(stream, epsilon=1.0, bound=100.0))
    out_a, err_a = dev.communicate(timeout=60)
    assert dev.returncode == 0, err_a
    _pub(port, f"tops/control/{stream}", stream_control(stream, epsilon=2.0, theta=40.0))
    dev = _device(port, stream, tmp_path / "b.txt")
    out_b, err_b = dev.communicate(timeout=60)
    assert dev.returncode == 0, err_b
    captured, _ = sub.communicate(timeout=60)
    lines = captured.splitlines()
    assert len(lines) == total
    messages = [json.loads(line) for line in lines]
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
def test_tops_device_gives_up_without_control_when_asked(device_broker: int, tmp_path: Path) -> None:
    (tmp_path / "r.txt").write_text("1.5\n2.5\n")
    dev = _device(device_broker, "silent", tmp_path / "r.txt", "--control-timeout", "1")
    _, err = dev.communicate(timeout=30)
    assert dev.returncode == 3 and "no control message" in err
    assert "1.5" not in err and "2.5" not in err


# --------------------------------------------------------------------------------------------------------------
# the device obeys its own pinned limits, never the server (issue 9 item 2)


class _DeviceProc:
    """`tops device` reading stdin (fed by the test), stderr collected by a thread."""

    def __init__(self, port: int, stream: str, *extra: str) -> None:
        import threading

        cmd = [sys.executable, "-m", "stream.cli", "device", "--host", "127.0.0.1", "--port", str(port)]
        self.proc = subprocess.Popen(
            [*cmd, "--stream", stream, "--qos", "1", *extra],
            cwd=REPO,
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


def _wait(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


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
    from tests.conftest import Subscriber

    port, stream = mosquitto.port, "meter-9"
    report_topic = f"meters/{stream}/report"
    sub = Subscriber(port, "meters/#")
    sub.wait_ready("meters/probe")
    state = tmp_path / "device.json"
    limits = ["--max-epsilon", "1", "--max-threshold-epsilon", "1", "--state-file", str(state)]
    if "first use" not in name:
        limits += ["--bound", "1000"]
    dev = _DeviceProc(port, stream, *limits)
    try:
        # an honest threshold phase first: the device reports, then the server turns malicious mid-stream
        _pub(port, f"tops/control/{stream}", threshold_control(stream, epsilon=1.0, bound=1000.0))
        honest = [round(12.345678 + 1.000001 * i, 6) for i in range(20)]
        dev.feed(f"{v:.6f}" for v in honest)
        _wait(lambda: len(sub.payloads(report_topic)) == 20, what="the honest reports")
        bad = make(stream)
        _pub(port, f"tops/control/{stream}", bad if isinstance(bad, str) else json.dumps(bad))
        _wait(lambda: "refusing control message" in dev.stderr(), what="the refusal")
        secret = [123.456789, 777.654321, 42.424242, *(round(500.000123 + 1.000001 * i, 6) for i in range(30))]
        dev.feed(f"{v:.6f}" for v in secret)
        time.sleep(2.5)  # bounded wait: whatever the device would send has had time to arrive
        assert len(sub.payloads(report_topic)) == 20, "a report went out under a refused control message"
        doc = json.loads(state.read_text()) if state.exists() else {}
        assert doc.get("refused", 0) >= 1
        # an acceptable control message: the held readings are reported under it, once each
        _pub(port, f"tops/control/{stream}", stream_control(stream, epsilon=0.5, theta=600.0))
        total = 20 + len(secret)
        _wait(lambda: len(sub.payloads(report_topic)) == total, what="the reports under the acceptable control")
        rc, out, err = dev.finish()
        assert rc == 0, err
        time.sleep(0.3)
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
    cmd = [sys.executable, "-m", "stream.cli", "device", "--host", "127.0.0.1", "--port", "1", "--stream", "m1"]
    return subprocess.run([*cmd, *args], cwd=REPO, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


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
    from tests.conftest import Subscriber

    port, stream = mosquitto.port, "meter-5"
    (tmp_path / "limits.toml").write_text("max_epsilon = 2.0\nmax_threshold_epsilon = 0.5\nbound = 100.0\n")
    sub = Subscriber(port, "meters/#")
    sub.wait_ready("meters/probe")
    state = tmp_path / "s.json"
    dev = _DeviceProc(port, stream, "--limits", str(tmp_path / "limits.toml"), "--state-file", str(state))
    try:
        _pub(port, f"tops/control/{stream}", threshold_control(stream, epsilon=1.0, bound=100.0))
        dev.feed(["11.123457", "22.234568", "33.345679"])
        _wait(lambda: "refusing control message (threshold_epsilon)" in dev.stderr(), what="the refusal")
        time.sleep(1.5)
        assert sub.payloads(f"meters/{stream}/report") == []
        _pub(port, f"tops/control/{stream}", threshold_control(stream, epsilon=0.5, bound=100.0))
        _wait(lambda: len(sub.payloads(f"meters/{stream}/report")) == 3, what="reports at the allowed epsilon")
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

"""The device side of local mode: the Device API, the control protocol, and `tops device` against a real Mosquitto."""

from __future__ import annotations

import json
import math
import os
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
from stream.device import (
    ADDRESS_HYBRID,
    ADDRESS_SQUARE_WAVE,
    ControlError,
    Device,
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
def test_bad_control_is_rejected_and_the_previous_one_kept(message, match: str) -> None:
    dev = Device("s1", key=KEY)
    dev.on_control(stream_control("s1", 1.0, 5.0))
    with pytest.raises(ControlError, match=match):
        dev.on_control(message)
    assert dev.phase == "stream" and dev.control is not None and dev.control.theta == 5.0


def test_no_reports_before_a_control_message_and_after_it_is_withdrawn() -> None:
    dev = Device("s1", key=KEY)
    with pytest.raises(RuntimeError, match="no control"):
        dev.perturb([1.0])
    dev.on_control(threshold_control("s1", 1.0, 10.0))
    assert len(dev.perturb([1.0, 2.0])) == 2
    assert dev.on_control(b"") is None and dev.phase is None
    with pytest.raises(RuntimeError):
        dev.perturb([1.0])


def test_reports_use_the_devices_keystream_and_never_reuse_it() -> None:
    dev = Device("s1", key=KEY)
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
    a, b = Device("s1"), Device("s1")
    for dev in (a, b):
        dev.on_control(stream_control("s1", 1.0, 10.0))
    x = np.full(64, 5.0)
    assert not np.array_equal(a.perturb_values(x), b.perturb_values(x))
    assert "secret" in repr(a._gen) and KEY.hex() not in repr(a)


@pytest.mark.slow
def test_stream_reports_are_unbiased_for_the_truncated_readings() -> None:
    dev = Device("s1", key=KEY)
    dev.on_control(stream_control("s1", 1.0, 10.0))
    readings = np.random.default_rng(1).exponential(4.0, 200_000)
    reports = dev.perturb_values(readings)
    sd = 10.0 / 2 * math.sqrt(hybrid_worst_case_variance(1.0) / readings.size)
    assert abs(reports.mean() - np.minimum(readings, 10.0).mean()) <= 4.5 * sd


def test_report_messages() -> None:
    dev = Device("s1", key=KEY)
    dev.on_control(threshold_control("s1", 1.0, 10.0))
    r = dev.perturb([3.0, 4.0], ts=[1.5, 2.5])
    assert [set(m) for m in r] == [{"report", "phase", "ts"}] * 2
    assert [m["ts"] for m in r] == [1.5, 2.5] and {m["phase"] for m in r} == {"threshold"}
    dev.on_control(stream_control("s1", 1.0, 6.0))
    (m,) = dev.perturb([3.0], ts=9.0)
    assert set(m) == {"report", "phase", "ts", "theta"} and m["theta"] == 6.0 and m["phase"] == "stream"
    json.dumps(m)  # JSON-ready
    for control in (threshold_control("s1", 0.7, 30.0), stream_control("s1", 3.0, 6.0)):
        dev.on_control(control)
        lo, hi = parse_control(control).report_range()
        values = dev.perturb_values(np.linspace(0, 50, 5000))
        assert lo <= values.min() and values.max() <= hi
    with pytest.raises(ValueError, match="finite and non-negative"):
        dev.perturb([-1.0])
    with pytest.raises(ValueError, match="stream name"):
        Device("a/#")


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


SUB_ARGS = ("-q", "1", "-W", "60", "-C")  # QoS 1, give up after 60 s, exit after this many messages:


def _pub(port: int, topic: str, message: dict | str) -> None:
    payload = message if isinstance(message, str) else json.dumps(message)
    args = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-t", topic, "-r", "-q", "1"]
    subprocess.run([*args, "-m", payload] if payload else [*args, "-n"], check=True, timeout=10)


def _device(port: int, stream: str, input_file: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "stream.cli", "device", "--host", "127.0.0.1", "--port", str(port)]
    return subprocess.Popen(
        [*cmd, "--stream", stream, "--input", str(input_file), "--qos", "1", *extra],
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
    (tmp_path / "a.txt").write_text("".join(f"{v:.6f}\n" for v in first) + "oops\n-3\n")
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
        assert set(m) == {"report", "phase", "ts"} and -b * 100 <= m["report"] <= (1 + b) * 100
    for m in messages[first.size :]:
        assert set(m) == {"report", "phase", "ts", "theta"} and m["theta"] == 40.0
    # no raw reading anywhere: not in the report payloads, not in the device's output or logs
    text = captured + out_a + err_a + out_b + err_b
    for v in np.concatenate([first, second]):
        assert f"{v:.6f}" not in text and repr(float(v)) not in text
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

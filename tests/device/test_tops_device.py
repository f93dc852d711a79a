"""`tops device` as a process: it follows the retained control of a real Mosquitto, refuses a control above its
pinned limits, gives up in one line, never publishes a reading, spends only on reports the daemon uses, and reports
each reading of its file once across restarts."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from operators.local import square_wave_parameters
from stream.device.client import (
    stream_control,
    threshold_control,
)
from tests.support import ROOT, DaemonProcess, Subscriber, daemon_config, free_port, leaked, tops_text, wait_for


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
    # the control messages said what each round takes: rounds end after 13, 25, 38 and 100 reports (1/8, 1/4, 3/8)
    said = [json.loads(p) for _, p in controls.lines]
    assert said[0]["phase"] == "threshold" and (said[0]["received"], said[0]["take"]) == (0, 13)
    assert {c["received"] + c["take"] for c in said if c["phase"] == "threshold"} == {13, 25, 38, 100}
    assert said[-1]["phase"] == "stream"
    assert m.get("tops_readings_total{result=invalid}", 0) == 0
    assert "stale report" not in daemon.stderr()
    assert len([p for p in releases.payloads(f"dp/{stream}") if "value" in p]) == n - holdout
    assert not leaked(readings, out + err)


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

"""A reader of stdout that goes away (``tops run ... | head``) ends the run as a signal would: what was accepted is
drained and checkpointed, the exit code is 0, and stderr has one line saying why, never a traceback. When the broker
is a sink too, the releases go on there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, DaemonProcess, Subscriber, daemon_config, free_port, publish, stdin_config, wait_for


def test_the_reader_of_stdout_going_away_stops_the_run_cleanly(tmp_path: Path) -> None:
    config = stdin_config(tmp_path)
    lines = "".join(f"m{i % 500},{i % 90}\n" for i in range(200_000)).encode()
    log = tmp_path / "stderr.txt"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config", str(config)], cwd=ROOT,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(lines[: len(lines) // 2])
    proc.stdin.flush()
    first = proc.stdout.readline()  # the first status line: the daemon is writing
    proc.stdout.close()  # the reader goes away (what `head -1` does)
    try:
        proc.stdin.write(lines[len(lines) // 2 :])
        proc.stdin.close()
    except BrokenPipeError:  # the daemon stopped reading first: as good
        pass
    proc.wait(timeout=60)
    stderr = log.read_text()
    assert first.startswith(b"{")
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert proc.returncode == 0
    assert "the reader of stdout went away" in stderr
    restarted = subprocess.run([sys.executable, "-m", "stream.cli", "state", "--config", str(config)], cwd=ROOT,
                               capture_output=True, text=True, timeout=60, check=False)
    assert restarted.returncode == 0, restarted.stderr  # the store was closed cleanly: it opens again


@pytest.mark.network
def test_with_the_broker_a_sink_too_releases_go_on_there_after_the_reader_of_stdout_went_away(mosquitto,
                                                                                                tmp_path: Path) -> None:
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, output={"sinks": ["stdout", "mqtt"], "status_topic": ""})
    daemon = DaemonProcess(cfg, mport, tmp_path, stdout=subprocess.PIPE)
    sub = Subscriber(mosquitto.port, "dp/a")
    try:
        daemon.wait_connected()
        sub.wait_ready("dp/a")
        publish(mosquitto.port, "meters/a/reading", [str(i % 90) for i in range(100)])
        assert daemon.proc.stdout is not None
        assert daemon.proc.stdout.readline().startswith(b"{")  # stdout is written
        daemon.proc.stdout.close()  # and its reader goes away
        publish(mosquitto.port, "meters/a/reading", [str(i % 90) for i in range(100, 300)])
        wait_for(lambda: len([p for p in sub.payloads() if "tick" in p]) >= 250, 30, what="every release on the broker")
        assert sorted(p["tick"] for p in sub.payloads() if "tick" in p) == list(range(50, 300))
        wait_for(lambda: "releases go on to the broker only" in daemon.stderr(), 10, what="the note on stderr")
        assert daemon.proc.poll() is None  # still running
        # stdout's count stops at what it wrote; the broker's comes to every release
        m = wait_for(lambda: (m := daemon.metrics())["tops_releases_total{sink=mqtt}"] >= 250 and m, 20,
                     what="the broker's count")
        assert m["tops_releases_total{sink=mqtt}"] == 250 and m["tops_releases_total{sink=stdout}"] < 250
        assert daemon.stop() == 0
    finally:
        sub.close()
        daemon.kill()
    assert "Traceback" not in daemon.stderr()


def test_a_closed_stream_is_a_reader_gone_and_any_other_error_is_raised() -> None:
    """The sink takes a closed stream for a reader that went away (its lines dropped from then on), but a ValueError
    of a stream that is still open is a bug: it is raised, not taken for a closed pipe."""
    import io

    from stream.core.sinks import StdoutSink

    closed = io.StringIO()
    sink = StdoutSink(closed)
    sink.write_lines([b'{"a":1}\n'])
    closed.close()
    sink.write_lines([b'{"a":2}\n'])
    assert sink.gone

    class Refusing(io.StringIO):
        def write(self, s: str) -> int:
            msg = "not a closed stream"
            raise ValueError(msg)

    with pytest.raises(ValueError, match="not a closed stream"):
        StdoutSink(Refusing()).write_lines([b'{"a":1}\n'])

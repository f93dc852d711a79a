"""A reader of stdout that goes away (``tops run ... | head``) ends the run as a signal would: what was accepted is
drained and checkpointed, the exit code is 0, and stderr has one line saying why, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, stdin_config


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

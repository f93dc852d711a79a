"""Streams changing phase are logged by name only for the first few per window; the rest are counted in one line,
so that a fleet starting does not log two lines per stream (and every change is still accounted for). The
start's own objects are kept out of the garbage collector's full passes (their pauses grow with the heap).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stream.daemon.phaselog import PhaseLog
from tests.support import ROOT, write_toml


def test_a_burst_of_phase_changes_is_named_then_counted(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    pl = PhaseLog(burst=3, window=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="tops"):
        for i in range(50):
            pl.note(f"m{i}", "holdout" if i < 30 else "releasing")
        pl.roll()  # the window is not over: nothing yet
        assert len(caplog.records) == 3
        now[0] = 10.5
        pl.roll()
        pl.note("late", "failed")  # a new window: named again
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:3] == ["stream 'm0': holdout", "stream 'm1': holdout", "stream 'm2': holdout"]
    assert lines[3].startswith("47 more streams changed phase in the last 10 s (holdout 27, releasing 20)")
    assert lines[4] == "stream 'late': failed"



@pytest.mark.parametrize("first", [0, 2, 5])
def test_a_steps_phase_changes_noted_together_are_noted_as_one_by_one(caplog: pytest.LogCaptureFixture,
                                                                      first: int) -> None:
    """``note_many`` (a processing step's changes) logs and counts what :meth:`PhaseLog.note` does change by change,
    whether the burst is untouched, partly used or used up by the changes before."""
    runs = []
    for together in (True, False):
        caplog.clear()
        pl = PhaseLog(burst=3, window=10.0, clock=lambda: 0.0)
        with caplog.at_level(logging.INFO, logger="tops"):
            for i in range(first):
                pl.note(f"early{i}", "holdout")
            changes = [(f"m{i}", ["holdout", "releasing", "failed"][i % 3]) for i in range(40)]
            if together:
                pl.note_many(changes)
                pl.note_many([])
            else:
                for name, phase in changes:
                    pl.note(name, phase)
            pl.roll(final=True)
        runs.append([r.getMessage() for r in caplog.records])
    assert runs[0] == runs[1]
    assert len(runs[0]) == 4 and runs[0][-1].startswith(f"{40 + first - 3} more streams changed phase")


def test_a_stream_born_and_out_of_its_holdout_in_one_step_logs_each_phase_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Four readings on stdin, holdout 2: the stream is created and leaves its holdout while processing one chunk.
    Its log says "holdout", then "releasing", each once (the change is noted with the phase it made, not the phase
    the stream has when the step's notes are written)."""
    import asyncio
    import io

    from stream.core.config import build_config
    from stream.daemon.service import Daemon

    cfg = build_config({"metrics": {"port": 0}, "state": {"data_dir": ""},
                        "streams": {"key_file": str(tmp_path / "k"),
                                    "template": {"epsilon": 1.0, "bound": 10.0, "holdout": 2, "query_range": 16,
                                                 "fanout": 4}}})
    out = io.StringIO()
    daemon = Daemon(cfg, stdin=io.BytesIO(b"1\n2\n3\n4\n"), stdout=out, install_signals=False)
    with caplog.at_level(logging.INFO, logger="tops"):
        assert asyncio.run(daemon.serve()) == 0
    phases = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stream 'default'")]
    assert phases == ["stream 'default': holdout", "stream 'default': releasing"], phases
    assert len(out.getvalue().splitlines()) == 2


class RefiningReports:
    """A local stream's operator in its holdout: reports, a refined control after two, its phase after four."""

    takes_reports = True

    def __init__(self) -> None:
        self.reports, self.control_changed = 0, False

    @property
    def phase(self) -> str:
        return "holdout" if self.reports < 4 else "releasing"

    def observe_threshold(self, values) -> None:
        self.reports += len(values)
        self.control_changed = self.reports == 2


def test_a_status_that_changes_no_phase_is_not_noted_as_a_phase_change() -> None:
    """The router keeps, with each status it sends at once, the phase its change made: a new control message (the
    holdout's finer round) is a status, not a phase change (None), and is not logged as one."""
    from stream.core.router import Router

    r = Router(lambda _: RefiningReports(), max_streams=2)
    rec = r.record("d")
    for i in range(4):
        assert r.add(rec, 1.0, None, i, 0.0) == "ok"
    assert [(x.name, phase) for x, phase in r.status_now] == [("d", "holdout"), ("d", None), ("d", "releasing")]


def test_a_fleet_starting_logs_a_bounded_number_of_lines(tmp_path: Path) -> None:
    """The attack: 2,000 new streams through their holdout on stdin. Before, 4,000 lines (one per stream and phase);
    now at most the burst named plus the counts, and the counts add up to every change."""
    cfg = write_toml(tmp_path / "tops.toml", {
        "input": {"source": "stdin"}, "output": {"sinks": ["stdout"]},
        "streams": {"key_file": str(tmp_path / "k"), "max_streams": 5000,
                    "template": {"epsilon": 1.0, "bound": 100.0, "holdout": 3, "query_range": 64, "fanout": 4}},
        "state": {"data_dir": ""}, "metrics": {"port": 0},
    })
    lines = "".join(f"m{i},{(i * r) % 90}\n" for r in range(4) for i in range(2000))
    run = subprocess.run([sys.executable, "-m", "stream.cli", "run", "--config", str(cfg)], input=lines.encode(),
                         cwd=ROOT, capture_output=True, check=True, timeout=120)
    err = run.stderr.decode()
    named = re.findall(r"stream '(m\d+)': (holdout|releasing)", err)
    counted = [(int(n.replace(",", "")), by) for n, by in
               re.findall(r"([\d,]+) more streams changed phase in the last \d+ s \(([^)]*)\)", err)]
    assert len(named) <= 40 and counted
    total = {"holdout": 0, "releasing": 0}
    for _, phase in named:
        total[phase] += 1
    for _, by in counted:
        for part in by.split(", "):
            phase, k = part.split(" ")
            total[phase] += int(k.replace(",", ""))
    # one line or count per change, with the phase of the change (a stream created and out of its holdout in the
    # same step is noted in holdout, then releasing)
    assert total == {"holdout": 2000, "releasing": 2000}
    assert len(run.stdout.splitlines()) == 2000  # the fourth reading of each stream: released


def test_the_start_is_taken_out_of_the_collectors_full_passes() -> None:
    """`tops run` freezes what exists before its daemon starts (imports, configuration): a full collection walks
    only what comes after (in a child process: freezing pytest's own heap would hide its garbage)."""
    code = ("import gc; from stream.daemon.service import settle_heap; n = len(gc.get_objects()); settle_heap(); "
            "print(n, len(gc.get_objects()), gc.get_freeze_count())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
    before, after, frozen = map(int, out.split())
    assert before > 10_000 and after < before / 20 and frozen >= 0.9 * before

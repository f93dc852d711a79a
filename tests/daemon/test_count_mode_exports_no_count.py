"""With period counts the number of events is the protected value: no metric, log line or status may carry it
(a counter of accepted readings such as ``tops_readings_total{result="ok"}``, scraped at a period's end, is exactly
the count).

The attack: feed a stream 5 events in one run and 37 in another (one open period each) and scrape everything the
daemon exports. In count mode both scrapes must be identical; in sum mode (where the count is public and the sum
protected) the same scrape does show 37, which proves the probe can see a leak. A restart that re-processes a journal
(kill -9 with the events journaled and not checkpointed) is the other place the count could show: its log line,
its metrics and the streams' status messages must say the same for 11 events as for 173.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stream.state.journal import Journal
from tests.support import ROOT, Subscriber, free_port, scrape, wait_for, write_toml

pytestmark = pytest.mark.slow
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")  # a whole number token (not digits inside a hex id)
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ", re.M)  # the log line's time


def _exports(tmp: Path, aggregate: str, events: int, settle: float) -> tuple[dict[str, float], str, float]:
    mport = free_port()
    cfg = write_toml(tmp / f"{aggregate}{events}.toml", {
        "input": {"source": "stdin"},
        "output": {"sinks": ["stdout"]},
        "ticks": {"mode": "period", "period": 3600.0, "aggregate": aggregate},
        "streams": {"key_file": str(tmp / "k"), "template": {"epsilon": 1.0, "bound": 100.0, "theta": 50.0}},
        "metrics": {"port": mport},
        "state": {"data_dir": str(tmp / f"state-{aggregate}{events}")},
        "log": {"level": "info"},
    })
    proc = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config", str(cfg)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: "tops_ticks_total" in scrape(mport), 20, what="metrics up")
        assert proc.stdin is not None
        t0 = time.monotonic()
        proc.stdin.write(b"".join(f"m,{1 + i % 4}\n".encode() for i in range(events)))
        proc.stdin.flush()
        if aggregate == "sum":  # the count is public here: the probe sees it once it is accounted
            wait_for(lambda: scrape(mport).get("tops_readings_total{result=ok}") == events, 20, what="accounted")
        took = time.monotonic() - t0
        time.sleep(settle)
        got = {k: v for k, v in scrape(mport).items() if "seconds" not in k and "_created" not in k}
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    return got, err.decode(), took


def test_count_mode_exports_nothing_that_moves_with_the_count(tmp_path: Path) -> None:
    control, _, took = _exports(tmp_path, "sum", 37, 0.0)
    assert control["tops_readings_total{result=ok}"] == 37  # the probe would see the count
    settle = max(1.5, 4 * took)  # several accounting intervals (0.25 s) after the events were written
    few, _, _ = _exports(tmp_path, "count", 5, settle)
    many, err_many, _ = _exports(tmp_path, "count", 37, settle)
    assert few == many, {k: (few.get(k), many.get(k)) for k in set(few) | set(many) if few.get(k) != many.get(k)}
    assert not any(k.startswith(("tops_readings_total{result=ok", "tops_messages_total{result=ok")) for k in many)
    assert "tops_incoming_queue_depth" not in many and "tops_journal_synced_readings_total" not in many
    assert "37" not in NUMBER.findall(STAMP.sub("", err_many)), err_many  # the count is no number of the log


def test_count_mode_status_and_state_do_not_carry_the_count(tmp_path: Path) -> None:
    """`tops state` of a count-mode store shows periods (public), never the events in them."""
    _, _, _ = _exports(tmp_path, "count", 37, 1.0)
    r = subprocess.run([sys.executable, "-m", "stream.cli", "state", "--data-dir", str(tmp_path / "state-count37"),
                        "--json"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows
    for row in rows:  # every number shown: periods, phase figures, epsilon; never the 37 events
        assert 37 not in [v for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)]


# -- a restart that re-processes its journal ------------------------------------------------------------------------


def _journaled(data: Path) -> int:
    """Readings in the journal's whole syncs (what a restart re-processes)."""
    return sum(1 for seg in (data / "journal").glob("seg-*.log") for _ in Journal._read_segment(seg))


def _restart_exports(tmp: Path, port: int, aggregate: str,
                     events: int) -> tuple[str, dict[str, float], list[str], list[str]]:
    """Feed ``events`` events to stream m and as many to stream x, kill -9 once the journal holds them (nothing
    checkpointed), and restart with a cap of one stream (x's readings are skipped on replay): the restart's log
    (times dropped), its metrics once it published m's status, every status payload of both runs, and the restart's
    (before the restart the subscriber also gets the retained statuses an earlier call left on the broker, and
    whatever the killed run had published by the time of its kill)."""
    tmp.mkdir()
    mport = free_port()
    doc = {
        "mqtt": {"host": "127.0.0.1", "port": port, "reconnect_min": 0.1, "reconnect_max": 1.0},
        "input": {"source": "stdin"},
        "output": {"sinks": ["stdout", "mqtt"], "topic": "dp/{stream}", "status_interval": 0.2},
        "ticks": {"mode": "period", "period": 3600.0, "aggregate": aggregate},
        "streams": {"key_file": str(tmp / "k"), "max_streams": 2,
                    "template": {"epsilon": 1.0, "bound": 100.0, "theta": 50.0}},
        "metrics": {"port": mport},
        "state": {"data_dir": str(tmp / "state"), "checkpoint_interval": 3600.0, "checkpoint_every": 10**9},
        "log": {"level": "info"},
    }
    statuses = Subscriber(port, "dp/+/status")
    try:
        first = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config",
                                  str(write_toml(tmp / "first.toml", doc))], cwd=ROOT, stdin=subprocess.PIPE,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: "tops_ticks_total" in scrape(mport), 20, what="metrics up")
            assert first.stdin is not None
            first.stdin.write(b"".join(f"{s},{1 + i % 4}\n".encode() for s in "mx" for i in range(events)))
            first.stdin.flush()
            wait_for(lambda: _journaled(tmp / "state") == 2 * events, 20, what="the events journaled")
            seen = wait_for(lambda: sum(t == "dp/m/status" for t, _ in statuses.lines), 20, what="m's status")
        finally:
            first.kill()  # kill -9: the journal is all there is of the events
            first.wait()
        doc["streams"]["max_streams"] = 1
        log = tmp / "restart.log"
        first_run = len(statuses.lines)  # the killed run published nothing after this: the restart starts later
        with log.open("wb") as err:
            second = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config",
                                       str(write_toml(tmp / "restart.toml", doc))], cwd=ROOT, stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, stderr=err)
            try:
                wait_for(lambda: "re-processed" in log.read_text(), 30, what="the journal re-processed")
                wait_for(lambda: sum(t == "dp/m/status" for t, _ in statuses.lines) > seen, 20,
                         what="m's status after the restart")
                exported = wait_for(lambda: _settled(scrape(mport)), 20, what="the restart settled")
                second.send_signal(signal.SIGTERM)
                second.wait(30)
            finally:
                second.kill()
        text = STAMP.sub("", log.read_text())
        every = [p for t, p in statuses.lines if t.endswith("/status")]
        return text, exported, every, [p for t, p in statuses.lines[first_run:] if t.endswith("/status")]
    finally:
        statuses.close()


def _settled(metrics: dict[str, float]) -> dict[str, float] | None:
    """The metrics without times, once the daemon is connected and has published all it had to (None before)."""
    if metrics.get("tops_mqtt_connected") != 1.0 or metrics.get("tops_publish_queue_depth") != 0.0:
        return None
    return {k: v for k, v in metrics.items() if "seconds" not in k and "_created" not in k}


def _restart_line(text: str) -> str:
    """The restart's summary line, its figures that are not the journal's (time, path) made neutral."""
    line = next(x for x in text.splitlines() if "re-processed" in x)
    return re.sub(r"\(\d+\.\d+ s\)", "(T s)", line)


@pytest.mark.network
def test_a_count_mode_restart_that_replays_its_journal_says_nothing_of_the_count(tmp_path: Path,
                                                                                mosquitto) -> None:
    """kill -9 with 2 x 173 (or 2 x 11) events journaled and none checkpointed, then a restart that re-processes
    them (one stream's, the other's skipped past the cap): in count mode no log line, metric or status carries
    173, and the restart says and exports the same with 11 events as with 173. In sum mode (the count is public)
    the same restart's log says "173 journaled readings", which proves the probe sees a count."""
    many, few = 173, 11
    control, _, _, _ = _restart_exports(tmp_path / "sum", mosquitto.port, "sum", many)
    assert f"{many} journaled readings re-processed ({many} for streams past the cap)" in control
    text_many, metrics_many, status_many, restart_many = _restart_exports(tmp_path / "many", mosquitto.port, "count",
                                                                          many)
    text_few, metrics_few, _, restart_few = _restart_exports(tmp_path / "few", mosquitto.port, "count", few)
    assert "journaled readings re-processed" in text_many
    leaks = [x for x in text_many.splitlines() if str(many) in NUMBER.findall(x)]
    assert not leaks, leaks
    assert many not in metrics_many.values() and 2 * many not in metrics_many.values()
    assert not [p for p in status_many if str(many) in NUMBER.findall(p)], status_many
    assert _restart_line(text_many) == _restart_line(text_few)
    assert metrics_many == metrics_few, {k: (metrics_few.get(k), v) for k, v in metrics_many.items()
                                         if metrics_few.get(k) != v}
    assert len(restart_many) == len(restart_few)

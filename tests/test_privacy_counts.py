"""With period counts the number of events is the protected value: no metric, log line or status may carry it
(issue 9, item 3). The old daemon exported ``tops_readings_total{result="ok"}`` every 0.25 s: exactly the count.

The attack: feed a stream 5 events in one run and 37 in another (one open period each) and scrape everything the
daemon exports. In count mode both scrapes must be identical; in sum mode (where the count is public and the sum
protected) the same scrape does show 37, which proves the probe can see a leak.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port, scrape, wait_for, write_toml

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


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
    few, err_few, _ = _exports(tmp_path, "count", 5, settle)
    many, err_many, _ = _exports(tmp_path, "count", 37, settle)
    assert few == many, {k: (few.get(k), many.get(k)) for k in set(few) | set(many) if few.get(k) != many.get(k)}
    assert not any(k.startswith(("tops_readings_total{result=ok", "tops_messages_total{result=ok")) for k in many)
    assert "tops_incoming_queue_depth" not in many and "tops_journal_synced_readings_total" not in many
    for text in (err_few, err_many):
        assert "journaled readings" not in text or " 5 journaled" not in text


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

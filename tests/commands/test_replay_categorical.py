"""`tops replay-categorical` on devices' range reports: every period released with its report count, other phases
and out-of-range values skipped as the daemon skips them, the same output twice."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.support import tops, write_toml


def test_replay_of_local_range_reports_gives_one_release_per_period(tmp_path: Path) -> None:
    """`tops replay-categorical` takes the devices' range reports (other phases and out-of-range values skipped, as
    the daemon skips them) and releases every period with its report count."""
    from stream.core.control import range_control
    from stream.device.client import Device

    cfg = write_toml(tmp_path / "tops.toml", {
        "ticks": {"mode": "period", "period": 10.0}, "streams": {"kind": "range", "mode": "local"},
        "local": {"streams": ["kwh"]},
        "ranges": {"epsilon": 1.0, "width": 1.0, "buckets": 64, "mechanism": "tree", "fanout": 4}})
    dev = Device("kwh", 1.0, key=bytes(32))
    dev.on_control(range_control("kwh", 1.0, "tree", 0.0, 1.0, 64, 4))
    per = [120, 0, 75]
    lines = []
    for k, n in enumerate(per):
        lines += [json.dumps(r) for r in dev.perturb(np.arange(n) % 64, ts=1000.0 + 10 * k + 1)]
    lines += [json.dumps({"report": 5, "phase": "categorical", "ts": 1001.0}),
              json.dumps({"report": 10_000, "phase": "range", "ts": 1001.0})]
    (tmp_path / "reports.jsonl").write_text("\n".join(lines) + "\n")
    out = tops("replay-categorical", str(tmp_path / "reports.jsonl"), "--config", str(cfg), "--stream", "kwh")
    assert out.returncode == 0, out.stderr.decode()
    rel = [json.loads(x) for x in out.stdout.decode().splitlines()]
    assert [r["reports"] for r in rel] == per and [r["tick"] for r in rel] == [0, 1, 2]
    assert all(len(r["levels"]) == 3 and [len(x) for x in r["levels"]] == [64, 16, 4] for r in rel)
    again = tops("replay-categorical", str(tmp_path / "reports.jsonl"), "--config", str(cfg), "--stream", "kwh")
    assert again.stdout == out.stdout

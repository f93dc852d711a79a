"""Range-counting streams in the daemon (`[streams] kind = "range"`): configuration, per-period releases equal to
`tops replay-categorical`, readings outside the domain clamped and counted, hostile values rejected, snapshots."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from operators.ranges.release import RangeConfig, RangeRelease
from stream.core.config import build_config
from stream.core.errors import ConfigFileError
from tests.support import ROOT, identity_from_log, tops, write_toml


@pytest.mark.parametrize(("doc", "line"), [
    ({"streams": {"kind": "range"}, "ranges": {"epsilon": 1.0, "width": 1.0, "buckets": 8}},
     '[streams] kind = "range" releases one histogram per period: set [ticks] mode = "period"'),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "range"}, "ranges": {"width": 1.0, "buckets": 8}},
     '[ranges] epsilon required (a positive number) with kind = "range"'),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "range"}, "ranges": {"epsilon": 1.0, "buckets": 8}},
     "[ranges] width required (a positive number: the width of a bucket)"),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "range"}, "ranges": {"epsilon": 1.0, "width": 1.0}},
     "[ranges] buckets required (an integer >= 1)"),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "range", "mode": "local"}, "local": {"streams": ["k"]},
      "ranges": {"epsilon": 1.0, "width": 1.0, "buckets": 1}},
     "[ranges] buckets must be at least 2 in local mode"),
])
def test_bad_range_configuration_gives_one_line_each(doc: dict, line: str) -> None:
    with pytest.raises(ConfigFileError) as err:
        build_config(doc)
    assert line in err.value.problems, err.value.problems
    assert len(err.value.problems) == 1, err.value.problems


def test_auto_takes_the_tree_only_where_it_wins() -> None:
    def mech(d: int) -> str:
        return build_config({"ticks": {"mode": "period"}, "streams": {"kind": "range"},
                             "ranges": {"epsilon": 1.0, "width": 1.0, "buckets": d}}).category.mechanism
    assert (mech(16), mech(4096)) == ("flat", "tree")


def test_snapshot_restores_the_tick_and_the_clamp_count() -> None:
    cfg = RangeConfig(epsilon=1.0, width=1.0, buckets=64, mechanism="tree")
    op = RangeRelease(cfg, bytes(32))
    op.category_of(-3.0)
    first = op.process([{1: 4}, {2: 9}])
    again = RangeRelease.restore(cfg, bytes(32), json.loads(json.dumps(op.snapshot())))
    assert (again.ticks, again.clamped) == (2, 1)
    assert again.process([{5: 1}]) == RangeRelease(cfg, bytes(32)).process([{1: 4}, {2: 9}, {5: 1}])[2:]
    assert first[0] != first[1]


@pytest.mark.slow
def test_stdin_releases_equal_replay_and_ranges_come_out_right(tmp_path: Path) -> None:
    now = time.time()
    rng = np.random.default_rng(4)
    values = np.round(rng.gamma(3.0, 1.0, 4000), 2)
    ts = np.sort(rng.uniform(now - 4500, now - 10, values.size)).round(3)
    lines = [json.dumps({"stream": "kwh", "value": float(v), "ts": float(t)}) for v, t in zip(values, ts, strict=True)]
    hostile = [f'{{"stream":"kwh","value":"{x}","ts":{now - 50:.3f}}}' for x in ("x", "nan", "1e999")]
    data = ("\n".join(hostile + lines) + "\n").encode()
    (tmp_path / "in.jsonl").write_bytes(data)
    cfg = write_toml(tmp_path / "tops.toml", {
        "input": {"source": "stdin"}, "output": {"sinks": ["stdout"]},
        "ticks": {"mode": "period", "period": 1000.0, "clock": "event", "lateness": 6000.0},
        "streams": {"kind": "range", "key_file": str(tmp_path / "master.key")},
        "ranges": {"epsilon": 2.0, "lower": 0.0, "width": 0.25, "buckets": 256, "mechanism": "tree"},
        "metrics": {"port": 0}, "state": {"data_dir": ""},
    })
    r = tops("run", "--config", str(cfg), stdin=data)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode().splitlines()
    rel = [json.loads(x) for x in out]
    assert [x["tick"] for x in rel] == list(range(len(rel))) and len(rel) >= 5
    # 2 to 5 kWh over all periods: the tree's consistent buckets 8..19, against the truth (sd per period ~ 10)
    est = sum(sum(x["counts"][8:20]) for x in rel)
    truth = int(((values >= 2) & (values < 5)).sum())
    assert abs(est - truth) < 6 * 10 * np.sqrt(len(rel)), (est, truth)
    identity = identity_from_log(r.stderr.decode())
    rep = tops("replay-categorical", str(tmp_path / "in.jsonl"), "--config", str(cfg), "--stream", "kwh",
               "--key-file", str(tmp_path / "master.key"), "--identity", identity,
               "--first", str(rel[0]["ts"]), "--last", str(rel[-1]["ts"]))
    assert rep.returncode == 0, rep.stderr.decode()
    assert rep.stdout.decode().splitlines() == out


# -- local mode: devices bucket and randomize, the server sees one-number reports -----------------------------------

def test_device_follows_a_range_control_and_refuses_what_it_must() -> None:
    """A numeric device takes the range control (its readings are bucketed on the device; every report is an integer
    in the layout's range, its level chosen by the device); it refuses more epsilon than its limit, an oracle it does
    not run, malformed controls (buckets 1, fanout 99, NaN width, mechanism oue); a categorical device refuses it."""
    from stream.core.control import parse_control, range_control
    from stream.device.client import ControlError, Device
    from stream.device.policy import DeviceLimits

    dev = Device("kwh", 2.0, key=bytes(32))
    ctl = range_control("kwh", 2.0, "tree", 0.0, 0.5, 16, 4)
    assert dev.on_control(ctl) == "range"
    total = parse_control(ctl).layout().total
    reps = dev.perturb([0.1, 3.3, 7.9, 1e9, -5.0])
    assert all(r["phase"] == "range" and type(r["report"]) is int and 0 <= r["report"] < total for r in reps)
    assert dev.account.phases["range"].readings == 5
    bad = [
        (range_control("kwh", 3.0, "tree", 0.0, 0.5, 16, 4), "epsilon"),
        ({"stream": "kwh", "phase": "range", "epsilon": 1.0, "mechanism": "tree", "lower": 0, "width": 0.5,
          "buckets": 1, "fanout": 4}, "buckets"),
        ({"stream": "kwh", "phase": "range", "epsilon": 1.0, "mechanism": "tree", "lower": 0, "width": 0.5,
          "buckets": 16, "fanout": 99}, "fanout"),
        ('{"stream": "kwh", "phase": "range", "epsilon": 1.0, "mechanism": "flat", "lower": 0, "width": NaN, '
         '"buckets": 16, "fanout": 4}', "malformed"),
        ({"stream": "kwh", "phase": "range", "epsilon": 1.0, "mechanism": "oue", "lower": 0, "width": 0.5,
          "buckets": 16, "fanout": 4}, "mechanism"),
    ]
    for msg, reason in bad:
        with pytest.raises(ControlError) as err:
            dev.on_control(msg)
        assert err.value.reason == reason, (msg, err.value.reason)
        with pytest.raises(RuntimeError):
            dev.perturb([1.0])
    grr_only = Device("kwh", DeviceLimits(max_epsilon=1.0, mechanisms=("grr",)), key=bytes(32))
    with pytest.raises(ControlError) as err:  # 1,024 buckets at eps 1 need Hadamard Response at the leaves
        grr_only.on_control(range_control("kwh", 1.0, "flat", 0.0, 1.0, 1024, 4))
    assert err.value.reason == "mechanism"
    cat = Device("kwh", 2.0, categories=6, key=bytes(32))
    with pytest.raises(ControlError) as err:
        cat.on_control(ctl)
    assert err.value.reason == "kind"


@pytest.mark.network
def test_local_range_with_tops_device_processes_and_hostile_reports(mosquitto, tmp_path: Path) -> None:
    """Local tree (16 buckets of 0.5, b = 4, eps 2: GRR on both levels). Hostile reports first (out of range,
    negative, fractional, another phase, 1e400, not JSON): each counted invalid, none in a release. Then three real
    `tops device` processes send 1,200 readings each. Every honest report is in exactly one release, and each range
    summed over the periods is within 5 standard errors (LocalTree's exact variance) of the truth."""
    from operators.ranges.local import LocalTree, answer_from_levels
    from tests.support import DaemonProcess, Subscriber, free_port, publish, wait_for

    mport = free_port()
    eps, d = 2.0, 16
    doc = {
        "mqtt": {"host": "127.0.0.1", "port": mosquitto.port, "reconnect_min": 0.1, "reconnect_max": 1.0},
        "input": {"source": "mqtt", "topics": ["meters/+/report"], "qos": 1},
        "output": {"sinks": ["mqtt"], "topic": "dp/{stream}", "qos": 1, "status_interval": 0.5},
        "ticks": {"mode": "period", "period": 1.0},
        "streams": {"kind": "range", "mode": "local"},
        "local": {"streams": ["kwh"]},
        "ranges": {"epsilon": eps, "lower": 0.0, "width": 0.5, "buckets": d, "mechanism": "tree", "fanout": 4},
        "metrics": {"port": mport},
        "state": {"data_dir": str(tmp_path / "state")},
    }
    cfg = write_toml(tmp_path / "tops.toml", doc)
    rng = np.random.default_rng(5)
    sub = Subscriber(mosquitto.port, "dp/+")
    sub.wait_ready("dp/probe")
    daemon = DaemonProcess(cfg, mport, tmp_path)
    counts = np.zeros(d, dtype=np.int64)
    try:
        daemon.wait_connected()
        now = time.time()
        hostile = [json.dumps({"report": r, "phase": "range", "ts": now}) for r in (36, 10_000, -1, 3.5)]
        hostile += [json.dumps({"report": 2, "phase": "categorical", "ts": now}),
                    '{"report": 1e400, "phase": "range"}', "not json"]
        assert publish(mosquitto.port, "meters/kwh/report", hostile).returncode == 0

        def rejected() -> float:
            m = daemon.metrics()
            return m.get("tops_readings_total{result=invalid}", 0.0) + m.get("tops_messages_total{result=invalid}", 0.0)

        wait_for(lambda: rejected() >= len(hostile), 15, what="hostile reports counted")
        procs = []
        for i in range(3):
            values = np.clip(rng.gamma(2.0, 1.5, size=1200), 0, None)
            counts += np.bincount(np.clip(np.floor(values / 0.5).astype(np.int64), 0, d - 1), minlength=d)
            f = tmp_path / f"dev{i}.txt"
            f.write_text("\n".join(f"{v:.3f}" for v in values) + "\n")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "stream.cli", "device", "--host", "127.0.0.1", "--port", str(mosquitto.port),
                 "--stream", "kwh", "--max-epsilon", "2", "--input", str(f), "--qos", "1", "--no-seq",
                 "--control-timeout", "20"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err.decode()[-2000:]
        n = int(counts.sum())
        wait_for(lambda: sum(r.get("reports", 0) for r in sub.payloads() if "tick" in r) >= n, 30,
                 what="every report in a release")
        assert daemon.stop() == 0
    finally:
        daemon.kill()
        sub.close()
    rel = [r for r in sub.payloads() if "tick" in r]
    assert sum(r["reports"] for r in rel) == n
    assert all(r["mechanism"] == "tree" and r["oracles"] == ["grr", "grr"] for r in rel)
    levels = [np.sum([r["levels"][j] for r in rel], axis=0) for j in range(2)]
    tree = LocalTree(d, 4, eps)
    for lo, hi in [(0, 3), (2, 9), (5, 5), (0, 15), (8, 15)]:
        truth = int(counts[lo : hi + 1].sum())
        sd = math.sqrt(tree.range_variance(counts, lo, hi))
        assert abs(answer_from_levels(levels, 4, lo, hi) - truth) <= 5 * sd, (lo, hi, truth, sd)
    log = daemon.stderr()
    assert "Traceback" not in log


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

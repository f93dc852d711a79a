"""Categorical streams in the daemon: configuration, per-period releases equal to `tops replay-categorical`,
hostile categories, kill -9 with durable state, local mode with real `tops device` processes over Mosquitto, and
devices that refuse a server's control outside their pinned limits."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pytest

from operators.categorical.grr import grr_variance
from operators.categorical.release import CategoricalConfig, CategoricalRelease
from stream.core.config import build_config
from stream.core.errors import ConfigFileError
from stream.daemon.service import Daemon
from stream.device.client import ControlError, Device, categorical_control, parse_control
from tests.support import ROOT, DaemonProcess, Subscriber, free_port, identity_from_log, tops, wait_for, write_toml


def central_doc(tmp: Path, **categorical: object) -> dict:
    return {
        "input": {"source": "stdin"},
        "output": {"sinks": ["stdout"]},
        "ticks": {"mode": "period", "period": 1000.0, "clock": "event", "lateness": 6000.0},
        "streams": {"kind": "categorical", "key_file": str(tmp / "master.key")},
        "categorical": {"epsilon": 1.0, "categories": 5, "top_k": 3, **categorical},
        "metrics": {"port": 0},
        "state": {"data_dir": ""},
    }


# -- configuration --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("doc", "line"), [
    ({"streams": {"kind": "categorical"}, "categorical": {"epsilon": 1.0, "categories": 4}},
     '[streams] kind = "categorical" releases one histogram per period: set [ticks] mode = "period"'),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "categorical"}, "categorical": {"categories": 4}},
     '[categorical] epsilon required (a positive number) with kind = "categorical"'),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "categorical"}, "categorical": {"epsilon": 1.0}},
     "[categorical] categories required (an integer >= 2), or labels"),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "categorical"},
      "categorical": {"epsilon": 1.0, "categories": 4, "mechanism": "grr"}},
     "[categorical] mechanism 'grr' is not one of mode central (laplace, stability)"),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "categorical", "mode": "local"}, "local": {"streams": ["r"]},
      "categorical": {"epsilon": 1.0, "categories": 4, "mechanism": "laplace"}},
     "[categorical] mechanism 'laplace' is not one of mode local (grr, hr)"),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "categorical"},
      "categorical": {"epsilon": 1.0, "categories": 4, "mechanism": "stability"}},
     "[categorical] delta must be in (0, 1) for the stability histogram (got None)"),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "categorical", "template": {"epsilon": 1, "bound": 5}},
      "categorical": {"epsilon": 1.0, "categories": 4}},
     "[streams.template] is for numeric streams; a categorical stream takes [categorical]"),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "categorical"},
      "categorical": {"epsilon": 1.0, "categories": 3, "labels": ["a", "b"]}},
     "[categorical] labels must name every category (3), got 2"),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "categorical"},
      "categorical": {"epsilon": 1.0, "categories": 3, "counters": ["1"]}},
     "[categorical] counter_bound required with counters (the largest count of one category in one period)"),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "categorical"},
      "categorical": {"epsilon": 1.0, "categories": 3, "counters": ["x"], "counter_bound": 9.0}},
     "[categorical] counters: 'x' is not a label nor an index 0 .. 2"),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "categorical", "mode": "local"}, "local": {"streams": ["r"]},
      "categorical": {"epsilon": 1.0, "categories": 3, "counters": ["1"], "counter_bound": 9.0}},
     "[categorical] counters need the raw counts: central mechanisms only"),
])
def test_bad_categorical_configuration_gives_one_line_each(doc: dict, line: str) -> None:
    with pytest.raises(ConfigFileError) as err:
        build_config(doc)
    assert line in err.value.problems, err.value.problems
    assert len(err.value.problems) == 1, err.value.problems


def test_auto_mechanism_and_protected_counts() -> None:
    central = build_config({"ticks": {"mode": "period"}, "streams": {"kind": "categorical"},
                            "categorical": {"epsilon": 1.0, "categories": 4}})
    assert central.category.mechanism == "laplace"
    local_small = build_config({"ticks": {"mode": "period"}, "streams": {"kind": "categorical", "mode": "local"},
                                "local": {"streams": ["r"]}, "categorical": {"epsilon": 1.0, "categories": 4}})
    local_big = build_config({"ticks": {"mode": "period"}, "streams": {"kind": "categorical", "mode": "local"},
                              "local": {"streams": ["r"]}, "categorical": {"epsilon": 1.0, "categories": 1085}})
    assert (local_small.category.mechanism, local_big.category.mechanism) == ("grr", "hr")
    # central: how many readings a period got is what the histogram protects, so no metric counts accepted ones
    assert Daemon(central, install_signals=False).metrics.counts_protected
    assert not Daemon(local_small, install_signals=False).metrics.counts_protected


# -- central, stdin -------------------------------------------------------------------------------------------------
def readings_text(now: float, n: int, seed: int) -> tuple[bytes, list[int]]:
    rng = np.random.default_rng(seed)
    cats = rng.choice(5, size=n, p=[0.5, 0.25, 0.15, 0.1, 0.0]).tolist()
    ts = np.sort(rng.uniform(now - 4500, now - 10, size=n)).round(3).tolist()
    lines = [json.dumps({"stream": "region", "value": c, "ts": t}) for c, t in zip(cats, ts, strict=True)]
    return "\n".join(lines).encode() + b"\n", cats


HOSTILE = [b'{"stream":"region","value":3.5,"ts":%.3f}', b'{"stream":"region","value":-1,"ts":%.3f}',
           b'{"stream":"region","value":99,"ts":%.3f}', b'{"stream":"region","value":1e300,"ts":%.3f}',
           b'{"stream":"region","value":"x","ts":%.3f}', b'{"stream":"region","value":5,"ts":%.3f}']


@pytest.mark.slow
def test_stdin_releases_equal_replay_and_hostile_categories_are_rejected(tmp_path: Path) -> None:
    """Readings through `tops run` and the same file through `tops replay-categorical` give the same lines byte
    for byte; categories outside 0..d-1 are rejected (never counted), and a second run draws other noise."""
    now = time.time()
    text, cats = readings_text(now, 3000, 1)
    hostile = b"\n".join(h % (now - 100) for h in HOSTILE) + b"\n"
    data = hostile + text
    (tmp_path / "in.jsonl").write_bytes(data)
    cfg = write_toml(tmp_path / "tops.toml", central_doc(tmp_path, labels=["a", "b", "c", "d", "e"], counters=["a"],
                                                         counter_bound=2000.0, counter_holdout=2,
                                                         counter_query_range=64))
    r = tops("run", "--config", str(cfg), stdin=data)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode().splitlines()
    rel = [json.loads(x) for x in out]
    assert len(rel) >= 5 and [x["tick"] for x in rel] == list(range(len(rel)))
    assert all("reports" not in x and "counts" not in x for x in rel)  # central: the period's count stays private
    # the ToPS counter of category "a": nothing in its holdout (2 periods), then one value per period
    assert [x["counters"]["a"] is None for x in rel[:3]] == [True, True, False]
    total = {lab: sum(v for x in rel for c, v in x["top"] if c == lab) for lab in "abcde"}
    truth = {lab: cats.count(i) for i, lab in enumerate("abcde")}
    for lab in "abc":  # always in the top 3: sums of per-period noisy counts (sd sqrt(2) each, <= 6 periods)
        assert abs(total[lab] - truth[lab]) <= 6 * math.sqrt(2 * 6), (lab, total[lab], truth[lab])
    err = r.stderr.decode()
    assert "invalid" in err and "Traceback" not in err
    identity = identity_from_log(err)
    rep = tops("replay-categorical", str(tmp_path / "in.jsonl"), "--config", str(cfg), "--stream", "region",
               "--key-file", str(tmp_path / "master.key"), "--identity", identity,
               "--first", str(rel[0]["ts"]), "--last", str(rel[-1]["ts"]))
    assert rep.returncode == 0, rep.stderr.decode()
    assert rep.stdout.decode().splitlines() == out
    again = tops("run", "--config", str(cfg), stdin=data)  # a new run identity: new keys, never the same noise
    assert again.returncode == 0 and again.stdout.decode().splitlines() != out


def test_a_release_states_the_histogram_and_the_counters_epsilon_together(tmp_path: Path) -> None:
    """A report feeds the histogram (epsilon 1) and the counters (0.5 together, split between the two a substitute
    move changes): every release of `tops run` and of `tops replay-categorical` states 1.5, and the two agree."""
    now = time.time()
    text, _ = readings_text(now, 400, 2)
    (tmp_path / "in.jsonl").write_bytes(text)
    cfg = write_toml(tmp_path / "tops.toml", central_doc(tmp_path, labels=["a", "b", "c", "d", "e"],
                                                         counters=["a", "b"], counter_epsilon=0.5,
                                                         neighbours="substitute", counter_bound=50.0,
                                                         counter_holdout=2, counter_query_range=64))
    r = tops("run", "--config", str(cfg), stdin=text)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode().splitlines()
    rel = [json.loads(x) for x in out]
    assert len(rel) >= 4 and {x["epsilon"] for x in rel} == {1.5}
    rep = tops("replay-categorical", str(tmp_path / "in.jsonl"), "--config", str(cfg), "--stream", "region",
               "--key-file", str(tmp_path / "master.key"), "--identity", identity_from_log(r.stderr.decode()),
               "--first", str(rel[0]["ts"]), "--last", str(rel[-1]["ts"]))
    assert rep.returncode == 0, rep.stderr.decode()
    assert rep.stdout.decode().splitlines() == out


# -- central, MQTT, kill -9 -----------------------------------------------------------------------------------------
class Feeder(threading.Thread):
    """Publishes categories with ts (event clock) and seq at QoS 1, at a steady pace."""

    def __init__(self, port: int, cats: list[int], rate: float) -> None:
        super().__init__(daemon=True)
        self.port, self.cats, self.rate = port, cats, rate
        self.sent: list[tuple[int, float, int]] = []

    def run(self) -> None:
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="cat-feeder")
        c.connect("127.0.0.1", self.port)
        c.loop_start()
        for i, cat in enumerate(self.cats):
            ts = round(time.time(), 3)
            self.sent.append((cat, ts, i))
            c.publish("meters/region/reading", json.dumps({"value": cat, "ts": ts, "seq": i}), qos=1).wait_for_publish()
            time.sleep(1.0 / self.rate)
        c.disconnect()
        c.loop_stop()


@pytest.mark.network
@pytest.mark.slow
def test_kill9_keeps_every_period_whole_and_released_once(mosquitto, tmp_path: Path) -> None:
    """kill -9 twice while categories flow: every released period equals the replay of all readings (nothing lost,
    nothing counted twice) and a period re-sent after a restart is byte-identical."""
    mport = free_port()
    doc = {
        "mqtt": {"host": "127.0.0.1", "port": mosquitto.port, "client_id": "tops-cat-kill", "reconnect_min": 0.1,
                 "reconnect_max": 1.0},
        "input": {"source": "mqtt", "topics": ["meters/+/reading"], "qos": 1},
        "output": {"sinks": ["mqtt"], "topic": "dp/{stream}", "qos": 1, "status_interval": 0.5},
        "ticks": {"mode": "period", "period": 1.0, "clock": "event", "lateness": 6.0},
        "streams": {"kind": "categorical", "key_file": str(tmp_path / "master.key")},
        "categorical": {"epsilon": 2.0, "categories": 4, "release": "full"},
        "metrics": {"port": mport},
        "state": {"data_dir": str(tmp_path / "state"), "checkpoint_interval": 0.3},
    }
    cfg = write_toml(tmp_path / "tops.toml", doc)
    rng = np.random.default_rng(5)
    cats = rng.choice(4, size=500, p=[0.4, 0.3, 0.2, 0.1]).tolist()
    sub = Subscriber(mosquitto.port, "dp/+")
    sub.wait_ready("dp/probe")
    feeder = Feeder(mosquitto.port, cats, rate=70)  # about 7 s
    logs = []
    try:
        for cycle in range(2):
            run = tmp_path / f"run{cycle}"
            run.mkdir()
            d = DaemonProcess(cfg, mport, run)
            d.wait_connected()
            if cycle == 0:
                feeder.start()
            time.sleep(1.5 + cycle)
            os.kill(d.proc.pid, signal.SIGKILL)
            d.kill()
            logs.append(d.stderr())
        run = tmp_path / "final"
        run.mkdir()
        d = DaemonProcess(cfg, mport, run)
        d.wait_connected()
        feeder.join(60)
        last_ts = feeder.sent[-1][1]
        wait_for(lambda: any(p.get("ts", 0) > last_ts for p in sub.payloads() if "tick" in p), 30,
                 what="the period of the last reading released")
        assert d.stop() == 0
        logs.append(d.stderr())
    finally:
        sub.close()
    assert all("Traceback" not in x for x in logs)
    rel: dict[int, str] = {}
    for p in sub.payloads():
        if "tick" not in p:
            continue
        line = json.dumps(p, sort_keys=True)
        assert rel.setdefault(p["tick"], line) == line, p["tick"]  # a repeat is identical
    ticks = sorted(rel)
    assert ticks == list(range(len(ticks)))
    first = json.loads(rel[0])["ts"]
    last = json.loads(rel[ticks[-1]])["ts"]
    inp = tmp_path / "sent.jsonl"
    inp.write_text("".join(json.dumps({"stream": "region", "value": c, "ts": t, "seq": q}) + "\n"
                           for c, t, q in feeder.sent))
    from stream.state.store import Store

    st = Store.open(tmp_path / "state" / "state.db", readonly=True)
    identity = st.identity
    st.close()
    rep = tops("replay-categorical", str(inp), "--config", str(cfg), "--stream", "region", "--key-file",
               str(tmp_path / "master.key"), "--identity", identity, "--first", str(first), "--last", str(last))
    assert rep.returncode == 0, rep.stderr.decode()
    replayed = [json.dumps(json.loads(x), sort_keys=True) for x in rep.stdout.decode().splitlines()]
    assert replayed == [rel[t] for t in ticks]
    assert sum(sum(json.loads(rel[t])["counts"]) > 0 for t in ticks) >= 5


# -- local mode: devices over Mosquitto -----------------------------------------------------------------------------
@pytest.mark.network
@pytest.mark.slow
def test_local_categorical_with_tops_device_processes(mosquitto, tmp_path: Path) -> None:
    """The daemon publishes the GRR control; three `tops device --categories 6` processes report; each period's
    release counts every report and the estimate over all periods is within 5 standard errors of the truth."""
    mport = free_port()
    eps, d = 2.0, 6
    doc = {
        "mqtt": {"host": "127.0.0.1", "port": mosquitto.port, "reconnect_min": 0.1, "reconnect_max": 1.0},
        "input": {"source": "mqtt", "topics": ["meters/+/report"], "qos": 1},
        "output": {"sinks": ["mqtt"], "topic": "dp/{stream}", "qos": 1, "status_interval": 0.5},
        "ticks": {"mode": "period", "period": 1.0},
        "streams": {"kind": "categorical", "mode": "local"},
        "local": {"streams": ["region"]},
        "categorical": {"epsilon": eps, "categories": d, "release": "full", "post": "base"},
        "metrics": {"port": mport},
        "state": {"data_dir": str(tmp_path / "state")},
    }
    cfg = write_toml(tmp_path / "tops.toml", doc)
    rng = np.random.default_rng(3)
    sub = Subscriber(mosquitto.port, "dp/+")
    sub.wait_ready("dp/probe")
    daemon = DaemonProcess(cfg, mport, tmp_path)
    truth = np.zeros(d)
    try:
        daemon.wait_connected()
        procs = []
        for i in range(3):
            cats = rng.choice(d, size=1500, p=[0.35, 0.25, 0.2, 0.1, 0.1, 0.0])
            truth += np.bincount(cats, minlength=d)
            f = tmp_path / f"dev{i}.txt"
            f.write_text("\n".join(map(str, cats.tolist())) + "\n")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "stream.cli", "device", "--host", "127.0.0.1", "--port", str(mosquitto.port),
                 "--stream", "region", "--max-epsilon", "2", "--categories", str(d), "--input", str(f), "--qos", "1",
                 "--no-seq", "--control-timeout", "20"], cwd=ROOT, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE))
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err.decode()[-2000:]
        n = int(truth.sum())
        wait_for(lambda: sum(r.get("reports", 0) for r in sub.payloads() if "tick" in r) >= n, 30,
                 what="every report in a release")
        assert daemon.stop() == 0
    finally:
        daemon.kill()
        sub.close()
    rel = [r for r in sub.payloads() if "tick" in r]
    assert sum(r["reports"] for r in rel) == n
    est = np.sum([r["counts"] for r in rel], axis=0)
    sd = np.sqrt(grr_variance(n, d, eps, truth))
    assert np.all(np.abs(est - truth) <= 5 * sd), (est, truth, sd)
    assert "Traceback" not in daemon.stderr()


def test_device_refuses_a_categorical_control_outside_its_limits() -> None:
    """The server proposes; a device with --categories 6 and --max-epsilon 1 refuses more epsilon, another d,
    a numeric phase and an unknown mechanism, and reports nothing after a refusal."""
    dev = Device("region", 1.0, categories=6, key=bytes(32))
    assert dev.on_control(categorical_control("region", 1.0, "grr", 6)) == "categorical"
    reps = dev.perturb([0, 5, 3])
    assert all(r["phase"] == "categorical" and type(r["report"]) is int and 0 <= r["report"] < 6 for r in reps)
    bad = [
        ({"stream": "region", "phase": "categorical", "epsilon": 5.0, "mechanism": "grr", "categories": 6}, "epsilon"),
        ({"stream": "region", "phase": "categorical", "epsilon": 1.0, "mechanism": "grr", "categories": 7},
         "categories"),
        ({"stream": "region", "phase": "categorical", "epsilon": 1.0, "mechanism": "oue", "categories": 6},
         "mechanism"),
        ({"stream": "region", "phase": "stream", "epsilon": 1.0, "theta": 3.0, "mechanism": "hybrid"}, "kind"),
    ]
    for msg, reason in bad:
        with pytest.raises(ControlError) as err:
            dev.on_control(msg)
        assert err.value.reason == reason, (msg, err.value.reason)
        with pytest.raises(RuntimeError):
            dev.perturb([1])
    numeric = Device("region", 1.0, key=bytes(32))
    with pytest.raises(ControlError) as err:
        numeric.on_control(categorical_control("region", 1.0, "grr", 6))
    assert err.value.reason == "kind"
    with pytest.raises(ControlError):
        parse_control({"stream": "region", "phase": "categorical", "epsilon": 1.0, "mechanism": "grr",
                       "categories": 1e300})
    dev.on_control(categorical_control("region", 1.0, "hr", 6))
    with pytest.raises(ValueError, match="categories must be integers"):
        dev.perturb([6])


def test_operator_snapshot_restores_the_tick_and_refuses_other_parameters() -> None:
    cfg = CategoricalConfig(epsilon=1.0, categories=4)
    op = CategoricalRelease(cfg, bytes(32))
    first = op.process([{0: 3}, {1: 2}])
    again = CategoricalRelease.restore(cfg, bytes(32), op.snapshot())
    assert again.ticks == 2
    assert again.process([{2: 1}]) == CategoricalRelease(cfg, bytes(32)).process([{0: 3}, {1: 2}, {2: 1}])[2:]
    assert first[0] != first[1]
    with pytest.raises(ValueError, match="other parameters"):
        CategoricalRelease.restore(CategoricalConfig(epsilon=2.0, categories=4), bytes(32), op.snapshot())

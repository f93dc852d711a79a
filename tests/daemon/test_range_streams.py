"""Range-counting streams in the daemon (`[streams] kind = "range"`): configuration, the tree only where it wins,
and per-period releases on stdin equal to `tops replay-categorical`, readings outside the domain clamped and counted,
hostile values rejected."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from stream.core.config import build_config
from stream.core.errors import ConfigFileError
from tests.support import identity_from_log, tops, write_toml


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

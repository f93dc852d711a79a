"""Count-of-counts streams in the daemon ([streams] kind = "countofcounts"): configuration refused in one line per
problem, and a stdin run with hostile readings equal to `tops replay-categorical`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from stream.core.config import build_config
from stream.core.errors import ConfigFileError
from tests.support import identity_from_log, tops, write_toml

LEAVES = ["north/a", "north/b", "north/c", "south/d", "south/e"]


J = 8


COCO = {"epsilon": 1.0, "max_size": J, "leaves": LEAVES}


@pytest.mark.parametrize(("doc", "line"), [
    ({"streams": {"kind": "countofcounts"}, "countofcounts": COCO},
     '[streams] kind = "countofcounts" releases one census per period: set [ticks] mode = "period"'),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "countofcounts", "mode": "local"}, "local": {"streams": ["c"]},
      "countofcounts": COCO},
     '[streams] kind = "countofcounts" is central only (the server holds each group\'s size)'),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "countofcounts"}, "countofcounts": {"epsilon": 1.0,
                                                                                          "max_size": J}},
     '[countofcounts] leaves required (the leaf regions as paths, e.g. ["ca/la", "ny/nyc"])'),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "countofcounts"},
      "countofcounts": {**COCO, "leaves": ["north/a", "south"]}},
     "[countofcounts] every leaf must have the same depth (a person is in one region per level)"),
    ({"ticks": {"mode": "period"}, "streams": {"kind": "countofcounts"}, "countofcounts": {**COCO, "max_size": 0}},
     "[countofcounts] max_size required (an integer >= 1: the largest group size)"),
])
def test_bad_countofcounts_configuration_gives_one_line_each(doc: dict, line: str) -> None:
    with pytest.raises(ConfigFileError) as err:
        build_config(doc)
    assert line in err.value.problems, err.value.problems
    assert len(err.value.problems) == 1, err.value.problems


@pytest.mark.slow
def test_stdin_run_with_hostile_readings_equals_the_replay(tmp_path: Path) -> None:
    """Groups over five leaves, event clock: each hostile reading (out of range, fractional, negative, text, 1e999) is
    rejected and counted; the releases equal `tops replay-categorical` of the same input byte for byte, every period
    is released once with its tick, and the periods count every group."""
    now = time.time()
    rng = np.random.default_rng(9)
    n = 3000
    leaf = rng.integers(0, len(LEAVES), n)
    size = np.minimum(rng.zipf(1.7, n), J)
    cats = leaf * J + size - 1
    ts = np.sort(rng.uniform(now - 5000, now - 100, n)).round(3)
    lines = [json.dumps({"stream": "census", "value": int(c), "ts": float(t)}) for c, t in zip(cats, ts, strict=True)]
    hostile = [json.dumps({"stream": "census", "value": v, "ts": round(now - 4000, 3)})
               for v in (len(LEAVES) * J, 3.5, -1)]
    hostile += [f'{{"stream":"census","value":"{x}","ts":{now - 4000:.3f}}}' for x in ("x", "1e999")]
    data = ("\n".join(hostile + lines) + "\n").encode()
    (tmp_path / "in.jsonl").write_bytes(data)
    cfg = write_toml(tmp_path / "tops.toml", {
        "input": {"source": "stdin"}, "output": {"sinks": ["stdout"]},
        "ticks": {"mode": "period", "period": 1000.0, "clock": "event", "lateness": 6000.0},
        "streams": {"kind": "countofcounts", "key_file": str(tmp_path / "master.key")},
        "countofcounts": COCO, "metrics": {"port": 0}, "state": {"data_dir": ""},
    })
    r = tops("run", "--config", str(cfg), stdin=data)
    assert r.returncode == 0, r.stderr.decode()
    err = r.stderr.decode()
    assert "invalid" in err and "Traceback" not in err
    out = r.stdout.decode().splitlines()
    rel = [json.loads(x) for x in out]
    assert [x["tick"] for x in rel] == list(range(len(rel))) and len(rel) >= 5
    assert sum(x["groups"]["all"] for x in rel) == n
    rep = tops("replay-categorical", str(tmp_path / "in.jsonl"), "--config", str(cfg), "--stream", "census",
               "--key-file", str(tmp_path / "master.key"), "--identity", identity_from_log(err),
               "--first", str(rel[0]["ts"]), "--last", str(rel[-1]["ts"]))
    assert rep.returncode == 0, rep.stderr.decode()
    assert rep.stdout.decode().splitlines() == out

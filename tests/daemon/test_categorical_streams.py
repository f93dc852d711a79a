"""Categorical streams in the daemon: configuration, the automatic mechanism and protected counts, per-period
releases on stdin equal to `tops replay-categorical` with hostile categories rejected, and one release stating the
histogram's and the counters' epsilon together."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from stream.core.config import build_config
from stream.core.errors import ConfigFileError
from stream.daemon.service import Daemon
from tests.support import identity_from_log, tops, write_toml


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

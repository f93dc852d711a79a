"""``tops compare DATA --holdout-scope fleet``: each stream's own holdout against one fleet holdout, on a file of many
streams or a single stream cut into pieces; and what it refuses, in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from operators import ToPSConfig
from stream.commands.compare_fleet import compare_fleet, fleet_rows
from tests.support import tops_text


def test_a_file_of_named_streams_and_a_cut_stream_give_rows_of_one_length(tmp_path: Path) -> None:
    f = tmp_path / "fleet.csv"
    f.write_text("".join(f"s{i % 3},{i}\n" for i in range(3 * 5)) + "s1,99\n")
    rows = fleet_rows(str(f), streams=7)
    assert rows.shape == (3, 5) and rows[1].tolist() == [1.0, 4.0, 7.0, 10.0, 13.0]
    one = tmp_path / "one.csv"
    one.write_text("".join(f"{i}\n" for i in range(100)))
    assert fleet_rows(str(one), streams=7).shape == (7, 14)


def test_the_comparison_holds_the_fleet_to_its_readings_and_each_stream_to_its_own() -> None:
    rows = np.random.default_rng(3).gamma(2.0, 10.0, (40, 300)).round()
    cfg = ToPSConfig(epsilon=1.0, bound=200, holdout=60, query_range=64, fanout=4, holdout_scope="fleet")
    c = compare_fleet(rows, cfg, repetitions=2, queries=100)
    assert len(c.fleet_thetas) == 2 and len(c.own_thetas) == 80
    assert 0.2 < c.ratio < 5.0  # alike streams: the same order of error
    assert c.young is not None and c.young < 1.0  # the fleet's releases of the young ticks beat nothing


def test_tops_compare_prints_the_table(tmp_path: Path) -> None:
    r = tops_text("compare", "dns", "--holdout-scope", "fleet", "--streams", "200", "--holdout", "100", "--range",
                  "256", "--repetitions", "1", "--queries", "50", "--eps", "1,2", timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("data") and "MSE t>=m fleet/own" in lines[0]
    assert [x.split()[:4] for x in lines[1:]] == [["dns", "1", "100", "1779"], ["dns", "2", "100", "1779"]]


@pytest.mark.parametrize(("args", "says"), [
    (("--holdout", "5000", "--streams", "1000"), "must leave released ticks"),
    (("--streams", "1"), "--streams must cut the stream"),
    (("--repetitions", "0"), "--repetitions must be at least 1"),
])
def test_what_the_fleet_comparison_refuses_is_one_line(args: tuple[str, ...], says: str) -> None:
    r = tops_text("compare", "dns", "--holdout-scope", "fleet", *args, timeout=60)
    err = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(err) == 1 and says in err[0] and "Traceback" not in r.stderr, r.stderr

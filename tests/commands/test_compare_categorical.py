"""``tops compare-categorical`` on the stand-in: a CSV row per (method, eps), and one-line refusals (exit 2)."""

from __future__ import annotations

import csv
import math

from stream.cli import main
from stream.commands.categorical_data import synthetic_dataset


def test_stand_in_has_the_thesis_shape() -> None:
    data = synthetic_dataset(0)
    assert data.n == 2_750_238 and data.od_cells.size == 287_116 and int(data.od_counts.max()) == 5871
    assert int((data.county_counts() == 0).sum()) == 6 and data.d_od == 9_796_900
    again = synthetic_dataset(0)
    assert (again.od_cells == data.od_cells).all() and (again.od_counts == data.od_counts).all()


def test_compare_categorical_writes_rows(tmp_path) -> None:
    out = tmp_path / "c.csv"
    assert main(["compare-categorical", "--methods", "grr,hr,stability", "--eps", "2", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["method"] for r in rows] == ["grr", "hr", "stability"]
    n = 2_750_238
    e = math.exp(2)
    grr = float(rows[0]["rmse"])  # Base-Pro lowers GRR's error below its unbiased closed form, never far
    closed_form = math.sqrt(n * (1085 - 2 + e) / (e - 1) ** 2)
    assert 0.5 * closed_form < grr < 1.05 * closed_form
    assert float(rows[2]["rmse"]) < 5


def test_compare_categorical_refuses_bad_arguments(capsys) -> None:
    assert main(["compare-categorical", "--methods", "nope"]) == 2
    assert main(["compare-categorical", "--level", "od", "--methods", "olh"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("tops compare-categorical:") for line in err)

"""`tops compare` (central mode): the reference extension of a data set, a CSV and a small PNG per figure, and
bad arguments refused in one line with exit 2."""

from __future__ import annotations

import numpy as np
import pytest

from stream import cli
from stream.commands import datasets
from stream.commands.scoring import extend


# -- tops compare --------------------------------------------------------------------------------------------------
def test_extend_is_the_reference_extension() -> None:
    x = datasets.load("retail").astype(float)
    assert np.array_equal(extend(x, 200_000), datasets.extended("retail", 200_000))


def test_compare_command_writes_csv_and_small_png(tmp_path, capsys) -> None:
    data = tmp_path / "dns_part.npy"
    np.save(data, datasets.load("dns")[:12_288])
    argv = [
        "compare",
        str(data),
        "--bound",
        "500",
        "--figure",
        "5",
        "--range",
        "4096",
        "--holdout",
        "4096",
        "--repetitions",
        "2",
        "--eps",
        "0.05,0.1",
        "--out-dir",
        str(tmp_path),
    ]
    assert cli.main(argv) == 0
    rows = (tmp_path / "dns_part_fig5.csv").read_text().splitlines()
    assert len(rows) == 1 + 5 * 2
    assert rows[0].startswith("data,ticks,figure,range,holdout,bound,fixed_theta")
    png = tmp_path / "dns_part_fig5.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size < 200_000
    assert "H16c" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--methods", "tops,nope"], "unknown method 'nope'"),
        (["--eps", "0.1,0.2", "--threshold-eps", "0.1,0.2"], "not both"),
        (["--repetitions", "0"], "--repetitions must be at least 1"),
    ],
)
def test_compare_bad_arguments_exit_2_with_one_line(tmp_path, capsys, extra, message) -> None:
    data = tmp_path / "x.npy"
    np.save(data, np.arange(100))
    assert cli.main(["compare", str(data), "--bound", "10", "--out-dir", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]

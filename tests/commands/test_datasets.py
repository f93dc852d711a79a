"""The shipped data sets: in the repository, compressed, licensed, reachable by name."""

from __future__ import annotations

import csv
import hashlib
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import pytest

from stream.commands import datasets
from tests.support import ROOT, tops_text

# sha256 of the int64 little-endian arrays of dp-cont/dp-cont as the project used them before shipping them
DIGESTS = {
    "dns": ("047594e2d525bfd22a3f56b9b993bc9558ead3dabb29b90825a112a8ef95be37", 355_872),
    "retail": ("51589b38974a42979ea3941bef96338f2cad70904789dc49153e0b2096fca155", 88_162),
    "star": ("f5b7bd9e55bf7918ff4ba1d70f6323531e2894418376008e1ed4b66213e4aed2", 49_046),
}


@pytest.mark.parametrize("name", sorted(DIGESTS))
def test_shipped_streams_are_the_reference_streams(name: str) -> None:
    x = datasets.load(name)
    digest, n = DIGESTS[name]
    assert x.shape == (n,) and x.dtype == np.int64
    assert hashlib.sha256(x.astype("<i8").tobytes()).hexdigest() == digest


def test_data_is_small_and_carries_the_license_notice() -> None:
    data = ROOT / "stream" / "data"
    total = sum(p.stat().st_size for p in data.iterdir())
    assert total < 1_000_000, total  # well under the 5 MB the issue allows
    notice = (data / "LICENSE.dp-cont").read_text()
    assert notice.startswith("MIT License") and "Copyright (c) 2021 dp-cont" in notice


def test_a_non_editable_install_has_every_package_and_the_data() -> None:
    """pyproject's package list and package-data cover every package directory and every data file."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = cfg["packages"]["find"]["include"]
    for init in [*ROOT.joinpath("operators").rglob("__init__.py"), *ROOT.joinpath("stream").rglob("__init__.py")]:
        pkg = ".".join(init.parent.relative_to(ROOT).parts)
        assert any(fnmatch(pkg, pat) for pat in include), pkg
    globs = cfg["package-data"]["stream"]
    for f in (ROOT / "stream" / "data").iterdir():
        assert any(fnmatch(f"data/{f.name}", g) for g in globs), f.name


def test_no_test_or_bench_reads_data_beside_the_repository() -> None:
    needles = ("shared" + "/data", "TOPS_SHARED" + "_DATA", "shared" + "_data")
    for p in [*ROOT.joinpath("tests").rglob("*.py"), *ROOT.joinpath("bench").rglob("*.py")]:
        text = p.read_text()
        assert not any(n in text for n in needles), p


def test_replay_and_evaluate_take_a_data_set_name(tmp_path: Path) -> None:
    out = tmp_path / "star.npy"
    res = tops_text("replay", "star", "--epsilon", 1, "--bound", 2088, "--holdout", 4096, "--range", 4096,
               "--key", "11" * 32, "--out", out)
    assert res.returncode == 0, res.stderr
    rel = np.load(out)
    assert rel.shape == (49_046,) and np.isnan(rel[:4096]).all() and not np.isnan(rel[4096:]).any()
    res = tops_text("evaluate", "star", out, "--range", 4096, "--repetitions", 1)
    assert res.returncode == 0, res.stderr
    res = tops_text("replay", "nosuchset", "--epsilon", 1, "--bound", 10, "--out", out)
    assert res.returncode == 2 and "no such file (nor a shipped data set: dns, retail, star)" in res.stderr


def test_compare_takes_a_data_set_name_and_its_bound(tmp_path: Path) -> None:
    res = tops_text("compare", "star", "--methods", "tops,zero", "--eps", 1, "--repetitions", 1, "--queries", 20,
               "--range", 4096, "--holdout", 4096, "--no-plot", "--out-dir", tmp_path)
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader((tmp_path / "star_compare.csv").open()))
    assert {r["method"] for r in rows} >= {"tops", "zero"}
    assert all(float(r["bound"]) == 2088 for r in rows if "bound" in r)

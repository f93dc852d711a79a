"""The status lines a file of releases carries (one before each releasing stream's first release) are written for
release rows without building each stream's status object: the same text, character for character, as
``status_line`` writes, whatever the template (holdout on either grid, a public theta, another resolution), the
stream's name (JSON escapes), its identity (none, or the store's) and generation."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from stream.core.config import build_config
from stream.core.sinks import status_line, status_lines
from stream.daemon import service as daemon_mod

TEMPLATES = [
    {"epsilon": 1.0, "bound": 5000.0, "holdout": 3},
    {"epsilon": 0.5, "bound": 100.0, "holdout": 3, "holdout_grid": "compact"},
    {"epsilon": 1.0, "bound": 200.0, "holdout": 12, "resolution": 0.5, "fanout": 4, "query_range": 256},
    {"epsilon": 1.0, "bound": 5000.0, "theta": 100.0},
]


@pytest.mark.parametrize("template", TEMPLATES, ids=["exact", "compact", "resolution", "public theta"])
def test_status_lines_in_bulk_are_what_status_line_writes(tmp_path: Path, template: dict) -> None:
    cfg = build_config({"metrics": {"port": 0}, "state": {"data_dir": ""}, "input": {"source": "stdin"},
                        "streams": {"key_file": str(tmp_path / "k"), "template": template}})
    d = daemon_mod.Daemon(cfg, stdin=io.BytesIO(b""), stdout=io.StringIO(), install_signals=False)
    d.startup()
    rng = np.random.default_rng(11)
    names = [f"m{i}" for i in range(300)] + ['q"uote', "back\\slash", "caf\u00e9", "tab\tname", "\U0001F600"]
    for _ in range(15):
        d.on_lines([f"{n},{float(rng.integers(0, int(template['bound']) + 50))}".encode() for n in names])
    recs = list(d.router.streams.values())
    for i, rec in enumerate(recs[:40]):  # identities and generations as a state store gives them
        rec.identity = "" if i % 3 == 0 else f"{i:032x}"
        rec.generation = 1 + i % 4
    d.router.fail(recs[41], "a test")
    assert sum(type(r.operator).__name__ == "RowOperator" for r in recs) > 250
    assert status_lines(recs) == [status_line(r) for r in recs]


def test_a_streams_own_params_are_written_as_the_json_encoder_writes_them() -> None:
    """The params a stream's holdout decided (``stream_params_json``, written into a frame its template and theta
    share) are the JSON encoder's text of ``stream_params``, on statistics of every shape a stream can hold: no
    spread or a spread over several leaf widths, no truncation statistic, a sum alone or a sum with bins, an empty
    blob, negative noisy counts, templates with another resolution or a public theta, theta at the bound."""
    import math

    from operators.config import ToPSConfig
    from stream.core.sinks import _compact_json, stream_params, stream_params_json

    rng = np.random.default_rng(1)
    configs = [ToPSConfig(epsilon=1.0, bound=5000.0, holdout=3),
               ToPSConfig(epsilon=0.5, bound=200.0, holdout=12, resolution=0.5, fanout=4, query_range=256),
               ToPSConfig(epsilon=1.0, bound=5000.0, theta=100.0),
               ToPSConfig(epsilon=2.0, bound=100.0, holdout=50, resolution=0.1)]
    for cfg in configs:
        bound_units = math.floor(cfg.span / cfg.resolution + 1e-9)
        for _ in range(1500):
            trunc_len = int(rng.choice([0, 1, 2, 9, 14]))
            theta_units = int(rng.integers(0, bound_units + (0 if trunc_len else 3)))
            spread_len = int(rng.choice([0, 4, 7, 10, 13]))
            spread = rng.normal(0, 1e4, spread_len).tolist()
            trunc = ([float(rng.normal(0, 100)), *rng.integers(-5, 50, trunc_len - 1).astype(float).tolist()]
                     if trunc_len else [])
            blob = b"" if rng.random() < 0.02 else np.array([float(spread_len), *spread, *trunc], "<f8").tobytes()
            assert stream_params_json(cfg, theta_units, blob) == _compact_json(stream_params(cfg, theta_units, blob))
        for theta_units in (0, 5, bound_units):
            assert stream_params_json(cfg, theta_units, None) == _compact_json(stream_params(cfg, theta_units, None))


def test_status_lines_written_a_few_at_a_time_each_come_before_their_streams_first_release(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that starts many streams writes their status lines in slices (``STATUS_LINES_A_WRITE``, here 7): every
    stream still has exactly one, the first of its lines in the file, before any release of the step."""
    import json

    monkeypatch.setattr(daemon_mod, "STATUS_LINES_A_WRITE", 7)
    cfg = build_config({"metrics": {"port": 0}, "state": {"data_dir": ""}, "input": {"source": "stdin"},
                        "streams": {"key_file": str(tmp_path / "k"), "template": TEMPLATES[0]}})
    out = io.StringIO()
    d = daemon_mod.Daemon(cfg, stdin=io.BytesIO(b""), stdout=out, install_signals=False)
    d.startup()
    names = [f"m{i}" for i in range(100)]
    for v in range(5):
        d.on_lines([f"{n},{v}".encode() for n in names])
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    statuses = [x["stream"] for x in lines if "phase" in x]
    assert sorted(statuses) == sorted(names)
    first_release = next(i for i, x in enumerate(lines) if "tick" in x)
    assert all("phase" in x for x in lines[:first_release]) and len(statuses) == first_release

"""The configuration's checks: each bad key gives one clear line, every problem is reported at once with exit 2,
the shipped deploy/tops.toml is valid, and the configuration reference documents every key."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream.core.config import build_config
from stream.core.errors import ConfigFileError
from tests.support import ROOT

TPL = {"epsilon": 1.0, "bound": 100.0}


# -- configuration -------------------------------------------------------------------------------------------
BAD_CONFIGS = [
    ({"mqtt": {"port": 0}}, "[mqtt] port must be an integer >= 1 and <= 65535 (got 0)"),
    ({"mqtt": {"hots": "x"}}, "[mqtt] unknown key 'hots'"),
    ({"input": {"source": "kafka"}}, "[input] source must be one of stdin, mqtt, nats (got 'kafka')"),
    ({"input": {"source": "mqtt", "topics": ["meters/#"]}}, "[input] topics: pattern 'meters/#' must have"),
    ({"input": {"qos": 2}}, "[input] qos must be an integer >= 0 and <= 1 (got 2)"),
    ({"output": {"topic": "dp/all"}}, "[output] topic must contain '{stream}'"),
    ({"output": {"sinks": ["kafka"]}}, "[output] sinks must be a list of mqtt, stdout"),
    ({"ticks": {"mode": "hourly"}}, "[ticks] mode must be one of reading, period (got 'hourly')"),
    ({"ticks": {"period": -1}}, "[ticks] period must be a number >= 0.01 (got -1)"),
    ({"streams": {"max_streams": "many"}}, "[streams] max_streams must be an integer >= 1 (got 'many')"),
    ({"metrics": {"port": 70000}}, "[metrics] port must be an integer >= 0 and <= 65535 (got 70000)"),
    ({"log": {"level": "loud"}}, "[log] level must be one of debug, info, warning, error (got 'loud')"),
    ({"streams": {"template": {"epsilon": 0, "bound": 5}}}, "[streams.template] epsilon must be a positive"),
    ({"streams": {"template": {"epsilon": 1, "bound": 5, "fanout": 1}}}, "[streams.template] fanout must be"),
    ({"streams": {"template": {"epsilon": 1, "bound": 5, "smoothr": "x"}}}, "[streams.template] unknown key"),
    ({"streams": {"template": {"bound": 5}}}, "[streams.template] epsilon required"),
    ({"nonsense": {}}, "unknown section [nonsense]"),
    ({"mqtt": {"tls": "yes"}}, "[mqtt] tls must be true or false (got 'yes')"),
    ({"mqtt": {"password_file": "/nonexistent/pw"}}, "[mqtt] password_file '/nonexistent/pw' cannot be read"),
]


@pytest.mark.parametrize(("doc", "line"), BAD_CONFIGS)
def test_each_bad_key_gives_one_clear_line(doc: dict, line: str) -> None:
    """One problem, one line that names the key and what is allowed."""
    doc = {k: dict(v) for k, v in doc.items()}
    doc.setdefault("streams", {}).setdefault("template", dict(TPL))
    with pytest.raises(ConfigFileError) as exc:
        build_config(doc)
    assert len(exc.value.problems) == 1, exc.value.problems
    assert exc.value.problems[0].startswith(line), exc.value.problems[0]
    assert "\n" not in exc.value.problems[0]


def test_all_problems_reported_and_exit_code_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`tops run --config` prints one line per problem and exits 2."""
    bad = tmp_path / "tops.toml"
    bad.write_text('[mqtt]\nport = "x"\n[ticks]\nmode = "hourly"\n[streams.template]\nepsilon = -1\nbound = 5\n')
    from stream.cli import main

    assert main(["run", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(x.startswith("tops run: [") for x in err), err
    assert main(["run", "--config", str(tmp_path / "missing.toml")]) == 2
    (tmp_path / "broken.toml").write_text("[mqtt\n")
    assert main(["run", "--config", str(tmp_path / "broken.toml")]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_deploy_example_config_is_valid(tmp_path: Path) -> None:
    """deploy/tops.toml passes the checks (with its password file present)."""
    import tomllib

    doc = tomllib.loads((ROOT / "deploy" / "tops.toml").read_text())
    pw = tmp_path / "pw"
    pw.write_text("secret\n")
    doc["mqtt"]["password_file"] = str(pw)
    cfg = build_config(doc)
    assert cfg.input.source == "mqtt" and cfg.ticks.mode == "period" and cfg.mqtt.password == "secret"  # noqa: S105 - a test value


def test_config_reference_documents_every_key() -> None:
    """The configuration reference (docs/configuration.md, its tables generated from the schema by the MkDocs hook
    docs/hooks/reference.py) has a table for every section and a row for every key of the schema and the template."""
    import importlib.util
    import re

    from stream.core.config import SCHEMA, TEMPLATE_DOCS

    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    page = reference.config_page((ROOT / "docs" / "configuration.md").read_text())

    def table(section: str) -> str:
        m = re.search(rf"^## \[{re.escape(section)}\]$(.*?)(?=^## |\Z)", page, flags=re.S | re.M)
        assert m, f"the configuration reference has no section [{section}]"
        return m.group(1)

    for section, fields in SCHEMA.items():
        body = table(section)
        for key in fields:
            assert f"| `{key}` |" in body, (section, key)
    body = table("streams.template")
    for key in TEMPLATE_DOCS:
        assert f"| `{key}` |" in body, key

"""Refusals at start: each problem is one line on stderr and exit code 2, never a traceback;
``tops run --check`` checks what the start checks and lists every problem at once."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from operators import ToPSConfig
from stream.core.config import build_config
from stream.core.errors import ConfigFileError
from stream.state.store import Store
from tests.support import free_port, tops_text, write_toml

TPL = {"epsilon": 1.0, "bound": 100.0, "holdout": 50, "query_range": 256, "fanout": 4}


def run(config: Path, *extra: str) -> tuple[int, list[str]]:
    r = tops_text("run", "--config", config, *extra, timeout=60, stdin="")
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, [x for x in r.stderr.splitlines() if x.strip()]


def config(tmp: Path, **sections: dict) -> Path:
    doc: dict = {"streams": {"key_file": str(tmp / "master.key"), "template": dict(TPL)},
                 "metrics": {"port": 0}, "state": {"data_dir": ""}}
    for name, d in sections.items():
        for k, v in d.items():
            if isinstance(v, dict):
                doc.setdefault(name, {}).setdefault(k, {}).update(v)
            else:
                doc.setdefault(name, {})[k] = v
    return write_toml(tmp / "tops.toml", doc)


MQTT = {"input": {"source": "mqtt", "topics": ["meters/+/reading"]}, "output": {"sinks": ["mqtt"]}}


@pytest.mark.parametrize(("sections", "line"), [
    ({"streams": {"template": {"epsilon": 1e300}}},
     "tops run: [streams.template] epsilon = 1e+300 is above 1024"),
    ({**MQTT, "output": {"sinks": ["mqtt"], "topic": "dp/{stream}", "status_topic": "dp/{stream}"}},
     "tops run: [output] status_topic must differ from topic"),
    ({"input": {"source": "mqtt", "topics": ["dp/+"]}, "output": {"sinks": ["mqtt"]}},
     "tops run: [input] topics: pattern 'dp/+' overlaps [output] topic 'dp/{stream}'"),
    ({"input": {"source": "mqtt", "topics": ["+/x/status"]}, "output": {"sinks": ["mqtt"]}},
     "tops run: [input] topics: pattern '+/x/status' overlaps [output] status_topic 'dp/{stream}/status'"),
    ({"streams": {"idle_timeout": 60.0}}, "tops run: [streams] idle_timeout needs durable state"),
], ids=["epsilon-1e300", "status-equals-topic", "input-overlaps-output", "input-overlaps-status", "idle-no-state"])
def test_configuration_refused_in_one_line(tmp_path: Path, sections: dict, line: str) -> None:
    rc, err = run(config(tmp_path, **sections))
    assert rc == 2 and len(err) == 1 and err[0].startswith(line), err
    rc, err2 = run(config(tmp_path, **sections), "--check")
    assert rc == 2 and err2 == err


def test_metrics_port_in_use_and_unwritable_key_folder(tmp_path: Path) -> None:
    """Both in one start: two lines, exit 2 (today: a traceback and exit 1 for each)."""
    (tmp_path / "afile").write_text("")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = config(tmp_path, metrics={"port": port}, streams={"key_file": str(tmp_path / "afile" / "k" / "m.key")})
        for extra in ((), ("--check",)):
            rc, err = run(cfg, *extra)
            assert rc == 2 and len(err) == 2, err
            assert err[0].startswith("tops run: [streams] key_file") and "cannot be created" in err[0]
            assert err[1] == f"tops run: [metrics] port {port} on 127.0.0.1 cannot be opened (Address already in use)"


@pytest.mark.parametrize("content", [b"\xcb\x01" * 16, b"ab" * 31 + b"\n", "\u00e9".encode() * 32],
                         ids=["raw-bytes", "short-hex", "non-ascii-text"])
def test_a_key_file_that_is_not_64_hex_digits_is_one_line(tmp_path: Path, content: bytes) -> None:
    """32 raw random bytes (what ``head -c 32 /dev/urandom`` writes), too few digits or other text: one line that
    names the file and the format, never a traceback and never the file's bytes."""
    key = tmp_path / "master.key"
    key.write_bytes(content)
    key.chmod(0o600)
    for extra in ((), ("--check",)):
        rc, err = run(config(tmp_path), *extra)
        assert rc == 2 and err == [f"tops run: [streams] key_file: master key file {key} must hold 64 hex digits"], err


def test_template_errors_reported_all_at_once(tmp_path: Path) -> None:
    cfg = config(tmp_path, streams={"template": {"epsilon": -1, "fanout": 1, "smoother": "x", "alpha": 3}})
    rc, err = run(cfg)
    assert rc == 2 and [x.split(" must")[0] for x in err] == [
        "tops run: [streams.template] epsilon", "tops run: [streams.template] fanout",
        "tops run: [streams.template] smoother", "tops run: [streams.template] alpha"], err


def test_check_lists_every_ledger_mismatch_and_the_start_refuses_the_same(tmp_path: Path) -> None:
    """Two stored streams with other privacy parameters: `--check` names both (not only the first) and exits 2;
    the start refuses with the same lines; with both named for a new generation, the check passes."""
    data = tmp_path / "state"
    data.mkdir(mode=0o700)
    store = Store.open(data / "state.db")
    old = {"mode": "central", "method": "tops", **ToPSConfig(**{**TPL, "epsilon": 0.5}).to_dict()}
    for name in ("meter-a", "meter-b"):
        store.admit(name, old)
    store.close()
    cfg = config(tmp_path, state={"data_dir": str(data)}, metrics={"port": free_port()})
    rc, err = run(cfg, "--check")
    assert rc == 2 and len(err) == 2, err
    assert "'meter-a'" in err[0] and "'meter-b'" in err[1] and all("epsilon 0.5 -> 1.0" in x for x in err)
    assert run(cfg) == (2, err)
    rc, err = run(cfg, "--check", "--new-generation", "meter-a", "--new-generation", "meter-b")
    assert rc == 0 and err == [f"tops run: configuration {cfg} is valid"], err


def test_a_threshold_budget_above_epsilon_is_refused_by_the_builder_and_the_check(tmp_path: Path) -> None:
    """A reading in the holdout costs threshold_epsilon, and every release states epsilon: a threshold budget above
    epsilon would make the stated guarantee false. Refused by the configuration builder (one line) and by `tops run
    --check` (exit 2, that line), with a bound far above both; equal to epsilon is accepted."""
    line = "[streams.template] threshold_epsilon (5.0) must not exceed epsilon (1.0)"
    doc = {"streams": {"key_file": str(tmp_path / "master.key"), "template": {**TPL, "threshold_epsilon": 5.0}},
           "metrics": {"port": 0}, "state": {"data_dir": ""}}
    assert doc["streams"]["template"]["bound"] > 5.0
    with pytest.raises(ConfigFileError) as exc:
        build_config(doc)
    assert len(exc.value.problems) == 1 and exc.value.problems[0].startswith(line), exc.value.problems
    rc, err = run(config(tmp_path, streams={"template": {"threshold_epsilon": 5.0}}), "--check")
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"tops run: {line}"), err
    assert build_config({**doc, "streams": {**doc["streams"], "template": {**TPL, "threshold_epsilon": 1.0}}})
    rc, err = run(config(tmp_path, streams={"template": {"threshold_epsilon": 1.0}}), "--check")
    assert rc == 0, err


def test_the_check_draws_its_probe_without_loading_the_compiled_kernels(tmp_path: Path) -> None:
    """``tops run --check`` runs the template's operator on test streams (the probe that refuses ``epsilon = 1e300``)
    on the numpy path: on a fresh install, loading the kernels would compile them first (tens of seconds of CPU)
    for a check. The template is one whose probe makes enough draws to load them otherwise. A daemon's own draws
    load them as before; TOPS_NOISE_KERNEL=numba still forces them."""
    import os
    import subprocess
    import sys

    script = ("import operators.noise as n; from stream.core.config import build_config; "
              "build_config({'streams': {'template': {'epsilon': 1.0, 'bound': 10.0, 'holdout': 2, "
              "'query_range': 65536}}, 'state': {'data_dir': ''}}); probe = n._kernel_state['sample'] is not None; "
              "n.expect_draws(1000); print(probe, n._kernel_state['sample'] is not None)")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TOPS_NOISE_KERNEL"}
    out = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr
    forced = subprocess.run([sys.executable, "-c", script], cwd=root, env={**env, "TOPS_NOISE_KERNEL": "numba"},
                            capture_output=True, text=True, timeout=120)
    assert forced.stdout.split() == ["True", "True"], forced.stdout + forced.stderr

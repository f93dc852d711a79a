"""Every file of deploy/ exercised with the real program it is for.

* Prometheus: `promtool check config` on deploy/prometheus.yml, `promtool check rules` and `promtool test rules` on
  the shipped alerting rules, and every metric the rules use is exported by a real daemon (a renamed metric would
  silently disarm an alert).
* deploy/install.sh into a temporary root; the installed `tops` runs; `systemd-analyze verify` accepts the unit;
  the unit does not restart on exit code 2, and `tops run --check` on the installed configuration lists every problem
  on its own line and exits 2.
(TLS is tested in tests/e2e/test_tls.py, the roles of the ACL in tests/e2e/test_acl.py, on the same broker set-up.)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import DEPLOY, DaemonProcess, daemon_config, free_port, run_tool

PROMTOOL = shutil.which("promtool")


needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (.ci/run installs it)")


@needs_promtool
def test_promtool_accepts_the_scrape_config_and_the_rules_and_their_tests() -> None:
    r = run_tool([PROMTOOL, "check", "config", "prometheus.yml"], cwd=DEPLOY)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_tool([PROMTOOL, "check", "rules", "tops.rules.yml"], cwd=DEPLOY)
    assert r.returncode == 0 and "9 rules found" in r.stdout, r.stdout + r.stderr
    r = run_tool([PROMTOOL, "test", "rules", "tops.rules.test.yml"], cwd=DEPLOY)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


@needs_promtool
def test_the_cluster_scrape_config_is_valid_and_no_shipped_target_is_a_placeholder(tmp_path: Path) -> None:
    """A shipped target that is always down fires the shipped alerts: the daemon's job scrapes loopback only, and the
    workers' job reads its hosts from a file the operator writes."""
    shutil.copy(DEPLOY / "nats" / "prometheus.yml", tmp_path)
    shutil.copy(DEPLOY / "tops.rules.yml", tmp_path)
    r = run_tool([PROMTOOL, "check", "config", "prometheus.yml"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    for conf in (DEPLOY / "prometheus.yml", DEPLOY / "nats" / "prometheus.yml"):
        targets = re.findall(r"targets:\s*\[([^\]]*)\]", "\n".join(
            line for line in conf.read_text().splitlines() if not line.lstrip().startswith("#")))
        hosts = {t.strip().strip('"').rsplit(":", 1)[0] for group in targets for t in group.split(",") if t.strip()}
        assert hosts <= {"127.0.0.1", "localhost"}, (conf.name, hosts)


@needs_promtool
def test_a_broken_rule_test_fails(tmp_path: Path) -> None:
    """The rule tests can fail: the same tests against rules whose disconnection alert waits 10 minutes."""
    shutil.copy(DEPLOY / "tops.rules.test.yml", tmp_path)
    rules = (DEPLOY / "tops.rules.yml").read_text().replace("expr: tops_mqtt_connected == 0\n        for: 2m",
                                                            "expr: tops_mqtt_connected == 0\n        for: 10m")
    (tmp_path / "tops.rules.yml").write_text(rules)
    r = run_tool([PROMTOOL, "test", "rules", "tops.rules.test.yml"], cwd=tmp_path)
    assert r.returncode != 0


def test_every_metric_the_rules_use_is_exported(mosquitto, tmp_path: Path) -> None:
    from tests.support import scrape

    mport = free_port()
    daemon = DaemonProcess(daemon_config(tmp_path, mosquitto.port, mport), mport, tmp_path)
    try:
        daemon.wait_connected()
        exported = {k.split("{")[0] for k in scrape(mport)}
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    rules = (DEPLOY / "tops.rules.yml").read_text()
    daemon_rules, cluster_rules = rules.split("- name: tops-cluster")
    used = set(re.findall(r"\b(tops_[a-z_]+)", daemon_rules))
    assert used and used <= exported, used - exported
    # the cluster group's metrics are a worker's (its own registry, served on [metrics] port)
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from stream.cluster.worker import ClusterWorker
    from stream.core.config import build_config

    cfg = build_config({"input": {"source": "nats"}, "streams": {"template": {"epsilon": 1.0, "bound": 10.0}}})
    worker = ClusterWorker(cfg, bytes(32), name="w")
    worker.m_partitions.set(1)
    for result in ("ok",):
        worker.m_readings.labels(result).inc()
    text = generate_latest(worker.registry).decode()
    by_worker = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    used = set(re.findall(r"\b(tops_[a-z_]+)", cluster_rules))
    assert used and used <= by_worker, used - by_worker


def _dependency_dirs() -> str:
    """The directories this interpreter imports tops's dependencies from (a venv's own site-packages included)."""
    import sysconfig

    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    return ":".join(dict.fromkeys(d for d in dirs if Path(d).is_dir()))


def _install(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    dest = tmp_path / "root"
    inherited = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    full = {**inherited, "DESTDIR": str(dest), "TOPS_SITE_PACKAGES": _dependency_dirs(), **env}
    return run_tool(["bash", str(DEPLOY / "install.sh")], env=full), dest


def _only_root_enters(tmp_path: Path) -> Path:
    """A python3 in a directory only its owner can enter, as pyenv's in /root: the tops user cannot run it."""
    private = tmp_path / "private"
    (private / "bin").mkdir(parents=True)
    (private / "bin" / "python3").symlink_to(sys.executable)
    private.chmod(0o700)
    return private / "bin" / "python3"


def _picked_minor(out: str) -> str:
    found = re.search(r"using \S+ \((3\.\d+)", out)
    assert found, out
    return found.group(1)


def test_install_script_makes_a_working_tree_and_prints_its_next_steps(tmp_path: Path) -> None:
    """With a python3 first on PATH that only its owner can run (pyenv under /root), the script picks one every user
    can run, completes with exit 0 and prints the next steps, systemd or not."""
    private = _only_root_enters(tmp_path)
    r, dest = _install(tmp_path, PATH=f"{private.parent}:{os.environ['PATH']}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert str(private) not in r.stdout
    if _picked_minor(r.stdout) != f"{sys.version_info.major}.{sys.version_info.minor}":
        pytest.skip("the interpreter every user can run here is another Python than the tests' (no shared packages)")
    assert "Next steps" in r.stdout and "tops run --config /etc/tops/tops.toml --check" in r.stdout
    assert "systemd is not running here" in r.stdout  # a DESTDIR install never talks to systemd
    tops = dest / "opt/tops/venv/bin/tops"
    v = run_tool([str(tops), "--version"])
    assert v.returncode == 0 and v.stdout.startswith("tops "), v.stdout + v.stderr
    unit = (dest / "etc/systemd/system/tops.service").read_text()
    for f in ("etc/tops/tops.toml", "etc/mosquitto/conf.d/tops.conf", "etc/mosquitto/tops.acl",
              "etc/prometheus/tops.rules.yml"):
        assert (dest / f).is_file(), f
    documentation = _unit(unit)["Unit"]["Documentation"][0].removeprefix("file://")
    assert (dest / documentation.lstrip("/")).is_file(), documentation
    assert (dest / "etc/tops/tops.toml").stat().st_mode & 0o007 == 0
    # the installed configuration, checked by the installed tops: each problem on its own line, exit 2
    chk = run_tool([str(tops), "run", "--config", str(dest / "etc/tops/tops.toml"), "--check"])
    assert chk.returncode == 2
    lines = [x for x in chk.stderr.splitlines() if x.strip()]
    assert lines and all("Traceback" not in x for x in lines)
    assert any("password_file" in x for x in lines)  # /etc/tops/mqtt-password is not there yet
    # the unit, with its paths moved into the temporary root, passes systemd's own check
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: all but systemd's own check of the unit passed "
                    "(.ci/run installs it)")
    local = tmp_path / "tops.service"
    local.write_text(unit.replace("/opt/tops/venv/bin/tops", str(tops))
                     .replace("/etc/tops/tops.toml", str(dest / "etc/tops/tops.toml")))
    ver = run_tool([analyze, "verify", str(local)])
    assert ver.returncode == 0, ver.stdout + ver.stderr


def test_an_interpreter_the_service_user_cannot_run_is_refused_in_one_line(tmp_path: Path) -> None:
    private = _only_root_enters(tmp_path)
    r, dest = _install(tmp_path, PYTHON=str(private))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "PYTHON=" in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert not (dest / "opt/tops/venv").exists()


def _unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as systemd reads it: sections of keys, a key given again adds a value, backslash continues."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.mark.parametrize("name", ["tops.service", "nats/tops-worker@.service"])
def test_a_configuration_error_never_restarts_the_unit_in_a_loop(name: str) -> None:
    """`tops run` exits 2 on a configuration error; systemd's RestartPreventExitStatus applies to ExecStart only (not
    to ExecStartPre), so the check must run in ExecStart, and a start limit stops any other failure loop."""
    unit = _unit((DEPLOY / name).read_text())
    service = unit["Service"]
    assert service["Restart"] == ["on-failure"]
    assert "2" in " ".join(service["RestartPreventExitStatus"]).split()
    assert not any("tops" in cmd for cmd in service.get("ExecStartPre", []) + service.get("ExecStartPost", [])), \
        "a tops command before ExecStart exits 2 on a configuration error and is restarted forever"
    assert any(cmd.split()[:2] == ["/opt/tops/venv/bin/tops", "run"] for cmd in service["ExecStart"])  # install.sh's
    burst = int(unit["Unit"]["StartLimitBurst"][-1])
    interval = unit["Unit"]["StartLimitIntervalSec"][-1]
    assert 0 < burst <= 10 and interval not in ("0", "infinity")
    assert int(service["RestartSec"][-1]) * burst < int(interval), "the start limit must be reachable"


def test_the_shipped_configuration_releases_within_an_hour_of_the_first_reading() -> None:
    import tomllib

    cfg = tomllib.loads((DEPLOY / "tops.toml").read_text())
    ticks, template = cfg["ticks"], cfg["streams"]["template"]
    assert ticks["mode"] == "period"
    first_release = template["holdout"] * ticks["period"] + ticks.get("lateness", 0)
    assert first_release <= 3600, first_release

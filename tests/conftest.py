"""Shared fixtures: a real Mosquitto broker on a free loopback port (open, or with the deploy/ users and ACLs)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
DEPLOY = Path(__file__).resolve().parent.parent / "deploy"

# Users of the ACL broker (passwords for tests only; deploy/mosquitto.passwd.example documents the procedure).
ACL_USERS = {"svc/tops": "daemon-secret", "svc/consumer": "consumer-secret", "meter-a": "device-a-secret",
             "meter-b": "device-b-secret"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    msg = f"mosquitto did not open port {port}"
    raise TimeoutError(msg)


@dataclass
class Broker:
    """A running Mosquitto; ``stop()``/``start()`` restart it on the same port."""

    port: int
    conf: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.conf.with_suffix(".log").open("ab")
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=log, stderr=log)
        try:
            wait_port(self.port)
        except TimeoutError:
            self.stop()
            msg = f"mosquitto did not start: {self.conf.with_suffix('.log').read_text()[-500:]}"
            raise RuntimeError(msg) from None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


def _write_conf(tmp: Path, port: int, extra: str = "") -> Path:
    conf = tmp / "mosquitto.conf"
    # As root, mosquitto would switch to the `mosquitto` user, which cannot read files in pytest's tmp dirs.
    user = "user root\n" if os.geteuid() == 0 else ""
    conf.write_text(f"listener {port} 127.0.0.1\npersistence false\nmax_queued_messages 100000\n{user}{extra}")
    return conf


def _broker(tmp: Path, extra: str = "") -> Iterator[Broker]:
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed (.ci/run installs it)")
    port = free_port()
    b = Broker(port, _write_conf(tmp, port, extra))
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Broker]:
    """An anonymous broker on a free loopback port, persistence off."""
    yield from _broker(tmp_path, "allow_anonymous true\n")


# Debian's stock /etc/mosquitto/mosquitto.conf (mosquitto 2.0), used when the file is not on this machine.
STOCK_CONF = """pid_file /run/mosquitto/mosquitto.pid

persistence true
persistence_location /var/lib/mosquitto/

log_dest file /var/log/mosquitto/mosquitto.log

include_dir /etc/mosquitto/conf.d
"""


def deploy_broker_conf(tmp: Path, port: int, *, extra_dropins: tuple[str, ...] = ()) -> Path:
    """Debian's stock mosquitto.conf (paths moved under ``tmp``) with ``deploy/mosquitto.conf`` in its conf.d and
    the shipped ACL, exactly as the drop-in's header installs them; only paths, the port and (as root) the user
    change. Passwords for ``ACL_USERS`` are made with ``mosquitto_passwd``."""
    stock = Path("/etc/mosquitto/mosquitto.conf")
    text = stock.read_text() if stock.exists() else STOCK_CONF
    etc = tmp / "etc"
    (etc / "conf.d").mkdir(parents=True, exist_ok=True)
    (tmp / "lib").mkdir(exist_ok=True)
    text = (text.replace("/run/mosquitto/mosquitto.pid", str(tmp / "mosquitto.pid"))
            .replace("/var/lib/mosquitto/", f"{tmp / 'lib'}/")
            .replace("log_dest file /var/log/mosquitto/mosquitto.log", "log_dest stderr")
            .replace("/etc/mosquitto/conf.d", str(etc / "conf.d")))
    if os.geteuid() == 0:  # as root, mosquitto would switch to the `mosquitto` user, which cannot read tmp dirs
        text = "user root\n" + text
    conf = etc / "mosquitto.conf"
    conf.write_text(text)
    dropin = (DEPLOY / "mosquitto.conf").read_text()
    dropin = (dropin.replace("/etc/mosquitto/tops.passwd", str(etc / "tops.passwd"))
              .replace("/etc/mosquitto/tops.acl", str(etc / "tops.acl"))
              .replace("listener 1883 127.0.0.1", f"listener {port} 127.0.0.1"))
    (etc / "conf.d" / "tops.conf").write_text(dropin)
    for i, extra in enumerate(extra_dropins):
        (etc / "conf.d" / f"tops-{i}.conf").write_text(extra)
    passwd = etc / "tops.passwd"
    passwd.touch(mode=0o600)
    for user, password in ACL_USERS.items():
        subprocess.run(["mosquitto_passwd", "-b", str(passwd), user, password], check=True, capture_output=True)
    shutil.copy(DEPLOY / "mosquitto.acl", etc / "tops.acl")
    os.chmod(etc / "tops.acl", 0o600)
    return conf


@pytest.fixture
def mosquitto_acl(tmp_path: Path) -> Iterator[Broker]:
    """Debian's Mosquitto with its stock configuration plus the drop-in, users and ACL of deploy/."""
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed (.ci/run installs it)")
    port = free_port()
    b = Broker(port, deploy_broker_conf(tmp_path / "broker", port))
    b.start()
    try:
        yield b
    finally:
        b.stop()


# -- helpers for daemon tests ---------------------------------------------------------------------------------
def scrape(port: int) -> dict[str, float]:
    """Samples of the daemon's metrics endpoint as ``{"name{label=value}": value}`` (parsed by prometheus_client)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate()`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            v = predicate()
            if v:
                return v
        except Exception as exc:
            last_exc = exc
        time.sleep(interval)
    msg = f"timed out waiting for {what} (last error: {last_exc})"
    raise TimeoutError(msg)


def write_toml(path: Path, doc: dict) -> Path:
    """A tiny TOML writer for test configurations (tables of scalars and lists)."""
    import json

    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str | list):
            return json.dumps(v)
        return repr(v)

    lines: list[str] = []

    def table(name: str, d: dict) -> None:
        lines.append(f"[{name}]")
        sub = []
        for k, v in d.items():
            if isinstance(v, dict):
                sub.append((f"{name}.{k}", v))
            else:
                lines.append(f"{k} = {val(v)}")
        for n, t in sub:
            table(n, t)

    for name, d in doc.items():
        table(name, d)
    path.write_text("\n".join(lines) + "\n")
    return path


class DaemonProcess:
    """``tops run --config`` as a subprocess, stderr captured to a file."""

    def __init__(self, config: Path, metrics_port: int, cwd: Path, stdout=subprocess.DEVNULL) -> None:
        import sys

        self.log = cwd / "daemon.log"
        self.metrics_port = metrics_port
        self._logf = self.log.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config", str(config)],
                                     stdout=stdout, stderr=self._logf, cwd=Path(__file__).resolve().parent.parent)

    def metrics(self) -> dict[str, float]:
        return scrape(self.metrics_port)

    def wait_connected(self, timeout: float = 20.0) -> None:
        wait_for(lambda: self.metrics().get("tops_mqtt_connected") == 1.0, timeout, what="daemon connected")

    def stop(self, timeout: float = 30.0) -> int:
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        self._logf.close()
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._logf.close()

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


class Subscriber:
    """``mosquitto_sub -v`` in the background; ``lines`` collects ``(topic, payload)`` as they arrive."""

    def __init__(self, port: int, topic: str, *, user: tuple[str, str] | None = None, qos: int = 1) -> None:
        import threading

        cmd = ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-t", topic, "-q", str(qos), "-v"]
        if user:
            cmd += ["-u", user[0], "-P", user[1]]
        self.port, self.user = port, user
        self.lines: list[tuple[str, str]] = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            topic, _, payload = raw.decode().rstrip("\n").partition(" ")
            self.lines.append((topic, payload))

    def wait_ready(self, probe_topic: str, user: tuple[str, str] | None = None) -> None:
        """Publish probes on ``probe_topic`` until one arrives (the subscription is active)."""

        before = sum(1 for t, _ in self.lines if t == probe_topic)

        def seen() -> bool:
            publish(self.port, probe_topic, ["probe"], user=user)
            time.sleep(0.1)
            return sum(1 for t, _ in self.lines if t == probe_topic) > before

        wait_for(seen, 10, what="subscriber ready")

    def payloads(self, prefix: str = "dp/") -> list[dict]:
        import json

        return [json.loads(p) for t, p in list(self.lines) if t.startswith(prefix) and p != "probe"]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(5)


def publish(port: int, topic: str, lines: list[str] | list[bytes], *, qos: int = 1,
            user: tuple[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """``mosquitto_pub -l``: each line one message, in order."""
    cmd = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-t", topic, "-q", str(qos), "-l"]
    if user:
        cmd += ["-u", user[0], "-P", user[1]]
    data = b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines)
    return subprocess.run(cmd, input=data, capture_output=True, timeout=60, check=False)


def publish_file(port: int, topic: str, path: Path, *, qos: int = 1) -> subprocess.CompletedProcess[bytes]:
    """``mosquitto_pub -f``: the whole file as one message."""
    cmd = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-t", topic, "-q", str(qos), "-f", str(path)]
    return subprocess.run(cmd, capture_output=True, timeout=60, check=False)


TEMPLATE = {"epsilon": 1.0, "bound": 100.0, "holdout": 50, "query_range": 256, "fanout": 4}


def release_lines(text: str | bytes) -> list[dict]:
    """The releases among the JSON lines ``tops run`` wrote to stdout (a status line, without a tick, comes before
    each releasing numeric stream's first release: stream/core/sinks.py status_line)."""
    if isinstance(text, bytes):
        text = text.decode()
    return [r for r in map(json.loads, text.splitlines()) if "tick" in r]


def daemon_config(tmp: Path, port: int, metrics_port: int, **sections: dict) -> Path:
    """A test configuration: MQTT in (meters/+/reading), MQTT out (dp/{stream}), small ToPS parameters."""
    doc: dict = {
        "mqtt": {"host": "127.0.0.1", "port": port, "reconnect_min": 0.1, "reconnect_max": 1.0},
        "input": {"source": "mqtt", "topics": ["meters/+/reading"], "qos": 1},
        "output": {"sinks": ["mqtt"], "topic": "dp/{stream}", "qos": 1, "status_interval": 0.5,
                   "drain_timeout": 10.0},
        "streams": {"key_file": str(tmp / "master.key"), "max_streams": 100, "template": dict(TEMPLATE)},
        "metrics": {"port": metrics_port},
        "log": {"level": "info"},
        "state": {"data_dir": str(tmp / "state")},
    }
    for name, d in sections.items():
        for k, v in d.items():
            if isinstance(v, dict) and isinstance(doc.get(name, {}).get(k), dict):
                doc[name][k].update(v)
            else:
                doc.setdefault(name, {})[k] = v
    return write_toml(tmp / "tops.toml", doc)


def identity_from_log(text: str) -> str:
    """The run or store identity that ``tops run`` printed on stderr (the last one, after restarts)."""
    import re

    found = re.findall(r"identity ([0-9a-f]{32})", text)
    assert found, "tops run printed no identity"
    return found[-1]


def find_identity(tmp: Path) -> str:
    """The identity the streams of a test daemon under ``tmp`` derive their keys from: the state store's when it
    exists, else the run identity in ``tmp/daemon.log``."""
    db = tmp / "state" / "state.db"
    if db.exists():
        from stream.state.store import Store

        st = Store.open(db, readonly=True)
        try:
            return st.identity
        finally:
            st.close()
    return identity_from_log((tmp / "daemon.log").read_text(errors="replace"))



# -- NATS JetStream cluster (deploy/nats/nats-node.conf rendered on loopback) ----------------------------------------
NATS_SERVER = shutil.which("nats-server") or "/usr/sbin/nats-server"
NATS_PARTITIONS = 8


@dataclass
class NatsNode:
    name: str
    port: int
    conf: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.conf.with_suffix(".log").open("ab")
        self.proc = subprocess.Popen([NATS_SERVER, "-c", str(self.conf)], stdout=log, stderr=log)
        wait_port(self.port, 20)

    def kill(self) -> None:
        """SIGKILL: the node dies at once (its JetStream replicas on disk stay)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@dataclass
class NatsCluster:
    nodes: list[NatsNode]
    mqtt_port: int
    partitions: int

    @property
    def servers(self) -> list[str]:
        return [f"nats://127.0.0.1:{n.port}" for n in self.nodes]


def _wait_jetstream(servers: list[str], timeout: float = 60.0) -> None:
    """Until the cluster's JetStream answers (its meta leader elected) and places a stream on all its nodes: an
    answering meta leader that does not know every peer yet refuses a stream of three replicas ("no suitable peers
    for placement"), which a test that creates the streams at once then met."""
    import asyncio

    async def ready() -> None:
        import nats
        from nats.js.api import StorageType, StreamConfig

        nc = await nats.connect(servers=servers)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    js = nc.jetstream(timeout=2.0)
                    await js.account_info()
                    await js.add_stream(StreamConfig(name="READY_PROBE", subjects=["ready.probe"],
                                                     num_replicas=len(servers), storage=StorageType.MEMORY))
                    await js.delete_stream("READY_PROBE")
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.3)
        finally:
            await nc.close()

    asyncio.run(ready())


def render_nats_conf(name: str, client: int, cluster: int, mqtt: int, routes: list[int], store: Path,
                     partitions: int) -> str:
    from string import Template

    text = (Path(__file__).resolve().parent.parent / "deploy" / "nats" / "nats-node.conf").read_text()
    return Template(text).substitute(NAME=name, HOST="127.0.0.1", CLIENT_PORT=client, CLUSTER_PORT=cluster,
                                     MQTT_PORT=mqtt, STORE=str(store), PARTITIONS=partitions,
                                     ROUTES=", ".join(f"nats-route://127.0.0.1:{p}" for p in routes))


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three nats-server processes (JetStream, Raft) clustered on loopback, from deploy/nats/nats-node.conf."""
    if not Path(NATS_SERVER).exists():
        pytest.skip("nats-server is not installed (.ci/run installs it)")
    clients = [free_port() for _ in range(3)]
    routes = [free_port() for _ in range(3)]
    mqtts = [free_port() for _ in range(3)]
    nodes = []
    for i in range(3):
        conf = tmp_path / f"nats{i + 1}.conf"
        conf.write_text(render_nats_conf(f"n{i + 1}", clients[i], routes[i], mqtts[i], routes,
                                         tmp_path / f"js{i + 1}", NATS_PARTITIONS))
        nodes.append(NatsNode(f"n{i + 1}", clients[i], conf))
    try:
        for n in nodes:
            n.start()
        _wait_jetstream([f"nats://127.0.0.1:{p}" for p in clients])
        yield NatsCluster(nodes, mqtts[0], NATS_PARTITIONS)
    finally:
        for n in nodes:
            n.kill()

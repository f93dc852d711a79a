"""Helpers shared by the test modules, in one place: the command line as a subprocess, Mosquitto and NATS servers on
loopback ports, daemon processes and MQTT clients, replays to compare releases against, stand-in operators, hostile
inputs and the likelihood-ratio check of the privacy tests. Fixtures built on them are in ``tests/conftest.py``; no
test module imports another test module."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

if TYPE_CHECKING:
    from stream.core.router import Router
    from stream.daemon.service import Daemon

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


# -- the command line ------------------------------------------------------------------------------------------------
def tops(*args: object, stdin: bytes | str | None = None, text: bool = False, timeout: float = 120,
         **kw: Any) -> subprocess.CompletedProcess:
    """``python -m stream.cli ARGS`` from the repository's root, output captured, never raising on its exit code.
    ``stdin`` is what the command reads (bytes, or str with ``text=True``, which also gives str output); None lets
    it inherit ours. ``timeout`` stops a command that hangs."""
    return subprocess.run([sys.executable, "-m", "stream.cli", *map(str, args)], cwd=ROOT, input=stdin,
                          capture_output=True, text=text, timeout=timeout, check=False, **kw)


def run_tool(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """A program other than tops (promtool, openssl, systemd-analyze, install.sh), output captured as text, never
    raising on its exit code."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, **kw)


def tops_text(*args: object, stdin: str | None = None, timeout: float = 120,
              **kw: Any) -> subprocess.CompletedProcess[str]:
    """:func:`tops` with str in and out."""
    return tops(*args, stdin=stdin, text=True, timeout=timeout, **kw)


# -- Mosquitto -------------------------------------------------------------------------------------------------------
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"

# Users of the ACL broker (passwords for tests only; deploy/mosquitto.passwd.example documents the procedure).
ACL_USERS = {"svc/tops": "daemon-secret", "svc/consumer": "consumer-secret", "meter-a": "device-a-secret",
             "meter-b": "device-b-secret"}


def _ephemeral_ports() -> range:
    """The ports the kernel gives outgoing connections (Linux: ip_local_port_range)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


_PORTS = random.Random(os.getpid() ^ time.monotonic_ns())  # not a secret: test servers' ports
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, below the ephemeral range (a port the kernel may hand an outgoing
    connection, a NATS node's route to another, could be taken between this choice and the server's bind), and never
    one this process handed out before (a cluster's nine ports are chosen before any server binds one)."""
    ephemeral = _ephemeral_ports()
    for _ in range(1000):
        port = _PORTS.randrange(10_000, ephemeral.start if ephemeral.start > 11_000 else 30_000)
        if port in ephemeral or port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    msg = "no free loopback port below the ephemeral range"
    raise RuntimeError(msg)


def wait_port(port: int, timeout: float = 10.0, server: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until something listens on ``port``; fails at once if ``server`` (the process that should) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if server is not None and server.poll() is not None:
                msg = f"the server for port {port} exited with {server.returncode} before listening"
                raise TimeoutError(msg) from None
            time.sleep(0.05)
    msg = f"nothing listens on port {port} after {timeout:g} s"
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
            wait_port(self.port, server=self.proc)
        except TimeoutError:
            self.stop()
            msg = f"mosquitto did not start: {self.conf.with_suffix('.log').read_text()[-500:]}"
            raise RuntimeError(msg) from None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


class TricklingRelay:
    """A TCP relay on a free loopback port in front of a broker: what clients send goes through at once; what the
    broker sends them goes through at full speed, or, while ``trickle`` is set, ``burst`` bytes every ``every``
    seconds (a broker short of CPU, sending in bursts with the client's socket drained between them)."""

    def __init__(self, target: int, burst: int = 4096, every: float = 0.05) -> None:
        self.target, self.burst, self.every = target, burst, every
        self.trickle = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        try:
            while True:
                trickling = downstream and self.trickle.is_set()
                data = src.recv(self.burst if trickling else 1 << 16)
                if not data:
                    break
                dst.sendall(data)
                if trickling:
                    time.sleep(self.every)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self._server.close()


def broker_conf(tmp: Path, port: int, extra: str = "") -> Path:
    """A Mosquitto configuration in ``tmp``: one loopback listener on ``port``, persistence off unless ``extra``
    turns it on, and ``extra``'s lines."""
    conf = tmp / "mosquitto.conf"
    # As root, mosquitto would switch to the `mosquitto` user, which cannot read files in pytest's tmp dirs.
    user = "user root\n" if os.geteuid() == 0 else ""
    conf.write_text(f"listener {port} 127.0.0.1\npersistence false\nmax_queued_messages 100000\n{user}{extra}")
    return conf


def running_broker(tmp: Path, extra: str = "") -> Iterator[Broker]:
    """A Mosquitto with ``broker_conf(tmp, port, extra)`` on a free port, for a fixture to ``yield from``; skipped
    (with the reason) where Mosquitto is not installed."""
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed (.ci/run installs it)")
    port = free_port()
    b = Broker(port, broker_conf(tmp, port, extra))
    b.start()
    try:
        yield b
    finally:
        b.stop()


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


# -- daemons, clients and configurations ---------------------------------------------------------------------
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


def wait_while_progressing(measure: Callable[[], float], goal: float, stall: float = 30.0, interval: float = 0.5,
                           what: str = "progress") -> float:
    """Poll ``measure()`` until it reaches ``goal``. Fails only when the measure has not moved for ``stall`` seconds:
    a drain that is slow on a busy machine is waited for, one that has stopped is reported with where it stopped."""
    last, moved = measure(), time.monotonic()
    while last < goal:
        time.sleep(interval)
        now = measure()
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall:
            msg = f"{what} stopped at {last:g} of {goal:g} for {stall:g} s"
            raise TimeoutError(msg)
    return last


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

    def __init__(self, config: Path, metrics_port: int, cwd: Path, stdout=subprocess.DEVNULL, stdin=None,
                 umask: int = -1) -> None:
        self.log = cwd / "daemon.log"
        self.metrics_port = metrics_port
        self._logf = self.log.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config", str(config)],
                                     stdin=stdin, stdout=stdout, stderr=self._logf, cwd=ROOT, umask=umask)

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

    def __init__(self, port: int, topic: str, *, user: tuple[str, str] | None = None, qos: int = 1,
                 session: str | None = None) -> None:
        """``session``: a client id whose session the broker keeps (``-c``): messages for it wait while it is away
        (with a broker that persists them, across the broker's restart too)."""
        import threading

        cmd = ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-t", topic, "-q", str(qos), "-v"]
        if user:
            cmd += ["-u", user[0], "-P", user[1]]
        if session:
            cmd += ["-c", "-i", session]
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


def release_lines(text: str | bytes) -> list[dict]:
    """The releases among the JSON lines ``tops run`` wrote to stdout (the lines with a tick)."""
    if isinstance(text, bytes):
        text = text.decode()
    return [r for r in map(json.loads, text.splitlines()) if "tick" in r]


def own_releases(d: Daemon, key_file: Path, name: str, values: list[float]) -> dict[int, float]:
    """What stream ``name`` of daemon ``d`` releases by tick when its own operator (its key from ``key_file`` and the
    daemon's identity) takes ``values`` in their order."""
    from stream.core.config import build_operator
    from stream.core.keys import derive_stream_key, load_master_key

    key = derive_stream_key(load_master_key(key_file), name, identity=d.identity)
    rel = build_operator(d.cfg.template, "tops", key).process(np.array(values))
    return {t: float(v) for t, v in enumerate(rel) if not np.isnan(v)}


def stdin_config(tmp: Path, **state: object) -> Path:
    """A stdin -> stdout configuration with durable state in ``tmp/state``."""
    return write_toml(tmp / "tops.toml", {
        "input": {"source": "stdin"},
        "output": {"sinks": ["stdout"]},
        "streams": {"key_file": str(tmp / "master.key"), "template": dict(TEMPLATE)},
        "metrics": {"port": 0},
        "state": {"data_dir": str(tmp / "state"), **state},
    })


def stdin_daemon(tmp: Path, **template: float) -> Daemon:
    """The daemon in-process on the configuration of :func:`stdin_config` (its template changed by ``template``),
    nothing on stdin, its releases thrown away."""
    import io

    from stream.core.config import build_config
    from stream.daemon.service import Daemon

    cfg = build_config({
        "input": {"source": "stdin"},
        "output": {"sinks": ["stdout"]},
        "streams": {"key_file": str(tmp / "master.key"), "template": {**TEMPLATE, **template}},
        "metrics": {"port": 0},
        "state": {"data_dir": str(tmp / "state")},
    })
    return Daemon(cfg, stdin=io.BytesIO(b""), stdout=open(os.devnull, "w"), install_signals=False)


async def started(d: Daemon) -> None:
    """``d.startup()`` inside an event loop (``asyncio.run(started(d))``), as ``serve`` starts it."""
    d.startup()


class StdinRun:
    """``tops run --config`` on a stdin pipe, its releases collected as they come out."""

    def __init__(self, cfg: Path, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config", str(cfg)], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("wb"))
        self.releases: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            r = json.loads(line)
            if "tick" in r and "value" in r:
                self.releases.append(r)

    def send(self, stream: str, values: np.ndarray) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"".join(f"{stream},{v:g}\n".encode() for v in values))
        self.proc.stdin.flush()


def run_devices(port: int, stream: str, inputs: list[Path], *extra: str) -> None:
    """One ``tops device`` process per input file, all at once, reporting ``stream`` at QoS 1 without seq (budget up
    to 2); each must exit 0."""
    procs = [subprocess.Popen([sys.executable, "-m", "stream.cli", "device", "--host", "127.0.0.1", "--port", str(port),
                               "--stream", stream, "--max-epsilon", "2", "--input", str(f), "--qos", "1", "--no-seq",
                               "--control-timeout", "20", *extra], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for f in inputs]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()[-2000:]


class DeviceFeeder(threading.Thread):
    """One device (its own account, a persistent session, QoS 1) publishing ``{"value", "ts", "seq"}`` readings of
    its stream at a steady pace (``seq`` False: without ``seq``); every ``ts`` is distinct, so a release names the
    reading it came from. paho keeps what is published while the broker is away and sends it, and what was in
    flight, again after the reconnect."""

    T0 = 1767225600

    def __init__(self, port: int, user: tuple[str, str], n: int, rate: float, *, seq: bool = True) -> None:
        super().__init__(daemon=True)
        import paho.mqtt.client as mqtt

        self.stream, self.n, self.pause, self.seq = user[0], n, 1.0 / rate, seq
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"device-{user[0]}",
                                  clean_session=False)
        self.client.username_pw_set(*user)
        self.client.reconnect_delay_set(0.05, 0.5)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.infos: list = []

    def run(self) -> None:
        for i in range(self.n):
            reading = {"value": float(i % 90), "ts": self.T0 + i}
            body = json.dumps({**reading, "seq": i} if self.seq else reading)
            self.infos.append(self.client.publish(f"meters/{self.stream}/reading", body, qos=1))
            time.sleep(self.pause)

    def confirmed(self) -> bool:
        return all(info._published for info in self.infos)  # private: is_published() raises for a message
        # published while the broker was away, which paho still sends after the reconnect

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


# -- releases against the replay -------------------------------------------------------------------------------------
def replay(values: np.ndarray, key_file: Path, stream: str, tmp: Path, identity: str | None = None,
           grid: str = "exact", holdout: int = TEMPLATE["holdout"]) -> np.ndarray:
    """`tops replay` by subprocess with the daemon's master key file and identity (found under ``tmp`` if None), and
    the template's parameters with this holdout grid and holdout."""
    identity = identity or find_identity(tmp)
    src, out = tmp / f"{stream}.npy", tmp / f"{stream}.out.npy"
    np.save(src, values)
    cmd = [sys.executable, "-m", "stream.cli", "replay", str(src), "--epsilon", str(TEMPLATE["epsilon"]),
           "--bound", str(TEMPLATE["bound"]), "--holdout", str(holdout),
           "--range", str(TEMPLATE["query_range"]), "--fanout", str(TEMPLATE["fanout"]),
           "--key-file", str(key_file), "--identity", identity, "--stream", stream, "--out", str(out),
           "--holdout-grid", grid]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    return np.load(out)


def check_against_replay(releases: list[dict], values: np.ndarray, key_file: Path, stream: str, tmp: Path,
                         identity: str | None = None, grid: str = "exact", holdout: int = TEMPLATE["holdout"]) -> int:
    """Released ticks and values of ``stream`` equal the replay of ``values``; returns the number released."""
    expected = replay(values, key_file, stream, tmp, identity, grid, holdout)
    got = {r["tick"]: r["value"] for r in releases if r["stream"] == stream}
    want = {t: float(v) for t, v in enumerate(expected) if not np.isnan(v)}
    assert sorted(got) == sorted(want), f"stream {stream}: released ticks differ from replay"
    assert all(got[t] == want[t] for t in want), f"stream {stream}: released values differ from replay"
    return len(want)


# -- operators and the router ----------------------------------------------------------------------------------------
def key_of(name: str) -> bytes:
    """A stream's key in tests of operators and the router: SHA-256 of its name."""
    return hashlib.sha256(name.encode()).digest()


class FakeOperator:
    """Holds out ``holdout`` ticks, then releases value + 0.5 (deterministic; tests of the runtime only)."""

    def __init__(self, holdout: int = 2) -> None:
        self.holdout, self.ticks, self.theta = holdout, 0, None
        self.seen: list[float] = []

    @property
    def phase(self) -> str:
        return "holdout" if self.theta is None else "releasing"

    @property
    def holdout_left(self) -> int:
        return max(0, self.holdout - self.ticks)

    def process(self, values: np.ndarray) -> np.ndarray:
        return np.array([self.process_one(float(v)) for v in values])

    def process_one(self, v: float) -> float:
        self.seen.append(v)
        self.ticks += 1
        if self.ticks <= self.holdout:
            if self.ticks == self.holdout:
                self.theta = 10.0
            return math.nan
        return v + 0.5


def feed_router(router: Router, feed: list[tuple[str, float]], step: int) -> dict[str, list[tuple[int, float]]]:
    """``feed``'s readings into ``router``, flushed every ``step`` readings (and at the end); the released
    ``(tick, value)`` pairs of each stream."""
    got: dict[str, list[tuple[int, float]]] = {}
    for i, (name, v) in enumerate(feed):
        rec = router.record(name)
        assert router.add(rec, v, None, None, 0.0) == "ok"
        if (i + 1) % step == 0 or i + 1 == len(feed):
            for b in router.flush():
                got.setdefault(b.record.name, []).extend(zip(b.ticks, b.values, strict=True))
    return got


def holdout_readings(rng: np.random.Generator, n: int, bound: float) -> np.ndarray:
    """Readings with every kind a holdout meets: integers, half-unit ties, values above the bound and below 0."""
    kind = rng.integers(0, 4, n)
    out = rng.integers(0, 100, n).astype(float)
    out[kind == 1] += 0.5
    out[kind == 2] = bound * 3
    out[kind == 3] = -7.25
    return out


def failing_batch(cfg: Any, break_it: Callable[[], None], caplog: pytest.LogCaptureFixture) -> Router:
    """Four streams of ``cfg`` one reading before their holdout's end; ``break_it`` makes the batched end raise; three
    of them end in one step (with a new stream beside them): those three fail, logged without a value, no other."""
    import logging

    from operators.tops import ToPS
    from stream.core.router import Router

    router = Router(lambda name: ToPS(cfg, key_of(name)), 100)
    router.use_columns()
    feed_router(router, [(f"m{i % 4}", 5.0) for i in range(4 * (cfg.holdout - 1))], 8)  # one reading left each
    break_it()
    with caplog.at_level(logging.ERROR, logger="tops.router"):
        got = feed_router(router, [("m0", 77.5), ("m1", 5.0), ("m2", 6.0), ("fresh", 6.0)], 4)
    assert got == {}
    assert all(router.streams[n].failed for n in ("m0", "m1", "m2"))
    assert not router.streams["m3"].failed and not router.streams["fresh"].failed
    assert "77.5" not in caplog.text.replace("choice bug 77.5", "") and "RuntimeError" in caplog.text
    assert router.in_holdout == 2 and router.failed == 3
    return router


# -- hostile input ---------------------------------------------------------------------------------------------------
HUGE = "1" + "0" * 400  # 10^400: an int Python parses, too large for a float
HOSTILE_SCALARS = [HUGE, "-" + HUGE, HUGE + ".5", "1e400", "-1e400", "NaN", "Infinity", "-Infinity", "1e-400",
                   str(2**63), str(2**63 - 1), str(2**64), "-1", "-0", "0", "1.5", "true", "false", "null", '""',
                   '"12"', '"\\ud800"', '"\\u0000"', '"m\\u00e9ter"', '"\\ud83d\\ude00"', "[]", "{}", "[1]",
                   '{"value": 1}', "9" * 4000, "1" + "0" * 5000, "4102444800", "4102444801", "1700000000.25"]
FIELDS = ["value", "ts", "seq", "stream", "report", "phase", "theta"]


def hostile_doc(rng: Any, depth: int = 0) -> str:
    """One hostile JSON text (an object, a batch, a scalar or deep nesting), as a string; ``rng`` a
    ``random.Random``."""
    k = rng.random()
    if k < 0.45 or depth > 2:
        keys = rng.sample(FIELDS, rng.randint(0, len(FIELDS)))
        if rng.random() < 0.7 and "value" not in keys:
            keys.append("value")
        parts = []
        for key in keys:
            if key == "phase" and rng.random() < 0.5:
                v = rng.choice(['"threshold"', '"stream"', "{}", "[]"])
            else:
                v = rng.choice(HOSTILE_SCALARS)
            parts.append(f'"{key}": {v}')
        return "{" + ", ".join(parts) + "}"
    if k < 0.8:
        return "[" + ", ".join(hostile_doc(rng, depth + 1) if rng.random() < 0.5 else rng.choice(HOSTILE_SCALARS)
                               for _ in range(rng.randint(1, 6))) + "]"
    if k < 0.9:
        n = rng.choice([10, 1000, 100_000])
        return "[" * n + "1" + "]" * (n if rng.random() < 0.5 else 0)
    return rng.choice(HOSTILE_SCALARS)


NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def leaked(values, text: str) -> list[str]:
    """The raw readings written whole anywhere in `text` (as `%.6f` or as Python prints them).

    Whole numbers only: a noisy report such as 16.94269895 starts with the digits of the reading 16.94269 by
    chance (roughly one run in a hundred), and that is not a leak.
    """
    numbers = set(NUMBER.findall(text))
    return [s for v in values for s in (f"{v:.6f}", repr(float(v))) if s in numbers]


def short_id(value: Any) -> str:
    """A short test id for a parameter (hostile values are long)."""
    return repr(value)[:12]


class Hung(Exception):
    """The call did not return within its watchdog."""


@contextmanager
def watchdog(seconds: int = 30) -> Iterator[None]:
    """Stop the call inside after ``seconds`` (a hang detector, not a speed assertion)."""

    def stop(signum: int, frame: Any) -> None:
        raise Hung(f"no return within {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# -- the empirical privacy checks ------------------------------------------------------------------------------------
def uniforms(tag: int, count: int) -> np.ndarray:
    """``count`` keyed uniforms of the local domain under the key ``bytes([tag]) * 32``."""
    from operators.noise import Domain, KeyedGenerator

    return KeyedGenerator(bytes([tag]) * 32).uniforms(Domain.LOCAL, tag, 0, count)


DELTA = 1e-6  # the failure probability of each one-sided Chernoff bound


def _kl(p: float, q: float) -> float:
    def term(a: float, b: float) -> float:
        return 0.0 if a == 0 else a * math.log(a / b)

    return term(p, q) + term(1 - p, 1 - q)


def chernoff_bounds(k: int, n: int, delta: float = DELTA) -> tuple[float, float]:
    """(lower, upper) with n KL(k/n || bound) = log(1/delta), by bisection."""
    p_hat, level = k / n, math.log(1 / delta) / n
    lo_a, lo_b = 0.0, p_hat
    for _ in range(100):
        mid = (lo_a + lo_b) / 2
        if mid > 0 and _kl(p_hat, mid) > level:
            lo_a = mid
        else:
            lo_b = mid
    up_a, up_b = p_hat, 1.0
    for _ in range(100):
        mid = (up_a + up_b) / 2
        if mid < 1 and _kl(p_hat, mid) > level:
            up_b = mid
        else:
            up_a = mid
    return lo_a, up_b


def worst_ratio(a: np.ndarray, b: np.ndarray, edges: np.ndarray) -> tuple[float, float]:
    """(largest lower-confidence likelihood ratio over bins and both directions, largest point estimate)."""
    ka, _ = np.histogram(a, edges)
    kb, _ = np.histogram(b, edges)
    bound, point = 0.0, 0.0
    for x, y in ((ka, kb), (kb, ka)):
        for i in range(len(x)):
            if x[i] == 0:
                continue
            low, _ = chernoff_bounds(int(x[i]), a.size)
            _, up = chernoff_bounds(int(y[i]), b.size)
            bound = max(bound, low / up)
            if y[i]:
                point = max(point, x[i] / y[i])
    return bound, point


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
        wait_port(self.port, 20, self.proc)

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


def wait_jetstream(servers: list[str], timeout: float = 60.0) -> None:
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

    text = (DEPLOY / "nats" / "nats-node.conf").read_text()
    return Template(text).substitute(NAME=name, HOST="127.0.0.1", CLIENT_PORT=client, CLUSTER_PORT=cluster,
                                     MQTT_PORT=mqtt, STORE=str(store), PARTITIONS=partitions,
                                     ROUTES=", ".join(f"nats-route://127.0.0.1:{p}" for p in routes))


class Feeder(threading.Thread):
    """Publishes ``{"value", "seq"}`` readings of several streams at QoS 1, interleaved, at a steady pace."""

    def __init__(self, port: int, values: dict[str, np.ndarray], rate: float,
                 starts: dict[str, int] | None = None) -> None:
        super().__init__(daemon=True)
        import paho.mqtt.client as mqtt

        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="feeder")
        self.client.max_inflight_messages_set(100)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.values, self.pause = values, 1.0 / rate
        self.starts = starts or dict.fromkeys(values, 0)  # the round of each stream's first reading
        self.sent = 0
        self.total = sum(len(v) for v in values.values())
        self.flowing = threading.Event()  # cleared: the feeder pauses before its next round
        self.flowing.set()

    def wait_sent(self, count: int) -> None:
        """Wait until ``count`` readings were published (or every reading was): the kill points are counts of
        readings sent, so they fall at the same places in the input however fast the machine runs."""
        wait_for(lambda: self.sent >= min(count, self.total) or not self.is_alive(), 60, interval=0.005,
                 what=f"{count} readings sent")

    def run(self) -> None:
        n = max(self.starts[s] + len(v) for s, v in self.values.items())
        infos = []
        for i in range(n):
            for s, v in self.values.items():
                j = i - self.starts[s]
                if 0 <= j < len(v):
                    self.flowing.wait()
                    payload = json.dumps({"value": float(v[j]), "seq": j})
                    infos.append(self.client.publish(f"meters/{s}/reading", payload, qos=1))
                    self.sent += 1
            time.sleep(self.pause)
        for info in infos:
            info.wait_for_publish(30)
        self.client.loop_stop()
        self.client.disconnect()


class PlainFeeder(Feeder):
    """Publishes plain numbers (no ``seq``) of several streams at QoS 1, interleaved, at a steady pace."""

    def run(self) -> None:
        n = max(len(v) for v in self.values.values())
        infos = []
        for i in range(n):
            for s, v in self.values.items():
                if i < len(v):
                    self.flowing.wait()
                    infos.append(self.client.publish(f"meters/{s}/reading", f"{float(v[i]):g}", qos=1))
                    self.sent += 1
            time.sleep(self.pause)
        for info in infos:
            info.wait_for_publish(30)
        self.client.loop_stop()


# a fleet-holdout template small enough for tests (tests/daemon, tests/state and tests/e2e share it)
FLEET_TEMPLATE = {"epsilon": 1.0, "bound": 50.0, "holdout": 40, "fanout": 2, "query_range": 64,
                  "holdout_scope": "fleet"}


def fleet_releases(key_file: Path, identity: str, template: dict, lines: list[tuple[str, float]],
                   generation: int = 1) -> dict[str, dict[int, float]]:
    """What the fleet's operators release of ``lines`` (in their order) with the daemon's keys: the fleet holdout
    (its key derived under FLEET_KEY_NAME) takes the first readings, each stream's own ToPS the others; every reading
    is a tick of its stream, the held ones released by none. ``generation``: the streams' key generation (the
    fleet's is the template's ``fleet_generation``)."""
    from operators import ToPSConfig
    from operators.fleet_holdout import FLEET_KEY_NAME, FleetHoldout, FleetMember
    from stream.core.keys import derive_stream_key, load_master_key

    cfg = ToPSConfig(**{**FLEET_TEMPLATE, **template})
    master = load_master_key(key_file)
    fleet = FleetHoldout(cfg, derive_stream_key(master, FLEET_KEY_NAME, identity=identity,
                                                generation=cfg.fleet_generation))
    ops: dict[str, Any] = {}
    ticks: dict[str, int] = {}
    out: dict[str, dict[int, float]] = {}
    for name, v in lines:
        if name not in ops:
            key = derive_stream_key(master, name, identity=identity, generation=generation)
            ops[name] = FleetMember(fleet, key) if fleet.choice is None else fleet.member(key)
        r = float(ops[name].process(np.array([v]))[0])
        tick = ticks[name] = ticks.get(name, -1) + 1
        if not math.isnan(r):
            out.setdefault(name, {})[tick] = r
    return out

"""Shared fixtures: real Mosquitto brokers on free loopback ports (open, persistent, or with the deploy/ users and
ACLs), a three-node NATS JetStream cluster, and the compiled kernels loaded. Their helpers are in tests/support.py."""

from __future__ import annotations

import compileall
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import (
    MOSQUITTO,
    NATS_PARTITIONS,
    NATS_SERVER,
    Broker,
    NatsCluster,
    NatsNode,
    deploy_broker_conf,
    free_port,
    render_nats_conf,
    running_broker,
    tops,
    wait_jetstream,
)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers a core. Most tests wait on a daemon, a broker or a NATS cluster starting, not on the
    CPU; the tests that measure progress under load run one at a time all the same (xdist group "heavy")."""
    return 2 * len(os.sched_getaffinity(0))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist starts its workers
def pytest_sessionstart(session: pytest.Session) -> None:
    """The kernels a daemon compiles at its first holdout end are compiled once, here, into the checkout's numba cache,
    before any worker starts. On a fresh clone every test daemon would otherwise compile them itself, several at once,
    its event loop held for tens of seconds on a loaded machine: a test that waits on progress would see a stall."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller has done it
        return
    compile_project_bytecode()
    with tempfile.TemporaryDirectory() as tmp:
        ran = simulated = tops("simulate", "--streams", "2", "--ticks", "3000")
        if simulated.returncode == 0:
            ran = tops("run", "--key-file", Path(tmp) / "master.key", "--data-dir", "", stdin=simulated.stdout,
                       timeout=600, env={**os.environ, "TOPS_NOISE_KERNEL": "numba"})
    if ran.returncode != 0:
        pytest.exit(f"warming the compiled kernels failed: {ran.stderr.decode(errors='replace')[-2000:]}", 3)


def compile_project_bytecode() -> None:
    """The project's modules are compiled to bytecode once, before the daemons start. Where the environment sets
    PYTHONDONTWRITEBYTECODE (CI machines and containers often do), Python would otherwise compile every module of
    ``operators`` and ``stream`` from source again in each of the hundreds of processes the tests start: 0.4 s of CPU
    each here."""
    root = Path(__file__).resolve().parent.parent
    for package in ("operators", "stream"):
        compileall.compile_dir(root / package, quiet=1, workers=0)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that start a NATS cluster run one after another on one worker (xdist group "nats"): three servers
    and their workers each."""
    for item in items:
        if "nats_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("nats"))


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Broker]:
    """An anonymous broker on a free loopback port, persistence off."""
    yield from running_broker(tmp_path, "allow_anonymous true\n")


@pytest.fixture
def mosquitto_persistent(tmp_path: Path) -> Iterator[Broker]:
    """A broker that keeps sessions across a restart (persistence on, in ``tmp_path``): a consumer's queue survives
    it."""
    yield from running_broker(tmp_path, f"allow_anonymous true\npersistence true\npersistence_location {tmp_path}/\n")


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
        wait_jetstream([f"nats://127.0.0.1:{p}" for p in clients])
        yield NatsCluster(nodes, mqtts[0], NATS_PARTITIONS)
    finally:
        for n in nodes:
            n.kill()


@pytest.fixture
def compiled_kernels() -> None:
    """The compiled kernels loaded, as a daemon (which draws often) has them."""
    from operators import noise

    noise._kernel(1 << 16)
    assert noise.compiled_loaded()

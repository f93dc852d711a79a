"""Cluster workers on a real 3-node NATS JetStream cluster: partitions leased in the key-value store,
kill -9 of a worker and of a NATS node mid-stream, a worker added, and the releases against the replay."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stream.core.config import build_config, build_operator, load_config
from stream.core.errors import ConfigFileError
from stream.core.keys import derive_stream_key, load_master_key
from tests.support import (
    FLEET_TEMPLATE,
    NATS_SERVER,
    ROOT,
    TEMPLATE,
    NatsCluster,
    fleet_releases,
    free_port,
    scrape,
    wait_for,
    write_toml,
)

# JetStream API requests the tests make themselves, for workers they set up by hand: the meta leader of a loaded
# cluster (four test processes on two cores) can take longer than a worker's 5 s to create a bucket
SETUP_API_TIMEOUT = 20.0


@pytest.mark.parametrize(("doc", "line"), [
    ({"input": {"source": "nats"}, "ticks": {"mode": "period"}},
     '[input] source = "nats" releases one tick per reading ([ticks] mode = "reading")'),
    ({"input": {"source": "nats"}, "streams": {"mode": "local"}, "local": {"streams": ["a"]}},
     '[input] source = "nats" runs numeric central streams ([streams] kind = "numeric", mode = "central")'),
    ({"input": {"source": "nats"}, "nats": {"output_subject": "tops.in"}},
     "[nats] output_subject must differ from input_subject"),
    ({"input": {"source": "nats"}, "nats": {"input_subject": "tops.*"}},
     "[nats] input_subject must be a subject without wildcards (got 'tops.*')"),
])
def test_bad_cluster_configuration_gives_one_line_each(doc: dict, line: str) -> None:
    doc = {"streams": {"template": dict(TEMPLATE)}, **doc}
    doc["streams"] = {"template": dict(TEMPLATE), **doc["streams"]}
    with pytest.raises(ConfigFileError) as err:
        build_config(doc)
    assert line in err.value.problems, err.value.problems
    assert len(err.value.problems) == 1, err.value.problems


def test_the_shipped_worker_configuration_is_valid() -> None:
    cfg = load_config(ROOT / "deploy" / "nats" / "worker.toml")
    assert cfg.input.source == "nats" and cfg.nats.partitions == 64


def worker_config(tmp: Path, cluster: NatsCluster, name: str, metrics_port: int = 0, key_file: str = "master.key",
                  partitions: int | None = None, template: dict | None = None) -> Path:
    return write_toml(tmp / f"{name}.toml", {
        "input": {"source": "nats"},
        "nats": {"servers": cluster.servers, "partitions": partitions or cluster.partitions, "worker": name,
                 "lease_ttl": 5.0,
                 "checkpoint_interval": 0.3, "fetch_batch": 200},
        "streams": {"key_file": str(tmp / key_file), "template": dict(template or TEMPLATE)},
        "metrics": {"port": metrics_port},
    })


class Worker:
    """A `tops run` cluster worker process."""

    def __init__(self, cfg: Path, tmp: Path, name: str) -> None:
        self.err = (tmp / f"{name}.err").open("wb")
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config", str(cfg)], cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=self.err)
        self.path = tmp / f"{name}.err"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return -9
        return int(self.proc.returncode)

    def log(self) -> str:
        return self.path.read_text(errors="replace")


class JetStreamFeeder(threading.Thread):
    """Publishes every stream's readings in order through JetStream (each acknowledged: accepted), with the message
    id ``<stream>:<i>`` so that a retry after a lost acknowledgement is dropped by the server."""

    def __init__(self, servers: list[str], values: dict[str, np.ndarray], rate: float) -> None:
        super().__init__(daemon=True)
        self.servers, self.values, self.pause = servers, values, 1.0 / rate
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # reported by the test
            self.error = exc

    async def _run(self) -> None:
        import nats

        nc = await nats.connect(servers=self.servers, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        js = nc.jetstream(timeout=2.0)
        n = max(len(v) for v in self.values.values())
        for i in range(n):
            for s, v in self.values.items():
                if i >= len(v):
                    continue
                for _ in range(60):
                    try:
                        await js.publish(f"meters.{s}.reading", f"{float(v[i]):g}".encode(),
                                         headers={"Nats-Msg-Id": f"{s}:{i}"})
                        break
                    except Exception:  # no leader for a moment (a node was killed): retry, same id
                        await asyncio.sleep(0.2)
                else:
                    raise RuntimeError("a reading was never accepted")
                self.sent += 1
            await asyncio.sleep(self.pause)
        await nc.close()


async def _releases(servers: list[str]) -> dict[tuple[str, int], set[float]]:
    """Every release in the output stream: (stream, tick) -> the values published for it (read message by message
    with direct gets: no consumer to place on a cluster that just lost a node)."""
    import nats
    from nats.js.errors import NotFoundError

    nc = await nats.connect(servers=servers)
    js = nc.jetstream(timeout=5.0)
    out: dict[tuple[str, int], set[float]] = {}
    try:
        info = await js.stream_info("TOPS_OUT")
        seqs = list(range(info.state.first_seq, info.state.last_seq + 1))

        async def get(seq: int) -> bytes | None:
            try:
                return (await js.get_msg("TOPS_OUT", seq)).data
            except NotFoundError:
                return None

        for k in range(0, len(seqs), 200):
            for data in await asyncio.gather(*(get(q) for q in seqs[k:k + 200])):
                if data:
                    r = json.loads(data)
                    out.setdefault((r["stream"], r["tick"]), set()).add(r["value"])
    finally:
        await nc.close()
    return out


async def _stored(servers: list[str], stream: str, subjects: str) -> int:
    """How many messages of ``stream`` are on ``subjects`` (-1: no such stream yet, or no leader to answer)."""
    import nats

    nc = await nats.connect(servers=servers)
    try:
        info = await nc.jetstream(timeout=2.0).stream_info(stream, subjects_filter=subjects)
        return sum((info.state.subjects or {}).values()) if subjects != ">" else int(info.state.messages)
    except Exception:
        return -1
    finally:
        await nc.close()


async def _identity(servers: list[str]) -> str:
    import nats

    nc = await nats.connect(servers=servers)
    kv = await nc.jetstream().key_value("tops_meta")
    ident = (await kv.get("identity")).value.decode()
    await nc.close()
    return ident


@pytest.mark.network
@pytest.mark.slow
def test_failover_of_a_worker_and_a_nats_node_never_noises_a_tick_twice(nats_cluster: NatsCluster,
                                                                          tmp_path: Path) -> None:
    """Three workers over 8 partitions; 24 streams x 150 readings through JetStream (and 2 streams over MQTT into the
    NATS MQTT listener). Mid-stream: kill -9 one worker, kill -9 one NATS node, start a fourth worker. Every (stream,
    tick) is released with exactly one value, that value is `tops replay`'s (the same operator, key and identity), and
    every accepted reading is in: all ticks of every stream are there."""
    (tmp_path / "master.key").write_text(os.urandom(32).hex() + "\n")
    (tmp_path / "master.key").chmod(0o600)
    rng = np.random.default_rng(14)
    values = {f"m{i}": rng.integers(0, 120, 150).astype(float) for i in range(24)}
    mqtt_values = {f"q{i}": rng.integers(0, 120, 80).astype(float) for i in range(2)}
    cluster = nats_cluster
    mports = {1: free_port(), 2: free_port()}  # the two workers that live through the test
    workers = [Worker(worker_config(tmp_path, cluster, f"w{i}", mports.get(i, 0)), tmp_path, f"w{i}")
               for i in range(3)]
    feeder = JetStreamFeeder(cluster.servers[:2], values, rate=40)
    try:
        time.sleep(2.0)  # the workers create the streams and take their partitions
        # MQTT readings reach JetStream as plain NATS messages: one sent before the input stream exists is stored
        # nowhere (a slow start once lost q0's first reading that way); devices publish once the cluster is up
        wait_for(lambda: asyncio.run(_stored(cluster.servers, "TOPS_IN", ">")) >= 0, 60, interval=0.5,
                 what="the input stream")
        for s, v in mqtt_values.items():
            r = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(cluster.mqtt_port), "-q", "1",
                                "-t", f"meters/{s}/reading", "-l"], input="".join(f"{x:g}\n" for x in v).encode(),
                               capture_output=True, timeout=60, check=False)
            assert r.returncode == 0, r.stderr.decode()
        for s, v in mqtt_values.items():  # accepted over MQTT (QoS 1): stored in the input stream
            wait_for(lambda s=s, v=v: asyncio.run(_stored(cluster.servers, "TOPS_IN", f"tops.in.*.{s}")) == len(v),
                     30, interval=0.5, what=f"{len(v)} readings of {s} in the input stream")
        feeder.start()
        time.sleep(1.0)
        workers[0].kill()  # kill -9 a worker mid-stream
        time.sleep(1.0)
        cluster.nodes[2].kill()  # kill -9 a NATS node mid-stream
        time.sleep(1.0)
        workers.append(Worker(worker_config(tmp_path, cluster, "w3"), tmp_path, "w3"))  # a worker joins
        feeder.join(120)
        assert not feeder.is_alive() and feeder.error is None, feeder.error
        everything = {**values, **mqtt_values}
        want = sum(len(v) - TEMPLATE["holdout"] for v in everything.values())
        servers = cluster.servers[:2]
        try:
            wait_for(lambda: len(asyncio.run(_releases(servers))) >= want, 90, interval=2.0, what="every release")
        finally:
            got = asyncio.run(_releases(servers))
            short = {s: len(v) - TEMPLATE["holdout"] - sum(1 for (n, _) in got if n == s)
                     for s, v in everything.items()}
            print("missing releases per stream:", {s: k for s, k in short.items() if k})
            if any(short.values()):  # what the workers said (no value is ever logged)
                for w in workers:
                    print(f"--- {w.name}", *w.log().splitlines()[-40:], sep="\n")
        identity = asyncio.run(_identity(servers))

        def view() -> dict:
            r = subprocess.run([sys.executable, "-m", "stream.cli", "cluster", "--config", str(tmp_path / "w1.toml"),
                                "--json"], cwd=ROOT, capture_output=True, timeout=60, check=False)
            assert r.returncode == 0, r.stderr.decode()
            return json.loads(r.stdout)

        # the worker that joined is up (stopped while still joining, it would end before its handlers exist)
        wait_for(lambda: "cluster identity" in workers[3].log(), 60, interval=0.5, what="the fourth worker joined")
        # the workers' Prometheus endpoints (deploy/tops.rules.yml alerts on these); which worker published how much
        # depends on who held which partition when: their sum, not one worker's count (w1 alone once had 0)
        ms = [scrape(p) for p in mports.values()]
        assert all("tops_cluster_partitions_owned" in m and "tops_cluster_releases_total" in m for m in ms)
        assert sum(m["tops_cluster_releases_total"] for m in ms) > 0
        # `tops cluster`: every partition owned by a live worker, nothing left behind its floor
        wait_for(lambda: all(p["owner"] in {"w1", "w2", "w3"} and p["lag"] == 0 for p in view()["partitions"]),
                 60, interval=1.0, what="tops cluster: all partitions owned, no lag")
    finally:
        codes = [w.stop() for w in workers[1:]]
        workers[0].kill()
    assert codes == [0, 0, 0], [w.log()[-3000:] for w in workers]
    for w in workers:
        assert "Traceback" not in w.log(), w.log()[-3000:]
    twice = {k: v for k, v in got.items() if len(v) > 1}
    assert not twice, f"(stream, tick) with two values: {sorted(twice)[:5]}"
    cfg = load_config(worker_config(tmp_path, cluster, "check"))
    master = load_master_key(tmp_path / "master.key")
    for s, v in everything.items():
        op = build_operator(cfg.template, "tops", derive_stream_key(master, s, identity=identity))
        expected = op.process(v)
        want_ticks = {t: float(x) for t, x in enumerate(expected) if not np.isnan(x)}
        have = {t: next(iter(vals)) for (name, t), vals in got.items() if name == s}
        assert sorted(have) == sorted(want_ticks), f"stream {s}: ticks differ from the replay"
        assert all(have[t] == want_ticks[t] for t in want_ticks), f"stream {s}: values differ from the replay"
    assert "handed back" in "".join(w.log() for w in workers[1:3]) or "taken" in workers[3].log()


@pytest.mark.network
def test_a_worker_that_lost_its_lease_writes_and_publishes_nothing_more(nats_cluster: NatsCluster,
                                                                         tmp_path: Path) -> None:
    """The attack: worker A owns the partition and is paused (its lease expires); B takes the partition. A wakes up
    with readings it fetched before: its fetch from its own consumer fails (B deleted it), its lease renewal is
    refused, and it drops the partition without one more state write or release. B continues from the checkpoint:
    every tick once, equal to the replay."""
    from stream.cluster.worker import ClusterWorker

    (tmp_path / "master.key").write_text(os.urandom(32).hex() + "\n")
    (tmp_path / "master.key").chmod(0o600)
    cfg = load_config(worker_config(tmp_path, nats_cluster, "a"))
    cfg.nats.values["partitions"] = 1
    master = load_master_key(tmp_path / "master.key")
    values = np.random.default_rng(3).integers(0, 120, 90).astype(float)

    async def scenario() -> tuple[int, int, dict[tuple[str, int], set[float]], str]:
        import nats

        a, b = ClusterWorker(cfg, master, name="a"), ClusterWorker(cfg, master, name="b")
        for w in (a, b):
            w.nc = await nats.connect(servers=nats_cluster.servers)
            w.js = w.nc.jetstream(timeout=SETUP_API_TIMEOUT)
            from stream.cluster.jetstream import ensure

            w.kv = await ensure(w.js, w.names)
            await w._identity()
        pub = await nats.connect(servers=nats_cluster.servers)
        pjs = pub.jetstream()

        async def feed(vals: np.ndarray, first: int) -> None:
            for i, v in enumerate(vals):
                await pjs.publish(f"{cfg.nats.input_subject}.0.x", f"{v:g}".encode(),
                                  headers={"Nats-Msg-Id": f"x:{first + i}"})

        await a._acquire(0)
        await feed(values[:60], 0)
        while a.owned[0].applied < 60:
            await a._step()
        await a._maintain(0.0)  # releases 0..9 published, state and floor written
        out_before = (await a.js.stream_info("TOPS_OUT")).state.messages
        # A is paused: its lease expires (deleted here rather than waited for) and B takes the partition
        await b.kv["leases"].delete("p.0")
        await b._acquire(0)
        await feed(values[60:], 60)
        a_fetched = await a._step()  # A, awake: its consumer is gone
        await a._maintain(0.0)  # its renewal is refused: fenced
        out_after_a = (await a.js.stream_info("TOPS_OUT")).state.messages
        lost = int(a.m_fenced._value.get())
        while b.owned[0].applied < 90:
            await b._step()
        await b._maintain(0.0)
        for w in (a, b):
            await w.nc.close()
        await pub.close()
        got = await _releases(nats_cluster.servers)
        ident = await _identity(nats_cluster.servers)
        return a_fetched, out_after_a - out_before, got, ident if lost == 1 else ""

    a_fetched, a_published, got, identity = asyncio.run(scenario())
    assert identity, "A was not fenced"
    assert a_fetched == 0 and a_published == 0
    op = build_operator(cfg.template, "tops", derive_stream_key(master, "x", identity=identity))
    want = {t: float(x) for t, x in enumerate(op.process(values)) if not np.isnan(x)}
    assert {t: vals for (s, t), vals in got.items() if s == "x"} == {t: {v} for t, v in want.items()}


def test_the_shipped_node_configurations_are_the_template_for_three_hosts() -> None:
    """deploy/nats/nats1..3.conf are nats-node.conf for hosts nats1..3 with 64 partitions (the worker.toml's P), and
    nats-server accepts each."""
    from string import Template

    d = ROOT / "deploy" / "nats"
    body = (d / "nats-node.conf").read_text().split("\n", 3)[3]
    for i in (1, 2, 3):
        text = (d / f"nats{i}.conf").read_text()
        want = Template(body).substitute(NAME=f"nats{i}", HOST="0.0.0.0", CLIENT_PORT=4222, CLUSTER_PORT=6222,  # noqa: S104
                                         MQTT_PORT=1883, STORE="/var/lib/nats/jetstream", PARTITIONS=64,
                                         ROUTES=", ".join(f"nats-route://nats{k}:6222" for k in (1, 2, 3)))
        assert text.split("\n", 1)[1] == want
    assert load_config(d / "worker.toml").nats.partitions == 64
    if not Path(NATS_SERVER).exists():
        pytest.skip("nats-server is not installed: the files match the template, nats-server's own check of them "
                    "is skipped (.ci/run installs it)")
    for i in (1, 2, 3):
        r = subprocess.run([NATS_SERVER, "-c", str(d / f"nats{i}.conf"), "-t"], capture_output=True, timeout=30,
                           check=False)
        assert r.returncode == 0, r.stderr.decode()


@pytest.mark.network
def test_a_paused_worker_does_not_publish_what_it_processed_before_losing_its_lease(nats_cluster: NatsCluster,
                                                                                    tmp_path: Path) -> None:
    """The attack: worker A fetched and processed readings, then paused before publishing their releases (its
    lease expired meanwhile and B took the partition). Awake, A must not publish them: its lease is older than half
    its life, the renewal is refused, and the partition is dropped with its pending releases."""
    import nats

    from stream.cluster.jetstream import ensure
    from stream.cluster.worker import ClusterWorker

    (tmp_path / "master.key").write_text(os.urandom(32).hex() + "\n")
    (tmp_path / "master.key").chmod(0o600)
    cfg = load_config(worker_config(tmp_path, nats_cluster, "a"))
    cfg.nats.values["partitions"] = 1
    master = load_master_key(tmp_path / "master.key")

    async def scenario() -> tuple[int, int, int]:
        a, b = ClusterWorker(cfg, master, name="a"), ClusterWorker(cfg, master, name="b")
        for w in (a, b):
            w.nc = await nats.connect(servers=nats_cluster.servers)
            w.js = w.nc.jetstream(timeout=SETUP_API_TIMEOUT)
            w.kv = await ensure(w.js, w.names)
            await w._identity()
        pjs = a.nc.jetstream()
        await a._acquire(0)
        for i in range(70):
            await pjs.publish(f"{cfg.nats.input_subject}.0.x", f"{i % 90}".encode(), headers={"Nats-Msg-Id": f"x:{i}"})
        part = a.owned[0]
        taken = 0
        while taken < 70:  # fetched and processed, not published
            msgs = await part.sub.fetch(70 - taken, timeout=2)
            await a._take(part, msgs)
            taken += len(msgs)
        part.renewed -= 2 * a.names.lease_ttl  # paused that long
        await b.kv["leases"].delete("p.0")  # its lease expired
        await b._acquire(0)
        before = (await a.js.stream_info("TOPS_OUT")).state.messages
        await a._fresh_leases()
        await a._publish()
        after = (await a.js.stream_info("TOPS_OUT")).state.messages
        for w in (a, b):
            await w.nc.close()
        return after - before, len(a.owned), taken

    published, owned, taken = asyncio.run(scenario())
    assert taken == 70
    assert published == 0 and owned == 0


def _one_partition(tmp_path: Path, cluster: NatsCluster) -> tuple[Any, bytes]:
    """A worker configuration with one partition, and a fresh master key (the single-worker attack tests)."""
    (tmp_path / "master.key").write_text(os.urandom(32).hex() + "\n")
    (tmp_path / "master.key").chmod(0o600)
    cfg = load_config(worker_config(tmp_path, cluster, "a"))
    cfg.nats.values["partitions"] = 1
    return cfg, load_master_key(tmp_path / "master.key")


async def _joined(cfg: Any, master: bytes, cluster: NatsCluster) -> Any:
    """Worker "a", connected to the cluster, its buckets and the cluster's identity ready (no partition yet)."""
    import nats

    from stream.cluster.jetstream import ensure
    from stream.cluster.worker import ClusterWorker

    w = ClusterWorker(cfg, master, name="a")
    w.nc = await nats.connect(servers=cluster.servers)
    w.js = w.nc.jetstream(timeout=SETUP_API_TIMEOUT)
    w.kv = await ensure(w.js, w.names)
    await w._identity()
    return w


class _GetFailsOnce:
    """The state bucket as the worker sees it while a NATS node dies: the first read of one key times out (the
    client's own timeout, as in the failover test); everything else goes to the real bucket."""

    def __init__(self, kv, key: str) -> None:
        self.kv, self.key, self.armed = kv, key, True

    async def get(self, key: str):
        if self.armed and key == self.key:
            self.armed = False
            from nats.errors import TimeoutError as NatsTimeout

            raise NatsTimeout
        return await self.kv.get(key)

    def __getattr__(self, name: str):
        return getattr(self.kv, name)


@pytest.mark.network
def test_a_state_read_that_times_out_leaves_no_unloaded_stream_behind(nats_cluster: NatsCluster,
                                                                       tmp_path: Path) -> None:
    """The attack (the failover test lost a tick this way): a worker reads a stream's stored state the first time
    it sees it, and that read times out (a NATS node was just killed). The step fails and the worker drops its
    partitions, as ``serve`` does; it takes the partition again and goes on. The stream must be loaded from its
    stored state then, not continue as the fresh record the failed read left behind (which restarts the stream at
    tick 0, is never checkpointed, and lets the floor pass readings its stored state never took): every tick once,
    equal to the replay."""
    from stream.cluster.jetstream import state_key

    cfg, master = _one_partition(tmp_path, nats_cluster)
    values = np.random.default_rng(5).integers(0, 120, 120).astype(float)

    async def scenario() -> tuple[dict[tuple[str, int], set[float]], str]:
        w = await _joined(cfg, master, nats_cluster)
        pjs = w.nc.jetstream()

        async def feed(first: int, last: int) -> None:
            for i in range(first, last):
                await pjs.publish(f"{cfg.nats.input_subject}.0.x", f"{values[i]:g}".encode(),
                                  headers={"Nats-Msg-Id": f"x:{i}"})

        async def run_until(n: int) -> None:
            for _ in range(400):
                if 0 in w.owned and w.owned[0].applied >= n:
                    break
                try:  # what serve does with a step that fails
                    if 0 not in w.owned:
                        await w._acquire(0)
                    await w._step()
                    await w._maintain(0.0)
                except Exception as exc:
                    await w._reset(type(exc).__name__)
            await w._maintain(0.0)

        await w._acquire(0)
        await feed(0, 70)
        await run_until(70)  # tick 69 is in the stored state; releases 50..69 out
        await w._reset("a test")  # the partition is dropped (it could be anything: a publish not confirmed)
        w.kv["state"] = _GetFailsOnce(w.kv["state"], state_key("x"))
        await feed(70, 120)
        await run_until(120)
        await w.nc.close()
        return await _releases(nats_cluster.servers), await _identity(nats_cluster.servers)

    got, identity = asyncio.run(scenario())
    op = build_operator(cfg.template, "tops", derive_stream_key(master, "x", identity=identity))
    want = {t: float(x) for t, x in enumerate(op.process(values)) if not np.isnan(x)}
    assert {t: vals for (s, t), vals in got.items() if s == "x"} == {t: {v} for t, v in want.items()}


class _LosesOnePublish:
    """The worker's NATS connection, whose ``lose``-th release is lost: never stored, its confirmation an error (the
    stream's leader died with it); everything else is the real connection's."""

    def __init__(self, nc, releases: str, lose: int) -> None:
        self.nc, self.releases, self.lose, self.seen = nc, releases + ".", lose, 0

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "", headers=None):
        if subject.startswith(self.releases):
            self.seen += 1
            if self.seen == self.lose:
                await self.nc.publish(reply, b'{"error":{"code":503,"description":"lost in flight"}}')
                return
        await self.nc.publish(subject, payload, reply=reply, headers=headers)

    def __getattr__(self, name: str):
        return getattr(self.nc, name)


@pytest.mark.network
def test_a_release_whose_publish_is_not_confirmed_is_made_again_before_any_state_covers_it(
        nats_cluster: NatsCluster, tmp_path: Path) -> None:
    """The attack: releases are sent pipelined, their confirmations gathered a step later, and one of them is lost
    (its confirmation an error). No state may be written that covers its tick before it is confirmed, or it is gone
    for good (the worker would never make it again): the step fails, the worker drops its partition as ``serve``
    does, takes it again from the last checkpoint and makes the lost release again, the same bytes. Every tick is
    released once, equal to the replay; the lost publish was met."""
    cfg, master = _one_partition(tmp_path, nats_cluster)
    values = np.random.default_rng(9).integers(0, 120, 120).astype(float)

    async def scenario() -> tuple[dict[tuple[str, int], set[float]], str, int]:
        w = await _joined(cfg, master, nats_cluster)
        pjs = w.nc.jetstream()
        lossy = w.nc = _LosesOnePublish(w.nc, cfg.nats.output_subject, lose=12)
        await w._acquire(0)
        for i in range(120):
            await pjs.publish(f"{cfg.nats.input_subject}.0.x", f"{values[i]:g}".encode(),
                              headers={"Nats-Msg-Id": f"x:{i}"})
        failures = 0
        for _ in range(400):
            if 0 in w.owned and w.owned[0].applied >= 120 and not w.unconfirmed:
                break
            try:  # what serve does with a step that fails
                if 0 not in w.owned:
                    await w._acquire(0)
                await w._step()
                await w._maintain(0.0)
            except Exception as exc:
                failures += 1
                await w._reset(type(exc).__name__)
        await w._maintain(0.0)
        await w.nc.close()
        assert lossy.seen > lossy.lose
        return await _releases(nats_cluster.servers), await _identity(nats_cluster.servers), failures

    got, identity, failures = asyncio.run(scenario())
    assert failures >= 1
    op = build_operator(cfg.template, "tops", derive_stream_key(master, "x", identity=identity))
    want = {t: float(x) for t, x in enumerate(op.process(values)) if not np.isnan(x)}
    assert {t: vals for (s, t), vals in got.items() if s == "x"} == {t: {v} for t, v in want.items()}


class _LosesOneDelivery:
    """A partition's pull subscription whose connection drops one delivery in flight (the server counts it
    delivered: its node died while the message was on the wire); everything else is the real consumer's."""

    def __init__(self, sub, lose: int) -> None:
        self.sub, self.lose, self.seen = sub, lose, 0

    async def fetch(self, batch: int, timeout: float):
        msgs = await self.sub.fetch(batch, timeout=timeout)
        out = []
        for m in msgs:
            self.seen += 1
            if self.seen != self.lose:
                out.append(m)
        return out

    def __getattr__(self, name: str):
        return getattr(self.sub, name)


@pytest.mark.network
def test_a_delivery_lost_in_flight_is_fetched_again_not_acknowledged_away(nats_cluster: NatsCluster,
                                                                           tmp_path: Path) -> None:
    """The attack (how the failover test lost one tick of one stream): a node dies while a fetched message is on
    the wire. The consumer counts it delivered and goes on with the next ones; a worker that takes the later messages,
    moves the floor past them and acknowledges them (ack policy all) has acknowledged away a reading it never saw.
    The worker sees the gap in the consumer's delivery sequence and fetches again from the last message it took:
    every tick once, equal to the replay."""
    cfg, master = _one_partition(tmp_path, nats_cluster)
    values = np.random.default_rng(6).integers(0, 120, 120).astype(float)

    async def scenario() -> tuple[dict[tuple[str, int], set[float]], str]:
        w = await _joined(cfg, master, nats_cluster)
        pjs = w.nc.jetstream()
        for i, v in enumerate(values):
            await pjs.publish(f"{cfg.nats.input_subject}.0.x", f"{v:g}".encode(), headers={"Nats-Msg-Id": f"x:{i}"})
        await w._acquire(0)
        w.owned[0].sub = _LosesOneDelivery(w.owned[0].sub, lose=80)
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:  # the consumer is made again beside this loop, as beside serve's
            if w.owned[0].applied >= 120 and not w.router.dirty:
                break
            if not await w._step():
                await asyncio.sleep(0.02)
            await w._maintain(0.0)
        await w._maintain(0.0)
        await w.nc.close()
        return await _releases(nats_cluster.servers), await _identity(nats_cluster.servers)

    got, identity = asyncio.run(scenario())
    op = build_operator(cfg.template, "tops", derive_stream_key(master, "x", identity=identity))
    want = {t: float(x) for t, x in enumerate(op.process(values)) if not np.isnan(x)}
    assert {t: vals for (s, t), vals in got.items() if s == "x"} == {t: {v} for t, v in want.items()}


class _SlowConsumerCreation:
    """JetStream as a worker sees it right after a NATS node died: the first consumer made for one partition waits
    ``delay`` seconds for its raft group's leader (the election waits out the dead peer: 5-10 s measured on the
    failover test's cluster). A caller whose timeout is shorter gives up then, as the real client does; everything
    else goes to the real JetStream."""

    def __init__(self, js, subject: str, delay: float) -> None:
        self.js, self.subject, self.delay, self.armed = js, subject, delay, True

    async def add_consumer(self, stream: str, config=None, timeout: float | None = None, **params):
        if self.armed and config is not None and config.filter_subject == self.subject:
            self.armed = False
            wait = 5.0 if timeout is None else timeout  # the worker's client timeout: 5 s
            await asyncio.sleep(min(wait, self.delay))
            if wait < self.delay:
                from nats.errors import TimeoutError as NatsTimeout

                raise NatsTimeout
        return await self.js.add_consumer(stream, config, timeout=timeout, **params)

    def __getattr__(self, name: str):
        return getattr(self.js, name)


@pytest.mark.network
def test_a_consumer_creation_that_outlasts_a_lease_stops_no_partition_held(nats_cluster: NatsCluster,
                                                                            tmp_path: Path) -> None:
    """The attack (how the failover test stalled a partition for its 90 s): right after a NATS node died, making a
    partition's consumer waits for a raft election, longer than the client's timeout and than a lease's life. A
    worker that waits for it in its main loop stops releasing the partitions it holds, loses their leases (5 s) and
    gives up the creation, round after round. Here the worker holds partition 0 and takes partition 1, whose first
    consumer takes 8 s: partition 0 must go on (no pause of its intake above 2 s: its loop passes take milliseconds,
    a checkpoint 0.3 s), never be lost, and partition 1 must be taken; every tick of both streams once, equal to the
    replay."""
    cfg, master = _one_partition(tmp_path, nats_cluster)
    cfg.nats.values["partitions"] = 2
    x = np.random.default_rng(7).integers(0, 120, 160).astype(float)
    y = np.random.default_rng(8).integers(0, 120, 60).astype(float)

    async def scenario() -> tuple[dict[tuple[str, int], set[float]], str, float, float, int]:
        w = await _joined(cfg, master, nats_cluster)
        pjs = w.nc.jetstream()
        for i, v in enumerate(y):
            await pjs.publish(f"{cfg.nats.input_subject}.1.y", f"{v:g}".encode(), headers={"Nats-Msg-Id": f"y:{i}"})
        await w._acquire(0)
        w.js = _SlowConsumerCreation(w.js, w.names.partition_subject(1), delay=8.0)

        async def feed() -> None:  # partition 0's readings arrive all along (8 s)
            for i, v in enumerate(x):
                await pjs.publish(f"{cfg.nats.input_subject}.0.x", f"{v:g}".encode(),
                                  headers={"Nats-Msg-Id": f"x:{i}"})
                await asyncio.sleep(0.05)

        async def watch() -> float:  # the longest time partition 0 took no reading while readings came
            feeding = asyncio.ensure_future(feed())
            longest, last, seen = 0.0, time.monotonic(), -1
            deadline = time.monotonic() + 60.0
            while time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                now = time.monotonic()
                part = w.owned.get(0)
                applied = part.applied if part is not None else seen
                if applied != seen or feeding.done():
                    longest = max(longest, now - last) if seen >= 0 else longest
                    last, seen = now, applied
                held = [w.owned.get(i) for i in (0, 1)]
                if feeding.done() and all(p is not None for p in held) and not w.router.dirty and \
                        {w.js_seq.get("x"), w.js_seq.get("y")} <= {p.applied for p in held if p is not None}:
                    break
            await feeding
            w.stopping.set()
            return longest

        watcher = asyncio.ensure_future(watch())
        await w._run()  # ends with both partitions handed back (checkpointed)
        longest = await watcher
        lost = int(w.m_fenced._value.get())
        taken = float(w.m_partitions._value.get())
        await w.nc.close()
        return await _releases(nats_cluster.servers), await _identity(nats_cluster.servers), longest, taken, lost

    got, identity, longest, _, lost = asyncio.run(scenario())
    assert lost == 0, "a partition held was lost while another's consumer was being made"
    assert longest < 2.0, f"partition 0 took no reading for {longest:.1f} s while partition 1's consumer was made"
    for name, values in (("x", x), ("y", y)):
        op = build_operator(cfg.template, "tops", derive_stream_key(master, name, identity=identity))
        want = {t: float(v) for t, v in enumerate(op.process(values)) if not np.isnan(v)}
        assert {t: vals for (s, t), vals in got.items() if s == name} == {t: {v} for t, v in want.items()}, name


def _key_file(path: Path) -> str:
    """A fresh master key file (mode 0600); returns its 64 hex digits (to check that no output shows them)."""
    text = os.urandom(32).hex()
    path.write_text(text + "\n")
    path.chmod(0o600)
    return text


async def _publish_readings(servers: list[str], stream: str, values: np.ndarray, first: int) -> None:
    """Readings ``first..`` of ``stream`` on partition 0 of the input (one-partition workers), each acknowledged by
    JetStream."""
    import nats

    nc = await nats.connect(servers=servers)
    js = nc.jetstream(timeout=5.0)
    for i, v in enumerate(values, start=first):
        await js.publish(f"tops.in.0.{stream}", f"{v:g}".encode(), headers={"Nats-Msg-Id": f"{stream}:{i}"})
    await nc.close()


@pytest.mark.network
def test_a_worker_with_another_master_key_is_refused_and_the_stream_stays_under_one_key(
        nats_cluster: NatsCluster, tmp_path: Path) -> None:
    """The attack: worker A (master key k1) handles readings 0..199 of a stream and stops; worker B, the same
    configuration but another key file (k2), joins the same cluster while readings 200..255 wait. B must not noise
    them under k2: it stops at the start with one line (exit 2, no key material), takes no partition and releases
    nothing; `tops cluster` says which configuration's key is the cluster's. A later worker with k1 continues the
    stream: every tick once, equal to `tops replay` with k1."""
    k1 = _key_file(tmp_path / "master.key")
    k2 = _key_file(tmp_path / "other.key")
    values = np.random.default_rng(17).integers(0, 120, 256).astype(float)
    servers = nats_cluster.servers
    holdout = int(TEMPLATE["holdout"])

    def ticks_out() -> dict[int, set[float]]:
        return {t: v for (s, t), v in asyncio.run(_releases(servers)).items() if s == "x"}

    a = Worker(worker_config(tmp_path, nats_cluster, "a", partitions=1), tmp_path, "a")
    workers = [a]
    try:
        wait_for(lambda: "cluster identity" in a.log(), 60, interval=0.2, what="worker A joined")
        asyncio.run(_publish_readings(servers, "x", values[:200], 0))
        wait_for(lambda: len(ticks_out()) == 200 - holdout, 60, interval=0.5, what="A's releases of ticks 50..199")
        assert a.stop() == 0, a.log()[-3000:]
        asyncio.run(_publish_readings(servers, "x", values[200:], 200))
        b = Worker(worker_config(tmp_path, nats_cluster, "b", key_file="other.key", partitions=1), tmp_path, "b")
        workers.append(b)
        # today's B takes the partition and releases ticks 200..255 under k2: wait for its end or for those
        wait_for(lambda: b.proc.poll() is not None or len(ticks_out()) == 256 - holdout, 60, interval=0.5,
                 what="worker B refused or releasing")
        b_code, b_log, after_b = b.stop(), b.log(), ticks_out()
        assert max(after_b) == 199, f"worker B released ticks {min(set(after_b) - set(range(200)))}.. under k2"
        assert b_code == 2, b_log[-3000:]
        refusal = [line for line in b_log.splitlines() if line.startswith("tops run:")]
        assert len(refusal) == 1 and "another master key" in refusal[0], b_log[-3000:]
        assert "taken" not in b_log, b_log[-3000:]
        for name, verdict in (("b", "differs"), ("a", "matches")):  # `tops cluster` compares a configuration's key
            r = subprocess.run([sys.executable, "-m", "stream.cli", "cluster", "--config",
                                str(tmp_path / f"{name}.toml"), "--json"], cwd=ROOT, capture_output=True, timeout=60,
                               check=False)
            assert r.returncode == 0 and json.loads(r.stdout)["key"] == verdict, r.stderr.decode()
        c = Worker(worker_config(tmp_path, nats_cluster, "c", partitions=1), tmp_path, "c")
        workers.append(c)
        wait_for(lambda: len(ticks_out()) == 256 - holdout, 60, interval=0.5, what="C's releases of ticks 200..255")
        assert c.stop() == 0, c.log()[-3000:]
    finally:
        for w in workers:
            w.kill()
    for w in workers:
        text = w.log()
        assert k1 not in text and k2 not in text and "Traceback" not in text, text[-3000:]
    master = load_master_key(tmp_path / "master.key")
    op = build_operator(load_config(tmp_path / "a.toml").template, "tops",
                        derive_stream_key(master, "x", identity=asyncio.run(_identity(servers))))
    want = {t: {float(x)} for t, x in enumerate(op.process(values)) if not np.isnan(x)}
    assert ticks_out() == want, "the stream's ticks differ from the replay with k1"


@pytest.mark.network
def test_two_workers_with_different_keys_starting_together_on_an_empty_cluster_leave_one_key(
        nats_cluster: NatsCluster, tmp_path: Path) -> None:
    """The race: two workers with different master keys join an empty cluster at the same moment (each on its own
    connection; the buckets are there, empty). Whatever the interleaving, the cluster's key check is created once
    (compare-and-set), so exactly one of them is refused and the survivor's key is the cluster's. Twelve empty
    clusters (bucket prefixes)."""
    import nats

    from stream.cluster.jetstream import ensure
    from stream.cluster.worker import ClusterWorker, WorkerError

    _key_file(tmp_path / "master.key")
    _key_file(tmp_path / "other.key")
    cfg = load_config(worker_config(tmp_path, nats_cluster, "a"))
    cfg.nats.values["partitions"] = 1
    cfg.nats.values["replicas"] = 1  # each round's buckets: made in milliseconds, not a raft group's election
    keys = [load_master_key(tmp_path / "master.key"), load_master_key(tmp_path / "other.key")]

    async def scenario() -> list[list[str]]:
        outcomes: list[list[str]] = []
        for r in range(12):
            cfg.nats.values["bucket_prefix"] = f"race{r}"
            pair = [ClusterWorker(cfg, k, name=f"w{i}") for i, k in enumerate(keys)]
            for w in pair:
                w.nc = await nats.connect(servers=nats_cluster.servers)
                w.js = w.nc.jetstream(timeout=SETUP_API_TIMEOUT)
            await ensure(pair[0].js, pair[0].names)  # empty buckets (made together, they take election rounds)
            done = await asyncio.gather(*(w._join() for w in pair), return_exceptions=True)
            outcomes.append(["refused" if isinstance(x, WorkerError) else "joined" if x is True else repr(x)
                             for x in done])
            stored = (await pair[0].kv["meta"].get("key_check")).value.decode()
            outcomes[-1] += [f"{w.name}'s key" for w, x in zip(pair, done, strict=True) if x is True and
                             stored == w.key_check]
            for w in pair:
                await w.nc.close()
        return outcomes

    outcomes = asyncio.run(scenario())
    assert all(o in (["joined", "refused", "w0's key"], ["refused", "joined", "w1's key"]) for o in outcomes), outcomes


@pytest.mark.network
def test_a_stream_state_made_under_another_key_or_identity_is_refused_when_loaded(nats_cluster: NatsCluster,
                                                                                   tmp_path: Path) -> None:
    """The attack past the start's check: the cluster's meta bucket (its identity and key check) is lost while the
    streams' states remain. A worker that starts then makes a new identity and a new key check that agree with each
    other, so only the stream's own state can say it was noised under other keys (here the same key file under the
    lost identity: its stream keys are gone). Loading it, the worker must refuse: it processes no reading of the
    stream, releases nothing, writes no state, hands its partition back and ends with one line."""
    from nats.js.errors import KeyDeletedError, KeyNotFoundError

    from stream.cluster.jetstream import state_key
    from stream.cluster.worker import ClusterWorker, WorkerError

    cfg, master = _one_partition(tmp_path, nats_cluster)
    values = np.random.default_rng(9).integers(0, 120, 160).astype(float)

    async def feed(js: Any, first: int, last: int) -> None:
        for i in range(first, last):
            await js.publish(f"{cfg.nats.input_subject}.0.x", f"{values[i]:g}".encode(),
                             headers={"Nats-Msg-Id": f"x:{i}"})

    async def scenario() -> tuple[str, int, int, bytes, bytes, bool]:
        a = await _joined(cfg, master, nats_cluster)
        await a._acquire(0)
        await feed(a.js, 0, 120)
        renewed = time.monotonic()
        while a.owned[0].applied < 120:
            await a._step()
            renewed = await a._maintain(renewed)  # its lease renewed (a loaded machine takes seconds here)
        await a._drop(a.owned[0], hand_back=True)  # state and floor written, lease given back
        stored = (await a.kv["state"].get(state_key("x"))).value
        await a.js.delete_key_value(a.names.meta)  # the identity and the key check are lost
        out_before = (await a.js.stream_info("TOPS_OUT")).state.messages
        await feed(a.js, 120, 160)
        b = ClusterWorker(cfg, master, name="b")
        why = ""
        try:
            await asyncio.wait_for(b.serve(), 30)
        except WorkerError as exc:
            why = str(exc)
        except TimeoutError:
            why = "not refused"
        out_after = (await a.js.stream_info("TOPS_OUT")).state.messages
        after = (await a.kv["state"].get(state_key("x"))).value
        try:
            await a.kv["leases"].get("p.0")
            free = False
        except (KeyNotFoundError, KeyDeletedError):
            free = True
        await a.nc.close()
        if b.nc is not None and not b.nc.is_closed:
            await b.nc.close()
        return why, out_before, out_after, stored, after, free

    why, out_before, out_after, stored, after, free = asyncio.run(scenario())
    assert "another master key" in why, why
    assert out_after == out_before, f"{out_after - out_before} releases under the new identity"
    assert after == stored, "the stream's state was written again"
    assert free, "the refused worker kept the partition's lease"


@pytest.mark.network
@pytest.mark.slow
def test_one_fleet_holdout_for_the_cluster_whichever_worker_takes_which_partition(nats_cluster: NatsCluster,
                                                                                tmp_path: Path) -> None:
    """``holdout_scope = "fleet"`` on two workers over the partitions, one of them killed with SIGKILL mid-stream and a
    third started: the cluster has one fleet holdout (the input's first ``holdout`` readings, in the input stream's
    order, whichever partitions they are on), every stream releases with its one choice, and every (stream, tick)
    is the fleet's operators' on the readings in the order they were published: none twice, none missing."""
    _key_file(tmp_path / "master.key")
    rng = np.random.default_rng(15)
    values = {f"m{i}": rng.integers(0, 50, 30).astype(float) for i in range(12)}
    cluster = nats_cluster
    workers = [Worker(worker_config(tmp_path, cluster, f"f{i}", template=FLEET_TEMPLATE), tmp_path, f"f{i}")
               for i in range(2)]
    feeder = JetStreamFeeder(cluster.servers, values, rate=60)
    try:
        wait_for(lambda: asyncio.run(_stored(cluster.servers, "TOPS_IN", ">")) >= 0, 60, interval=0.5,
                 what="the input stream")
        feeder.start()
        wait_for(lambda: feeder.sent >= 12 * 10, 60, what="10 rounds of readings published")
        workers[0].kill()  # after the choice: its partitions move, the choice stays the cluster's
        workers.append(Worker(worker_config(tmp_path, cluster, "f2", template=FLEET_TEMPLATE), tmp_path, "f2"))
        feeder.join(120)
        assert not feeder.is_alive() and feeder.error is None, feeder.error
        want_count = 12 * 30 - FLEET_TEMPLATE["holdout"]
        wait_for(lambda: sum(len(v) for v in asyncio.run(_releases(cluster.servers)).values()) >= want_count, 120,
                 interval=2.0, what="every release")
        got = asyncio.run(_releases(cluster.servers))
        identity = asyncio.run(_identity(cluster.servers))
    finally:
        codes = [w.stop() for w in workers[1:]]
        workers[0].kill()
    assert codes == [0, 0], [w.log()[-3000:] for w in workers]
    assert all("Traceback" not in w.log() for w in workers)
    assert not {k: v for k, v in got.items() if len(v) > 1}, "a (stream, tick) with two values"
    order = [(s, float(v[i])) for i in range(30) for s, v in values.items()]  # the feeder's order
    want = fleet_releases(tmp_path / "master.key", identity, {}, order)
    assert {(s, t): {v} for s, ticks in want.items() for t, v in ticks.items()} == got
    thetas = {line.split("theta ")[1].split()[0] for w in workers for line in w.log().splitlines()
              if "fleet holdout generation" in line}
    assert len(thetas) == 1, thetas  # every worker read the one choice

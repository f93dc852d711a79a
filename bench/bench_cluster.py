"""Cluster workers on a 3-node NATS JetStream cluster on this machine: throughput with 1, 2 and 3 workers, and
failover time.

    python bench/bench_cluster.py [--streams 200] [--readings 500] [--partitions 8]

1. Throughput: ``streams x readings`` readings (holdout 50) are first stored in the input stream; then k workers
   start and the clock runs until the output stream holds every release. Readings per second = readings / time
   (worker start-up, about 1 s, included).
2. Failover: two workers run; one is killed with SIGKILL; the time until every partition is leased again (the
   dead worker's leases expire after ``lease_ttl``) and until the first release of one of its partitions after it.

Everything runs on loopback on this machine: the three NATS servers and the workers share its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from string import Template

ROOT = Path(__file__).resolve().parent.parent
HOLDOUT = 50


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_cluster(tmp: Path, partitions: int) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    clients, routes, mqtts = ([free_port() for _ in range(3)] for _ in range(3))
    text = (ROOT / "deploy" / "nats" / "nats-node.conf").read_text()
    procs = []
    for i in range(3):
        conf = tmp / f"n{i}.conf"
        conf.write_text(Template(text).substitute(
            NAME=f"n{i}", HOST="127.0.0.1", CLIENT_PORT=clients[i], CLUSTER_PORT=routes[i], MQTT_PORT=mqtts[i],
            STORE=str(tmp / f"js{i}"), PARTITIONS=partitions,
            ROUTES=", ".join(f"nats-route://127.0.0.1:{p}" for p in routes)))
        procs.append(subprocess.Popen([shutil.which("nats-server") or "/usr/sbin/nats-server", "-c", str(conf)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    servers = [f"nats://127.0.0.1:{p}" for p in clients]

    async def ready() -> None:
        import nats

        nc = await nats.connect(servers=servers, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        for _ in range(200):
            try:
                await nc.jetstream(timeout=2).account_info()
                break
            except Exception:
                await asyncio.sleep(0.3)
        await nc.close()

    time.sleep(0.5)
    asyncio.run(ready())
    return procs, servers


def worker_toml(tmp: Path, servers: list[str], partitions: int, name: str) -> Path:
    p = tmp / f"{name}.toml"
    p.write_text(f"""[input]
source = "nats"
[nats]
servers = {servers!r}
partitions = {partitions}
worker = "{name}"
lease_ttl = 3.0
checkpoint_interval = 0.5
[streams]
key_file = "{tmp / 'master.key'}"
[streams.template]
epsilon = 1.0
bound = 100.0
holdout = {HOLDOUT}
query_range = 1024
[metrics]
port = 0
""")
    return p


def start_worker(cfg: Path, tmp: Path) -> subprocess.Popen[bytes]:
    err = (tmp / (cfg.stem + ".err")).open("ab")
    return subprocess.Popen([sys.executable, "-m", "stream.cli", "run", "--config", str(cfg)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=err)


async def preload(servers: list[str], streams: int, readings: int) -> None:
    import nats

    nc = await nats.connect(servers=servers)
    js = nc.jetstream(timeout=10)
    from nats.js.api import StreamConfig

    await js.add_stream(StreamConfig(name="TOPS_IN", subjects=["tops.in.>"], num_replicas=3))
    futs = []
    for i in range(readings):
        for s in range(streams):
            futs.append(js.publish(f"meters.s{s}.reading", f"{(i * 7 + s) % 90}".encode()))
            if len(futs) >= 2000:
                await asyncio.gather(*futs)
                futs = []
    await asyncio.gather(*futs)
    await nc.close()


async def out_count(servers: list[str]) -> int:
    import nats

    nc = await nats.connect(servers=servers)
    try:
        return int((await nc.jetstream(timeout=5).stream_info("TOPS_OUT")).state.messages)
    except Exception:
        return 0
    finally:
        await nc.close()


async def leased(servers: list[str], partitions: int) -> set[str]:
    try:
        return await _leased(servers, partitions)
    except Exception:  # a request timed out (the machine is busy): ask again
        return {"?"}


async def _leased(servers: list[str], partitions: int) -> set[str]:
    import nats
    from nats.js.errors import KeyDeletedError, KeyNotFoundError

    nc = await nats.connect(servers=servers)
    try:
        kv = await nc.jetstream(timeout=5).key_value("tops_leases")
    except Exception:  # not created yet (no worker up)
        await nc.close()
        return {"-"}
    owners = set()
    for p in range(partitions):
        try:
            owners.add((await kv.get(f"p.{p}")).value.decode())
        except (KeyNotFoundError, KeyDeletedError):
            owners.add("-")
    await nc.close()
    return owners


def cpu_seconds(procs: list[subprocess.Popen[bytes]]) -> float:
    """User + system CPU seconds the running processes ``procs`` have used so far (from /proc)."""
    total = 0
    for p in procs:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    return total / os.sysconf("SC_CLK_TCK")


def throughput(k: int, args: argparse.Namespace) -> tuple[float, float, float, float]:
    """Readings per second with ``k`` workers, the wall seconds, and the CPU seconds of the workers and of the three
    NATS servers over the run (the servers' CPU of the preload taken out)."""
    tmp = Path(tempfile.mkdtemp(prefix="tops-bench-cluster-"))
    (tmp / "master.key").write_text(os.urandom(32).hex() + "\n")
    (tmp / "master.key").chmod(0o600)
    procs, servers = start_cluster(tmp, args.partitions)
    workers = []
    try:
        asyncio.run(preload(servers, args.streams, args.readings))
        want = args.streams * (args.readings - HOLDOUT)
        servers_before = cpu_seconds(procs)
        t0 = time.perf_counter()
        workers = [start_worker(worker_toml(tmp, servers, args.partitions, f"w{i}"), tmp) for i in range(k)]
        while asyncio.run(out_count(servers)) < want:
            time.sleep(0.5)
            if time.perf_counter() - t0 > 900:
                raise TimeoutError("releases did not all arrive")
        wall = time.perf_counter() - t0
        return args.streams * args.readings / wall, wall, cpu_seconds(workers), cpu_seconds(procs) - servers_before
    finally:
        for w in workers:
            w.send_signal(signal.SIGKILL)
        for p in procs:
            p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def failover(args: argparse.Namespace) -> tuple[float, float]:
    tmp = Path(tempfile.mkdtemp(prefix="tops-bench-cluster-"))
    (tmp / "master.key").write_text(os.urandom(32).hex() + "\n")
    (tmp / "master.key").chmod(0o600)
    procs, servers = start_cluster(tmp, args.partitions)
    workers = []
    try:
        workers = [start_worker(worker_toml(tmp, servers, args.partitions, f"w{i}"), tmp) for i in range(2)]
        while asyncio.run(leased(servers, args.partitions)) != {"w0", "w1"}:
            time.sleep(0.2)
        time.sleep(2.0)
        workers[0].send_signal(signal.SIGKILL)
        t0 = time.perf_counter()
        while asyncio.run(leased(servers, args.partitions)) != {"w1"}:
            time.sleep(0.1)
        moved = time.perf_counter() - t0
        before = asyncio.run(out_count(servers))
        asyncio.run(preload_small(servers, args.partitions))
        while asyncio.run(out_count(servers)) <= before:
            time.sleep(0.05)
        return moved, time.perf_counter() - t0
    finally:
        for w in workers:
            w.send_signal(signal.SIGKILL)
        for p in procs:
            p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


async def preload_small(servers: list[str], partitions: int) -> None:
    """Enough readings of enough streams that every partition releases something."""
    import nats

    nc = await nats.connect(servers=servers)
    js = nc.jetstream(timeout=10)
    for _ in range(HOLDOUT + 1):
        await asyncio.gather(*(js.publish(f"meters.f{s}.reading", b"5") for s in range(8 * partitions)))
    await nc.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--readings", type=int, default=500)
    ap.add_argument("--partitions", type=int, default=8)
    args = ap.parse_args()
    print(f"{args.streams} streams x {args.readings} readings, {args.partitions} partitions, 3 NATS nodes, "
          f"{os.cpu_count()} cores")
    for k in (1, 2, 3):
        rate, wall, workers_cpu, servers_cpu = throughput(k, args)
        print(f"  {k} worker(s): {rate:,.0f} readings/s ({wall:.1f} s; CPU: workers {workers_cpu:.1f} s, NATS "
              f"servers {servers_cpu:.1f} s, {(workers_cpu + servers_cpu) / wall / (os.cpu_count() or 1):.0%} of "
              "the cores)")
    moved, first = failover(args)
    print(f"  failover (lease_ttl 3 s): partitions leased again {moved:.1f} s after the kill; first release after "
          f"{first:.1f} s (readings sent once the partitions moved)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

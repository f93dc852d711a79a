"""A full disk under the data directory: every write waits and is retried, nothing accepted is lost or doubled.

The data directory lies on a real tmpfs of 4 MiB (mounted by the ``small_disk`` fixture: root only, skipped with the
reason elsewhere) that a ballast file fills up while readings flow; removing the ballast gives the space back. The
daemon tests run ``tops run`` with an MQTT sink (real Mosquitto) and with stdin; the others drive each write path of
the state layer (the journal, the store's checkpoint, the spill and the outbox's position file) through
:class:`stream.state.disk.DiskRetry` on the same kind of disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from stream.state.disk import DiskRefused, DiskRetry, refusal
from stream.state.journal import Journal
from stream.state.spill import Spill
from stream.state.store import Store
from tests.support import (
    ROOT,
    TEMPLATE,
    DaemonProcess,
    Subscriber,
    check_against_replay,
    daemon_config,
    find_identity,
    free_port,
    identity_from_log,
    publish,
    scrape,
    wait_for,
    write_toml,
)

HOLDOUT = TEMPLATE["holdout"]
PAGE = 4096


class SmallDisk:
    """A tmpfs mounted at ``path``; :meth:`fill` takes its free space with a ballast file (all of it, or all but
    ``leave`` bytes), :meth:`free` gives the space back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ballast = path / "ballast"

    def fill(self, leave: int = 0) -> None:
        with open(self.ballast, "ab", buffering=0) as f:
            for chunk in (1 << 16, PAGE, 1):
                with contextlib.suppress(OSError):
                    while True:
                        f.write(b"\0" * chunk)
            if leave:
                f.truncate(max(0, f.tell() - leave))

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A real 4 MiB tmpfs at ``tmp_path/disk`` (mounting needs root: CI runs as root; elsewhere the test is skipped,
    saying why)."""
    where = tmp_path / "disk"
    where.mkdir()
    try:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(where)],
                             capture_output=True, check=False, timeout=30)
    except OSError as exc:
        pytest.skip(f"a small tmpfs cannot be mounted here ({exc.strerror}): the full-disk tests need root")
    if res.returncode != 0:
        pytest.skip(f"a small tmpfs cannot be mounted here ({res.stderr.decode().strip()}): the full-disk tests need "
                    "root")
    try:
        yield SmallDisk(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, timeout=30)


def by_file(metrics: dict[str, float], name: str) -> dict[str, float]:
    """The samples of ``name`` by their ``file`` label."""
    prefix = name + "{file="
    return {k[len(prefix):-1]: v for k, v in metrics.items() if k.startswith(prefix)}


def unwritable(port: int) -> dict[str, float]:
    """``tops_state_unwritable`` by file: 1 while that file's writes wait for the disk."""
    return by_file(scrape(port), "tops_state_unwritable")


def refused(port: int) -> dict[str, float]:
    """``tops_state_refused_writes_total`` by file: the attempts the disk refused."""
    return by_file(scrape(port), "tops_state_refused_writes_total")


def checkpoints(port: int) -> float:
    """How many checkpoints the daemon took."""
    return scrape(port)["tops_checkpoint_seconds_count"]


def once_each(releases: list[dict]) -> None:
    """Every (stream, tick) released once."""
    seen = [(r["stream"], r["tick"]) for r in releases]
    assert len(seen) == len(set(seen)), "a tick was released twice"


def check_disk_lines(log: str) -> None:
    """One line says the disk refuses writes, one that it takes them again; neither holds a reading's value (the
    tests' values all end in .25) nor a traceback is in the log."""
    lines = log.splitlines()
    full = [x for x in lines if "cannot be written" in x]
    again = [x for x in lines if "writable again" in x]
    assert len(full) == 1 and len(again) == 1, (full, again)
    assert not re.search(r"\d\.25\b", full[0] + again[0])
    assert "Traceback" not in log


class StdinDaemon(DaemonProcess):
    """``tops run`` reading stdin (pipe), stdout collected as JSON lines by a thread, stderr to a file."""

    def __init__(self, config: Path, metrics_port: int, tmp: Path, *, umask: int = -1) -> None:
        super().__init__(config, metrics_port, tmp, stdout=subprocess.PIPE, stdin=subprocess.PIPE, umask=umask)
        self.out: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        wait_for(lambda: scrape(metrics_port), 20, what="metrics endpoint")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        self.out.extend(r for r in map(json.loads, self.proc.stdout) if "tick" in r)  # releases, not the status line

    def send(self, lines: list[str]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("".join(x + "\n" for x in lines).encode())
        self.proc.stdin.flush()

    def finish(self) -> int:
        """Close stdin (end of input: the daemon drains and exits); its exit code."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        rc = self.proc.wait(60)
        self._reader.join(10)
        self._logf.close()
        return rc


# -- the daemon -------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_full_disk_with_an_mqtt_sink_makes_the_daemon_wait_and_retry_not_exit(small_disk: SmallDisk, mosquitto,
                                                                                  tmp_path: Path) -> None:
    """MQTT in, MQTT out, checkpoints every 0.5 s, the disk filled while readings flow: the daemon stays up, says so
    in one line and in ``tops_state_unwritable``, retries; once the ballast goes every reading is released exactly
    once, equal to ``tops replay``."""
    rng = np.random.default_rng(11)
    values = {s: rng.integers(0, 100, size=300).astype(float) + 0.25 for s in ("a", "b")}
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, state={"data_dir": str(small_disk.path / "state"),
                                                                 "checkpoint_interval": 0.5})
    daemon = DaemonProcess(cfg, mport, tmp_path)
    sub = Subscriber(mosquitto.port, "dp/#")

    def releases() -> list[dict]:
        return [p for p in sub.payloads() if "tick" in p]

    def send(lo: int, hi: int) -> None:
        for s, v in values.items():
            lines = [json.dumps({"value": float(x), "seq": lo + i}) for i, x in enumerate(v[lo:hi])]
            assert publish(mosquitto.port, f"meters/{s}/reading", lines).returncode == 0

    try:
        daemon.wait_connected()
        sub.wait_ready("dp/probe")
        send(0, 100)
        wait_for(lambda: len(releases()) >= 2 * (100 - HOLDOUT), 20, what="releases before the disk fills")
        small_disk.fill()
        send(100, 200)
        wait_for(lambda: sum(unwritable(mport).values()) >= 1, 20, what="the disk reported full")
        small_disk.fill()  # what the daemon freed meanwhile (a checkpoint's segments) is taken too
        before = sum(refused(mport).values())
        wait_for(lambda: sum(refused(mport).values()) >= before + 3, 20, what="retries")
        assert daemon.proc.poll() is None, "the daemon exited on a full disk"
        small_disk.free()
        wait_for(lambda: sum(unwritable(mport).values()) == 0, 20, what="the disk writable again")
        send(200, 300)
        wait_for(lambda: len(releases()) >= 2 * (300 - HOLDOUT), 30, what="every release")
        assert daemon.stop() == 0
    finally:
        sub.close()
        daemon.kill()
    check_disk_lines(daemon.stderr())
    got = releases()
    once_each(got)
    identity = find_identity(tmp_path)
    for s, v in values.items():
        assert check_against_replay(got, v, tmp_path / "master.key", s, tmp_path, identity) == len(v) - HOLDOUT


@pytest.mark.slow
def test_a_disk_left_three_pages_makes_a_checkpoint_wait_not_the_daemon_exit(small_disk: SmallDisk, mosquitto,
                                                                             tmp_path: Path) -> None:
    """The disk filled to its last three pages while the daemon is idle between checkpoints (MQTT sink): the next
    checkpoint's journal segment and store commit take them, and the outbox's position file finds no room: its
    OSError must not end the daemon (exit 1). The write that finds no room waits and is retried; once space
    returns every reading is released exactly once."""
    rng = np.random.default_rng(12)
    values = rng.integers(0, 100, size=200).astype(float) + 0.25
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, state={"data_dir": str(small_disk.path / "state"),
                                                                 "checkpoint_interval": 0.5})
    daemon = DaemonProcess(cfg, mport, tmp_path)
    sub = Subscriber(mosquitto.port, "dp/#")

    def releases() -> list[dict]:
        return [p for p in sub.payloads() if "tick" in p]

    def send(lo: int, hi: int) -> None:
        lines = [json.dumps({"value": float(x), "seq": lo + i}) for i, x in enumerate(values[lo:hi])]
        assert publish(mosquitto.port, "meters/a/reading", lines).returncode == 0

    try:
        daemon.wait_connected()
        sub.wait_ready("dp/probe")
        send(0, 100)
        wait_for(lambda: len(releases()) >= 100 - HOLDOUT, 20, what="releases before the disk fills")
        idle = checkpoints(mport) + 6  # idle checkpoints: each takes the same pages
        wait_for(lambda: checkpoints(mport) >= idle, 20, what="idle checkpoints")
        small_disk.fill(leave=3 * PAGE)
        wait_for(lambda: daemon.proc.poll() is not None or sum(refused(mport).values()) >= 3, 20,
                 what="writes refused and retried")
        assert daemon.proc.poll() is None, "the daemon exited on a full disk"
        small_disk.free()
        wait_for(lambda: sum(unwritable(mport).values()) == 0, 20, what="the disk writable again")
        send(100, 200)
        wait_for(lambda: len(releases()) >= 200 - HOLDOUT, 30, what="every release")
        assert daemon.stop() == 0
    finally:
        sub.close()
        daemon.kill()
    check_disk_lines(daemon.stderr())
    got = releases()
    once_each(got)
    assert check_against_replay(got, values, tmp_path / "master.key", "a", tmp_path,
                                find_identity(tmp_path)) == len(values) - HOLDOUT


@pytest.mark.slow
def test_a_stop_signal_while_the_disk_is_full_ends_the_wait_and_a_restart_loses_nothing(
        small_disk: SmallDisk, mosquitto, tmp_path: Path) -> None:
    """The waits give way to shutdown: SIGTERM while the journal cannot be written stops the daemon (exit 0, one
    line saying what waited) instead of hanging. The readings it could not journal were never acknowledged, so the
    broker (persistent session) hands them to the restart made once space returns: every reading is released,
    each tick with one value (a re-processed journal re-publishes byte-identical releases), equal to ``tops
    replay``."""
    rng = np.random.default_rng(13)
    values = rng.integers(0, 100, size=300).astype(float) + 0.25
    mport = free_port()
    cfg = daemon_config(tmp_path, mosquitto.port, mport, state={"data_dir": str(small_disk.path / "state"),
                                                                 "checkpoint_interval": 0.5})
    sub = Subscriber(mosquitto.port, "dp/#")

    def releases() -> list[dict]:
        return [p for p in sub.payloads() if "tick" in p]

    def send(lo: int, hi: int) -> None:
        lines = [json.dumps({"value": float(x), "seq": lo + i}) for i, x in enumerate(values[lo:hi])]
        assert publish(mosquitto.port, "meters/a/reading", lines).returncode == 0

    daemon = DaemonProcess(cfg, mport, tmp_path)
    try:
        daemon.wait_connected()
        sub.wait_ready("dp/probe")
        send(0, 100)
        wait_for(lambda: len(releases()) >= 100 - HOLDOUT, 20, what="releases before the disk fills")
        small_disk.fill()
        send(100, 200)
        wait_for(lambda: unwritable(mport).get("journal") == 1, 20, what="the journal refused")
        assert daemon.stop(timeout=40) == 0
        first_log = daemon.stderr()
        small_disk.free()
        daemon = DaemonProcess(cfg, mport, tmp_path)
        daemon.wait_connected()
        wait_for(lambda: len({r["tick"] for r in releases()}) >= 200 - HOLDOUT, 30, what="the waiting readings")
        send(200, 300)
        wait_for(lambda: len({r["tick"] for r in releases()}) >= 300 - HOLDOUT, 30, what="every release")
        assert daemon.stop() == 0
    finally:
        sub.close()
        daemon.kill()
    assert "stopping while the disk refuses writes (journal)" in first_log and "Traceback" not in first_log
    assert "Traceback" not in daemon.stderr()
    got = releases()
    seen: dict[int, dict] = {}
    for r in got:
        assert seen.setdefault(r["tick"], r) == r  # a repeat is byte-identical
    assert check_against_replay(got, values, tmp_path / "master.key", "a", tmp_path,
                                find_identity(tmp_path)) == len(values) - HOLDOUT


@pytest.mark.slow
def test_a_full_disk_on_stdin_pauses_intake_releases_nothing_meanwhile_and_loses_nothing(
        small_disk: SmallDisk, tmp_path: Path) -> None:
    """stdin in, stdout out, the disk filled while readings flow: once the journal is refused nothing more is
    released while the daemon retries; stdin intake waits; once space returns every reading is released, equal to
    ``tops replay`` tick for tick, and end of input stops it with exit code 0."""
    mport = free_port()
    cfg = write_toml(tmp_path / "tops.toml", {
        "input": {"source": "stdin"},
        "output": {"sinks": ["stdout"]},
        "streams": {"key_file": str(tmp_path / "master.key"), "template": dict(TEMPLATE)},
        "metrics": {"port": mport},
        "log": {"level": "info"},
        "state": {"data_dir": str(small_disk.path / "state"), "checkpoint_interval": 0.5},
    })
    values = np.random.default_rng(3).integers(0, 100, size=400).astype(float) + 0.25
    daemon = StdinDaemon(cfg, mport, tmp_path)
    try:
        daemon.send([f"d,{v}" for v in values[:100]])
        wait_for(lambda: len(daemon.out) >= 100 - HOLDOUT, 20, what="first releases")
        small_disk.fill()
        daemon.send([f"d,{v}" for v in values[100:300]])
        wait_for(lambda: unwritable(mport).get("journal") == 1, 20, what="the journal refused")
        small_disk.fill()
        released = len(daemon.out)
        before = refused(mport)["journal"]
        wait_for(lambda: refused(mport)["journal"] >= before + 3, 20, what="retries")
        assert len(daemon.out) == released and daemon.proc.poll() is None  # nothing accepted: nothing released
        small_disk.free()
        wait_for(lambda: sum(unwritable(mport).values()) == 0, 20, what="the disk writable again")
        daemon.send([f"d,{v}" for v in values[300:]])
        assert daemon.finish() == 0
    finally:
        daemon.kill()
    log = daemon.stderr()
    check_disk_lines(log)
    once_each(daemon.out)
    n = check_against_replay(daemon.out, values, tmp_path / "master.key", "d", tmp_path, identity_from_log(log))
    assert n == len(values) - HOLDOUT


@pytest.mark.slow
def test_a_full_disk_while_the_broker_is_away_keeps_spilled_releases_in_memory_until_written(
        small_disk: SmallDisk, mosquitto_persistent, tmp_path: Path) -> None:
    """stdin in, MQTT out, the broker away: releases past ``publish_queue`` go to the spill; the disk is filled
    (six pages left: the journal's 500 lines of 45 bytes fit, their 500 releases of 160 do not) and the spill's
    writes are refused: the releases stay in memory, in order, the checkpoint retries writing them, intake waits.
    Once space
    returns and the broker is back, a subscriber (persistent session) gets every release exactly once, equal to
    ``tops replay``."""
    broker = mosquitto_persistent
    port = broker.port
    sub = Subscriber(port, "dp/#", session="full-disk-reader")
    daemon: StdinDaemon | None = None
    try:
        sub.wait_ready("dp/probe")
        broker.stop()  # the reader's session (and its subscription) is kept in the broker's persistence file
        mport = free_port()
        cfg = write_toml(tmp_path / "tops.toml", {
            "mqtt": {"host": "127.0.0.1", "port": port, "reconnect_min": 0.1, "reconnect_max": 0.5},
            "input": {"source": "stdin"},
            "output": {"sinks": ["mqtt"], "topic": "dp/{stream}", "status_topic": "", "qos": 1, "publish_queue": 10,
                       "drain_timeout": 10.0},
            "streams": {"key_file": str(tmp_path / "master.key"), "template": dict(TEMPLATE)},
            "metrics": {"port": mport},
            "log": {"level": "info"},
            "state": {"data_dir": str(small_disk.path / "state"), "checkpoint_interval": 60.0},
        })
        values = np.random.default_rng(5).integers(0, 100, size=700).astype(float) + 0.25

        def lines(lo: int, hi: int) -> list[str]:
            return [f"s,{v}" for v in values[lo:hi]]

        def depth() -> float:
            return scrape(mport)["tops_publish_queue_depth"]

        daemon = StdinDaemon(cfg, mport, tmp_path)
        daemon.send(lines(0, 160))
        wait_for(lambda: depth() == 110, 20, what="10 releases in memory, 100 spilled")
        small_disk.fill(leave=6 * PAGE)
        daemon.send(lines(160, 660))
        wait_for(lambda: depth() == 610 and unwritable(mport)["spill"] == 1, 20, what="the spill refused")
        before = sum(refused(mport).values())  # the checkpoint retries (its new journal segment is refused too)
        wait_for(lambda: sum(refused(mport).values()) >= before + 3, 20, what="the checkpoint retrying")
        assert depth() == 610 and daemon.proc.poll() is None  # kept in memory, not lost
        small_disk.free()
        wait_for(lambda: sum(unwritable(mport).values()) == 0, 20, what="the disk writable again")
        daemon.send(lines(660, 700))
        wait_for(lambda: depth() == 650, 20, what="intake resumed")
        broker.start()
        wait_for(lambda: len([p for p in sub.payloads() if "tick" in p]) >= 650, 30, what="every release")
        assert daemon.finish() == 0
    finally:
        sub.close()
        if daemon is not None:
            daemon.kill()
        broker.stop()
    log = daemon.stderr()
    check_disk_lines(log)
    got = [p for p in sub.payloads() if "tick" in p]
    once_each(got)
    n = check_against_replay(got, values, tmp_path / "master.key", "s", tmp_path, identity_from_log(log))
    assert n == len(values) - HOLDOUT


def test_a_start_on_a_full_disk_stops_with_one_line_that_blames_the_disk_not_the_store(small_disk: SmallDisk,
                                                                                          tmp_path: Path) -> None:
    """A daemon started (say by systemd, after a crash) on a full disk cannot open its store: it stops with one line
    and exit code 2 that says the disk refuses, and the store is not touched. It said "is not a readable tops store
    (disk I/O error)", a corrupt store to anyone reading it; once space returns the same store starts."""
    cfg = write_toml(tmp_path / "tops.toml", {
        "input": {"source": "stdin"}, "output": {"sinks": ["stdout"]}, "metrics": {"port": 0},
        "streams": {"key_file": str(tmp_path / "master.key"), "template": dict(TEMPLATE)},
        "state": {"data_dir": str(small_disk.path / "state")},
    })

    def start(stdin: bytes) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-m", "stream.cli", "run", "--config", str(cfg)], cwd=ROOT,
                              input=stdin, capture_output=True, timeout=120, check=False)

    assert start(b"a,1.25\n").returncode == 0
    small_disk.fill()
    res = start(b"a,2.25\n")
    err = [x for x in res.stderr.decode().splitlines() if not x.startswith("tops: ")]
    assert res.returncode == 2 and len(err) == 1, err
    assert "its disk refuses" in err[0] and "full?" in err[0] and "not a readable" not in err[0]
    small_disk.free()
    res = start(b"a,3.25\n")
    assert res.returncode == 0 and "state: 1 streams stored" in res.stderr.decode()


@pytest.mark.slow
def test_every_file_the_daemon_makes_in_its_data_directory_is_private(mosquitto, tmp_path: Path) -> None:
    """With umask 0 (an adversarial environment), every file in the data directory is mode 0600 and every folder
    0700, while the daemon runs (journal segments, the store and its WAL files, the lock, the spill, the outbox's
    position file) and after it stopped. ``outbox.pos`` was 0644 (0666 here)."""
    mport = free_port()
    data = tmp_path / "state"
    cfg = write_toml(tmp_path / "tops.toml", {
        "mqtt": {"host": "127.0.0.1", "port": mosquitto.port},
        "input": {"source": "stdin"},
        "output": {"sinks": ["mqtt"], "topic": "dp/{stream}", "qos": 1},
        "streams": {"key_file": str(tmp_path / "master.key"), "template": dict(TEMPLATE)},
        "metrics": {"port": mport},
        "state": {"data_dir": str(data), "checkpoint_interval": 0.2},
    })

    def modes() -> dict[str, str]:
        return {str(p.relative_to(data)): oct(stat.S_IMODE(p.stat().st_mode)) for p in data.rglob("*")
                if p.exists()}

    def expected(found: dict[str, str]) -> dict[str, str]:
        return {name: "0o700" if (data / name).is_dir() else "0o600" for name in found}

    daemon = StdinDaemon(cfg, mport, tmp_path, umask=0)
    try:
        daemon.send([f"m,{v}.25" for v in range(80)])
        wait_for(lambda: scrape(mport).get("tops_releases_total{sink=mqtt}", 0) >= 80 - HOLDOUT, 20,
                 what="releases confirmed")
        wait_for(lambda: (data / "outbox.pos").exists(), 20, what="a checkpoint")
        running = modes()
        assert {"daemon.lock", "state.db", "state.db-wal", "state.db-shm", "journal", "outbox-0.spill",
                "outbox.pos"} <= set(running), running
        assert running == expected(running)
        assert daemon.finish() == 0
    finally:
        daemon.kill()
    stopped = modes()
    assert stopped == expected(stopped)
    assert oct(stat.S_IMODE(data.stat().st_mode)) == "0o700"


# -- each write path through DiskRetry ------------------------------------------------------------------------------
def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> asyncio.Future[None]:
    """A task that ends once ``condition()`` holds (checked at every event-loop pass); TimeoutError after
    ``timeout`` seconds."""
    async def poll() -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0)
    return asyncio.ensure_future(poll())


def test_a_journal_write_the_disk_cuts_is_finished_by_the_retry_and_replayed_once(small_disk: SmallDisk) -> None:
    """A sync of 2,000 readings on a disk with one page left is cut in the middle of a line: the retry writes the
    rest (never the start again) once space returns, and the journal replays every reading once, in order."""
    registry = CollectorRegistry()

    async def go() -> None:
        disk = DiskRetry(small_disk.path, registry, first_wait=0.01, longest_wait=0.05)
        journal = Journal.open(small_disk.path / "journal")
        for i in range(2000):
            journal.append(f"meter-{i % 7}", i + 0.25, ts=float(i), seq=i)
        small_disk.fill(leave=PAGE)
        journal.take()
        write = asyncio.ensure_future(disk.run("journal", journal.write_durable, thread=True))
        await wait_until(lambda: disk.refusals >= 3)
        assert not write.done() and not disk.writable.is_set() and 0 < len(journal.unwritten)
        assert registry.get_sample_value("tops_state_unwritable", {"file": "journal"}) == 1
        small_disk.free()
        assert await write == 2000
        assert disk.writable.is_set() and not disk.waiting
        assert registry.get_sample_value("tops_state_unwritable", {"file": "journal"}) == 0
        assert registry.get_sample_value("tops_state_refused_writes_total", {"file": "journal"}) >= 3
        journal.rotate()
        got = [(r.stream, r.value, r.seq) for r in journal.replay(0)]
        assert got == [(f"meter-{i % 7}", i + 0.25, i) for i in range(2000)]

    asyncio.run(go())


def test_a_store_checkpoint_the_disk_refuses_midway_is_reported_as_full_and_retried(small_disk: SmallDisk) -> None:
    """A checkpoint larger than the store's page cache meets a full disk inside its transaction: SQLite rolls it
    back itself, and a second ROLLBACK by the store would fail ("cannot rollback - no transaction is active") and hide
    the full disk (no retry, a misleading error). The disk's SQLITE_FULL comes out, the retry commits it all once space
    returns."""
    store = Store.open(small_disk.path / "state.db")
    store.commit_checkpoint([("{}", "t", "a")], 1, [], writer=True)
    store._writer().execute("PRAGMA cache_size = 2")  # a small cache: pages spill to the WAL before the COMMIT
    rows = [(json.dumps({"v": "x" * 2000, "i": i}), "t", f"s{i}") for i in range(200)]
    small_disk.fill(leave=10 * PAGE)
    with pytest.raises(sqlite3.Error) as err:
        store.commit_checkpoint(rows, 2, [("dp/a", b"1.25", False, 1)], writer=True)
    assert refusal(err.value) == "database or disk is full"

    async def go() -> None:
        disk = DiskRetry(small_disk.path, first_wait=0.01, longest_wait=0.05)
        commit = asyncio.ensure_future(disk.run("store", store.commit_checkpoint, rows, 2,
                                                [("dp/a", b"1.25", False, 1)], writer=True, thread=True))
        await wait_until(lambda: disk.refusals >= 2)
        small_disk.free()
        await commit
        assert not disk.waiting

    asyncio.run(go())
    assert store.journal_position() == 2 and store.outbox() == [("dp/a", b"1.25", False, 1)]
    assert store._writer().execute("SELECT COUNT(*) FROM slices").fetchone()[0] == 1 + 200
    store.close()


def test_a_full_disk_keeps_spilled_messages_in_memory_in_order_and_the_position_file_waits(
        small_disk: SmallDisk) -> None:
    """The spill's appends on a full disk: refused, kept in memory behind the file, read back in order, the owner
    asked to retry soon; its sync waits until space returns. Then its read position: the disk full again, the
    commit waits, and once written ``outbox.pos`` is mode 0600 and names the position; a restart reads on from it."""
    registry = CollectorRegistry()
    asked: list[bool] = []
    msgs = [(f"dp/m{i}", json.dumps({"value": i + 0.25}).encode() * 20, bool(i % 2), 1) for i in range(300)]

    async def go() -> None:
        disk = DiskRetry(small_disk.path, registry, first_wait=0.01, longest_wait=0.05,
                         retry_soon=lambda: asked.append(True))
        spill = Spill.open(small_disk.path, fsync=True, disk=disk)
        spill.append(msgs[:10])
        spill.sync()
        small_disk.fill()
        assert spill.append(msgs[10:])  # taken, though the disk refuses them
        assert asked and disk.waiting == {"spill": "No space left on device"} and len(spill) == 300
        assert spill.written < spill.end
        assert spill.read(5) == msgs[:5]
        sync = asyncio.ensure_future(disk.run("spill", spill.sync))
        await wait_until(lambda: registry.get_sample_value("tops_state_refused_writes_total",
                                                           {"file": "spill"}) >= 3)
        assert not sync.done()
        assert spill.read(100) == msgs[5:105]  # from the file, then from memory
        small_disk.free()
        await sync
        assert spill.written == spill.end and not disk.waiting
        small_disk.fill()
        commit = asyncio.ensure_future(disk.run("outbox_position", spill.commit, spill.read_pos))
        await wait_until(lambda: disk.waiting.get("outbox_position") is not None and disk.refusals >= 3)
        assert not commit.done()
        small_disk.free()
        await commit
        spill.close()

    asyncio.run(go())
    pos = small_disk.path / "outbox.pos"
    assert oct(stat.S_IMODE(pos.stat().st_mode)) == "0o600"
    assert oct(stat.S_IMODE((small_disk.path / "outbox-0.spill").stat().st_mode)) == "0o600"
    assert Spill.open(small_disk.path).read(1000) == msgs[105:]


def test_a_write_waiting_for_the_disk_gives_up_when_the_daemon_stops(small_disk: SmallDisk) -> None:
    """Waiting is interruptible: a write the disk keeps refusing ends with DiskRefused at the stop signal (the
    drain then ends with what is on disk), and later refusals raise at once instead of waiting."""

    async def go() -> None:
        disk = DiskRetry(small_disk.path, first_wait=0.01, longest_wait=0.05)
        journal = Journal.open(small_disk.path / "journal")
        small_disk.fill()
        for i in range(500):  # more than the header's page has room for
            journal.append("m", i + 0.25, ts=float(i), seq=None)
        journal.take()
        write = asyncio.ensure_future(disk.run("journal", journal.write_durable, thread=True))
        await wait_until(lambda: disk.refusals >= 2)
        disk.interrupt()
        with pytest.raises(DiskRefused) as err:
            await write
        assert err.value.file == "journal" and "No space" in err.value.reason
        with pytest.raises(DiskRefused):
            await disk.run("journal", journal.write_durable)
        assert not disk.writable.is_set()

    asyncio.run(go())

"""What ``tops run`` checks before it starts, and ``tops run --check`` checks without starting: every problem at once.

Beyond the configuration file itself (:func:`stream.core.config.build_config`): with MQTT, the installed paho-mqtt
and aiomqtt (those the MQTT adapter was written for, stream/daemon/mqtt_paho.py); the master key file (readable and of
mode 0600, or creatable in its folder), the metrics port (free), the data directory (usable), and the state store
(readable, made with this master key, and every stored stream's privacy parameters equal to the template's unless a
new generation is asked for). Nothing is created or changed here. Each problem is one line; the daemon does not start
while there is any (exit code 2).

The data directory's lock (:func:`lock_data_dir`) keeps one daemon per directory and lets ``tops state retire``
make sure no daemon is running.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
from pathlib import Path
from typing import IO

from stream.core.config import DaemonConfig, stream_params
from stream.core.keys import KeyFileError, load_master_key

__all__ = ["DataDirLocked", "lock_data_dir", "preflight"]

LOCK_NAME = "daemon.lock"


class DataDirLocked(Exception):
    """Another process (a running daemon) holds the data directory."""


def lock_data_dir(data_dir: str | os.PathLike[str], *, create: bool = True) -> IO[bytes] | None:
    """Take the data directory's lock (released when the returned file is closed, or the process ends); None when
    the directory (or, without ``create``, the lock file) does not exist. :class:`DataDirLocked` if a running daemon
    holds it."""
    d = Path(data_dir).expanduser()
    if not d.is_dir() or not (create or (d / LOCK_NAME).exists()):
        return None
    fd = os.open(d / LOCK_NAME, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
    f = os.fdopen(fd, "r+b")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        msg = f"[state] data_dir {d} is in use by a running daemon"
        raise DataDirLocked(msg) from None
    return f


def _key_problem(path: Path) -> tuple[bytes | None, str | None]:
    if path.exists():
        try:
            return load_master_key(path), None
        except KeyFileError as exc:
            return None, f"[streams] key_file: {exc}"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        return None, (f"[streams] key_file {path} does not exist and cannot be created ({folder} is not a writable "
                      "folder)")
    return None, None


def _port_problem(host: str, port: int) -> str | None:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"[metrics] host {host!r} cannot be resolved ({exc.strerror or exc})"
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server of prometheus_client does
        try:
            s.bind(addr)
        except OSError as exc:
            return f"[metrics] port {port} on {host} cannot be opened ({exc.strerror or exc})"
    return None


def _store_problems(cfg: DaemonConfig, master: bytes | None) -> list[str]:
    from stream.daemon.durability import key_check
    from stream.state.store import Store, StoreError

    d = Path(cfg.state.data_dir).expanduser()
    if d.exists():
        if not d.is_dir():
            return [f"[state] data_dir {d} is not a directory"]
        if not os.access(d, os.W_OK | os.X_OK):
            return [f"[state] data_dir {d} is not writable by this user"]
    else:
        folder = d.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            return [f"[state] data_dir {d} does not exist and cannot be created ({folder} is not a writable folder)"]
        return []
    db = d / "state.db"
    if not db.exists():
        return []
    if db.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):  # as Store.open refuses it at the start
        return [f"state store {db} must not be readable by group or others (chmod 600): it holds private data"]
    try:
        store = Store.open(db, readonly=True)
    except StoreError as exc:
        return [str(exc)]
    try:
        problems = []
        stored_tag = store.meta("key_check")
        if master is not None and stored_tag is not None and stored_tag != key_check(master):
            problems.append(f"state store {db} was made with another master key than {cfg.streams.key_file}; "
                            "use the key file it was made with, or another [state] data_dir")
        params = stream_params(cfg)
        if not cfg.state.new_generation_all:  # with it, every changed stream starts a new generation
            problems += store.privacy_mismatches(params, set(cfg.state.new_generation))
        return problems
    except Exception as exc:  # a store of another shape: the start would refuse it too
        return [f"state store {db} cannot be read ({type(exc).__name__})"]
    finally:
        store.close()


def preflight(cfg: DaemonConfig) -> list[str]:
    """Every problem that would stop the start of a valid configuration, one line each (empty: it can start)."""
    problems: list[str] = []
    if cfg.uses_mqtt:  # the MQTT adapter runs only on the paho-mqtt and aiomqtt it was written for
        from stream.daemon.mqtt_paho import adapter_problems

        problems += adapter_problems()
    master = None
    if cfg.streams.mode == "central":
        master, err = _key_problem(Path(cfg.streams.key_file).expanduser())
        if err:
            problems.append(err)
    if cfg.metrics.port:
        err = _port_problem(cfg.metrics.host, cfg.metrics.port)
        if err:
            problems.append(err)
    if cfg.state.data_dir:
        d = Path(cfg.state.data_dir).expanduser()
        try:
            lock = lock_data_dir(d, create=False)
        except DataDirLocked as exc:
            problems.append(str(exc))
        except OSError as exc:
            problems.append(f"[state] data_dir {d} cannot be locked ({exc.strerror})")
        else:
            with contextlib.suppress(OSError):
                if lock is not None:
                    lock.close()
        problems += _store_problems(cfg, master)
    return problems

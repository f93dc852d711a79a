"""``tops cluster``: partitions, their owners and their lag, read from the NATS JetStream cluster (read-only).

Contract::

    tops cluster --config worker.toml [--json]

For every partition: the worker holding its lease (``-`` when free), the floor (the last input sequence whose effect
is in the state bucket), and the lag (input messages of the partition after the floor, from its consumer's pending
count); then the live workers and the input and output streams' sizes; then the cluster's identity and whether the
configuration's master key file is the one the cluster's streams were made with (its key check, compared here: a
worker with another key refuses to start). Nothing is written; no key or key check is shown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from typing import Any

from stream.cluster.jetstream import Names, key_check
from stream.cluster.leases import lease_key
from stream.core.config import load_config
from stream.core.errors import ConfigFileError
from stream.core.keys import KeyFileError, load_master_key

__all__ = ["add_arguments", "cluster_view", "main"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", required=True, help="a worker's configuration ([input] source = \"nats\")")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")


def key_verdict(master: bytes | None, identity: str | None, stored: str | None) -> str:
    """Whether ``master`` is the cluster's key: its key check under the cluster's identity against the stored one.

    >>> tag = key_check(bytes(32), "00" * 16)
    >>> [key_verdict(bytes(32), "00" * 16, tag), key_verdict(bytes(31) + b"\\x01", "00" * 16, tag)]
    ['matches', 'differs']
    >>> key_verdict(None, "00" * 16, tag), key_verdict(bytes(32), None, None)
    ('unknown', 'not set')
    """
    if identity is None or stored is None:
        return "not set"  # no worker has joined yet (or none since the key check exists)
    if master is None:
        return "unknown"  # the key file cannot be read here
    return "matches" if key_check(master, identity) == stored else "differs"


async def cluster_view(servers: list[str], names: Names, master: bytes | None = None) -> dict[str, Any]:
    """The view as a dict (partitions, workers, streams, the cluster's identity, and ``key``: :func:`key_verdict`
    of ``master``)."""
    import nats
    from nats.js.errors import KeyDeletedError, KeyNotFoundError, NotFoundError

    nc = await nats.connect(servers=servers, connect_timeout=5, max_reconnect_attempts=2)
    js = nc.jetstream(timeout=5.0)
    try:
        leases = await js.key_value(names.leases)
        state = await js.key_value(names.state)
        rows = []
        for p in range(names.partitions):
            owner, floor, lag = "-", 0, None
            try:
                owner = (await leases.get(lease_key(p))).value.decode()
            except (KeyNotFoundError, KeyDeletedError):
                pass
            consumer = ""
            try:
                doc = json.loads((await state.get(f"p.{p}")).value)
                floor, consumer = int(doc.get("floor", 0)), str(doc.get("consumer", ""))
            except (KeyNotFoundError, KeyDeletedError):
                pass
            if consumer:
                try:
                    info = await js.consumer_info(names.input_stream, consumer)
                    lag = int(info.num_pending) + int(info.num_ack_pending)
                except NotFoundError:
                    lag = None
            rows.append({"partition": p, "owner": owner, "floor": floor, "lag": lag})
        meta = await js.key_value(names.meta)
        identity, stored = None, None
        with contextlib.suppress(KeyNotFoundError, KeyDeletedError):
            identity = (await meta.get("identity")).value.decode()
        with contextlib.suppress(KeyNotFoundError, KeyDeletedError):
            stored = (await meta.get("key_check")).value.decode()
        workers = (await js.stream_info(f"KV_{names.workers}")).state.messages
        streams = {}
        for name in (names.input_stream, names.output_stream):
            st = (await js.stream_info(name)).state
            streams[name] = {"messages": st.messages, "last_seq": st.last_seq}
        return {"partitions": rows, "workers": workers, "streams": streams, "identity": identity,
                "key": key_verdict(master, identity, stored)}
    finally:
        await nc.close()


def main(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config)
    except ConfigFileError as exc:
        for line in exc.problems:
            print(f"tops cluster: {line}", file=sys.stderr)
        return 2
    if cfg.input.source != "nats":
        print('tops cluster: the configuration is not a cluster worker\'s ([input] source = "nats")', file=sys.stderr)
        return 2
    try:
        master: bytes | None = load_master_key(cfg.streams.key_file, create=False)
    except KeyFileError:
        master = None
    try:
        view = asyncio.run(cluster_view(list(cfg.nats.servers), Names.from_config(cfg.nats), master))
    except Exception as exc:  # the cluster is not there: one line
        print(f"tops cluster: cannot read the cluster at {', '.join(cfg.nats.servers)} ({type(exc).__name__})",
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(view))
        return 0
    print(f"{'partition':>9}  {'owner':<24} {'floor':>10} {'lag':>8}")
    for r in view["partitions"]:
        lag = "-" if r["lag"] is None else str(r["lag"])
        print(f"{r['partition']:>9}  {r['owner']:<24} {r['floor']:>10} {lag:>8}")
    print(f"live workers: {view['workers']}; " + "; ".join(f"{k}: {v['messages']} messages"
                                                         for k, v in view["streams"].items()))
    print(f"cluster identity: {view['identity'] or '-'}; master key {cfg.streams.key_file}: {_KEY_WORDS[view['key']]}")
    return 0


_KEY_WORDS = {"matches": "the cluster's (its key check matches)",
              "differs": "another than the cluster's (a worker with it refuses to start)",
              "unknown": "cannot be read here (not compared)",
              "not set": "not compared (no worker has made the cluster's key check yet)"}

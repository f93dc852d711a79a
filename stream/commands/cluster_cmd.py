"""``tops cluster``: partitions, their owners and their lag, read from the NATS JetStream cluster (read-only).

Contract::

    tops cluster --config worker.toml [--json]

For every partition: the worker holding its lease (``-`` when free), the floor (the last input sequence whose effect
is in the state bucket), and the lag (input messages of the partition after the floor, from its consumer's pending
count); then the live workers and the input and output streams' sizes. Nothing is written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from stream.cluster.jetstream import Names
from stream.cluster.leases import lease_key
from stream.core.config import load_config
from stream.core.errors import ConfigFileError

__all__ = ["add_arguments", "cluster_view", "main"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", required=True, help="a worker's configuration ([input] source = \"nats\")")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")


async def cluster_view(servers: list[str], names: Names) -> dict[str, Any]:
    """The view as a dict (partitions, workers, streams)."""
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
        workers = (await js.stream_info(f"KV_{names.workers}")).state.messages
        streams = {}
        for name in (names.input_stream, names.output_stream):
            st = (await js.stream_info(name)).state
            streams[name] = {"messages": st.messages, "last_seq": st.last_seq}
        return {"partitions": rows, "workers": workers, "streams": streams}
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
        view = asyncio.run(cluster_view(list(cfg.nats.servers), Names.from_config(cfg.nats)))
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
    return 0

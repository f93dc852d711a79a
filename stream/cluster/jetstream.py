"""The JetStream side of a cluster: the input and output streams, the key-value buckets, and their names.

Created by the first worker if missing (replicated ``[nats] replicas`` times): the input stream takes
``<input_subject>.>`` (the servers' subject mapping puts ``meters.<stream>.reading`` on
``<input_subject>.<partition>.<stream>``), the output stream ``<output_subject>.>`` with a duplicate window
(releases carry the message id ``<stream>:<tick>``), and four buckets: leases and workers (keys live ``lease_ttl``
seconds), state (every stream's checkpoint and every partition's floor) and meta (the cluster's identity, its key
check and its streams' privacy parameters).

The key check (:func:`key_check`) is a one-way tag of the master key and the cluster's identity: the first worker
creates it in the meta bucket (compare-and-set: of two workers starting together, one creates it and the other
compares), every worker compares its own with it before it takes a partition, and every stream state a worker
writes carries it, so a state is compared again each time it is loaded. It reveals nothing of the key, and it differs
from cluster to cluster even under one key file (the identity is in it).

>>> key_check(bytes(32), "00" * 16) == key_check(bytes(32), "00" * 16)
True
>>> key_check(bytes(32), "00" * 16) != key_check(bytes(31) + b"\x01", "00" * 16)
True
>>> key_check(bytes(32), "00" * 16) != key_check(bytes(32), "11" * 16)
True
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from stream.core.keys import hkdf_sha256_32

__all__ = ["Names", "ensure", "key_check", "state_key", "stream_of_key"]

DUPLICATE_WINDOW = 600.0  # seconds JetStream remembers a release's message id
KEY_CHECK_SALT = b"tops/cluster-key-check/v1"


@dataclass(frozen=True)
class Names:
    """Subjects, streams and buckets of one cluster configuration (``[nats]``)."""

    input_subject: str
    output_subject: str
    input_stream: str
    output_stream: str
    prefix: str
    partitions: int
    replicas: int
    lease_ttl: float

    @classmethod
    def from_config(cls, nats: Any) -> Names:
        return cls(nats.input_subject, nats.output_subject, nats.input_stream, nats.output_stream,
                   nats.bucket_prefix, int(nats.partitions), int(nats.replicas), float(nats.lease_ttl))

    @property
    def leases(self) -> str:
        return f"{self.prefix}_leases"

    @property
    def workers(self) -> str:
        return f"{self.prefix}_workers"

    @property
    def state(self) -> str:
        return f"{self.prefix}_state"

    @property
    def meta(self) -> str:
        return f"{self.prefix}_meta"

    def consumer(self, partition: int, lease_rev: int) -> str:
        """A partition's consumer for one lease: a stale owner's pulls go to its own (deleted) consumer, never to the
        new owner's (whose acknowledgement of a later message would cover readings the new owner never saw)."""
        return f"{self.prefix}-p{partition}-r{lease_rev}"

    def partition_subject(self, partition: int) -> str:
        return f"{self.input_subject}.{partition}.>"


def key_check(master: bytes, identity: str) -> str:
    """The cluster's key check: the first 128 bits of ``HKDF-SHA256(master, salt=KEY_CHECK_SALT, info=identity)``
    (RFC 5869), in hex. Equal tags: the same master key and identity, so the same stream keys."""
    return hkdf_sha256_32(KEY_CHECK_SALT, master, identity.encode())[:16].hex()


def state_key(stream: str) -> str:
    """The state bucket's key of a stream (key-value keys allow few characters: the name, base64url)."""
    return "s." + base64.urlsafe_b64encode(stream.encode()).decode().rstrip("=")


def stream_of_key(key: str) -> str:
    b = key[2:]
    return base64.urlsafe_b64decode(b + "=" * (-len(b) % 4)).decode()


async def ensure(js: Any, names: Names) -> dict[str, Any]:
    """The streams and buckets, created when missing; returns the four buckets by role."""
    from nats.js.api import KeyValueConfig, StorageType, StreamConfig
    from nats.js.errors import BucketNotFoundError, NotFoundError

    for name, subject, dup in ((names.input_stream, names.input_subject, None),
                               (names.output_stream, names.output_subject, DUPLICATE_WINDOW)):
        try:
            await js.stream_info(name)
        except NotFoundError:
            cfg = StreamConfig(name=name, subjects=[f"{subject}.>"], num_replicas=names.replicas,
                               storage=StorageType.FILE, duplicate_window=dup)
            await js.add_stream(cfg)  # another worker creating it at the same time: the same config, no error
    buckets: dict[str, Any] = {}
    for role, bucket, ttl in (("leases", names.leases, names.lease_ttl), ("workers", names.workers, names.lease_ttl),
                              ("state", names.state, None), ("meta", names.meta, None)):
        try:
            buckets[role] = await js.key_value(bucket)
        except (BucketNotFoundError, NotFoundError):
            cfg = KeyValueConfig(bucket=bucket, history=1, replicas=names.replicas, ttl=ttl)
            buckets[role] = await js.create_key_value(cfg)
    return buckets

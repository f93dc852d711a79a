"""Partition leases and rebalancing: who runs which partition of the input, decided in the JetStream key-value store.

Every worker heartbeats ``<prefix>_workers/<worker>`` (the bucket's messages count the live workers) and holds the
partitions it runs as keys ``<prefix>_leases/p.<i>`` (value: its name). Both buckets keep a key for ``lease_ttl``
seconds after its last write (the bucket's max age), so a dead worker's heartbeat and leases vanish on their own. A
lease is taken with *create* (refused while another worker's key lives) and renewed with *update on the revision it
holds* (compare-and-set): a worker whose renewal is refused, or who could not renew for ``lease_ttl``, has lost the
partition and must not write its state or publish for it again (:mod:`stream.cluster.worker` fences every state write
the same way).

Rebalancing is each worker's own arithmetic on the same facts: with ``n`` live workers each aims at ``ceil(P / n)``
partitions (:func:`share`); one above its share hands the extra back (after a checkpoint, so the next owner continues
from it), one below takes free ones, lowest index first.

>>> share(16, 3), share(16, 1), share(4, 8)
(6, 16, 1)
>>> wanted(range(16), owned={0, 1, 2, 3, 4, 5, 6}, free={7, 8}, target=6)
([], [6])
>>> wanted(range(16), owned={0, 1}, free={7, 3, 9}, target=4)
([3, 7], [])
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["lease_key", "share", "wanted"]


def lease_key(partition: int) -> str:
    return f"p.{partition}"


def share(partitions: int, workers: int) -> int:
    """How many partitions a worker aims at with ``workers`` live workers."""
    return math.ceil(partitions / max(1, workers))


def wanted(partitions: Iterable[int], *, owned: set[int], free: set[int], target: int) -> tuple[list[int], list[int]]:
    """(partitions to take, partitions to hand back) to move ``owned`` toward ``target`` (free ones lowest first;
    handed back highest first)."""
    if len(owned) > target:
        return [], sorted(owned, reverse=True)[: len(owned) - target]
    order = [p for p in partitions if p in free and p not in owned]
    return sorted(order)[: max(0, target - len(owned))], []

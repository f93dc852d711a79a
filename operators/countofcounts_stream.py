"""A count-of-counts stream released per period (Kuo et al., PVLDB 2018): the consistent count-of-counts histogram of
every region.

A public region hierarchy is given by its leaves as paths (``"ca/la"``, ``"ca/sf"``, ``"ny/nyc"``: every prefix is a
region, all under one root ``root_name``); all leaves have the same depth, so a person is in exactly one region per
level. In each period every group (a household, a vehicle's passengers) reports once, as one integer

    ``c = leaf_index * J + (size - 1)``   (``size`` in ``1 .. J``; larger groups report ``J``),

``leaf_index`` being the leaf's position in ``leaves``. At the end of the period the groups' sizes go through
:class:`operators.countofcounts.CountOfCounts` (geometric noise on every node's cumulative ``H_c`` at ``eps / L``,
pool-adjacent-violators per node, then the two passes with sorted matching), the noise addressed by the tick, and the
release carries, for every region, ``H[j]`` for ``j = 1 .. J`` (non-negative integers, consistent: a region's groups
are exactly its children's) and its number of groups.

Privacy (the poster's model): the groups and their regions are public (every node's number of groups is released as
it is); a person is private. Neighbouring periods differ in one person, which moves one group's size by one; every
node's ``H_c`` changes by at most 1 in one entry, and with ``eps / L`` per level the period's release is eps-DP.
Periods are disjoint (a person is in one group per period), so every period's census is eps-DP.

>>> cfg = CountOfCountsConfig(epsilon=1.0, max_size=4, leaves=("a/x", "a/y", "b/z"))
>>> op = CountOfCountsRelease(cfg, key=bytes(32))
>>> op.category_of(cfg.category("a/y", 3)), op.valid(12), op.valid(11)
(6, False, True)
>>> rel = op.process([{0: 2, 5: 1, 11: 1}])[0]
>>> sorted(rel["groups"].items())
[('a', 3), ('a/x', 2), ('a/y', 1), ('all', 4), ('b', 1), ('b/z', 1)]
>>> all(sum(h) == rel["groups"][n] for n, h in rel["nodes"].items())
True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from operators.config import ConfigError
from operators.countofcounts import CountOfCounts
from operators.noise import KeyedGenerator

__all__ = ["MAX_LEAVES", "CountOfCountsConfig", "CountOfCountsRelease"]

MAX_LEAVES = 1 << 14
MAX_SIZE = 1 << 12
_SNAPSHOT_VERSION = 1


@dataclass(frozen=True)
class CountOfCountsConfig:
    """The public parameters of a count-of-counts stream."""

    epsilon: float
    max_size: int
    leaves: tuple[str, ...]
    root_name: str = "all"

    local = False  # central only: the server holds each group's size

    def __post_init__(self) -> None:
        e = self.epsilon
        if isinstance(e, bool) or not isinstance(e, int | float) or not math.isfinite(e) or not 0 < e <= 30:
            msg = f"epsilon must be a number in (0, 30] (got {e!r})"
            raise ConfigError(msg)
        j = self.max_size
        if isinstance(j, bool) or not isinstance(j, int) or not 1 <= j <= MAX_SIZE:
            msg = f"max_size must be an integer in [1, {MAX_SIZE}] (got {j!r})"
            raise ConfigError(msg)
        leaves = tuple(self.leaves)
        object.__setattr__(self, "leaves", leaves)
        if not 1 <= len(leaves) <= MAX_LEAVES:
            msg = f"leaves must list 1 to {MAX_LEAVES} regions (got {len(leaves)})"
            raise ConfigError(msg)
        if any(not isinstance(x, str) or not x or any(not p for p in x.split("/")) for x in leaves):
            msg = "every leaf is a region path like \"state/county\" (non-empty names separated by /)"
            raise ConfigError(msg)
        if len(set(leaves)) != len(leaves):
            msg = "leaves must be distinct"
            raise ConfigError(msg)
        depths = {x.count("/") for x in leaves}
        if len(depths) != 1:
            msg = "every leaf must have the same depth (a person is in one region per level)"
            raise ConfigError(msg)
        prefixes = {x[:i] for x in leaves for i in range(len(x)) if x[i] == "/"}
        if prefixes & set(leaves) or self.root_name in prefixes | set(leaves) or not self.root_name:
            msg = "a leaf cannot also be a region above another leaf, nor be named as the root"
            raise ConfigError(msg)

    @property
    def report_epsilon(self) -> float:
        """The guarantee of one group over a release (the one histogram it carries): ``epsilon``."""
        return float(self.epsilon)

    @property
    def categories(self) -> int:
        """How many report values there are: ``len(leaves) * J``."""
        return len(self.leaves) * self.max_size

    def category(self, leaf: str, size: int) -> int:
        """The report of a group of ``size`` people in ``leaf`` (sizes above ``J`` report ``J``)."""
        return self.leaves.index(leaf) * self.max_size + min(max(int(size), 1), self.max_size) - 1

    def children(self) -> dict[str, list[str]]:
        """The hierarchy: the root, every path prefix, the leaves."""
        out: dict[str, list[str]] = {self.root_name: []}
        for leaf in self.leaves:
            parts = leaf.split("/")
            parent = self.root_name
            for i in range(1, len(parts) + 1):
                node = "/".join(parts[:i])
                if node not in out:
                    out[node] = []
                    out[parent].append(node)
                parent = node
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["leaves"] = list(self.leaves)
        return d


class CountOfCountsRelease:
    """One count-of-counts stream: a tally of group reports per period in, one consistent release per period out
    (the interface of :class:`operators.categorical.release.CategoricalRelease`)."""

    takes_categories = True
    takes_reports = False
    phase = "releasing"
    holdout_left = 0
    theta = None

    def __init__(self, config: CountOfCountsConfig, key: bytes) -> None:
        self.config = config
        self._gen = KeyedGenerator(key)
        self._mech = CountOfCounts(float(config.epsilon), config.max_size)
        self._children = config.children()
        self.ticks = 0
        self.clamped = 0

    def __repr__(self) -> str:
        return f"CountOfCountsRelease(leaves={len(self.config.leaves)}, J={self.config.max_size}, ticks={self.ticks})"

    def valid(self, value: float) -> bool:
        """A report is an integer in ``[0, len(leaves) * J)``."""
        return value == value and 0 <= value < self.config.categories and value == math.floor(value)

    def category_of(self, value: float) -> int:
        return int(value)

    def release_one(self, tally: dict[int, int]) -> dict[str, Any]:
        cfg, j = self.config, self.config.max_size
        groups: dict[str, list[int]] = {leaf: [] for leaf in cfg.leaves}
        for c, n in sorted(tally.items()):
            leaf, size = divmod(int(c), j)
            groups[cfg.leaves[leaf]].extend([size + 1] * int(n))
        est = self._mech.release(self._children, groups, self._gen, address=self.ticks)
        self.ticks += 1
        nodes = {n: [int(x) for x in est[n]] for n in self._children}
        return {"mechanism": "countofcounts", "max_size": j, "nodes": nodes,
                "groups": {n: int(sum(h)) for n, h in nodes.items()}}

    def process(self, tallies: list[dict[int, int]]) -> list[dict[str, Any]]:
        return [self.release_one(t) for t in tallies]

    def process_one(self, tally: dict[int, int]) -> dict[str, Any]:
        return self.release_one(tally)

    def snapshot(self) -> dict[str, Any]:
        return {"version": _SNAPSHOT_VERSION, "kind": "countofcounts", "config": self.config.to_dict(),
                "ticks": self.ticks}

    @classmethod
    def restore(cls, config: CountOfCountsConfig, key: bytes, snapshot: dict[str, Any]) -> CountOfCountsRelease:
        if snapshot.get("version") != _SNAPSHOT_VERSION or snapshot.get("kind") != "countofcounts":
            msg = "not a count-of-counts snapshot"
            raise ValueError(msg)
        if snapshot.get("config") is not None and snapshot["config"] != config.to_dict():
            msg = "the snapshot was made with other parameters"
            raise ValueError(msg)
        op = cls(config, key)
        op.ticks = int(snapshot["ticks"])
        return op

    def state_nbytes(self) -> int:
        return 16

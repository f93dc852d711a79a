"""A b-ary tree over a value domain and the decomposition of a range into its nodes (Friis, thesis 2021, sections 7.2
and 9.4).

The domain ``0 .. d - 1`` is padded to ``b^h`` leaves, ``h = ceil(log_b d)`` computed on integers (the thesis's float
formula gives 4 for d = 125, b = 5 instead of 3). Level ``j`` (0 = the leaves, ``h`` = the root) has ``b^(h - j)``
nodes, node ``i`` covering leaves ``[i b^j, (i + 1) b^j)``. A range ``[lo, hi]`` decomposes into at most
``2 (b - 1)`` nodes per level: climbing from the leaves, the unaligned ends of the range at each level are taken as
nodes of that level, and what is left is aligned one level up (the same set as the thesis's two root-to-leaf searches,
section 9.4, without their special cases at the domain's ends).

>>> decompose(2, 22, fanout=2)       # the thesis's example, D = 32: [2,3] [4,7] [8,15] [16,19] [20,21] [22,22]
[(1, 1), (2, 1), (3, 1), (2, 4), (1, 10), (0, 22)]
>>> [node_span(j, i, 2) for j, i in decompose(2, 22, fanout=2)]
[(2, 3), (4, 7), (8, 15), (16, 19), (20, 21), (22, 22)]
>>> tree_height(125, 5), tree_height(32, 2), tree_height(27, 3), tree_height(1, 4)
(3, 5, 3, 0)
"""

from __future__ import annotations

__all__ = ["decompose", "max_nodes", "node_span", "tree_height"]


def tree_height(d: int, fanout: int) -> int:
    """``h = ceil(log_b d)`` on integers: the levels above the leaves of a tree with at least ``d`` leaves."""
    if d < 1 or fanout < 2:
        msg = "a tree needs d >= 1 and fanout >= 2"
        raise ValueError(msg)
    h, span = 0, 1
    while span < d:
        span *= fanout
        h += 1
    return h


def node_span(level: int, index: int, fanout: int) -> tuple[int, int]:
    """The leaves ``[first, last]`` node ``index`` of ``level`` covers."""
    w = fanout**level
    return index * w, (index + 1) * w - 1


def decompose(lo: int, hi: int, *, fanout: int) -> list[tuple[int, int]]:
    """The ``(level, index)`` nodes whose spans partition ``[lo, hi]``, in left-to-right order of their spans."""
    if lo < 0 or hi < lo:
        msg = "a range needs 0 <= lo <= hi"
        raise ValueError(msg)
    left: list[tuple[int, int]] = []
    right: list[tuple[int, int]] = []
    a, b, j = lo, hi + 1, 0  # half-open [a, b) at level j
    while a < b:
        if a % fanout == 0 and b % fanout == 0:  # whole parents: go up
            a, b, j = a // fanout, b // fanout, j + 1
            continue
        if a // fanout == (b - 1) // fanout:  # part of one parent's children: these nodes
            left.extend((j, i) for i in range(a, b))
            break
        while a % fanout:
            left.append((j, a))
            a += 1
        while b % fanout:
            b -= 1
            right.append((j, b))
        a, b, j = a // fanout, b // fanout, j + 1
    return left + right[::-1]


def max_nodes(fanout: int, height: int) -> int:
    """At most ``2 (b - 1)`` nodes per level below the top and ``b - 1`` at the top: ``2 (b - 1) h`` in all."""
    return 2 * (fanout - 1) * max(height, 1)

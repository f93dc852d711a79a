"""The count-of-counts release (operators/countofcounts_stream.py): every region's histogram counts exactly its
groups, a parent's histogram is the sum of its children's, the noise is keyed by the tick, and a snapshot continues
bit for bit."""

from __future__ import annotations

import json

import numpy as np

from operators.countofcounts_stream import CountOfCountsConfig, CountOfCountsRelease

LEAVES = ["north/a", "north/b", "north/c", "south/d", "south/e"]


J = 8


def test_every_release_is_consistent_and_keyed_by_the_tick() -> None:
    """Every region's histogram counts exactly its groups, a parent's histogram is the sum of its children's (the
    matching makes a parent's groups exactly its children's), and the noise is addressed by the tick: the same
    tallies give the same releases, another key other ones; a snapshot continues bit for bit."""
    cfg = CountOfCountsConfig(1.0, J, tuple(LEAVES))
    rng = np.random.default_rng(2)
    tallies = []
    for _ in range(4):
        t: dict[int, int] = {}
        for leaf in LEAVES:
            for size in rng.zipf(1.8, 60):
                c = cfg.category(leaf, int(size))
                t[c] = t.get(c, 0) + 1
        tallies.append(t)
    op = CountOfCountsRelease(cfg, bytes(32))
    rel = op.process(tallies)
    children = cfg.children()
    for r, t in zip(rel, tallies, strict=True):
        assert r["groups"]["all"] == sum(t.values()) == 300
        for node, kids in children.items():
            h = np.array(r["nodes"][node])
            assert h.min() >= 0 and h.sum() == r["groups"][node]
            if kids:
                assert np.array_equal(h, np.sum([r["nodes"][k] for k in kids], axis=0)), node
    assert rel == CountOfCountsRelease(cfg, bytes(32)).process(tallies)
    assert rel != CountOfCountsRelease(cfg, bytes([1]) * 32).process(tallies)
    half = CountOfCountsRelease(cfg, bytes(32))
    half.process(tallies[:2])
    again = CountOfCountsRelease.restore(cfg, bytes(32), json.loads(json.dumps(half.snapshot())))
    assert again.process(tallies[2:]) == rel[2:]

"""Range counting (Friis, thesis 2021) and count-of-counts (Kuo et al., PVLDB 2018): the papers' worked examples as
oracles, each
mechanism's empirical error against its closed form, consistency, and keyed, replayable noise."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from operators.countofcounts import CountOfCounts, counts_of, cumulative, estimate_node, match, pav, unattributed
from operators.noise import DiscreteLaplace, KeyedGenerator
from operators.ranges import (
    FlatHistogram,
    RangeTree,
    decompose,
    max_nodes,
    mean_variance,
    node_span,
    prefer_tree,
    range_variance,
    tree_height,
)
from operators.ranges.release import RangeConfig, RangeRelease


# -- decomposition (oracles 5, 6, 8, 10) ----------------------------------------------------------------------------
def test_the_thesis_example_and_heights() -> None:
    spans = [node_span(j, i, 2) for j, i in decompose(2, 22, fanout=2)]
    assert spans == [(2, 3), (4, 7), (8, 15), (16, 19), (20, 21), (22, 22)]
    assert [tree_height(n, b) for n, b in [(32, 2), (27, 3), (64, 4), (125, 5), (28, 2), (20, 3)]] == [5, 3, 3, 3, 5, 3]


@pytest.mark.parametrize(("b", "d", "most", "mean"), [(2, 32, 8, 3.2746), (4, 64, 14, 5.9082), (2, 256, 14, 6.0467),
                                                      (4, 256, 20, 8.7393)])
def test_every_range_partitions_into_at_most_2_b_minus_1_nodes_per_level(b: int, d: int, most: int,
                                                                         mean: float) -> None:
    sizes = []
    for lo in range(d):
        for hi in range(lo, d):
            nodes = decompose(lo, hi, fanout=b)
            spans = [node_span(j, i, b) for j, i in nodes]
            assert spans[0][0] == lo and spans[-1][1] == hi
            assert all(spans[k][1] + 1 == spans[k + 1][0] for k in range(len(spans) - 1))
            per_level: dict[int, int] = {}
            for j, _ in nodes:
                per_level[j] = per_level.get(j, 0) + 1
            assert max(per_level.values()) <= 2 * (b - 1)
            sizes.append(len(nodes))
    assert max(sizes) == most <= max_nodes(b, tree_height(d, b))
    assert round(float(np.mean(sizes)), 4) == mean


# -- central flat and tree: empirical error against the closed form -------------------------------------------------
COUNTS = np.random.default_rng(0).integers(0, 20, 64)


@pytest.mark.slow
@pytest.mark.parametrize("mech", [FlatHistogram(64, 1.0), RangeTree(64, 4, 1.0),
                                  RangeTree(64, 4, 1.0, consistent=False), RangeTree(64, 2, 0.5)],
                         ids=["flat", "tree4-consistent", "tree4-raw", "tree2-eps0.5"])
def test_empirical_variance_matches_the_closed_form(mech) -> None:
    """4,000 keyed releases per range; the sample variance of a sum of discrete Laplace terms has a relative standard
    error of at most sqrt(5 / n) = 3.5%, so the tolerance is 12% (about 3.4 standard errors) and the mean is within
    4.5 standard errors of 0 (unbiased)."""
    n = 4000
    for lo, hi in [(3, 40), (0, 63), (10, 10)]:
        truth = COUNTS[lo : hi + 1].sum()
        errs = np.empty(n)
        for k in range(n):
            rel = mech.release(COUNTS, KeyedGenerator(k.to_bytes(4, "little") * 8), address=k)
            got = FlatHistogram.answer(rel, lo, hi) if isinstance(mech, FlatHistogram) else rel.answer(lo, hi)
            errs[k] = got - truth
        v = range_variance(mech, lo, hi)
        assert abs(errs.var() / v - 1) < 0.12, (lo, hi, errs.var(), v)
        assert abs(errs.mean()) < 4.5 * math.sqrt(v / n)


def test_noise_is_keyed_and_replayable() -> None:
    tree = RangeTree(64, 4, 1.0)
    a = tree.release(COUNTS, KeyedGenerator(bytes(32)), address=3)
    b = tree.release(COUNTS, KeyedGenerator(bytes(32)), address=3)
    c = tree.release(COUNTS, KeyedGenerator(bytes(32)), address=4)
    assert all(np.array_equal(x, y) for x, y in zip(a.levels, b.levels, strict=True))
    assert not np.array_equal(a.levels[0], c.levels[0])
    assert math.isclose(a.answer(0, 63), float(a.levels[-1][0]), rel_tol=0, abs_tol=1e-6)  # consistent
    for j in range(1, len(a.levels)):
        assert np.allclose(a.levels[j - 1].reshape(-1, 4).sum(axis=1), a.levels[j])


def test_the_central_tree_noise_is_scaled_to_its_height_not_under_noised() -> None:
    """One reading is in h + 1 nodes: each node's noise has sensitivity h + 1 (the thesis's code used
    log2(h + 1) / eps, up to 6.8x too little)."""
    tree = RangeTree(2048, 4, 1.0)
    assert tree.height == 6
    assert tree.node_noise == DiscreteLaplace(1.0, 7)


def test_consistency_never_hurts_and_the_rule_prefers_the_tree_only_for_long_ranges() -> None:
    for lo, hi in [(0, 63), (5, 50), (7, 7)]:
        assert range_variance(RangeTree(64, 4, 1.0), lo, hi) <= range_variance(RangeTree(64, 4, 1.0, False), lo, hi)
    assert not prefer_tree(1024, 4, 1.0, [8])  # short ranges: flat
    assert prefer_tree(1024, 4, 1.0, [1024])  # the whole domain: the tree
    assert mean_variance(FlatHistogram(256, 1.0), [128]) == pytest.approx(128 * DiscreteLaplace(1.0, 1).variance)


# -- count-of-counts (oracles 23-27) ------------------------------------------------------------------------------
def test_the_posters_arrays() -> None:
    root, a, b = [2, 1, 0, 1], [1, 0, 0, 1], [1, 1, 0, 0]
    assert cumulative(root).tolist() == [2, 3, 3, 4] and cumulative(a).tolist() == [1, 1, 1, 2]
    assert unattributed(root).tolist() == [1, 1, 2, 4] and unattributed(a).tolist() == [1, 4]
    assert counts_of([4, 1, 2, 1], 4).tolist() == root
    assert match([1, 1, 2, 4], [[1, 4], [1, 2]]) == [[1, 4], [1, 2]]
    out = CountOfCounts(30.0, 4).release({"root": ["a", "b"]}, {"a": [4, 1], "b": [2, 1]}, KeyedGenerator(bytes(32)))
    assert {k: v.tolist() for k, v in out.items()} == {"root": root, "a": a, "b": b}


def test_pav_and_the_per_node_estimate() -> None:
    assert pav([1, 3, 2, 4]).tolist() == [1, 2.5, 2.5, 4]
    assert pav([3, 2, 1]).tolist() == [2, 2, 2]
    assert np.allclose(pav([2.2, 1.8, 3.4, 3.9]), [2, 2, 3.4, 3.9])
    assert pav([5, 1, 1, 1, 5]).tolist() == [2, 2, 2, 2, 5]
    h = estimate_node([3.2, -4.0, 9.7, 8.1, 30.0], 10)
    assert h.min() >= 0 and h.sum() == 10 and h.dtype.kind == "i"


def test_the_geometric_mechanism_has_the_right_normaliser_and_variance() -> None:
    one, two = DiscreteLaplace(1.0, 1), DiscreteLaplace(1.0, 2)
    assert one.pmf(0) == pytest.approx(0.462117, abs=1e-6) and one.variance == pytest.approx(1.841347, abs=1e-5)
    assert two.pmf(0) == pytest.approx(0.244919, abs=1e-6) and two.variance == pytest.approx(7.835396, abs=1e-5)
    assert float(two.pmf(np.arange(-200, 201)).sum()) == pytest.approx(1.0)
    x = KeyedGenerator(bytes(32)).discrete_laplace(1, 0, 0, 200_000, one)
    assert abs(x.var() / one.variance - 1) < 0.05  # sqrt(5 / 200,000) = 0.5%: within 5% at 10 standard errors


def _hierarchy(seed: int) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    children: dict[str, list[str]] = {"root": [f"s{i}" for i in range(4)]}
    groups: dict[str, list[int]] = {}
    for i in range(4):
        children[f"s{i}"] = [f"c{i}_{k}" for k in range(6)]
        for k in range(6):
            groups[f"c{i}_{k}"] = rng.zipf(2.0, 200).clip(1, 30).tolist()
    return children, groups


def test_the_release_is_consistent_integer_and_matches_public_totals() -> None:
    children, groups = _hierarchy(1)
    out = CountOfCounts(1.0, 30).release(children, groups, KeyedGenerator(bytes(32)))
    for node, kids in children.items():
        assert np.array_equal(sum(out[c] for c in kids), out[node])
    for leaf, g in groups.items():
        assert out[leaf].min() >= 0 and out[leaf].sum() == len(g)


@pytest.mark.slow
def test_consistency_costs_little_against_per_node_least_squares() -> None:
    """Earth mover's distance per level over 8 keys: the consistent release is within 10% of the per-node estimates
    at every level (measured: 0% at the root, better one level down, +1-4% at the leaves)."""
    children, groups = _hierarchy(2)

    def sizes(n: str) -> list[int]:
        return groups[n] if n in groups else [s for c in children[n] for s in sizes(c)]

    truth = {n: counts_of(sizes(n), 30) for n in [*children, *groups]}
    cc = CountOfCounts(1.0, 30)
    err = {True: {0: [], 1: [], 2: []}, False: {0: [], 1: [], 2: []}}
    for k in range(8):
        for td in (True, False):
            out = cc.release(children, groups, KeyedGenerator(bytes([k]) * 32), top_down=td)
            for n, t in truth.items():
                lvl = 0 if n == "root" else 1 if n.startswith("s") else 2
                err[td][lvl].append(np.abs(np.cumsum(out[n]) - np.cumsum(t)).sum())
    for lvl in (0, 1, 2):
        assert np.mean(err[True][lvl]) <= 1.10 * np.mean(err[False][lvl]), lvl


# -- local flat and hierarchical ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("eps", [1.0, 3.0])
def test_local_flat_and_tree_match_their_closed_forms(eps: float) -> None:
    """1,500 keyed runs of 16 buckets (OUE at the leaves at eps 1, GRR at eps 3): unbiased (mean within 4.5 standard
    errors) and the variance within 15% of the closed form (the sample variance's standard error is about 4% here;
    `bench/bench_ranges.py` shows 10,000 runs within 5%)."""
    from operators.ranges.local import LocalTree, flat_estimate, flat_perturb, flat_range_variance

    counts = np.random.default_rng(0).integers(0, 80, 16)
    values = np.repeat(np.arange(16), counts)
    tree = LocalTree(16, 4, eps)
    n = 1500
    for lo, hi in [(3, 9), (5, 5), (4, 11)]:
        flat, hier = np.empty(n), np.empty(n)
        truth = counts[lo : hi + 1].sum()
        for k in range(n):
            gen = KeyedGenerator(k.to_bytes(4, "little") * 8)
            flat[k] = flat_estimate(flat_perturb(values, 16, eps, gen), values.size, 16, eps)[lo : hi + 1].sum() - truth
            levels, reports = tree.perturb(values, gen)
            hier[k] = tree.answer(tree.estimate(levels, reports), lo, hi) - truth
        for errs, v in ((flat, flat_range_variance(counts, lo, hi, eps)), (hier, tree.range_variance(counts, lo, hi))):
            assert abs(errs.var() / v - 1) < 0.15, (lo, hi, errs.var(), v)
            assert abs(errs.mean()) < 4.5 * math.sqrt(v / n)


def test_the_local_oracle_is_the_one_with_the_smaller_variance() -> None:
    from operators.ranges.local import LocalTree, best_oracle

    assert best_oracle(10, 1.0) == "grr" and best_oracle(11, 1.0) == "oue"  # 3 e + 2 = 10.15
    assert LocalTree(1024, 4, 1.0).oracles == ["oue", "oue", "oue", "oue", "grr"]  # 1,024 ... 16 nodes, then 4


@pytest.mark.parametrize(("eps", "tree"), [(3.0, False), (3.0, True), (1.0, False), (1.0, True)])
def test_one_number_reports_of_the_daemon_estimate_ranges_without_bias(eps: float, tree: bool) -> None:
    """The daemon's one-number layout (operators.ranges.local.ReportLayout): 2,000 seeded runs of 650 devices over 16
    buckets. Every range's mean is within 5 standard errors of the truth; at eps 3 every level is GRR, so the
    empirical variance must match LocalTree's closed form within 10% (2,000 runs: the ratio's sd is about 3%)."""
    from operators.ranges.local import LocalTree, ReportLayout, answer_from_levels, flat_range_variance

    counts = np.random.default_rng(1).integers(0, 80, 16)
    values = np.repeat(np.arange(16), counts)
    lay = ReportLayout(16, 4, eps, tree=tree)
    ranges = [(3, 9), (5, 5), (0, 15)]
    runs = 2000
    got = np.empty((runs, len(ranges)))
    for k in range(runs):
        gen = KeyedGenerator(k.to_bytes(4, "little") * 8)
        reports = lay.report(values, gen.uniforms(1, 0, 0, 3 * values.size))
        assert reports.min() >= 0 and reports.max() < lay.total
        tally: dict[int, int] = {}
        for r in reports.tolist():
            tally[r] = tally.get(r, 0) + 1
        levels, n = lay.estimate(tally)
        assert n == values.size and [lv.size for lv in levels] == lay.sizes
        got[k] = [answer_from_levels(levels, 4, lo, hi) for lo, hi in ranges]
    truth = np.array([counts[lo : hi + 1].sum() for lo, hi in ranges])
    se = got.std(axis=0) / math.sqrt(runs)
    assert np.all(np.abs(got.mean(axis=0) - truth) < 5 * se)
    if eps == 3.0:
        assert set(lay.oracles) == {"grr"}
        ref = LocalTree(16, 4, eps) if tree else None
        for c, (lo, hi) in enumerate(ranges):
            closed = ref.range_variance(counts, lo, hi) if ref else flat_range_variance(counts, lo, hi, eps, "grr")
            if closed == 0:  # flat over the whole domain: the GRR estimates add up to n exactly
                assert got[:, c].var() < 1e-9
            else:
                assert 0.9 < got[:, c].var() / closed < 1.1


def test_snapshot_restores_the_tick_and_the_clamp_count() -> None:
    cfg = RangeConfig(epsilon=1.0, width=1.0, buckets=64, mechanism="tree")
    op = RangeRelease(cfg, bytes(32))
    op.category_of(-3.0)
    first = op.process([{1: 4}, {2: 9}])
    again = RangeRelease.restore(cfg, bytes(32), json.loads(json.dumps(op.snapshot())))
    assert (again.ticks, again.clamped) == (2, 1)
    assert again.process([{5: 1}]) == RangeRelease(cfg, bytes(32)).process([{1: 4}, {2: 9}, {5: 1}])[2:]
    assert first[0] != first[1]

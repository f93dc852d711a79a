"""Range counting over a value domain (Friis, thesis 2021): the b-ary tree and range decomposition, central flat and
tree histograms with consistency, local flat and hierarchical histograms over frequency oracles, their exact range
variances and the rules for when the tree beats flat."""

from operators.ranges.central import (
    FlatHistogram,
    RangeTree,
    ReleasedTree,
    mean_variance,
    prefer_tree,
    range_variance,
)
from operators.ranges.decomposition import decompose, max_nodes, node_span, tree_height
from operators.ranges.local import LocalTree, flat_estimate, flat_perturb, flat_range_variance, prefer_local_tree

__all__ = [
    "FlatHistogram",
    "LocalTree",
    "RangeTree",
    "ReleasedTree",
    "decompose",
    "flat_estimate",
    "flat_perturb",
    "flat_range_variance",
    "max_nodes",
    "mean_variance",
    "node_span",
    "prefer_local_tree",
    "prefer_tree",
    "range_variance",
    "tree_height",
]

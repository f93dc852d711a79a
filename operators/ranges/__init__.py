"""Range counting over a value domain (seed 000): the b-ary tree and range decomposition, central flat and tree
histograms with consistency, their exact range variances and the rule for when the tree beats flat."""

from operators.ranges.central import (
    FlatHistogram,
    RangeTree,
    ReleasedTree,
    mean_variance,
    prefer_tree,
    range_variance,
)
from operators.ranges.decomposition import decompose, max_nodes, node_span, tree_height

__all__ = [
    "FlatHistogram",
    "RangeTree",
    "ReleasedTree",
    "decompose",
    "max_nodes",
    "mean_variance",
    "node_span",
    "prefer_tree",
    "range_variance",
    "tree_height",
]

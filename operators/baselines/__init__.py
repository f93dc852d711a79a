"""Baselines of the ToPS paper (Section 5) as operators, and a registry of every method by name.

``METHODS[name](config, key)`` builds an operator with ``process(values) -> releases`` (NaN for holdout ticks).
Operators whose ``answers_from_nodes`` is true answer range queries from tree nodes with
``range_queries(starts, lengths)`` over the released ticks; for the others a range sum is the sum of releases.

| name | threshold phase | stream phase | paper |
|---|---|---|---|
| tops | calibrated (operators.selection) | consistent 16-ary + Recent smoother (Ĥ16c) | ToPS, calibrated |
| tops-paper | NM-E (Eq. 6), s by Eq. 7 | the same | ToPS as published |
| pak | S-PAK | binary tree, answers from nodes (H2) | PAK, Fig. 3 |
| nm-e | NM-E | H2 | "NM-E", Fig. 3 |
| s-pak | S-PAK | Ĥ16c | "Ĥ16c", Fig. 3; "S-PAK", Fig. 7 |
| s-p | S-P | Ĥ16c | "S-P", Fig. 7 |
| h2, h16 | NM-E | b-ary tree, no consistency, answers from nodes | Fig. 5 |
| h16c | NM-E | consistent 16-ary tree, no smoother | Fig. 5 |
| flat | NM-E | per-tick Laplace | Appendix F |
| counter | NM-E | binary-tree continual counter (Dwork / Chan) | Section 3.1 |
| zero | none | always 0 | "Base", Figs. 5, 7 |

With ``config.theta`` set, every method skips its threshold phase and uses that public theta (Figure 5's setup).

>>> import numpy as np
>>> from operators.config import ToPSConfig
>>> sorted(METHODS)
['counter', 'flat', 'h16', 'h16c', 'h2', 'nm-e', 'pak', 's-p', 's-pak', 'tops', 'tops-paper', 'zero']
>>> op = METHODS["h16c"](ToPSConfig(epsilon=1.0, bound=10, theta=4, query_range=256), bytes(32))
>>> op.process(np.full(3, 2.0)).shape
(3,)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from operators.baselines._common import THRESHOLDS, TwoPhase, baseline_domain
from operators.baselines.counter import Counter, counter
from operators.baselines.flat import Flat, flat
from operators.baselines.hierarchies import Hierarchy, h2, h16, h16c
from operators.baselines.pak import pak, s_p, s_pak, smooth_percentile_threshold, smooth_sensitivity
from operators.baselines.zero import Zero
from operators.config import ToPSConfig

__all__ = [
    "LABELS",
    "METHODS",
    "THRESHOLDS",
    "Counter",
    "Flat",
    "Hierarchy",
    "TwoPhase",
    "Zero",
    "baseline_domain",
    "counter",
    "flat",
    "h2",
    "h16",
    "h16c",
    "make",
    "pak",
    "s_p",
    "s_pak",
    "smooth_percentile_threshold",
    "smooth_sensitivity",
]


def _tops(config: ToPSConfig, key: bytes) -> Any:
    from operators.tops import ToPS

    return ToPS(config, key)


def _tops_paper(config: ToPSConfig, key: bytes) -> Any:
    from operators.tops import ToPS

    return ToPS(config.replace(selection="paper"), key)


METHODS: dict[str, Callable[[ToPSConfig, bytes], Any]] = {
    "tops": _tops,
    "tops-paper": _tops_paper,
    "pak": pak,
    "nm-e": h2,
    "s-pak": s_pak,
    "s-p": s_p,
    "h2": h2,
    "h16": h16,
    "h16c": h16c,
    "flat": flat,
    "counter": counter,
    "zero": Zero,
}

# how the paper's figures name them
LABELS = {
    "tops": "ToPS",
    "tops-paper": "ToPS (paper's choice)",
    "pak": "PAK",
    "nm-e": "NM-E (+H2)",
    "s-pak": "S-PAK (+Ĥ16c)",
    "s-p": "S-P (+Ĥ16c)",
    "h2": "H2",
    "h16": "H16",
    "h16c": "H16c",
    "flat": "flat",
    "counter": "counter",
    "zero": "Base (zero)",
}


def make(name: str, config: ToPSConfig, key: bytes) -> Any:
    """``METHODS[name](config, key)`` with a clear error for an unknown name."""
    try:
        factory = METHODS[name]
    except KeyError:
        msg = f"unknown method {name!r}; known: {', '.join(METHODS)}"
        raise ValueError(msg) from None
    return factory(config, key)

"""The keystream domains: what each keyed ChaCha20 stream of :mod:`operators.noise` is for.

A domain is the high part of the 32-bit domain field of a keystream's nonce; its low 16 bits carry a sub-purpose (a
layer, a level). Kept apart from the generator so that the compiled kernels, which the generator loads, can name them
without importing it.
"""

from __future__ import annotations

import enum

__all__ = ["Domain"]


class Domain(enum.IntEnum):
    """What a keystream is for; the high part of the 32-bit domain field of the nonce."""

    HIERARCHY = 1  # node noise of the perturber; low 16 bits carry the layer
    THRESHOLD = 2  # the threshold optimizer's draws (permute-and-flip, discrete Laplace)
    LOCAL = 3  # randomizers of the local-DP mode
    BASELINE = 4  # baselines and audits
    CATEGORICAL = 5  # categorical streams (operators/categorical): low 16 bits carry the purpose
    RANGES = 6  # range counting and count-of-counts (operators/ranges, operators/countofcounts): low bits the level
    TRUNCATION = 7  # the holdout's excess above theta (operators/truncation.py)

"""The always-zero baseline ("Base" of Figures 5 and 7): releases 0 for every tick and reads nothing.

A method whose error is above this one gives no useful information. It keeps the holdout convention (NaN for the
first ``m`` ticks unless theta is fixed) so that it is compared on the same ticks as the other methods.

>>> from operators.config import ToPSConfig
>>> Zero(ToPSConfig(epsilon=1.0, bound=10, holdout=2), bytes(32)).process([5, 6, 7, 8]).tolist()
[nan, nan, 0.0, 0.0]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from operators.config import ToPSConfig

__all__ = ["Zero"]


class Zero:
    """Releases 0 for every tick after the holdout; data-independent, so 0-DP."""

    answers_from_nodes = False

    def __init__(self, config: ToPSConfig, key: bytes | None = None) -> None:
        self.config = config
        self.ticks = 0
        self.guarantee = {"neighbours": "event-level (one tick changed)", "epsilon": 0.0, "delta": 0.0}

    def __repr__(self) -> str:
        return f"Zero({self.config!r})"

    def process(self, values: Any) -> np.ndarray:
        """0 per tick (NaN in the holdout)."""
        n = np.asarray(values).reshape(-1).size
        idx = self.ticks + np.arange(n)
        self.ticks += n
        return np.where(idx < self.config.holdout_ticks, np.nan, 0.0)

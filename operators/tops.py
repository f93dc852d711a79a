"""ToPS (seed 001, Algorithm 1): threshold optimizer on the holdout, truncation, perturber, smoother.

(Interface in place; the implementation lands in the same module.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from operators.config import ToPSConfig

__all__ = ["ToPS"]


class ToPS:
    """One stream's eps-DP continual release.

    ``process(values)`` takes a 1-D array of finite, non-negative readings (one per tick) and returns a float64
    array of the same length: NaN for holdout ticks, the released value for every other tick. Values above
    ``config.bound`` are clamped (counted in ``clamped``). ``snapshot()`` returns a JSON-serialisable dict
    without any secret; ``ToPS.restore(config, key, snapshot)`` continues exactly where it left off.
    """

    def __init__(self, config: ToPSConfig, key: bytes) -> None:
        self.config = config
        self.theta: float | None = config.theta
        self.smoother_layers: int | None = None
        self.ticks = 0
        self.clamped = 0

    @property
    def phase(self) -> str:
        return "holdout" if self.theta is None else "releasing"

    @property
    def holdout_left(self) -> int:
        return max(0, self.config.holdout_ticks - self.ticks)

    def process(self, values: Any) -> np.ndarray:
        raise NotImplementedError

    def snapshot(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def restore(cls, config: ToPSConfig, key: bytes, snapshot: dict[str, Any]) -> ToPS:
        raise NotImplementedError

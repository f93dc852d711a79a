"""PAK (Perrier et al.) and its thresholds S-P and S-PAK as two-phase baselines (Wang et al., CCS 2021, Appendices A-B).

The threshold step is :mod:`operators.baselines.smooth_sensitivity`; here it is paired with the stream phase of the
paper's comparison (H2 for PAK, the consistent hierarchy with a smoother for S-P and S-PAK).
"""

from __future__ import annotations

from typing import Any

from operators.baselines._common import TwoPhase
from operators.baselines.smooth_sensitivity import (
    BETA,
    PERCENTILE,
    laplace_inverse_cdf,
    percentile_rank,
    smooth_percentile_threshold,
    smooth_sensitivity,
    smoothing_parameters,
)
from operators.config import ToPSConfig

__all__ = [
    "BETA",
    "PERCENTILE",
    "laplace_inverse_cdf",
    "pak",
    "percentile_rank",
    "s_p",
    "s_pak",
    "smooth_percentile_threshold",
    "smooth_sensitivity",
    "smoothing_parameters",
]


def _h2_stream(config: ToPSConfig, key: bytes):
    from operators.baselines.hierarchies import Hierarchy

    return Hierarchy(config, key, fanout=2)


def _hhat16c_stream(config: ToPSConfig, key: bytes):
    from operators.tops import ToPS

    return ToPS(config.replace(fanout=16), key)


def pak(config: ToPSConfig, key: bytes, **kwargs: Any) -> TwoPhase:
    """PAK end to end (Figure 3): S-PAK threshold on the holdout, then the binary hierarchy H2 answering from nodes.

    >>> import numpy as np
    >>> from operators.config import ToPSConfig
    >>> x = np.random.default_rng(0).poisson(3.0, 3000).astype(float)
    >>> op = pak(ToPSConfig(epsilon=1.0, bound=50, holdout=1000, query_range=1024), bytes(32))
    >>> rel = op.process(x)
    >>> bool(op.theta >= np.percentile(x[:1000], 99.5)), op.guarantee["delta"] > 0
    (True, True)
    >>> op.range_queries(np.array([0]), np.array([1024])).shape
    (1,)
    """
    return TwoPhase(
        config, key, threshold="s-pak", stream=_h2_stream, stream_fanout=2, answers_from_nodes=True, **kwargs
    )


def s_pak(config: ToPSConfig, key: bytes, **kwargs: Any) -> TwoPhase:
    """S-PAK threshold, then ToPS's perturber and smoother (the Ĥ16c of Figures 3 and 7).

    >>> import numpy as np
    >>> from operators.config import ToPSConfig
    >>> op = s_pak(ToPSConfig(epsilon=1.0, bound=50, holdout=500, query_range=256), bytes(32))
    >>> bool(np.isfinite(op.process(np.full(700, 3.0))[500:]).all())
    True
    """
    return TwoPhase(config, key, threshold="s-pak", stream=_hhat16c_stream, stream_fanout=16, **kwargs)


def s_p(config: ToPSConfig, key: bytes, **kwargs: Any) -> TwoPhase:
    """S-P (Nissim et al.'s smooth-sensitivity percentile) threshold, then ToPS's perturber and smoother (Figure 7).

    >>> import numpy as np
    >>> from operators.config import ToPSConfig
    >>> op = s_p(ToPSConfig(epsilon=1.0, bound=50, holdout=500, query_range=256), bytes(32))
    >>> bool(np.isfinite(op.process(np.full(700, 3.0))[500:]).all())
    True
    """
    return TwoPhase(config, key, threshold="s-p", stream=_hhat16c_stream, stream_fanout=16, **kwargs)

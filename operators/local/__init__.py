"""Local-DP randomizers and estimators of ToPL (Wang et al., CCS 2021, Section 4, Appendix E): SR, PM, HM and Square
Wave.

Every randomizer is a pure, vectorized function of the values and explicit uniforms in (0, 1) (drawn by the caller
from :class:`operators.noise.KeyedGenerator` under ``Domain.LOCAL``), so it is deterministic and testable:

- devices: :func:`square_wave_report` (phase ``threshold``) and :func:`hybrid_report` (phase ``stream``), both in
  reading units; ``*_perturb`` work on the mechanisms' unit scales;
- the server: :func:`threshold_from_reports` (SW histogram -> EM -> SW-W -> Eq. 8) and plain sums of Hybrid reports.
"""

from operators.local._units import REPORT_GRID, from_signed_unit, to_signed_unit, to_unit
from operators.local.hybrid import (
    hybrid_alpha,
    hybrid_perturb,
    hybrid_report,
    hybrid_scale,
    hybrid_variance,
    hybrid_worst_case_variance,
)
from operators.local.piecewise import (
    piecewise_parameters,
    piecewise_perturb,
    piecewise_report,
    piecewise_scale,
    piecewise_variance,
)
from operators.local.square_wave import (
    DensityEstimate,
    estimate_density,
    square_wave_density,
    square_wave_em,
    square_wave_histogram,
    square_wave_parameters,
    square_wave_perturb,
    square_wave_report,
    square_wave_transition_matrix,
    sww_prune,
)
from operators.local.stochastic_rounding import (
    stochastic_rounding_perturb,
    stochastic_rounding_report,
    stochastic_rounding_scale,
    stochastic_rounding_variance,
)
from operators.local.threshold import (
    ThresholdEstimate,
    optimal_threshold,
    threshold_candidates,
    threshold_from_reports,
    threshold_objective,
)

__all__ = [
    "REPORT_GRID",
    "DensityEstimate",
    "ThresholdEstimate",
    "estimate_density",
    "from_signed_unit",
    "hybrid_alpha",
    "hybrid_perturb",
    "hybrid_report",
    "hybrid_scale",
    "hybrid_variance",
    "hybrid_worst_case_variance",
    "optimal_threshold",
    "piecewise_parameters",
    "piecewise_perturb",
    "piecewise_report",
    "piecewise_scale",
    "piecewise_variance",
    "square_wave_density",
    "square_wave_em",
    "square_wave_histogram",
    "square_wave_parameters",
    "square_wave_perturb",
    "square_wave_report",
    "square_wave_transition_matrix",
    "stochastic_rounding_perturb",
    "stochastic_rounding_report",
    "stochastic_rounding_scale",
    "stochastic_rounding_variance",
    "sww_prune",
    "threshold_candidates",
    "threshold_from_reports",
    "threshold_objective",
    "to_signed_unit",
    "to_unit",
]

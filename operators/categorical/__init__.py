"""Categorical streams: LDP frequency oracles, their post-processing, and central histograms (Finnegan, thesis 2024).

Local (each device randomizes its own category; the server only sees reports):

- :mod:`~operators.categorical.grr` generalised randomized response;
- :mod:`~operators.categorical.unary` OUE and SUE;
- :mod:`~operators.categorical.olh` OLH with an exactly pairwise-independent hash and compiled exact decoding;
- :mod:`~operators.categorical.olh_fourier` OLH over a prime field, exact decoding by one Fourier transform;
- :mod:`~operators.categorical.hadamard` the one-bit Hadamard mechanism and Hadamard Response (FWHT decoding).

Every estimator returns unbiased counts; :mod:`~operators.categorical.postprocess` turns them into non-negative or
consistent ones. Central (the server holds the raw categories): :mod:`~operators.categorical.central`.
"""

from operators.categorical.central import (
    NEIGHBOURS,
    laplace_histogram,
    sparse_counts,
    stability_delta,
    stability_histogram,
    stability_threshold,
)
from operators.categorical.grr import grr_estimate, grr_parameters, grr_perturb, grr_variance
from operators.categorical.hadamard import (
    fwht,
    hm_estimate,
    hm_perturb,
    hm_size,
    hm_tally,
    hm_variance,
    hr_block_size,
    hr_estimate,
    hr_layout,
    hr_perturb,
    hr_variance,
    sylvester,
)
from operators.categorical.olh import (
    olh_estimate,
    olh_g,
    olh_g_optimal,
    olh_hash,
    olh_parameters,
    olh_perturb,
    olh_seeds,
    olh_support,
    olh_variance,
)
from operators.categorical.olh_fourier import (
    fourier_estimate,
    fourier_g,
    fourier_hash,
    fourier_perturb,
    fourier_seeds,
    fourier_support,
    fourier_support_brute,
    fourier_variance,
)
from operators.categorical.postprocess import POSTPROCESSORS, base, base_cut, base_pro, norm_sub, project_simplex
from operators.categorical.unary import (
    unary_estimate,
    unary_parameters,
    unary_perturb,
    unary_perturb_many,
    unary_simulate_support,
    unary_variance,
)

__all__ = [
    "NEIGHBOURS",
    "POSTPROCESSORS",
    "base",
    "base_cut",
    "base_pro",
    "fourier_estimate",
    "fourier_g",
    "fourier_hash",
    "fourier_perturb",
    "fourier_seeds",
    "fourier_support",
    "fourier_support_brute",
    "fourier_variance",
    "fwht",
    "grr_estimate",
    "grr_parameters",
    "grr_perturb",
    "grr_variance",
    "hm_estimate",
    "hm_perturb",
    "hm_size",
    "hm_tally",
    "hm_variance",
    "hr_block_size",
    "hr_estimate",
    "hr_layout",
    "hr_perturb",
    "hr_variance",
    "laplace_histogram",
    "norm_sub",
    "olh_estimate",
    "olh_g",
    "olh_g_optimal",
    "olh_hash",
    "olh_parameters",
    "olh_perturb",
    "olh_seeds",
    "olh_support",
    "olh_variance",
    "project_simplex",
    "sparse_counts",
    "stability_delta",
    "stability_histogram",
    "stability_threshold",
    "sylvester",
    "unary_estimate",
    "unary_parameters",
    "unary_perturb",
    "unary_perturb_many",
    "unary_simulate_support",
    "unary_variance",
]

"""The intervals of ``tops query`` hold the true range sum at their rate, checked as a consumer would: many independent
runs of ToPS (a fresh key each) on the shipped DNS and retail streams and on ``tops simulate`` meters (their spikes
truncated at the theta their holdout chose), windows of every length (log-uniform in [1, n]) at uniform starts, and
the share of windows whose 95 % interval holds the true sum, per length class.

Tolerance: every class of every stream kind in [0.93, 0.99]. A class holds about 350 windows from 120 runs; windows
of one run share its noise draws (the truncation statistic's above all), so a class's share varies about as a
binomial of the runs it spans: a standard deviation of about 2 % for the longest class, 1.2 % for the shortest.
The seeds are fixed.

A model broken on purpose (:class:`operators.error_bar.RangeError` with one part left out or understated) must fail
the same check: the last three tests see the check reject each.
"""

from __future__ import annotations

import pytest

from operators.error_bar import RangeError
from tests.query._coverage import CLASSES, Kind, run_coverage

pytestmark = pytest.mark.slow

RUNS, WINDOWS, RELEASED = 120, 15, 1 << 16
LOW, HIGH = 0.93, 0.99
# the streams and the holdout each is checked with: the meters' shorter holdout chooses a theta that truncates their
# spikes (a 65,536-reading holdout chooses theta = B, where nothing is truncated)
STREAMS = {"dns": (Kind("dns", 500.0), 65536), "retail": (Kind("retail", 500.0), 65536),
           "meter": (Kind("meter", 5000.0), 16384)}


def out_of_band(cov) -> list[str]:
    return [f"[{lo},{hi}) {cov.rate((lo, hi)):.3f}" for lo, hi in CLASSES
            if cov.windows[(lo, hi)] and not LOW <= cov.rate((lo, hi)) <= HIGH]


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_the_95_percent_interval_holds_the_true_sum_in_93_to_99_percent_of_windows_of_every_length(name: str) -> None:
    kind, holdout = STREAMS[name]
    cov = run_coverage(kind, runs=RUNS, windows=WINDOWS, holdout=holdout, released=RELEASED, seed=11)
    assert not out_of_band(cov), f"{name}: {cov}"


class NoSmootherTerm(RangeError):
    """Eq. (2) left out: the prediction error of partly covered leaves counts for nothing."""

    def smoother_part(self, keys, counts, held_last):
        return 0.0, [], 0.0


class QuarterNoiseVariance(RangeError):
    """Eq. (1) understated: the node noise's variance taken as a quarter of what it is."""

    def noise_part(self, keys, counts, held_last):
        nodes, start = super().noise_part(keys, counts, held_last)
        return nodes / 4.0, start / 4.0


class NoTruncationTerm(RangeError):
    """Eq. (3) left out: the interval of the sum truncated at theta taken for the true sum."""

    def truncation_part(self, count):
        return None


@pytest.mark.parametrize(("broken", "name"), [(NoSmootherTerm, "dns"), (QuarterNoiseVariance, "meter"),
                                              (NoTruncationTerm, "meter")])
def test_the_check_rejects_a_model_with_a_part_broken_on_purpose(broken: type[RangeError], name: str) -> None:
    kind, holdout = STREAMS[name]
    cov = run_coverage(kind, runs=40, windows=WINDOWS, holdout=holdout, released=RELEASED, seed=11, range_error=broken)
    assert out_of_band(cov), f"{broken.__name__} on {name} passed: {cov}"

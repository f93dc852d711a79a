"""The server half of ToPL (Wang et al., CCS 2021, Section 4) for the daemon's local mode: it only ever sees perturbed
reports.

Phase ``holdout`` (the device side calls it ``threshold``): the first ``m`` Square Wave reports (in reading units,
``y * B``) are counted over the SW report buckets; when ``m`` have arrived, theta is chosen exactly as
``tops replay --mode local`` chooses it (:func:`operators.topl.choose_threshold`: EM without smoothing, SW-W
pruning, Eq. 8 with Var from Eq. 22). With ``refine`` (default) the holdout comes in rounds that may zoom in on the
data (:mod:`operators.local.rounds`): after a zoom the control message asks the devices for Square Wave over
``[0, U]``, and only reports made over that domain (they say so) count from then on.
Phase ``releasing`` (devices: ``stream``): a tick's value is the sum of the
unbiased Hybrid reports of that tick, released as it is (no smoother: a range sum is a plain sum).

Every step is post-processing of eps-LDP reports, so nothing here spends budget.

>>> import numpy as np
>>> from operators.topl import ToPLConfig
>>> srv = LocalServer(ToPLConfig(epsilon=1.0, bound=64.0, holdout=3))
>>> srv.accepts("threshold", None, 10.0), srv.accepts("stream", 5.0, 1.0)
('ok', 'stale')
>>> srv.observe_threshold(np.array([10.0, 20.0, 30.0])); srv.phase
'releasing'
>>> srv.process(np.array([1.5, -0.25])).tolist()     # the sums of the tick's reports, as they are
[1.5, -0.25]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from operators.local.hybrid import hybrid_scale
from operators.local.rounds import HoldoutRounds
from operators.local.square_wave import square_wave_parameters
from operators.topl import ToPLConfig

__all__ = ["LocalServer"]

_SNAPSHOT_VERSION = 1


class LocalServer:
    """One local-mode stream on the server: counts of SW reports until theta, then per-tick report sums.

    Same interface as the central operator (``process``, ``process_one``, ``phase``, ``theta``, ``ticks``,
    ``holdout_left``, ``snapshot``, ``restore``) plus ``accepts`` (is a report of this phase and theta, in the range
    honest reports fall in?) and ``observe_threshold`` (the holdout's reports, which are not ticks).
    """

    takes_reports = True  # holdout reports are observed one by one, not as ticks

    def __init__(self, config: ToPLConfig, key: bytes | None = None) -> None:
        self.config = config
        self.theta: float | None = config.theta
        self.ticks = 0
        self.received = 0  # holdout reports counted
        self.clamped = 0
        self._sw_b = square_wave_parameters(config.threshold_budget)[0]
        self._rounds = HoldoutRounds(config)
        self.control_changed = False  # a round ended (and may have zoomed in): the devices must be told

    @property
    def sw_domain(self) -> float:
        """The domain holdout reports are made over now: ``B``, or smaller once a round zoomed in."""
        return self._rounds.domain

    def __repr__(self) -> str:
        return f"LocalServer(phase={self.phase!r}, theta={self.theta!r})"

    @property
    def phase(self) -> str:
        return "holdout" if self.theta is None else "releasing"

    @property
    def holdout_left(self) -> int:
        return max(0, self.config.holdout_ticks - self.received)

    @property
    def holdout_take(self) -> int:
        """Holdout reports still taken in the current round (over :attr:`sw_domain`); 0 once theta is chosen. The
        control message says it, so that a device reports no reading the server would then drop as stale."""
        return 0 if self.theta is not None else self._rounds.room()

    @property
    def sw_b(self) -> float:
        return self._sw_b

    def report_range(self) -> tuple[float, float]:
        """Where honest reports of this phase lie (Square Wave: ``[-b B, (1+b) B]``; Hybrid: theta (1 +- S)/2)."""
        if self.theta is None:
            return -self._sw_b * self.sw_domain, (1.0 + self._sw_b) * self.sw_domain
        s = hybrid_scale(self.config.epsilon)
        return 0.5 * self.theta * (1.0 - s), 0.5 * self.theta * (1.0 + s)

    def accepts(self, phase: str, theta: float | None, report: float) -> str:
        """``ok``, ``stale`` (made for another phase, theta or domain) or ``invalid`` (outside the honest range).

        A holdout report's ``theta`` slot carries the domain it was made over (absent: ``B``)."""
        if self.theta is None:
            if phase != "threshold":
                return "stale"
            made = self.config.bound if theta is None else theta
            if not math.isclose(made, self.sw_domain, rel_tol=1e-12):
                return "stale"
        elif phase != "stream" or theta is None or not math.isclose(theta, self.theta, rel_tol=1e-12):
            return "stale"
        lo, hi = self.report_range()
        tol = 1e-9 * max(1.0, abs(hi - lo))
        return "ok" if (math.isfinite(report) and lo - tol <= report <= hi + tol) else "invalid"

    def observe_threshold(self, reports: np.ndarray) -> None:
        """Count holdout Square Wave reports (reading units); choose theta when ``m`` have arrived."""
        if self.theta is not None:
            return
        rounds = self._rounds
        r = np.asarray(reports, dtype=np.float64)[: self.holdout_left]
        rounds_before = rounds.zooms_done
        while r.size:
            k = min(r.size, rounds.room())
            if not k:
                break
            dom = rounds.domain
            self.received += k
            if rounds.add_unit(r[:k] / dom):
                break  # the rest of this batch was made over the old domain: not counted
            r = r[k:]
        if rounds.zooms_done != rounds_before:  # a new round: its domain and what it takes go to the devices
            self.control_changed = True
        if self.holdout_left == 0:
            self.theta = float(rounds.estimate().theta)

    def process(self, values: Any) -> np.ndarray:
        """Release the ticks: NaN before theta is known, else the tick's sum of unbiased reports."""
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        self.ticks += v.size
        if self.theta is None:
            return np.full(v.size, np.nan)
        return v.copy()

    def process_one(self, value: float) -> float:
        self.ticks += 1
        return math.nan if self.theta is None else float(value)

    def snapshot(self) -> dict[str, Any]:
        """JSON-serialisable state: counts of perturbed reports (never a reading), theta, tick position."""
        return {
            "version": _SNAPSHOT_VERSION,
            "operator": "topl-server",
            "ticks": self.ticks,
            "received": self.received,
            "theta": self.theta,
            "phase": self.phase,
            "rounds": self._rounds.to_dict() if self.theta is None else None,
        }

    @classmethod
    def restore(cls, config: ToPLConfig, key: bytes | None, snapshot: dict[str, Any]) -> LocalServer:
        if snapshot.get("version") != _SNAPSHOT_VERSION or snapshot.get("operator") != "topl-server":
            msg = "not a local-mode server snapshot of a supported version"
            raise ValueError(msg)
        srv = cls(config, key)
        srv.ticks = int(snapshot["ticks"])
        srv.received = int(snapshot["received"])
        srv.theta = snapshot["theta"]
        if srv.theta is None:
            if snapshot.get("rounds") is not None:
                srv._rounds = HoldoutRounds.from_dict(config, snapshot["rounds"])
            else:  # saved before the holdout had rounds: one round over [0, B]
                counts = np.asarray(snapshot["sw_counts"], dtype=np.int64)
                if counts.shape != (config.buckets,):
                    msg = "snapshot does not match the configuration (sw_counts)"
                    raise ValueError(msg)
                srv._rounds = HoldoutRounds.single(config, counts, srv.received)
        return srv

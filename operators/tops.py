"""ToPS (Wang et al., CCS 2021, Algorithm 1): threshold optimizer on the holdout, truncation, perturber, smoother.

1. The first ``m`` ticks (the holdout) are never released; their quantized values go into a histogram over the
   candidate thresholds (and, for the calibrated selection, block statistics), and when the holdout is full theta
   and s are chosen: by the calibrated error model of :mod:`operators.selection` (default), or by permute-and-flip
   on Eq. 6 (Eq. 5 counts) and Eq. 7 for s (``selection="paper"``).
2. The tree keeps ``L = h - s`` layers at ``eps / L`` each.
3. Every later value is quantized to the resolution grid and truncated to theta (Algorithm 1, "Truncate").
4. Each leaf (``b^s`` ticks) releases its true sum plus its consistent noise (Appendix C), spread over its ticks
   by the smoother (Appendix D), one release per tick, final when made.

5. When the holdout ends, what truncation at the chosen theta takes and how short sums vary are measured on it, with
   noise (:mod:`operators.error_stats`), for the error bars of the releases.

Privacy (event level, one tick is one event): the holdout ticks feed only the threshold choice and those
statistics, eps_T-DP together (sequential composition of their shares of eps_T), and the released ticks only the
eps-DP hierarchy; they are disjoint, so the stream is max(eps, eps_T)-DP by parallel composition, and consistency
and smoothing are post-processing.

>>> import numpy as np
>>> cfg = ToPSConfig(epsilon=1.0, bound=10, holdout=100, query_range=256, fanout=4)
>>> op = ToPS(cfg, key=bytes(32))
>>> rel = op.process(np.full(300, 3.0))
>>> bool(np.isnan(rel[:100]).all()), op.phase, op.theta, op.smoother_layers
(True, 'releasing', 3.0, 3)
>>> rel2 = ToPS(cfg, key=bytes(32)).process(np.full(300, 3.0))
>>> bool(np.array_equal(rel, rel2, equal_nan=True))     # same key, same ticks: same releases
True
"""

from __future__ import annotations

import math
from array import array
from typing import Any

import numpy as np

from operators.config import ToPSConfig
from operators.error_stats import budgets, measure
from operators.hierarchy import ConsistentNoise
from operators.noise import Domain, KeyedGenerator, shared_laplace
from operators.permute_and_flip import keyed_permute_and_flip
from operators.selection import BlockStats, Cells, Selection, choose, choose_small_many, default_layers
from operators.smoother import SmootherState, release_ticks
from operators.threshold import (
    candidate_grid,
    holdout_histogram,
    integer_run,
    m_theta,
    score_bound,
    scores,
)

__all__ = ["ToPS", "choose_ends", "end_holdouts", "release_layers"]

_SNAPSHOT_VERSION = 1
_SPARSE_CELLS = 128  # a holdout touching at most this many candidate cells may keep them in a dict


_FEW_HELD = 8  # ToPS.hold takes at most this many readings one at a time in scalars (numpy's set-up costs more)


def _pending_array(bound_units: int) -> array:
    """An empty typed array for a holdout's pending readings in units (``0 .. bound_units``): 2, 4 or 8 bytes each."""
    return array("H" if bound_units < 1 << 16 else "I" if bound_units < 1 << 32 else "q")


class ToPS:
    """One stream's eps-DP continual release.

    ``process(values)`` takes a 1-D array of finite, non-negative readings (one per tick) and returns a float64
    array of the same length: NaN for holdout ticks, the released value for every other tick. Values above
    ``config.bound`` are clamped (counted in ``clamped``). ``snapshot()`` returns a JSON-serialisable dict
    without any secret; ``ToPS.restore(config, key, snapshot)`` continues exactly where it left off.
    """

    # no instance dict: a daemon holds one of these per stream in its holdout
    __slots__ = ("_blocks", "_bound_units", "_candidates", "_gen", "_hist", "_noise", "_pending", "_smoother",
                 "clamped", "config", "error_stats", "smoother_layers", "start_units", "theta_units", "ticks")

    def __init__(self, config: ToPSConfig, key: bytes, *, start: float | None = None) -> None:
        self.config = config
        self._gen = KeyedGenerator(key)
        self._bound_units = math.floor(config.span / config.resolution + 1e-9)
        self.ticks = 0
        self.clamped = 0
        self.theta_units: int | None = None
        self.smoother_layers: int | None = None
        self._candidates: np.ndarray | None = None
        self._hist: np.ndarray | dict[int, int] | None = None
        self._noise: ConsistentNoise | None = None
        self._smoother: SmootherState | None = None
        self._blocks: BlockStats | None = None
        # holdout readings (units) not yet in the block statistics (at most 64), 2-8 bytes each (not 32-byte ints)
        self._pending = _pending_array(self._bound_units)
        self.start_units: float | None = None
        self.error_stats: bytes | None = None  # the holdout's statistics for error bars (operators/error_stats.py)
        if config.theta is not None:  # a public theta; ``start`` (value units, public) replaces the prior theta/2
            units = None if start is None else (start - config.lower) / config.resolution
            self._start_release(max(1, round((config.theta - config.lower) / config.resolution)), start=units)
        else:
            self._candidates = candidate_grid(config.span, config.resolution, config.holdout_grid == "compact")
            self._hist = {}  # sparse while that is smaller than the dense int32 histogram (small holdouts)
            self._blocks = self._new_blocks()

    def _new_blocks(self) -> BlockStats | None:
        cfg = self.config
        if cfg.selection != "calibrated":
            return None
        return BlockStats(cfg.fanout, cfg.holdout, self._bound_units, cfg.query_range)

    def __repr__(self) -> str:
        return f"ToPS({self.config!r}, key=<secret>)"

    # -- public state -------------------------------------------------------------------------------------------
    @property
    def theta(self) -> float | None:
        """The truncation threshold in value units (``None`` while in the holdout)."""
        return None if self.theta_units is None else self.config.lower + self.theta_units * self.config.resolution

    @property
    def phase(self) -> str:
        return "holdout" if self.theta_units is None else "releasing"

    @property
    def holdout_left(self) -> int:
        return 0 if self.theta_units is not None else max(0, self.config.holdout_ticks - self.ticks)

    @property
    def leaf_ticks(self) -> int | None:
        return None if self.smoother_layers is None else self.config.fanout**self.smoother_layers

    @property
    def layer_epsilon(self) -> float | None:
        """``eps / (h - s)``, the budget of each tree layer."""
        if self.smoother_layers is None:
            return None
        return self.config.epsilon / (self.config.height - self.smoother_layers)

    def state_nbytes(self) -> int:
        """Numeric state kept between calls, in bytes (histogram in the holdout; walk + smoother after)."""
        if self._hist is not None:
            pending = self._pending.itemsize * len(self._pending)
            blocks = self._blocks.nbytes() + pending if self._blocks is not None else 0
            hist = 16 * len(self._hist) if isinstance(self._hist, dict) else int(self._hist.nbytes)
            return hist + 64 + blocks
        return self._noise.state_nbytes() + self._smoother.nbytes()

    # -- the work -----------------------------------------------------------------------------------------------
    def _quantize(self, values: np.ndarray) -> np.ndarray:
        """Clamp to ``[lower, B]``, shift by ``lower`` and quantize: integer units in ``[0, (B - lower) / q]``."""
        cfg = self.config
        out = (values > cfg.bound) | (values < cfg.lower)
        n_out = int(np.count_nonzero(out))
        if n_out:
            self.clamped += n_out
            values = np.clip(values, cfg.lower, cfg.bound)
        if cfg.lower:
            values = values - cfg.lower
        units = np.rint(values / cfg.resolution).astype(np.int64)
        return np.clip(units, 0, self._bound_units)

    def _select(self) -> None:
        """End of the holdout: choose theta (and s, and the smoother's start) and start releasing."""
        self.start(self._choice())

    def _choice(self) -> Selection:
        """The choice that ends the holdout (theta; s and the smoother's start, or None for the defaults)."""
        if self._blocks is None:
            return Selection(self._choose_threshold(), None, None, False)
        self._flush()
        hist = self._hist
        if isinstance(hist, dict):  # a small holdout's occupied cells, as they are (no dense histogram)
            hist = Cells.of(hist, len(self._candidates) + 1)
        return choose(hist, self._candidates, self._blocks, gen=self._gen, **_choice_parameters(self.config))

    def start(self, sel: Selection) -> None:
        """Start releasing with the choice ``sel`` made at the end of this holdout (:func:`choose_ends`), after the
        holdout's statistics for error bars are measured (:meth:`measure_error_stats`)."""
        self.error_stats = self.measure_error_stats(sel)
        self._start_release(sel.theta_units, sel.smoother_layers, start=sel.start_units)

    def adopt_choice(self, sel: Selection, error_stats: bytes | None) -> None:
        """Release from the next reading with a choice made on another holdout (a fleet's:
        :mod:`operators.fleet_holdout`) and that holdout's error statistics; only before this stream's first reading.
        """
        if self.theta_units is not None or self.ticks:
            msg = "adopt_choice() is for a stream that has taken no reading"
            raise ValueError(msg)
        self.error_stats = error_stats
        self._start_release(sel.theta_units, sel.smoother_layers, start=sel.start_units)

    def measure_error_stats(self, sel: Selection) -> bytes:
        """What truncation at the chosen theta takes and how short sums vary, with their noise
        (:mod:`operators.error_stats`, at their shares of the threshold budget); the holdout must still be held."""
        cfg = self.config
        if self._blocks is not None:
            self._flush()
        return measure(self._dense_hist(), self._candidates, theta_units=sel.theta_units,
                       bound_units=self._bound_units, blocks=self._blocks,
                       leaf_ticks=cfg.fanout ** release_layers(cfg, sel.smoother_layers), gen=self._gen,
                       threshold_epsilon=cfg.threshold_epsilon or cfg.epsilon)

    def _choose_threshold(self) -> int:
        """Eq. 6's theta (``selection = "paper"``): permute-and-flip over the candidates (monotone, sensitivity 1),
        its draws at address 0."""
        cfg = self.config
        thr_eps = budgets(cfg.threshold_epsilon or cfg.epsilon)[0]
        cands = self._candidates
        params = {"m": cfg.holdout, "epsilon": cfg.epsilon, "query_range": cfg.query_range, "fanout": cfg.fanout}
        thetas = cands * cfg.resolution
        score = scores(m_theta(self._dense_hist()), thetas, **params)
        k = keyed_permute_and_flip(score, thr_eps, score_bound(thetas, **params), self._gen, int(Domain.THRESHOLD), 0)
        return int(cands[k])

    def _start_release(self, theta_units: int, s: int | None = None, start: float | None = None) -> None:
        cfg = self.config
        self.theta_units = theta_units
        self.start_units = start
        s = self.smoother_layers = release_layers(cfg, s)
        layers = cfg.height - s
        noise = shared_laplace(cfg.epsilon / layers, theta_units)
        self._noise = ConsistentNoise(
            self._gen,
            fanout=cfg.fanout,
            layers=layers,
            top_nodes=cfg.query_range // cfg.fanout ** (cfg.height - 1),
            noise=noise,
        )
        self._smoother = SmootherState.initial(
            cfg.smoother, leaf_ticks=cfg.fanout**s, theta_units=theta_units, window=cfg.window, start=start
        )
        self._candidates = None
        self._hist = None
        self._blocks = None

    def process(self, values: Any) -> np.ndarray:
        """Release one value per input tick (NaN for holdout ticks)."""
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        n = values.size
        out = np.full(n, np.nan)
        if n == 0:
            return out
        units = self._quantize(values)
        start = 0
        if self.theta_units is None:
            start = self._hold_units(units)
            if self.holdout_left == 0:
                self._select()
        if start < n:
            truncated = np.minimum(units[start:], self.theta_units)
            st = self._smoother
            noise = self._noise.next_leaves((st.pos + (n - start)) // st.leaf_ticks)
            rel = release_ticks(truncated, noise, st, alpha=self.config.alpha)
            out[start:] = rel * self.config.resolution if self.config.resolution != 1.0 else rel
            if self.config.lower:  # post-processing: a public constant added to each noisy release
                out[start:] += self.config.lower
            self.ticks += n - start
        return out

    def _hold_units(self, units: np.ndarray) -> int:
        """The holdout takes as many of ``units`` as it has readings left; returns how many."""
        take = min(units.size, self.holdout_left)
        self._count(units[:take])
        if self._blocks is not None:
            self._flush()
            self._blocks.add(units[:take])
        self.ticks += take
        return take

    def hold(self, values: Any) -> None:
        """The holdout's readings up to and including its last one, without the choice that ends it (what
        :meth:`process` does with them, NaN for each): :func:`end_holdouts` then makes the choice for many streams
        at once. ``ValueError`` when more readings than the holdout has left are given, or none is left."""
        if self.theta_units is None and len(values) <= self.holdout_left:
            if len(values) <= _FEW_HELD and not self.config.lower:  # numpy's set-up costs more than a few scalars
                for v in values:
                    self._hold_one(float(v))
            else:
                self._hold_units(self._quantize(np.asarray(values, dtype=np.float64).reshape(-1)))
            return
        msg = "hold() takes at most the readings the holdout has left"
        raise ValueError(msg)

    def process_one(self, value: float) -> float:
        """One tick: its release, or NaN in the holdout.

        A scalar fast path for the daemon; it does exactly what :meth:`process` does on a one-element array (a test
        checks bit equality): the holdout's readings, its end (the choice, :meth:`_select`) and the ticks inside a
        leaf here, and it hands over to :meth:`process` whenever a leaf completes.
        """
        cfg = self.config
        v = float(value)
        st = self._smoother
        if cfg.lower:  # the general path clamps, shifts and adds lower back
            return float(self.process(np.array([v], dtype=np.float64))[0])
        if self._hist is not None:
            self._hold_one(v)
            if self.ticks >= cfg.holdout_ticks:  # the holdout's last reading: choose, as process() does
                self._select()
            return math.nan
        if st is not None and st.pos + 1 < st.leaf_ticks:
            units = min(self._units_one(v), self.theta_units)
            st.pos += 1
            st.leaf_sum += units
            self.ticks += 1
            return st.pred * cfg.resolution if cfg.resolution != 1.0 else st.pred
        return float(self.process(np.array([v], dtype=np.float64))[0])

    def _units_one(self, v: float) -> int:
        """One reading (``lower`` = 0) clamped to ``[0, B]`` (counted in ``clamped``) and quantized, in scalars: what
        :meth:`_quantize` does with it."""
        cfg = self.config
        if v > cfg.bound:
            self.clamped += 1
            v = cfg.bound
        elif v < 0.0:
            self.clamped += 1
            v = 0.0
        return min(round(v / cfg.resolution), self._bound_units)

    def _hold_one(self, v: float) -> None:
        """One holdout reading (``lower`` = 0), in scalars: what :meth:`_hold_units` does with it."""
        units = self._units_one(v)
        low, dense_top = integer_run(self._candidates)
        if units <= low:
            cell = 0
        elif units <= dense_top:  # the grid's integer run: candidates[k] = low + k
            cell = units - low
        else:
            cell = int(np.searchsorted(self._candidates, units, side="left"))
        hist = self._hist
        if isinstance(hist, dict):
            hist[cell] = hist.get(cell, 0) + 1
            if len(hist) > self._sparse_cells():
                self._hist = self._dense_hist()
        else:
            hist[cell] += 1
        blocks = self._blocks
        if blocks is not None:  # the block statistics take readings in batches (exact however batched)
            if blocks.widths:
                self._pending.append(units)
                if len(self._pending) >= 64:
                    self._flush()
            else:  # a holdout too short for any block: only its position counts (what add() would do)
                blocks.pos += 1
        self.ticks += 1

    def _count(self, units: np.ndarray) -> None:
        """Count holdout readings (quantized units) in the histogram over the candidates."""
        if isinstance(self._hist, dict):
            cells, counts = np.unique(np.searchsorted(self._candidates, units, side="left"), return_counts=True)
            hist = self._hist
            for c, n in zip(cells.tolist(), counts.tolist(), strict=True):
                hist[c] = hist.get(c, 0) + n
            if len(hist) > self._sparse_cells():
                self._hist = self._dense_hist()
        else:
            holdout_histogram(units, self._candidates, self._hist)

    def _sparse_cells(self) -> int:
        """Most cells the sparse histogram holds: a dict entry costs about 64 bytes, a dense cell 4."""
        return min(_SPARSE_CELLS, (len(self._candidates) + 1) // 16)

    def _dense_hist(self) -> np.ndarray:
        """The holdout histogram as ``len(candidates) + 1`` int32 counts (Eq. 5's input)."""
        hist = self._hist
        if not isinstance(hist, dict):
            return hist
        dense = np.zeros(len(self._candidates) + 1, dtype=np.int32)
        for c, n in hist.items():
            dense[c] = n
        return dense

    def _flush(self) -> None:
        if self._pending:
            self._blocks.add(np.array(self._pending, dtype=np.int64))
            del self._pending[:]

    # -- checkpoints --------------------------------------------------------------------------------------------
    def frozen(self) -> ToPS:
        """A copy of this operator's holdout state as it is now, for a :meth:`snapshot` taken later (a daemon's
        checkpoint lends its holdout streams to its writer thread, and copies one only when it takes a reading before
        the writer made its snapshot). The copy shares the configuration, the key's generator and the read-only
        parts."""
        if self.theta_units is not None:
            msg = "frozen() copies a holdout; a releasing stream's snapshot is taken at once"
            raise ValueError(msg)
        op = ToPS.__new__(ToPS)
        for name in self.__slots__:
            setattr(op, name, getattr(self, name))
        hist = self._hist
        if hist is not None:
            op._hist = dict(hist) if isinstance(hist, dict) else hist.copy()
        if self._blocks is not None:
            op._blocks = self._blocks.copy()
        op._pending = self._pending[:]
        return op

    def snapshot(self, *, stored: bool = False) -> dict[str, Any]:
        """A JSON-serialisable picture of the state (no key; the holdout histogram while in the holdout: a dense list,
        or ``{"cells", "index", "count"}`` of its non-zero cells while it is sparse).

        ``stored``: as a state store keeps it (``stream.state.records``): without ``config`` (stored beside it) and
        the histogram always as its non-zero cells, found by numpy (not by filtering the cells in Python: a checkpoint
        writes every holdout)."""
        snap: dict[str, Any] = {"version": _SNAPSHOT_VERSION}
        if not stored:
            snap["config"] = self.config.to_dict()
        snap["ticks"] = self.ticks
        snap["clamped"] = self.clamped
        snap["theta_units"] = self.theta_units
        snap["smoother_layers"] = self.smoother_layers
        if self.theta_units is None:
            hist = self._hist
            if isinstance(hist, dict):  # the non-zero cells only (what a state store keeps anyway)
                cells = sorted(hist)
                snap["holdout_histogram"] = {"cells": len(self._candidates) + 1, "index": cells,
                                             "count": [hist[c] for c in cells]}
            elif stored:
                idx = np.flatnonzero(hist)
                snap["holdout_histogram"] = {"cells": len(hist), "index": idx.tolist(), "count": hist[idx].tolist()}
            else:
                snap["holdout_histogram"] = hist.tolist()
            if self._blocks is not None:
                self._flush()
                snap["holdout_blocks"] = self._blocks.to_dict()
        else:
            snap["walk"] = self._noise.state()
            snap["smoother"] = self._smoother.to_dict()
        return snap

    @staticmethod
    def check_snapshot(config: ToPSConfig, snapshot: dict[str, Any]) -> None:
        """``ValueError`` unless ``snapshot`` is of this version and was made with ``config`` (what :meth:`restore`
        checks first; ``operators.columnar`` restores a releasing stream straight into a row after the same check)."""
        if snapshot.get("version") != _SNAPSHOT_VERSION:
            msg = "unsupported ToPS snapshot version"
            raise ValueError(msg)
        made = dict(snapshot["config"])
        if "selection" not in made and (config.selection == "paper" or snapshot["theta_units"] is not None):
            made["selection"] = config.selection  # made before selection existed (Eq. 6); once releasing it is moot
        if made != config.to_dict():
            msg = "the snapshot was made with other parameters"
            if "selection" not in snapshot["config"]:
                msg += ' (before the calibrated selection: set selection = "paper" to finish its holdout)'
            raise ValueError(msg)

    @classmethod
    def restore(cls, config: ToPSConfig, key: bytes, snapshot: dict[str, Any]) -> ToPS:
        """Continue from ``snapshot``; the noise of the current tree is regenerated from the key, never redrawn."""
        cls.check_snapshot(config, snapshot)
        op = cls.__new__(cls)
        op.config = config
        op._gen = KeyedGenerator(key)
        op._bound_units = math.floor(config.span / config.resolution + 1e-9)
        op.ticks = int(snapshot["ticks"])
        op.clamped = int(snapshot["clamped"])
        op.theta_units = None
        op.smoother_layers = None
        op._noise = None
        op._smoother = None
        op._blocks = None
        op._pending = _pending_array(op._bound_units)
        op.start_units = None
        op.error_stats = None
        if snapshot["theta_units"] is None:
            op._candidates = candidate_grid(config.span, config.resolution, config.holdout_grid == "compact")
            saved = snapshot["holdout_histogram"]
            if isinstance(saved, dict):  # the non-zero cells of a sparse holdout
                try:
                    dense = np.zeros(int(saved["cells"]), dtype=np.int32)
                    dense[np.asarray(saved["index"], dtype=np.int64)] = np.asarray(saved["count"], dtype=np.int32)
                except (KeyError, TypeError, ValueError, IndexError):
                    msg = "corrupt ToPS snapshot (holdout histogram)"
                    raise ValueError(msg) from None
                saved = dense
            op._hist = np.array(saved, dtype=np.int32)
            if op._hist.shape != (len(op._candidates) + 1,) or (op._hist < 0).any():
                msg = "corrupt ToPS snapshot (holdout histogram)"
                raise ValueError(msg)
            cells = np.flatnonzero(op._hist)
            if len(cells) <= op._sparse_cells():
                op._hist = {int(c): int(op._hist[c]) for c in cells}
            op._blocks = op._new_blocks()
            if op._blocks is not None:
                try:
                    op._blocks.load(snapshot["holdout_blocks"])
                except (KeyError, TypeError, ValueError):
                    msg = "corrupt ToPS snapshot (holdout blocks)"
                    raise ValueError(msg) from None
            return op
        # rebuild the release side with the recorded s, then move the walk and the smoother into place
        op._start_release(int(snapshot["theta_units"]), int(snapshot["smoother_layers"]))
        op._noise.tree = int(snapshot["walk"]["tree"])
        op._noise.leaf = int(snapshot["walk"]["leaf"])
        op._smoother = SmootherState.from_dict(
            config.smoother, op._smoother.leaf_ticks, config.window, snapshot["smoother"]
        )
        return op


def release_layers(cfg: ToPSConfig, s: int | None) -> int:
    """The smoothed layers a stream releases with: the choice's ``s``, else the configured one, else Eq. 7's."""
    return s if s is not None else default_layers(cfg.smoother_layers, cfg.epsilon, cfg.query_range, cfg.fanout)


def _choice_parameters(cfg: ToPSConfig) -> dict[str, Any]:
    """The public parameters of the calibrated choice (``operators.selection.choose``) for a configuration: the
    threshold budget less the error statistics' shares (:func:`operators.error_stats.budgets`)."""
    return {"epsilon": cfg.epsilon, "threshold_epsilon": choice_epsilon(cfg), "holdout": cfg.holdout,
            "query_range": cfg.query_range, "fanout": cfg.fanout, "fixed_s": cfg.smoother_layers}


def choice_epsilon(cfg: ToPSConfig) -> float:
    """The budget of the choice of theta, s and the start: ``eps_T`` less the error statistics' shares."""
    return budgets(cfg.threshold_epsilon or cfg.epsilon)[0]


def end_holdouts(ops: list[ToPS]) -> None:
    """End the holdout of each of ``ops`` (each took its last holdout reading with :meth:`ToPS.hold`) with the choice
    :func:`choose_ends` makes: each stream releases from then on as :meth:`ToPS.process` would have made it."""
    for op, sel in zip(ops, choose_ends(ops), strict=True):
        op.start(sel)


def choose_ends(ops: list[ToPS]) -> list[Selection]:
    """The choice that ends the holdout of each of ``ops`` (each took its last holdout reading with :meth:`ToPS.hold`),
    the same as :meth:`ToPS.process` makes at that reading: the small holdouts of one configuration
    (:func:`operators.selection.choose_small_many`) are chosen together, the others one by one. The streams stay at
    the end of their holdout (:meth:`ToPS.start` starts one with its choice). ``ValueError`` (before any choice) when
    one of them still has holdout readings to take or is releasing."""
    if any(op.theta_units is not None or op.holdout_left for op in ops):
        msg = "end_holdouts() takes streams whose holdout took its last reading"
        raise ValueError(msg)
    groups: dict[ToPSConfig, list[int]] = {}
    for i, op in enumerate(ops):
        groups.setdefault(op.config, []).append(i)
    out: list[Selection | None] = [None] * len(ops)
    for cfg, members in groups.items():
        grid = ops[members[0]]._candidates
        small = [i for i in members
                 if ops[i]._blocks is not None and isinstance(ops[i]._hist, dict) and ops[i]._candidates is grid]
        chosen = None
        if len(small) > 1:
            for i in small:
                ops[i]._flush()
            chosen = choose_small_many(
                [Cells.of(ops[i]._hist, len(grid) + 1) for i in small],  # type: ignore[arg-type]
                [ops[i]._blocks for i in small],  # type: ignore[misc]
                [ops[i]._gen for i in small],
                grid,  # type: ignore[arg-type]
                **_choice_parameters(cfg),
            )
        if chosen is not None:
            for i, sel in zip(small, chosen, strict=True):
                out[i] = sel
        for i in members:
            if out[i] is None:
                out[i] = ops[i]._choice()
    return out  # type: ignore[return-value]

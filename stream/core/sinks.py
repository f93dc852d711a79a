"""Where releases go: JSON encoding, the bounded publish queue (MQTT) and the stdout JSONL sink."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import sys
from collections import deque
from collections.abc import Iterable
from json.encoder import encode_basestring_ascii  # json.dumps of a str, without its checks
from typing import IO, Any

import numpy as np

from operators.columnar import RowOperator
from operators.config import SMOOTHERS, ToPSConfig
from operators.error_stats import budgets as error_stats_budgets
from operators.error_stats import status as error_stats_status
from operators.selection import BUDGET_SPLIT, _dlap_noise
from operators.topl_server import LocalServer
from operators.tops import ToPS, choice_epsilon
from operators.truncation import public_frame
from stream.core import _release_text as text
from stream.core.router import ReleaseBatch, Releases, RowReleases, StreamRecord

__all__ = ["PublishQueue", "StdoutSink", "encode_all", "encode_release_rows", "encode_releases", "encode_status",
           "encode_step", "release_params", "releases_in", "status_line", "status_lines"]


def encode_releases(batch: ReleaseBatch, epsilon: float, reprs: dict[float, str] | None = None) -> list[str]:
    """One JSON object per released tick: ``{"stream", "tick", "ts", "value", "epsilon", "theta"}``. ``reprs``: the
    texts of times, epsilons and thetas already formatted, shared by the batches of one processing step (a float's
    ``repr`` is costly; one step's releases share their time and epsilon, and have a few thetas).

    >>> from types import SimpleNamespace
    >>> rec = SimpleNamespace(name_json='"m1"')
    >>> encode_releases(ReleaseBatch(rec, [5], [1.5], [2.0], 7.0), 1.0)
    ['{"stream":"m1","tick":5,"ts":1.5,"value":2.0,"epsilon":1.0,"theta":7.0}']
    """
    values, ts = batch.values, batch.ts
    if len(values) == 1 == len(ts) == len(batch.ticks) and type(values[0]) is float and ts[0] != 0.0:
        # one release (a stream's reading of this step), its time and epsilon formatted once a step. Equal floats
        # other than +-0 have one repr (0.0 is never a time: a reading's ts is checked to lie in 1970-2100)
        if reprs is None:
            reprs = {}
        t, eps = ts[0], float(epsilon)
        t_text = reprs.get(t)
        if t_text is None:
            t_text = reprs[t] = repr(t)
        e_text = reprs.get(eps)
        if e_text is None:
            e_text = reprs[eps] = repr(eps)
        theta = batch.theta  # a float above 0 (a few distinct ones a step): its text shared too
        th_text = reprs.get(theta) if type(theta) is float else None
        if th_text is None:
            th_text = repr(theta)
            if type(theta) is float:
                reprs[theta] = th_text
        return [f'{{"stream":{batch.record.name_json},"tick":{batch.ticks[0]},"ts":{t_text},"value":{values[0]!r},'
                f'"epsilon":{e_text},"theta":{th_text}}}']
    if batch.values and isinstance(batch.values[0], dict):  # categorical: one histogram per period
        name = batch.record.name_json
        eps = float(epsilon)
        return [f'{{"stream":{name},"tick":{t},"ts":{ts!r},' + json.dumps(v, separators=(",", ":"))[1:-1]
                + f',"epsilon":{eps!r}}}' for t, ts, v in zip(batch.ticks, batch.ts, batch.values, strict=True)]
    head = f'{{"stream":{batch.record.name_json},"tick":'
    tail = f',"epsilon":{float(epsilon)!r},"theta":{batch.theta!r}}}'
    ts = batch.ts
    if ts and ts[0] != 0.0 and ts.count(ts[0]) == len(ts):
        # one time for all (the readings of one step): formatted once. Equal floats other than +-0 have one repr.
        mid = f',"ts":{ts[0]!r},"value":'
        if len(batch.values) != len(ts) or len(batch.ticks) != len(ts):
            msg = "release batch columns differ in length"
            raise ValueError(msg)
        return [f'{head}{t}{mid}{v!r}{tail}' for t, v in zip(batch.ticks, batch.values, strict=True)]
    return [f'{head}{t},"ts":{ts!r},"value":{v!r}{tail}' for t, ts, v in zip(batch.ticks, batch.ts, batch.values,
                                                                           strict=True)]


def encode_all(batches: list[ReleaseBatch], epsilon: float) -> list[str]:
    """The lines of every batch, in order: what :func:`encode_releases` gives batch by batch (one processing step's
    batches: one time, one epsilon), without a call per batch for the common one, a stream's one release."""
    reprs: dict[float, str] = {}
    e_text = reprs[float(epsilon)] = repr(float(epsilon))
    out: list[str] = []
    t_last: float | None = None
    th_last: float | None = None
    t_text = th_text = ""
    for b in batches:
        values, ts = b.values, b.ts
        if len(values) == 1 == len(ts) == len(b.ticks) and type(values[0]) is float and type(b.theta) is float \
                and ts[0] != 0.0:
            t, theta = ts[0], b.theta
            if t != t_last:  # equal floats other than +-0 have one repr (a time is never 0.0)
                t_text = reprs.get(t) or reprs.setdefault(t, repr(t))
                t_last = t
            if theta != th_last:  # a theta is a float above 0
                th_text = reprs.get(theta) or reprs.setdefault(theta, repr(theta))
                th_last = theta
            out.append(f'{{"stream":{b.record.name_json},"tick":{b.ticks[0]},"ts":{t_text},"value":{values[0]!r},'
                       f'"epsilon":{e_text},"theta":{th_text}}}')
        else:
            out += encode_releases(b, epsilon, reprs)
    return out


def _distinct_texts(x: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The ``repr`` of each distinct float of ``x`` (told apart by their bits: -0.0 is not 0.0), and the index of
    each element's text."""
    bits, which = np.unique(x.view(np.int64), return_inverse=True)
    return [repr(v) for v in bits.view(np.float64).tolist()], which.reshape(-1)


def _off_grid_texts(x: np.ndarray, first: int) -> tuple[list[str], np.ndarray]:
    """The ``repr`` of each element of ``x`` the compiled encoder does not write itself (``on_grid``), and each
    element's text index (from ``first`` on; -1: on the grid)."""
    off = np.flatnonzero(~text.on_grid(x))
    which = np.full(x.size, -1, dtype=np.int64)
    which[off] = np.arange(first, first + off.size, dtype=np.int64)
    return [repr(v) for v in x[off].tolist()], which


def encode_release_rows(rows: RowReleases, epsilon: float) -> bytes:
    """Every line of ``rows`` (each followed by a newline), in one buffer written by a compiled pass
    (stream/core/_release_text.py): the text :func:`encode_releases` writes for each stream's batch, character for
    character. Values and thetas on the release grid are written by that pass; each distinct time, and every other
    value and theta, is formatted by ``repr``."""
    n = rows.values.size
    if not n:
        return b""
    ts_texts, ts_of = _distinct_texts(rows.ts)
    texts = [*ts_texts, repr(float(epsilon))]
    epsilon_text = len(ts_texts)
    theta_texts, theta_text = _off_grid_texts(rows.theta, len(texts))
    texts += theta_texts
    value_texts, value_text = _off_grid_texts(rows.values, len(texts))
    texts += value_texts
    lengths = [len(t) for t in texts]
    text_at = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=text_at[1:])
    names = [rec.name_json for rec in rows.records]
    name_bytes = "".join(names).encode()
    name_len = np.fromiter(map(len, names), dtype=np.int64, count=len(names))
    if len(name_bytes) != int(name_len.sum()):  # a name's JSON that is not ASCII: its bytes counted one by one
        name_len = np.fromiter((len(x.encode()) for x in names), dtype=np.int64, count=len(names))
    name_at = np.zeros(len(names) + 1, dtype=np.int64)
    np.cumsum(name_len, out=name_at[1:])
    counts = rows.counts
    stream_of = np.repeat(np.arange(len(names), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    ticks = np.repeat(rows.first_tick - starts, counts) + np.arange(n, dtype=np.int64)
    size = (n * (text.LINE_OVERHEAD + text.INT_DIGITS + 2 * text.GRID_VALUE_CHARS + max(map(len, ts_texts))
                 + lengths[epsilon_text] + max(map(len, theta_texts), default=0))
            + int((name_len * counts).sum()) + sum(map(len, value_texts)))
    out = np.empty(size, dtype=np.uint8)
    head, tick, ts, value, eps, theta = text.pieces()
    written = text.encode_lines(out, stream_of, ticks, rows.values, value_text, ts_of, rows.theta,
                                theta_text, np.frombuffer(name_bytes, dtype=np.uint8), name_at,
                                np.frombuffer("".join(texts).encode(), dtype=np.uint8), text_at, epsilon_text,
                                head, tick, ts, value, eps, theta)
    return out[:written].tobytes()


def releases_in(releases: Releases | list[ReleaseBatch]) -> int:
    """The number of releases (lines) of one step's batches."""
    if isinstance(releases, Releases):
        rows, others = releases.rows, releases.others
        return (int(rows.values.size) if rows is not None else 0) + sum(len(b.ticks) for b in others)
    return sum(len(b.ticks) for b in releases)


def encode_step(releases: Releases | list[ReleaseBatch], epsilon: float) -> list[bytes]:
    """Every line of one processing step's releases, each followed by a newline, in order, as UTF-8 pieces to be
    written one after the other: the release rows' in one compiled pass (:func:`encode_release_rows`), the other
    batches' as :func:`encode_all` writes them."""
    if isinstance(releases, Releases):
        rows, others = releases.rows, releases.others
    else:
        rows, others = None, releases
    pieces = [encode_release_rows(rows, epsilon)] if rows is not None else []
    tail = encode_all(others, epsilon) if others else []
    if tail:
        pieces.append(("\n".join(tail) + "\n").encode())
    return pieces


_compact_json = json.JSONEncoder(separators=(",", ":")).encode


def encode_status(rec: StreamRecord) -> bytes:
    """The retained status payload of a stream.

    A releasing numeric stream also carries ``params`` (:func:`release_params`): everything a consumer needs to read
    its releases (``tops query`` computes error bars from them). No secret and no data: theta, the smoother's start
    and the statistics for error bars are DP outputs of the holdout.
    """
    return _status_json(rec).encode()


def status_line(rec: StreamRecord) -> str | None:
    """The status a file of releases carries before a releasing numeric stream's first release in it (the JSONL
    that ``tops run`` writes to stdout has no retained message to read first); None for other streams."""
    if rec.phase != "releasing" or not _has_params(rec.operator):
        return None
    return _status_json(rec)


def status_lines(recs: list[StreamRecord]) -> list[str | None]:
    """:func:`status_line` of each of ``recs``, character for character; the status of a stream that is a release row
    (the common one) is written without building its status object first (its name's JSON is the record's, its
    theta, identity and generation formatted as the JSON encoder formats them)."""
    out: list[str | None] = []
    templates: dict[tuple[int, int], str] = {}  # the template's part of the params, by configuration and s
    shared: dict[tuple[int, int, int], str] = {}  # the whole params of streams without statistics (a public theta)
    for rec in recs:
        op = rec.operator
        if type(op) is not RowOperator or rec.failed or type(rec.generation) is not int \
                or type(rec.identity) is not str:
            out.append(status_line(rec))
            continue
        pool, r = op.pool, op.row
        ci = int(pool.config[r])
        cfg = pool.configs[ci]
        theta_units = int(pool.theta[r])
        theta = cfg.lower + theta_units * cfg.resolution
        if theta != theta or theta in (math.inf, -math.inf):  # what the JSON encoder spells its own way
            out.append(status_line(rec))
            continue
        who = f',"identity":{encode_basestring_ascii(rec.identity)},"generation":{rec.generation}' \
            if rec.identity else ""
        s = int(pool.layers_kept[r])
        stats = rec.error_stats
        params = shared.get((ci, s, theta_units)) if stats is None else None
        if params is None:
            template = templates.get((ci, s))
            if template is None:
                template = templates[ci, s] = _template_json(cfg, s)
            params = f'{template},{stream_params_json(cfg, theta_units, stats)[1:]}'
            if stats is None:
                shared[ci, s, theta_units] = params
        if cfg.holdout_scope == "fleet":
            params = f'{params[:-1]},"released_from":{rec.released_from}}}'

        out.append(f'{{"stream":{rec.name_json},"phase":"releasing","theta":{float(theta)!r}{who},"params":{{{params}}}')
    return out


def _has_params(op: Any) -> bool:
    """Whether ``op`` releases numbers whose meaning a status states: a ToPS stream past its holdout (central), or a
    ToPL stream with its theta (local)."""
    return ((isinstance(op, ToPS | RowOperator) and op.smoother_layers is not None)
            or (isinstance(op, LocalServer) and op.theta is not None))


def _status_json(rec: StreamRecord) -> str:
    """:meth:`StreamRecord.status` with the ``params`` of a releasing numeric stream, as compact JSON. A central
    stream's params are the template's part, encoded once for all streams that share it (:func:`_template_json`),
    then its own (:func:`stream_params`): the same text as the whole object encoded at once."""
    status = rec.status()
    op = rec.operator
    if status.get("phase") != "releasing" or not _has_params(op):
        return _compact_json(status)
    if isinstance(op, LocalServer):
        status["params"] = local_params(op.config)
        return _compact_json(status)
    own = stream_params_json(op.config, op.theta_units, rec.error_stats)
    if op.config.holdout_scope == "fleet":
        own = f'{own[:-1]},"released_from":{rec.released_from}}}'
    return f'{_compact_json(status)[:-1]},"params":{{{_template_json(op.config, op.smoother_layers)},{own[1:]}}}'


def release_params(rec: StreamRecord) -> dict[str, Any] | None:
    """The public parameters of a releasing numeric stream (central ToPS or local ToPL), None for other streams."""
    op = rec.operator
    if not _has_params(op):
        return None
    if isinstance(op, LocalServer):
        return local_params(op.config)
    p = central_params(op.config, op.theta_units, op.smoother_layers, rec.error_stats)
    if op.config.holdout_scope == "fleet":
        p["released_from"] = rec.released_from
    return p


def central_params(cfg: ToPSConfig, theta_units: int, s: int, error_stats: bytes | None) -> dict[str, Any]:
    """What a ToPS stream's releases mean: mode and mechanism, the per-reading guarantee ``epsilon`` (the hierarchy's;
    the holdout's ``threshold_epsilon`` is at most it), the hierarchy (holdout, r, b, s, smoother and the parameters
    it reads, ``SmootherSpec.reads``), the value grid (:func:`template_params`), then the stream's own: the smoother
    start's noise and the holdout's statistics for error bars (:func:`stream_params`)."""
    return {**template_params(cfg, s), **stream_params(cfg, theta_units, error_stats)}


def stream_params(cfg: ToPSConfig, theta_units: int, error_stats: bytes | None) -> dict[str, Any]:
    """The part of :func:`central_params` a stream's holdout decided: the smoother start's noise (:func:`start_sd`),
    and the holdout's statistics for error bars (``operators.error_stats``: the ``truncation`` statistic, or a
    ``truncation_note`` saying why there is none, and the ``spread``)."""
    thr = cfg.threshold_epsilon or cfg.epsilon
    p: dict[str, Any] = {"start_sd": start_sd(cfg, theta_units)}
    bound_units = math.floor(cfg.span / cfg.resolution + 1e-9)
    trunc = spread = None
    if error_stats is not None:
        trunc, spread = error_stats_status(error_stats, theta_units=theta_units, bound_units=bound_units,
                                           resolution=cfg.resolution, threshold_epsilon=thr,
                                           holdout=cfg.holdout_ticks)
    p["truncation"] = trunc
    if theta_units >= bound_units:
        p["truncation_note"] = "theta is the bound: nothing is truncated"
    elif trunc is None and cfg.theta is not None:
        p["truncation_note"] = "theta is public: nothing measured the readings above it"
    elif trunc is None and error_stats is not None:
        p["truncation_note"] = "not measured: (B - theta) / resolution is beyond the exact sampler's range"
    elif trunc is None:
        p["truncation_note"] = "not measured: the holdout ended before its statistic existed"
    p["spread"] = spread
    return p


def stream_params_json(cfg: ToPSConfig, theta_units: int, error_stats: bytes | None) -> str:
    """:func:`stream_params` as compact JSON, the same text as the JSON encoder writes of it, without building the
    dictionaries: what every stream of one template and theta shares is written once (:func:`_own_frame`), the
    stream's noisy statistics are written into it. A stream starts with its status line, so a fleet's first step
    writes one for every stream."""
    if error_stats is None or sys.byteorder != "little" or len(error_stats) % 8:
        return _compact_json(stream_params(cfg, theta_units, error_stats))
    v = memoryview(error_stats).cast("d").tolist()
    n = int(v[0]) if v else 0
    rest = v[1 + n:] if v else []
    frame = _own_frame(cfg, theta_units, len(rest) if rest else 0, n > 0)
    if frame is None:  # a statistic the fast writer does not spell (not finite): the encoder's own text
        return _compact_json(stream_params(cfg, theta_units, error_stats))
    head, trunc_mid, trunc_tail, between, spread_head, res = frame
    parts = [head]
    if rest:
        parts += [_number_json(rest[0] * res), trunc_mid, ",".join([repr(int(c)) for c in rest[1:]]), trunc_tail]
    parts.append(between)
    if n:
        total, v1, squares, v2 = v[1:5]
        blocks = v[5:1 + n]
        parts += [spread_head, _number_json(total * res), ',"sum_variance":', _number_json(v1 * res**2),
                  ',"squares":', _number_json(squares * res**2), ',"squares_variance":', _number_json(v2 * res**4),
                  ',"widths":[', ",".join([repr(int(w)) for w in blocks[0::3]]),
                  '],"mean_abs":[', ",".join([_number_json(a * res) for a in blocks[1::3]]),
                  '],"abs_variance":[', ",".join([_number_json(x * res**2) for x in blocks[2::3]]), "]}}"]
    else:
        parts.append("null}")
    return "".join(parts)


def _number_json(x: float) -> str:
    """A float as the JSON encoder writes it."""
    return repr(x) if x - x == 0.0 else _compact_json(x)


@functools.lru_cache(maxsize=1 << 14)
def _own_frame(cfg: ToPSConfig, theta_units: int, trunc_len: int, spread: bool) -> tuple[str, ...] | None:
    """The text of :func:`stream_params_json` that one template, theta and shape of statistics share: the start's
    noise, the truncation statistic's public frame (its budget, holdout, step, noise variances and edges), its note,
    and the spread's holdout; None where a shared number is not finite."""
    res = cfg.resolution
    thr = cfg.threshold_epsilon or cfg.epsilon
    bound_units = math.floor(cfg.span / cfg.resolution + 1e-9)
    p = stream_params(cfg, theta_units, None)
    sd = p["start_sd"]
    if not all(math.isfinite(x) for x in (sd, res)):
        return None
    head = '{"start_sd":' + _compact_json(sd) + ',"truncation":'
    trunc_mid = trunc_tail = ""
    if trunc_len:
        _, eps_t, _ = error_stats_budgets(thr)
        sum_variance, edges, count_variance = public_frame(bound_units - theta_units, trunc_len > 1, res, eps_t)
        if not all(math.isfinite(x) for x in (eps_t, sum_variance, count_variance, *edges)):
            return None
        head += (f'{{"epsilon":{_compact_json(eps_t)},"holdout":{_compact_json(cfg.holdout_ticks)},'
                 f'"step":{_compact_json(res)},"excess_sum":')
        trunc_mid = f',"sum_variance":{_compact_json(sum_variance)},"edges":{_compact_json(list(edges))},"counts":['
        trunc_tail = f'],"count_variance":{_compact_json(count_variance)}}}'
    else:
        head += "null"
    # the note as stream_params decides it, from what decides it: theta against the bound, a public theta, whether
    # a statistic exists and whether the stream has statistics at all (it has: error_stats is given)
    note = None
    if theta_units >= bound_units:
        note = "theta is the bound: nothing is truncated"
    elif not trunc_len and cfg.theta is not None:
        note = "theta is public: nothing measured the readings above it"
    elif not trunc_len:
        note = "not measured: (B - theta) / resolution is beyond the exact sampler's range"
    between = (f',"truncation_note":{_compact_json(note)}' if note is not None else "") + ',"spread":'
    spread_head = f'{{"holdout":{_compact_json(cfg.holdout_ticks)},"sum":' if spread else ""
    return head, trunc_mid, trunc_tail, between, spread_head, res


def template_params(cfg: ToPSConfig, s: int) -> dict[str, Any]:
    """The part of :func:`central_params` that the configuration and ``s`` decide."""
    return {
        "mode": "central", "mechanism": "tops", "epsilon": cfg.epsilon,
        "threshold_epsilon": cfg.threshold_epsilon or cfg.epsilon,
        "holdout": cfg.holdout_ticks, "query_range": cfg.query_range, "fanout": cfg.fanout, "smoother_layers": s,
        "smoother": cfg.smoother, **{key: getattr(cfg, key) for key in SMOOTHERS[cfg.smoother].reads},
        "resolution": cfg.resolution,
        "lower": cfg.lower, "bound": cfg.bound,
        "selection": "public" if cfg.theta is not None else cfg.selection,
        **({"holdout_scope": "fleet"} if cfg.holdout_scope == "fleet" else {}),
    }


@functools.lru_cache(maxsize=256)
def _template_json(cfg: ToPSConfig, s: int) -> str:
    """:func:`template_params` as the members of a compact JSON object (no braces), once per template and s."""
    return _compact_json(template_params(cfg, s))[1:-1]


@functools.lru_cache(maxsize=1 << 14)
def start_sd(cfg: ToPSConfig, theta_units: int) -> float:
    """The standard deviation (value units, per tick) of the smoother's start: the calibrated choice's noisy holdout
    mean (operators.selection, step 6: ``DLap(theta / eps_s) / m``); 0 for the public prior ``theta / 2``."""
    if cfg.theta is not None or cfg.selection != "calibrated":
        return 0.0
    noise = _dlap_noise(BUDGET_SPLIT["start"] * choice_epsilon(cfg), theta_units)
    return 0.0 if noise is None else math.sqrt(noise.variance) * cfg.resolution / cfg.holdout_ticks


def local_params(cfg: Any) -> dict[str, Any]:
    """What a ToPL stream's releases mean: each is the sum of a tick's unbiased Hybrid reports of the reading
    truncated at theta (no hierarchy, no smoother)."""
    return {"mode": "local", "mechanism": "topl-hybrid", "epsilon": cfg.epsilon,
            "threshold_epsilon": cfg.threshold_budget, "holdout": cfg.holdout_ticks, "bound": cfg.bound,
            "resolution": cfg.resolution, "query_range": cfg.query_range}


class PublishQueue:
    """Messages ``(topic, payload, retain, n)`` waiting for the broker (``n``: releases carried, 0 for a status).

    Nothing is ever dropped. ``limit`` messages are kept in memory; the daemon's intake waits (:meth:`wait_room`)
    while the queue holds ``limit`` or more. While the broker is unreachable (``connected`` False) and a
    :class:`~stream.state.spill.Spill` is attached (durable state), what does not fit in memory goes to disk, in order,
    and is read back as the queue drains; intake then waits only when the spill's disk budget is reached. The
    memory part may exceed ``limit`` by the releases of one processing step, and by period and status messages made
    while intake waits.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: deque[tuple[str, bytes, bool, int]] = deque()
        self.dropped = 0  # kept for the metric: nothing is dropped any more
        self.nonempty = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()
        self.connected = False  # set by the MQTT link
        self.spill: Any = None  # stream.state.spill.Spill, attached with durable state

    def __len__(self) -> int:
        return len(self.items) + (len(self.spill) if self.spill is not None else 0)

    def put(self, topic: str, payload: bytes, retain: bool = False, n: int = 1) -> None:
        self.put_many(((topic, payload, retain, n),))

    def put_many(self, messages: Iterable[tuple[str, bytes, bool, int]]) -> None:
        items, spill = self.items, self.spill
        if spill is not None and (len(spill) or (not self.connected and len(items) >= self.limit)):
            messages = list(messages)
            if spill.append(messages):  # behind what is already on disk, or memory is full while disconnected
                self._update()
                return
        items.extend(messages)
        self._update()

    def requeue(self, messages: list[tuple[str, bytes, bool, int]]) -> None:
        """Put unconfirmed messages back at the front, in their order (after a lost connection)."""
        self.items.extendleft(reversed(messages))
        self._update()

    def refill(self) -> None:
        """Read spilled messages back into memory while it has room (in order, behind what is there)."""
        spill = self.spill
        if spill is not None and len(spill) and len(self.items) < self.limit // 2 + 1:
            self.items.extend(spill.read(self.limit - len(self.items)))
            self._update()

    def has_room(self) -> bool:
        if len(self) < self.limit:
            return True
        spill = self.spill
        return spill is not None and not self.connected and spill.room()

    def _update(self) -> None:
        if self.items or (self.spill is not None and len(self.spill)):
            self.nonempty.set()
        if self.has_room():
            self.room.set()
        else:
            self.room.clear()

    def set_connected(self, connected: bool) -> None:
        self.connected = connected
        self._update()

    def taken(self) -> None:
        """Called after messages left the front (published): refill from disk, wake a waiting intake."""
        self.refill()
        if not self.room.is_set() and self.has_room():
            self.room.set()

    async def wait_room(self) -> None:
        """Return when the queue can take more (at once, mostly)."""
        while not self.has_room():
            self.room.clear()
            await self.room.wait()

    def take_dropped(self) -> int:
        n, self.dropped = self.dropped, 0
        return n


class StdoutSink:
    """JSONL releases on a text stream (stdout by default), flushed after every processing step.

    The lines come as UTF-8 bytes (the compiled encoder's buffer) and go to the stream's binary buffer as they are,
    after whatever text the stream still holds; a stream without one (``io.StringIO``) is given them decoded."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self.out = out if out is not None else sys.stdout
        self.binary: IO[bytes] | None = getattr(self.out, "buffer", None)
        self.gone = False  # the reader went away (a closed pipe): nothing more is written

    def write_lines(self, pieces: list[bytes]) -> None:
        """Lines already encoded, each followed by a newline, in pieces written in order. When the reader has gone
        away (a closed pipe or stream), :attr:`gone` is set and the lines are dropped: the daemon then stops, or goes on
        with the broker alone."""
        if self.gone:
            return
        try:
            if self.binary is None:
                for piece in pieces:
                    self.out.write(piece.decode())
                return
            self.out.flush()  # text written to the stream before (none from the daemon) goes first
            for piece in pieces:
                self.binary.write(piece)
        except (BrokenPipeError, ValueError) as exc:
            self._reader_gone(exc)

    def flush(self) -> None:
        if self.gone:
            return
        try:
            self.out.flush()
            if self.binary is not None:
                self.binary.flush()
        except (BrokenPipeError, ValueError) as exc:
            self._reader_gone(exc)

    def _reader_gone(self, exc: Exception) -> None:
        """The pipe or the stream is closed: what the buffers still hold is dropped, and the stream's descriptor
        points at /dev/null, so that no later flush (the interpreter's at exit) fails again. Any other ValueError is
        a bug, raised as it is."""
        if not isinstance(exc, BrokenPipeError) and not getattr(self.out, "closed", False):
            raise exc
        self.gone = True
        try:
            fd = self.out.fileno()
        except (OSError, ValueError, AttributeError):
            return
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)



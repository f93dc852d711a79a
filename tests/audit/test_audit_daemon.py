"""Audit of what the daemon releases: ``tops run``'s stdin path, end to end, on neighbouring streams.

**What is run.** The daemon in-process (:class:`stream.daemon.service.Daemon`, ``[input] source = "stdin"``): lines
``name,value`` go through ``Daemon.on_lines`` (what ``tops run`` does with each stdin chunk), the router makes every
stream a row of its columnar store (:class:`operators.columnar.ColumnarRelease`: a public theta makes a stream
release from its first reading) and releases the rows in its compiled pass; the audit reads the JSON lines the daemon
writes to stdout. Thousands of streams, each keyed by the daemon (``derive_stream_key`` of its name), are the
samples; D0 and D1 run in two daemons with two master keys, so their noise is independent.

**Neighbours.** D0: every reading 0. D1: the bound B at the first tick of every top subtree (a tick that moves the
true sums of its ``L = h - s`` path nodes by theta after truncation), 0 elsewhere. The top subtrees of a stream are
independent (each is the root of its own consistent subtree with its own noise), so each is one sample, as in
tests/audit/test_audit_tops.py.

**The statistic, from the released values only.** The released ticks of a leaf add up to its consistent noisy sum
(the Recent smoother), so the sum of the released ticks under any node is that node's consistent estimate. The
indicator of a leaf-to-root path is itself a consistent vector, so Hay's least-squares consistency leaves its inner
product unchanged: the consistent estimates of the ``L`` path nodes add up to the *raw* noisy nodes' sum,
``T = sum_j (S_j + N_j)``, with ``sum_j S_j = L theta`` on D1 and 0 on D0, and the ``N_j`` independent discrete
Laplace at ``eps / L`` for sensitivity theta. ``T`` is a sum of ``L`` releases' sums, so events ``T >= t`` fixed in
advance (t over a range of half-integers) are events on the release. Their likelihood ratio tends to ``e^eps``
in the tail (exactly ``e^eps`` at ``t = theta - 1/2`` when ``L = 1``); a halved noise scale anywhere on the path
(the layer epsilon doubled, the ``eps / L`` split lost, the noise added at half its size) doubles it. Clopper-Pearson
lower bounds with Bonferroni over the events and both directions (``_audit.eps_lower_bound``, confidence
``1 - 1e-3`` per test); flagged when ``eps_lb > eps``.

**A broken store** (:class:`TwiceTheLayerBudget`, the layer epsilon doubled in the trees the rows' noise is drawn
for) is run through the same statistic, outside the daemon (the daemon makes its own store), to show the statistic
catches it.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from operators.columnar import ColumnarRelease, RowOperator
from operators.config import ToPSConfig
from stream.core.config import build_config
from stream.daemon import service as daemon_mod
from tests.audit._audit import audit_key, eps_lower_bound, event_hits
from tests.support import release_lines

EPS = 1.0
BOUND = 10.0
THETA = 3.0  # public, resolution 1: every stream releases from its first reading, as a row
CHUNK = 20_000  # stdin lines a chunk

SAMPLES = 10_000  # top subtrees a side
# (fanout, query_range, smoother layers, readings a stream): one layer (every tick its own top node), and two layers
# under smoothed leaves of four ticks (h = 3, s = 1: 16 ticks a top subtree, a leaf's four released ticks adding up
# to its consistent sum; 256 readings a stream use the 64 leaves of noise the router draws ahead at once)
SHAPES = {"L1": (16, 16, 0, 16), "L2-smoothed": (4, 64, 1, 256)}


def _template(shape: str) -> dict[str, float | int]:
    b, r, s, _ = SHAPES[shape]
    return {"epsilon": EPS, "bound": BOUND, "theta": THETA, "fanout": b, "query_range": r, "smoother_layers": s}


def _geometry(tpl: dict[str, float | int]) -> tuple[int, int, int]:
    """(ticks of a top subtree, ticks of a leaf, layers kept L) of a template."""
    cfg = ToPSConfig(**tpl)  # type: ignore[arg-type]
    b, s = cfg.fanout, int(cfg.smoother_layers or 0)
    return b ** (cfg.height - 1), b**s, cfg.height - s


def _neighbours(span: int, ticks: int) -> tuple[np.ndarray, np.ndarray]:
    """A stream's readings on D0 (zeros) and D1 (B at the first tick of every top subtree)."""
    d0 = np.zeros(ticks)
    d1 = d0.copy()
    d1[::span] = BOUND
    return d0, d1


def _daemon_releases(tmp: Path, label: str, tpl: dict, streams: int, readings: np.ndarray) -> np.ndarray:
    """The daemon's releases of ``streams`` streams that all read ``readings``, shape (streams, ticks), through
    ``Daemon.on_lines`` in chunks of stdin lines, the streams' readings interleaved as many devices send them."""
    tmp.mkdir()
    key_file = tmp / "master.key"  # a fixed master key and run identity: the daemon's stream keys are seeded
    key_file.write_text(audit_key(f"daemon-{label}", 0).hex() + "\n")
    key_file.chmod(0o600)
    cfg = build_config({"metrics": {"port": 0}, "state": {"data_dir": ""}, "input": {"source": "stdin"},
                        "streams": {"key_file": str(key_file), "template": tpl, "max_streams": streams}})
    out = io.StringIO()
    d = daemon_mod.Daemon(cfg, stdin=io.BytesIO(b""), stdout=out, install_signals=False)
    d.startup()
    d.set_identity(audit_key(f"identity-{label}", 0).hex()[:32], durable=False)
    names = [f"m{i}".encode() for i in range(streams)]
    lines = [b"%s,%g" % (n, v) for v in readings for n in names]
    for at in range(0, len(lines), CHUNK):
        d.on_lines(lines[at : at + CHUNK])
    assert all(type(rec.operator) is RowOperator for rec in d.router.streams.values()), "not the rows' path"
    rel = np.full((streams, readings.size), np.nan)
    for r in release_lines(out.getvalue()):
        assert r["epsilon"] == EPS and r["theta"] == THETA
        rel[int(r["stream"][1:]), r["tick"]] = r["value"]
    assert not np.isnan(rel).any(), "a reading without its release"
    return rel


def _path_sums(rel: np.ndarray, tpl: dict[str, float | int]) -> np.ndarray:
    """``T`` of every top subtree: the released sums of the ``L`` nodes on the path of its first tick (the first
    node of each kept layer: ``w b^j`` ticks), one sample per top subtree."""
    span, leaf, layers = _geometry(tpl)
    sub = rel.reshape(-1, span)
    return sum(sub[:, : leaf * int(tpl["fanout"]) ** j].sum(axis=1) for j in range(layers))


def _events(layers: int) -> np.ndarray:
    """``T >= t`` for half-integers t from ``L theta - 2.5`` to ``5 L theta`` (fixed in advance)."""
    return np.arange(layers * THETA - 2, 5 * layers * THETA + 1) - 0.5


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_daemons_releases_on_neighbouring_streams_reach_at_most_their_epsilon(shape: str, tmp_path: Path) -> None:
    """10,000 samples a side. L = 1: 0.8 eps <= eps_lb <= eps (measured 0.88). L = 2, smoothed leaves: eps_lb <= eps
    and at least 0.45 eps (measured 0.51: a sum of two noises tends to its ratio slowly). Made in a copy, each of
    these is flagged: the layer epsilon doubled in ColumnarRelease's noise walk (1.83 at L = 1, 1.29 at L = 2), the
    eps / L split dropped there (1.29 at L = 2), the noise added at half its size in the compiled pass (1.80,
    1.21)."""
    tpl = _template(shape)
    span, _, layers = _geometry(tpl)
    ticks = SHAPES[shape][3]
    streams = SAMPLES // (ticks // span)
    d0, d1 = _neighbours(span, ticks)
    t0 = _path_sums(_daemon_releases(tmp_path / "d0", f"{shape}-0", tpl, streams, d0), tpl)
    t1 = _path_sums(_daemon_releases(tmp_path / "d1", f"{shape}-1", tpl, streams, d1), tpl)
    ev = _events(layers)
    lb = eps_lower_bound(event_hits(t0, ev), event_hits(t1, ev), t0.size, t1.size)
    assert lb <= EPS, lb
    assert lb >= (0.8 if layers == 1 else 0.45) * EPS, lb


# -- the statistic catches a halved noise scale in the rows ----------------------------------------------------------
class TwiceTheLayerBudget(ColumnarRelease):
    """The rows' noise walk at twice the layer budget (half the noise scale): true eps = 2 eps."""

    def _shape(self, ci: int, s: int) -> int:
        at = self._shapes.get((ci, s))
        if at is None:  # the tree the rows' noise is drawn for, registered at twice its epsilon
            cfg = self.configs[ci]
            at = self._shapes[(ci, s)] = self._shape_table.add(
                cfg.fanout, cfg.height - s, cfg.query_range // cfg.fanout ** (cfg.height - 1), 2.0 * cfg.epsilon)
        return at


def _store_releases(cls: type[ColumnarRelease], tpl: dict, streams: int, readings: np.ndarray, label: str
                    ) -> np.ndarray:
    cfg = ToPSConfig(**tpl)
    store = cls(capacity=streams, ahead=64)
    rows = [store.add_new(cfg, audit_key(label, i)) for i in range(streams)]
    ticks = readings.size
    out = store.process(np.tile(np.array(rows), ticks), np.repeat(readings, streams))
    return out.reshape(ticks, streams).T


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_store_at_twice_the_layer_budget_is_flagged(shape: str) -> None:
    tpl = _template(shape)
    span, _, layers = _geometry(tpl)
    ticks = SHAPES[shape][3]
    streams = SAMPLES // (ticks // span)
    d0, d1 = _neighbours(span, ticks)
    t0 = _path_sums(_store_releases(TwiceTheLayerBudget, tpl, streams, d0, f"twice-{shape}-0"), tpl)
    t1 = _path_sums(_store_releases(TwiceTheLayerBudget, tpl, streams, d1, f"twice-{shape}-1"), tpl)
    ev = _events(layers)
    assert eps_lower_bound(event_hits(t0, ev), event_hits(t1, ev), t0.size, t1.size) > EPS

"""``tops replay``: a stream from a file through the very operators the daemon runs, at full speed.

Contract (other tools depend on it)::

    tops replay INPUT --epsilon E --bound B [--holdout M] [--range R] [--fanout F] [--smoother NAME]
                [--key HEX | --key-file FILE --identity ID --stream NAME] [--holdout-scope stream|fleet] --out OUT.npy

OUT is float64 with one entry per input tick: NaN for holdout ticks, the released value otherwise. theta and s are
printed on stderr. With ``--key-file`` and ``--stream`` the stream key is derived exactly as the daemon derives it,
so any output of the daemon can be reproduced offline. With ``--holdout-scope fleet`` INPUT is a fleet's readings in
their order of arrival, and OUT is stream NAME's: NaN for its readings the fleet holdout took.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from operators import SMOOTHERS, ConfigError, ToPS, ToPSConfig, new_key
from operators.config import HOLDOUT_GRIDS, HOLDOUT_SCOPES, SELECTIONS
from stream.commands.failure import refuse
from stream.commands.inputs import InputError, read_stream, read_streams
from stream.core.keys import KeyFileError, check_identity, derive_stream_key, load_master_key, parse_hex_key

__all__ = ["add_arguments", "config_from_args", "key_from_args", "main", "replay"]

# the names of operators.baselines.METHODS (kept here so that `tops replay --help` does not import them)
METHOD_NAMES = ("tops", "tops-paper", "pak", "nm-e", "s-pak", "s-p", "h2", "h16", "h16c", "flat", "counter", "zero")


def add_privacy_arguments(p: argparse.ArgumentParser) -> None:
    """The stream parameters shared by replay and compare-style commands."""
    p.add_argument("--epsilon", type=float, required=True, help="privacy budget per event (eps-DP)")
    p.add_argument("--bound", type=float, required=True, help="public upper bound B of a value")
    p.add_argument("--lower", type=float, default=0.0,
                   help="public lower bound of a value (default 0; smaller values are clamped to it)")
    p.add_argument(
        "--holdout", type=int, default=65536, help="m, ticks held out to choose theta (default 65536)"
    )
    p.add_argument(
        "--range", dest="query_range", type=int, default=1 << 20, help="r, longest range (default 2^20)"
    )
    p.add_argument("--fanout", type=int, default=16, help="b, fan-out of the hierarchy (default 16)")
    p.add_argument("--smoother", choices=tuple(SMOOTHERS), default="recent", help="smoother (default recent)")
    p.add_argument("--smoother-layers", type=int, default=None, help="s; default: chosen with theta (--selection)")
    p.add_argument("--selection", choices=SELECTIONS, default="calibrated",
                   help="how the holdout chooses theta and s: calibrated (default) or paper (Eq. 6, Eq. 7)")
    p.add_argument("--holdout-grid", choices=HOLDOUT_GRIDS, default="exact",
                   help="the holdout's candidate thresholds: exact (default) or compact (O(log B) cells)")
    p.add_argument("--holdout-scope", choices=HOLDOUT_SCOPES, default="stream",
                   help="stream (default: the stream's own first m readings) or fleet (the first m readings of the "
                   "INPUT's streams in their order: a fleet's file, with --key-file, --identity and --stream)")
    p.add_argument("--alpha", type=float, default=0.6, help="EMA weight (default 0.6)")
    p.add_argument("--window", type=int, default=8, help="leaves for the moving/median smoothers (default 8)")
    p.add_argument("--resolution", type=float, default=1.0, help="quantization step of values (default 1)")
    p.add_argument(
        "--threshold-epsilon", type=float, default=None, help="budget of the threshold (default: eps)"
    )
    p.add_argument(
        "--theta", type=float, default=None, help="fixed public theta: no holdout, no budget spent"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "input",
        help='the stream: .npy (1-D), .csv (one value a line, or stream,value), .jsonl ({"value": x}, '
        'optionally "stream") or a shipped data set (dns, retail, star)',
    )
    add_privacy_arguments(p)
    p.add_argument(
        "--mode", choices=("central", "local"), default="central", help="ToPS (central) or ToPL (local)"
    )
    p.add_argument(
        "--method",
        choices=METHOD_NAMES,
        default="tops",
        help="central mode: ToPS or a baseline of the paper (tops compare measures them; h2/h16/pak/nm-e answer "
        "range queries from tree nodes, their per-tick release is the noisy leaf)",
    )
    p.add_argument("--key", help="the stream key, 64 hex digits (default: a fresh random key)")
    p.add_argument("--key-file", help="the daemon's master key file (with --stream)")
    p.add_argument(
        "--stream",
        help="the stream to read from an INPUT of several streams (required then), and whose key to derive "
        "from --key-file",
    )
    p.add_argument("--identity", help="with --key-file: the run or store identity the daemon printed at start and "
                   "puts in every status message (stream keys derive from it)")
    p.add_argument("--generation", type=int, default=1, help="the stream's key generation (default 1)")
    p.add_argument(
        "--out",
        required=True,
        help="output file, written as .npy at exactly this path: NaN for holdout ticks, the release otherwise",
    )


def config_from_args(args: argparse.Namespace) -> ToPSConfig:
    return ToPSConfig(
        epsilon=args.epsilon,
        bound=args.bound,
        holdout=args.holdout,
        query_range=args.query_range,
        fanout=args.fanout,
        smoother=args.smoother,
        smoother_layers=args.smoother_layers,
        alpha=args.alpha,
        window=args.window,
        resolution=args.resolution,
        threshold_epsilon=args.threshold_epsilon,
        theta=args.theta,
        lower=getattr(args, "lower", 0.0),
        selection=getattr(args, "selection", "calibrated"),
        holdout_grid=getattr(args, "holdout_grid", "exact"),
        holdout_scope=getattr(args, "holdout_scope", "stream"),
    )


def key_from_args(args: argparse.Namespace) -> tuple[bytes, str]:
    """The stream key and a word on where it came from (never the key itself)."""
    if args.key and args.key_file:
        msg = "give either --key or --key-file, not both"
        raise ConfigError(msg)
    if args.key_file:
        if not args.stream:
            msg = "--key-file needs --stream NAME"
            raise ConfigError(msg)
        if not args.identity:
            msg = ("--key-file needs --identity ID: the run or store identity that tops run printed at start and puts "
                   "in every status message")
            raise ConfigError(msg)
        try:
            identity = check_identity(args.identity)
        except ValueError as exc:
            raise ConfigError(f"--identity: {exc}") from None
        master = load_master_key(args.key_file)
        key = derive_stream_key(master, args.stream, identity=identity, generation=args.generation)
        return key, f"derived for stream {args.stream!r}"
    if args.key:
        try:
            return parse_hex_key(args.key), "given"
        except ValueError:
            msg = "--key must be 64 hex digits (256 bits)"
            raise ConfigError(msg) from None
    return new_key(), "fresh random (pass --key or --key-file to reproduce)"


def replay_fleet(names: list[str], values: np.ndarray, config: ToPSConfig, fleet_key: bytes, stream: str,
                 key: bytes) -> tuple[np.ndarray, ToPS | None]:
    """Stream ``stream``'s releases in a fleet's readings (``names[i]`` sent ``values[i]``, in their order of arrival):
    the fleet holdout (its key ``fleet_key``) takes the first ``holdout`` readings, whichever streams sent them (NaN
    for each of the stream's), the stream's own ToPS (``key``) releases its others with the fleet's choice, as the
    daemon does; and that ToPS (None when the fleet holdout never filled)."""
    from operators.fleet_holdout import FleetHoldout

    fleet = FleetHoldout(config, fleet_key)
    fleet.take(values)  # it takes the first readings it has room for
    mine = np.fromiter((n == stream for n in names), dtype=bool, count=len(names))
    own = values[mine]
    held = int(mine[: fleet.taken].sum())
    out = np.full(own.size, np.nan)
    if fleet.choice is None:
        return out, None
    op = fleet.member(key, held)
    out[held:] = op.process(own[held:])
    return out, op


def replay(values: np.ndarray, config: ToPSConfig, key: bytes) -> tuple[np.ndarray, ToPS]:
    """Run ``values`` through one ToPS operator; the releases and the operator (for theta, s, counters)."""
    op = ToPS(config, key)
    return op.process(values), op


def main(args: argparse.Namespace) -> int:
    try:
        key, key_note = key_from_args(args)
        t0 = time.perf_counter()
        fleet = getattr(args, "holdout_scope", "stream") == "fleet"
        if fleet and (not args.key_file or args.mode != "central" or args.method != "tops"):
            msg = ("--holdout-scope fleet replays central ToPS streams of a daemon: it needs --key-file, --identity "
                   "and --stream (the fleet's key derives from the master key)")
            raise ConfigError(msg)
        values = read_stream(args.input, args.stream) if not fleet else np.empty(0)
        if getattr(args, "lower", 0.0) and (args.mode == "local" or args.method != "tops"):
            msg = "--lower is supported by central ToPS only (the baselines and local mode take values in [0, bound])"
            raise ConfigError(msg)
        thr = args.threshold_epsilon
        if thr is not None and thr > args.epsilon:
            print(f"tops replay: warning: threshold_epsilon {thr:g} > epsilon {args.epsilon:g}: each reading is "
                  f"protected at max(epsilon, threshold_epsilon) = {thr:g}", file=sys.stderr)
        if args.mode == "local":
            from operators.topl import ToPL, ToPLConfig

            cfg_l = ToPLConfig(
                epsilon=args.epsilon,
                bound=args.bound,
                threshold_epsilon=args.threshold_epsilon,
                holdout=args.holdout,
                query_range=args.query_range,
                resolution=args.resolution,
                theta=args.theta,
            )
            op = ToPL(cfg_l, key)
            releases = op.process(values)
            theta, s = op.theta, None
        elif args.method != "tops":
            from operators.baselines import make

            op = make(args.method, config_from_args(args), key)
            releases = op.process(values)
            theta, s = getattr(op, "theta", None), None
        elif fleet:
            from operators.fleet_holdout import FLEET_KEY_NAME

            names, readings = read_streams(args.input)
            if args.stream not in set(names):
                msg = f"{Path(args.input).name}: no stream {args.stream!r} in it"
                raise InputError(msg)
            fleet_key = derive_stream_key(load_master_key(args.key_file), FLEET_KEY_NAME,
                                          identity=check_identity(args.identity))
            releases, op = replay_fleet(names, readings, config_from_args(args), fleet_key, args.stream, key)
            values = releases
            theta, s = (None, None) if op is None else (op.theta, op.smoother_layers)
        else:
            cfg = config_from_args(args)
            releases, op = replay(values, cfg, key)
            theta, s = op.theta, op.smoother_layers
        with Path(args.out).open("wb") as f:  # exactly the path given (np.save(path) would append .npy)
            np.save(f, releases)
        elapsed = time.perf_counter() - t0
    except (ConfigError, InputError, KeyFileError) as exc:
        return refuse("replay", exc)
    except OSError as exc:
        return refuse("replay", f"{exc.strerror or exc}: {exc.filename or ''}")
    n = len(values)
    released = int(np.count_nonzero(~np.isnan(releases)))
    theta_text = "none (stream shorter than the holdout)" if theta is None else f"{theta:g}"
    print(f"theta = {theta_text}", file=sys.stderr)
    print(f"s = {s if s is not None else '-'}", file=sys.stderr)
    domain = getattr(op, "domain", None)
    if args.mode == "local" and domain is not None and domain < op.config.bound:
        print(f"holdout zoomed in: Square Wave over [0, {domain:g}] after the coarse rounds", file=sys.stderr)
    clamped = getattr(op, "clamped", 0)
    print(
        f"ticks = {n}, released = {released}, clamped to bound = {clamped}, key = {key_note}, "
        f"{rate_text(n, elapsed)} (file I/O included)",
        file=sys.stderr,
    )
    return 0


def rate_text(ticks: int, seconds: float) -> str:
    """Ticks per second in a unit that shows it (a short input is not "0.0 M ticks/s").

    >>> rate_text(20, 0.004), rate_text(45_000, 1.0), rate_text(2_000_000, 0.5), rate_text(0, 0.0)
    ('5000 ticks/s', '45.0 k ticks/s', '4.0 M ticks/s', '0 ticks/s')
    """
    rate = ticks / seconds if seconds > 0 else 0.0
    if rate >= 1e6:
        return f"{rate / 1e6:.1f} M ticks/s"
    if rate >= 1e4:
        return f"{rate / 1e3:.1f} k ticks/s"
    return f"{rate:.0f} ticks/s"

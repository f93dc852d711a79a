"""The ``tops`` command: one entry point, one subcommand per module (``add_arguments`` + ``main``).

Exit codes, for every command: 0 when it did its work; 2 when it refused, with one line on stderr, whatever the cause
(an argument, a parameter out of range, a configuration or an input file: :mod:`stream.commands.failure`); 130 on
Ctrl-C. A traceback is a bug.
"""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["main"]

# subcommand -> (module, one-line help). Each module defines add_arguments(parser) and main(args) -> int.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("stream.daemon.service", "run the daemon: readings in (MQTT or stdin), one private release per tick out"),
    "replay": ("stream.commands.replay", "run a stream from a file through the same operators, at full speed"),
    "replay-categorical": (
        "stream.commands.replay_categorical",
        "a categorical stream from a file through the daemon's operator: the same per-period releases",
    ),
    "evaluate": ("stream.commands.evaluate", "range-query MSE/MAE of releases against the truth (Eq. 9)"),
    "query": (
        "stream.commands.query",
        "range sums and totals per hour/day of releases (a file or live MQTT), with error bars",
    ),
    "simulate": ("stream.commands.simulate", "a synthetic smart-meter feed for demos and tests"),
    "state": (
        "stream.commands.state_cmd",
        "streams, phase, ticks released, theta, eps from the state store (read-only); `state retire NAME...` "
        "retires streams for good (writes; the daemon stopped)",
    ),
    "compare": (
        "stream.commands.compare",
        "several methods over a grid of eps on real data: CSV and plots (Figures 3, 5, 7)",
    ),
    "compare-categorical": (
        "stream.commands.compare_categorical",
        "frequency oracles and central histograms on the commuting stand-in (Finnegan's experiments): CSV",
    ),
    "compare-ranges": (
        "stream.commands.compare_ranges",
        "range counting and count-of-counts as Friis and Kuo et al. measure them (the thesis's flawed ones labelled)",
    ),
    "cluster": (
        "stream.commands.cluster_cmd",
        "read-only: the NATS cluster's partitions, their owners and lag, the live workers",
    ),
    "device": (
        "stream.device.client",
        "the device side of local-DP mode: perturb readings locally and publish reports",
    ),
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tops")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


class _Parser(argparse.ArgumentParser):
    """argparse that prints one line (no usage block) and exits 2 on a bad argument."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only the module of ``command`` is imported (so ``tops replay`` never loads the MQTT stack)."""
    parser = _Parser(prog="tops", description="Differentially private continual release of data streams.")
    parser.add_argument("--version", action="version", version=f"tops {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name != command:
            continue
        mod = importlib.import_module(module)
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main)
    return parser


_TOP_OPTIONS = ("-h", "--help", "--version")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    before = argv if command is None else argv[: argv.index(command)]
    unknown = [a for a in before if a not in _TOP_OPTIONS]
    if unknown:  # options of no command: argparse would first say that a command or its arguments are required
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args = parser.parse_args(argv)
    try:
        return int(args._main(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())

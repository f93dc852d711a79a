"""Errors of the streaming runtime: few, flat, each carrying what went wrong as attributes."""

from __future__ import annotations

__all__ = ["ConfigFileError", "PayloadError", "StartupError", "StreamCapError", "TopsRuntimeError"]


class TopsRuntimeError(Exception):
    """Base of the runtime's own errors."""


class ConfigFileError(TopsRuntimeError):
    """The daemon configuration is invalid; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class PayloadError(TopsRuntimeError):
    """A payload or reading cannot be accepted; ``reason`` is a short label, never the raw value."""

    def __init__(self, reason: str, result: str = "invalid") -> None:
        self.reason = reason
        self.result = result
        super().__init__(reason)


class StreamCapError(TopsRuntimeError):
    """A new stream would exceed the configured ``max_streams``."""


class StartupError(TopsRuntimeError):
    """The daemon cannot start (a port in use, a folder it cannot write): one line, exit code 2."""

"""``tops query``, kept at its old import path: the command and the Python API live in :mod:`stream.query`."""

from stream.query.command import add_arguments, main
from stream.query.releases import Answer, QueryError, Releases

__all__ = ["Answer", "QueryError", "Releases", "add_arguments", "main"]

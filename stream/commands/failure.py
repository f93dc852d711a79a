"""How a command refuses: one line on stderr, ``tops COMMAND: error: PROBLEM``, and exit code 2.

The convention of every ``tops`` command: exit 0 when it did its work; exit 2 when it refused, whether the command
line (argparse's own code for a bad argument), a parameter out of range, a configuration file or an input file is the
cause (the line says which, and never quotes a reading's value). A traceback is a bug.
"""

from __future__ import annotations

import sys

__all__ = ["EXIT_REFUSED", "refuse"]

EXIT_REFUSED = 2


def refuse(command: str, problem: object) -> int:
    """Print the one line of a refusal (a multi-line message joined) and return the exit code.

    >>> import contextlib, io
    >>> err = io.StringIO()
    >>> with contextlib.redirect_stderr(err):
    ...     refuse("query", "line one\\nline two")
    2
    >>> err.getvalue()
    'tops query: error: line one line two\\n'
    """
    text = " ".join(str(problem).splitlines())
    print(f"tops {command}: error: {text}", file=sys.stderr)
    return EXIT_REFUSED

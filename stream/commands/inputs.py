"""Reading a whole stream from a file (.npy, .csv or JSONL) for ``tops replay`` and ``tops evaluate``.

Every value must be a finite number (values outside [lower, bound] are clamped by the operator). A bad file is
refused with a message that names the first bad line and what is wrong with it, never the value itself (a reading
is private data).

>>> import tempfile, os
>>> d = tempfile.mkdtemp()
>>> p = os.path.join(d, "x.csv")
>>> _ = open(p, "w").write("1\\n2.5\\n\\n3\\n")
>>> read_stream(p).tolist()
[1.0, 2.5, 3.0]
>>> _ = open(p, "w").write("1\\nnan\\n")
>>> read_stream(p)
Traceback (most recent call last):
...
stream.commands.inputs.InputError: x.csv line 2: not a finite number (NaN or infinite)
>>> read_stream("dns")[:5].tolist()         # a shipped data set by name
[2.0, 2.0, 2.0, 2.0, 2.0]
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

__all__ = ["InputError", "read_stream"]


class InputError(Exception):
    """An input file cannot be used; the message names the file, the line and the problem (never the value)."""


def _check_values(values: np.ndarray, name: str, line_of) -> np.ndarray:
    bad = ~np.isfinite(values)  # values outside [lower, bound] are clamped by the operator, as in the daemon
    if bad.any():
        i = int(np.argmax(bad))
        msg = f"{name} {line_of(i)}: not a finite number (NaN or infinite)"
        raise InputError(msg)
    return values


def _read_npy(path: Path) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        msg = f"{path.name}: not a readable .npy file ({type(exc).__name__})"
        raise InputError(msg) from None
    if arr.ndim != 1:
        msg = f"{path.name}: a .npy input must be 1-D (got shape {arr.shape})"
        raise InputError(msg)
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        msg = f"{path.name}: a .npy input must hold numbers (got dtype {arr.dtype})"
        raise InputError(msg)
    values = arr.astype(np.float64)
    return _check_values(values, path.name, lambda i: f"element {i}")


def _lines(path: Path) -> tuple[list[str], list[int]]:
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        msg = f"{path.name}: not a text file"
        raise InputError(msg) from None
    raw = text.splitlines()
    keep = [(i + 1, s.strip()) for i, s in enumerate(raw) if s.strip()]
    return [s for _, s in keep], [n for n, _ in keep]


def _read_csv(path: Path, stream: str | None) -> np.ndarray:
    lines, numbers = _lines(path)
    # a header line is allowed if it is not a number
    if lines and not _is_number(lines[0].split(",")[-1]):
        lines, numbers = lines[1:], numbers[1:]
    rows = [[f.strip() for f in s.split(",")] for s in lines]
    # `stream,value[,ts]` (the daemon's stdin CSV, `tops simulate --format csv`): a non-numeric first field names
    # the stream; otherwise the value is the last field (one value a line, or `index,value`)
    names = [r[0] if len(r) > 1 and not _is_number(r[0]) else None for r in rows]
    fields = [r[1] if name is not None else r[-1] for r, name in zip(rows, names, strict=True)]
    keep = _select(names, stream, path.name)
    if keep is not None:
        fields = [f for f, k in zip(fields, keep, strict=True) if k]
        numbers = [n for n, k in zip(numbers, keep, strict=True) if k]
    try:
        values = np.array(fields, dtype=np.float64)
    except ValueError:
        for s, n in zip(fields, numbers, strict=True):
            if not _is_number(s):
                msg = f"{path.name} line {n}: not a number"
                raise InputError(msg) from None
        raise
    return _check_values(values, path.name, lambda i: f"line {numbers[i]}")


def _select(names: list[str | None], stream: str | None, file: str) -> list[bool] | None:
    """Which lines belong to ``stream`` (``None``: all of them). A file of several named streams needs a choice; a
    file without names is one stream, whatever ``stream`` says (it then only names the key)."""
    present = sorted({n for n in names if n is not None})
    if not present:
        return None
    if stream is None:
        if len(present) == 1 and None not in names:
            return None
        shown = ", ".join(present[:5]) + (", ..." if len(present) > 5 else "")
        msg = f"{file} holds {len(present)} streams ({shown}): choose one with --stream NAME"
        raise InputError(msg)
    if stream not in present:
        msg = f"{file}: no stream {stream!r} in it ({len(present)} streams)"
        raise InputError(msg)
    return [n == stream for n in names]


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _read_jsonl(path: Path, stream: str | None) -> np.ndarray:
    lines, numbers = _lines(path)
    values = np.empty(len(lines))
    names: list[str | None] = []
    for k, (s, n) in enumerate(zip(lines, numbers, strict=True)):
        try:
            obj = json.loads(s)
        except json.JSONDecodeError:
            msg = f"{path.name} line {n}: not valid JSON"
            raise InputError(msg) from None
        v = obj.get("value") if isinstance(obj, dict) else obj
        name = obj.get("stream") if isinstance(obj, dict) else None
        names.append(None if name is None else str(name))
        if isinstance(v, bool) or not isinstance(v, int | float):
            msg = f'{path.name} line {n}: "value" must be a number'
            raise InputError(msg)
        if not math.isfinite(v):
            msg = f"{path.name} line {n}: not a finite number (NaN or infinite)"
            raise InputError(msg)
        values[k] = v
    keep = _select(names, stream, path.name)
    return values if keep is None else values[np.asarray(keep, dtype=bool)]


def read_stream(path: str | Path, stream: str | None = None) -> np.ndarray:
    """The values of a stream file as float64, one per tick; raises :class:`InputError` on bad input.

    A CSV or JSONL file may hold several named streams (``stream,value`` lines, ``{"stream": ...}`` objects, as
    ``tops simulate --streams N`` writes): then ``stream`` selects one, and without it the file is refused.

    A name of a shipped data set (``dns``, ``retail``, ``star``: :mod:`stream.commands.datasets`) that is not an
    existing file reads that data set.
    """
    p = Path(path)
    if not p.is_file():
        from stream.commands.datasets import DATASETS, load

        if str(path) in DATASETS:
            return load(str(path)).astype(np.float64)
        msg = f"{p}: no such file (nor a shipped data set: {', '.join(DATASETS)})"
        raise InputError(msg)
    suffix = p.suffix.lower()
    if suffix == ".npy":
        return _read_npy(p)
    if suffix in (".jsonl", ".ndjson", ".json"):
        return _read_jsonl(p, stream)
    if suffix in (".csv", ".txt", ""):
        return _read_csv(p, stream)
    msg = f"{p.name}: unknown input format {suffix!r} (use .npy, .csv or .jsonl)"
    raise InputError(msg)

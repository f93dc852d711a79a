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
import re
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

__all__ = ["MAX_INT_DIGITS", "MAX_JSON_DEPTH", "MAX_LINE_BYTES", "InputError", "JSONInputError", "file_lines",
           "load_json", "load_npy", "read_stream", "read_streams"]

# The bounds of what a command parses from a file, checked before the parser sees it. A daemon's release or status
# is nested 3 deep and its numbers have at most 19 digits; a line of the daemon's output is far below 16 MiB (a
# batch of 5,000 releases is about 600 kB).
MAX_LINE_BYTES = 16 << 20
MAX_JSON_DEPTH = 64
MAX_INT_DIGITS = 300  # 10^300 is a float; longer integers are not numbers any reading or release holds
_FLOAT_MAX = sys.float_info.max


class InputError(Exception):
    """An input file cannot be used; the message names the file, the line and the problem (never the value)."""


class JSONInputError(ValueError):
    """A text is not JSON within the bounds (``MAX_*``); the message says which bound, never the text."""


def _bounded_int(text: str) -> int:
    if len(text) - text.startswith("-") > MAX_INT_DIGITS:
        msg = f"a number of more than {MAX_INT_DIGITS} digits"
        raise JSONInputError(msg)
    return int(text)


_DECODER = json.JSONDecoder(parse_int=_bounded_int)
# a JSON string, or an unterminated one up to the end (a trailing lone backslash included): every match ends at its
# closing quote or at the end, so the scan is linear whatever the text
_STRING = re.compile(r'"(?:[^"\\]|\\[\s\S])*+(?:"|\\?\Z)')
_NEST = np.zeros(256, dtype=np.int8)  # +1 opens, -1 closes, 2 a quote
_NEST[[ord("["), ord("{")]] = 1
_NEST[[ord("]"), ord("}")]] = -1
_NEST[ord('"')] = 2


def nested_too_deep(text: str) -> bool:
    """Whether ``[`` and ``{`` outside strings nest more than ``MAX_JSON_DEPTH`` deep, found without recursion: the
    running sum of +1 per opening and -1 per closing bracket outside strings (numpy, over the brackets and quotes
    only). Without a backslash, a bracket is inside a string when an odd number of quotes precede it; with one, the
    strings are removed first (one linear regex pass). A text with no more opening brackets than the bound is not
    looked at further."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:  # (load_json counts first: no call for a flat line)
        return False
    if "\\" in text:
        text = _STRING.sub("", text)
    kind = np.take(_NEST, np.frombuffer(text.encode("utf-8", errors="surrogatepass"), dtype=np.uint8))
    kind = kind[np.flatnonzero(kind)]
    quote = kind == 2
    outside = (np.cumsum(quote, dtype=np.int32) & 1) == 0
    steps = np.where(outside & ~quote, kind, 0)
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0)) > MAX_JSON_DEPTH


def load_json(data: bytes | str) -> Any:
    """One JSON document within the bounds: at most ``MAX_LINE_BYTES``, nested at most ``MAX_JSON_DEPTH`` deep,
    integers of at most ``MAX_INT_DIGITS`` digits (Python's int parser refuses 4,300 and more with a ValueError and
    is quadratic below that). NaN and Infinity parse as floats (callers refuse them where a number must be finite).
    Anything else raises :class:`JSONInputError`.

    >>> load_json(b'{"tick": 3, "value": [1.5]}')
    {'tick': 3, 'value': [1.5]}
    >>> load_json("[" * 100_000)
    Traceback (most recent call last):
    ...
    stream.commands.inputs.JSONInputError: nested more than 64 deep
    """
    if len(data) > MAX_LINE_BYTES:
        msg = f"longer than {MAX_LINE_BYTES >> 20} MiB"
        raise JSONInputError(msg)
    try:
        text = data if isinstance(data, str) else data.decode("utf-8")
    except UnicodeDecodeError:
        msg = "not UTF-8 text"
        raise JSONInputError(msg) from None
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and nested_too_deep(text):
        msg = f"nested more than {MAX_JSON_DEPTH} deep"
        raise JSONInputError(msg)
    try:
        return _DECODER.decode(text)
    except JSONInputError:
        raise
    except ValueError:  # json.JSONDecodeError, and int() on the text of an integer
        msg = "not valid JSON"
        raise JSONInputError(msg) from None


def file_lines(f: IO[bytes]) -> Iterator[bytes | None]:
    """The lines of a binary file, each at most ``MAX_LINE_BYTES`` held at a time: a longer line is read through
    and skipped, yielded as ``None`` (a file of one 2 GB line is not loaded whole)."""
    while True:
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) <= MAX_LINE_BYTES or line.endswith(b"\n"):
            yield line
            continue
        while line and not line.endswith(b"\n"):
            line = f.readline(1 << 20)
        yield None


def _check_values(values: np.ndarray, name: str, line_of) -> np.ndarray:
    bad = ~np.isfinite(values)  # values outside [lower, bound] are clamped by the operator, as in the daemon
    if bad.any():
        i = int(np.argmax(bad))
        msg = f"{name} {line_of(i)}: not a finite number (NaN or infinite)"
        raise InputError(msg)
    return values


def load_npy(path: str | Path) -> np.ndarray:
    """A .npy file, memory-mapped (a header that claims 8 TB allocates nothing: the file is shorter, refused), read
    without pickles; :class:`InputError` with one line for anything numpy cannot read (an empty file, a cut or
    malformed header)."""
    p = Path(path)
    try:
        return np.load(p, allow_pickle=False, mmap_mode="r")
    except (ValueError, OSError, EOFError, SyntaxError, tokenize.TokenError) as exc:
        msg = f"{p.name}: not a readable .npy file ({type(exc).__name__})"
        raise InputError(msg) from None


def _read_npy(path: Path) -> np.ndarray:
    arr = load_npy(path)
    if arr.ndim != 1:
        msg = f"{path.name}: a .npy input must be 1-D (got shape {arr.shape})"
        raise InputError(msg)
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        msg = f"{path.name}: a .npy input must hold numbers (got dtype {arr.dtype})"
        raise InputError(msg)
    values = np.array(arr, dtype=np.float64)  # a copy: the file is not held open
    return _check_values(values, path.name, lambda i: f"element {i}")


def _lines(path: Path) -> tuple[list[str], list[int]]:
    """The non-blank lines of a text file, stripped, and their numbers (the file is read whole, as the values it
    holds are; each JSON line is bounded by :func:`load_json`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        msg = f"{path.name}: not a text file (not UTF-8)"
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


def _json_reading(text: str, where: str) -> tuple[str | None, float]:
    """A JSON line's stream name (None without one) and its finite value (an object's ``value``, or the line itself);
    ``where`` names the line in the message of the :class:`InputError` it raises otherwise."""
    try:
        obj = load_json(text)
    except JSONInputError as exc:
        msg = f"{where}: {exc}"
        raise InputError(msg) from None
    v = obj.get("value") if isinstance(obj, dict) else obj
    name = obj.get("stream") if isinstance(obj, dict) else None
    if isinstance(v, bool) or not isinstance(v, int | float):
        msg = f'{where}: "value" must be a number'
        raise InputError(msg)
    if not -_FLOAT_MAX <= v <= _FLOAT_MAX:  # NaN fails too; an int is compared before any conversion
        msg = f"{where}: not a finite number (NaN or infinite)"
        raise InputError(msg)
    return None if name is None else str(name), v


def _read_jsonl(path: Path, stream: str | None) -> np.ndarray:
    lines, numbers = _lines(path)
    values = np.empty(len(lines))
    names: list[str | None] = []
    for k, (s, n) in enumerate(zip(lines, numbers, strict=True)):
        name, v = _json_reading(s, f"{path.name} line {n}")
        names.append(name)
        values[k] = v
    keep = _select(names, stream, path.name)
    return values if keep is None else values[np.asarray(keep, dtype=bool)]


def read_streams(path: str | Path) -> tuple[list[str], np.ndarray]:
    """Every reading of a CSV or JSONL file of named streams, in the file's order: each line's stream name and the
    values as float64 (what a fleet's replay needs: the order of arrival across streams); raises
    :class:`InputError` on bad input, or on a line that names no stream."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".jsonl", ".ndjson", ".json", ".csv", ".txt", ""):
        msg = f"{p.name}: a file of several streams is .csv (stream,value lines) or .jsonl"
        raise InputError(msg)
    try:
        lines, numbers = _lines(p)
    except OSError as exc:
        msg = f"{p.name}: cannot read ({exc.strerror or type(exc).__name__})"
        raise InputError(msg) from None
    if suffix in (".csv", ".txt", ""):
        return _csv_streams(lines, numbers, p.name)
    names: list[str] = []
    values = np.empty(len(lines))
    for k, (s, n) in enumerate(zip(lines, numbers, strict=True)):
        name, values[k] = _json_reading(s, f"{p.name} line {n}")
        if not name:
            msg = f"{p.name} line {n}: names no stream (a fleet's file has stream,value lines)"
            raise InputError(msg)
        names.append(name)
    return names, values


def _csv_streams(lines: list[str], numbers: list[int], file: str) -> tuple[list[str], np.ndarray]:
    """:func:`read_streams` of ``stream,value[,ts]`` lines: split and converted in bulk (a line at a time only to
    name the first bad one)."""
    parts = [s.split(",", 2) for s in lines]
    names = [x[0].strip() if len(x) > 1 else "" for x in parts]
    try:
        values = np.array([x[1] if len(x) > 1 else "nan" for x in parts], dtype=np.float64)
    except ValueError:
        values = np.array([float(x[1]) if len(x) > 1 and _is_number(x[1]) else math.nan for x in parts])
    bad = np.flatnonzero(~np.isfinite(values) | np.array([not n or _is_number(n) for n in names], dtype=bool))
    if bad.size:
        i = int(bad[0])
        what = "names no stream (a fleet's file has stream,value lines)" if not names[i] or _is_number(names[i]) \
            else "not a finite number"
        msg = f"{file} line {numbers[i]}: {what}"
        raise InputError(msg)
    return names, values


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
    try:
        if suffix == ".npy":
            return _read_npy(p)
        if suffix in (".jsonl", ".ndjson", ".json"):
            return _read_jsonl(p, stream)
        if suffix in (".csv", ".txt", ""):
            return _read_csv(p, stream)
    except OSError as exc:
        msg = f"{p.name}: cannot read ({exc.strerror or type(exc).__name__})"
        raise InputError(msg) from None
    msg = f"{p.name}: unknown input format {suffix!r} (use .npy, .csv or .jsonl)"
    raise InputError(msg)

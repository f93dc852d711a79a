"""Decoding of readings: a number, a JSON object, a JSON array (a batch), or a stdin line (number, CSV, JSON).

Decoding never echoes the raw payload: errors carry a short reason only. A reading's value must be a finite
number (booleans and strings are not numbers; values outside ``[lower, bound]`` are clamped by the operator, never
dropped, since a missing tick would reveal them); ``ts`` a number of seconds since the Unix epoch within
[``TS_MIN``, ``TS_MAX``] (1970 to 2100); ``seq`` an integer in [0, 2^63). Every field is range-checked here: nothing
a payload holds (an integer of 400 digits, deep nesting, a NaN token) raises anything but :class:`PayloadError`.

>>> decode_payload(b"12.5")
([(None, 12.5, None, None)], 0)
>>> decode_payload(b'{"value": 3, "ts": 1700000000.5, "seq": 7}')
([(None, 3.0, 1700000000.5, 7)], 0)
>>> decode_payload(b'[1, 2, -3, {"value": 4}, "x"]')
([(None, 1.0, None, None), (None, 2.0, None, None), (None, -3.0, None, None), (None, 4.0, None, None)], 1)
>>> decode_payload(b"nan")
Traceback (most recent call last):
...
stream.core.errors.PayloadError: value is not a finite number
>>> decode_line(b"meter-7,42")
([('meter-7', 42.0, None, None)], 0)
"""

from __future__ import annotations

import json
import math
from typing import Any

from stream.core.errors import PayloadError

__all__ = ["SEQ_LIMIT", "TS_MAX", "TS_MIN", "Reading", "check_stream_name", "decode_line", "decode_payload",
           "decode_payload_columns", "decode_reports"]

# (stream or None, value, ts or None, seq or None); a plain tuple keeps the per-message work small.
Reading = tuple[str | None, float, float | None, int | None]

_BAD_VALUE = "value is not a finite number"
_BAD_TS = "'ts' is not a number of seconds between 1970 and 2100"
_BAD_SEQ = "'seq' is not an integer in [0, 2^63)"
TS_MIN = 0.0
TS_MAX = 4_102_444_800.0  # 2100-01-01T00:00:00Z
SEQ_LIMIT = 1 << 63  # seq is a non-negative 63-bit integer (it is stored as SQLite INTEGER and compared as one)
_MAX_NAME = 128


def check_stream_name(name: Any) -> str:
    """A stream name usable in a topic level: 1-128 printable characters without ``/ + #``."""
    if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME or not name.isprintable():
        msg = "stream name must be 1-128 printable characters"
        raise PayloadError(msg)
    if "/" in name or "+" in name or "#" in name:  # three scans in C (a set made per reading cost more)
        msg = "stream name must not contain '/', '+' or '#'"
        raise PayloadError(msg)
    return name


def _value(x: Any) -> float:
    if type(x) is float:
        if math.isfinite(x):  # negative readings are clamped to [lower, bound] by the operator, never dropped
            return x
    elif type(x) is int and -(2**1023) < x < 2**1023:
        return float(x)
    raise PayloadError(_BAD_VALUE)


def _ts(x: Any, reason: str = _BAD_TS) -> float:
    """A timestamp in [TS_MIN, TS_MAX] (an int is compared before any conversion: 10^400 never meets ``float``)."""
    if (type(x) is float or type(x) is int) and TS_MIN <= x <= TS_MAX:  # NaN fails the comparison
        return float(x)
    raise PayloadError(reason)


def _seq(x: Any, reason: str = _BAD_SEQ) -> int:
    if type(x) is int and 0 <= x < SEQ_LIMIT:
        return x
    raise PayloadError(reason)


def _object(obj: dict[str, Any], with_stream: bool) -> Reading:
    if "value" not in obj:
        msg = "object has no 'value'"
        raise PayloadError(msg)
    value = _value(obj["value"])
    ts = obj.get("ts")
    if ts is not None:
        ts = _ts(ts)
    seq = obj.get("seq")
    if seq is not None:
        seq = _seq(seq)
    stream = None
    if with_stream and "stream" in obj:
        stream = check_stream_name(obj["stream"])
    return (stream, value, ts, seq)


def _element(x: Any, with_stream: bool) -> Reading:
    if type(x) is dict:
        return _object(x, with_stream)
    return (None, _value(x), None, None)


_NUMBER_TYPES = frozenset((float, int))
_INT_LIMIT = 2.0**1023


def _plain_values(doc: list[Any]) -> list[float] | None:
    """The values of a batch of plain numbers when every element is a valid value (checked in C, without a Python
    call per element), else None (then each element is checked on its own). Same result as :func:`_value`."""
    kinds = set(map(type, doc))
    if not kinds <= _NUMBER_TYPES:  # objects, strings, booleans, null: element by element
        return None
    try:
        values = list(map(float, doc))  # a float stays the same object
    except OverflowError:
        return None
    total = sum(values)
    if total - total != 0.0:  # a NaN or an infinity (or an overflowing sum)
        return None
    if int in kinds and max(map(abs, values)) >= _INT_LIMIT:  # _value takes ints < 2**1023 only: decide one by one
        return None
    return values


def _load(data: bytes | str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError, MemoryError):
        msg = "payload is not a number or valid JSON"
        raise PayloadError(msg) from None


def _decode_json(data: bytes | str, with_stream: bool) -> tuple[list[Reading], int]:
    return _decode_doc(_load(data), with_stream)


def _decode_doc(doc: Any, with_stream: bool) -> tuple[list[Reading], int]:
    if type(doc) is list:
        if not doc:
            msg = "empty batch"
            raise PayloadError(msg)
        values = _plain_values(doc)
        if values is not None:
            return [(None, v, None, None) for v in values], 0
        out: list[Reading] = []
        bad = 0
        for x in doc:
            try:
                out.append(_element(x, with_stream))
            except PayloadError:
                bad += 1
        return out, bad
    if type(doc) is dict:
        return [_object(doc, with_stream)], 0
    if type(doc) in (int, float):
        return [(None, _value(doc), None, None)], 0
    msg = "JSON payload is not a number, an object or an array"
    raise PayloadError(msg)


def _number_or_text(data: bytes) -> float | str:
    """A payload that is a plain number (fast path: ``float()`` accepts bytes), else its UTF-8 text."""
    try:
        v = float(data)
    except (ValueError, TypeError):
        pass
    else:
        if math.isfinite(v):
            return v
        raise PayloadError(_BAD_VALUE)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        msg = "payload is not UTF-8"
        raise PayloadError(msg) from None


def decode_payload(data: bytes) -> tuple[list[Reading], int]:
    """Readings of one MQTT payload and the number of invalid batch elements (a ``stream`` key is ignored).

    Raises :class:`PayloadError` when nothing in the payload can be read.
    """
    x = _number_or_text(data)
    if isinstance(x, float):
        return [(None, x, None, None)], 0
    return _decode_json(x, with_stream=False)


def decode_payload_columns(data: bytes) -> tuple[list[float], list[float | None] | None, list[int | None] | None,
                                                 int]:
    """:func:`decode_payload` as columns ``(values, ts, seq, bad)``; ``ts`` and ``seq`` are None when no reading
    carries one (the common case: a number or an array of numbers, decoded without a Python call per element).

    >>> decode_payload_columns(b'[1, 2.5, -3, "x"]')
    ([1.0, 2.5, -3.0], None, None, 1)
    >>> decode_payload_columns(b'[4, {"value": 5, "seq": 9}]')
    ([4.0, 5.0], None, [None, 9], 0)
    """
    x = _number_or_text(data)
    if isinstance(x, float):
        return [x], None, None, 0
    doc = _load(x)
    if type(doc) is list and doc:
        values = _plain_values(doc)
        if values is not None:
            return values, None, None, 0
    readings, bad = _decode_doc(doc, with_stream=False)
    values = [r[1] for r in readings]
    ts = [r[2] for r in readings]
    seq = [r[3] for r in readings]
    return (values, None if ts.count(None) == len(ts) else ts, None if seq.count(None) == len(seq) else seq, bad)


def decode_line(line: bytes) -> tuple[list[Reading], int]:
    """Readings of one stdin line: a number, ``stream,value[,ts]`` CSV, or JSON (object or array).

    JSON objects may carry ``"stream"``; readings without a stream name have ``None`` (the default stream).
    """
    line = line.strip()
    if not line:
        return [], 0
    first = line[:1]
    if first in (b"{", b"["):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            msg = "line is not UTF-8"
            raise PayloadError(msg) from None
        return _decode_json(text, with_stream=True)
    if b"," in line:
        parts = line.split(b",")
        if len(parts) not in (2, 3):
            msg = "CSV line is not stream,value[,ts]"
            raise PayloadError(msg)
        try:
            name = parts[0].strip().decode("utf-8")
        except UnicodeDecodeError:
            msg = "stream name is not UTF-8"
            raise PayloadError(msg) from None
        name = check_stream_name(name)
        try:
            value = float(parts[1])
        except ValueError:
            raise PayloadError(_BAD_VALUE) from None
        if not math.isfinite(value):
            raise PayloadError(_BAD_VALUE)
        ts = None
        if len(parts) == 3 and parts[2].strip():
            try:
                ts = float(parts[2])
            except ValueError:
                ts = math.nan
            ts = _ts(ts, "ts is not a number of seconds between 1970 and 2100")
        return [(name, value, ts, None)], 0
    readings, bad = decode_payload(line)
    return readings, bad


# -- local mode: device reports ---------------------------------------------------------------------------------
# (report, ts or None, seq or None, phase, theta or None)
Report = tuple[float, float | None, int | None, str, float | None]

_PHASES = ("threshold", "stream", "categorical", "range")


_REPORT_LIMIT = 2.0**1023  # a report or theta beyond it is no float a device could have sent


def _finite(x: Any) -> float | None:
    """``x`` as a finite float, or None (booleans, strings, NaN, infinities and integers too large for a float)."""
    if type(x) is float:
        return x if math.isfinite(x) else None
    if type(x) is int and -_REPORT_LIMIT < x < _REPORT_LIMIT:
        return float(x)
    return None


def _report(obj: Any) -> Report:
    if type(obj) is not dict:
        msg = "a report must be a JSON object"
        raise PayloadError(msg)
    y = _finite(obj.get("report"))
    if y is None:
        msg = "report is not a finite number"
        raise PayloadError(msg)
    phase = obj.get("phase")
    if type(phase) is not str or phase not in _PHASES:
        msg = "report phase must be 'threshold', 'stream', 'categorical' or 'range'"
        raise PayloadError(msg)
    # the 5th element: theta for a stream report, the Square Wave domain for a threshold report (absent: the bound)
    key = "theta" if phase == "stream" else "domain"
    theta = obj.get(key)
    if theta is not None:
        theta = _finite(theta)
        if theta is None or not theta > 0:
            msg = f"report {key} must be a positive number"
            raise PayloadError(msg)
    ts = obj.get("ts")
    if ts is not None:
        ts = _ts(ts, "ts must be a number of seconds between 1970 and 2100")
    seq = obj.get("seq")
    if seq is not None:
        seq = _seq(seq, "seq must be an integer in [0, 2^63)")
    return y, ts, seq, phase, theta


def decode_reports(data: bytes) -> tuple[list[Report], int]:
    """Device reports of local mode: one JSON object or an array of them; returns (reports, bad elements).

    >>> decode_reports(b'{"report": -1.5, "phase": "stream", "theta": 19.0, "ts": 5}')
    ([(-1.5, 5.0, None, 'stream', 19.0)], 0)
    >>> decode_reports(b'[{"report": 3, "phase": "threshold"}, {"report": "x", "phase": "threshold"}]')
    ([(3.0, None, None, 'threshold', None)], 1)
    """
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError, MemoryError):
        msg = "not a JSON report"
        raise PayloadError(msg) from None
    if type(doc) is list:
        out: list[Report] = []
        bad = 0
        for el in doc:
            try:
                out.append(_report(el))
            except PayloadError:
                bad += 1
        return out, bad
    return [_report(doc)], 0

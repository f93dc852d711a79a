"""Compiled writing of release lines: a step's JSON lines of release rows into one byte buffer.

Each line is ``{"stream":NAME,"tick":T,"ts":TS,"value":V,"epsilon":E,"theta":TH}``, the text
:func:`stream.core.sinks.encode_releases` writes. Names, times, thetas and epsilon arrive already as text (each
distinct one rendered once by ``repr``); a value on the release grid is written here as its exact decimal expansion
(:func:`grid_text`), every other value arrives as its ``repr``.
"""

from __future__ import annotations

import numba
import numpy as np

GRID = 1024  # a value ``k / GRID`` with ``|value| < GRID_LIMIT`` is written here (its repr is its exact expansion)
GRID_LIMIT = float(1 << 21)
FRACTION_DIGITS = 10  # 1 / 1024 = 0.0009765625: ten decimal places hold every k / 1024 exactly
FRACTION_SCALE = 9765625  # 10**10 / 1024: the fraction's k / 1024 as ten decimal digits, k * 9765625

_STREAM = np.frombuffer(b'{"stream":', dtype=np.uint8)
_TICK = np.frombuffer(b',"tick":', dtype=np.uint8)
_TS = np.frombuffer(b',"ts":', dtype=np.uint8)
_VALUE = np.frombuffer(b',"value":', dtype=np.uint8)
_EPSILON = np.frombuffer(b',"epsilon":', dtype=np.uint8)
_THETA = np.frombuffer(b',"theta":', dtype=np.uint8)
LINE_OVERHEAD = sum(a.size for a in (_STREAM, _TICK, _TS, _VALUE, _EPSILON, _THETA)) + 2  # "}" and "\n"
INT_DIGITS = 20  # an int64's digits and sign
GRID_VALUE_CHARS = 1 + 7 + 1 + FRACTION_DIGITS  # sign, the integer part below 2^21, ".", the fraction


def on_grid(values: np.ndarray) -> np.ndarray:
    """Which values :func:`encode_lines` writes itself: ``k / 1024`` with ``|value| < 2^21``, not -0.0 (whose repr
    keeps its sign), finite. For these ``repr`` is the exact decimal expansion: ``repr`` gives the shortest text that
    reads back as the same double, and below 2^21 the grid's spacing (2^-10) is coarse enough against the double's
    (at most 2^-32) that no shorter decimal lies within half an ulp (pinned by
    tests/core/test_release_encoding.py for every ``k / 1024`` below 4096 and random ones up to the limit)."""
    scaled = values * GRID
    return (np.abs(values) < GRID_LIMIT) & (scaled == np.floor(scaled)) & ~((values == 0.0) & np.signbit(values))


@numba.njit(cache=True, nogil=True, inline="always")
def _put(out: np.ndarray, at: int, src: np.ndarray, start: int, stop: int) -> int:
    for j in range(start, stop):
        out[at] = src[j]
        at += 1
    return at


@numba.njit(cache=True, nogil=True, inline="always")
def _put_int(out: np.ndarray, at: int, x: int) -> int:
    """The decimal digits of ``x`` (with a ``-`` below 0), as ``str(int)`` writes them."""
    if x < 0:
        out[at] = 45  # "-"
        at += 1
        x = -x
    n = 1
    y = x
    while y >= 10:
        y //= 10
        n += 1
    for j in range(n - 1, -1, -1):
        out[at + j] = 48 + x % 10
        x //= 10
    return at + n


@numba.njit(cache=True, nogil=True, inline="always")
def grid_text(out: np.ndarray, at: int, value: float) -> int:
    """``repr(value)`` of a value :func:`on_grid` accepts: the integer part, ``.``, then the fraction's exact decimal
    digits ``(k mod 1024) * 10^10 / 1024`` without trailing zeros (``.0`` for an integer)."""
    k = np.int64(value * GRID)
    if k < 0:
        out[at] = 45
        at += 1
        k = -k
    at = _put_int(out, at, k >> 10)
    out[at] = 46  # "."
    at += 1
    frac = (k & 1023) * FRACTION_SCALE
    if frac == 0:
        out[at] = 48
        return at + 1
    digits = FRACTION_DIGITS
    while frac % 10 == 0:
        frac //= 10
        digits -= 1
    for j in range(digits - 1, -1, -1):
        out[at + j] = 48 + frac % 10
        frac //= 10
    return at + digits


@numba.njit(cache=True, nogil=True, inline="always")
def _number_text(out: np.ndarray, at: int, number: float, text: int, texts: np.ndarray, text_at: np.ndarray) -> int:
    """``number`` written by :func:`grid_text` when ``text < 0`` (on the grid), else its text ``text``."""
    if text < 0:
        return grid_text(out, at, number)
    return _put(out, at, texts, text_at[text], text_at[text + 1])


@numba.njit(cache=True, nogil=True)
def encode_lines(out: np.ndarray, stream_of: np.ndarray, ticks: np.ndarray, values: np.ndarray,
                 value_text: np.ndarray, ts_of: np.ndarray, thetas: np.ndarray, theta_text: np.ndarray,
                 names: np.ndarray, name_at: np.ndarray, texts: np.ndarray, text_at: np.ndarray,
                 epsilon_text: int, head: np.ndarray, tick: np.ndarray, ts: np.ndarray, value: np.ndarray,
                 epsilon: np.ndarray, theta: np.ndarray) -> int:
    """Write line ``i`` of every release into ``out``; returns the bytes written. Line ``i``: stream
    ``stream_of[i]`` (its JSON name ``names[name_at[s]:name_at[s + 1]]``), tick ``ticks[i]``, the time text
    ``ts_of[i]``, the value (``value_text[i] < 0``: ``values[i]`` on the grid, written by :func:`grid_text`; else
    that text), epsilon's text, and the stream's theta (``theta_text[s] < 0``: ``thetas[s]`` on the grid; else that
    text); text ``t`` is
    ``texts[text_at[t]:text_at[t + 1]]``."""
    at = 0
    for i in range(stream_of.size):
        s = stream_of[i]
        at = _put(out, at, head, 0, head.size)
        at = _put(out, at, names, name_at[s], name_at[s + 1])
        at = _put(out, at, tick, 0, tick.size)
        at = _put_int(out, at, ticks[i])
        at = _put(out, at, ts, 0, ts.size)
        t = ts_of[i]
        at = _put(out, at, texts, text_at[t], text_at[t + 1])
        at = _put(out, at, value, 0, value.size)
        at = _number_text(out, at, values[i], value_text[i], texts, text_at)
        at = _put(out, at, epsilon, 0, epsilon.size)
        at = _put(out, at, texts, text_at[epsilon_text], text_at[epsilon_text + 1])
        at = _put(out, at, theta, 0, theta.size)
        at = _number_text(out, at, thetas[s], theta_text[s], texts, text_at)
        out[at] = 125  # "}"
        out[at + 1] = 10  # "\n"
        at += 2
    return at


def pieces() -> tuple[np.ndarray, ...]:
    """The constant parts of a line, in order, for :func:`encode_lines`."""
    return _STREAM, _TICK, _TS, _VALUE, _EPSILON, _THETA

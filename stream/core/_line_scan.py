"""Compiled reading of ``stream,value`` lines: each line of a buffer split, its name looked up, its value parsed.

A line is **plain** when it is ``NAME,VALUE`` with one comma, at most ``limit`` bytes, a name that does not begin
with whitespace, ``{`` or ``[`` and does not end with whitespace, and a value ``[+-]DIGITS[.DIGITS]`` with at most
15 significant digits and at most 22 after the point. Such a value is ``m / 10^f`` with ``m < 2^53`` and ``10^f``
both exact doubles, so one IEEE division (correctly rounded) gives the double ``float()`` gives (Clinger, How to
read floating point numbers accurately, PLDI 1990: the "fast path"). Every other line is left to the caller's full
decoder, byte for byte as it arrived.

Names are looked up in a :class:`NameTable`: open addressing over an arena of name bytes, hashed with SipHash-1-3
under a random per-process key (Aumasson and Bernstein, SipHash: a fast short-input PRF, INDOCRYPT 2012), so that
names cannot be chosen to collide.
"""

from __future__ import annotations

import os

import numba
import numpy as np

PLAIN_KNOWN = 0  # a plain line whose name is in the table (its slot and value are given)
PLAIN_NEW = 1  # a plain line whose name is not in the table (its value is given)
FULL_DECODE = 2  # any other line: the caller decodes it whole

MAX_SIGNIFICANT = 15
MAX_FRACTION = 22
_POW10 = np.array([10.0 ** k for k in range(MAX_FRACTION + 1)])


@numba.njit(cache=True, nogil=True, inline="always")
def _rotl(x: np.uint64, b: int) -> np.uint64:
    return (x << np.uint64(b)) | (x >> np.uint64(64 - b))


@numba.njit(cache=True, nogil=True, inline="always")
def _sipround(v0: np.uint64, v1: np.uint64, v2: np.uint64, v3: np.uint64) -> tuple:
    v0 += v1
    v1 = _rotl(v1, 13)
    v1 ^= v0
    v0 = _rotl(v0, 32)
    v2 += v3
    v3 = _rotl(v3, 16)
    v3 ^= v2
    v0 += v3
    v3 = _rotl(v3, 21)
    v3 ^= v0
    v2 += v1
    v1 = _rotl(v1, 17)
    v1 ^= v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


@numba.njit(cache=True, nogil=True)
def siphash13(k0: np.uint64, k1: np.uint64, data: np.ndarray, start: int, stop: int) -> np.uint64:
    """SipHash-1-3 of ``data[start:stop]`` under the key ``(k0, k1)`` (one compression round, three finalization
    rounds; little-endian words, the length in the last byte)."""
    v0 = k0 ^ np.uint64(0x736F6D6570736575)
    v1 = k1 ^ np.uint64(0x646F72616E646F6D)
    v2 = k0 ^ np.uint64(0x6C7967656E657261)
    v3 = k1 ^ np.uint64(0x7465646279746573)
    n = stop - start
    end = start + (n - n % 8)
    i = start
    while i < end:
        m = np.uint64(0)
        for j in range(8):
            m |= np.uint64(data[i + j]) << np.uint64(8 * j)
        v3 ^= m
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
        v0 ^= m
        i += 8
    b = np.uint64(n & 0xFF) << np.uint64(56)
    for j in range(stop - end):
        b |= np.uint64(data[end + j]) << np.uint64(8 * j)
    v3 ^= b
    v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    v0 ^= b
    v2 ^= np.uint64(0xFF)
    for _ in range(3):
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


@numba.njit(cache=True, nogil=True)
def _find(key: np.ndarray, index: np.ndarray, arena: np.ndarray, name_at: np.ndarray, data: np.ndarray,
          start: int, stop: int) -> int:
    """The slot of the name ``data[start:stop]``, or -1."""
    mask = np.int64(index.size - 1)
    h = np.int64(siphash13(key[0], key[1], data, start, stop) & np.uint64(mask))
    n = stop - start
    while True:
        s = index[h]
        if s < 0:
            return -1
        a = name_at[s]
        if name_at[s + 1] - a == n:
            same = True
            for j in range(n):
                if arena[a + j] != data[start + j]:
                    same = False
                    break
            if same:
                return s
        h = (h + 1) & mask


@numba.njit(cache=True, nogil=True)
def _find_many(key: np.ndarray, index: np.ndarray, arena: np.ndarray, name_at: np.ndarray, data: np.ndarray,
               bounds: np.ndarray, out: np.ndarray) -> None:
    """The slot (or -1) of each name ``data[bounds[i]:bounds[i + 1]]``, into ``out[i]``."""
    for i in range(out.size):
        out[i] = _find(key, index, arena, name_at, data, bounds[i], bounds[i + 1])


@numba.njit(cache=True, nogil=True)
def _place(key: np.ndarray, index: np.ndarray, arena: np.ndarray, name_at: np.ndarray, first: int, stop: int) -> None:
    """Enter slots ``first .. stop - 1`` (their names already in the arena) into ``index``."""
    mask = np.int64(index.size - 1)
    for s in range(first, stop):
        h = np.int64(siphash13(key[0], key[1], arena, name_at[s], name_at[s + 1]) & np.uint64(mask))
        while index[h] >= 0:
            h = (h + 1) & mask
        index[h] = s


@numba.njit(cache=True, nogil=True, inline="always")
def _space(c: int) -> bool:
    """Whether byte ``c`` is whitespace as ``bytes.isspace`` sees it (ASCII space, \\t \\n \\v \\f \\r)."""
    return c == 32 or 9 <= c <= 13


@numba.njit(cache=True, nogil=True)
def _value(data: np.ndarray, i: int, stop: int, pow10: np.ndarray) -> float:
    """The value of ``data[i:stop]`` if it is ``[+-]DIGITS[.DIGITS]`` within the fast path's limits, else NaN."""
    neg = False
    if i < stop and (data[i] == 45 or data[i] == 43):  # "-", "+"
        neg = data[i] == 45
        i += 1
    m = 0
    significant = 0
    digits = 0
    fraction = -1  # digits after the point (-1: no point)
    while i < stop:
        c = data[i]
        if 48 <= c <= 57:
            digits += 1
            if m or c != 48:
                significant += 1
                if significant > MAX_SIGNIFICANT:
                    return np.nan
            m = m * 10 + (c - 48)
            if fraction >= 0:
                fraction += 1
                if fraction > MAX_FRACTION:
                    return np.nan
        elif c == 46 and fraction < 0 and digits:  # ".", after at least one digit
            fraction = 0
        else:
            return np.nan
        i += 1
    if not digits:
        return np.nan
    x = float(m)
    if fraction > 0:
        x = x / pow10[fraction]
    return -x if neg else x


@numba.njit(cache=True, nogil=True)
def scan_lines(data: np.ndarray, limit: int, key: np.ndarray, index: np.ndarray, arena: np.ndarray,
               name_at: np.ndarray, pow10: np.ndarray, starts: np.ndarray, commas: np.ndarray,
               kinds: np.ndarray, slots: np.ndarray, values: np.ndarray) -> int:
    """Split ``data`` (whole lines, each ending in a newline) into lines and classify each (``PLAIN_KNOWN``,
    ``PLAIN_NEW``, ``FULL_DECODE``), with its start, its comma (-1: none), its slot (-1: none) and its value; returns
    the number of lines. ``starts`` has room for one more entry than lines: the end of the last line + 1."""
    n = 0
    i = 0
    size = data.size
    while i < size:
        start = i
        comma = -1
        commas_seen = 0
        while data[i] != 10:
            if data[i] == 44:
                commas_seen += 1
                comma = i
            i += 1
        stop = i  # the newline
        i += 1
        starts[n] = start
        commas[n] = comma
        slots[n] = -1
        kinds[n] = FULL_DECODE
        values[n] = np.nan
        if commas_seen == 1 and stop - start <= limit and comma > start:
            first, last = data[start], data[comma - 1]
            if not (_space(first) or first == 123 or first == 91 or _space(last)):
                v = _value(data, comma + 1, stop, pow10)
                if v == v:
                    values[n] = v
                    s = _find(key, index, arena, name_at, data, start, comma)
                    slots[n] = s
                    kinds[n] = PLAIN_KNOWN if s >= 0 else PLAIN_NEW
        n += 1
    starts[n] = size
    return n


class NameTable:
    """Stream names (their bytes, as lines give them) to slots ``0, 1, 2, ...`` in the order they were added, and
    the value each slot stands for (``values``, e.g. the stream's decoded name; None past the last slot)."""

    def __init__(self, capacity: int = 1 << 12) -> None:
        self.key = np.frombuffer(os.urandom(16), dtype=np.uint64).copy()
        self.values = np.full(max(capacity, 16), None, dtype=object)
        self.arena = np.empty(max(capacity, 16) * 16, dtype=np.uint8)
        self.name_at = np.zeros(max(capacity, 16) + 1, dtype=np.int64)
        self.index = np.full(_table_size(capacity), -1, dtype=np.int64)
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def add(self, names: list[bytes], values: list[object] | None = None) -> None:
        """Give each of ``names`` (none in the table yet, distinct) the next slot, standing for the same entry of
        ``values``."""
        if not names:
            return
        first, stop = self.count, self.count + len(names)
        if stop > self.values.size:
            grown_values = np.full(2 * stop, None, dtype=object)
            grown_values[:first] = self.values[:first]
            self.values = grown_values
        if values is not None:
            self.values[first:stop] = values
        if stop + 1 > self.name_at.size:
            grown = np.zeros(2 * stop + 1, dtype=np.int64)
            grown[: first + 1] = self.name_at[: first + 1]
            self.name_at = grown
        blob = b"".join(names)
        used = int(self.name_at[first])
        if used + len(blob) > self.arena.size:
            grown_arena = np.empty(2 * (used + len(blob)), dtype=np.uint8)
            grown_arena[:used] = self.arena[:used]
            self.arena = grown_arena
        self.arena[used : used + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
        lengths = np.fromiter(map(len, names), dtype=np.int64, count=len(names))
        np.cumsum(lengths, out=self.name_at[first + 1 : stop + 1])
        self.name_at[first + 1 : stop + 1] += used
        self.count = stop
        if 2 * stop > self.index.size:  # at most half full: short probes
            self.index = np.full(_table_size(stop), -1, dtype=np.int64)
            _place(self.key, self.index, self.arena, self.name_at, 0, stop)
        else:
            _place(self.key, self.index, self.arena, self.name_at, first, stop)

    def slots(self, names: list[bytes]) -> np.ndarray:
        """The slot of each of ``names`` (-1: not in the table), in one compiled pass."""
        out = np.empty(len(names), dtype=np.int64)
        if names:
            bounds = np.zeros(len(names) + 1, dtype=np.int64)
            np.cumsum(np.fromiter(map(len, names), dtype=np.int64, count=len(names)), out=bounds[1:])
            data = np.frombuffer(b"".join(names), dtype=np.uint8)
            _find_many(self.key, self.index, self.arena, self.name_at, data, bounds, out)
        return out

    def slot(self, name: bytes) -> int:
        """The slot of ``name``, or -1."""
        data = np.frombuffer(name, dtype=np.uint8)
        return int(_find(self.key, self.index, self.arena, self.name_at, data, 0, data.size))


def _table_size(count: int) -> int:
    """A power of two at least four times ``count`` (and 64)."""
    return 1 << max(6, (4 * max(count, 1) - 1).bit_length())


class ScannedLines:
    """The lines of one buffer as :func:`scan_lines` classified them."""

    __slots__ = ("commas", "count", "data", "kinds", "slots", "starts", "values")

    def __init__(self, data: bytes, limit: int, table: NameTable) -> None:
        buf = np.frombuffer(data, dtype=np.uint8)
        most = data.count(b"\n")
        self.data = data
        self.starts = np.empty(most + 1, dtype=np.int64)
        self.commas = np.empty(most, dtype=np.int64)
        self.kinds = np.empty(most, dtype=np.int8)
        self.slots = np.empty(most, dtype=np.int64)
        self.values = np.empty(most, dtype=np.float64)
        self.count = scan_lines(buf, limit, table.key, table.index, table.arena, table.name_at, _POW10, self.starts,
                                self.commas, self.kinds, self.slots, self.values)

    def line(self, i: int) -> bytes:
        """Line ``i``, without its newline."""
        return self.data[self.starts[i] : self.starts[i + 1] - 1]

    def name(self, i: int) -> bytes:
        """The name's bytes of plain line ``i``."""
        return self.data[self.starts[i] : self.commas[i]]

"""The compiled reading of ``stream,value`` lines (stream/core/_line_scan.py): a value it parses is exactly the
double ``float()`` makes of the same bytes, anything else is left to the full decoder; names are found by their bytes
in a table whose hash is keyed, and only there."""

from __future__ import annotations

import math
import struct

import numpy as np

from stream.core._line_scan import FULL_DECODE, PLAIN_KNOWN, PLAIN_NEW, NameTable, ScannedLines


def _value_texts(rng: np.random.Generator, n: int) -> list[bytes]:
    """Texts a value field may hold: plain decimals of every length (short, at and past 15 significant digits, long
    fractions, leading zeros), signs, exponents, underscores, hex, spaces, inf and nan in their spellings, empties."""
    out = []
    for _ in range(n):
        kind = int(rng.integers(0, 12))
        digits = "".join(str(int(d)) for d in rng.integers(0, 10, int(rng.integers(1, 25))))
        frac = "".join(str(int(d)) for d in rng.integers(0, 10, int(rng.integers(0, 26))))
        sign = ["", "-", "+"][int(rng.integers(0, 3))]
        if kind <= 4:
            point = f".{frac[:int(rng.integers(0, 8))]}" if kind % 2 else ""
            text = f"{sign}{digits[: int(rng.integers(1, 9))]}{point}"
        elif kind == 5:
            text = f"{sign}{digits}.{frac}"
        elif kind == 6:
            text = f"{sign}{digits[:3]}e{int(rng.integers(-30, 30))}"
        elif kind == 7:
            text = f"{sign}{digits[:2]}_{digits[2:4] or '0'}"
        elif kind == 8:
            odd = ["inf", "-inf", "nan", "NaN", "Infinity", "+inf", "1e999", "-1e999", "0x10", "", ".", "-", "+", ".5",
                   "5.", "-.5", "1..2", "1.2.3", "--1", "1-", "٣", "1 ", " 1", "1\r", "\t1"]
            text = odd[int(rng.integers(0, len(odd)))]
        elif kind == 9:
            text = f"{sign}0000000000000000000{digits[:4]}.{frac[:3]}"
        elif kind == 10:
            text = f"{sign}{rng.random() * 10.0 ** int(rng.integers(-8, 16))!r}"
        else:
            text = f"{sign}{int(rng.integers(0, 1 << 53))}"
        out.append(text.encode())
    return out


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def test_a_parsed_value_is_the_double_float_gives_and_everything_else_is_left_to_the_full_decoder() -> None:
    """Seeded fuzz against ``float()``: every value the scan parses has the bits ``float()`` gives (-0.0 included);
    every text ``float()`` rejects or reads as inf or nan is left to the full decoder; and the common shapes (up to
    15 significant digits, with or without a fraction and a sign) are all parsed."""
    rng = np.random.default_rng(1990)
    table = NameTable()
    table.add([b"m1"])
    texts = _value_texts(rng, 60_000)
    scan = ScannedLines(b"".join(b"m1," + t + b"\n" for t in texts), 1 << 20, table)
    assert scan.count == len(texts)
    parsed = 0
    for i, t in enumerate(texts):
        try:
            want = float(t)
        except ValueError:
            want = None
        if scan.kinds[i] == PLAIN_KNOWN:
            parsed += 1
            assert want is not None and math.isfinite(want), t
            assert _bits(float(scan.values[i])) == _bits(want), t
            assert scan.slots[i] == 0
        else:
            assert scan.kinds[i] == FULL_DECODE, t
            body = t[1:] if t[:1] in (b"+", b"-") else t
            digits = body.replace(b".", b"").lstrip(b"0")
            common = (body[:1].isdigit() and body.count(b".") <= 1 and body.replace(b".", b"").isdigit()
                      and len(digits) <= 15 and len(body.partition(b".")[2]) <= 22)
            assert not common, t
    assert parsed > 25_000


def test_a_lines_shape_decides_whether_it_is_plain() -> None:
    """Only ``NAME,VALUE`` with one comma, within the limit, and a name without surrounding space or a JSON opening
    is plain; a plain line's name is found only when its bytes are in the table."""
    table = NameTable()
    table.add([b"a", b"caf\xc3\xa9", b"x" * 40])
    lines = [b"a,1", b"b,2", b"caf\xc3\xa9,3", b"x" * 40 + b",4", b" a,5", b"a ,6", b"\ta,7", b"{a,8", b"[a,9",
             b"a,1,2", b"a", b",1", b"", b'{"stream":"a","value":1}', b"a," + b"1" * 30, b"A,1", b"a\x00,1",
             b"a," + b"0" * 90 + b"1"]
    scan = ScannedLines(b"".join(line + b"\n" for line in lines), 64, table)
    kinds = [int(k) for k in scan.kinds[: scan.count]]
    assert kinds == [PLAIN_KNOWN, PLAIN_NEW, PLAIN_KNOWN, PLAIN_KNOWN] + [FULL_DECODE] * 11 + [PLAIN_NEW, PLAIN_NEW,
                                                                                             FULL_DECODE]
    assert [int(s) for s in scan.slots[:4]] == [0, -1, 1, 2]
    assert [scan.line(i) for i in range(scan.count)] == lines
    assert scan.name(1) == b"b"


def test_every_name_is_found_by_its_bytes_as_the_table_grows() -> None:
    """A hundred thousand names added in batches (the table grows and rehashes on the way), among them names that
    differ in one byte, share prefixes or are long: each is found at its slot, and names never added are not."""
    rng = np.random.default_rng(7)
    names = [bytes(rng.integers(33, 256, int(rng.integers(1, 60)), dtype=np.uint8)).replace(b",", b".")
             for _ in range(50_000)]
    names += [f"m{i}".encode() for i in range(50_000)]
    names = list(dict.fromkeys(names))
    table = NameTable(capacity=16)
    for at in range(0, len(names), 7_919):
        table.add(names[at : at + 7_919])
    assert len(table) == len(names)
    sample = rng.choice(len(names), 5_000, replace=False)
    assert all(table.slot(names[i]) == i for i in sample.tolist())
    assert table.slot(b"m50000") == -1 and table.slot(b"") == -1 and table.slot(b"m1\x00") == -1
    absent = [b"m50000", b"", b"m1\x00"]
    asked = [names[i] for i in sample.tolist()] + absent
    assert table.slots(asked).tolist() == [*sample.tolist(), -1, -1, -1]
    assert table.slots([]).tolist() == []

"""Hostile input never raises past the decoders: a seeded property test over hostile JSON (huge integers, deep
nesting, NaN/Infinity tokens, wrong types, unicode, 10^400 in every field, in batches), and the range checks of
every field (``ts`` within 1970-2100, ``seq`` a non-negative 63-bit integer, values finite numbers; negative ones
are clamped by the operator)."""

from __future__ import annotations

import json
import math
import random

import pytest

from stream.core.errors import PayloadError
from stream.core.payload import SEQ_LIMIT, TS_MAX, decode_line, decode_payload, decode_payload_columns, decode_reports
from tests.support import HUGE, hostile_doc


def check_readings(readings: list, bad: int) -> None:
    assert bad >= 0
    for stream, value, ts, seq in readings:
        assert stream is None or (isinstance(stream, str) and 0 < len(stream) <= 128)
        assert type(value) is float and math.isfinite(value)
        assert ts is None or (type(ts) is float and 0 <= ts <= TS_MAX)
        assert seq is None or (type(seq) is int and 0 <= seq < SEQ_LIMIT)


def test_seeded_fuzz_of_every_decoder_raises_only_payload_errors() -> None:
    """3,000 hostile documents, each through the four decoders (MQTT rows and columns, stdin, local reports):
    either a PayloadError or readings whose every field is in range; no other exception, no echo of the input."""
    rng = random.Random(20240610)
    outcomes = {"ok": 0, "rejected": 0}
    for _ in range(3000):
        doc = hostile_doc(rng)
        data = doc.encode("utf-8", errors="surrogatepass")
        for decode in (decode_payload, decode_line, decode_payload_columns, decode_reports):
            try:
                out = decode(data)
            except PayloadError as exc:
                outcomes["rejected"] += 1
                assert HUGE[:20] not in str(exc) and len(str(exc)) < 100
                continue
            outcomes["ok"] += 1
            if decode is decode_payload_columns:
                values, ts, seqs, bad = out
                rows = [(None, v, None if ts is None else ts[i], None if seqs is None else seqs[i])
                        for i, v in enumerate(values)]
                check_readings(rows, bad)
            elif decode is decode_reports:
                reports, bad = out
                for y, ts, seq, phase, theta in reports:
                    assert type(y) is float and math.isfinite(y) and phase in ("threshold", "stream")
                    assert ts is None or 0 <= ts <= TS_MAX
                    assert seq is None or 0 <= seq < SEQ_LIMIT
                    assert theta is None or (math.isfinite(theta) and theta > 0)
            else:
                check_readings(*out)
    assert outcomes["ok"] > 500 and outcomes["rejected"] > 500, outcomes  # both sides were exercised


@pytest.mark.parametrize("field", ["value", "ts", "seq"])
@pytest.mark.parametrize("number", [HUGE, "-" + HUGE, "1e400", "NaN", "Infinity"])
def test_out_of_range_in_every_field_is_a_payload_error(field: str, number: str) -> None:
    """10^400 (an integer no float holds), infinities and NaN in each field: rejected, alone or batched."""
    obj = {"value": "1", "ts": "1700000000", "seq": "7"}
    obj[field] = number
    text = "{" + ", ".join(f'"{k}": {v}' for k, v in obj.items()) + "}"
    for decode in (decode_payload, decode_line, decode_payload_columns):
        with pytest.raises(PayloadError):
            decode(text.encode())
        out = decode(f"[{text}, 5]".encode())  # in a batch: that element is counted bad, the other taken
        assert out[-1] == 1
    line = f'{{"stream": "m", {text[1:]}'
    with pytest.raises(PayloadError):
        decode_line(line.encode())
    report = text.replace('"value"', '"report"').replace("}", ', "phase": "stream"}')
    with pytest.raises(PayloadError):
        decode_reports(report.encode())


def test_field_windows() -> None:
    """ts in [0, 4102444800] (1970-2100), seq in [0, 2^63), on every path (JSON, CSV, reports)."""
    assert decode_payload(b'{"value": 1, "ts": 4102444800, "seq": 9223372036854775807}')[0][0][2:] == \
        (TS_MAX, 2**63 - 1)
    for bad in (b'{"value": 1, "ts": 4102444801}', b'{"value": 1, "ts": -1}', b'{"value": 1, "seq": 2e3}',
                b'{"value": 1, "seq": 9223372036854775808}', b'{"value": 1, "ts": true}'):
        with pytest.raises(PayloadError):
            decode_payload(bad)
    with pytest.raises(PayloadError):
        decode_line(b"m,1,1e400")
    with pytest.raises(PayloadError):
        decode_line(b"m,1,-5")
    assert decode_line(b"m,1,1700000000")[0][0][2] == 1.7e9
    for bad in ('{"report": 1, "phase": "stream", "theta": H}', '{"report": H, "phase": "stream"}',
                '{"report": 1, "phase": "stream", "ts": H}', '{"report": 1, "phase": ["stream"]}',
                '{"report": 1, "phase": "stream", "seq": H}'):
        bad = bad.replace("H", HUGE)
        with pytest.raises(PayloadError):
            decode_reports(bad.encode())
    assert json.loads("[" + HUGE + "]")  # the test's premise: Python's json parses it as an int

"""Payload decoding of MQTT messages and stdin lines: numbers, JSON objects and batches; every rejection is a
PayloadError whose message never echoes the payload nor an ordinary reading."""

from __future__ import annotations

import pytest

from stream.core.errors import PayloadError
from stream.core.payload import decode_line, decode_payload, decode_payload_columns, decode_reports
from tests.support import NUMBER


# -- payloads ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("payload", [b"12", b" 12.5\n", b"0", b'{"value": 12}', b"1e3"])
def test_payload_numbers(payload: bytes) -> None:
    readings, bad = decode_payload(payload)
    assert bad == 0 and len(readings) == 1 and readings[0][1] >= 0


@pytest.mark.parametrize("payload", [b"nan", b"-inf", b"inf", b"\xff\xfe", b"", b"{", b'{"value": "1"}',
                                     b'{"value": true}', b'{"value": null}', b"[]", b'"5"', b"null",
                                     b'{"value": 1, "seq": -1}', b'{"value": 1, "seq": 1.5}',
                                     b'{"value": 1, "ts": "x"}', b'{"value": 1e400}', b"[" * 100000])
def test_payload_rejected_without_echo(payload: bytes) -> None:
    with pytest.raises(PayloadError) as exc:
        decode_payload(payload)
    shown = payload.decode(errors="ignore").strip()[:5]
    assert not shown or shown not in str(exc.value)  # the message never echoes the payload


READINGS = ("17.25", "4242")  # ordinary readings, as a device writes them


ECHO_CASES = [
    (decode_payload, b'{"value": 17.25, "ts": "x"}'), (decode_payload, b'{"value": 4242, "seq": -1}'),
    (decode_payload, b'{"value": 17.25, "seq": 1.5}'), (decode_payload, b'{"value": 4242, "ts": -17.25}'),
    (decode_payload, b'{"value": "17.25"}'), (decode_payload, b'"4242"'), (decode_payload, b'{"value": 17.25, "x'),
    (decode_payload, b"17.25 4242"), (decode_payload_columns, b'{"value": 4242, "ts": "x"}'),
    (decode_payload_columns, b'{"value": 17.25, "seq": "4242"}'), (decode_line, b"m,17.25,x"),
    (decode_line, b"m,4242,17.25,1"), (decode_line, b"m/4242,17.25"), (decode_line, b"m,17.25x"),
    (decode_line, b'{"stream": "m", "value": 4242, "ts": "x"}'), (decode_line, b'{"stream": 4242, "value": 17.25}'),
    (decode_reports, b'{"report": 17.25, "phase": "x"}'), (decode_reports, b'{"report": 4242, "phase": "stream", '
                                                                           b'"theta": -17.25}'),
    (decode_reports, b'{"report": 17.25, "phase": "stream", "seq": 4242.5}'), (decode_reports, b"17.25"),
]


def echoed(payload: bytes, message: str) -> list[str]:
    """The ordinary readings of ``payload`` that ``message`` carries as a whole number (however it prints them:
    4242 echoed from a parsed float reads 4242.0)."""
    shown = {float(t) for t in NUMBER.findall(message)}
    return [r for r in READINGS if r.encode() in payload and float(r) in shown]


@pytest.mark.parametrize(("decode", "payload"), ECHO_CASES, ids=[f"{f.__name__}-{i}" for i, (f, _) in
                                                                  enumerate(ECHO_CASES)])
def test_a_rejection_never_echoes_an_ordinary_reading(decode, payload: bytes) -> None:
    with pytest.raises(PayloadError) as exc:
        decode(payload)
    assert not echoed(payload, str(exc.value)), str(exc.value)


def test_payload_batch_partial() -> None:
    readings, bad = decode_payload(b'[1, {"value": 2, "seq": 3, "ts": 5}, -1, "x", {"value": false}]')
    assert readings == [(None, 1.0, None, None), (None, 2.0, 5.0, 3), (None, -1.0, None, None)] and bad == 2


def test_stdin_lines() -> None:
    assert decode_line(b"7\n") == ([(None, 7.0, None, None)], 0)
    assert decode_line(b"m1,7,100.5") == ([("m1", 7.0, 100.5, None)], 0)
    assert decode_line(b'{"stream": "m2", "value": 1, "seq": 0}') == ([("m2", 1.0, None, 0)], 0)
    assert decode_line(b"") == ([], 0)
    assert decode_line(b"m,-1") == ([("m", -1.0, None, None)], 0)  # clamped by the operator, never dropped
    for bad in (b"a/b,1", b"a#b,1", b"m,nan", b"m,x", b"a,b,c,d", b'{"stream": "a+b", "value": 1}',
                b'{"stream": 5, "value": 1}'):
        with pytest.raises(PayloadError):
            decode_line(bad)

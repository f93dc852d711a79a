"""The redelivery table (stream/state/redelivery.py) against the broker's worst sequences, live and after a restart.

A QoS 1 reading without ``seq`` is counted once only if every message the broker may still send again is in the
table. These tests play the broker's side packet by packet: a repeat recognised on a new connection whose
acknowledgement never reaches the broker (the connection breaks, or the daemon is killed) is sent once more.
"""

from __future__ import annotations

from typing import Any

from stream.state.redelivery import Redeliveries

KEY = b"k" * 32


def table() -> tuple[Redeliveries, list[dict[str, Any]]]:
    marks: list[dict[str, Any]] = []
    return Redeliveries(KEY, mark=marks.append, clock=lambda: 0.0), marks


def restarted(checkpoint: list[list[int]], marks: list[dict[str, Any]]) -> Redeliveries:
    """What a restart rebuilds: the checkpoint's table, then the journaled marks in order."""
    r = Redeliveries(KEY)
    r.load(checkpoint)
    for m in marks:
        r.replay_mark(m)
    return r


def test_a_repeat_whose_acknowledgement_was_lost_is_still_a_repeat_on_the_next_connection() -> None:
    """Connection 1 processes X; the broker drops it before X's PUBACK. Connection 2: X again (DUP) is recognised and
    its PUBACK queued, then a new message Y (DUP clear) arrives, and connection 2 breaks before X's PUBACK is written.
    Connection 3: the broker sends X a third time. It must still be a repeat (a table that dropped X's entry
    when Y arrived would miss it: 'the broker resends everything unacknowledged first' is true, but X's resend was
    not acknowledged yet)."""
    r, _ = table()
    x, y = r.digest("meters/a/reading", b"5"), r.digest("meters/a/reading", b"7")
    r.connected(session_present=False)
    assert not r.is_repeat(1, x, dup=False)
    r.keep(1, x)
    r.connected(session_present=True)
    assert r.is_repeat(1, x, dup=True)
    assert not r.is_repeat(2, y, dup=False)
    r.keep(2, y)
    r.connected(session_present=True)
    assert r.is_repeat(1, x, dup=True), "X counted twice"
    assert r.is_repeat(2, y, dup=True)


def test_the_same_after_a_kill_9_right_after_the_reconnect() -> None:
    """As above, but the daemon is killed after the marks of connection 2 are durable and before X's PUBACK leaves;
    the restart rebuilds the table from the checkpoint and the marks, and the broker sends X again."""
    r, marks = table()
    x, y = r.digest("meters/a/reading", b"5"), r.digest("meters/a/reading", b"7")
    r.connected(session_present=False)
    r.keep(1, x)
    marks.append({"u": [[1, x]]})
    checkpoint = r.snapshot()
    marks.clear()
    r.connected(session_present=True)
    assert r.is_repeat(1, x, dup=True)
    assert not r.is_repeat(2, y, dup=False)
    r.keep(2, y)
    marks.append({"u": [[2, y]]})
    after = restarted(checkpoint, marks)
    after.connected(session_present=True)
    assert after.is_repeat(1, x, dup=True), "X counted twice after the restart"
    assert after.is_repeat(2, y, dup=True)


def test_a_repeat_leaves_once_the_broker_has_its_acknowledgement() -> None:
    """The entry re-kept for a repeat goes with the evidence of the connection that acknowledged it."""
    r, marks = table()
    x = r.digest("t", b"5")
    r.connected(session_present=False)
    r.keep(1, x)
    r.connected(session_present=True)
    assert r.is_repeat(1, x, dup=True)
    r.acked([1], pub_seq=3)
    assert r.confirm(3, connected=True) == 0  # no publish after the PUBACK confirmed yet
    assert r.confirm(4, connected=True) == 1
    assert 1 not in r.entries and {"k": [1]} in marks
    assert not r.is_repeat(1, x, dup=True)


def test_old_entries_go_when_a_new_message_shows_the_broker_has_resent_everything() -> None:
    """Entries of an earlier connection that were not sent again before a new message are gone (acknowledged)."""
    r, marks = table()
    x, y, z = r.digest("t", b"1"), r.digest("t", b"2"), r.digest("t", b"3")
    r.connected(session_present=False)
    r.keep(1, x)
    r.keep(2, y)
    r.connected(session_present=True)
    assert r.is_repeat(1, x, dup=True)
    assert not r.is_repeat(3, z, dup=False)
    assert 2 not in r.entries and 1 in r.entries and {"o": 1} in marks


def test_a_lost_session_forgets_everything() -> None:
    r, marks = table()
    x = r.digest("t", b"1")
    r.connected(session_present=False)
    r.keep(1, x)
    r.connected(session_present=False)
    assert not r.entries and {"x": 1} in marks
    assert not r.is_repeat(1, x, dup=True)

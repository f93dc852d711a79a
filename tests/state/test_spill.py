"""The spill of unsent releases: what was not read before the last checkpoint is read again after a restart or a
kill -9, a torn last record is cut off, and a spill read to its end is deleted at the next commit."""

from __future__ import annotations

from pathlib import Path


def test_spill_survives_a_restart_and_cuts_a_torn_tail(tmp_path: Path) -> None:
    """The unread part of the spill (from the position recorded after the last checkpoint) is read again after a
    restart; a torn last record is cut off; a spill read to its end is deleted at the next commit."""
    from stream.state.spill import Spill

    s = Spill.open(tmp_path, fsync=False)
    s.append([("a", b"1", False, 1), ("b", b"2", True, 0), ("c", b"3", False, 2)])
    s.sync()
    assert [m[1] for m in s.read(1)] == [b"1"]
    s.commit()
    s.append([("d", b"4", False, 1)])
    s.sync()
    s.close()
    with (tmp_path / "outbox-0.spill").open("ab") as f:
        f.write(b"\x00\x00\x00\x05tor")  # a record cut short by a crash
    s = Spill.open(tmp_path, fsync=False)
    assert len(s) == 3 and s.read(10) == [("b", b"2", True, 0), ("c", b"3", False, 2), ("d", b"4", False, 1)]
    s.commit()
    assert not (tmp_path / "outbox-0.spill").exists() and len(Spill.open(tmp_path)) == 0


def test_spill_messages_read_during_a_checkpoint_write_are_read_again_after_a_crash(tmp_path: Path) -> None:
    """The attack on the background checkpoint: the queue goes on reading the spill while a checkpoint's write runs.
    What it read after the cut is in no stored outbox, so the position the commit records must be the cut's; with
    the position of the moment of the commit, a kill -9 before the next checkpoint lost those messages (here 4 of
    them). Also: a spill read out after the cut is not deleted by that commit (its tail is still unconfirmed)."""
    from stream.state.spill import Spill

    msgs = [(f"t{i}", str(i).encode(), False, 1) for i in range(10)]
    s = Spill.open(tmp_path, fsync=False)
    s.append(msgs)
    s.sync()
    s.read(3)  # into memory before the cut: the cut's outbox holds them
    at_cut = s.read_pos
    s.read(4)  # read back while the checkpoint's write runs: in no stored outbox
    s.commit(at_cut)  # the checkpoint's commit
    s.close()  # kill -9 before the next checkpoint
    assert Spill.open(tmp_path, fsync=False).read(10) == msgs[3:]
    s = Spill.open(tmp_path, fsync=False)
    s.read(2)
    at_cut = s.read_pos
    s.read(10)  # read out after the cut
    s.commit(at_cut)
    s.close()
    assert (tmp_path / "outbox-0.spill").exists() and Spill.open(tmp_path, fsync=False).read(10) == msgs[5:]

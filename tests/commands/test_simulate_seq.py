"""Every device-side path we ship sends ``seq`` and a re-run does not reuse numbers."""

from __future__ import annotations

import itertools
import json

from tests.support import tops_text


def _simulate(*args: str) -> list[dict]:
    r = tops_text("simulate", *args, timeout=60)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_simulate_sends_seq_and_a_rerun_continues_above_it() -> None:
    first = _simulate("--streams", "2", "--ticks", "300")
    second = _simulate("--streams", "2", "--ticks", "300")
    for run in (first, second):
        for name in ("meter-1", "meter-2"):
            seqs = [m["seq"] for m in run if m["stream"] == name]
            assert len(seqs) == 300 and all(b == a + 1 for a, b in itertools.pairwise(seqs))
            assert all(type(s) is int and 0 <= s < 1 << 63 for s in seqs)
    assert min(m["seq"] for m in second) > max(m["seq"] for m in first)
    fixed = _simulate("--ticks", "3", "--seq-start", "7")
    assert [m["seq"] for m in fixed] == [7, 8, 9]
    r = tops_text("simulate", "--seq-start", "-1", timeout=60)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1

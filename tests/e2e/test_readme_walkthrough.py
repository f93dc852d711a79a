"""The README's MQTT walkthrough, run command for command from the README's own text, against a real Mosquitto.

The walkthrough is the section "Walkthrough: readings over MQTT". Its ```sh blocks are run in order, each with
``bash -e`` in one temporary directory, with a free port in place of 1883 and a ``tops`` on PATH that runs this
tree's ``python -m stream.cli``. The README's own words say where each command runs: the paragraph before a block
names its terminal ("In terminal 2, ..."), and a paragraph before a ```text block names the terminal that shows it
("Terminal 3 shows ..."); without a name, the terminal is the previous block's.

* A command runs in its terminal until it ends; the next command in the same terminal waits for it to end, and must
  find that it ended with status 0 (as a person at that terminal would see before typing the next one).
* A ```text block is what its terminal shows: the test waits until every line of it has appeared there, each line
  matched by a distinct line of output. ``...`` in a line stands for any text; a JSON line (after an optional topic)
  must have the same keys and the same values, except those the README says differ from run to run: times (``ts``),
  noisy values (``value``, the number after ``sum``) and the identity.
* A subscriber shows nothing until a message comes, so before ``mosquitto_sub`` starts the test leaves a retained
  probe on a topic its filter matches and waits for the probe to show: then the subscription is in place (a person
  sees no such line, and needs none: typing the next command takes longer than subscribing).
* At the end, Ctrl-C (SIGINT) goes to each terminal's command that still runs, the daemon first; the README says the
  daemon then exits 0.

Nothing waits a fixed time: every wait is for a line of output, a probe, or a process's end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import ROOT, free_port, wait_for

README = ROOT / "README.md"
HEADING = "## Walkthrough: readings over MQTT"
PORT_IN_README = "1883"
VARIES = {"ts", "value", "identity"}  # JSON keys whose values differ from run to run (the README says which)
NUMBER = r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?"
WILD = re.compile(r"(\.\.\.|(?<=\bsum )" + NUMBER + ")")  # "..." (any text) or a noisy sum's number
WAIT = 180.0  # seconds: the longest any one step may take on a loaded 2-core machine

pytestmark = [pytest.mark.network, pytest.mark.slow]


# -- the README's walkthrough, as data -----------------------------------------------------------------------------
@dataclass
class Step:
    kind: str  # "sh" (commands to run) or "text" (what a terminal shows)
    terminal: int
    body: str


def walkthrough_steps(text: str) -> list[Step]:
    """The walkthrough section's ```sh and ```text blocks in order, each with the terminal the README names."""
    start = text.index(HEADING) + len(HEADING)
    end = text.find("\n## ", start)
    section = text[start:] if end < 0 else text[start:end]
    steps: list[Step] = []
    terminal = 0
    pos = 0
    for m in re.finditer(r"^```(\w+)\n(.*?)^```$", section, flags=re.M | re.S):
        prose = section[pos:m.start()]
        pos = m.end()
        named = re.findall(r"\b[Tt]erminal (\d+)\b", prose)
        if named:
            terminal = int(named[-1])
        lang = m.group(1)
        if lang in ("sh", "text"):
            assert terminal, f"the README names no terminal before block {m.group(0)[:40]!r}"
            steps.append(Step(lang, terminal, m.group(2)))
    return steps


def line_matches(expected: str, actual: str) -> bool:
    """Whether one line of output is the line the README shows (see the module's docstring for the rules)."""
    expected, actual = expected.strip(), actual.strip()
    exp_json = _topic_and_json(expected)
    if exp_json is not None:
        act_json = _topic_and_json(actual)
        return act_json is not None and act_json[0] == exp_json[0] and _same_json(exp_json[1], act_json[1])
    pieces = WILD.split(expected)  # text at even places, "..." or a noisy number at odd ones
    pattern = "".join(re.escape(p) if i % 2 == 0 else ".*" if p == "..." else NUMBER for i, p in enumerate(pieces))
    return re.fullmatch(pattern, actual) is not None


def _topic_and_json(line: str) -> tuple[str, dict] | None:
    topic, _, rest = line.partition(" ")
    for head, body in (("", line), (topic, rest)):
        if body.startswith("{"):
            try:
                doc = json.loads(body)
            except json.JSONDecodeError:
                return None
            return (head, doc) if isinstance(doc, dict) else None
    return None


def _same_json(expected: object, actual: object) -> bool:
    if isinstance(expected, dict):
        return (isinstance(actual, dict) and expected.keys() == actual.keys()
                and all(k in VARIES or _same_json(v, actual[k]) for k, v in expected.items()))
    return type(expected) is type(actual) and expected == actual


def unmatched(expected_lines: list[str], actual_lines: list[str]) -> list[str]:
    """The expected lines that no distinct actual line matches."""
    free = list(actual_lines)
    missing = []
    for exp in expected_lines:
        hit = next((i for i, act in enumerate(free) if line_matches(exp, act)), None)
        if hit is None:
            missing.append(exp)
        else:
            free.pop(hit)
    return missing


# -- terminals ------------------------------------------------------------------------------------------------------
@dataclass
class Command:
    """One ```sh block running in its terminal: ``bash -e`` in its own process group, output collected by line."""

    proc: subprocess.Popen[bytes]
    lines: list[str] = field(default_factory=list)
    read_all: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, script: str, cwd: Path, env: dict[str, str]) -> Command:
        proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        cmd = cls(proc)
        threading.Thread(target=cmd._read, daemon=True).start()
        return cmd

    def ended(self) -> bool:
        """Whether it has ended and everything it wrote has been read (it can show nothing more)."""
        return self.read_all.is_set() and self.proc.poll() is not None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))
        self.read_all.set()

    def interrupt(self) -> int:
        """Ctrl-C in its terminal: SIGINT to its process group; its exit status."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout=WAIT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=WAIT)


def _shim(where: Path) -> Path:
    """A ``tops`` that runs this tree's code, so the README's commands run unchanged."""
    where.mkdir()
    tops = where / "tops"
    tops.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m stream.cli "$@"\n')
    tops.chmod(0o755)
    return where


def _probe_subscription(script: str, port: int, cwd: Path, env: dict[str, str]) -> tuple[str, str] | None:
    """For a ``mosquitto_sub`` block: a retained probe on a topic its filter matches, and the line it will show."""
    m = re.search(r"mosquitto_sub\b.*?-t\s+'([^']+)'", script)
    if m is None:
        return None
    topic = m.group(1).replace("#", "readme-probe").replace("+", "readme-probe")
    _publish(port, topic, "probe", cwd, env, retain=True)
    return topic, f"{topic} probe"


def _publish(port: int, topic: str, payload: str | None, cwd: Path, env: dict[str, str], *, retain: bool) -> None:
    cmd = ["mosquitto_pub", "-h", "localhost", "-p", str(port), "-t", topic, "-q", "1"]
    cmd += ["-r"] if retain else []
    cmd += ["-n"] if payload is None else ["-m", payload]
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, timeout=WAIT)


@pytest.fixture
def terminals() -> Iterator[dict[int, Command]]:
    running: dict[int, Command] = {}
    yield running
    for cmd in running.values():
        cmd.kill()


# -- the walkthrough ---------------------------------------------------------------------------------------------
def test_the_readme_walkthrough_runs_as_written_and_shows_what_it_says(tmp_path: Path, terminals) -> None:
    for tool in ("mosquitto", "mosquitto_pub", "mosquitto_sub"):
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin") is None:
            pytest.skip(f"{tool} is not installed (.ci/run installs it)")
    steps = walkthrough_steps(README.read_text())
    assert [s.kind for s in steps].count("sh") >= 5, "the walkthrough lost its commands"
    port = free_port()
    work = tmp_path / "walkthrough"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "PATH": f"{_shim(tmp_path / 'bin')}:{os.environ.get('PATH', '')}:/usr/sbin"}
    for step in steps:
        body = step.body.replace(PORT_IN_README, str(port))
        if step.kind == "sh":
            before = terminals.get(step.terminal)
            if before is not None:  # the terminal's previous command must have ended, and well
                rc = before.proc.wait(timeout=WAIT)
                assert rc == 0, f"terminal {step.terminal}: {before.lines[-20:]}"
            probe = _probe_subscription(body, port, work, env)
            terminals[step.terminal] = cmd = Command.start(body, work, env)
            if probe is not None:
                wait_for(lambda c=cmd, p=probe: any(line.strip() == p[1] for line in c.lines), WAIT,
                         what=f"the subscriber in terminal {step.terminal} to show the probe")
                _publish(port, probe[0], None, work, env, retain=True)  # the retained probe cleared
        else:
            cmd = terminals[step.terminal]
            expected = [line for line in body.splitlines() if line.strip()]
            wait_for(lambda c=cmd, e=expected: c.ended() or not unmatched(e, c.lines), WAIT,
                     what=f"terminal {step.terminal} to show what the README shows")
            missing = unmatched(expected, cmd.lines)
            assert not missing, f"terminal {step.terminal} did not show {missing}; it showed {cmd.lines[-30:]}"
    daemon = next(s.terminal for s in steps if s.kind == "sh" and "tops run" in s.body)
    assert terminals[daemon].interrupt() == 0, terminals[daemon].lines[-20:]
    for terminal in sorted(terminals, reverse=True):
        terminals[terminal].interrupt()


# -- the matching rules themselves -------------------------------------------------------------------------------
def test_a_readme_line_matches_output_only_where_the_readme_says_it_may_differ() -> None:
    shown = 'dp/m {"stream":"m","tick":3,"ts":1.5,"value":47.0,"epsilon":1.0,"theta":50.0}'
    assert line_matches(shown, 'dp/m {"stream":"m","tick":3,"ts":9.25,"value":-8.5,"epsilon":1.0,"theta":50.0}')
    assert not line_matches(shown, 'dp/m {"stream":"m","tick":4,"ts":1.5,"value":47.0,"epsilon":1.0,"theta":50.0}')
    assert not line_matches(shown, 'dp/m {"stream":"m","tick":3,"ts":1.5,"value":47.0,"epsilon":2.0,"theta":50.0}')
    assert not line_matches(shown, 'dp/x {"stream":"m","tick":3,"ts":1.5,"value":47.0,"epsilon":1.0,"theta":50.0}')
    assert not line_matches(shown, 'dp/m {"stream":"m","tick":3,"ts":1.5,"value":47.0,"epsilon":1.0}')
    answer = "kitchen  ticks 0..7  sum 183 +- 196 (95%, noise sd 100)  releases 8"
    assert line_matches(answer, "kitchen  ticks 0..7  sum -12.5 +- 196 (95%, noise sd 100)  releases 8")
    assert not line_matches(answer, "kitchen  ticks 0..7  sum 183 +- 197 (95%, noise sd 100)  releases 8")
    log = "... INFO connected to localhost:1883"
    assert line_matches(log, "12:00:00,001 tops.mqtt INFO connected to localhost:1883")
    assert not line_matches(log, "12:00:00,001 tops.mqtt INFO connected to localhost:1884")
    assert unmatched(["a", "a"], ["a"]) == ["a"]  # each shown line needs a line of its own

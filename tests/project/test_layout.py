"""The runtime's folders import in one direction (``commands -> daemon -> cluster -> state -> core -> operators``,
``device -> core``, ``query``, the consumer's side, beside ``commands``), ``operators`` never imports ``stream``, no
module imports one that imports it back, test modules take their shared helpers from tests/support.py, never from
another test module, and no method is reassigned at run time (layers are composed at construction)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support import ROOT

RANK = {"core": 0, "state": 1, "cluster": 2, "daemon": 3, "device": 2, "commands": 4, "query": 4}
ALLOWED = {"core": {"core"}, "state": {"core", "state"}, "cluster": {"core", "state", "cluster"},
           "daemon": {"core", "state", "cluster", "daemon"}, "device": {"core", "device"},
           "commands": {"core", "state", "cluster", "daemon", "commands", "query"},
           "query": {"core", "commands", "query"}}


def _imports(path: Path) -> set[str]:
    """Every ``stream.*`` / ``operators.*`` module a file imports, at any depth (lazy imports count too; imports
    under ``if TYPE_CHECKING:``, which never run, do not)."""
    out: set[str] = set()
    todo: list[ast.AST] = [ast.parse(path.read_text())]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        todo.extend(ast.iter_child_nodes(node))
    return {m for m in out if m.split(".")[0] in ("stream", "operators")}


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def test_folders_import_in_one_direction() -> None:
    bad = []
    for f in (ROOT / "stream").rglob("*.py"):
        parts = f.relative_to(ROOT / "stream").parts
        if len(parts) < 2:
            continue  # stream/cli.py dispatches to every command module
        for m in _imports(f):
            p = m.split(".")
            if p[0] == "stream" and len(p) > 1 and p[1] not in ALLOWED[parts[0]]:
                bad.append(f"{f.relative_to(ROOT)} imports {m}")
    assert not bad, bad


def test_operators_never_import_stream() -> None:
    bad = [str(f.relative_to(ROOT)) for f in (ROOT / "operators").rglob("*.py")
           if any(m.startswith("stream") for m in _imports(f))]
    assert not bad, bad


def test_no_import_cycles_between_modules() -> None:
    files = {_module(f): f for d in ("stream", "operators") for f in (ROOT / d).rglob("*.py")}
    graph = {m: {i for i in _imports(f) if i in files and i != m} for m, f in files.items()}
    cycles = []
    for a, deps in graph.items():
        for b in deps:
            seen, todo = set(), [b]
            while todo:
                x = todo.pop()
                if x == a:
                    cycles.append(f"{a} -> {b} -> ... -> {a}")
                    break
                if x not in seen:
                    seen.add(x)
                    todo.extend(graph.get(x, ()))
    assert not cycles, cycles


def test_test_modules_take_shared_helpers_from_the_support_module() -> None:
    """Helpers shared by test modules live in tests/support.py (fixtures in tests/conftest.py): no test module, and
    no benchmark, imports another test module or the conftest."""
    allowed = {"tests.support", "tests.reference", "tests.flood", "tests.audit._audit", "tests.query._coverage"}
    files = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
    bad = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            bad += [f"{f.relative_to(ROOT)} imports {m}" for m in names
                    if m.split(".")[0] == "tests" and m != "tests" and m not in allowed]
    assert not bad, bad


# Attributes that hold the router's intake and stream maker, and the MQTT link's client maker, message handler and
# acknowledgement mode: what durable state used to replace on the instances at run time. A layer is composed at
# construction instead.
REASSIGNED_NAMES = {"add", "add_many", "add_values", "record", "factory", "_client", "on_messages", "manual_ack"}
# Where paho-mqtt's and aiomqtt's internals may be touched (the one module that knows them).
PAHO_MODULE = "stream/daemon/mqtt_paho.py"


def _assigned_attributes(tree: ast.AST) -> list[tuple[int, ast.Attribute]]:
    """Every ``X.name = ...`` target (also inside tuples, augmented and annotated assignments), with its line."""
    out: list[tuple[int, ast.Attribute]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        while targets:
            t = targets.pop()
            if isinstance(t, ast.Tuple | ast.List):
                targets.extend(t.elts)
            elif isinstance(t, ast.Starred):
                targets.append(t.value)
            elif isinstance(t, ast.Attribute):
                out.append((node.lineno, t))
    return out


def _reaches_paho(node: ast.expr) -> bool:
    """Whether an expression names paho's client: a variable ``paho``, or ``something._client``."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        if isinstance(node, ast.Attribute) and node.attr == "_client":
            return True
        node = node.value if not isinstance(node, ast.Call) else node.func
    return isinstance(node, ast.Name) and node.id == "paho"


def test_no_method_is_reassigned_at_run_time() -> None:
    """Layers are composed when objects are built, never patched in afterwards: no ``type: ignore[method-assign]``
    anywhere; no assignment, from outside its class, to an attribute that holds the router's intake or stream
    maker or the MQTT link's client maker or message handler; and paho's client is changed only in the module that
    owns the connection."""
    bad = []
    for d in ("stream", "operators", "tests", "bench"):
        for f in sorted((ROOT / d).rglob("*.py")):
            rel = str(f.relative_to(ROOT))
            text = f.read_text()
            bad += [f"{rel}:{i}: method-assign ignored" for i, line in enumerate(text.splitlines(), 1)
                    if "ignore[method-assign" in line and rel != "tests/project/test_layout.py"]
            for line, t in _assigned_attributes(ast.parse(text)):
                outside = not (isinstance(t.value, ast.Name) and t.value.id == "self")
                if outside and t.attr in REASSIGNED_NAMES:
                    bad.append(f"{rel}:{line}: .{t.attr} assigned from outside its class")
                elif rel != PAHO_MODULE and _reaches_paho(t.value):
                    bad.append(f"{rel}:{line}: paho's client changed outside {PAHO_MODULE}")
    assert not bad, "\n".join(bad)


# The internals of paho-mqtt and aiomqtt the MQTT adapter relies on (stream/daemon/mqtt_paho.py, PRIVATES there).
PAHO_PRIVATES = re.compile(r"\._client\b|_packet_queue|loop_read|on_socket_open|_create_socket|manual_ack_set|"
                           r"_disconnected|\._sock\b|MQTTMessageInfo|_set_as_published|\._manual_ack\b|"
                           r"\._published\b|_mid_generate")


def test_paho_and_aiomqtt_internals_are_named_only_in_the_mqtt_adapter() -> None:
    """One module knows paho-mqtt's and aiomqtt's internals (pinned to the versions it was written for): nothing else
    in stream/ names one, so a new paho or aiomqtt is checked in one place."""
    bad = []
    for f in sorted((ROOT / "stream").rglob("*.py")):
        rel = str(f.relative_to(ROOT))
        if rel == PAHO_MODULE:
            continue
        bad += [f"{rel}:{i}: {m.group(0)}" for i, line in enumerate(f.read_text().splitlines(), 1)
                for m in PAHO_PRIVATES.finditer(line)]
    assert not bad, "\n".join(bad)

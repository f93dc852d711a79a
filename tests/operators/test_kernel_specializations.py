"""A compiled function never passes a bare constant to another compiled function.

numba compiles a compiled function again for every new combination of argument types, and a bare constant passed
from one compiled function to another is a type of its own (``Literal[int](0)``, ``Literal[bool](True)``): each
such call adds a specialization to the first compile of a fresh install, which a daemon pays with its event loop held
at its first holdout end (typed values, ``np.int64(0)``, share one). Read from the source: every call between the
compiled functions of the kernel modules (operators/ and stream/), its arguments.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import ROOT

KERNELS = sorted(p for part in ("operators", "stream") for p in (ROOT / part).rglob("*.py")
                 if "numba.njit" in p.read_text())


def compiled_functions(tree: ast.Module) -> set[str]:
    """The module's compiled functions that are compiled on their own (``inline="always"`` ones are inlined into
    their caller's code, constants and all)."""
    return {f.name for f in tree.body if isinstance(f, ast.FunctionDef)
            and any("njit" in ast.unparse(d) and "inline" not in ast.unparse(d) for d in f.decorator_list)}


def bare_constants_passed(path: Path, compiled: set[str]) -> list[str]:
    tree = ast.parse(path.read_text())
    constants = {t.id for a in tree.body if isinstance(a, ast.Assign) for t in a.targets if isinstance(t, ast.Name)}
    found = []
    for f in tree.body:
        if not (isinstance(f, ast.FunctionDef) and f.name in compiled):
            continue
        for call in ast.walk(f):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in compiled):
                continue
            for arg in call.args:
                value = arg.operand if isinstance(arg, ast.UnaryOp) else arg
                if isinstance(value, ast.Constant) or (isinstance(value, ast.Name) and value.id in constants):
                    found.append(f"{path.name}:{call.lineno} {f.name} -> {ast.unparse(call)}")
    return found


def test_the_kernel_modules_are_found() -> None:
    assert {p.name for p in KERNELS} >= {"_dlap_kernel.py", "_refill_kernel.py", "_selection_kernel.py",
                                         "_line_scan.py"}


@pytest.mark.parametrize("path", KERNELS, ids=lambda p: p.name)
def test_compiled_functions_pass_typed_values_not_bare_constants(path: Path) -> None:
    compiled = set().union(*(compiled_functions(ast.parse(p.read_text())) for p in KERNELS))
    assert bare_constants_passed(path, compiled) == []


def test_a_bare_constant_is_seen(tmp_path: Path) -> None:
    """The check itself: a call with a literal, or a module constant, is reported."""
    source = tmp_path / "k.py"
    source.write_text("import numba\nN = 8\n@numba.njit\ndef f(a, b):\n    return a\n"
                      "@numba.njit\ndef g(x):\n    return f(x, 0) + f(x, N) + f(x, -1) + f(x, x)\n")
    assert len(bare_constants_passed(source, {"f", "g"})) == 3

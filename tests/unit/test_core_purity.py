"""hopsmgr.core and the scheduler state machine (hopsmgr.control) stay pure: no I/O, no clock, no
logging, no event loop; only core/ilp.py talks to PuLP; the machine imports no driver."""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

import pytest

import hopsmgr.control
import hopsmgr.core

CORE = Path(hopsmgr.core.__file__).resolve().parent
CONTROL = Path(hopsmgr.control.__file__).resolve().parent
MODULES = sorted(CORE.glob("*.py")) + sorted(CONTROL.glob("*.py"))
DRIVERS = ("hopsmgr.master", "hopsmgr.sim", "hopsmgr.cli", "hopsmgr.local", "hopsmgr.node")

BANNED = frozenset(
    {
        "asyncio",
        "aiohttp",
        "asyncssh",
        "sqlite3",
        "structlog",
        "logging",
        "pynvml",
        "torch",
        "time",
        "datetime",
        "socket",
        "subprocess",
        "os",
    }
)
SOLVER = "pulp"
SOLVER_MODULE = "ilp.py"


def imported_roots(source: str) -> set[str]:
    """Top-level names of every module `source` imports (absolute imports; relative ones are local)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call):
            func = node.func
            # __import__("x") / importlib.import_module("x") would dodge the checks above.
            if isinstance(func, ast.Name) and func.id == "__import__":
                roots.add("<dynamic import>")
            if isinstance(func, ast.Attribute) and func.attr == "import_module":
                roots.add("<dynamic import>")
    return roots


def clock_reads(source: str) -> list[str]:
    """`time.<x>` and `datetime.now`-style uses in code (comments and strings do not count)."""
    tokens = [
        t
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    ]
    found: list[str] = []
    for k in range(len(tokens) - 2):
        prev = tokens[k - 1] if k > 0 else None
        name, dot, attr = tokens[k], tokens[k + 1], tokens[k + 2]
        if name.type != tokenize.NAME or dot.string != "." or attr.type != tokenize.NAME:
            continue
        if prev is not None and prev.string == ".":
            continue  # an attribute of something else (self.time.x)
        if name.string == "time":
            found.append(f"line {name.start[0]}: time.{attr.string}")
        if name.string in ("datetime", "date") and attr.string in ("now", "utcnow", "today"):
            found.append(f"line {name.start[0]}: {name.string}.{attr.string}")
    return found


def test_core_modules_found() -> None:
    names = {p.name for p in MODULES}
    assert {"planner.py", "ilp.py", "model.py", "lifecycle.py", "reconcile.py", "window.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_banned_imports(path: Path) -> None:
    roots = imported_roots(path.read_text(encoding="utf-8"))
    assert not roots & BANNED, f"{path.name} imports {sorted(roots & BANNED)}"
    assert "<dynamic import>" not in roots, f"{path.name} imports dynamically"
    if path.name != SOLVER_MODULE:
        assert SOLVER not in roots, f"{path.name} imports {SOLVER}; only {SOLVER_MODULE} may"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_only_stdlib_project_and_solver_imports(path: Path) -> None:
    roots = imported_roots(path.read_text(encoding="utf-8"))
    allowed = set(sys.stdlib_module_names) | {"hopsmgr", "__future__", SOLVER}
    assert roots <= allowed, f"{path.name} imports third-party {sorted(roots - allowed)}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_clock_reads(path: Path) -> None:
    assert clock_reads(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", sorted(CONTROL.glob("*.py")), ids=lambda p: p.name)
def test_the_state_machine_imports_no_driver(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in modules if m.startswith(DRIVERS)], f"{path.name} imports a driver"


def test_ilp_is_the_module_that_uses_the_solver() -> None:
    assert SOLVER in imported_roots((CORE / SOLVER_MODULE).read_text(encoding="utf-8"))


# The checkers themselves must catch what they are meant to catch.


@pytest.mark.parametrize(
    ("source", "root"),
    [
        ("import os\n", "os"),
        ("import os.path as p\n", "os"),
        ("from time import monotonic\n", "time"),
        ("from datetime import datetime\n", "datetime"),
        ("def f():\n    import logging\n", "logging"),
        ("import asyncio, json\n", "asyncio"),
        ("x = __import__('socket')\n", "<dynamic import>"),
        ("import importlib\nm = importlib.import_module('subprocess')\n", "<dynamic import>"),
    ],
)
def test_import_checker_catches(source: str, root: str) -> None:
    assert root in imported_roots(source)


def test_import_checker_ignores_relative_imports() -> None:
    assert imported_roots("from . import model\nfrom .os import x\n") == set()


@pytest.mark.parametrize(
    "source",
    ["t = time.monotonic()\n", "now = datetime.now()\n", "d = date.today()\n", "f = time.time\n"],
)
def test_clock_checker_catches(source: str) -> None:
    assert clock_reads(source)


@pytest.mark.parametrize(
    "source",
    [
        "# time.monotonic() in a comment\n",
        "s = 'time.time()'\n",
        "t = self.time.value\n",
        "timer = lambda: 0.0\nx = timer()\n",
        '"""Reads no clock: not time.monotonic()."""\n',
    ],
)
def test_clock_checker_ignores(source: str) -> None:
    assert clock_reads(source) == []

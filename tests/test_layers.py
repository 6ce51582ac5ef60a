"""The package's rooms import each other in one direction only (ARCHITECTURE.md):

    cli -> spark -> options -> transport -> dialects -> foundation (errors, wire, connections)

- options/ (the registry, read by spark/ and cli/ alike) and transport/ never import spark/ or
  pyspark: the CLI and other programs use them without Spark;
- dialects/ never import transport/, spark/ or cli/: they hold SQL and know nothing of the operations;
- the foundation modules import only each other;
- nothing imports cli/ but cli/ itself (and the package's lazy `python -m` entry).

Read from the source (every import statement, at module level or inside a function), not by importing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "spark_qtransport"
ROOT = "spark_qtransport"
FOUNDATION = {"errors", "wire", "connections"}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of every module `path` imports (relative imports resolved)."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from . import session`
    return found


def _room(name: str) -> str | None:
    """The room of a module of ours: spark, transport, dialects, cli, foundation or top (the package)."""
    if name == ROOT:
        return "top"
    if not name.startswith(ROOT + "."):
        return None
    first = name.split(".")[1]
    if first in FOUNDATION:
        return "foundation"
    return first if first in {"spark", "options", "transport", "dialects", "cli"} else None


ALLOWED = {
    "foundation": {"foundation"},
    "dialects": {"dialects", "foundation"},
    "transport": {"transport", "dialects", "foundation"},
    "options": {"options", "transport", "dialects", "foundation"},
    "spark": {"spark", "options", "transport", "dialects", "foundation", "top"},
    "cli": {"cli", "spark", "options", "transport", "dialects", "foundation", "top"},
    "top": {"spark", "foundation"},
}
FORBIDDEN_THIRD_PARTY = {"options": ("pyspark",), "transport": ("pyspark",), "dialects": ("pyspark",), "foundation": ("pyspark",)}


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_module_imports_only_the_rooms_below_it(path: Path) -> None:
    room = _room(_module(path))
    assert room is not None, f"{path} is in no room: add it to one (ARCHITECTURE.md)"
    wrong = []
    for name in sorted(_imports(path)):
        target = _room(name)
        if target is not None and target not in ALLOWED[room] and _module_exists(name):
            wrong.append(name)
        if any(name == p or name.startswith(p + ".") for p in FORBIDDEN_THIRD_PARTY.get(room, ())):
            wrong.append(name)
    assert not wrong, f"{_module(path)} ({room}) imports {wrong}"


def _module_exists(name: str) -> bool:
    """A module or package of ours (`from .x import Name` adds `x.Name`, which is not a module)."""
    rel = Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def test_the_rooms_are_what_the_check_reads() -> None:
    """The check itself sees imports: it finds transport's use of the dialects and spark's of transport."""
    receiving = {n for p in (PACKAGE / "transport").rglob("*.py") for n in _imports(p)}
    assert any(n.startswith("spark_qtransport.dialects") for n in receiving)
    reader = _imports(PACKAGE / "spark" / "reader.py")
    assert any(n.startswith("spark_qtransport.transport") for n in reader)
    assert _room("spark_qtransport.cli.embedded") == "cli"


def test_the_map_names_every_module() -> None:
    """ARCHITECTURE.md's map names each module of the package by its file name (`values.py`: a
    dialect's modules are named once for all dialects), so a new room or module lands on the map. A
    word of the prose does not count: "plain values" does not name `values.py`."""
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text(encoding="utf-8")
    missing = [str(p.relative_to(PACKAGE)) for p in _sources()
               if p.name != "__init__.py" and not re.search(rf"(?<![\w.]){re.escape(p.name)}(?!\w)", text)]
    assert missing == []


#: a five-character SQLSTATE as a string literal ("42704", "53200", "40P01")
_SQLSTATE = re.compile(r"[0-9][0-9A-Z][0-9A-Z]{3}")


@pytest.mark.parametrize("room", ["transport", "spark", "cli"])
def test_no_sqlstate_above_the_dialects(room: str) -> None:
    """Which driver error means what is the dialect's to say (`DriverSupport.is_transient`,
    `is_out_of_prepared_slots`, `is_unknown_prepared`...): a SQLSTATE written above the dialects
    is a second classification that the other dialect never gets."""
    found = [f"{p.relative_to(PACKAGE)}:{node.lineno} {node.value!r}"
             for p in sorted((PACKAGE / room).rglob("*.py"))
             for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQLSTATE.fullmatch(node.value)
             and not node.value.endswith(("KB", "MB", "GB", "TB"))]  # a setting's size ("256MB")
    assert found == []


def imports_of(path: Path) -> set[str]:
    """The modules of ours `path` imports (a name imported from a module counts as the module;
    ``from .. import session`` imports the submodule, not what the package's __init__ holds)."""
    found = set()
    for name in _imports(path):
        while name != ROOT and name.startswith(ROOT + ".") and not _module_exists(name):
            name = name.rsplit(".", 1)[0]
        if name.startswith(ROOT + ".") and name != _module(path):
            found.add(name)
    return {n for n in found if not any(o.startswith(n + ".") for o in found)
            or not (PACKAGE / Path(*n.split(".")[1:]) / "__init__.py").exists()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for t in graph[m]:
            if t not in index:
                visit(t)
                low[m] = min(low[m], low[t])
            elif t in stack:
                low[m] = min(low[m], index[t])
        if low[m] == index[m]:
            group = []
            while True:
                t = stack.pop()
                group.append(t)
                if t == m:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return groups


def test_no_import_circle() -> None:
    """No module of the package reaches itself through its imports (imports inside functions and
    under TYPE_CHECKING count: they are the same knot). The receive side was one circle of eleven
    modules (platform.after, acker, claimer, mover, planner, prepared, receiver, sessions, setup,
    slices, warden): which module is below which could not be told. tests/module_map.py prints
    the map."""
    modules = {_module(p): p for p in _sources()}
    graph = {m: {t for t in imports_of(p) if t in modules} for m, p in modules.items()}
    assert circles(graph) == []


#: transport's sub-packages from the lowest: each imports only those before it (the platform's copies
#: know nothing of claims; the receive side knows nothing of installers or the CLI's doctor)
TRANSPORT_PACKAGES = ("platform", "receiving", "sending", "operations")


def test_transport_packages_import_one_way() -> None:
    """The layer check above sees rooms, not transport's sub-packages: the receive side and the
    platform imported each other (the platform's after-processing read claims and moved poison),
    and so did the receive side and the operations (an installer's warning)."""
    assert {p.name for p in (PACKAGE / "transport").iterdir() if (p / "__init__.py").exists()} == set(TRANSPORT_PACKAGES)
    wrong = []
    for path in _sources():
        parts = _module(path).split(".")
        if len(parts) < 3 or parts[1] != "transport" or parts[2] not in TRANSPORT_PACKAGES:
            continue
        below = TRANSPORT_PACKAGES[:TRANSPORT_PACKAGES.index(parts[2])]
        for name in sorted(_imports(path)):
            target = name.split(".")
            if (len(target) >= 3 and target[1] == "transport" and target[2] in TRANSPORT_PACKAGES
                    and target[2] != parts[2] and target[2] not in below):
                wrong.append(f"{_module(path)} imports {name}")
    assert wrong == []

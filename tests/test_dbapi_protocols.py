"""The DB-API protocols (`dialects/base/dbapi.py`) fit both drivers, and the seam uses them.

Unit tier (conftest.py marks it: no database, no Spark fixture). The drivers' classes are checked
as classes: no connection is opened. mypy checks psycopg's fit statically too, where
`PostgresDriver.connect` returns a `psycopg.Connection` as a `Connection`; pyodbc has no type
information mypy reads, so this test is where pyodbc's members are checked at all.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from spark_qtransport.dialects import Connection, Cursor

try:  # Python 3.13+
    from typing import get_protocol_members
except ImportError:
    from typing_extensions import get_protocol_members

PACKAGE = Path(__file__).resolve().parent.parent / "spark_qtransport"

#: the members, on purpose: a new one is a DB-API call the seam makes (and both drivers must have),
#: never a driver's own (reach that inside its dialect: `psycopg_connection`, `pyodbc_connection`)
CURSOR_MEMBERS = {"description", "rowcount", "execute", "fetchone", "fetchall", "fetchmany", "nextset", "close"}
CONNECTION_MEMBERS = {"autocommit", "cursor", "commit", "rollback", "close"}
#: members read or set as attributes (properties on psycopg, descriptors on pyodbc); the rest are called
ATTRIBUTES = {"description", "rowcount", "autocommit"}


def test_the_protocols_are_the_members_the_seam_uses() -> None:
    assert set(get_protocol_members(Cursor)) == CURSOR_MEMBERS
    assert set(get_protocol_members(Connection)) == CONNECTION_MEMBERS


@pytest.mark.parametrize("driver", ["psycopg", "pyodbc"])
def test_each_driver_has_every_member(driver: str) -> None:
    module = pytest.importorskip(driver)
    for cls, protocol in ((module.Connection, Connection), (module.Cursor, Cursor)):
        for name in sorted(get_protocol_members(protocol)):
            found = inspect.getattr_static(cls, name, None)
            assert found is not None, f"{driver}.{cls.__name__} has no {name}"
            if name in ATTRIBUTES:  # a property or a C descriptor, never a plain method
                assert not inspect.isroutine(found), f"{driver}.{cls.__name__}.{name} is a method"
            else:
                assert callable(getattr(cls, name)), f"{driver}.{cls.__name__}.{name} is not callable"
        # the class has every member, as runtime_checkable's isinstance sees it
        assert isinstance(cls, protocol), f"{driver}.{cls.__name__} is not a {protocol.__name__}"


# -- nothing on the seam is typed Any ---------------------------------------------------------------

#: the names a connection or cursor goes by in the package
DB_NAMES = {"cur", "conn", "cursor", "connection"}


def _mentions_any(annotation: ast.expr | None) -> bool:
    return annotation is not None and any(
        (isinstance(n, ast.Name) and n.id == "Any") or (isinstance(n, ast.Attribute) and n.attr == "Any")
        or (isinstance(n, ast.Constant) and isinstance(n.value, str) and "Any" in n.value)
        for n in ast.walk(annotation))


def _typed_any(package: Path = PACKAGE) -> list[str]:
    """Where a parameter or an annotated attribute named as in `DB_NAMES` is typed with `Any`."""
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package.parent)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                    if arg.arg in DB_NAMES and _mentions_any(arg.annotation):
                        found.append(f"{where}:{arg.lineno} {node.name}({arg.arg}: {ast.unparse(arg.annotation)})")
            elif isinstance(node, ast.AnnAssign):  # `conn: Any = None`, `self.cur: Any = None`
                target = node.target
                name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
                if name in DB_NAMES and _mentions_any(node.annotation):
                    found.append(f"{where}:{node.lineno} {ast.unparse(target)}: {ast.unparse(node.annotation)}")
    return found


def test_no_connection_or_cursor_is_typed_any() -> None:
    assert _typed_any() == []


def test_the_check_sees_an_any(tmp_path: Path) -> None:
    """The check itself finds parameters and an attribute typed with `Any` (inside a union or a
    `Callable` too), and leaves other names and other types alone."""
    package = tmp_path / "spark_qtransport"
    package.mkdir()
    (package / "m.py").write_text(
        "from typing import Any\n"
        "def f(cur: Any, conn: 'Any | None', other: Any, cursor: Cursor,\n"
        "      connection: Callable[[], typing.Any]) -> None:\n"
        "    self.cursor: Any = None\n"
        "    self.conn: Connection | None = None\n")
    assert [line.split(" ", 1)[1] for line in _typed_any(package)] == [
        "f(cur: Any)", "f(conn: 'Any | None')", "f(connection: Callable[[], typing.Any])", "self.cursor: Any"]

"""Small DB-API helpers shared by the queue operations: run a dialect `Statement`, read its answer."""

from __future__ import annotations

from typing import Any

from ..dialects import Statement

__all__ = ["args", "execute", "first", "one", "columns", "rowcount", "rollback", "close"]


def args(stmt: Statement) -> tuple[Any, ...]:
    return (stmt.sql,) if stmt.params is None else (stmt.sql, stmt.params)


def execute(cur: Any, stmt: Statement) -> Any:
    cur.execute(*args(stmt))
    return cur


def first(cur: Any, stmt: Statement) -> Any:
    cur.execute(*args(stmt))
    return cur.fetchone()


def one(cur: Any, stmt: Statement) -> tuple[Any, ...]:
    cur.execute(*args(stmt))
    row = cur.fetchone()
    return tuple(row) if row is not None else (None,)


def columns(cur: Any, stmt: Statement) -> dict[str, str]:
    cur.execute(*args(stmt))
    return {str(name).lower(): str(typ) for name, typ in cur.fetchall()}


def rowcount(cur: Any, stmt: Statement) -> int:
    cur.execute(*args(stmt))
    return max(int(cur.rowcount), 0)


def rollback(conn: Any) -> None:
    try:
        conn.rollback()
    except Exception:  # noqa: BLE001 - the connection may be gone; the caller raises the real error
        pass


def close(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - see _rollback
        pass

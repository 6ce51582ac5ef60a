"""Small DB-API helpers shared by the queue operations: run a dialect `Statement`, read its answer."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..dialects import Dialect, Statement
from ..errors import QTransportError

__all__ = ["args", "execute", "first", "one", "columns", "rowcount", "rollback", "close", "retrying"]

log = logging.getLogger("spark_qtransport.db")

T = TypeVar("T")

#: attempts of one transaction that meets transient faults (connection lost, deadlock victim...)
RETRIES = 4


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


def retrying(
    dialect: Dialect,
    fn: Callable[[Any], T],
    *,
    connection: Callable[[], Any],
    discard: Callable[[Any], None],
    what: str,
    explain: Callable[[Exception], Exception] | None = None,
) -> T:
    """Run `fn(conn)` in a transaction and commit; after a transient fault, `discard` the
    connection, wait (0.2 s, doubling, at most 5 s) and run it again on a new one, at most
    `RETRIES` times. Our own errors and persistent faults roll back and propagate (through
    `explain`, when given)."""
    delay = 0.2
    for attempt in range(1, RETRIES + 1):
        conn = connection()
        try:
            result = fn(conn)
            conn.commit()
            return result
        except QTransportError:
            rollback(conn)
            raise
        except Exception as exc:
            if not dialect.is_transient(exc) or attempt == RETRIES:
                rollback(conn)
                if explain is None:
                    raise
                raise explain(exc) from exc
            log.warning("%s failed (%s); retrying in %.1fs", what, exc, delay)
            discard(conn)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")

"""Small DB-API helpers shared by the queue operations: run a dialect `Statement`, read its answer."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..dialects import Dialect, Statement
from ..errors import DatabaseError, QTransportError, QueueNotFoundError

__all__ = ["args", "execute", "first", "one", "rows", "columns", "rowcount", "rollback", "close", "describe", "explain", "retrying"]

log = logging.getLogger("spark_qtransport.db")

T = TypeVar("T")

#: attempts of one transaction that meets transient faults (connection lost, deadlock victim,
#: server restarting): waits of 0.2, 0.4, 0.8, 1.6 and 3.2 s between them ride out a restart
RETRIES = 6


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


def rows(cur: Any, stmt: Statement) -> list[Any]:
    cur.execute(*args(stmt))
    return cur.fetchall()  # type: ignore[no-any-return]


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


def describe(dialect: Dialect, exc: BaseException) -> str:
    """One line about an error for a log: ours as they are; a driver's without the lines that
    may quote row contents (see `Dialect.error_text`)."""
    return str(exc) if isinstance(exc, QTransportError) else dialect.error_text(exc)


def explain(dialect: Dialect, what: str, exc: Exception) -> QTransportError:
    """Our error for a driver error that is final: one line that names the operation (and with it
    the queue) and the driver's primary message, never the row contents or password a driver's
    full text may hold. Raise it `from exc`: the driver's error stays its cause."""
    text = dialect.error_text(exc)
    if dialect.is_undefined_table(exc):
        return QueueNotFoundError(f"{what}: a table does not exist ({text})")
    return DatabaseError(f"{what} failed: {type(exc).__name__}: {text}")


def retrying(
    dialect: Dialect,
    fn: Callable[[Any], T],
    *,
    connection: Callable[[], Any],
    discard: Callable[[Any], None],
    what: str,
) -> T:
    """Run `fn(conn)` in a transaction and commit. After a transient fault (in `fn`, at commit or
    while connecting) `discard` the connection, wait (0.2 s, doubling, at most 5 s) and run it
    again on a new one, at most `RETRIES` times. Our own errors propagate as they are. A
    permanent fault (`Dialect.is_transient` false: a wrong password, a missing database or
    table, no permission) at once, or a transient one on the last attempt, rolls back and is
    raised as `QueueNotFoundError` / `DatabaseError` naming `what`, on one line, with the
    driver's error as its cause.

    `fn` must be safe to run again after a failure whose commit may or may not have happened
    (the dispatch finds its own outbox record; claims and acknowledgements are idempotent)."""
    delay = 0.2
    for attempt in range(1, RETRIES + 1):
        conn = None
        try:
            conn = connection()
            result = fn(conn)
            conn.commit()
            return result
        except QTransportError:
            if conn is not None:
                rollback(conn)
            raise
        except Exception as exc:
            if conn is not None:
                rollback(conn)
            if not dialect.is_transient(exc) or attempt == RETRIES:
                raise explain(dialect, what, exc) from exc
            log.warning("%s failed (%s); retrying in %.1fs", what, dialect.error_text(exc), delay)
            if conn is not None:
                discard(conn)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")

"""Executor connections: the idle connection a Python worker keeps between Spark tasks.

A cached connection may have been dropped by the server since the last task (idle timeout,
failover, an administrator). Using it fails on the first statement, before anything was read or
written, so the task's first step is retried once on a fresh connection.
"""

from __future__ import annotations

from collections.abc import Callable
from logging import Logger
from typing import TypeVar

from ..connections import ConnectionCache, ConnectionURL
from ..dialects import Connection, Dialect
from . import session as db

__all__ = ["EXECUTOR_CONNECTIONS", "cached_connection", "give_back"]

T = TypeVar("T")

#: idle connections of this Python worker, shared by reads (receive) and staging (send) tasks
EXECUTOR_CONNECTIONS: ConnectionCache[Connection] = ConnectionCache()


def cached_connection(dialect: Dialect, url: ConnectionURL, first_step: Callable[[Connection], T],
                      *, what: str, log: Logger) -> tuple[Connection, T]:
    """This worker's cached connection to `url` (or a new one) and what `first_step(conn)` returned.
    A transient fault in the first step closes that connection and runs it once more on a new one;
    any other failure closes it and propagates. The replacement is logged (info) on `log`, the
    caller's logger."""
    for attempt in (1, 2):
        conn = EXECUTOR_CONNECTIONS.get(url, dialect.connect)
        try:
            return conn, first_step(conn)
        except Exception as exc:
            db.close(conn)
            if attempt == 2 or not dialect.is_transient(exc):
                raise
            log.info("reconnecting for %s: %s", what, db.describe(dialect, exc))
    raise AssertionError("unreachable")


def give_back(url: ConnectionURL, conn: Connection) -> None:
    """Keep a healthy connection (no open transaction) for this worker's next task."""
    EXECUTOR_CONNECTIONS.put(url, conn)

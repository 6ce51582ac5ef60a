"""The driver: connecting, transactions (savepoints) and the one classification of its errors."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from .dbapi import Connection, Cursor
from .values import Statement, one_line


class DriverSupport(ABC):
    """What runs statements: connections, savepoints, errors."""

    def streaming_cursor(self, conn: Connection) -> Cursor:
        """A cursor whose fetchmany() streams rows instead of holding the whole result in memory."""
        return conn.cursor()

    def page_cursor(self, conn: Connection) -> Cursor:
        """A cursor for one page of a slice's read (`ReceiveSql.read_in_pages`), closed once read."""
        return conn.cursor()

    @abstractmethod
    def connect(self, url: Any) -> Connection:
        """Open a DB-API connection (autocommit off, READ COMMITTED) for a `ConnectionURL`."""

    # -- connections that hang (see transport/watchdog.py) ----------------------------------------

    def backend_of(self, conn: Connection) -> Any:
        """The server's id of `conn`'s session, for `is_working`; None: this dialect's hangs are
        left to the driver's own timeout (`connect` sets it)."""
        return None

    def is_working(self, probe: Connection, backend: Any) -> bool:
        """Asked on another connection (`probe`): is the server running a statement of `backend`
        now? False when it waits for the client, or the session is gone."""
        return False

    def cut(self, conn: Connection) -> None:
        """End `conn`'s socket under a thread blocked on it: its read fails at once, as if the
        server had closed it. By default `conn` is closed."""
        conn.close()

    def savepoint(self, name: str) -> Statement:
        return Statement(f"SAVEPOINT {name}")

    def rollback_to_savepoint(self, name: str) -> Statement:
        return Statement(f"ROLLBACK TO SAVEPOINT {name}")

    def release_savepoint(self, name: str) -> Statement | None:
        return Statement(f"RELEASE SAVEPOINT {name}")

    @abstractmethod
    def is_transient(self, exc: BaseException) -> bool:
        """True for faults worth a retry on a new connection (connection lost, deadlock victim...)."""

    @abstractmethod
    def is_out_of_connections(self, exc: BaseException) -> bool:
        """True when the server refused a connection because it has none left (PostgreSQL's
        max_connections, a role's or database's CONNECTION LIMIT; SQL Server's user connections).
        Waited on briefly, then reported in one line (`session.with_retries`), never ridden
        through as an outage: holding on does not free a slot."""

    @abstractmethod
    def connection_limit(self) -> Statement:
        """One row, one column: the server's connection limit (for the error when it is reached)."""

    @abstractmethod
    def is_driver_error(self, exc: BaseException) -> bool:
        """True for the driver's own errors (the database or the connection failed); other
        exceptions are bugs or bad input and are never retried or reported as database failures."""

    @abstractmethod
    def sqlstate(self, exc: BaseException) -> str | None:
        """The driver error's SQLSTATE, if it has one."""

    @abstractmethod
    def is_undefined_table(self, exc: BaseException) -> bool:
        """True when the error says a table does not exist."""

    def is_out_of_prepared_slots(self, exc: BaseException) -> bool:
        """True when PREPARE TRANSACTION failed because the server has no slot for it (all of its
        prepared transactions in use, or none allowed): the claim is rolled back and held in the
        claim table instead. False where the database has no prepared transactions."""
        return False

    def is_unknown_prepared(self, exc: BaseException) -> bool:
        """True when COMMIT or ROLLBACK PREPARED failed because no prepared transaction has that
        gid (committed or parked before)."""
        return False

    #: SQLSTATEs of "already exists" that idempotent DDL (CREATE ... IF NOT EXISTS) meets when
    #: another installer creates the same object at the same moment; empty: none is expected
    ddl_race_states: frozenset[str] = frozenset()

    def is_concurrent_ddl(self, exc: BaseException) -> bool:
        """True when idempotent DDL failed only because a concurrent installer created the object
        first (see `ddl_race_states`): running it again finds the object and does nothing."""
        return self.is_driver_error(exc) and self.sqlstate(exc) in self.ddl_race_states

    def error_text(self, exc: BaseException) -> str:
        """The driver's primary message on one line, for our errors and logs: never the lines a
        database adds that may copy row contents (PostgreSQL's DETAIL, CONTEXT, HINT), never a
        password."""
        return one_line(str(exc)) or type(exc).__name__

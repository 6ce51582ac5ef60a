"""psycopg 3: connecting, and the one classification of its errors."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any, cast

from ...connections import mask
from ..base import Connection, Cursor, DriverSupport, Statement, one_line

if TYPE_CHECKING:
    import psycopg
    from psycopg.rows import TupleRow

# A server error carries its SQLSTATE: transient are those below and class 08 (connection
# exception); everything else (28P01/28000 authentication, 3D000 no database, 42501 permission,
# 42P01/42703 undefined table/column, 23514 check violation, 42602/3F000/42704 bad names...)
# is permanent and fails at once. Errors raised while connecting, and by libpq or psycopg
# themselves, have no SQLSTATE (psycopg 3 leaves it None): they are judged by libpq's message,
# permanent fragments first, and are permanent unless a fragment says the connection was lost,
# refused or timed out, or the server is starting, stopping or full.
_TRANSIENT_STATES = frozenset({
    "40001",  # serialization failure
    "40P01",  # deadlock detected
    "55P03",  # lock not available (lock_timeout)
    "53300",  # too many connections
    "57P01",  # terminating connection due to administrator command
    "57P02",  # crash shutdown
    "57P03",  # cannot connect now (starting up, shutting down)
    "57P05",  # terminating connection due to idle-session timeout
})


#: libpq's words for a server with no connection left (53300, which it does not carry while connecting)
_NO_SLOTS = (
    "sorry, too many clients already",
    "too many connections",  # per role, per database
    "remaining connection slots are reserved",
)

_PERMANENT_MESSAGES = (
    "password authentication failed",  # 28P01
    "authentication failed",  # 28000 (ident, peer, ldap...)
    "no password supplied",
    "no pg_hba.conf entry",  # 28000
    "is not permitted to log in",  # 28000
    "does not exist",  # 3D000 database, 28000 role
    "permission denied",  # 42501
    "could not translate host name",  # unknown host (libpq)
    "name or service not known",  # unknown host (getaddrinfo, glibc)
    "nodename nor servname",  # unknown host (getaddrinfo, BSD / macOS)
    "no address associated with hostname",
    "failed to resolve host",  # psycopg's own resolver, whatever the reason
    "invalid connection option",
    "invalid dsn",
    "certificate",  # TLS verification failed
)


_TRANSIENT_MESSAGES = (
    "connection refused",
    "server closed the connection unexpectedly",
    "terminating connection",
    "timeout expired",  # libpq connect_timeout, psycopg's "connection timeout expired"
    "connection timed out",
    "connection reset",
    "broken pipe",
    "could not receive data from server",
    "could not send data to server",
    "ssl syscall error",
    # psycopg's own InternalError when a session is terminated while a FETCH's rows arrive: the
    # rows and the FATAL error come back as two results of one command (seen in the chaos suite)
    "results from command",
    "ssl connection has been closed unexpectedly",
    "no connection to the server",
    "the connection is closed",
    "the connection is lost",
    "connection is bad",
    "consuming input failed",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    *_NO_SLOTS,
    "network is unreachable",
    "no route to host",
    "temporary failure in name resolution",  # the resolver, not the name, failed
)


def psycopg_connection(conn: Connection) -> psycopg.Connection[TupleRow]:
    """`conn` as what it is on this dialect: the psycopg connection `PostgresDriver.connect` opened,
    for what only psycopg has (`info`, `fileno`, `Connection.execute`, binary cursors, COPY). No
    check is made: the DB-API protocol stays DB-API, and this dialect's connections are psycopg's."""
    return cast("psycopg.Connection[TupleRow]", conn)


def _is_psycopg_error(exc: BaseException) -> bool:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - the postgres extra is not installed
        return False
    return isinstance(exc, psycopg.Error)


def _classify(exc: BaseException) -> str:
    """``"transient"`` (worth a retry on a new connection) or ``"permanent"`` (fail at once)."""
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:
        sqlstate = sqlstate.upper()
        return "transient" if sqlstate in _TRANSIENT_STATES or sqlstate.startswith("08") else "permanent"
    if not _is_psycopg_error(exc):
        return "permanent"
    text = str(exc).lower()
    if any(m in text for m in _PERMANENT_MESSAGES):
        return "permanent"
    if any(m in text for m in _TRANSIENT_MESSAGES):
        return "transient"
    return "permanent"


class PostgresDriver(DriverSupport):
    """The PostgreSQL connections and errors of the dialect."""

    # CREATE ... IF NOT EXISTS checks the catalog, then inserts into it: two sessions creating one
    # table both see it missing and the second fails on the catalog's unique indexes (23505, on
    # pg_type or pg_class) or with 42P07 / 42710. Our installers serialise on an advisory lock;
    # NServiceBus's take none and swallow exactly these three (QueueCreator.CreateQueue,
    # SubscriptionTableCreator.CreateIfNecessary: DuplicateTable, DuplicateObject, UniqueViolation).
    ddl_race_states = frozenset({"42P07", "42710", "23505"})

    def connect(self, url: Any) -> Connection:
        import psycopg

        conn = psycopg.connect(**url.psycopg_kwargs(), autocommit=False)
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        try:
            # Every function, operator and type the connector names resolves to the catalog: a
            # role with CREATE on a schema in the search path could otherwise plant a better
            # match (public.hashtextextended(text, integer) beats the catalog's with its implicit
            # cast). Every table we touch is schema-qualified. pg_temp last: never searched first.
            conn.execute("SET search_path = pg_catalog, pg_temp")
            conn.commit()
        except BaseException:
            conn.close()
            raise
        return conn

    def page_cursor(self, conn: Connection) -> Cursor:
        return psycopg_connection(conn).cursor(binary=True)

    def backend_of(self, conn: Connection) -> Any:
        return psycopg_connection(conn).info.backend_pid

    def is_working(self, probe: Connection, backend: Any) -> bool:
        # a role sees the state of its own sessions in pg_stat_activity, no privilege needed
        row = psycopg_connection(probe).execute("SELECT state FROM pg_catalog.pg_stat_activity WHERE pid = %s", (backend,)).fetchone()
        return row is not None and row[0] == "active"

    def cut(self, conn: Connection) -> None:
        # shutdown() acts on the socket, not on the descriptor: the copy's shutdown makes the
        # blocked recv() of libpq return, and psycopg raises "server closed the connection"
        with socket.socket(fileno=os.dup(psycopg_connection(conn).fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)

    def is_driver_error(self, exc: BaseException) -> bool:
        return _is_psycopg_error(exc)

    def sqlstate(self, exc: BaseException) -> str | None:
        state = getattr(exc, "sqlstate", None)
        return state.upper() if isinstance(state, str) and state else None

    def is_transient(self, exc: BaseException) -> bool:
        return _classify(exc) == "transient"

    def is_out_of_connections(self, exc: BaseException) -> bool:
        if self.sqlstate(exc) == "53300":
            return True
        text = str(exc).lower()
        return _is_psycopg_error(exc) and any(m in text for m in _NO_SLOTS)

    def connection_limit(self) -> Statement:
        return Statement("SELECT pg_catalog.current_setting('max_connections')::int")

    def is_undefined_table(self, exc: BaseException) -> bool:
        return getattr(exc, "sqlstate", None) == "42P01"

    def is_out_of_prepared_slots(self, exc: BaseException) -> bool:
        # "maximum number of prepared transactions reached" (out_of_memory), or
        # max_prepared_transactions = 0 (feature_not_supported)
        return _is_psycopg_error(exc) and self.sqlstate(exc) in ("53200", "0A000")

    def is_unknown_prepared(self, exc: BaseException) -> bool:
        return _is_psycopg_error(exc) and self.sqlstate(exc) == "42704"  # undefined_object

    def error_text(self, exc: BaseException) -> str:
        # The primary message only: DETAIL ("Key (b)=(...) already exists", "Failing row
        # contains (...)"), CONTEXT and HINT may copy row contents, the LINE lines the statement.
        diag = getattr(exc, "diag", None)
        primary = getattr(diag, "message_primary", None) if diag is not None else None
        if primary:
            return one_line(primary)
        if _is_psycopg_error(exc):  # raised by libpq or psycopg itself: no row in it; keep every line
            return mask(" ".join(str(exc).split())) or type(exc).__name__
        return super().error_text(exc)

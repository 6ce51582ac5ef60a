"""pyodbc: connecting, savepoints, and the one classification of its errors.

A pyodbc error's args are (SQLSTATE, message); the message carries each diagnostic record's native
error number. Permanent markers win (a failed login often comes with a connection SQLSTATE); then
the transient ones; anything else is permanent and fails at once.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, cast

from ...errors import QTransportError
from ..base import Connection, DriverSupport, Statement, one_line

if TYPE_CHECKING:
    import pyodbc

# error numbers that never go away by retrying
_PERMANENT_NUMBERS = frozenset(
    {
        18456,  # login failed
        18452, 18470, 18487, 18488,  # untrusted domain, account disabled, password expired / must change
        4060,  # cannot open database requested by the login
        916,  # the server principal cannot access the database
        229, 230, 262,  # permission denied (object, column, statement)
        208, 207,  # invalid object name, invalid column name
        547,  # constraint conflict
        11001,  # no such host is known (WSAHOST_NOT_FOUND)
    }
)


# error numbers worth a retry on a new connection: Microsoft.Data.SqlClient's transient list
# (SqlConfigurableRetryFactory, the list its retry logic and NServiceBus's connection resiliency
# rely on), but for 4060 ("cannot open database": a misspelt database name too, permanent here)
_TRANSIENT_NUMBERS = frozenset(
    {
        -2,  # client timeout (SqlClient's number; ODBC reports SQLSTATE HYT00)
        20,  # the instance does not support encryption / connection closed during the handshake
        64,  # the specified network name is no longer available (a connection dropped at login)
        233,  # no process on the other end of the pipe
        997,  # overlapped I/O operation in progress (a connection broken mid-login)
        1204,  # the instance cannot obtain a LOCK resource at this time
        1205,  # deadlock victim
        1222,  # lock request time out period exceeded
        4221,  # login to a read-secondary failed: replica not yet available (Azure SQL)
        10053, 10054, 10060,  # connection aborted / reset / timed out
        10928, 10929,  # Azure SQL: resource limit reached
        40143, 40197, 40501, 40540, 40613,  # Azure SQL: failover in progress, service error, busy, unavailable
        49918, 49919, 49920,  # Azure SQL: too many operations in progress
    }
)


# SQLSTATEs worth a retry: 08xxx connection exceptions (08S01 link failure, 08001 cannot
# connect), 40001 deadlock victim, HYT00/HYT01 query / connection timeout
_TRANSIENT_STATES = frozenset({"40001", "HYT00", "HYT01"})

# an unknown host is permanent whatever SQLSTATE the driver gives it
_UNKNOWN_HOST = re.compile(
    r"(?i)no such host is known|name or service not known|nodename nor servname|could not translate host name|unknown host"
)


# sentences of SQL Server messages that copy row contents: cut from our errors and logs
_ROW_CONTENTS = re.compile(r"(?i)\s*(?:The duplicate key value is \(.*?\)\.|Truncated value: '.*?'\.)")

# pyodbc formats each diagnostic record as "[SQLSTATE] message (native error) (function)", the
# records joined by "; ": a native number is the parenthesized integer before "(SQL...", ";" or the end.
_NATIVE_NUMBER = re.compile(r"\((-?\d+)\)(?=\s*(?:\(SQL|;|$))")


_RETRY_KEY = re.compile(r"(?i)(?:^|;)\s*ConnectRetryCount\s*=\s*(?:\{(?:[^}]|\}\})*\}|[^;]*)")


def without_reconnect(odbc: str) -> str:
    """The ODBC connection string with ConnectRetryCount=0 (whatever it said before).

    ODBC Driver 18 reconnects an idle connection that broke (connection resiliency) without a
    word, and a new server session has none of the old one's session-owned application locks:
    the endpoint's consumer lock would vanish while this process believes it holds it. Without
    the silent reconnect, the broken connection raises; the session layer opens a new one and
    takes the lock again (or finds another query holding it). ODBC uses a repeated keyword's
    first value, so the old one is removed, not overridden."""
    rest = _RETRY_KEY.sub("", odbc).lstrip(";")
    return "ConnectRetryCount=0;" + rest


def pyodbc_connection(conn: Connection) -> pyodbc.Connection:
    """`conn` as what it is on this dialect: the pyodbc connection `SqlServerDriver.connect` opened,
    for what only pyodbc has (`fast_executemany`, `setinputsizes`, `executemany` on its cursors).
    No check is made: the DB-API protocol stays DB-API, and this dialect's connections are pyodbc's.
    (pyodbc has no type information mypy reads: what this returns is not checked further.)"""
    return cast("pyodbc.Connection", conn)


class SqlServerDriver(DriverSupport):
    """The SQL Server connections, savepoints and errors of the dialect."""

    # streaming_cursor: pyodbc's default cursor is a forward-only firehose whose fetchmany()
    # reads rows off the wire as asked, so the base implementation streams already.

    def connect(self, url: Any) -> Connection:
        import pyodbc

        # No ODBC connection pooling: a pooled session would keep its sp_getapplock (the
        # endpoint's receiver lock) after close() and make the next query look busy. Only takes
        # effect before the process's first pyodbc connection.
        pyodbc.pooling = False
        conn = pyodbc.connect(without_reconnect(url.odbc_string()), autocommit=False)
        # A hanging connection (a failover that left the socket open) ends in the driver's own
        # query timeout (HYT00, transient): the server cannot be asked about another session
        # without VIEW SERVER STATE. Four times `responseTimeout`, as long statements are legitimate.
        conn.timeout = int(max(url.response, 0) * 4)
        try:
            # READCOMMITTED: READPAST and UPDLOCK keep their meaning (SNAPSHOT would break them).
            # Set on every connection: a pooled connection keeps its previous isolation level.
            cur = conn.cursor()
            cur.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            # The server's `user options` may start sessions with NOCOUNT or XACT_ABORT on
            # (NServiceBus's statements expect that and restore it). Ours read row counts (the
            # outbox insert: 0 means a replay, so NOCOUNT would skip every batch) and roll a
            # failed insert back to a savepoint (XACT_ABORT would doom the transaction): off for
            # the session. Batches that want them on say so, and it ends with the batch.
            cur.execute("SET NOCOUNT OFF; SET XACT_ABORT OFF;")
            cur.close()
            conn.commit()
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _check_savepoint(name: str) -> str:
        # Written into the SQL text: a regular identifier only. SQL Server uses 32 characters of it.
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,31}", name):
            raise QTransportError(
                f"savepoint name {name!r} must be a letter or _ then up to 31 letters, digits or _", operation="savepoint"
            )
        return name

    def savepoint(self, name: str) -> Statement:
        # SAVE TRANSACTION needs an open transaction (error 628 otherwise), and does not open
        # one: pyodbc without autocommit runs in implicit transaction mode, where a transaction
        # starts with the first statement that touches a table, so none may be open yet. There,
        # BEGIN TRANSACTION at @@TRANCOUNT 0 opens two nested transactions (the implicit one and
        # the explicit one, @@TRANCOUNT 2); committing the inner one only lowers the count to 1,
        # leaving the implicit transaction that the driver commit or rollback ends, as usual.
        # Outside implicit mode BEGIN TRANSACTION makes 1 and nothing is committed. No parameter:
        # a plain batch, not sp_executesql (which would refuse to end with a transaction count
        # different from the one it began with).
        return Statement(
            "IF @@TRANCOUNT = 0\n"
            "BEGIN\n"
            "    BEGIN TRANSACTION;\n"
            "    IF @@TRANCOUNT = 2 COMMIT TRANSACTION;\n"
            "END\n"
            f"SAVE TRANSACTION {self._check_savepoint(name)};"
        )

    def rollback_to_savepoint(self, name: str) -> Statement:
        # Undoes the work since the savepoint and keeps the transaction (and @@TRANCOUNT). Only
        # possible while the transaction is committable: an error that dooms it (XACT_STATE -1:
        # XACT_ABORT, most errors raised in a trigger) or ends it (a trigger that rolls back)
        # leaves no savepoint to return to. Then this raises, and the caller error path rolls
        # the whole transaction back.
        return Statement(
            "IF XACT_STATE() = 1\n"
            f"    ROLLBACK TRANSACTION {self._check_savepoint(name)};\n"
            "ELSE\n"
            "    THROW 51000, N'sqlqueue: the failed statement ended the transaction (an error in a trigger"
            " or XACT_ABORT), so it cannot be rolled back to a savepoint', 1;"
        )

    def release_savepoint(self, name: str) -> Statement | None:
        self._check_savepoint(name)
        return None  # SQL Server has no RELEASE: a savepoint lives until the transaction ends

    @staticmethod
    def _diagnostics(exc: BaseException) -> tuple[str, set[int]]:
        """(SQLSTATE, native error numbers) of a pyodbc error: args are (sqlstate, message), the
        message carrying each native number in parentheses, e.g. ``... (1205) (SQLExecDirectW)``."""
        args = getattr(exc, "args", ()) or ()
        state = args[0] if args and isinstance(args[0], str) and len(args[0]) == 5 else ""
        text = " ".join(str(a) for a in args[1:]) if state else " ".join(str(a) for a in args)
        numbers = {int(m) for m in _NATIVE_NUMBER.findall(text)}
        number = getattr(exc, "number", None)  # other drivers (pymssql, SqlClient-style)
        if isinstance(number, int):
            numbers.add(number)
        return state.upper(), numbers

    def is_driver_error(self, exc: BaseException) -> bool:
        try:
            import pyodbc
        except ImportError:  # pragma: no cover - the sqlserver extra is not installed
            return bool(self._diagnostics(exc)[0])
        return isinstance(exc, pyodbc.Error) or bool(self._diagnostics(exc)[0])

    def sqlstate(self, exc: BaseException) -> str | None:
        return self._diagnostics(exc)[0] or None

    def is_transient(self, exc: BaseException) -> bool:
        # Judged by the diagnostics alone, whatever the driver's class: pyodbc raises a failed
        # login and a lost connection alike as OperationalError.
        state, numbers = self._diagnostics(exc)
        if numbers & _PERMANENT_NUMBERS or _UNKNOWN_HOST.search(self._message(exc)):
            return False
        if state.startswith("08") or state in _TRANSIENT_STATES:
            return True
        return bool(numbers & _TRANSIENT_NUMBERS)

    def is_out_of_connections(self, exc: BaseException) -> bool:
        # 17809: "Could not connect because the maximum number of '%d' user connections has
        # already been reached" (sp_configure 'user connections')
        return 17809 in self._diagnostics(exc)[1]

    def connection_limit(self) -> Statement:
        return Statement("SELECT @@MAX_CONNECTIONS")

    def is_undefined_table(self, exc: BaseException) -> bool:
        state, numbers = self._diagnostics(exc)
        return state == "42S02" or 208 in numbers

    @staticmethod
    def _message(exc: BaseException) -> str:
        args: tuple[Any, ...] = tuple(getattr(exc, "args", ()) or ())
        if len(args) >= 2 and isinstance(args[0], str) and len(args[0]) == 5:
            return " ".join(str(a) for a in args[1:])
        return " ".join(str(a) for a in args) if args else str(exc)

    def error_text(self, exc: BaseException) -> str:
        # The driver's message without pyodbc's tuple around it, and without the sentences that
        # quote a row (a duplicate key's value, a truncated value).
        return one_line(_ROW_CONTENTS.sub("", self._message(exc))) or type(exc).__name__

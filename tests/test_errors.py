"""Errors are classified once per dialect: permanent ones fail at once with one line, transient
ones are retried. PostgreSQL cases are real errors of the embedded server; SQL Server ones are
pyodbc errors as its drivers raise them."""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from backends import Backend
from spark_qtransport.connections import parse_url
from spark_qtransport.errors import DatabaseError, QueueNotFoundError
from spark_qtransport.transport import session as db


def raised(fn: Callable[[], Any]) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- a role that logs in with a password ------------------------------------------------------------

#: a password that urllib would cut short at '#', '/' or '?' and at the first '@'; its pieces
PASSWORD = "s3cr#t p@ss"
WRONG = "w0ng#x q@zz"
PIECES = ("s3cr", "cr#t", "t p@", "@ss", "p@ss", "w0ng", "g#x", "x q@", "q@zz")


@dataclass
class Role:
    """A login role that must give its password (the embedded server trusts everyone else)."""

    name: str
    base: str  # the test database's URL

    def url(self, password: str = PASSWORD) -> str:
        """The URL with the password written raw, not percent-encoded."""
        p = parse_url(self.base)
        return f"postgresql://{self.name}:{password}@{p.host}:{p.port}/{p.database}"

    def kwargs(self, password: str = PASSWORD) -> dict[str, Any]:
        return {**parse_url(self.base).psycopg_kwargs(), "user": self.name, "password": password}


def password_role(pg: Backend) -> Iterator[Role]:
    """Create a role with `PASSWORD` and make the server ask it for its password (scram), by a
    pg_hba.conf line of its own; the line is removed afterwards. Skips on a server whose
    pg_hba.conf this process cannot edit."""
    import psycopg
    from psycopg import sql

    name = f"qt_pw_{uuid.uuid4().hex[:8]}"
    lines = "".join(f"host all {name} {net} scram-sha-256\n" for net in ("127.0.0.1/32", "::1/128"))
    with pg.connect() as conn:
        try:
            hba = conn.execute("SHOW hba_file").fetchone()[0]
            with open(hba, encoding="utf-8") as f:
                text = f.read()
            with open(hba, "w", encoding="utf-8") as f:
                f.write(lines + text)
        except (psycopg.Error, OSError) as exc:
            pytest.skip(f"cannot require a password on this server: {type(exc).__name__}")
        try:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(name), PASSWORD))
            conn.execute("SELECT pg_catalog.pg_reload_conf()")
            role = Role(name, pg.url)
            deadline = time.monotonic() + 10
            while True:  # the reload is asynchronous: wait until a wrong password is refused
                try:
                    psycopg.connect(**role.kwargs(WRONG)).close()
                except psycopg.OperationalError:
                    break
                assert time.monotonic() < deadline, "pg_hba.conf reload did not take effect"
                time.sleep(0.05)
            yield role
        finally:
            with open(hba, encoding="utf-8") as f:
                text = f.read()
            with open(hba, "w", encoding="utf-8") as f:
                f.write(text.replace(lines, ""))
            conn.execute("SELECT pg_catalog.pg_reload_conf()")
            if conn.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", (name,)).fetchone():
                conn.execute(f'DROP OWNED BY "{name}"')
                conn.execute(f'DROP ROLE "{name}"')


@pytest.fixture(scope="module")
def role(pg: Backend) -> Iterator[Role]:
    yield from password_role(pg)


def no_secret(text: str) -> None:
    for piece in PIECES:
        assert piece not in text, f"{piece!r} leaked: {text!r}"


# -- PostgreSQL: real errors -----------------------------------------------------------------------


class TestPostgresPermanent:
    def test_wrong_password(self, pg: Backend, role: Role) -> None:
        import psycopg

        exc = raised(lambda: psycopg.connect(**role.kwargs(WRONG)))
        assert not pg.dialect.is_transient(exc)
        text = pg.dialect.error_text(exc)
        assert "password authentication failed" in text and "\n" not in text
        no_secret(text)

    def test_missing_database(self, pg: Backend) -> None:
        import psycopg

        exc = raised(lambda: psycopg.connect(**{**pg.parsed.psycopg_kwargs(), "dbname": "no_such_db_qt"}))
        assert not pg.dialect.is_transient(exc)
        assert 'database "no_such_db_qt" does not exist' in pg.dialect.error_text(exc)

    def test_unknown_host(self, pg: Backend) -> None:
        import psycopg

        exc = raised(lambda: psycopg.connect(**{**pg.parsed.psycopg_kwargs(), "host": "nonexistent.invalid"}))
        assert not pg.dialect.is_transient(exc), str(exc)

    def test_undefined_table_and_column(self, pg: Backend) -> None:
        with pg.connect() as conn:
            exc = raised(lambda: conn.execute("SELECT 1 FROM qt_no_such_table"))
            assert not pg.dialect.is_transient(exc) and pg.dialect.is_undefined_table(exc)
            assert pg.dialect.error_text(exc) == 'relation "qt_no_such_table" does not exist'  # no LINE lines
            exc = raised(lambda: conn.execute("SELECT qt_no_such_column FROM pg_catalog.pg_class"))
            assert not pg.dialect.is_transient(exc) and not pg.dialect.is_undefined_table(exc)

    def test_permission_denied(self, pg: Backend, role: Role, names: Any) -> None:
        import psycopg

        q = pg.create_queue(names("Private"))
        with psycopg.connect(**role.kwargs()) as conn:
            exc = raised(lambda: conn.execute(f"SELECT * FROM {pg.q(q)}"))
        assert getattr(exc, "sqlstate", None) == "42501"
        assert not pg.dialect.is_transient(exc)

    def test_check_violation_and_its_row_is_not_shown(self, pg: Backend, names: Any) -> None:
        t = names("checked")
        with pg.connect() as conn:
            conn.execute(f'CREATE TABLE "{t}" (a int CHECK (a > 0), b text UNIQUE)')
            conn.execute(f"""INSERT INTO "{t}" VALUES (1, 'body-secret-1')""")
            check = raised(lambda: conn.execute(f"""INSERT INTO "{t}" VALUES (-1, 'body-secret-2')"""))
            unique = raised(lambda: conn.execute(f"""INSERT INTO "{t}" VALUES (2, 'body-secret-1')"""))
            conn.execute(f'DROP TABLE "{t}"')
        assert getattr(check, "sqlstate", None) == "23514" and not pg.dialect.is_transient(check)
        assert not pg.dialect.is_transient(unique)
        for exc in (check, unique):
            assert "body-secret" in str(exc)  # the driver's DETAIL line copies the row...
            assert "body-secret" not in pg.dialect.error_text(exc)  # ...our text never does
            assert "DETAIL" not in pg.dialect.error_text(exc)


class TestPostgresTransient:
    def test_terminated_session(self, pg: Backend) -> None:
        victim = pg.connect()
        with pg.connect() as admin:
            admin.execute("SELECT pg_catalog.pg_terminate_backend(%s)", (victim.info.backend_pid,))
        exc = raised(lambda: victim.execute("SELECT 1"))
        assert getattr(exc, "sqlstate", None) == "57P01" and pg.dialect.is_transient(exc)
        closed = raised(lambda: victim.execute("SELECT 1"))  # and the connection it left behind
        assert pg.dialect.is_transient(closed), str(closed)

    def test_session_terminated_while_fetch_results_arrive(self, pg: Backend) -> None:
        """The chaos suite met this one: the FETCH's rows and the FATAL error arrive as two results,
        and psycopg raises its own InternalError (no SQLSTATE). Its text is psycopg's."""
        import psycopg

        exc = psycopg.InternalError("received 2 results from command 'FETCH FORWARD 64 FROM \"sqlqueue_read\"'")
        assert pg.dialect.is_transient(exc)
        assert not pg.dialect.is_transient(psycopg.InternalError("cannot use a closed cursor"))

    def test_connection_refused(self, pg: Backend) -> None:
        import psycopg

        exc = raised(lambda: psycopg.connect(**{**pg.parsed.psycopg_kwargs(), "port": free_port()}))
        assert "Connection refused" in str(exc) and pg.dialect.is_transient(exc)
        assert "\n" not in pg.dialect.error_text(exc)

    def test_lock_timeout_and_serialization_failure(self, pg: Backend, names: Any) -> None:
        import psycopg

        t = names("locked")
        with pg.connect() as setup:
            setup.execute(f'CREATE TABLE "{t}" (k int PRIMARY KEY, v int)')
            setup.execute(f'INSERT INTO "{t}" VALUES (1, 0)')
        a, b = pg.connect(autocommit=False), pg.connect(autocommit=False)
        try:
            a.execute(f'LOCK TABLE "{t}"')
            b.execute("SET lock_timeout = '100ms'")
            lock = raised(lambda: b.execute(f'SELECT * FROM "{t}"'))
            a.rollback()
            b.rollback()
            for conn in (a, b):
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                conn.execute(f'SELECT v FROM "{t}"').fetchall()
            a.execute(f'UPDATE "{t}" SET v = 1')
            a.commit()
            serial = raised(lambda: b.execute(f'UPDATE "{t}" SET v = 2'))
        finally:
            a.close()
            b.close()
            pg.drop(t)
        assert getattr(lock, "sqlstate", None) == "55P03" and pg.dialect.is_transient(lock)
        assert getattr(serial, "sqlstate", None) == "40001" and pg.dialect.is_transient(serial)

    def test_deadlock(self, pg: Backend, names: Any) -> None:
        t = names("deadlock")
        with pg.connect() as setup:
            setup.execute(f'CREATE TABLE "{t}" (k int PRIMARY KEY, v int)')
            setup.execute(f'INSERT INTO "{t}" VALUES (1, 0), (2, 0)')
        a, b = pg.connect(autocommit=False), pg.connect(autocommit=False)
        errors: list[BaseException] = []

        def update(conn: Any, key: int) -> None:
            try:
                conn.execute(f'UPDATE "{t}" SET v = 1 WHERE k = %s', (key,))
            except Exception as exc:  # noqa: BLE001 - one of the two is the victim
                errors.append(exc)
            finally:
                conn.rollback()

        try:
            for conn in (a, b):
                conn.execute("SET deadlock_timeout = '100ms'")
            a.execute(f'UPDATE "{t}" SET v = 1 WHERE k = 1')
            b.execute(f'UPDATE "{t}" SET v = 1 WHERE k = 2')
            other = threading.Thread(target=update, args=(a, 2))
            other.start()
            time.sleep(0.2)
            update(b, 1)
            other.join(30)
        finally:
            a.close()
            b.close()
            pg.drop(t)
        [exc] = errors
        assert getattr(exc, "sqlstate", None) == "40P01" and pg.dialect.is_transient(exc)

    def test_too_many_connections(self, pg: Backend) -> None:
        import psycopg

        name = f"qt_full_{uuid.uuid4().hex[:8]}"
        with pg.connect() as conn:
            conn.execute(f'CREATE ROLE "{name}" LOGIN CONNECTION LIMIT 0')
            try:
                exc = raised(lambda: psycopg.connect(**{**pg.parsed.psycopg_kwargs(), "user": name}))
            finally:
                conn.execute(f'DROP ROLE "{name}"')
        assert "too many connections" in str(exc) and pg.dialect.is_transient(exc)


@pytest.mark.parametrize(
    ("sqlstate", "transient"),
    [
        ("08006", True), ("08001", True), ("57P01", True), ("57P02", True), ("57P03", True),
        ("40P01", True), ("40001", True), ("55P03", True), ("53300", True),
        ("28P01", False), ("28000", False), ("3D000", False), ("42501", False), ("42P01", False),
        ("42703", False), ("23514", False), ("42602", False), ("3F000", False), ("42704", False),
        ("23505", False), ("22P02", False), ("57014", False), ("XX000", False),
    ],
)
def test_postgres_classification_by_sqlstate(pg: Backend, sqlstate: str, transient: bool) -> None:
    import psycopg

    exc = psycopg.errors.lookup(sqlstate)("message")
    assert exc.sqlstate == sqlstate
    assert pg.dialect.is_transient(exc) is transient


@pytest.mark.parametrize(
    ("message", "transient"),
    [
        ('connection failed: connection to server at "h", port 5432 failed: server closed the connection '
         "unexpectedly\n\tThis probably means the server terminated abnormally", True),
        ('connection failed: connection to server at "h", port 5432 failed: FATAL:  the database system is '
         "starting up", True),
        ('connection failed: connection to server at "h", port 5432 failed: FATAL:  sorry, too many clients '
         "already", True),
        ("connection timeout expired", True),
        ("consuming input failed: SSL SYSCALL error: EOF detected", True),
        ('connection failed: could not translate host name "db" to address: Name or service not known', False),
        ("failed to resolve host 'db': [Errno 8] nodename nor servname provided, or not known", False),
        ('connection failed: connection to server at "h", port 5432 failed: FATAL:  password authentication '
         'failed for user "u"', False),
        ("connection failed: connection to server at \"h\", port 5432 failed: FATAL:  no pg_hba.conf entry "
         'for host "10.0.0.1", user "u", database "d", no encryption', False),
        ("something nobody foresaw", False),
    ],
)
def test_postgres_classification_by_libpq_message(pg: Backend, message: str, transient: bool) -> None:
    """Errors raised while connecting carry no SQLSTATE in psycopg 3: judged by libpq's words."""
    import psycopg

    exc = psycopg.OperationalError(message)
    assert exc.sqlstate is None
    assert pg.dialect.is_transient(exc) is transient


def test_errors_not_from_the_driver_are_permanent(pg: Backend) -> None:
    for exc in (ValueError("x"), OSError("Connection refused"), KeyError("y")):
        assert not pg.dialect.is_transient(exc)


# -- SQL Server: pyodbc errors as the drivers raise them -------------------------------------------


def _sqlserver() -> Any:
    from spark_qtransport.dialects import dialect_named

    return dialect_named("sqlserver")


def _odbc(cls: str, state: str, message: str, number: int) -> BaseException:
    pyodbc = pytest.importorskip("pyodbc")
    text = f"[{state}] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]{message} ({number}) (SQLExecDirectW)"
    return getattr(pyodbc, cls)(state, text)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("cls", "state", "message", "number"),
    [
        ("InterfaceError", "28000", "Login failed for user 'sa'.", 18456),
        ("OperationalError", "08004", "Login failed for user 'sa'.", 18456),  # a connection SQLSTATE, still final
        ("ProgrammingError", "42000", "Cannot open database \"Shop\" requested by the login. The login failed.", 4060),
        ("ProgrammingError", "42000", "The SELECT permission was denied on the object 'Sales', database 'Shop'.", 229),
        ("ProgrammingError", "42000", "The SELECT permission was denied on the column 'Body'.", 230),
        ("ProgrammingError", "42000", "CREATE TABLE permission denied in database 'Shop'.", 262),
        ("ProgrammingError", "42S02", "Invalid object name 'dbo.Sales'.", 208),
        ("ProgrammingError", "42S22", "Invalid column name 'Body'.", 207),
        ("IntegrityError", "23000", "The INSERT statement conflicted with the CHECK constraint \"ck\".", 547),
        ("OperationalError", "08001", "TCP Provider: No such host is known.", 11001),
        ("OperationalError", "HY000", "Something nobody foresaw.", 50000),
    ],
)
def test_sqlserver_permanent(cls: str, state: str, message: str, number: int) -> None:
    assert not _sqlserver().is_transient(_odbc(cls, state, message, number))


@pytest.mark.parametrize(
    ("cls", "state", "message", "number"),
    [
        ("OperationalError", "40001", "Transaction (Process ID 57) was deadlocked on lock resources with another "
                                      "process and has been chosen as the deadlock victim.", 1205),
        ("OperationalError", "HY000", "Lock request time out period exceeded.", 1222),
        ("OperationalError", "08S01", "TCP Provider: Error code 0x68", 104),
        ("OperationalError", "08001", "Unable to connect to data source", 0),
        ("OperationalError", "HYT00", "Query timeout expired", 0),
        ("OperationalError", "HYT01", "Connection timeout expired", 0),
        ("OperationalError", "42000", "Database 'Shop' on server 'x' is not currently available.", 40613),
        ("OperationalError", "42000", "The service is currently busy.", 40501),
        ("OperationalError", "42000", "The service has encountered an error processing your request.", 40197),
        ("OperationalError", "HY000", "Too many operations in progress.", 49918),
        ("OperationalError", "HY000", "Too many create or update operations in progress.", 49919),
        ("OperationalError", "HY000", "Too many operations in progress for subscription.", 49920),
        ("OperationalError", "42000", "Login to read-secondary failed due to long wait on 'HADR_DATABASE_WAIT'.", 4221),
        ("OperationalError", "08S01", "Named Pipes Provider: No process is on the other end of the pipe.", 233),
        ("OperationalError", "08S01", "TCP Provider: An established connection was aborted.", 10053),
        ("OperationalError", "08S01", "TCP Provider: An existing connection was forcibly closed.", 10054),
        ("OperationalError", "HY000", "TCP Provider: A connection attempt failed.", 10060),
    ],
)
def test_sqlserver_transient(cls: str, state: str, message: str, number: int) -> None:
    assert _sqlserver().is_transient(_odbc(cls, state, message, number))


def test_sqlserver_error_text_is_the_message_without_row_contents() -> None:
    pyodbc = pytest.importorskip("pyodbc")
    d = _sqlserver()
    exc = pyodbc.IntegrityError(
        "23000", "[23000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Violation of PRIMARY KEY constraint "
        "'PK_x'. Cannot insert duplicate key in object 'dbo.x'. The duplicate key value is (body-secret). (2627) "
        "(SQLExecDirectW)")
    text = d.error_text(exc)
    assert text.startswith("[23000] [Microsoft]") and "Cannot insert duplicate key" in text
    assert "body-secret" not in text and "\n" not in text
    trunc = pyodbc.DataError("22001", "[22001] ... String or binary data would be truncated in table 'dbo.x', column "
                                      "'Body'. Truncated value: 'body-secret'. (2628) (SQLExecDirectW)")
    assert "body-secret" not in d.error_text(trunc) and "truncated" in d.error_text(trunc)
    assert d.error_text(pyodbc.Error("no state here")) == "no state here"


# -- what callers see ----------------------------------------------------------------------------


class TestRetrying:
    def test_permanent_errors_fail_at_once_with_one_line(
        self, pg: Backend, role: Role, caplog: pytest.LogCaptureFixture
    ) -> None:
        import psycopg

        calls: list[int] = []

        def connect() -> Any:
            calls.append(1)
            return psycopg.connect(**role.kwargs(WRONG))

        caplog.set_level(logging.WARNING, "spark_qtransport")
        started = time.monotonic()
        with pytest.raises(DatabaseError) as info:
            db.retrying(pg.dialect, lambda conn: None, connection=connect, discard=db.close, what="peek on queue Q")
        assert time.monotonic() - started < 1 and calls == [1]
        text = str(info.value)
        assert info.value.operation == "peek on queue Q"
        assert "\n" not in text and "OperationalError" in text
        assert "password authentication failed" in text
        assert isinstance(info.value.__cause__, psycopg.OperationalError)
        no_secret(text)
        assert "retrying" not in caplog.text

    def test_undefined_table_is_queue_not_found(self, pg: Backend) -> None:
        calls: list[int] = []

        def connect() -> Any:
            calls.append(1)
            return pg.dialect.connect(pg.parsed)

        def fn(conn: Any) -> None:
            conn.execute('SELECT 1 FROM "public"."qt_absent"')

        with pytest.raises(QueueNotFoundError) as info:
            db.retrying(pg.dialect, fn, connection=connect, discard=db.close, what="read Q")
        assert calls == [1] and getattr(info.value.__cause__, "sqlstate", None) == "42P01"
        assert (info.value.operation, info.value.sqlstate) == ("read Q", "42P01")
        assert "qt_absent" in str(info.value) and "\n" not in str(info.value)

    def test_transient_errors_are_retried(self, pg: Backend, caplog: pytest.LogCaptureFixture) -> None:
        conns: list[Any] = []

        def connect() -> Any:
            conns.append(pg.dialect.connect(pg.parsed))
            return conns[-1]

        def fn(conn: Any) -> int:
            if len(conns) == 1:  # the first session is killed under the statement
                conn.execute("SELECT pg_catalog.pg_terminate_backend(pg_catalog.pg_backend_pid())")
            return int(conn.execute("SELECT 7").fetchone()[0])

        caplog.set_level(logging.DEBUG, "spark_qtransport")
        try:
            assert db.retrying(pg.dialect, fn, connection=connect, discard=db.close, what="peek on queue Q") == 7
        finally:
            for conn in conns:
                db.close(conn)
        assert len(conns) == 2
        # one fault the next attempt cured: a reconnection (DEBUG), not an outage (WARNING)
        [line] = [r.getMessage() for r in caplog.records if "reconnecting" in r.getMessage()]
        assert "peek on queue Q" in line and "terminating connection" in line  # the operation, the driver's reason
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


class TestStreamAndSinkSetUp:
    def test_receiver_with_a_wrong_password(self, pg: Backend, role: Role, names: Any) -> None:
        from spark_qtransport.options.parse import ReaderOptions
        from spark_qtransport.transport.receiving.receiver import Receiver

        q, e = pg.create_queue(names("Sales")), pg.create_queue(names("error"))
        r = Receiver(ReaderOptions.parse({"url": role.url(WRONG), "queue": q, "errorQueue": e}))
        started = time.monotonic()
        with pytest.raises(DatabaseError) as info:
            r.initial_offset()
        assert time.monotonic() - started < 3
        assert info.value.operation is not None and q in info.value.operation
        assert "password authentication failed" in str(info.value)  # the server's reason
        no_secret(str(info.value))

    def test_sender_with_a_wrong_password(self, pg: Backend, role: Role, names: Any) -> None:
        from spark_qtransport.options.parse import WriterOptions
        from spark_qtransport.transport.sending.dispatch import set_up_sender
        from spark_qtransport.transport.sending.staging import stage_partition

        sales = pg.create_queue(names("Sales"))
        good = WriterOptions.parse({"url": pg.url, "endpoint": sales})
        plan = set_up_sender(good)
        bad = WriterOptions.parse({"url": role.url(WRONG), "endpoint": sales, "inlineBytes": "0"})  # tasks stage
        with pytest.raises(DatabaseError) as a:
            set_up_sender(bad)
        rows = [{"body": b"{}", "message_type": "T", "destination": sales}]
        with pytest.raises(DatabaseError) as b:
            stage_partition(bad, plan, [rows], batch_id=0, query_id=None)
        assert a.value.operation is not None and a.value.operation.startswith("setting up the sender tables")
        assert b.value.operation is not None and b.value.operation.startswith("staging batch 0")
        for info in (a, b):
            assert sales in str(info.value.operation)
            assert "password authentication failed" in str(info.value)  # the server's reason
            no_secret(str(info.value))


# -- the command line ------------------------------------------------------------------------------


def sqlqueue(url: str, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "spark_qtransport.cli", *args, "--url", url],
        capture_output=True, text=True, timeout=60,
    )
    return result, time.monotonic() - started


def _missing_database(pg: Backend, role: Role) -> str:
    return pg.url.rsplit("/", 1)[0] + "/qt_no_such_db"


def _wrong_password(pg: Backend, role: Role) -> str:
    return role.url(WRONG)


def _unknown_host(pg: Backend, role: Role) -> str:
    return "postgresql://postgres@nonexistent.invalid:5432/postgres"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (_missing_database, 'database "qt_no_such_db" does not exist'),
        (_wrong_password, "password authentication failed"),
        (_unknown_host, "nonexistent.invalid"),
    ],
    ids=["missing-database", "wrong-password", "unknown-host"],
)
def test_cli_fails_at_once_on_permanent_errors(
    pg: Backend, role: Role, url: Callable[[Backend, Role], str], says: str
) -> None:
    result, seconds = sqlqueue(url(pg, role), "stats")
    assert result.returncode == 1, result
    assert seconds < 3, (seconds, result.stderr)
    assert "retrying" not in result.stderr
    [line] = result.stderr.splitlines()
    assert re.match(r"error: sqlqueue .*stats failed: OperationalError: ", line) and says in line, line
    no_secret(result.stdout + result.stderr)

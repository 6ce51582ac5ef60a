"""A connection and the one retry policy, and the small DB-API helpers every operation shares.

- `Backoff`: the retry policy (how many attempts, how long between them). Every retry in the
  package waits through it.
- `with_retries(dialect, what, attempt)`: run `attempt(n)` until it succeeds; a transient fault
  (`Dialect.is_transient`) waits and calls it again, a permanent one, or the last, raises our
  error naming `what`. For work that keeps its own progress between attempts (a slice read from
  where the last attempt stopped, staging keeping the rows it wrote).
- `retrying(...)`: one transaction through `with_retries`, committed.
- `Session`: one connection slot with `run(what, fn)`: a transaction, retried on a new connection
  after a transient fault. Receivers, dispatchers and the CLI each hold sessions.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..connections import OUTAGE_TIMEOUT
from ..dialects import Connection, Cursor, Dialect, QueueAddress, Statement
from ..errors import DatabaseError, QTransportError, QueueNotFoundError
from .watchdog import WATCHDOG

__all__ = ["Backoff", "Session", "with_retries", "OUTAGES", "OUTAGE_TIMEOUT", "seconds_text", "args", "execute", "results", "first", "one", "rows", "columns", "rowcount",
           "rollback", "close", "describe", "explain", "retrying", "install", "warn_about_name"]

log = logging.getLogger("spark_qtransport.db")
#: an outage's two lines (declared, over): a logger of their own, so a front end can show them
OUTAGE_LOGGER = "spark_qtransport.outage"
outage_log = logging.getLogger(OUTAGE_LOGGER)

T = TypeVar("T")



@dataclass(frozen=True)
class Backoff:
    """The retry policy. Transient faults are ridden through for `bound` seconds from the start
    of the database's outage (0: not at all), waiting `first` seconds after the first failure and
    twice as long after each next one, at most `longest`; each wait is jittered (half to all of
    it), so that the processes that lost one server do not all come back at the same instant.

    `attempts`: best-effort work (monitoring reports, a metrics scrape) gives up after this many
    attempts whatever the bound, and leaves the outage's log lines to the work that waits it out.
    `database`: the masked URL the outage is reported for."""

    bound: float = OUTAGE_TIMEOUT
    first: float = 0.2
    longest: float = 5.0
    attempts: int | None = None
    database: str = "the database"

    @staticmethod
    def of(url: Any, *, attempts: int | None = None) -> Backoff:
        """The policy for `url`'s database (its `outageTimeout`)."""
        return Backoff(bound=float(getattr(url, "outage", OUTAGE_TIMEOUT)), attempts=attempts,
                       database=str(url))

    def wait(self, failed_attempt: int) -> float:
        full = min(self.first * 2 ** (failed_attempt - 1), self.longest)
        return random.uniform(full / 2, full)

    def gives_up(self, failed_attempt: int, outage_seconds: float) -> bool:
        """After `failed_attempt`, the outage `outage_seconds` old (the last wait ends at the bound)."""
        if self.attempts is not None:
            return failed_attempt >= self.attempts
        return outage_seconds >= self.bound


BACKOFF = Backoff()


def seconds_text(seconds: float) -> str:
    """``2 min``, ``90 s``, ``0.5 s``: a bound as a person reads it."""
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


#: seconds a database that has not answered once in this process is tried at a start (the CLI, a
#: query's planning: `Outages.starts_here`) before the error: a wrong host or port fails in
#: seconds, and the outage bound is for a database that answered before
FIRST_CONTACT = 5.0

#: seconds without a fault after which an outage counts as over (the longest wait between two
#: attempts is 5 s, plus a connect timeout of 10 s)
STALE = 30.0


class Outages:
    """When each database's outage began, per process: the one WARNING when it starts and the one
    INFO when it ends, however many sessions meet it (a claim, an acknowledgement in the
    background, monitoring), and the start every retry loop measures its bound from.

    A single fault that the next attempt cures (a connection the server dropped while idle, or
    that the outage broke and its end found stale; a terminated session) is a reconnection,
    logged at DEBUG; the outage is declared when a retry fails too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._declared: set[str] = set()
        self._answered: set[str] = set()
        self._starts_here = False

    def starts_here(self) -> None:
        """This process is a start (the CLI, a query's planning): a database that has not answered
        in it yet is tried for `FIRST_CONTACT` seconds, not the outage bound. Not in Spark's
        executors, whose first contact may fall in an outage of a database the query met."""
        self._starts_here = True

    def never_answered(self, backoff: Backoff) -> bool:
        """A start whose database has not answered yet (`starts_here`)."""
        return self._starts_here and backoff.database not in self._answered

    def answers(self, backoff: Backoff, dialect: Dialect, failure: BaseException) -> bool:
        """Whether `failure` came from the server (an error with a SQLSTATE: a session it
        terminated, a deadlock): then it answered, and is counted so. A refused or unreachable
        connection carries none."""
        if isinstance(failure, QTransportError) or dialect.sqlstate(failure) is None:
            return False
        self._answered.add(backoff.database)
        return True

    def began(self, backoff: Backoff, what: str, text: str, failed_attempt: int) -> float:
        """A transient fault of `what`, its `failed_attempt`-th: when its database's outage began.
        An outage nobody has met for `STALE` seconds is over (whoever met it last gave up, and
        nothing has asked since): a call's first fault then starts another. A call keeps the
        start it got at its first fault (`with_retries`), however long its attempts take."""
        now = time.monotonic()
        key = backoff.database
        if backoff.attempts is not None:
            log.debug("%s failed (%s)", what, text)
            return self._since.get(key, now)
        with self._lock:
            if failed_attempt == 1 and now - self._last.get(key, now) > STALE:
                self._since.pop(key, None)
                self._declared.discard(key)
            self._last[key] = now
            since = self._since.setdefault(key, now)
            declare = (failed_attempt > 1 or backoff.bound <= 0) and key not in self._declared
            if declare:
                self._declared.add(key)
        if declare and backoff.bound > 0:
            outage_log.warning("%s failed (%s); retrying for up to %s (outageTimeout) until %s answers", what, text,
                        seconds_text(backoff.bound), key)
        else:
            log.debug("%s failed (%s); reconnecting", what, text)
        return since

    def ended(self, backoff: Backoff) -> None:
        key = backoff.database
        self._answered.add(key)
        if not self._since:
            return
        with self._lock:
            since = self._since.pop(key, None)
            declared = key in self._declared
            self._declared.discard(key)
        if since is not None and declared:
            outage_log.info("%s answers again, after %.1f s", key, time.monotonic() - since)


#: this process's outages
OUTAGES = Outages()


#: seconds a refused connection (the server has none left) is tried again before the error: a
#: slot another client frees soon is taken, but waiting out an outage's bound would only hide it
NO_SLOT_WAIT = 10.0
#: the connection limit each database reported (`StreamSessions`), by its masked URL
CONNECTION_LIMITS: dict[str, int] = {}


def _no_slot(dialect: Dialect, what: str, exc: BaseException, backoff: Backoff, waited: float) -> DatabaseError:
    limit = CONNECTION_LIMITS.get(backoff.database)
    limit_text = f"its connection limit ({limit})" if limit is not None else "its connection limit (max_connections)"
    return DatabaseError(
        f"{what} failed: {backoff.database} has reached {limit_text} and refused a new connection for "
        f"{waited:.0f} s ({dialect.error_text(exc)}). A stream needs at most 3 connections on the driver whatever "
        "number of queues it reads, plus one per executor task running; free connections or raise the limit",
        operation=what, sqlstate=dialect.sqlstate(exc),
    )


def with_retries(dialect: Dialect, what: str, attempt: Callable[[int], T], *, backoff: Backoff = BACKOFF,
                 after_failure: Callable[[BaseException], None] | None = None) -> T:
    """`attempt(n)` for n = 1, 2, ... until it returns, riding through the database's outage for
    `backoff.bound` seconds. Our own errors propagate as they are, but for those that say they are
    transient (`QTransportError.transient`), retried. A driver error that is permanent
    (`Dialect.is_transient` false: a wrong password, a missing table, no permission) is raised as
    `QueueNotFoundError` / `DatabaseError` naming `what`, with the driver's error as its cause; a
    transient one past the bound as a `DatabaseError` naming the database and the bound. Any other
    exception (a bug, bad input) propagates as it is: only the driver's errors are "database
    failures". After a transient fault `after_failure(exc)` runs (drop the connection), then the
    policy's wait."""
    n, call_since, full_since, first_since = 0, None, None, None
    while True:
        n += 1
        try:
            result = attempt(n)
        except QTransportError as exc:
            if not exc.transient:
                raise
            failure: BaseException = exc
            text = str(exc)
        except Exception as exc:
            if not dialect.is_driver_error(exc):
                raise
            if dialect.is_out_of_connections(exc):
                full_since = time.monotonic() if full_since is None else full_since
                waited = time.monotonic() - full_since
                if waited >= NO_SLOT_WAIT or backoff.attempts is not None and n >= backoff.attempts:
                    raise _no_slot(dialect, what, exc, backoff, waited) from exc
                log.debug("%s: no connection left on the server (%s); trying again", what, dialect.error_text(exc))
                if after_failure is not None:
                    after_failure(exc)
                time.sleep(backoff.wait(n))
                continue
            if not dialect.is_transient(exc):
                raise explain(dialect, what, exc) from exc
            failure, text = exc, dialect.error_text(exc)
        else:
            OUTAGES.ended(backoff)
            return result
        if (backoff.attempts is None and backoff.bound > 0 and OUTAGES.never_answered(backoff)
                and not OUTAGES.answers(backoff, dialect, failure)):
            first_since = time.monotonic() if first_since is None else first_since
            left = min(FIRST_CONTACT, backoff.bound) - (time.monotonic() - first_since)
            if left <= 0:
                raise _never_answered(dialect, what, failure, text, backoff) from failure
            if after_failure is not None:
                after_failure(failure)
            time.sleep(min(backoff.wait(n), left))
            continue
        since = OUTAGES.began(backoff, what, text, n)
        call_since = since if call_since is None else call_since
        outage = time.monotonic() - call_since
        if backoff.gives_up(n, outage):
            raise _gave_up(dialect, what, failure, text, backoff, outage) from failure
        if after_failure is not None:
            after_failure(failure)
        time.sleep(min(backoff.wait(n), max(backoff.bound - outage, 0.0)) if backoff.attempts is None
                   else backoff.wait(n))


def _never_answered(dialect: Dialect, what: str, failure: BaseException, text: str,
                    backoff: Backoff) -> QTransportError:
    if isinstance(failure, QTransportError):
        return failure
    return DatabaseError(
        f"{what} failed: {backoff.database} does not answer: {text}; nothing has answered there since this "
        "started: check the host and port, and that the server runs",
        operation=what, sqlstate=dialect.sqlstate(failure))


def _gave_up(dialect: Dialect, what: str, failure: BaseException, text: str, backoff: Backoff,
             seconds: float) -> QTransportError:
    if backoff.attempts is not None:
        if isinstance(failure, QTransportError):
            return failure
        return explain(dialect, what, failure)  # type: ignore[arg-type]
    if backoff.bound <= 0:
        why = "`outage_timeout` is 0: no outage is waited out"
    else:
        why = (f"{backoff.database} has not answered for {seconds:.0f} s, longer than `outage_timeout` "
               f"({seconds_text(backoff.bound)})")
    fields = {"operation": what, "sqlstate": None if isinstance(failure, QTransportError) else dialect.sqlstate(failure)}
    return DatabaseError(f"{what} failed: {why}: {text}", **fields)


def args(stmt: Statement) -> tuple[Any, ...]:
    return (stmt.sql,) if stmt.params is None else (stmt.sql, stmt.params)


def execute(cur: Cursor, stmt: Statement) -> Cursor:
    cur.execute(*args(stmt))
    return cur


def results(cur: Cursor) -> Cursor:
    """`cur`, moved on to the first result that has rows: every read of a statement's result goes
    through here. A batch of several statements may answer with results that carry no rows
    before the one it selects: row counts, or a warning that ODBC reports as a result of its own
    (SQL Server's 8153, "Null value is eliminated by an aggregate"; pyodbc then says "No results.
    Previous SQL was not a query"). NServiceBus reads past them the same way (its receive drains
    every result). A statement that selects nothing is left where it ends, and fetching raises as
    the driver does."""
    while cur.description is None and cur.nextset():
        pass
    return cur


def first(cur: Cursor, stmt: Statement) -> Sequence[Any] | None:
    cur.execute(*args(stmt))
    return results(cur).fetchone()


def one(cur: Cursor, stmt: Statement) -> tuple[Any, ...]:
    cur.execute(*args(stmt))
    row = results(cur).fetchone()
    return tuple(row) if row is not None else (None,)


def rows(cur: Cursor, stmt: Statement) -> list[Sequence[Any]]:
    cur.execute(*args(stmt))
    return list(results(cur).fetchall())


def prefixed(cur: Cursor, stmts: list[Statement]) -> Statement:
    """Run every statement of `stmts` but the last (the `SET LOCAL`s a dialect puts first) and
    return the last, for the caller to run as it reads it (`rows`, `rowcount`)."""
    for stmt in stmts[:-1]:
        execute(cur, stmt)
    return stmts[-1]


def columns(cur: Cursor, stmt: Statement) -> dict[str, str]:
    return {str(name).lower(): str(typ) for name, typ in rows(cur, stmt)}


def rowcount(cur: Cursor, stmt: Statement) -> int:
    """The rows a statement wrote: the driver's rowcount, or the count a `Statement.counted`
    batch selects."""
    if stmt.counted:
        (n,) = one(cur, stmt)
        return int(n or 0)
    cur.execute(*args(stmt))
    return max(int(cur.rowcount), 0)


def rollback(conn: Connection) -> None:
    try:
        conn.rollback()
    except Exception:  # noqa: BLE001 - the connection may be gone; the caller raises the real error
        pass


def close(conn: Connection) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - see _rollback
        pass


#: attempts of idempotent DDL that a concurrent installer made fail with "already exists"
INSTALL_ATTEMPTS = 3


def warn_about_name(dialect: Dialect, table: QueueAddress) -> None:
    """Log a warning when a queue or delayed table about to be created has a name an NServiceBus
    endpoint would refuse to start with (PostgreSQL: over 55 bytes): the database takes it."""
    problem = dialect.nservicebus_name_problem(table)
    if problem is not None:
        logging.getLogger("spark_qtransport.install").warning("creating %s: %s", dialect.qualified(table), problem)


def install(dialect: Dialect, cur: Cursor, statements: list[Statement]) -> None:
    """Run idempotent DDL (CREATE ... IF NOT EXISTS) in the caller's transaction.

    Another installer creating the same objects at the same moment (NServiceBus's installers take
    no lock) can make it fail with "already exists" (`Dialect.is_concurrent_ddl`). NServiceBus
    swallows those errors; here the statements are rolled back to a savepoint and run again, and
    IF NOT EXISTS then finds what the other installer made. Any other error propagates."""
    if not statements:
        return
    if not dialect.ddl_race_states:
        for stmt in statements:
            execute(cur, stmt)
        return
    savepoint = "sqlqueue_install"
    for n in range(1, INSTALL_ATTEMPTS + 1):
        execute(cur, dialect.savepoint(savepoint))
        try:
            for stmt in statements:
                execute(cur, stmt)
        except Exception as exc:
            if n == INSTALL_ATTEMPTS or not dialect.is_concurrent_ddl(exc):
                raise
            execute(cur, dialect.rollback_to_savepoint(savepoint))
            log.info("another installer created the same table meanwhile (%s); checking again",
                     dialect.error_text(exc))
            continue
        release = dialect.release_savepoint(savepoint)
        if release is not None:
            execute(cur, release)
        return


def describe(dialect: Dialect, exc: BaseException) -> str:
    """One line about an error for a log: ours as they are; a driver's without the lines that
    may quote row contents (see `Dialect.error_text`)."""
    return str(exc) if isinstance(exc, QTransportError) else dialect.error_text(exc)


def explain(dialect: Dialect, what: str, exc: Exception) -> QTransportError:
    """Our error for a driver error that is final: one line that names the operation (and with it
    the queue) and the driver's primary message, never the row contents or password a driver's
    full text may hold. Raise it `from exc`: the driver's error stays its cause."""
    text = dialect.error_text(exc)
    fields = {"operation": what, "sqlstate": dialect.sqlstate(exc)}
    if dialect.is_undefined_table(exc):
        return QueueNotFoundError(f"{what}: a table does not exist ({text})", **fields)
    return DatabaseError(f"{what} failed: {type(exc).__name__}: {text}", **fields)


def retrying(
    dialect: Dialect,
    fn: Callable[[Connection], T],
    *,
    connection: Callable[[], Connection],
    discard: Callable[[Connection], None],
    what: str,
    backoff: Backoff = BACKOFF,
    url: Any = None,
) -> T:
    """Run `fn(conn)` in a transaction and commit, through `with_retries`: after a transient fault
    (in `fn`, at commit or while connecting) roll back, `discard` the connection and run it again
    on a new one. A failure always rolls back. With `url`, the transaction is watched for a
    connection that hangs (`watchdog.py`, its `responseTimeout`).

    `fn` must be safe to run again after a failure whose commit may or may not have happened
    (the dispatch finds its own outbox record; claims and acknowledgements are idempotent)."""
    held: list[Connection] = []

    def attempt(_: int) -> T:
        held.clear()
        try:
            conn = connection()
            held.append(conn)
            with WATCHDOG.watching(dialect, url, conn, what):  # without a url: not watched
                result = fn(conn)
                conn.commit()
            return result
        except BaseException:
            if held:
                rollback(held[0])
            raise

    def drop(_: BaseException) -> None:
        if held:
            discard(held[0])

    return with_retries(dialect, what, attempt, backoff=backoff, after_failure=drop)


class Session:
    """One connection, opened when first needed, and transactions on it retried by the policy.
    `on_connect(conn)` runs on each new connection (set-up, locks); if it fails the connection is
    closed. After a transient fault the connection is dropped and the next attempt opens another.
    `backoff`: its retry policy; by default the URL's (`Backoff.of`: its `outageTimeout`);
    best-effort work, such as monitoring reports, gives up sooner."""

    def __init__(self, dialect: Dialect, url: Any, *, what: str = "",
                 on_connect: Callable[[Connection], None] | None = None, backoff: Backoff | None = None) -> None:
        self.dialect, self.url, self.what = dialect, url, what
        self.backoff = backoff if backoff is not None else Backoff.of(url)
        self._on_connect = on_connect
        self._conn: Connection | None = None
        #: connections opened and dropped so far: what was learnt on one (a claim's outcome, a
        #: lock) may not hold once it is gone, after a fault whose commit is unknown
        self.generation = 0

    @property
    def connected(self) -> bool:
        return self._conn is not None

    @property
    def current(self) -> Connection | None:
        """The open connection, or None (opens none)."""
        return self._conn

    def connection(self) -> Connection:
        if self._conn is None:
            conn = self.dialect.connect(self.url)
            self.generation += 1
            if self._on_connect is not None:
                try:
                    self._on_connect(conn)
                except BaseException:
                    close(conn)
                    raise
            self._conn = conn
        return self._conn

    def drop(self, conn: Connection | None = None) -> None:
        """Close the connection (after a fault); the next use opens a new one."""
        if self._conn is not None and (conn is None or conn is self._conn):
            close(self._conn)
            self._conn = None
            self.generation += 1

    def run(self, fn: Callable[[Connection], T], what: str | None = None) -> T:
        """`fn(conn)` in a transaction, committed; retried on a new connection after a transient fault."""
        return retrying(self.dialect, fn, connection=self.connection, discard=self.drop, what=what or self.what,
                        backoff=self.backoff, url=self.url)

    def close(self) -> None:
        if self._conn is not None:
            rollback(self._conn)
            self.drop()

"""What a receiver's main connection does once it opens: check the server and the queues, create
the claim table, take the endpoint's consumer lock. Also `Endpoint`, the queue as every piece of
the receiver sees it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...dialects import Connection, Cursor, Dialect, QueueAddress
from ...errors import ConsumerBusyError, QueueNotFoundError, SchemaError, field_error
from .. import session as db
from .. import settled
from ..routing import queue_shape_problem
from ..server import require_databases
from ..settings import CLAIM_PREPARED, CLAIM_TABLE
from .mode import ClaimMode

if TYPE_CHECKING:
    from ..settings import ReceiveSettings

__all__ = ["ConnectionFacts", "Endpoint", "LOCK_WAIT", "EndpointSetUp", "PreparedSlots", "look_ahead"]

log = logging.getLogger("spark_qtransport.receive")

#: how long a starting query waits for its endpoint's lock before ConsumerBusyError
LOCK_WAIT = 30.0


@dataclass
class Endpoint:
    """The queue one streaming query receives from, shared by the receiver's pieces. The one place
    the receiver holds its dialect: the pieces read it from here, never keep a copy."""

    options: ReceiveSettings
    dialect: Dialect
    claims: QueueAddress  # the queue's claim table
    #: the database has the settled-batches table (`transport.settled`): read tasks record their batches
    settling: bool = False
    #: where its claims are held (`claimMode`, decided by the set-up): the one place that says
    mode: ClaimMode = field(init=False)

    def __post_init__(self) -> None:
        self.mode = ClaimMode(self.dialect.prepared_claims)

    @property
    def queue_text(self) -> str:
        return self.dialect.format_address(self.options.queue)

    def what(self, operation: str) -> str:
        """An operation's name for errors and logs: it names the queue."""
        return f"{operation} on queue {self.queue_text}"


class PreparedSlots:
    """The server's prepared transactions a stream's queues may hold (`claimMode`): read once,
    when the first queue decides; each queue holding its claims in prepared transactions counts
    on `PER_QUEUE` of them (a claim made and not acknowledged, one claimed ahead), and the stream
    leaves half of what was free to the server's other users."""

    PER_QUEUE = 2

    def __init__(self) -> None:
        self.free: int | None = None
        self.setting: int | None = None
        self.taken = 0

    def take(self, dialect: Dialect, cur: Cursor) -> bool:
        if self.free is None:
            setting, used = db.one(cur, dialect.prepared_capacity())
            self.setting, self.free = int(setting), max(0, int(setting) - int(used))
        if self.taken + self.PER_QUEUE > self.free // 2:
            return False
        self.taken += self.PER_QUEUE
        return True


class ConnectionFacts:
    """What the set-ups of a stream's queues learned on its current main connection, so that a
    thousand queues ask it once: the server's version, and the queues every one of them names
    (an error queue, an audit queue) checked; and what `look_ahead` read for all of them in a
    few statements: each table's columns and id, the consumer locks taken. Forgotten when the
    connection changes."""

    def __init__(self) -> None:
        self._conn: Connection | None = None
        self.version: int | None = None
        self.checked: set[str] = set()
        #: by qualified name: a table's columns as `queue_columns` gives them ({}: no such table), its id
        self.columns: dict[str, dict[str, str]] = {}
        self.ids: dict[str, str] = {}
        #: (qualified claim table, consumer) whose consumer lock this connection holds
        self.locked: set[tuple[str, str]] = set()

    def on(self, conn: Connection) -> ConnectionFacts:
        if conn is not self._conn:
            self._conn, self.version, self.checked = conn, None, set()
            self.columns, self.ids, self.locked = {}, {}, set()
        return self

    def forget(self, qualified: str) -> None:
        """A table's columns and id are read again when next asked for (a queue's set-up has run)."""
        self.columns.pop(qualified, None)
        self.ids.pop(qualified, None)


def look_ahead(conn: Connection, set_ups: list[EndpointSetUp]) -> None:
    """Before the set-ups of many queues run on `conn` (a stream's new connection, or its first
    planning), read what each would ask alone in a few statements: every table's columns and id
    (`Dialect.columns_of`), then every consumer lock (`Dialect.try_lock_consumers`), into the
    stream's `ConnectionFacts`. Each set-up then judges what it found as before, and asks alone only
    for what is missing here (a lock another session holds, a table it creates). A thousand queues'
    set-ups: three statements, not five thousand. Nothing is read for a dialect without these
    statements, nor for fewer than two set-ups; a statement refused here is left to each set-up."""
    pending = [s for s in set_ups if s.conn is not conn]
    if len(pending) < 2:
        return
    d = pending[0].endpoint.dialect
    facts = pending[0].facts.on(conn)
    tables: dict[str, QueueAddress] = {}
    for s in pending:
        o = s.endpoint.options
        named = [s.endpoint.claims] if s.draining else [o.queue, o.error_queue, *o.platform_queues().values(), s.endpoint.claims]
        for address in named:
            tables.setdefault(d.qualified(address), address)
    names = [n for n in tables if n not in facts.columns]
    cur = conn.cursor()
    stmt = d.columns_of([tables[n] for n in names]) if names else None
    if stmt is None and names:
        return
    try:
        if stmt is not None:
            found: dict[str, dict[str, str]] = {n: {} for n in names}
            for i, column, typ, table_id in db.rows(cur, stmt):
                found[names[int(i)]][str(column)] = str(typ)
                facts.ids[names[int(i)]] = str(table_id)
            facts.columns.update(found)
        # the locks of the queues whose tables are there (a set-up that finds one missing takes none)
        pairs = [(s.endpoint.claims, s.endpoint.options.consumer) for s in pending
                 if facts.columns.get(d.qualified(s.endpoint.claims))
                 and (s.draining or facts.columns.get(d.qualified(s.endpoint.options.queue)))
                 and (d.qualified(s.endpoint.claims), s.endpoint.options.consumer) not in facts.locked]
        locks = d.try_lock_consumers(pairs) if pairs else None
        if locks is not None:
            for i, taken in db.rows(cur, locks):
                if taken:
                    claims, consumer = pairs[int(i)]
                    facts.locked.add((d.qualified(claims), consumer))
        conn.commit()
    except Exception as exc:
        if d.is_transient(exc.__cause__ or exc):
            raise
        db.rollback(conn)
        log.info("reading %d queues' set-ups together failed (%s); each queue's set-up asks alone", len(pending), exc)


class EndpointSetUp:
    """`on_connect` of the receiver's main session: runs on each new main connection and keeps the
    claim table's identity (`table_id`), warning when it changes while the query runs."""

    def __init__(self, endpoint: Endpoint, *, clock: Callable[[], float] = time.monotonic,
                 draining: bool = False) -> None:
        self.endpoint = endpoint
        #: a queue leaving a stream, maybe dropped: only its claim table and the lock are needed
        self.draining = draining
        self.table_id: str | None = None
        #: the connection this set-up last ran on (its consumer lock is held there)
        self.conn: Connection | None = None
        self._clock = clock
        #: how long the set-up waits for the consumer lock before ConsumerBusyError
        self.lock_wait = LOCK_WAIT
        #: the stream's share of the server's prepared transactions (`StreamSessions.join`)
        self.slots: PreparedSlots | None = None
        #: what the stream's other queues' set-ups learned on the connection (`StreamSessions.join`)
        self.facts = ConnectionFacts()
        self._mode_decided = False

    def ensure(self, conn: Connection) -> None:
        """The set-up on `conn`, unless it ran there already (a stream's shared connection runs
        every queue's set-up when it opens; a queue that joins later runs its own here)."""
        if self.conn is not conn:
            self(conn)

    def __call__(self, conn: Connection) -> None:
        """Check the queues, create our claim table, take the consumer lock (once per connection),
        in one transaction (and one more where DDL ran)."""
        cur, facts = conn.cursor(), self.facts.on(conn)
        try:
            self._set_up(conn, cur, facts)
        finally:  # what `look_ahead` read for this queue serves this set-up only: a later one asks afresh
            for table in (self.endpoint.options.queue, self.endpoint.claims):
                facts.forget(self.endpoint.dialect.qualified(table))

    def _set_up(self, conn: Connection, cur: Cursor, facts: ConnectionFacts) -> None:
        self._check_server(cur, facts)
        o = self.endpoint.options
        d, claims = self.endpoint.dialect, self.endpoint.claims
        if self.draining:
            if not self._columns(cur, claims):
                raise QueueNotFoundError(f"claim table {d.qualified(claims)} does not exist",
                                         queue=self.endpoint.queue_text)
        else:
            for name, address in (("queue", o.queue), ("error_queue", o.error_queue), *o.platform_queues().items()):
                shared = name != "queue" and f"{name} {d.qualified(address)}"
                if shared and shared in facts.checked:
                    continue  # (another queue of the stream names it too: checked on this connection)
                self._check_queue(conn, cur, name, address)
                if shared:
                    facts.checked.add(shared)
            self._create_claims(conn, cur)
        self.endpoint.settling = settled.exists(d, o.url, conn, settled.READER)
        self._lock_consumer(conn, cur)
        if not self._mode_decided and not self.draining:
            self._decide_mode(cur)
        table_id = facts.ids.pop(d.qualified(claims), None)
        if table_id is None:
            (table_id,) = db.one(cur, d.table_id(claims))
        conn.commit()
        if self.table_id is not None and str(table_id) != self.table_id:
            log.warning("claim table %s was recreated while this query ran", d.qualified(claims))
        self.table_id = str(table_id)
        self.conn = conn

    def _decide_mode(self, cur: Cursor) -> None:
        """Where this run holds its claims (`claimMode`): decided once, on the first connection."""
        d, o = self.endpoint.dialect, self.endpoint.options
        self._mode_decided = True
        if o.claim_mode == CLAIM_TABLE or not self.endpoint.mode.possible:
            return
        explicit = o.claim_mode == CLAIM_PREPARED
        slots = self.slots if self.slots is not None else PreparedSlots()
        if slots.take(d, cur):
            self.endpoint.mode.start_preparing()
            log.info("queue %s: claims are held by prepared transactions (claimMode %s; preparedClaimTimeout %s)",
                     self.endpoint.queue_text, o.claim_mode, db.seconds_text(o.prepared_timeout))
            return
        why = (f"the server allows {slots.setting} prepared transactions (max_prepared_transactions) and "
               f"{slots.free} were free when the stream started; a queue needs {PreparedSlots.PER_QUEUE}, and a "
               "stream leaves half of the free ones to others. Raise max_prepared_transactions (a server "
               "restart; `sqlqueue doctor` says by how much) to hold claims without writing them twice")
        if explicit and not slots.taken:
            raise field_error("claim_mode", f"prepared: {why}")
        log.info("queue %s: claims are held in the claim table (claimMode %s): %s", self.endpoint.queue_text,
                 o.claim_mode, why)

    def _check_server(self, cur: Cursor, facts: ConnectionFacts) -> None:
        d = self.endpoint.dialect
        check = d.server_check()
        if check is not None:
            if facts.version is None:
                (version,) = db.one(cur, check)
                facts.version = int(version)
            self.endpoint.dialect, problem = d.adapt_to_server(facts.version, self.endpoint.claims)
            if problem:
                raise field_error("url", problem, kind=SchemaError, queue=self.endpoint.queue_text)
        o = self.endpoint.options
        require_databases(cur, self.endpoint.dialect, (o.queue, o.error_queue, *o.platform_queues().values()),
                          queue=self.endpoint.queue_text)

    def _check_queue(self, conn: Connection, cur: Cursor, name: str, address: QueueAddress) -> None:
        """The queue settings field `name` gives exists (or is created) and is a queue table."""
        d = self.endpoint.dialect
        if name != "queue" and self.endpoint.options.routing.is_own_table(d, address):
            text = d.format_address(address)
            raise field_error(name, f"{text} is a table of the transport itself, not a queue", kind=SchemaError,
                              queue=text)
        cols = self._columns(cur, address)
        if not cols and self.endpoint.options.create_queues:
            db.warn_about_name(d, address)
            db.install(d, cur, d.create_queue(address))
            conn.commit()
            cols = db.columns(cur, d.queue_columns(address))
        text = d.format_address(address)
        if not cols:
            raise field_error(name, f"queue {text} does not exist; create it (the DDL in sql/, or set "
                              "`create_queues`)", kind=QueueNotFoundError, queue=text)
        shape = queue_shape_problem(cols)  # the routing path's own check, for our own queues too
        if shape is not None:
            raise field_error(name, f"table {text} {shape}", kind=SchemaError, queue=text)

    def _create_claims(self, conn: Connection, cur: Cursor) -> None:
        """DDL only for what is missing: once a DBA has created the tables (and, on PostgreSQL
        13-15, the helper function), table privileges are enough to run."""
        d, claims = self.endpoint.dialect, self.endpoint.claims
        columns = self._columns(cur, claims)
        ddl = [] if columns else d.create_claims(claims)
        helpers = d.helpers_exist(claims)
        if helpers is not None and not db.one(cur, helpers)[0]:
            ddl += d.create_helpers(claims)
        if ddl:
            db.install(d, cur, ddl)
            conn.commit()

    def _columns(self, cur: Cursor, table: QueueAddress) -> dict[str, str]:
        """`table`'s columns (`Dialect.queue_columns`), as `look_ahead` read them on this connection
        if it did; read once so (a queue dropped and created again later asks afresh)."""
        d = self.endpoint.dialect
        known = self.facts.columns.pop(d.qualified(table), None)
        return known if known is not None else db.columns(cur, d.queue_columns(table))

    def _lock_consumer(self, conn: Connection, cur: Cursor) -> None:
        """Take the session lock that makes this query the endpoint's only receiver on the queue.

        A driver that was just killed may leave a process that still holds it for a moment (its
        connection closes when that process notices), so wait a while before calling it busy.
        """
        d, o = self.endpoint.dialect, self.endpoint.options
        if (d.qualified(self.endpoint.claims), o.consumer) in self.facts.locked:
            return  # taken by `look_ahead` on this connection
        deadline = self._clock() + self.lock_wait
        warned = False
        while True:
            (locked,) = db.one(cur, d.try_lock_consumer(self.endpoint.claims, o.consumer))
            if locked:  # (a session's lock: the set-up's transaction goes on)
                return
            conn.commit()  # no transaction held open while waiting
            if self._clock() >= deadline:
                raise ConsumerBusyError(
                    f"endpoint {o.consumer!r} is already receiving from queue {d.format_address(o.queue)} "
                    f"in another running query (waited {self.lock_wait:.0f}s); give each query its own "
                    "`consumer`", field="consumer", queue=d.format_address(o.queue),
                )
            if not warned:
                log.warning("endpoint %r on %s is held by another session; waiting up to %.0fs",
                            o.consumer, d.format_address(o.queue), self.lock_wait)
                warned = True
            time.sleep(0.5)

    def unlock(self, conn: Connection) -> None:
        """Release the consumer lock before the connection closes (closing releases it anyway)."""
        d = self.endpoint.dialect
        try:
            db.rollback(conn)
            db.execute(conn.cursor(), d.unlock_consumer(self.endpoint.claims, self.endpoint.options.consumer))
            conn.commit()
            self.facts.locked.discard((d.qualified(self.endpoint.claims), self.endpoint.options.consumer))
            self.conn = None
        except Exception:  # noqa: BLE001 - closing the connection releases the lock anyway
            pass

"""What every database dialect provides: address parsing, identifier quoting and SQL statements.

A dialect never executes anything: each method returns a `Statement` (SQL text with quoted
identifiers inlined and every value as a driver parameter) that the dialect-free code in
`spark_qtransport.transport` runs on a DB-API connection. Only already-quoted identifiers are ever
formatted into SQL text.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

__all__ = ["QueueAddress", "Statement", "Dialect", "ClaimResult", "STAGED_COLUMNS", "TABLE_PRIVILEGES"]

#: columns of a staged row, in the order executors write them (see `Dialect.stage_rows`)
STAGED_COLUMNS = (
    "sink", "batch_id", "attempt", "kind", "route", "message_id", "headers", "body", "ttbr_ms", "delay_ms", "due",
)

#: the table privileges the connector ever needs (and `Dialect.grants` / `Dialect.privileges` take)
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")


def check_privileges(privileges: Sequence[str]) -> tuple[str, ...]:
    """Privilege names, upper-cased, each one of `TABLE_PRIVILEGES` (they are written into SQL)."""
    out = tuple(str(p).upper() for p in privileges)
    bad = [p for p in out if p not in TABLE_PRIVILEGES]
    if bad or not out:
        raise ConfigError(f"table privileges must be some of {', '.join(TABLE_PRIVILEGES)}, not {list(privileges)!r}")
    return out


@dataclass(frozen=True)
class QueueAddress:
    """A parsed, unquoted queue address. ``schema``/``catalog`` are None for the connection's default."""

    table: str
    schema: str | None = None
    catalog: str | None = None

    def with_table(self, table: str) -> QueueAddress:
        return QueueAddress(table, self.schema, self.catalog)

    def __str__(self) -> str:
        parts = [p for p in (self.catalog, self.schema, self.table) if p is not None]
        return ".".join(parts)


@dataclass(frozen=True)
class Statement:
    """One SQL statement: text plus bound parameters (a dict for psycopg, a tuple for pyodbc)."""

    sql: str
    params: Any = field(default=None)


@dataclass(frozen=True)
class ClaimResult:
    """What one claim transaction did."""

    deleted: int  # rows removed from the queue
    expired: int  # of which expired, dropped and counted
    poison: int  # of which moved raw to the error queue
    claimed: int  # of which inserted into the claim table
    max_claim: int | None  # highest claim sequence inserted, None if none
    max_source: int | None  # highest queue sequence seen, None if none
    min_claim: int | None = None  # lowest claim sequence inserted, None if none
    forward: int = 0  # claimed rows whose headers may name a ForwardDestination (text match)


def one_line(text: str) -> str:
    """The first non-blank line of an error's text, whitespace collapsed, passwords masked: a
    driver's later lines may quote the statement or the row at fault."""
    from ..connections import mask

    for line in text.splitlines():
        if line.strip():
            return mask(" ".join(line.split()))
    return ""


def check_name(kind: str, name: str, *, max_bytes: int) -> str:
    """Validate one identifier part; quoting makes any text safe, but some text is never a name."""
    if not name or not name.strip():
        raise ConfigError(f"{kind} name is empty")
    if "\x00" in name:
        raise ConfigError(f"{kind} name {name!r} contains a NUL character")
    if len(name.encode("utf-8")) > max_bytes:
        raise ConfigError(f"{kind} name {name!r} is longer than {max_bytes} bytes")
    return name


class Dialect(ABC):
    """The SQL of one database. Subclasses: `PostgresDialect`, `SqlServerDialect`."""

    name: str
    #: the schema used when an address names none
    default_schema: str
    #: longest table name the database accepts, in bytes
    max_table_bytes: int

    # -- addresses and identifiers ------------------------------------------------------------

    @abstractmethod
    def parse_address(self, text: str, *, option: str = "queue") -> QueueAddress:
        """Parse a queue address in this transport's syntax; errors name `option`."""

    @abstractmethod
    def format_address(self, address: QueueAddress) -> str:
        """The canonical address text, as it would appear in a ReplyToAddress header."""

    @abstractmethod
    def quote(self, name: str) -> str:
        """Quote one identifier part."""

    def qualified(self, address: QueueAddress) -> str:
        """The fully quoted table name (``"schema"."table"`` / ``[catalog].[schema].[table]``)."""
        schema = address.schema or self.default_schema
        parts = [schema, address.table]
        if address.catalog:
            parts.insert(0, address.catalog)
        return ".".join(self.quote(p) for p in parts)

    def companion(self, queue: QueueAddress, suffix: str) -> QueueAddress:
        """A table that belongs to a queue or endpoint, beside it: ``<queue>.<suffix>``
        (``Claims``, ``Delayed`` as NServiceBus names it, ``Staging``, ``Outbox``)."""
        name = f"{queue.table}.{suffix}"
        if len(name.encode("utf-8")) > self.max_table_bytes:
            raise ConfigError(
                f"queue name {queue.table!r} is too long: its table {name!r} would exceed "
                f"{self.max_table_bytes} bytes"
            )
        return queue.with_table(name)

    def claims_table(self, queue: QueueAddress) -> QueueAddress:
        """The claim table that belongs to a queue: ``<queue>.Claims`` beside it."""
        return self.companion(queue, "Claims")

    def index_name(self, table: QueueAddress, suffix: str) -> str:
        """The name of an index of ours on `table`: ``<table>_<suffix>``, or, where that would be
        longer than the database allows (PostgreSQL would cut it silently), the table name
        shortened with a digest of the whole, so the name still fits and stays unique."""
        import hashlib

        name = f"{table.table}_{suffix}"
        if len(name.encode("utf-8")) <= self.max_table_bytes:
            return name
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
        keep = self.max_table_bytes - len(suffix) - len(digest) - 2
        head = table.table.encode("utf-8")[:keep].decode("utf-8", errors="ignore")
        return f"{head}_{digest}_{suffix}"

    #: schemas (lower case) whose tables are the database's own, never a queue
    system_schemas: frozenset[str] = frozenset()

    def fold_name(self, name: str) -> str:
        """An identifier part as the database compares it (case-sensitive unless overridden)."""
        return name

    def is_system_schema(self, schema: str) -> bool:
        return schema.lower() in self.system_schemas

    def is_system_catalog(self, catalog: str) -> bool:
        """A database that holds only the server's own tables (SQL Server's master, msdb...)."""
        return False

    def schema_and_tables(self, schema: str, tables: list[str]) -> Statement | None:
        """One row: (does `schema` exist, which of `tables` exist in the default schema, shortest
        name first), for reading a dotted name typed by a person; None where dots never split
        names (SQL Server addresses use ``@``)."""
        return None

    # -- savepoints: one INSERT that may fail without aborting its transaction -----------------

    def savepoint(self, name: str) -> Statement:
        return Statement(f"SAVEPOINT {name}")

    def rollback_to_savepoint(self, name: str) -> Statement:
        return Statement(f"ROLLBACK TO SAVEPOINT {name}")

    def release_savepoint(self, name: str) -> Statement | None:
        return Statement(f"RELEASE SAVEPOINT {name}")

    # -- installers ---------------------------------------------------------------------------

    @abstractmethod
    def create_queue(self, queue: QueueAddress, *, seq_bits: int = 64) -> list[Statement]:
        """Idempotent DDL for an NServiceBus-compatible queue table."""

    @abstractmethod
    def create_claims(self, claims: QueueAddress) -> list[Statement]:
        """Idempotent DDL for a queue's claim table."""

    @abstractmethod
    def script(self, statements: list[Statement]) -> str:
        """The statements as a script for people (``sql/<dialect>/``, ``sqlqueue ddl``): parameters
        written as literals, ready to review and run by hand."""

    # -- receive ------------------------------------------------------------------------------

    @abstractmethod
    def table_id(self, table: QueueAddress) -> Statement:
        """One row, one column: an id that changes when the table is dropped and created again
        (NULL when it does not exist)."""

    def server_check(self) -> Statement | None:
        """One row, one column: the server's version number; None when nothing is checked."""
        return None

    def adapt_to_server(self, version: int, claims: QueueAddress) -> str | None:
        """Adapt the SQL to the server `server_check` found; the reason it cannot be used, or None."""
        return None

    def create_helpers(self, claims: QueueAddress) -> list[Statement]:
        """Idempotent DDL for server-side helpers the SQL needs on this server (none by default)."""
        return []

    def helpers_exist(self, claims: QueueAddress) -> Statement | None:
        """One row, one boolean: the helpers `create_helpers` makes are there (so no DDL runs).
        None when there are none to make."""
        return None

    @abstractmethod
    def queue_columns(self, table: QueueAddress) -> Statement:
        """Rows of (lower-cased column name, type name) of an ordinary table; none if there is no
        such table (a view, a foreign table or a system object has none either)."""

    @abstractmethod
    def try_lock_consumer(self, claims: QueueAddress, consumer: str) -> Statement:
        """One row, one boolean: a session-level lock on (claim table, consumer) was taken."""

    @abstractmethod
    def unlock_consumer(self, claims: QueueAddress, consumer: str) -> Statement:
        """Release the lock taken by `try_lock_consumer`."""

    @abstractmethod
    def peek(self, queue: QueueAddress, *, after: int, upto: int | None) -> Statement:
        """One row, one column: the lowest unlocked queue sequence > after (and <= upto), or NULL.

        Skips rows locked by other consumers and never blocks on them; takes no lock when the
        queue is empty, so an idle queue costs no write."""

    @abstractmethod
    def claim(
        self,
        queue: QueueAddress,
        claims: QueueAddress,
        error: QueueAddress,
        *,
        consumer: str,
        limit: int,
        after: int,
        upto: int | None,
    ) -> list[Statement]:
        """Move at most `limit` of the oldest unlocked queue rows (sequence > after, <= upto) into
        the claim table, dropping expired ones and moving poison ones raw to the error queue.
        The LAST statement returns one row shaped like `ClaimResult`'s fields, in order."""

    @abstractmethod
    def forward_candidates(self, claims: QueueAddress, consumer: str, *, lo: int, hi: int) -> Statement:
        """Rows (claim_seq, headers) of the consumer's claims in [lo, hi] whose headers text
        contains the ForwardDestination header name (decoded and checked by the caller)."""

    @abstractmethod
    def forward_claims(
        self, claims: QueueAddress, consumer: str, destination: QueueAddress, *, keys: list[int],
        headers: list[str], recoverable: bool = False,
    ) -> Statement:
        """Insert the consumer's claims `keys` (claim sequences) into `destination` with the given
        headers, in that order: same native id (a new one where it would clash with the
        destination's key), no expiry, body copied server-side. NServiceBus forwards so."""

    @abstractmethod
    def set_claim_headers(self, claims: QueueAddress, consumer: str, *, keys: list[int], headers: list[str]) -> Statement:
        """Replace the headers of the consumer's claims `keys`."""

    @abstractmethod
    def drop_claims(self, claims: QueueAddress, consumer: str, *, keys: list[int]) -> Statement:
        """Delete the consumer's claims `keys` (forwarded elsewhere in the same transaction)."""

    @abstractmethod
    def backlog(self, queue: QueueAddress) -> Statement:
        """One row, one column: an estimate of the messages waiting (span of unlocked sequences)."""

    @abstractmethod
    def max_claim(self, claims: QueueAddress, consumer: str) -> Statement:
        """One row: (max claim sequence or NULL, min claim sequence or NULL) for the consumer."""

    @abstractmethod
    def nth_claim(self, claims: QueueAddress, consumer: str, *, after: int, n: int) -> Statement:
        """One row (or none): the n-th (1-based) claim sequence of the consumer after `after`."""

    @abstractmethod
    def read_claims(self, claims: QueueAddress, consumer: str, *, after: int, upto: int) -> Statement:
        """Rows (claim_seq, native_id text, expires, headers, body, source_seq, claimed_at) ordered
        by claim_seq, for claim_seq in (after, upto]."""

    @abstractmethod
    def ack_claims(self, claims: QueueAddress, consumer: str, *, upto: int, batch: int) -> Statement:
        """Delete at most `batch` claims of the consumer with claim_seq <= upto (rowcount = deleted)."""

    def dispatch_plans(self) -> list[Statement]:
        """Run first in a dispatch transaction: plans that stay linear whatever the statistics say.
        A staging table swings between empty and a whole batch faster than statistics follow;
        last seen empty, it is estimated at one row, and a plan built on that (a nested loop over
        a full scan) costs seconds per batch instead of milliseconds."""
        return []

    def vacuum_due(self, table: QueueAddress, *, every_seconds: float, min_rows: int) -> Statement | None:
        """One row, two columns: (due, allowed). Due: `table` holds at least `min_rows` deleted
        rows and was not vacuumed in the last `every_seconds`. Allowed: the current role may vacuum
        it (owns it; PostgreSQL 17+: or holds MAINTAIN); a role with table privileges only leaves
        it to autovacuum. No row when there is no such table. None when the database reclaims the
        space of deleted rows by itself (SQL Server's ghost cleanup)."""
        return None

    def vacuum(self, table: QueueAddress) -> Statement | None:
        """Run outside any transaction: make the space of deleted rows reusable (see `vacuum_due`)."""
        return None

    @abstractmethod
    def max_source_seq(self, queue: QueueAddress) -> Statement:
        """One row, one column: the highest sequence in the queue (NULL when empty)."""

    # -- send: installers ---------------------------------------------------------------------

    @abstractmethod
    def create_staging(self, staging: QueueAddress) -> list[Statement]:
        """Idempotent DDL for an endpoint's staging table (rows written by executors, moved by
        the driver's dispatch). Columns: see `STAGED_COLUMNS`."""

    @abstractmethod
    def create_outbox(self, outbox: QueueAddress) -> list[Statement]:
        """Idempotent DDL for an endpoint's outbox: one row per dispatched (sink, batch id)."""

    @abstractmethod
    def create_delayed(self, delayed: QueueAddress) -> list[Statement]:
        """Idempotent DDL for ``<endpoint>.Delayed``, as NServiceBus creates it."""

    @abstractmethod
    def create_subscriptions(self, table: QueueAddress) -> list[Statement]:
        """Idempotent DDL for the ``SubscriptionRouting`` table, as NServiceBus creates it."""

    # -- send: staging (executors) ------------------------------------------------------------

    @abstractmethod
    def stage_rows(self, conn: Any, staging: QueueAddress, rows: list[tuple[Any, ...]]) -> None:
        """Bulk-write staged rows (tuples in `STAGED_COLUMNS` order) with the driver's fastest
        path (COPY, fast executemany). The one dialect method that executes: bulk APIs are
        driver-specific. Does not commit."""

    # -- send: dispatch (driver, one transaction) ----------------------------------------------

    @abstractmethod
    def outbox_insert(self, outbox: QueueAddress, *, sink: str, batch_id: int, fingerprint: str) -> Statement:
        """Record the batch unless recorded already; rowcount (or one row) says whether it was.

        Taking the row first makes a second dispatcher of the same batch wait, then see it."""

    @abstractmethod
    def outbox_get(self, outbox: QueueAddress, *, sink: str, batch_id: int) -> Statement:
        """One row (fingerprint, dispatched_at, sent, delayed, published) or none."""

    @abstractmethod
    def outbox_finish(
        self, outbox: QueueAddress, *, sink: str, batch_id: int, sent: int, delayed: int, published: int
    ) -> Statement:
        """Store the counts of a dispatched batch."""

    @abstractmethod
    def subscribers(self, table: QueueAddress, topics: list[str]) -> Statement:
        """Rows (queue address text, topic) subscribed to any of `topics`."""

    @abstractmethod
    def dispatch(
        self,
        staging: QueueAddress,
        destination: QueueAddress,
        *,
        attempts: list[str],
        route: str | None,
        publish_routes: list[str],
        recoverable: bool = False,
    ) -> Statement:
        """INSERT into one destination queue the staged rows of `attempts` sent to it (kind 's',
        `route`) and published to it (kind 'p', route in `publish_routes`): one row per message
        id (the first staged), in staging order, new native ids, Expires computed on the server.
        Rowcount = rows inserted."""

    @abstractmethod
    def staged_messages(
        self, staging: QueueAddress, *, attempts: list[str], route: str | None, publish_routes: list[str]
    ) -> Statement:
        """Rows (key, headers) of the staged rows `dispatch` would insert for this selection (one
        per message id, the first staged, in staging order): read when they cannot be sent."""

    @abstractmethod
    def move_staged(
        self, staging: QueueAddress, destination: QueueAddress, *, keys: list[Any], headers: list[str],
        recoverable: bool = False,
    ) -> Statement:
        """INSERT the staged rows `keys` (from `staged_messages`, in that order) into
        `destination` with new native ids, Expires NULL and the given headers; bodies copied
        server-side (error copies of messages that cannot be sent)."""

    @abstractmethod
    def dispatch_delayed(self, staging: QueueAddress, delayed: QueueAddress, *, attempts: list[str]) -> Statement:
        """INSERT the staged delayed rows (kind 'd') of `attempts` into the delayed table, due
        computed on the server (absolute due, or now + delay). Rowcount = rows inserted."""

    @abstractmethod
    def delete_staged(self, staging: QueueAddress, *, attempts: list[str]) -> Statement:
        """Delete the staged rows of `attempts`; rowcount = rows deleted."""

    @abstractmethod
    def delete_batch_leftovers(self, staging: QueueAddress, *, sink: str, batch_id: int) -> Statement:
        """Delete what failed task attempts of a batch staged."""

    # -- send: cleanup ---------------------------------------------------------------------------

    @abstractmethod
    def outbox_cleanup(self, outbox: QueueAddress, *, older_than_seconds: int, limit: int) -> Statement:
        """Delete at most `limit` outbox records older than the retention; rowcount = deleted."""

    @abstractmethod
    def staging_cleanup(self, staging: QueueAddress, *, older_than_seconds: int, limit: int) -> Statement:
        """Delete at most `limit` staged rows older than the retention (of batches never dispatched)."""

    # -- delayed delivery ------------------------------------------------------------------------

    @abstractmethod
    def any_due(self, delayed: QueueAddress) -> Statement:
        """Zero or one row: is any delayed message due? A read, no lock: an idle check costs no write."""

    @abstractmethod
    def lock_mover(self, delayed: QueueAddress) -> Statement:
        """One row, one boolean: this transaction is the delayed table's only mover (xact-scoped)."""

    @abstractmethod
    def due_delayed(self, delayed: QueueAddress, *, limit: int) -> Statement:
        """Lock and return at most `limit` due rows (key text, headers), oldest due first, skipping
        rows other transactions hold."""

    @abstractmethod
    def move_delayed(
        self, delayed: QueueAddress, destination: QueueAddress, *, keys: list[str], headers: list[str],
        recoverable: bool = False,
    ) -> Statement:
        """INSERT the delayed rows `keys` (in that order) into `destination` with new ids and the
        given headers (ForwardDestination removed), bodies copied server-side."""

    @abstractmethod
    def delete_delayed(self, delayed: QueueAddress, *, keys: list[str]) -> Statement:
        """Delete the delayed rows `keys`."""

    # -- operations (the sqlqueue CLI) ---------------------------------------------------------

    @abstractmethod
    def peek_messages(self, queue: QueueAddress, *, limit: int) -> Statement:
        """At most `limit` rows (native id text, expires, headers, body, sequence), oldest first.
        Changes nothing, takes no lock, never waits for other sessions' rows."""

    @abstractmethod
    def list_queues(self) -> Statement:
        """Rows (schema, table) of every table of the database shaped like a queue table (id,
        headers, body, expires and a sequence column), ordered."""

    @abstractmethod
    def queue_stats(self, queue: QueueAddress) -> Statement:
        """One row: (messages, expired, lowest sequence, highest sequence): counted, not estimated
        (SQL Server skips rows other sessions hold at that moment)."""

    @abstractmethod
    def delayed_stats(self, delayed: QueueAddress) -> Statement:
        """One row: (due now, not yet due, next due time or NULL) of a delayed table."""

    @abstractmethod
    def claim_stats(self, claims: QueueAddress) -> Statement:
        """Rows (consumer, claimed-but-unacknowledged count, oldest claimed_at) of a claim table."""

    @abstractmethod
    def count_rows(self, table: QueueAddress) -> Statement:
        """One row, one column: the table's row count."""

    @abstractmethod
    def purge_expired(self, queue: QueueAddress, *, limit: int) -> Statement:
        """Delete at most `limit` expired messages (skipping rows others hold); rowcount = deleted."""

    @abstractmethod
    def subscribe(self, table: QueueAddress, *, queue_address: str, endpoint: str, topic: str) -> Statement:
        """Upsert one subscription (endpoint, topic) -> queue address, as NServiceBus's SubscribeText."""

    @abstractmethod
    def unsubscribe(self, table: QueueAddress, *, endpoint: str, topic: str) -> Statement:
        """Delete one subscription; rowcount = deleted."""

    @abstractmethod
    def lock_messages(self, queue: QueueAddress, *, native_ids: list[str] | None, limit: int) -> Statement:
        """Lock and return rows (key text, native id text, headers) of a queue: those with the
        given native ids, else the oldest `limit`; skips rows others hold. The key is what
        `move_messages`/`delete_messages` take."""

    @abstractmethod
    def move_messages(
        self, queue: QueueAddress, destination: QueueAddress, *, keys: list[str], headers: list[str],
        recoverable: bool = False,
    ) -> Statement:
        """INSERT the rows `keys` of `queue` (in that order) into `destination` with new native
        ids, Expires NULL and the given headers; bodies copied server-side."""

    @abstractmethod
    def delete_messages(self, queue: QueueAddress, *, keys: list[str]) -> Statement:
        """Delete the rows `keys` of `queue`."""

    @abstractmethod
    def indexes(self, table: QueueAddress) -> Statement:
        """Rows (index name, comma-separated key columns lower-cased in key order, is clustered,
        is unique, filter predicate text or NULL) of a table's indexes, for schema checks."""

    # -- privileges (``sqlqueue ddl --grant-to``, ``sqlqueue doctor``) -------------------------

    @abstractmethod
    def grants(
        self, role: str, tables: Mapping[QueueAddress, Sequence[str]], *, queues: Collection[QueueAddress] = ()
    ) -> list[Statement]:
        """GRANT statements that give `role` the privileges (`TABLE_PRIVILEGES` names) on each
        table, and what using them needs besides (PostgreSQL: USAGE on each schema, and on the
        sequence of each table in `queues` granted INSERT: a ``serial`` seq column takes its next
        value with the inserting role's privileges). Tables must exist when they run."""

    @abstractmethod
    def privileges(self, table: QueueAddress, privileges: Sequence[str]) -> Statement:
        """Rows (what, granted) of the current role: each of `privileges` on `table` (none when
        there is no such table), and what using the table needs besides, named as in GRANT
        (PostgreSQL: ``USAGE ON SCHEMA ...``; with INSERT, ``USAGE ON SEQUENCE ...`` of each
        serial column). Needs no privilege on the table itself."""

    # -- connections --------------------------------------------------------------------------

    def streaming_cursor(self, conn: Any) -> Any:
        """A cursor whose fetchmany() streams rows instead of holding the whole result in memory."""
        return conn.cursor()

    @abstractmethod
    def connect(self, url: Any) -> Any:
        """Open a DB-API connection (autocommit off, READ COMMITTED) for a `ConnectionURL`."""

    @abstractmethod
    def is_transient(self, exc: BaseException) -> bool:
        """True for faults worth a retry on a new connection (connection lost, deadlock victim...)."""

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

    def error_text(self, exc: BaseException) -> str:
        """The driver's primary message on one line, for our errors and logs: never the lines a
        database adds that may copy row contents (PostgreSQL's DETAIL, CONTEXT, HINT), never a
        password."""
        return one_line(str(exc)) or type(exc).__name__

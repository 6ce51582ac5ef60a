"""One routing path for every queue address that comes from message data. Dialect-free.

Addresses from data: the sink's ``destination`` column (and with it `reply()`'s ReplyToAddress),
``SubscriptionRouting`` rows, ``NServiceBus.SqlServer.ForwardDestination`` on receive and in the
delayed mover, ``NServiceBus.FailedQ`` on ``sqlqueue error retry``. On a database shared with other
teams any of them may name any table, so before a message is written there, the `Router` checks
that the target

- parses as a queue address of the dialect;
- is outside the system schemas (``pg_catalog``, ``information_schema``, ``pg_toast``; ``sys``,
  ``INFORMATION_SCHEMA``) and is not one of our companion tables (``.Claims``, ``.Staging``,
  ``.Outbox``, ``.Delayed``, or the delayed table the options name: ``.<delayedTableSuffix>``,
  ``delayedTable``);
- passes the optional allow-list (options ``allowedSchemas`` / ``allowedQueues``);
- exists as an ordinary table with the columns NServiceBus needs (the reader's own check).

A target that fails never stops anything: `route_rows` sends that one message to the error queue
with NServiceBus's failure headers (``FailedQ`` = the address, ``ExceptionInfo.Message`` = the
reason) in the caller's transaction, and goes on. Each target's INSERT runs under a savepoint, so a
target that fails only when written to (a privilege missing, a trigger that raises, a constraint)
is routed the same way instead of aborting the claim or the batch.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..dialects import Cursor, Dialect, QueueAddress, Statement
from ..errors import ConfigError, QTransportError, QueueNotFoundError, field_error
from ..wire import encode_headers, failure_headers
from . import session as db

__all__ = [
    "COMPANION_SUFFIXES",
    "Item",
    "Refusal",
    "Routed",
    "Router",
    "RoutingPolicy",
    "Target",
    "allow_list",
    "insert_guarded",
    "queue_shape_problem",
    "route_rows",
]

log = logging.getLogger("spark_qtransport.routing")

#: tables of ours (and NServiceBus's delayed store, by its default suffix) beside a queue: never a
#: destination from data; a custom delayed suffix or table comes from the options (`RoutingPolicy.reserving`)
COMPANION_SUFFIXES = ("Claims", "Staging", "Outbox", "Delayed", "Batches")
#: columns every queue table has (lower case), besides its sequence column
QUEUE_COLUMNS = ("id", "headers", "body", "expires")
#: a queue table's FIFO column: PostgreSQL's seq, SQL Server's RowVersion
SEQUENCE_COLUMNS = ("seq", "rowversion")
#: the exception type written into the failure headers of a message that could not be routed
REFUSED_TYPE = "spark_qtransport.RoutingError"


def queue_shape_problem(columns: Mapping[str, str]) -> str | None:
    """Why a table with these (lower-cased) columns is not a queue table; None when it is one."""
    if not columns:
        return "does not exist"
    missing = [c for c in QUEUE_COLUMNS if c not in columns]
    if not any(c in columns for c in SEQUENCE_COLUMNS):
        missing.append("seq")
    if missing:
        return f"is not a queue table: missing column(s) {', '.join(sorted(missing))}"
    return None


@dataclass(frozen=True)
class RoutingPolicy:
    """The optional allow-list for addresses from data (the same for reader, writer and CLI).

    ``schemas``: the schemas a target may be in (None: any schema but the system ones).
    ``queues``: glob patterns (``fnmatch``) a target's table name must match (empty: any).
    ``own_suffixes``, ``own_tables``: tables of the transport's own besides `COMPANION_SUFFIXES`
    (a delayed table's custom suffix, an explicit delayed table), never a target (`reserving`).
    """

    schemas: tuple[str, ...] | None = None
    queues: tuple[str, ...] = ()
    own_suffixes: tuple[str, ...] = ()
    own_tables: tuple[QueueAddress, ...] = ()

    def reserving(self, *, suffix: str, table: QueueAddress | None) -> RoutingPolicy:
        """This policy, refusing also tables named ``<anything>.<suffix>`` and `table`."""
        suffixes = self.own_suffixes if suffix in (*COMPANION_SUFFIXES, *self.own_suffixes) else (*self.own_suffixes, suffix)
        tables = self.own_tables if table is None or table in self.own_tables else (*self.own_tables, table)
        return self if (suffixes, tables) == (self.own_suffixes, self.own_tables) else replace(
            self, own_suffixes=suffixes, own_tables=tables)

    def is_own_table(self, dialect: Dialect, address: QueueAddress) -> bool:
        """A table of the transport itself: a companion by its suffix, or one the options name."""
        fold = dialect.fold_name
        table = fold(address.table)
        if any(table.endswith("." + fold(s)) for s in (*COMPANION_SUFFIXES, *self.own_suffixes)):
            return True
        name = fold(dialect.qualified(address))
        return any(fold(dialect.qualified(t)) == name for t in self.own_tables)

    @classmethod
    def parse(cls, schemas: str | None, queues: str | None) -> RoutingPolicy:
        """The allow-list from its two comma-separated lists (None: not given); errors name the
        fields ``allowed_schemas`` and ``allowed_queues``."""
        return cls.allowing(allow_list(schemas, "allowed_schemas"), allow_list(queues, "allowed_queues"))

    @classmethod
    def allowing(cls, schemas: tuple[str, ...] | None, queues: tuple[str, ...] | None) -> RoutingPolicy:
        """The allow-list from its two lists, parsed (None: not given): the one place reader,
        writer and CLI make it."""
        return cls(schemas, queues or ())

    def problem(self, dialect: Dialect, address: QueueAddress) -> str | None:
        fold = dialect.fold_name
        schema = address.schema or dialect.default_schema
        if self.schemas is not None and fold(schema) not in {fold(s) for s in self.schemas}:
            return f"schema {schema!r} is not in the allowed schemas ({', '.join(self.schemas)})"
        if self.queues and not any(fnmatch.fnmatchcase(fold(address.table), fold(p)) for p in self.queues):
            return f"queue {address.table!r} matches none of the allowed queue patterns ({', '.join(self.queues)})"
        return None


def allow_list(raw: str | None, field: str) -> tuple[str, ...] | None:
    """The items of a comma-separated list (None: not given); an error names the settings `field`."""
    if raw is None:
        return None
    values = tuple(v.strip() for v in str(raw).split(",") if v.strip())
    if not values:
        raise field_error(field, "is empty: give a comma-separated list, or leave it out")
    if any("\x00" in v for v in values):
        raise field_error(field, "contains a NUL character")
    return values


@dataclass(frozen=True)
class Target:
    """A checked destination: an existing queue table the allow-list admits."""

    address: QueueAddress
    name: str  # quoted, qualified: the key targets are grouped by
    text: str  # canonical address text (as in a ReplyToAddress header)
    columns: Mapping[str, str]


@dataclass(frozen=True)
class Refusal:
    """Why a message cannot go where its data says: `failed_q` is the address as given."""

    failed_q: str
    reason: str

    @property
    def message(self) -> str:
        return f"cannot deliver the message to {self.failed_q or '(no address)'}: {self.reason}"


class Router:
    """Resolves addresses from data to checked `Target`s, one look-up per distinct address.

    A router caches what it found for the life of one transaction (or one batch of them): make
    a new one, or call `forget`, whenever tables may have changed since.
    """

    def __init__(self, dialect: Dialect, policy: RoutingPolicy | None = None) -> None:
        self.dialect = dialect
        self.policy = policy or RoutingPolicy()
        self._found: dict[str, Target | Refusal] = {}

    def forget(self) -> None:
        self._found.clear()

    def resolve(self, cur: Cursor, text: str | None, *, source: str = "address") -> Target | Refusal:
        """Parse and check an address given as text (a header, a column, a subscription row:
        `source` says which, in the refusal's reason)."""
        if text is None or not str(text).strip():
            return Refusal("", "the message names no destination queue")
        text = str(text)
        try:
            address = self.dialect.parse_address(text, field=source)
        except ConfigError as exc:
            return Refusal(text, f"not a queue address ({exc})")
        return self.target(cur, address, given=text)

    def target(self, cur: Cursor, address: QueueAddress, *, given: str | None = None) -> Target | Refusal:
        """Check a parsed address: system schema, companion table, allow-list, queue shape."""
        d = self.dialect
        try:
            name = d.qualified(address)
        except ConfigError as exc:
            return Refusal(given or str(address), f"not a queue address ({exc})")
        found = self._found.get(name)
        if found is None:
            found = self._check(cur, address, name)
            self._found[name] = found
        if isinstance(found, Refusal) and given is not None and found.failed_q != given:
            return Refusal(given, found.reason)
        return found

    def trusted(self, cur: Cursor, address: QueueAddress) -> Target | Refusal:
        """A queue named by an option, not by data (the endpoint's own queue): no allow-list,
        but it must exist and be queue-shaped."""
        d = self.dialect
        return self._queue(cur, address, d.qualified(address), d.format_address(address))

    def configured(self, cur: Cursor, address: QueueAddress, *, field: str) -> Target:
        """Like `trusted`, for a queue the work cannot go on without (the error queue): a
        `QueueNotFoundError` naming the settings field when it is missing or not a queue."""
        found = self.trusted(cur, address)
        if isinstance(found, Refusal):
            raise field_error(field, f"queue {found.reason}; create it (sqlqueue create-queue, the DDL in sql/, "
                              "or set `create_queues`)", kind=QueueNotFoundError, queue=found.failed_q)
        return found

    def _queue(self, cur: Cursor, address: QueueAddress, name: str, text: str) -> Target | Refusal:
        """The table's columns: a `Target` if it is a queue table, else why not."""
        columns = db.columns(cur, self.dialect.queue_columns(address))
        shape = queue_shape_problem(columns)
        if shape is not None:
            return Refusal(text, f"{name} {shape}")
        return Target(address, name, text, columns)

    def _check(self, cur: Cursor, address: QueueAddress, name: str) -> Target | Refusal:
        d = self.dialect
        text = d.format_address(address)
        schema = address.schema or d.default_schema
        if d.is_system_schema(schema) or (address.catalog is not None and d.is_system_catalog(address.catalog)):
            return Refusal(text, f"{name} is a system table, not a queue")
        if self.policy.is_own_table(d, address):
            return Refusal(text, f"{name} is a table of the transport itself, not a queue")
        problem = self.policy.problem(d, address)
        if problem is not None:
            return Refusal(text, problem)
        return self._queue(cur, address, name, text)


@dataclass
class Item:
    """One message to route: `key` names it in its source table; `headers` are what it gets at
    its destination (None: the source's headers text was unreadable, `raw` goes to the error
    queue as it is); `to` is its destination: address text to check, or already decided."""

    key: Any
    headers: dict[str, Any] | None
    to: str | Target | Refusal | None
    raw: str | None = None


@dataclass
class Routed:
    """What `route_rows` did."""

    moved: dict[str, int] = field(default_factory=dict)  # canonical address -> messages
    failed: int = 0  # to the error queue
    kept: list[tuple[Any, str]] = field(default_factory=list)  # (key, reason): left where they are


#: copies rows `keys` of the source into a target with the given headers text (one per key)
Insert = Callable[[Target, list[Any], list[str]], Statement]


def route_rows(
    cur: Cursor,
    router: Router,
    items: Iterable[Item],
    *,
    insert: Insert,
    delete: Callable[[list[Any]], Statement] | None,
    error_queue: Callable[[], Target] | None,
    source: str,
    endpoint: str,
) -> Routed:
    """Move messages from one source table to the queues their data names, in the caller's
    transaction: group by target, insert each group under a savepoint, then delete what moved.

    A message whose target is refused (or whose group's INSERT fails for good) goes to the
    error queue (`error_queue()`, looked up only then) with NServiceBus's failure headers; with
    no error queue it stays where it is (``Routed.kept``). Transient faults propagate: the
    caller's transaction is retried whole."""
    d = router.dialect
    result = Routed()
    groups: dict[str, tuple[Target, list[Item]]] = {}
    to_error: list[tuple[Item, Refusal | None]] = []  # None: unreadable headers, copied raw
    for item in items:
        to = item.to
        if isinstance(to, str) or to is None:
            to = router.resolve(cur, to)
        if item.headers is None:
            to_error.append((item, None))
        elif isinstance(to, Refusal):
            to_error.append((item, to))
        else:
            groups.setdefault(to.name, (to, []))[1].append(item)
    moved: list[Any] = []
    for target, group in groups.values():
        _, problem = insert_guarded(
            cur, d, insert(target, [i.key for i in group], [encode_headers(i.headers or {}) for i in group]))
        if problem is None:
            moved += [i.key for i in group]
            result.moved[target.text] = result.moved.get(target.text, 0) + len(group)
        else:
            refusal = Refusal(target.text, f"writing to {target.name} failed: {problem}")
            to_error += [(i, refusal) for i in group]
    if to_error:
        if error_queue is None:
            result.kept += [(i.key, r.reason if r else "its headers are not a flat JSON object") for i, r in to_error]
        else:
            error = error_queue()
            headers = [
                encode_headers(failure_headers(
                    i.headers or {}, failed_q=r.failed_q, exception_type=REFUSED_TYPE, message=r.message,
                    source=source, endpoint=endpoint))
                if r is not None else (i.raw or "")
                for i, r in to_error
            ]
            db.execute(cur, insert(error, [i.key for i, _ in to_error], headers))
            moved += [i.key for i, _ in to_error]
            result.failed = len(to_error)
            for r in {(r.failed_q, r.reason): r for _, r in to_error if r is not None}.values():
                log.warning("%s: a message went to %s: %s", source, error.text, r.message)
    if moved and delete is not None:
        db.execute(cur, delete(moved))
    return result


_SAVEPOINT = "sqlqueue_route"


def insert_guarded(cur: Cursor, d: Dialect, stmt: Statement | Callable[[], int]) -> tuple[int, str | None]:
    """Run one INSERT (a statement, or a function writing rows and returning how many) under a
    savepoint: (rows inserted, None) when it worked; (0, the reason) when it failed for good,
    rolled back to the savepoint so the transaction goes on. Transient faults propagate: the
    caller's transaction is retried whole."""
    db.execute(cur, d.savepoint(_SAVEPOINT))
    try:
        inserted = stmt() if callable(stmt) else db.rowcount(cur, stmt)
    except QTransportError:
        raise
    except Exception as exc:
        if d.is_transient(exc):
            raise
        db.execute(cur, d.rollback_to_savepoint(_SAVEPOINT))
        return 0, d.error_text(exc)
    release = d.release_savepoint(_SAVEPOINT)
    if release is not None:
        db.execute(cur, release)
    return inserted, None

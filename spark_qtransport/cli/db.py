"""A command's database: one `Session` (one connection, the package's retry policy) and how a
queue or endpoint name given on the command line becomes an address.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar

import click

from ..dialects import Connection, Dialect, QueueAddress, Statement, dialect_named
from ..errors import ConfigError, QueueNotFoundError
from ..transport import session as db
from ..transport.delayed import DEFAULT_DELAYED_SUFFIX, DelayedTableRule
from ..transport.routing import queue_shape_problem
from ..transport.session import Backoff, Session
from .app import command_what, delayed_rule, need_url

__all__ = ["CommandDb", "Peeked", "PeekedDelayed", "open_db", "resolve"]

T = TypeVar("T")

#: an NServiceBus endpoint name with dots (Shop.Web, Sales.Analytics): letters, digits, _ and -
_ENDPOINT_NAME = re.compile(r"[\w-]+(?:\.[\w-]+)+")

#: the tables a dotted name may already stand for, besides the queue itself
_COMPANIONS = ("Staging", "Outbox", DEFAULT_DELAYED_SUFFIX, "Claims")
#: what the connector's tables beside a queue or endpoint are, for a command given one as a queue
_COMPANION_KINDS = {"Claims": "the connector's claim table of queue", "Staging": "the sink's staging table of endpoint",
                    "Outbox": "the sink's outbox table of endpoint",
                    "Delayed": "the delayed table of endpoint"}
#: what a command can do with such a table instead
_COMPANION_ADVICE = {"Delayed": "; `sqlqueue peek` lists its messages, `sqlqueue stats` counts its due and pending messages, `sqlqueue move-delayed` "
                                "delivers the due ones"}


#: the columns of a delayed table (NServiceBus's: headers, body, due and a sequence or key)
DELAYED_COLUMNS = ("headers", "body", "due")

#: the bytes of each body `peek` reads: enough for PREVIEW_CHARS characters of UTF-8 text
PREVIEW_CHARS = 60
PREVIEW_BYTES = 4 * PREVIEW_CHARS


class Peeked(NamedTuple):
    """A message as `Dialect.peek_messages` reads it, oldest first: the start of its body only."""

    native_id: Any
    expires_value: Any  # a datetime, or None where it is NULL or `expires_text` says what it is
    expires_text: str | None
    headers: str | None
    body_start: bytes | None
    body_bytes: int | None
    seq: int

    @property
    def expires(self) -> Any:
        """Expires as it may be shown: a datetime, or text such as ``infinity``, or None."""
        return self.expires_value if self.expires_text is None else self.expires_text

    @property
    def preview(self) -> str:
        return preview_of(self.body_start, self.body_bytes)

    @property
    def cut(self) -> bool:
        return is_cut(self.body_start, self.body_bytes)


class PeekedDelayed(NamedTuple):
    """A message as `Dialect.peek_delayed` reads it, the soonest due first: the start of its body only."""

    due: Any
    headers: str | None
    body_start: bytes | None
    body_bytes: int | None

    @property
    def preview(self) -> str:
        return preview_of(self.body_start, self.body_bytes)

    @property
    def cut(self) -> bool:
        return is_cut(self.body_start, self.body_bytes)


def preview_of(body_start: bytes | None, body_bytes: int | None) -> str:
    """A body's first PREVIEW_CHARS characters, ``...`` where it goes on; ``(null)`` for a NULL
    body; a body that is not text (not UTF-8, or control characters other than white space: the
    monitoring queue's binary reports, a file) as ``(binary, N bytes) 7f 45 4c ...``, its first
    bytes in hex."""
    if body_start is None:
        return "(null)"
    start = bytes(body_start)
    text = _text_of(start, whole=int(body_bytes or 0) <= len(start))
    if text is None:
        shown = " ".join(f"{b:02x}" for b in start[:PREVIEW_CHARS // 3])
        return f"(binary, {int(body_bytes or len(start)):,} bytes) {shown}" + (
            " ..." if int(body_bytes or 0) > PREVIEW_CHARS // 3 else "")
    return text[:PREVIEW_CHARS] + ("..." if is_cut(body_start, body_bytes) else "")


def is_cut(body_start: bytes | None, body_bytes: int | None) -> bool:
    """Whether a body goes on beyond its `preview_of`."""
    if body_start is None:
        return False
    start = bytes(body_start)
    return int(body_bytes or 0) > len(start) or len(start.decode("utf-8", errors="replace")) > PREVIEW_CHARS


def _text_of(start: bytes, *, whole: bool) -> str | None:
    """`start` as text, None when it is not: invalid UTF-8 (a character cut at the end of a body's
    first bytes is no fault), or a control character other than tab, newline and carriage return."""
    for cut in (0,) if whole else range(4):
        try:
            text = start[:len(start) - cut].decode("utf-8")
            break
        except UnicodeDecodeError:
            continue
    else:
        return None
    if any((ord(c) < 0x20 and c not in "\t\n\r") or ord(c) == 0x7F for c in text):
        return None
    return text


class CommandDb:
    """The statements a command runs, each a transaction of the session (retried after a
    transient fault), and the addresses it reads from the command line."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.d: Dialect = session.dialect

    def run(self, fn: Callable[[Connection], T]) -> T:
        return self.session.run(fn)

    def all(self, stmt: Statement) -> list[tuple[Any, ...]]:
        return self.run(lambda conn: [tuple(r) for r in db.rows(conn.cursor(), stmt)])

    def one(self, stmt: Statement) -> tuple[Any, ...]:
        rows = self.all(stmt)
        return rows[0] if rows else (None,)

    def rowcount(self, stmt: Statement) -> int:
        return self.run(lambda conn: db.rowcount(conn.cursor(), stmt))

    def execute_all(self, stmts: list[Statement]) -> None:
        """Installers in one transaction: idempotent, safe to run again after a fault and beside
        another installer creating the same tables (`session.install`)."""
        self.run(lambda conn: db.install(self.d, conn.cursor(), stmts))

    def peek(self, address: QueueAddress, limit: int) -> list[Peeked]:
        """The oldest `limit` messages of a queue, left where they are (the start of each body)."""
        return [Peeked(*row) for row in self.all(self.d.peek_messages(address, limit=limit, preview=PREVIEW_BYTES))]

    def peek_delayed(self, delayed: QueueAddress, limit: int) -> list[PeekedDelayed]:
        """The `limit` messages of a delayed table due soonest, left where they are."""
        stmt = self.d.peek_delayed(delayed, limit=limit, preview=PREVIEW_BYTES)
        return [PeekedDelayed(*row) for row in self.all(stmt)]

    def exists(self, address: QueueAddress) -> bool:
        return bool(self.all(self.d.queue_columns(address)))

    def address(self, text: str, option: str = "QUEUE") -> QueueAddress:
        """A queue or endpoint name from the command line, dotted endpoint names included (`resolve`)."""
        return self.d.parse_address(resolve(self.d, text, option=option, facts=self.one), option=option)

    def delayed_rule(self, table: str | None, suffix: str | None, *, names: int = 1) -> DelayedTableRule:
        """The rule of the --delayed-table / --delayed-suffix flags (the table read as `address` reads names)."""
        resolved = None if table is None else resolve(self.d, table, option="--delayed-table", facts=self.one)
        return delayed_rule(self.d, resolved, suffix, names=names)

    def peekable(self, text: str) -> tuple[QueueAddress, bool]:
        """A queue's address, or a delayed table's (then True): the tables `peek` reads."""
        address = self.address(text)
        columns = dict(self.all(self.d.queue_columns(address)))
        if columns and queue_shape_problem(columns) is not None and all(c in columns for c in DELAYED_COLUMNS):
            return address, True
        return self._queue_shaped(address, columns, "QUEUE"), False

    def queue(self, text: str, option: str = "QUEUE") -> QueueAddress:
        """An existing queue's address; a table of another shape (the connector's own tables
        beside a queue, anything else) is named for what it is."""
        address = self.address(text, option=option)
        return self._queue_shaped(address, dict(self.all(self.d.queue_columns(address))), option)

    def _queue_shaped(self, address: QueueAddress, columns: dict[str, str], option: str) -> QueueAddress:
        """`address` when its table's `columns` are a queue's; else the error naming what it is."""
        name = self.d.format_address(address)
        if not columns:
            raise QueueNotFoundError(f"queue {name} does not exist", queue=name, option=option)
        problem = queue_shape_problem(columns)
        if problem is not None:
            owner, dot, suffix = address.table.rpartition(".")
            what = _COMPANION_KINDS.get(suffix) if dot else None
            if what is not None:
                raise ConfigError(f"{name} is {what} {self.d.format_address(address.with_table(owner))}, not a queue"
                                  + _COMPANION_ADVICE.get(suffix, ""), queue=name, option=option)
            raise ConfigError(f"{name} is not a queue: {problem}", queue=name, option=option)
        return address


@contextmanager
def open_db(url: str | None, *, attempts: int | None = None) -> Iterator[CommandDb]:
    """The command's database (its --url must be given); the connection is closed at the end.
    Its transactions ride through an outage of the URL's `outageTimeout`, or give up after
    `attempts` (a command that tries again by itself, as a scrape)."""
    parsed = need_url(url)
    session = Session(dialect_named(parsed.dialect), parsed, what=command_what(),
                      backoff=Backoff.of(parsed, attempts=attempts))
    try:
        yield CommandDb(session)
    finally:
        session.close()


def resolve(d: Dialect, text: str, *, option: str,
            facts: Callable[[Statement], tuple[Any, ...]] | None) -> str:
    """How every command reads a queue or endpoint name given on the command line: the text to use.

    PostgreSQL addresses split at the first unquoted dot (``billing.Invoices`` is schema
    ``billing``, table ``Invoices``), but NServiceBus endpoint names have dots. A dotted name
    without quotes, ``Shop.Web``, is read as:

    - the table ``"public"."Shop.Web"`` when there is no schema ``Shop`` (whether or not that
      table, or its ``.Staging``/``.Outbox``/``.Delayed``/``.Claims`` tables, exist yet);
    - ``"Shop"."Web"`` when the schema ``Shop`` exists and none of those tables does;
    - an error naming both quoted forms when both the schema and such a table exist.

    Quoted names (``'"Shop"."Web"'``, ``'"Shop.Web"'``), names without dots and SQL Server
    addresses (``table@schema``, where a dot is part of the table name) are taken as written.
    Without `facts` (a query's one row; ``ddl`` needs no connection) nothing is known to exist.
    """
    address = d.parse_address(text, option=option)
    plain = text.strip()
    if not d.dot_splits_schema or address.schema is None or '"' in plain:
        return text
    whole = d.quote(plain)
    d.parse_address(whole, option=option)  # a name too long as one table fails here
    dotted_endpoint = bool(_ENDPOINT_NAME.fullmatch(plain))
    if facts is None:
        return whole if dotted_endpoint else text
    stmt = d.schema_and_tables(str(address.schema), [plain, *(f"{plain}.{suffix}" for suffix in _COMPANIONS)])
    if stmt is None:
        return text
    schema_exists, tables = facts(stmt)
    if schema_exists and tables:
        split, joined = d.format_address(address), d.format_address(QueueAddress(plain))
        found = d.format_address(QueueAddress(str(tables[0])))
        raise click.UsageError(
            f"{option} {plain} is ambiguous: schema {d.quote(str(address.schema))} exists and so does table {found}; "
            f"quote it: '{split}' or '{joined}'")
    return whole if not schema_exists and dotted_endpoint else text

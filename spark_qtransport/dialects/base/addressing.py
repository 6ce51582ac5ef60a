"""Addresses and identifiers: parsing, quoting, canonical text and the tables beside a queue."""

from __future__ import annotations

from abc import ABC, abstractmethod

from ...errors import ConfigError, QTransportError, field_error
from .values import QueueAddress, Statement


class AddressingSql(ABC):
    """How a database names tables: what every other feature builds its SQL on."""

    name: str
    #: the schema used when an address names none
    default_schema: str
    #: longest identifier (table, schema, role name) the database accepts, in `length_unit`s
    max_table_bytes: int
    #: what `max_table_bytes` counts (see `name_length`)
    length_unit = "bytes"
    #: an unquoted dot splits schema from table (PostgreSQL's ``billing.Invoices``); where it does
    #: not (SQL Server's ``table@schema``), a dot is part of the table name
    dot_splits_schema = False

    def name_length(self, name: str) -> int:
        """The length the database limits an identifier by (UTF-8 bytes unless overridden)."""
        return len(name.encode("utf-8"))

    def check_name(self, kind: str, name: str, *, option: str | None = None) -> str:
        """Validate one identifier part; quoting makes any text safe, but some text is never a name."""
        if not isinstance(name, str) or not name or not name.strip():
            raise ConfigError(f"{kind} name is empty", option=option)
        if "\x00" in name:
            raise ConfigError(f"{kind} name {name!r} contains a NUL character", option=option)
        if self.name_length(name) > self.max_table_bytes:
            raise ConfigError(f"{kind} name {name!r} is longer than {self.max_table_bytes} {self.length_unit}",
                              option=option)
        return name

    def nservicebus_name_problem(self, table: QueueAddress) -> str | None:
        """Why an NServiceBus endpoint of this transport would refuse to start with `table` as one
        of its queues or as its ``<endpoint>.Delayed`` table (a name the database takes but
        NServiceBus does not), or None."""
        return None

    #: a valid address, named in the error about an empty one
    address_example: str
    #: whether white space around an address is dropped (NServiceBus's SQL Server parser keeps it)
    trims_addresses = True

    def parse_address(self, text: str, *, option: str = "queue", field: str | None = None) -> QueueAddress:
        """Parse a queue address in this transport's syntax (`split_address`) and check its
        names (`check_address`); errors name `option` (as a front end calls it) or, given, the
        settings `field` (for the front end to name: `errors.named`)."""
        def refuse(detail: str, queue: str | None = None) -> QTransportError:
            if field is not None:
                return field_error(field, detail, queue=queue) if queue else field_error(field, detail)
            return ConfigError(f"option '{option}'{'' if detail.startswith('is ') else ':'} {detail}", option=option,
                               queue=queue)

        if text is None or not str(text).strip():
            raise refuse(f"is empty: give a queue name such as {self.address_example}")
        text = str(text).strip() if self.trims_addresses else str(text)
        try:
            address = self.split_address(text)
            self.check_address(address)
        except ConfigError as exc:
            raise refuse(f"invalid queue address {text!r}: {exc}", queue=text) from None
        return address

    @abstractmethod
    def split_address(self, text: str) -> QueueAddress:
        """The parts of an address, unquoted and not yet checked."""

    def check_address(self, address: QueueAddress) -> None:
        """Check each name of an address (see `check_name`)."""
        for kind, part in (("table", address.table), ("schema", address.schema), ("catalog", address.catalog)):
            if part is not None:
                self.check_name(kind, part)

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
        if self.name_length(name) > self.max_table_bytes:
            raise ConfigError(
                f"queue name {queue.table!r} is too long: its table {name!r} would exceed "
                f"{self.max_table_bytes} {self.length_unit}",
                queue=str(queue),
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

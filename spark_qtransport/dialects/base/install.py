"""Installers: idempotent DDL, scripts for people, and adapting the SQL to the server found."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ...errors import ConfigError
from .addressing import AddressingSql
from .values import QueueAddress, Statement

if TYPE_CHECKING:
    from typing_extensions import Self

class InstallSql(AddressingSql):
    """The tables (and server-side helpers) the connector creates."""

    #: the type of a queue table's sequence column, by its width in bits
    seq_types: Mapping[int, str]

    def seq_type(self, seq_bits: int) -> str:
        """The sequence column type of a new queue table `seq_bits` wide (32: PostgreSQL's serial, as
        NServiceBus makes it there; NServiceBus's SQL Server RowVersion is always bigint)."""
        seq_type = self.seq_types.get(seq_bits)
        if seq_type is None:
            raise ConfigError(f"seq_bits must be 32 or 64, not {seq_bits!r}", option="--seq-bits")
        return seq_type

    @abstractmethod
    def create_queue(self, queue: QueueAddress, *, seq_bits: int = 64) -> list[Statement]:
        """Idempotent DDL for an NServiceBus-compatible queue table."""

    @abstractmethod
    def create_claims(self, claims: QueueAddress) -> list[Statement]:
        """Idempotent DDL for a queue's claim table. A table an earlier version made (with a
        ``failed`` column, or without one) is used as it is."""

    @abstractmethod
    def create_staging(self, staging: QueueAddress) -> list[Statement]:
        """Idempotent DDL for an endpoint's staging table (rows written by executors, moved by
        the driver's dispatch). Columns: see `STAGED_COLUMNS`."""

    @abstractmethod
    def create_outbox(self, outbox: QueueAddress) -> list[Statement]:
        """Idempotent DDL for an endpoint's outbox: one row per dispatched (sink, batch id)."""

    @abstractmethod
    def create_batches(self, table: QueueAddress) -> list[Statement]:
        """Idempotent DDL for the database's settled-batches table (`settled.py`)."""

    @abstractmethod
    def create_delayed(self, delayed: QueueAddress) -> list[Statement]:
        """Idempotent DDL for ``<endpoint>.Delayed``, as NServiceBus creates it."""

    @abstractmethod
    def create_subscriptions(self, table: QueueAddress) -> list[Statement]:
        """Idempotent DDL for the ``SubscriptionRouting`` table, as NServiceBus creates it."""

    @abstractmethod
    def script(self, statements: list[Statement]) -> str:
        """The statements as a script for people (``sql/<dialect>/``, ``sqlqueue ddl``): parameters
        written as literals, ready to review and run by hand."""

    def server_check(self) -> Statement | None:
        """One row, one column: the server's version number; None when nothing is checked."""
        return None

    def database_levels(self, catalogs: Sequence[str]) -> Statement | None:
        """Rows (database name, compatibility level) of the connection's database and each of
        `catalogs`; None where the database has no such level."""
        return None

    def level_problem(self, database: str, level: int) -> str | None:
        """Why a database at compatibility `level` cannot run the dialect's SQL, with the fix; None
        when it can."""
        return None

    def adapt_to_server(self, version: int, claims: QueueAddress) -> tuple[Self, str | None]:
        """(this dialect configured for the server `server_check` found, the reason that server
        cannot be used or None). Dialects are immutable: the adapted one is a copy."""
        return self, None

    def create_helpers(self, claims: QueueAddress) -> list[Statement]:
        """Idempotent DDL for server-side helpers the SQL needs on this server (none by default)."""
        return []

    def helpers_exist(self, claims: QueueAddress) -> Statement | None:
        """One row, one boolean: the helpers `create_helpers` makes are there (so no DDL runs).
        None when there are none to make."""
        return None

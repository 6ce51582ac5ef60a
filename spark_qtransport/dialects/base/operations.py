"""Operations: what the ``sqlqueue`` command reads and changes, and the privileges it grants and checks."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection, Mapping, Sequence

from ...errors import field_error
from .addressing import AddressingSql
from .values import QueueAddress, Statement

#: the most bytes of a body `peek_messages` reads (SQL Server's largest non-max varbinary)
PEEK_PREVIEW_MAX = 8000


def check_preview(preview: int) -> int:
    """How many bytes of each body `peek_messages` reads: 1 to PEEK_PREVIEW_MAX."""
    preview = int(preview)
    if not 1 <= preview <= PEEK_PREVIEW_MAX:
        raise field_error("preview", f"a body preview is 1 to {PEEK_PREVIEW_MAX} bytes, not {preview}")
    return preview


class OperationsSql(AddressingSql):
    """Statistics, peeking, purging, subscriptions, moving messages, indexes and privileges."""

    #: a queue table's FIFO column (as `queue_columns` names it), and what `sqlqueue doctor` calls
    #: it when it is 32 bits wide
    sequence_column: str
    int32_sequence: str
    #: the queue table's columns (lower case) NServiceBus's installer declares NOT NULL
    not_null_columns: tuple[str, ...]

    def table_findings(
        self, columns: Mapping[str, str], index_keys: Sequence[tuple[tuple[str, ...], bool]]
    ) -> list[tuple[str, str]]:
        """(level, text) of what `sqlqueue doctor` says about a queue table that only this
        database's tables can show (`index_keys`: each index's key columns and whether it is
        clustered). None unless the dialect knows some."""
        return []

    def server_time_zone(self) -> Statement | None:
        """One row: (the session's time zone setting, its UTC offset in seconds now, six months
        from now), where stored times depend on it (PostgreSQL's delayed Due); None elsewhere."""
        return None

    def wal_settings(self) -> Statement | None:
        """Rows (name, setting, unit, the values it may take joined by commas) of the settings
        that decide how much WAL the churn of queue pages costs (PostgreSQL: checkpoint_timeout,
        max_wal_size, full_page_writes, wal_compression), readable by any role; None where the
        database has none."""
        return None

    @abstractmethod
    def peek_messages(self, queue: QueueAddress, *, limit: int, preview: int) -> Statement:
        """At most `limit` rows (native id text, expires, expires text, headers, the first
        `preview` bytes of the body, the body's length in bytes, sequence), oldest first: a body is
        never fetched whole. `expires` is NULL and `expires text` says what it holds where the
        value is one a driver's datetime cannot hold (PostgreSQL ``infinity``, a year past 9999 or
        BC); else `expires text` is NULL. Changes nothing, takes no lock, never waits for other
        sessions' rows."""

    @abstractmethod
    def peek_delayed(self, delayed: QueueAddress, *, limit: int, preview: int) -> Statement:
        """At most `limit` rows (due instant, headers, the first `preview` bytes of the body, the
        body's length in bytes) of a delayed table, the soonest due first, as `peek_messages` reads
        a queue: changes nothing, takes no lock, never waits."""

    @abstractmethod
    def list_queues(self, *, like: tuple[str, str] | None = None) -> Statement:
        """Rows (schema, table) of every table of the database shaped like a queue table (id,
        headers, body, expires and a sequence column), ordered. With `like`, only those whose
        schema and name match these LIKE patterns (escape: backslash), compared case-insensitively
        (a superset the caller filters exactly): a pattern over a thousand tenants reads their
        tables, not the whole catalog's."""

    def catalog_version(self) -> Statement | None:
        """One row that changes whenever a table is created, dropped, renamed or altered: a stream
        by pattern resolves it again (`list_queues`) only when this changed, read before it in the
        same transaction. None: the dialect has no such reading (the pattern is resolved at every
        trigger)."""
        return None

    @abstractmethod
    def queue_stats(self, queue: QueueAddress) -> Statement:
        """One row: (messages, expired, lowest sequence, highest sequence): counted, not estimated
        (SQL Server skips rows other sessions hold at that moment)."""

    @abstractmethod
    def nullable_columns(self, table: QueueAddress) -> Statement:
        """Rows of one column: the lower-cased names of the table's columns that allow NULL."""

    @abstractmethod
    def oldest_headers(self, queue: QueueAddress) -> Statement:
        """At most one row, one column: the headers text of the oldest row (for its TimeSent).
        Reads no other column: no body, and no Expires, whatever it holds."""

    @abstractmethod
    def failure_stats(self, queue: QueueAddress, *, limit: int) -> Statement:
        """Rows (FailedQ, count) over the oldest `limit` rows of an error queue: the
        ``NServiceBus.FailedQ`` header's value as the dialect reads it (`failed_q_value` turns it
        into text), NULL where the headers are not a JSON object or have no FailedQ. Never fails on
        a row whose headers are not JSON; reads no body. Bounded: the oldest `limit` rows only."""

    def failed_q_value(self, value: object) -> str | None:
        """A FailedQ value of a `failure_stats` row as text (None where the row had none)."""
        return None if value is None else str(value)

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

"""Send: staging on executors, the outbox and the dispatch transaction on the driver."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from .addressing import AddressingSql
from .dbapi import Connection
from .values import QueueAddress, Statement


class SendSql(AddressingSql):
    """The SQL of the sink (docs/contributing/contract.md, Send)."""

    #: the longest delay or time-to-be-received the database's date arithmetic takes, in seconds
    #: (100 years unless the dialect says less)
    max_interval_seconds: float = 100 * 365.25 * 86_400

    @abstractmethod
    def stage_rows(self, conn: Connection, staging: QueueAddress, rows: Sequence[tuple[Any, ...]]) -> None:
        """Bulk-write staged rows (tuples in `STAGED_COLUMNS` order) with the driver's fastest
        path (COPY, fast executemany). The one dialect method that executes: bulk APIs are
        driver-specific. Does not commit."""

    #: whether `send_rows` writes rows straight into a queue table (the driver then sends the
    #: rows small tasks hand it without staging them)
    sends_inline: bool = False

    def send_rows(self, conn: Connection, destination: QueueAddress, rows: Sequence[tuple[Any, ...]]) -> int:
        """Bulk-write messages into a queue table: tuples (row id as 16 bytes, time to be received
        in ms or None, headers, body). Expires is the database's UTC clock plus the time to be
        received, as the dispatch statements write it. Does not commit. Only where `sends_inline`."""
        raise NotImplementedError(f"{type(self).__name__} does not send rows inline")

    @abstractmethod
    def insert_message(self, destination: QueueAddress, *, headers: str, body: bytes, ttbr_ms: int | None) -> Statement:
        """INSERT one message into a queue table, as NServiceBus's SendText does: a new native id,
        Expires = the database's UTC clock plus `ttbr_ms` (None: never expires), the headers text
        and the body; values bound. For sends outside any batch (monitoring reports)."""

    def dispatch_plans(self) -> list[Statement]:
        """Run first in a dispatch transaction: plans that stay linear whatever the statistics say.
        A staging table swings between empty and a whole batch faster than statistics follow;
        last seen empty, it is estimated at one row, and a plan built on that (a nested loop over
        a full scan) costs seconds per batch instead of milliseconds."""
        return []

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
        """Rows (queue address text, i): the queues subscribed to ``topics[i]``, the stored Topic
        compared with it as the database compares it (its collation: case-insensitive on a
        default SQL Server, where trailing spaces never count either), as NServiceBus's
        GetSubscribersText does. A row names the topic it matched by position, never by the
        stored spelling, so no comparison is left to Python. One row per (queue, i)."""

    @abstractmethod
    def dispatch(
        self,
        staging: QueueAddress,
        destination: QueueAddress,
        *,
        attempts: list[str],
        route: str | None,
        publish_routes: list[str],
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

    @abstractmethod
    def outbox_cleanup(self, outbox: QueueAddress, *, older_than_seconds: int, limit: int) -> Statement:
        """Delete at most `limit` outbox records older than the retention; rowcount = deleted."""

    @abstractmethod
    def staging_cleanup(self, staging: QueueAddress, *, older_than_seconds: int, limit: int) -> Statement:
        """Delete at most `limit` staged rows older than the retention (of batches never dispatched)."""

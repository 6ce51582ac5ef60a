"""The SQL of claims held by prepared transactions (PostgreSQL's PREPARE TRANSACTION): a claim
deletes its rows and is prepared instead of committed, so its rows are written once (the queue's
delete) instead of three times (the queue's delete, the claim table's insert and delete). The
rows stay readable by other sessions until the acknowledgement commits the prepared transaction;
competing consumers skip them as they skip any locked row. Dialects without it (SQL Server) keep
every claim in the claim table."""

from __future__ import annotations

from typing import Any

from .addressing import AddressingSql
from .dbapi import Connection
from .values import QueueAddress, Statement

__all__ = ["PreparedSql"]


class PreparedSql(AddressingSql):
    """Prepared claims; `prepared_claims` says whether the database has them at all."""

    #: the database can hold a claim in a prepared transaction
    prepared_claims: bool = False

    def _no_prepared(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no prepared transactions")

    def prepared_capacity(self) -> Statement:
        """One row: (max_prepared_transactions, prepared transactions now held on the server)."""
        return self._no_prepared()

    def prepare(self, gid: str) -> Statement:
        """End the current transaction by preparing it under `gid` (our own characters only)."""
        return self._no_prepared()

    def commit_prepared(self, gid: str) -> Statement:
        """Commit a prepared transaction (outside any transaction: `run_outside_transaction`)."""
        return self._no_prepared()

    def rollback_prepared(self, gid: str) -> Statement:
        """Roll a prepared transaction back (outside any transaction)."""
        return self._no_prepared()

    def run_outside_transaction(self, conn: Connection, stmt: Statement) -> None:
        """Run `stmt` on `conn` in autocommit (COMMIT PREPARED cannot run in a transaction)."""
        self._no_prepared()

    def list_prepared(self, prefix: str) -> Statement:
        """Rows (gid, transaction id text, prepared at, age in seconds) of this database's prepared
        transactions whose gid starts with `prefix` (our own characters only)."""
        return self._no_prepared()

    def read_prepared(self, queue: QueueAddress, *, xid: str, shift: int, after: int, upto: int,
                      claimed_at: str, limit: int | None = None) -> Statement:
        """The rows a prepared claim deleted, numbered `shift + seq`, in (after, upto], in order,
        as `read_claims` returns them (and its `limit`); the rows it did not claim (expired as of
        `claimed_at`, no id, an Expires beyond year 9999) are left out, as the claim left them out."""
        return self._no_prepared()

    def repeatable_read(self) -> Statement:
        """The first statement of a transaction that reads one snapshot throughout."""
        return self._no_prepared()

    def read_transaction(self, *, one_snapshot: bool) -> list[Statement]:
        """The statements that begin a slice's read transaction; `one_snapshot`: all of it reads
        one snapshot (a prepared claim's slice: see `slices._open`)."""
        return [self.repeatable_read()] if one_snapshot else []

    def parked(self, claims: QueueAddress, consumer: str, *, after: int, upto: int) -> Statement:
        """One row, one boolean: the claim table holds claims of the consumer in (after, upto]."""
        return self._no_prepared()

    def prepared_headers(self, queue: QueueAddress, *, xid: str, after: int, high: int, claimed_at: str,
                         limit: int) -> list[Statement]:
        """The rows `read_prepared` gives of a prepared claim's queue rows in (after, high], the
        first `limit`, as (seq, headers text, '' for NULL), in order (the LAST statement): what
        `park` is told the poison of."""
        return self._no_prepared()

    def park(self, queue: QueueAddress, claims: QueueAddress, consumer: str, *, xid: str, shift: int,
             first: int, last: int, low: int, high: int, claimed_at: str, poison: list[int]) -> Statement:
        """Copy a prepared claim's deliverable rows (`read_prepared`'s, less the `poison` queue
        sequences: its claim moved those to the error queue) into the claim table with their
        numbers, unless it holds claims in [first, last] already (idempotent)."""
        return self._no_prepared()

    def copy_held(self, queue: QueueAddress, destination: QueueAddress, *, xid: str, shift: int, claimed_at: str,
                  keys: list[int], headers: list[str] | None, ttbr_ms: int | None = None) -> Statement:
        """`forward_claims` for the rows of a prepared claim: copy the held rows numbered `keys`
        into `destination`, with `headers` (one text each) or their own, and a new native id."""
        return self._no_prepared()

    def copy_held_range(self, queue: QueueAddress, destination: QueueAddress, *, xid: str, shift: int,
                        claimed_at: str, after: int, upto: int, skip: list[int]) -> list[Statement]:
        """Copy the held rows of a prepared claim numbered in (after, upto], but those numbered
        `skip`, into `destination` as they are (forwardTo), in order, with a new native id, on the
        server: no key list, no header through the driver. The LAST statement inserts."""
        return self._no_prepared()

    def failed_take(self, failed: QueueAddress, *, table_id: str, after: int, upto: int) -> Statement:
        """Delete the sink's failed marks (in `failed`, `SettledSql.failed_table`) of the claim
        table `table_id` numbered in (after, upto]: a prepared claim's own numbers. Rows of one
        column: their numbers."""
        return self._no_prepared()

    def after_progress(self, claims: QueueAddress, consumer: str, *, first: int) -> Statement:
        """The last claim number whose after-processing is written, of the prepared claim whose
        first number is `first`: one row, or none when nothing of it is written yet."""
        return self._no_prepared()

    def note_progress(self, claims: QueueAddress, consumer: str, *, first: int, done: int) -> list[Statement]:
        """Record that the prepared claim beginning at `first` has its after-processing written up
        to number `done` (in the transaction that wrote it), and forget the consumer's records of
        claims before it (their prepared transactions are committed: acknowledged in order)."""
        return self._no_prepared()

    def forget_progress(self, claims: QueueAddress, consumer: str, *, upto: int) -> Statement:
        """Delete the consumer's progress records of claims beginning at or below `upto`
        (committed: nothing reads them again)."""
        return self._no_prepared()

    def prepared_bound(self) -> Statement:
        """One row: (the oldest prepared transaction's age in seconds or NULL, xid age of the
        database's datfrozenxid): what a prepared claim holds back."""
        return self._no_prepared()

"""Settled batches: which streaming batch read which claims, which the sink finished, and which
claims it failed.

One table per database (``SqlQueue.Batches`` in the default schema), because the read tasks that
write a batch's rows know its claims and Spark's (query id, batch id) but not the sink's endpoint,
and the sink knows (query id, batch id) but not the claim tables: the one key both have is
Spark's. A row per (query, batch, claim table, consumer): the batch's whole claim range of that
queue, and when the sink's dispatch transaction settled the batch (NULL: not yet).

Beside it, ``SqlQueue.Failed``: a row per claim the sink failed or retried (`fail()`,
`retry_later()`), by the claim table's identity (`ReceiveSql.table_id`) and the claim's number,
written in the sink's dispatch transaction; the acknowledgement takes them out of the claims it
copies for the platform (audit, forwardTo, timings). The one representation of "failed", whether
the claim is held in the claim table or by a prepared transaction, and one that needs no streaming
ids (a foreachBatch over Spark Connect fails messages too). The same DDL (`create_batches`) makes
both tables.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import NamedTuple

from .addressing import AddressingSql
from .values import QueueAddress, Statement

__all__ = ["BATCHES_TABLE", "FAILED_TABLE", "BatchRead", "SettledSql"]

#: the tables' names, in the connection's default schema
BATCHES_TABLE = "SqlQueue.Batches"
FAILED_TABLE = "SqlQueue.Failed"


class BatchRead(NamedTuple):
    """One queue's part of a streaming batch: the claims (after, upto] of `consumer` in the claim
    table `claims` (qualified, as the dialect quotes it) whose id is `table_id`."""

    claims: str
    consumer: str
    table_id: str
    after: int
    upto: int


class SettledSql(AddressingSql):
    """The statements of the settled-batches table."""

    def batches_table(self) -> QueueAddress:
        return QueueAddress(BATCHES_TABLE)

    def failed_table(self) -> QueueAddress:
        return QueueAddress(FAILED_TABLE)

    @abstractmethod
    def batches_record(self, table: QueueAddress, *, query_id: str, batch_id: int,
                       reads: Sequence[BatchRead]) -> Statement:
        """Record the reads of a batch; a row already there (another task of the batch, a replay)
        stays as it is."""

    @abstractmethod
    def batches_settle(self, table: QueueAddress, *, query_id: str, batch_id: int) -> Statement:
        """Mark every row of the batch settled (rowcount: rows marked)."""

    @abstractmethod
    def batches_settled(self, table: QueueAddress, *, claims: str, consumer: str, table_id: str) -> Statement:
        """One row, one column: the highest claim a settled batch of `consumer` read in `claims`
        (NULL: none)."""

    @abstractmethod
    def batches_forget(self, table: QueueAddress, *, claims: str, consumer: str, upto: int, failed: QueueAddress,
                       claims_table: QueueAddress, table_id: str, spans: Sequence[tuple[int, int]]) -> Statement:
        """Delete the rows of `consumer`'s batches in `claims` that end at or below `upto` (their
        claims are acknowledged), and those of an earlier claim table of that name; and the failed
        marks (`failed`) of the claim table `claims_table` (its id: `table_id`) no claim needs any
        more, which an acknowledgement without copies to make leaves: those numbered up to `upto`
        below `NUMBER_BASE` (the claim table's identity: unique in it) whose claim is gone from
        `claims_table`, whoever's it was (a claim still there, or locked by its own
        acknowledgement, keeps its mark), and those of our numbers within `spans` ((after, upto]
        ranges of claims this consumer acknowledged: our numbers are a stream's own)."""

    def batches_forget_many(self, table: QueueAddress, *, failed: QueueAddress,
                            queues: Sequence[BatchRead]) -> Statement | None:
        """`batches_forget` for many queues' acknowledgements at once, each up to its `upto` (its
        `after` is not used): the rows of their batches ending at or below it deleted; and, as the
        statement's rows, the claim-table ids (`table_id`) among them that hold any failed mark in
        `failed`: those need their own `batches_forget` (usually none is there). None: the dialect
        forgets queue by queue."""
        return None

    @abstractmethod
    def failed_note(self, table: QueueAddress, *, claims: QueueAddress, keys: list[int]) -> Statement:
        """Mark the claims `keys` of the claim table `claims` failed (rowcount: marks written; a
        mark already there stays). The claim table is found by name, as the reader's set-up finds
        it; none there: nothing is written."""

    @abstractmethod
    def failed_take_keys(self, table: QueueAddress, *, table_id: str, keys: list[int]) -> Statement:
        """Delete the failed marks of the claim table `table_id` numbered `keys` (claims of one
        consumer: the claim table's identity interleaves consumers' numbers); rows of one column:
        their numbers."""

    @abstractmethod
    def failed_among(self, table: QueueAddress, *, table_id: str, keys: list[int]) -> Statement:
        """Which of the numbers `keys` of the claim table `table_id` are marked failed (the marks
        stay): rows of one column."""

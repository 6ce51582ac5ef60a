"""Settled batches: which streaming batch read which claims, and which the sink finished.

One table per database (``SqlQueue.Batches`` in the default schema), because the read tasks that
write a batch's rows know its claims and Spark's (query id, batch id) but not the sink's endpoint,
and the sink knows (query id, batch id) but not the claim tables: the one key both have is
Spark's. A row per (query, batch, claim table, consumer): the batch's whole claim range of that
queue, and when the sink's dispatch transaction settled the batch (NULL: not yet).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import NamedTuple

from .addressing import AddressingSql
from .values import QueueAddress, Statement

__all__ = ["BATCHES_TABLE", "BatchRead", "SettledSql"]

#: the table's name, in the connection's default schema
BATCHES_TABLE = "SqlQueue.Batches"


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
    def batches_forget(self, table: QueueAddress, *, claims: str, consumer: str, upto: int) -> Statement:
        """Delete the rows of `consumer`'s batches in `claims` that end at or below `upto` (their
        claims are acknowledged), and those of an earlier claim table of that name."""

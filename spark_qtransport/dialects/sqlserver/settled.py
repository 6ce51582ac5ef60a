"""SQL Server: the settled-batches table's statements (see `dialects.base.settled`). NServiceBus
has no counterpart (its outbox is keyed by incoming message id); the statements follow the
dialect's rules: parameters never NULL, many values in one OPENJSON parameter, no aggregate over a
NULL, ROWLOCK on a table that never escalates."""

from __future__ import annotations

from collections.abc import Sequence

from ..base import BatchRead, QueueAddress, SettledSql, Statement
from .statements import json_list


class SqlServerSettled(SettledSql):
    def batches_record(self, table: QueueAddress, *, query_id: str, batch_id: int,
                       reads: Sequence[BatchRead]) -> Statement:
        t = self.qualified(table)
        rows = json_list([[r.claims, r.consumer, r.table_id, int(r.after), int(r.upto)] for r in reads])
        # UPDLOCK + HOLDLOCK: the keys stay locked until commit, so two tasks of one batch insert once
        return Statement(
            f"INSERT INTO {t} (QueryId, BatchId, Claims, Consumer, TableId, AfterClaim, UptoClaim)"
            " SELECT ?, ?, r.Claims, r.Consumer, r.TableId, r.AfterClaim, r.UptoClaim"
            " FROM OPENJSON(?) WITH (Claims nvarchar(776) '$[0]', Consumer nvarchar(200) '$[1]',"
            " TableId nvarchar(64) '$[2]', AfterClaim bigint '$[3]', UptoClaim bigint '$[4]') AS r"
            f" WHERE NOT EXISTS (SELECT 1 FROM {t} AS b WITH (UPDLOCK, HOLDLOCK, ROWLOCK)"
            " WHERE b.QueryId = ? AND b.BatchId = ? AND b.Claims = r.Claims AND b.Consumer = r.Consumer)",
            (query_id, int(batch_id), rows, query_id, int(batch_id)),
        )

    def batches_settle(self, table: QueueAddress, *, query_id: str, batch_id: int) -> Statement:
        return Statement(
            f"UPDATE {self.qualified(table)} WITH (ROWLOCK) SET SettledAt = SYSUTCDATETIME()"
            " WHERE QueryId = ? AND BatchId = ? AND SettledAt IS NULL",
            (query_id, int(batch_id)),
        )

    def batches_settled(self, table: QueueAddress, *, claims: str, consumer: str, table_id: str) -> Statement:
        # TOP (1) ... ORDER BY, not MAX(): an aggregate over no row would still be one row, and one
        # that skips NULLs sends warning 8153 as a result of its own
        return Statement(
            f"SELECT TOP (1) UptoClaim FROM {self.qualified(table)}"
            " WHERE Claims = ? AND Consumer = ? AND TableId = ? AND SettledAt IS NOT NULL ORDER BY UptoClaim DESC",
            (claims, consumer, table_id),
        )

    def batches_forget(self, table: QueueAddress, *, claims: str, consumer: str, upto: int) -> Statement:
        return Statement(
            f"DELETE FROM {self.qualified(table)} WITH (ROWLOCK) WHERE Claims = ? AND Consumer = ? AND UptoClaim <= ?",
            (claims, consumer, int(upto)),
        )

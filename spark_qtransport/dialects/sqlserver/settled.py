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

    def batches_forget(self, table: QueueAddress, *, claims: str, consumer: str, upto: int, failed: QueueAddress,
                       claims_table: QueueAddress, table_id: str, spans: Sequence[tuple[int, int]]) -> Statement:
        # SQL Server holds no prepared claim, so no number of ours: `spans` has nothing to add.
        # Two statements, one round trip; NOCOUNT: no row count of the first stands before the
        # batch's end. READPAST on the claim table: a claim being deleted (X-locked) is skipped,
        # which is safe as its acknowledgement took its mark first (`failed_take_keys` before the
        # delete), and this batch never waits on another consumer's claims while holding marks
        # (the acknowledgement that holds those claims may want the marks: no deadlock). A claim
        # read by an acknowledgement (UPDLOCK) is seen, and keeps its mark.
        return Statement(
            "SET NOCOUNT ON;"
            f" DELETE f FROM {self.qualified(failed)} AS f WITH (ROWLOCK) WHERE f.TableId = ? AND f.ClaimSeq <= ?"
            f" AND NOT EXISTS (SELECT 1 FROM {self.qualified(claims_table)} AS c WITH (READPAST)"
            " WHERE c.ClaimSeq = f.ClaimSeq);"
            f" DELETE FROM {self.qualified(table)} WITH (ROWLOCK) WHERE Claims = ? AND Consumer = ? AND UptoClaim <= ?",
            (table_id, int(upto), claims, consumer, int(upto)),
        )

    def failed_note(self, table: QueueAddress, *, claims: QueueAddress, keys: list[int]) -> Statement:
        # the claim table's identity as the reader's set-up reads it (`table_id`: OBJECT_ID of
        # the qualified name); NOT EXISTS under UPDLOCK + HOLDLOCK: a batch dispatched again marks
        # nothing twice, and two dispatches of one batch never race to insert one key
        t = self.qualified(table)
        return Statement(
            f"INSERT INTO {t} (TableId, ClaimSeq)"
            " SELECT i.TableId, k.ClaimSeq FROM (SELECT CAST(OBJECT_ID(?) AS nvarchar(20)) AS TableId) AS i"
            " CROSS JOIN OPENJSON(?) WITH (ClaimSeq bigint '$') AS k"
            f" WHERE i.TableId IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {t} AS f WITH (UPDLOCK, HOLDLOCK, ROWLOCK)"
            " WHERE f.TableId = i.TableId AND f.ClaimSeq = k.ClaimSeq)",
            (self.qualified(claims), json_list([int(k) for k in keys])),
        )

    def failed_take_keys(self, table: QueueAddress, *, table_id: str, keys: list[int]) -> Statement:
        return Statement(
            f"DELETE {self.qualified(table)} WITH (ROWLOCK) OUTPUT deleted.ClaimSeq"
            " WHERE TableId = ? AND ClaimSeq IN (SELECT k.ClaimSeq FROM OPENJSON(?) WITH (ClaimSeq bigint '$') AS k)",
            (table_id, json_list([int(k) for k in keys])),
        )

    def failed_among(self, table: QueueAddress, *, table_id: str, keys: list[int]) -> Statement:
        return Statement(
            f"SELECT ClaimSeq FROM {self.qualified(table)} WHERE TableId = ?"
            " AND ClaimSeq IN (SELECT k.ClaimSeq FROM OPENJSON(?) WITH (ClaimSeq bigint '$') AS k)",
            (table_id, json_list([int(k) for k in keys])),
        )

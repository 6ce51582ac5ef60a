"""PostgreSQL: the settled-batches table's statements (see `dialects.base.settled`)."""

from __future__ import annotations

from collections.abc import Sequence

from ..base import NUMBER_BASE, BatchRead, QueueAddress, SettledSql, Statement
from .addressing import PostgresAddressing


class PostgresSettled(PostgresAddressing, SettledSql):
    def batches_record(self, table: QueueAddress, *, query_id: str, batch_id: int,
                       reads: Sequence[BatchRead]) -> Statement:
        return Statement(
            f"INSERT INTO {self.qualified(table)} (query_id, batch_id, claims, consumer, table_id, after_claim, upto_claim)"
            " SELECT %(query)s, %(batch)s, r.c, r.n, r.t, r.a, r.u"
            " FROM unnest(%(claims)s::text[], %(consumers)s::text[], %(tables)s::text[], %(afters)s::bigint[],"
            " %(uptos)s::bigint[]) AS r(c, n, t, a, u)"
            " ON CONFLICT (query_id, batch_id, claims, consumer) DO NOTHING",
            {"query": query_id, "batch": int(batch_id), "claims": [r.claims for r in reads],
             "consumers": [r.consumer for r in reads], "tables": [r.table_id for r in reads],
             "afters": [int(r.after) for r in reads], "uptos": [int(r.upto) for r in reads]},
        )

    def batches_settle(self, table: QueueAddress, *, query_id: str, batch_id: int) -> Statement:
        return Statement(
            f"UPDATE {self.qualified(table)} SET settled_at = now()"
            " WHERE query_id = %(query)s AND batch_id = %(batch)s AND settled_at IS NULL",
            {"query": query_id, "batch": int(batch_id)},
        )

    def batches_settled(self, table: QueueAddress, *, claims: str, consumer: str, table_id: str) -> Statement:
        return Statement(
            f"SELECT max(upto_claim) FROM {self.qualified(table)}"
            " WHERE claims = %(claims)s AND consumer = %(consumer)s AND table_id = %(table)s AND settled_at IS NOT NULL",
            {"claims": claims, "consumer": consumer, "table": table_id},
        )

    def batches_forget(self, table: QueueAddress, *, claims: str, consumer: str, upto: int, failed: QueueAddress,
                       claims_table: QueueAddress, table_id: str, spans: Sequence[tuple[int, int]]) -> Statement:
        # One statement: the marks in a CTE (a DML CTE always runs). Usually no mark is there,
        # and the index range on (table_id, claim_seq) finds none; the anti-join on the claim
        # table reads it only for marks found. MVCC: a claim deleted by an acknowledgement not yet
        # committed is still there, so its mark stays for that acknowledgement to take.
        return Statement(
            f"WITH marks AS (DELETE FROM {self.qualified(failed)} AS f WHERE f.table_id = %(table)s AND ("
            " (f.claim_seq < %(base)s AND f.claim_seq <= %(upto)s"
            f" AND NOT EXISTS (SELECT 1 FROM {self.qualified(claims_table)} AS c WHERE c.claim_seq = f.claim_seq))"
            " OR (f.claim_seq >= %(base)s AND EXISTS (SELECT 1 FROM unnest(%(afters)s::bigint[], %(uptos)s::bigint[])"
            " AS r(a, u) WHERE f.claim_seq > r.a AND f.claim_seq <= r.u))))"
            f" DELETE FROM {self.qualified(table)} WHERE claims = %(claims)s AND consumer = %(consumer)s"
            " AND upto_claim <= %(upto)s",
            {"claims": claims, "consumer": consumer, "upto": int(upto), "table": table_id, "base": NUMBER_BASE,
             "afters": [int(a) for a, _ in spans], "uptos": [int(u) for _, u in spans]},
        )

    def batches_forget_many(self, table: QueueAddress, *, failed: QueueAddress,
                            queues: Sequence[BatchRead]) -> Statement | None:
        # the batches' rows by the index on (claims, consumer, upto_claim), and the marks' tables by
        # the primary key's first column (table_id, claim_seq): one probe a queue each
        return Statement(
            "WITH q AS MATERIALIZED (SELECT * FROM unnest(%(claims)s::text[], %(consumers)s::text[],"
            " %(uptos)s::bigint[], %(tables)s::text[]) AS q(claims, consumer, upto, table_id)),"
            f" gone AS (DELETE FROM {self.qualified(table)} AS b USING q WHERE b.claims = q.claims"
            " AND b.consumer = q.consumer AND b.upto_claim <= q.upto)"
            f" SELECT q.table_id FROM q WHERE EXISTS (SELECT 1 FROM {self.qualified(failed)} AS f"
            " WHERE f.table_id = q.table_id)",
            {"claims": [r.claims for r in queues], "consumers": [r.consumer for r in queues],
             "uptos": [int(r.upto) for r in queues], "tables": [str(r.table_id) for r in queues]},
        )

    def failed_note(self, table: QueueAddress, *, claims: QueueAddress, keys: list[int]) -> Statement:
        # the claim table's identity as the reader's set-up reads it (`table_id`); ON CONFLICT: a
        # batch dispatched again (a retried transaction) marks nothing twice
        expr, params = self._regclass(claims)
        return Statement(
            f"INSERT INTO {self.qualified(table)} (table_id, claim_seq)"
            f" SELECT {expr}::oid::text, k FROM unnest(%(keys)s::bigint[]) AS k WHERE {expr} IS NOT NULL"
            " ON CONFLICT (table_id, claim_seq) DO NOTHING",
            {**params, "keys": [int(k) for k in keys]},
        )

    def failed_take_keys(self, table: QueueAddress, *, table_id: str, keys: list[int]) -> Statement:
        return Statement(
            f"DELETE FROM {self.qualified(table)} WHERE table_id = %(table)s AND claim_seq = ANY(%(keys)s::bigint[])"
            " RETURNING claim_seq",
            {"table": table_id, "keys": [int(k) for k in keys]},
        )

    def failed_among(self, table: QueueAddress, *, table_id: str, keys: list[int]) -> Statement:
        return Statement(
            f"SELECT claim_seq FROM {self.qualified(table)} WHERE table_id = %(table)s"
            " AND claim_seq = ANY(%(keys)s::bigint[])",
            {"table": table_id, "keys": [int(k) for k in keys]},
        )

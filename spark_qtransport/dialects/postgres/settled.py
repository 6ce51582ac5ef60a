"""PostgreSQL: the settled-batches table's statements (see `dialects.base.settled`)."""

from __future__ import annotations

from collections.abc import Sequence

from ..base import BatchRead, QueueAddress, SettledSql, Statement


class PostgresSettled(SettledSql):
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

    def batches_forget(self, table: QueueAddress, *, claims: str, consumer: str, upto: int) -> Statement:
        return Statement(
            f"DELETE FROM {self.qualified(table)} WHERE claims = %(claims)s AND consumer = %(consumer)s"
            " AND upto_claim <= %(upto)s",
            {"claims": claims, "consumer": consumer, "upto": int(upto)},
        )

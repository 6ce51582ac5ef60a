"""PostgreSQL prepared claims (`PreparedSql`): the claim's rows are found again by the transaction
that deleted them (`xmax`), within the claim's sequence range."""

from __future__ import annotations

import re
from typing import Any

from ..base import AFTER_MARK, LATEST_TIME, Connection, PreparedSql, QueueAddress, Statement
from .addressing import PostgresAddressing
from .driver import psycopg_connection
from .statements import BY_INDEX, NO_ID, copies, page

#: what a gid we build may hold: PREPARE TRANSACTION takes a literal, not a parameter
_GID = re.compile(r"[A-Za-z0-9_.:~-]{1,199}")

#: a queue row's Expires as a reader can hold it (as `read_claims` maps a claim's)
_EXPIRES = (f"CASE WHEN q.expires > TIMESTAMP '{LATEST_TIME}' THEN NULL"
            " WHEN q.expires < TIMESTAMP '0001-01-01' THEN TIMESTAMP '0001-01-01' ELSE q.expires END")

#: the rows a numbered claim claimed rather than dropped or dead-lettered (see `_numbered_claim`)
_CLAIMED = ("q.id IS NOT NULL AND NOT (q.expires IS NOT NULL AND q.expires <= %(claimed_at)s::timestamp)"
            f" AND NOT COALESCE(q.expires > TIMESTAMP '{LATEST_TIME}' AND isfinite(q.expires), false)")

#: a row `q` of the queue that the prepared claim of transaction %(xid)s deleted and claimed: the
#: rows it deleted still stand for every other transaction, with its id as their xmax; within the
#: claim's seq range, no other row has it
_HELD = f"q.xmax = %(xid)s::xid AND {_CLAIMED}"


def _literal(gid: str) -> str:
    if not _GID.fullmatch(gid):
        raise ValueError(f"not a gid of ours: {gid!r}")
    return f"'{gid}'"


class PostgresPrepared(PostgresAddressing, PreparedSql):
    prepared_claims = True

    def prepared_capacity(self) -> Statement:
        return Statement("SELECT pg_catalog.current_setting('max_prepared_transactions')::int,"
                         " (SELECT count(*) FROM pg_catalog.pg_prepared_xacts)::int")

    def prepare(self, gid: str) -> Statement:
        return Statement(f"PREPARE TRANSACTION {_literal(gid)}")

    def commit_prepared(self, gid: str) -> Statement:
        return Statement(f"COMMIT PREPARED {_literal(gid)}")

    def rollback_prepared(self, gid: str) -> Statement:
        return Statement(f"ROLLBACK PREPARED {_literal(gid)}")

    def run_outside_transaction(self, conn: Connection, stmt: Statement) -> None:
        conn.rollback()  # idle: autocommit can be switched only outside a transaction
        conn.autocommit = True
        try:
            psycopg_connection(conn).execute(stmt.sql, stmt.params)
        finally:
            conn.autocommit = False

    def list_prepared(self, prefix: str) -> Statement:
        # LIKE with our own characters: only '_' is a wildcard among them, and gids never hold one
        if "_" in prefix or "%" in prefix:
            raise ValueError(f"not a gid prefix of ours: {prefix!r}")
        return Statement(
            "SELECT gid, transaction::text, prepared,"
            " extract(epoch FROM pg_catalog.clock_timestamp() - prepared)::float8"
            " FROM pg_catalog.pg_prepared_xacts WHERE database = pg_catalog.current_database()"
            " AND gid LIKE %(prefix)s ORDER BY gid",
            {"prefix": prefix + "%"},
        )

    def read_prepared(self, queue: QueueAddress, *, xid: str, shift: int, after: int, upto: int,
                      claimed_at: str, limit: int | None = None) -> Statement:
        return Statement(
            f"SELECT %(shift)s + q.seq, q.id::text, {_EXPIRES}, COALESCE(q.headers, ''), q.body, q.seq::bigint,"
            " %(claimed_at)s::timestamp AT TIME ZONE 'UTC'"
            f" FROM {self.qualified(queue)} AS q"
            f" WHERE q.seq > %(after)s - %(shift)s AND q.seq <= %(upto)s - %(shift)s AND {_HELD}"
            f" ORDER BY q.seq{page(limit)}",
            {"shift": int(shift), "after": int(after), "upto": int(upto), "xid": str(xid), "claimed_at": claimed_at,
             "limit": limit},
        )

    def repeatable_read(self) -> Statement:
        return Statement("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")

    def read_transaction(self, *, one_snapshot: bool) -> list[Statement]:
        return [*super().read_transaction(one_snapshot=one_snapshot), *BY_INDEX]

    def parked(self, claims: QueueAddress, consumer: str, *, after: int, upto: int) -> Statement:
        return Statement(
            f"SELECT EXISTS (SELECT FROM {self.qualified(claims)} WHERE consumer = %(consumer)s"
            " AND claim_seq > %(after)s AND claim_seq <= %(upto)s)",
            {"consumer": consumer, "after": int(after), "upto": int(upto)},
        )

    def prepared_headers(self, queue: QueueAddress, *, xid: str, after: int, high: int, claimed_at: str,
                         limit: int) -> list[Statement]:
        return [*BY_INDEX, Statement(
            f"SELECT q.seq, COALESCE(q.headers, '') FROM {self.qualified(queue)} AS q"
            f" WHERE q.seq > %(after)s AND q.seq <= %(high)s AND {_HELD}"
            " ORDER BY q.seq LIMIT %(limit)s",
            {"after": int(after), "high": int(high), "xid": str(xid), "claimed_at": claimed_at, "limit": int(limit)})]

    def park(self, queue: QueueAddress, claims: QueueAddress, consumer: str, *, xid: str, shift: int,
             first: int, last: int, low: int, high: int, claimed_at: str, poison: list[int]) -> Statement:
        c = self.qualified(claims)
        return Statement(
            f"INSERT INTO {c} (claim_seq, consumer, id, expires, headers, body, source_seq, claimed_at)"
            " OVERRIDING SYSTEM VALUE"
            " SELECT %(shift)s + q.seq, %(consumer)s, q.id, NULLIF(q.expires, TIMESTAMP 'infinity'),"
            " COALESCE(q.headers, ''), q.body, q.seq, %(claimed_at)s::timestamp AT TIME ZONE 'UTC'"
            f" FROM {self.qualified(queue)} AS q"
            f" WHERE q.seq >= %(low)s AND q.seq <= %(high)s AND {_HELD} AND NOT q.seq = ANY(%(poison)s::bigint[])"
            f" AND NOT EXISTS (SELECT FROM {c} WHERE consumer = %(consumer)s"
            " AND claim_seq >= %(first)s AND claim_seq <= %(last)s)"
            " ORDER BY q.seq",
            {"shift": int(shift), "consumer": consumer, "xid": str(xid), "low": int(low), "high": int(high),
             "first": int(first), "last": int(last), "claimed_at": claimed_at, "poison": [int(s) for s in poison]},
        )

    def copy_held(self, queue: QueueAddress, destination: QueueAddress, *, xid: str, shift: int, claimed_at: str,
                  keys: list[int], headers: list[str] | None, ttbr_ms: int | None = None) -> Statement:
        params: dict[str, Any] = {"xid": str(xid), "shift": int(shift), "claimed_at": claimed_at,
                                  "keys": [int(k) for k in keys]}
        source = (f"JOIN {self.qualified(queue)} AS q ON q.seq = v.seq - %(shift)s AND {_HELD}"
                  " AND q.seq >= %(low)s AND q.seq <= %(high)s")
        params.update(low=min(params["keys"], default=0) - int(shift), high=max(params["keys"], default=0) - int(shift))
        return copies(self.qualified(destination), source, "q", params, headers=headers, ttbr_ms=ttbr_ms)

    def copy_held_range(self, queue: QueueAddress, destination: QueueAddress, *, xid: str, shift: int,
                        claimed_at: str, after: int, upto: int, skip: list[int]) -> list[Statement]:
        return [*BY_INDEX, Statement(
            f"INSERT INTO {self.qualified(destination)} (id, expires, headers, body)"
            f" SELECT gen_random_uuid(), NULL, q.headers, q.body FROM {self.qualified(queue)} AS q"
            f" WHERE q.seq > %(after)s - %(shift)s AND q.seq <= %(upto)s - %(shift)s AND {_HELD}"
            " AND NOT %(shift)s + q.seq = ANY(%(skip)s::bigint[]) ORDER BY q.seq",
            {"after": int(after), "upto": int(upto), "shift": int(shift), "xid": str(xid), "claimed_at": claimed_at,
             "skip": [int(k) for k in skip]})]

    def failed_take(self, failed: QueueAddress, *, table_id: str, after: int, upto: int) -> Statement:
        return Statement(
            f"DELETE FROM {self.qualified(failed)} WHERE table_id = %(table)s AND claim_seq > %(after)s"
            " AND claim_seq <= %(upto)s RETURNING claim_seq",
            {"table": table_id, "after": int(after), "upto": int(upto)},
        )

    def after_progress(self, claims: QueueAddress, consumer: str, *, first: int) -> Statement:
        return Statement(
            f"SELECT source_seq FROM {self.qualified(claims)} WHERE consumer = %(mark)s AND claim_seq = %(first)s",
            {"mark": AFTER_MARK + consumer, "first": int(first)})

    def note_progress(self, claims: QueueAddress, consumer: str, *, first: int, done: int) -> list[Statement]:
        c, mark = self.qualified(claims), AFTER_MARK + consumer
        return [
            Statement(
                f"INSERT INTO {c} (consumer, claim_seq, id, headers, source_seq) OVERRIDING SYSTEM VALUE"
                " VALUES (%(mark)s, %(first)s, %(no_id)s, '', %(done)s)"
                " ON CONFLICT (consumer, claim_seq) DO UPDATE SET source_seq = EXCLUDED.source_seq",
                {"mark": mark, "first": int(first), "no_id": NO_ID, "done": int(done)}),
            Statement(f"DELETE FROM {c} WHERE consumer = %(mark)s AND claim_seq < %(first)s",
                      {"mark": mark, "first": int(first)}),
        ]

    def forget_progress(self, claims: QueueAddress, consumer: str, *, upto: int) -> Statement:
        return Statement(
            f"DELETE FROM {self.qualified(claims)} WHERE consumer = %(mark)s AND claim_seq <= %(upto)s",
            {"mark": AFTER_MARK + consumer, "upto": int(upto)})

    def prepared_bound(self) -> Statement:
        return Statement(
            "SELECT (SELECT extract(epoch FROM pg_catalog.clock_timestamp() - min(prepared))::float8"
            " FROM pg_catalog.pg_prepared_xacts),"
            " (SELECT pg_catalog.age(datfrozenxid) FROM pg_catalog.pg_database"
            " WHERE datname = pg_catalog.current_database())"
        )

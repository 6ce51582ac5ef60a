"""PostgreSQL send: COPY into staging or straight into a queue, the outbox, and the dispatch INSERTs."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..base import STAGED_COLUMNS, Connection, QueueAddress, SendSql, Statement
from .driver import psycopg_connection
from .statements import DUE_NOW, ROWS_OF, UTC_NOW, due_of

if TYPE_CHECKING:
    import psycopg
    from psycopg.rows import TupleRow


@functools.cache
def _uuid_bytes_dumper() -> type:
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    class UUIDBytesDumper(Dumper):
        """A uuid column's value given as its 16 bytes (no `uuid.UUID` object per row)."""

        format = Format.BINARY
        oid = 2950  # uuid

        def dump(self, obj: Any) -> Any:
            return obj

    return UUIDBytesDumper


def _copy_in(cur: psycopg.Cursor[TupleRow], table: str, columns: Sequence[str], types: list[str], rows: Iterable[tuple[Any, ...]]) -> None:
    """COPY `rows` into `table` (already quoted) in binary. bytea goes by psycopg's C dumper (the
    default one, in Python, also takes psycopg.Binary wrappers, which these rows never hold): this
    cursor only."""
    from psycopg.types.string import BytesBinaryDumper

    cur.adapters.register_dumper(bytes, BytesBinaryDumper)
    with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(types)
        write = copy.write_row
        for row in rows:
            write(row)


class PostgresSend(SendSql):
    """The PostgreSQL send of the dialect."""

    def stage_rows(self, conn: Connection, staging: QueueAddress, rows: Sequence[tuple[Any, ...]]) -> None:
        with psycopg_connection(conn).cursor() as cur:
            _copy_in(cur, self.qualified(staging), STAGED_COLUMNS,
                     ["text", "int8", "text", "text", "text", "text", "text", "bytea", "int8", "int8", "timestamptz"], rows)

    sends_inline = True

    def send_rows(self, conn: Connection, destination: QueueAddress, rows: Sequence[tuple[Any, ...]]) -> int:
        with psycopg_connection(conn).cursor() as cur:
            now: Any = None
            if any(ttbr is not None for _, ttbr, _, _ in rows):  # the transaction's clock, as dispatch uses
                clock = cur.execute(f"SELECT {UTC_NOW}").fetchone()
                assert clock is not None  # a SELECT without FROM: always one row
                (now,) = clock
            cur.adapters.register_dumper(None, _uuid_bytes_dumper())  # by oid only: ids as 16 raw bytes
            _copy_in(cur, self.qualified(destination), ("id", "expires", "headers", "body"),
                     ["uuid", "timestamp", "text", "bytea"],
                     ((row_id, None if ttbr is None else now + timedelta(milliseconds=ttbr), headers, body)
                      for row_id, ttbr, headers, body in rows))
        return len(rows)

    def insert_message(self, destination: QueueAddress, *, headers: str, body: bytes, ttbr_ms: int | None) -> Statement:
        # NServiceBus's SendText, Expires as `dispatch` computes it (the UTC wall clock plus the
        # time to be received; NULL without one).
        return Statement(
            f"INSERT INTO {self.qualified(destination)} (id, expires, headers, body) VALUES (gen_random_uuid(),"
            f" CASE WHEN %(ttbr)s::bigint IS NULL THEN NULL ELSE {UTC_NOW} + %(ttbr)s::bigint * interval '1 millisecond' END,"
            " %(headers)s, %(body)s)",
            {"ttbr": None if ttbr_ms is None else int(ttbr_ms), "headers": str(headers), "body": bytes(body)},
        )

    def dispatch_plans(self) -> list[Statement]:
        # LOCAL: this transaction only. Joins of staged rows become hash or merge joins, linear
        # in the batch (a nested loop is still used where nothing else can run).
        return [Statement("SET LOCAL enable_nestloop = off")]

    def outbox_insert(self, outbox: QueueAddress, *, sink: str, batch_id: int, fingerprint: str) -> Statement:
        return Statement(
            f"INSERT INTO {self.qualified(outbox)} (sink, batch_id, fingerprint)"
            " VALUES (%(sink)s, %(batch)s, %(fp)s) ON CONFLICT (sink, batch_id) DO NOTHING",
            {"sink": sink, "batch": int(batch_id), "fp": fingerprint},
        )

    def outbox_get(self, outbox: QueueAddress, *, sink: str, batch_id: int) -> Statement:
        return Statement(
            f"SELECT fingerprint, dispatched_at, sent, delayed, published FROM {self.qualified(outbox)}"
            " WHERE sink = %(sink)s AND batch_id = %(batch)s",
            {"sink": sink, "batch": int(batch_id)},
        )

    def outbox_finish(
        self, outbox: QueueAddress, *, sink: str, batch_id: int, sent: int, delayed: int, published: int
    ) -> Statement:
        return Statement(
            f"UPDATE {self.qualified(outbox)} SET sent = %(sent)s, delayed = %(delayed)s, published = %(published)s"
            " WHERE sink = %(sink)s AND batch_id = %(batch)s",
            {"sink": sink, "batch": int(batch_id), "sent": sent, "delayed": delayed, "published": published},
        )

    def subscribers(self, table: QueueAddress, topics: list[str]) -> Statement:
        # NServiceBus's GetSubscribersText (topic IN (...)) as a join on the topics and their
        # positions. The column compares as before: varchar, unlike char, keeps trailing spaces,
        # and a deterministic collation compares exactly; a nondeterministic (case-insensitive)
        # one a DBA gave the column decides as it does for NServiceBus.
        return Statement(
            f"SELECT DISTINCT s.queueaddress, t.n - 1 FROM {self.qualified(table)} AS s"
            " JOIN unnest(%(topics)s::text[]) WITH ORDINALITY AS t(topic, n) ON s.topic = t.topic",
            {"topics": [str(v) for v in topics]},
        )

    def dispatch(
        self,
        staging: QueueAddress,
        destination: QueueAddress,
        *,
        attempts: list[str],
        route: str | None,
        publish_routes: list[str],
    ) -> Statement:
        s, d = self.qualified(staging), self.qualified(destination)
        # `first` picks one staged row per message id (NServiceBus's dispatcher deduplicates on
        # (message id, destination) too) from the small columns; the outer join then reads each
        # picked row by primary key in staging order, so bodies are never sorted.
        sql = f"""
INSERT INTO {d} (id, expires, headers, body)
SELECT gen_random_uuid(),
       CASE WHEN m.ttbr_ms IS NULL THEN NULL ELSE {UTC_NOW} + m.ttbr_ms * interval '1 millisecond' END,
       m.headers, m.body
FROM (SELECT min(seq) AS seq FROM {s}
      WHERE {self._staged_selection()}
      GROUP BY message_id ORDER BY 1) AS first
JOIN {s} AS m ON m.seq = first.seq
ORDER BY first.seq"""
        return Statement(
            sql.strip(), {"attempts": list(attempts), "route": route, "published": list(publish_routes)}
        )

    @staticmethod
    def _staged_selection() -> str:
        return ("attempt = ANY(%(attempts)s)"
                " AND ((kind = 's' AND route = %(route)s) OR (kind = 'p' AND route = ANY(%(published)s)))")

    def staged_messages(
        self, staging: QueueAddress, *, attempts: list[str], route: str | None, publish_routes: list[str]
    ) -> Statement:
        s = self.qualified(staging)
        return Statement(
            f"SELECT m.seq, m.headers FROM (SELECT min(seq) AS seq FROM {s} WHERE {self._staged_selection()}"
            f" GROUP BY message_id) AS first JOIN {s} AS m ON m.seq = first.seq ORDER BY m.seq",
            {"attempts": list(attempts), "route": route, "published": list(publish_routes)},
        )

    def move_staged(
        self, staging: QueueAddress, destination: QueueAddress, *, keys: list[Any], headers: list[str],
    ) -> Statement:
        return Statement(
            f"INSERT INTO {self.qualified(destination)} (id, expires, headers, body)"
            " SELECT gen_random_uuid(), NULL, v.headers, m.body"
            " FROM unnest(%(keys)s::bigint[], %(headers)s::text[]) WITH ORDINALITY AS v(seq, headers, n)"
            f" JOIN {self.qualified(staging)} AS m ON m.seq = v.seq ORDER BY v.n",
            {"keys": [int(k) for k in keys], "headers": list(headers)},
        )

    def dispatch_delayed(self, staging: QueueAddress, delayed: QueueAddress, *, attempts: list[str]) -> Statement:
        s, d = self.qualified(staging), self.qualified(delayed)
        # Due as NServiceBus's StoreDelayedMessageText computes it (`statements.DUE_NOW`): the UTC
        # wall clock in the session's TimeZone, plus the delay with whole days added as days (its
        # DueAfterDays; the hours, minutes, seconds and milliseconds are one span of time). A
        # deliver_at time becomes the Due NServiceBus stores for that instant. Rows of one batch
        # may share a Due (one now() per transaction): NServiceBus's index on Due is not unique.
        # The staged rows are picked by their small columns, then read by key in staging order.
        sql = f"""
INSERT INTO {d} (headers, body, due)
SELECT m.headers, m.body,
       COALESCE({due_of("m.due")},
                {DUE_NOW} + (m.delay_ms / 86400000) * interval '1 day'
                + mod(m.delay_ms, 86400000) * interval '1 millisecond')
FROM (SELECT seq FROM {s} WHERE kind = 'd' AND attempt = ANY(%(attempts)s)) AS k
JOIN {s} AS m ON m.seq = k.seq
ORDER BY k.seq"""
        return Statement(sql.strip(), {"attempts": list(attempts)})

    def delete_staged(self, staging: QueueAddress, *, attempts: list[str]) -> Statement:
        return Statement(
            f"DELETE FROM {self.qualified(staging)} WHERE attempt = ANY(%(attempts)s)", {"attempts": list(attempts)}
        )

    def delete_batch_leftovers(self, staging: QueueAddress, *, sink: str, batch_id: int) -> Statement:
        return Statement(
            f"DELETE FROM {self.qualified(staging)} WHERE sink = %(sink)s AND batch_id = %(batch)s",
            {"sink": sink, "batch": int(batch_id)},
        )

    def outbox_cleanup(self, outbox: QueueAddress, *, older_than_seconds: int, limit: int) -> Statement:
        t = self.qualified(outbox)
        return Statement(
            f"DELETE FROM {t} WHERE {ROWS_OF}(SELECT ctid FROM {t}"
            " WHERE dispatched_at < now() - %(age)s * interval '1 second' LIMIT %(limit)s))",
            {"age": int(older_than_seconds), "limit": int(limit)},
        )

    def staging_cleanup(self, staging: QueueAddress, *, older_than_seconds: int, limit: int) -> Statement:
        t = self.qualified(staging)
        return Statement(
            f"DELETE FROM {t} WHERE {ROWS_OF}(SELECT ctid FROM {t}"
            " WHERE staged_at < now() - %(age)s * interval '1 second' LIMIT %(limit)s))",
            {"age": int(older_than_seconds), "limit": int(limit)},
        )

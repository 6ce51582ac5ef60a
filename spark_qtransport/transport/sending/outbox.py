"""The outbox: one record per dispatched (sink, batch id), so a replayed batch is sent once.

A record's fingerprint names the streaming query that dispatched it. Spark replays a batch with
the same query id (it lives in the checkpoint), so a replay finds its own fingerprint and is
skipped. A different query id under the same (endpoint, sink, batch id) means the checkpoint was
reset or another query shares the endpoint: skipping would silently drop that query's messages,
and sending could duplicate the old ones, so the batch fails with instructions instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from ...dialects import Connection, Cursor, Dialect, QueueAddress
from ...errors import OutboxConflictError, OutboxRaceError
from .. import session as db

__all__ = ["BatchRecord", "Outbox", "fingerprint", "CLEANUP_BATCH"]

log = logging.getLogger("spark_qtransport.outbox")

#: most rows one cleanup statement deletes (NServiceBus.Persistence.Sql: 4,000, below lock escalation)
CLEANUP_BATCH = 4000


def fingerprint(query_id: str | None, fallback: str) -> str:
    """``query <id>`` for streaming batches; `fallback` (unique per write) for one-off writes."""
    return f"query {query_id}" if query_id else f"write {fallback}"


@dataclass(frozen=True)
class BatchRecord:
    fingerprint: str
    dispatched_at: datetime | None
    sent: int | None
    delayed: int | None
    published: int | None


@dataclass(frozen=True)
class Outbox:
    dialect: Dialect
    table: QueueAddress
    staging: QueueAddress
    endpoint: str
    sink: str

    def begin(self, cur: Cursor, batch_id: int, fp: str) -> BatchRecord | None:
        """Record the batch as ours, inside the dispatch transaction. None: go on and send. A
        record: the batch was dispatched already by `fp` (skip) or by another query (raises)."""
        if db.rowcount(cur, self.dialect.outbox_insert(self.table, sink=self.sink, batch_id=batch_id, fingerprint=fp)):
            return None
        row = db.first(cur, self.dialect.outbox_get(self.table, sink=self.sink, batch_id=batch_id))
        if row is None:  # recorded and cleaned up between the two statements: ours to send again
            raise OutboxRaceError(f"outbox record of batch {batch_id} vanished while dispatching; retry",
                                  queue=self.dialect.format_address(self.table), operation="dispatch")
        fp_found, dispatched_at, sent, delayed, published = row
        record = BatchRecord(str(fp_found), dispatched_at, sent, delayed, published)
        if record.fingerprint != fp:
            t = self.dialect.qualified(self.table)
            sink = self.sink.replace("'", "''")
            raise OutboxConflictError(
                f"batch {batch_id} of sink {self.sink!r} of endpoint {self.endpoint!r} was already dispatched "
                f"at {record.dispatched_at} by another run ({record.fingerprint}; this is {fp}): the checkpoint "
                "was deleted or reset, or another query sends as the same endpoint. Nothing was sent. "
                "Give this query its own `sink` or `endpoint`; or, if the old checkpoint "
                f"is gone for good, delete its records: DELETE FROM {t} WHERE sink = '{sink}'",
                queue=self.dialect.format_address(self.table), operation="dispatch",
            )
        return record

    def finish(self, cur: Cursor, batch_id: int, *, sent: int, delayed: int, published: int) -> None:
        db.execute(cur, self.dialect.outbox_finish(
            self.table, sink=self.sink, batch_id=batch_id, sent=sent, delayed=delayed, published=published))

    def cleanup(self, conn: Connection, retention_seconds: int) -> int:
        """Delete records past the retention, and staged rows of batches never dispatched, at
        most `CLEANUP_BATCH` of each per call (each in its own short transaction)."""
        cur = conn.cursor()
        deleted = 0
        for stmt in (
            self.dialect.outbox_cleanup(self.table, older_than_seconds=retention_seconds, limit=CLEANUP_BATCH),
            self.dialect.staging_cleanup(self.staging, older_than_seconds=retention_seconds, limit=CLEANUP_BATCH),
        ):
            deleted += db.rowcount(cur, stmt)
            conn.commit()
        if deleted:
            log.info("outbox of endpoint %s: cleaned %d old rows", self.endpoint, deleted)
        return deleted

"""Settled batches: what lets a batch be finished when Spark commits it, whoever is left to act.

Spark tells a source that a batch is committed only when it asks for the next offset, and ends a
query's source process without a word. So after a query is gone (stopped right after a batch,
killed, or another query of the endpoint taking over from a new checkpoint), its last batch's
claims are held with nothing to say whether the batch was processed, and delivering them again
would process them twice. The sink knows: its dispatch transaction commits the batch's sends,
failed and retried copies. What it does not know is which claims the batch read; the read tasks
do, and they and the sink share one key, Spark's (query id, batch id). So (the database's one
``SqlQueue.Batches`` table, `dialects.base.settled`):

- each read task of a streaming batch records, for each queue it reads, the batch's whole claim
  range under that key (`record_reads`; a row a replay or another task made stays);
- the sink's dispatch marks the batch's rows settled in its transaction (`settle`), atomically
  with its sends, so a batch is settled exactly when its output is committed;
- whoever holds the claims next acknowledges up to the highest settled claim (`settled_upto`):
  the stream's warden when its process is gone, a query that takes the endpoint over; a settled
  batch implies every earlier batch of the consumer is committed (Spark runs them in order);
- an acknowledgement deletes the rows of what it acknowledged (`forget`): the table holds only
  batches in flight.

Where a batch's output is not this sink (foreachBatch into Delta only) nothing settles it: the
claims are acknowledged when Spark says it committed the batch, and a query's last batch, if Spark
had not yet said so, is delivered again to whoever takes the endpoint over. Where Spark gives a
read task no streaming ids (a foreachBatch function over Spark Connect runs its reads in another
server thread), the batch is not recorded, with the same result.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from ..connections import ConnectionURL
from ..dialects import BatchRead, Connection, Cursor, Dialect, QueueAddress
from . import session as db

__all__ = ["READER", "SINK", "ensure", "exists", "forget", "record_reads", "settle", "settled_upto"]

log = logging.getLogger("spark_qtransport.receive")

#: what a reader does there (record, look up, forget) and what a sink does (settle)
READER = ("SELECT", "INSERT", "DELETE")
SINK = ("SELECT", "UPDATE")

#: (database key, privileges) -> whether the table exists and this role may use it so, per process
_USABLE: dict[Any, bool] = {}
_WARNED: set[Any] = set()
_lock = threading.Lock()


def _key(dialect: Dialect, url: ConnectionURL, needs: tuple[str, ...]) -> Any:
    return (dialect.name, url.key(), needs)


def ensure(dialect: Dialect, url: ConnectionURL, conn: Connection, needs: tuple[str, ...] = READER) -> bool:
    """The table exists (created if missing, on `conn`, committed) and this role holds `needs` on
    it. False otherwise, said once: batches are then acknowledged only when Spark says it committed
    them, and a query's last batch may be delivered again to a query that takes its endpoint over."""
    cur = conn.cursor()
    table = dialect.batches_table()
    if not db.columns(cur, dialect.queue_columns(table)):
        try:
            db.install(dialect, cur, dialect.create_batches(table))
        except Exception as exc:
            if not dialect.is_driver_error(exc) or dialect.is_transient(exc):
                raise
            db.rollback(conn)
            return _unusable(dialect, url, needs, f"it does not exist and this role cannot create it "
                                                  f"({dialect.error_text(exc)})")
    missing = [what for what, granted in db.rows(cur, dialect.privileges(table, needs)) if not granted]
    conn.commit()
    if missing:
        return _unusable(dialect, url, needs, f"this role lacks {', '.join(missing)} on it")
    return _note(dialect, url, needs, True)


def _unusable(dialect: Dialect, url: ConnectionURL, needs: tuple[str, ...], why: str) -> bool:
    key = _key(dialect, url, needs)
    with _lock:
        first = key not in _WARNED
        _WARNED.add(key)
    if first:
        log.warning("table %s is not usable: %s. A batch is acknowledged once Spark says it committed it, and a "
                    "query's last batch may be delivered again to a query that takes its endpoint over; create it "
                    "and grant %s (sqlqueue ddl --part batches --grant-to ROLE)",
                    dialect.qualified(dialect.batches_table()), why, ", ".join(needs))
    return _note(dialect, url, needs, False)


def _note(dialect: Dialect, url: ConnectionURL, needs: tuple[str, ...], value: bool) -> bool:
    with _lock:
        _USABLE[_key(dialect, url, needs)] = value
    return value


def exists(dialect: Dialect, url: ConnectionURL, conn: Connection, needs: tuple[str, ...]) -> bool:
    """`ensure`, looked up once per process and database."""
    with _lock:
        known = _USABLE.get(_key(dialect, url, needs))
    return known if known is not None else ensure(dialect, url, conn, needs)


def record_reads(dialect: Dialect, conn: Connection, *, query_id: str, batch_id: int, reads: Sequence[BatchRead]) -> None:
    """Record the claims a read task's batch reads, in a transaction of its own (committed)."""
    if reads:
        db.execute(conn.cursor(), dialect.batches_record(dialect.batches_table(), query_id=query_id,
                                                         batch_id=batch_id, reads=reads))
    conn.commit()


def settle(dialect: Dialect, cur: Cursor, *, query_id: str | None, batch_id: int) -> int:
    """In the sink's dispatch transaction: the batch's recorded reads are settled (rows marked).
    The caller checked the table is usable (`exists`, before the transaction)."""
    if not query_id or batch_id < 0:
        return 0
    return db.rowcount(cur, dialect.batches_settle(dialect.batches_table(), query_id=query_id, batch_id=batch_id))


def settled_upto(dialect: Dialect, cur: Cursor, claims: QueueAddress, consumer: str, table_id: str) -> int:
    """The highest claim of `consumer` in `claims` a settled batch read (0: none)."""
    row = db.first(cur, dialect.batches_settled(dialect.batches_table(), claims=dialect.qualified(claims),
                                                consumer=consumer, table_id=table_id))
    return int(row[0]) if row is not None and row[0] is not None else 0


def forget(dialect: Dialect, cur: Cursor, claims: QueueAddress, consumer: str, upto: int) -> None:
    """The rows of batches acknowledged up to `upto` go."""
    db.execute(cur, dialect.batches_forget(dialect.batches_table(), claims=dialect.qualified(claims),
                                           consumer=consumer, upto=upto))

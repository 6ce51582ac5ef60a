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

Beside it, ``SqlQueue.Failed`` (made by the same DDL): the sink's dispatch marks the claims its
batch failed or retried (`note_failed`), in the same transaction, whether or not Spark gave the
read tasks streaming ids; the acknowledgement's chunks that make the platform's copies take the
marks of their range out (`take_failed`), so a failed message is not audited, forwarded or timed
(as NServiceBus audits only what its handlers processed), whether its claim was held in the claim
table or by a prepared transaction; `forget` deletes the marks an acknowledgement without copies
left. The two tables are usable together or not at all (`ensure`).

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
from ..dialects import BatchRead, Connection, Cursor, Dialect, QueueAddress, Statement
from . import session as db

__all__ = ["READER", "SINK", "ensure", "exists", "failed_among", "forget", "note_failed", "record_reads", "settle",
           "settled_upto", "take_failed"]

log = logging.getLogger("spark_qtransport.receive")

#: what a reader does in each table (batches: record, look up, forget; failed: take) and what a
#: sink does (batches: settle; failed: mark)
READER = (("batches", ("SELECT", "INSERT", "DELETE")), ("failed", ("SELECT", "DELETE")))
SINK = (("batches", ("SELECT", "UPDATE")), ("failed", ("SELECT", "INSERT")))
Needs = tuple[tuple[str, tuple[str, ...]], ...]

#: (database key, privileges) -> whether the table exists and this role may use it so, per process
_USABLE: dict[Any, bool] = {}
_WARNED: set[Any] = set()
_lock = threading.Lock()


def _key(dialect: Dialect, url: ConnectionURL, needs: Needs) -> Any:
    return (dialect.name, url.key(), needs)


def _tables(dialect: Dialect) -> dict[str, QueueAddress]:
    return {"batches": dialect.batches_table(), "failed": dialect.failed_table()}


def ensure(dialect: Dialect, url: ConnectionURL, conn: Connection, needs: Needs = READER) -> bool:
    """Both tables exist (created if missing, on `conn`, committed) and this role holds `needs` on
    them. False otherwise, said once: batches are then acknowledged only when Spark says it committed
    them, a query's last batch may be delivered again to a query that takes its endpoint over, and
    the messages a sink fails are audited like the rest."""
    cur = conn.cursor()
    tables = _tables(dialect)
    if not all(db.columns(cur, dialect.queue_columns(table)) for table in tables.values()):
        try:
            db.install(dialect, cur, dialect.create_batches(tables["batches"]))
        except Exception as exc:
            if not dialect.is_driver_error(exc) or dialect.is_transient(exc):
                raise
            db.rollback(conn)
            return _unusable(dialect, url, needs, f"they do not exist and this role cannot create them "
                                                  f"({dialect.error_text(exc)})")
    missing = [f"{what} on {dialect.qualified(tables[name])}" for name, privileges in needs
               for what, granted in db.rows(cur, dialect.privileges(tables[name], privileges)) if not granted]
    conn.commit()
    if missing:
        return _unusable(dialect, url, needs, f"this role lacks {', '.join(missing)}")
    return _note(dialect, url, needs, True)


def _unusable(dialect: Dialect, url: ConnectionURL, needs: Needs, why: str) -> bool:
    key = _key(dialect, url, needs)
    with _lock:
        first = key not in _WARNED
        _WARNED.add(key)
    if first:
        tables = _tables(dialect)
        log.warning("tables %s are not usable: %s. A batch is acknowledged once Spark says it committed it, a "
                    "query's last batch may be delivered again to a query that takes its endpoint over, and a "
                    "message the sink failed is audited; create them and grant %s (sqlqueue ddl --part batches "
                    "--grant-to ROLE)", " and ".join(dialect.qualified(t) for t in tables.values()), why,
                    "; ".join(f"{', '.join(privileges)} on {dialect.qualified(tables[name])}" for name, privileges in needs))
    return _note(dialect, url, needs, False)


def _note(dialect: Dialect, url: ConnectionURL, needs: Needs, value: bool) -> bool:
    with _lock:
        _USABLE[_key(dialect, url, needs)] = value
    return value


def exists(dialect: Dialect, url: ConnectionURL, conn: Connection, needs: Needs) -> bool:
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


def forget(dialect: Dialect, cur: Cursor, claims: QueueAddress, consumer: str, upto: int, table_id: str,
           spans: Sequence[tuple[int, int]] = ()) -> None:
    """The rows of batches acknowledged up to `upto` go, and the failed marks no claim of the claim
    table `claims` (its id: `table_id`) needs any more (`SettledSql.batches_forget`): `spans`, the
    (after, upto] ranges of our numbers this acknowledgement covered."""
    db.execute(cur, dialect.batches_forget(dialect.batches_table(), claims=dialect.qualified(claims),
                                           consumer=consumer, upto=upto, failed=dialect.failed_table(),
                                           claims_table=claims, table_id=table_id, spans=list(spans)))


def forget_many(dialect: Dialect, cur: Cursor, queues: Sequence[BatchRead]) -> set[str] | None:
    """`forget` for many queues' acknowledgements in one statement (`SettledSql.batches_forget_many`):
    the rows of their batches up to each one's `upto` go; the claim-table ids among them that hold
    a failed mark are returned, for `forget` of their own. None: the dialect forgets queue by queue."""
    stmt = dialect.batches_forget_many(dialect.batches_table(), failed=dialect.failed_table(), queues=queues)
    if stmt is None:
        return None
    return {str(t) for (t,) in db.rows(cur, stmt)}


def note_failed(dialect: Dialect, claims: QueueAddress, keys: Sequence[int]) -> Statement:
    """In the sink's dispatch transaction: the statement that marks the claims `keys` of the claim
    table `claims` failed. The caller checked the tables are usable (`exists`)."""
    return dialect.failed_note(dialect.failed_table(), claims=claims, keys=[int(k) for k in keys])


def take_failed(dialect: Dialect, cur: Cursor, table_id: str, *, keys: Sequence[int] | None = None,
                after: int = 0, upto: int = 0) -> set[int]:
    """In an acknowledgement's chunk: which of its claims (`keys`, a consumer's claims of the claim
    table `table_id`; else the numbers in (after, upto] of a prepared claim) the sink marked
    failed, their marks deleted: read once, in the transaction that acknowledges them."""
    if keys is not None:
        if not keys:
            return set()
        stmt = dialect.failed_take_keys(dialect.failed_table(), table_id=table_id, keys=[int(k) for k in keys])
    else:
        stmt = dialect.failed_take(dialect.failed_table(), table_id=table_id, after=after, upto=upto)
    return {int(k) for (k,) in db.rows(cur, stmt)}


def failed_among(dialect: Dialect, cur: Cursor, table_id: str, keys: Sequence[int]) -> set[int]:
    """Which of the claims `keys` of the claim table `table_id` the sink marked failed (the marks
    stay: the claims' chunks take them, or `forget`)."""
    if not keys:
        return set()
    return {int(k) for (k,) in db.rows(cur, dialect.failed_among(dialect.failed_table(), table_id=table_id,
                                                                 keys=[int(k) for k in keys]))}

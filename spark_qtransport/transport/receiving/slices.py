"""Executor side of receiving: read one slice of a planned batch, turn its rows into output rows.

Reading changes nothing, so Spark can replay a batch after a crash; claims are acknowledged by the
driver only once Spark has committed the batch. Poison claims (where the claim did not judge
headers) are left out of what a read yields; the acknowledgement moves them to the error queue.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa

from ...dialects import BatchRead, Connection, Cursor, Dialect, Statement, dialect_named
from ...errors import OffsetError
from .. import session as db
from .. import settled
from ..executor import cached_connection, give_back
from ..watchdog import WATCHDOG
from .decode import ReceivedMessage, rows_batch
from .planner import ClaimSlice

__all__ = ["FETCH_BYTES", "ReceivedMessage", "RowSizes", "pack", "read_batches", "read_chunks", "read_slice",
           "record_batch"]

log = logging.getLogger("spark_qtransport.receive")

#: most rows one fetch asks for (small rows: one round trip per 5,000)
_FETCH = 5000
#: headers and body bytes one fetch aims at; the next fetch is sized from the largest row seen
FETCH_BYTES = 16 * 2**20

#: the statement of a slice's read: its rows after a claim sequence, at most `limit` (None: all)
_Read = Callable[[int, int | None], Statement]


class RowSizes:
    """The largest row one task has read so far, over its slices: a later slice's first fetch is
    sized by it (`first_fetch`), so a tenant queue's few claims come in one page rather than in
    pages of 1 and 4 (at 1,000 queues, a statement a queue a batch on the queue's claim table)."""

    #: most rows a slice's first fetch asks for on what earlier slices read: rows of another queue
    #: may be larger, and this bounds by how much a first fetch can overshoot the byte budget
    FIRST_MOST = 16

    def __init__(self) -> None:
        self.largest = 0  # bytes of headers and body of the largest row read; 0: none read yet

    def first_fetch(self, claims: int, *, chunk: int, budget: int) -> int:
        """Rows a slice of at most `claims` claims asks for first: one while nothing is known."""
        if not self.largest:
            return 1
        return max(1, min(claims, self.FIRST_MOST, chunk, budget // self.largest))

    def seen(self, largest: int) -> None:
        self.largest = max(self.largest, largest)


def record_batch(parts: list[ClaimSlice], *, query_id: str, batch_id: int) -> None:
    """A read task of streaming batch `batch_id` of query `query_id`: record the whole batch's claims
    of each queue it reads (`transport.settled`), so the sink's dispatch can settle them. A failure
    costs only that: the batch is then acknowledged when Spark says it committed it (logged)."""
    found: dict[tuple[Any, str], dict[tuple[Any, str, str], tuple[int, int]]] = {}
    for p in parts:
        if p.batch is not None:
            found.setdefault((p.url, p.dialect), {})[(p.claims, p.consumer, p.table)] = p.batch
    for (url, name), queues in found.items():
        d = dialect_named(name)
        reads = [BatchRead(d.qualified(c), n, t, a, u) for (c, n, t), (a, u) in queues.items()]
        try:
            record = functools.partial(settled.record_reads, d, query_id=query_id, batch_id=batch_id, reads=reads)
            conn, _ = cached_connection(d, url, record, what=f"recording the reads of batch {batch_id}", log=log)
        except Exception as exc:  # noqa: BLE001 - the read goes on; its batch is acknowledged as Spark commits it
            log.warning("could not record the claims batch %d reads (%s): it is acknowledged once Spark says it "
                        "committed it", batch_id, db.describe(d, exc))
            continue
        give_back(url, conn)


class _SliceCursor:
    """One slice's read position and the query (or pages of queries) that read it. After a fault
    the read is opened again after the last claim sequence handed out, so a retried fetch goes on
    where it stopped."""

    def __init__(self, dialect: Dialect, part: ClaimSlice, *, chunk: int, budget: int, sizes: RowSizes) -> None:
        self.dialect, self.part = dialect, part
        self.chunk, self.budget, self.sizes = chunk, budget, sizes
        self.after = part.after
        # rows to fetch next; bytes of the largest row seen
        self.size, self.largest = sizes.first_fetch(part.upto - part.after, chunk=chunk, budget=budget), 1
        self.conn: Connection | None = None
        self.cur: Cursor | None = None  # the streaming cursor; None where the dialect reads in pages
        self.page: _Read | None = None  # the statement of a page (`read_in_pages`)
        self.done = self.last_page = False

    def fetch(self, _attempt: int) -> list[Sequence[Any]]:
        """The next rows, or [] once the slice is read (its transaction then ends)."""
        conn, page = self.conn, self.page
        if conn is None or page is None:  # both or neither: set and dropped together
            rest = replace(self.part, after=self.after)
            conn, (cur, page) = cached_connection(self.dialect, rest.url, lambda c: _open(self.dialect, rest, c),
                                                  what=f"reading {rest!r}", log=log)
            self.conn, self.cur, self.page = conn, cur, page
        with WATCHDOG.watching(self.dialect, self.part.url, conn, f"reading {self.part!r}"):
            rows = self._next_rows(conn, page)
        if not rows:
            if self.cur is not None:  # not read in pages
                self.cur.close()
            conn.commit()
            self.done = True
            return []
        self.after = int(rows[-1][0])
        # the slice's last claim read: nothing is after it, so no page is asked for to learn that
        self.last_page = self.last_page or self.after >= self.part.upto
        self.largest = max(self.largest, *(len(r[3] or "") + len(r[4] or b"") for r in rows))
        self.sizes.seen(self.largest)
        self.size = max(1, min(self.chunk, self.size * 4, self.budget // self.largest))
        return rows

    def _next_rows(self, conn: Connection, page: _Read) -> list[Sequence[Any]]:
        if self.cur is not None:  # not read in pages: the streaming cursor's next rows
            return list(self.cur.fetchmany(self.size))
        if self.last_page:  # the page before came short or ended at the slice's last claim: no more rows
            return []
        cur = self.dialect.page_cursor(conn)
        try:
            cur.execute(*db.args(page(self.after, self.size)))
            rows = list(cur.fetchall())
        finally:
            cur.close()
        self.last_page = len(rows) < self.size
        return rows

    def drop(self, exc: BaseException | None = None) -> None:
        """Close the connection (after a fault, or a read the caller abandoned)."""
        if exc is not None:
            log.info("reading %r again after claim %d", self.part, self.after)
        if self.conn is not None:
            db.close(self.conn)
        self.conn = self.cur = self.page = None

    def release(self) -> None:
        """Keep the connection for the next task if the slice was read to its end, else close it."""
        if self.done and self.conn is not None:
            give_back(self.part.url, self.conn)
            self.conn = self.cur = self.page = None
        self.drop()


def read_chunks(
    part: ClaimSlice, *, chunk: int = _FETCH, budget: int = FETCH_BYTES, sizes: RowSizes | None = None
) -> Iterator[list[Sequence[Any]]]:
    """Yield the raw claim rows of one slice in order, a fetch at a time, on a reused connection.

    Fetches are bounded by bytes as well as rows: the first asks for one row, each next one for
    at most `budget` bytes' worth of the largest row seen so far (never more than `chunk` rows,
    and at most four times the previous fetch, so a run of large rows after small ones is met
    by a small fetch). 20 MB bodies come one at a time; 1 KB bodies still 5,000 at a time. With
    `sizes`, the task's other slices read before this one size its first fetch (`RowSizes`): at
    most `RowSizes.FIRST_MOST` rows, fewer if their rows were large.

    Rows are (claim_seq, native_id text, expires, headers text, body, source_seq, claimed_at).
    A transient fault mid-slice (the session terminated, the server restarting) does not fail the
    task: each fetch goes through `session.with_retries`, and a retried one resumes after the last
    claim sequence yielded, on a new connection. Claims are not acknowledged before Spark commits
    this batch, so the rest of the slice is still there.
    """
    dialect = dialect_named(part.dialect)
    slice_cursor = _SliceCursor(dialect, part, chunk=chunk, budget=budget, sizes=sizes or RowSizes())
    try:
        while True:
            rows = db.with_retries(dialect, f"reading {part!r}", slice_cursor.fetch, after_failure=slice_cursor.drop,
                                   backoff=db.Backoff.of(part.url))
            if not rows:
                return
            yield rows
            rows = []  # the caller is done with them: not held during the next fetch
    finally:
        slice_cursor.release()


def _open(dialect: Dialect, part: ClaimSlice, conn: Connection) -> tuple[Cursor | None, _Read]:
    """Check the claim table is the one the batch was planned on, and start the slice's query: a
    cursor to fetch from (None where the dialect reads in pages), and what makes the statement of
    the page of `limit` rows after a claim sequence."""
    # a prepared claim's slice reads one snapshot for the question and the read: a claim parked
    # (`prepared.park`) has its copies committed before its prepared transaction, so the snapshot
    # sees either the copies or the queue rows still held, never neither nor both
    for stmt in dialect.read_transaction(one_snapshot=part.prepared is not None):
        db.execute(conn.cursor(), stmt)
    (table_id,) = db.one(conn.cursor(), dialect.table_id(part.claims))
    if str(table_id) != part.table:
        raise OffsetError(
            f"claim table {dialect.qualified(part.claims)} was dropped and created again after this "
            f"batch was planned (offset names table {part.table}, now {table_id}); its claims are gone. "
            "Start the query with a new checkpoint location to go on.", queue=part.queue,
        )
    held = part.prepared
    if held is not None and not db.one(conn.cursor(), dialect.parked(part.claims, part.consumer, after=part.after,
                                                                        upto=part.upto))[0]:
        def read(after: int, limit: int | None) -> Statement:
            return dialect.read_prepared(held.queue, xid=held.xid, shift=held.shift, after=after, upto=part.upto,
                                         claimed_at=held.claimed_at, limit=limit)
    else:
        def read(after: int, limit: int | None) -> Statement:
            return dialect.read_claims(part.claims, part.consumer, after=after, upto=part.upto, limit=limit)
    if dialect.read_in_pages:
        return None, read
    cur = dialect.streaming_cursor(conn)
    cur.execute(*db.args(read(part.after, None)))
    return cur, read


def read_batches(part: ClaimSlice, sizes: RowSizes | None = None) -> Iterator[pa.RecordBatch]:
    """Yield the messages of one slice as record batches of the stream's output schema
    (`decode.ARROW_SCHEMA`), one per fetch; neither a fetch's rows nor its batch are held while the
    next rows are fetched. `sizes`: what the task's slices read so far (`read_chunks`)."""
    # where the claim did not judge headers, the poison among these rows are left out: the
    # batch's acknowledgement moves them to the error queue (`ReceiveSql.poison_at_claim`)
    judge = not dialect_named(part.dialect).poison_at_claim
    for rows in read_chunks(part, sizes=sizes):
        batch = rows_batch(part.queue, rows, judge=judge)
        del rows
        if batch.num_rows:
            yield batch
        del batch


def read_slice(part: ClaimSlice, sizes: RowSizes | None = None) -> Iterator[ReceivedMessage]:
    """Yield the messages of one slice (`ReceivedMessage`), decoded as `read_batches` decodes them."""
    for batch in read_batches(part, sizes):
        for row in batch.to_pylist():
            yield ReceivedMessage(**{**row, "headers": dict(row["headers"])})


def pack(parts: list[ClaimSlice], rows: int, tasks: int) -> list[list[ClaimSlice]]:
    """The slices of a batch grouped into Spark tasks: several queues' small slices share a task
    (read one after the other on its one connection), so a batch over hundreds of tenant queues is
    at most about `tasks` tasks of at most `rows` claims, not one per queue. A queue cut into
    several slices (for parallelism) keeps them in separate tasks."""
    total = sum(p.upto - p.after for p in parts)
    target = max(1, min(rows, -(-total // max(tasks, 1))))
    groups: list[list[ClaimSlice]] = []
    size, queues = 0, set[str]()
    for part in parts:
        n = part.upto - part.after
        if not groups or size + n > target or part.queue in queues:
            groups.append([])
            size, queues = 0, set()
        groups[-1].append(part)
        size += n
        queues.add(part.queue)
    return groups

"""The sink's marks of the messages it failed (`transport.settled`: ``SqlQueue.Failed``), per
dialect (PostgreSQL always, SQL Server when configured), driven without Spark: a mark written as
the sink's dispatch writes it (`settled.note_failed`, in a transaction of its own here), then the
readers' claims, reads and acknowledgements as Spark drives them. A failed message is never
audited, whichever consumer holds it and whatever other consumers of its queue acknowledge
meanwhile, and no mark outlives its claim. (The sink's own path: test_finished, test_recoverability.)"""

from __future__ import annotations

import json
from typing import Any

from test_receive_contract import read_batch, receiving

from backends import Backend, nsb_headers
from spark_qtransport.transport import settled
from spark_qtransport.transport.receiving.receiver import Receiver
from spark_qtransport.wire import H


def _mark(backend: Backend, queue: str, keys: list[int]) -> int:
    """Mark claims of `queue` failed, as the sink's dispatch does."""
    d = backend.dialect
    stmt = settled.note_failed(d, d.claims_table(d.parse_address(queue)), keys)
    with backend.connect() as c:
        cur = c.cursor()
        cur.execute(stmt.sql, stmt.params)
        return int(cur.rowcount)


def _marks(backend: Backend, r: Receiver) -> int:
    """The marks of `r`'s claim table."""
    column = "table_id" if backend.name == "postgres" else "TableId"
    return backend.count(backend.dialect.format_address(backend.dialect.failed_table()),
                         f"WHERE {column} = '{r.table_id}'")


def _audited(backend: Backend, audit: str) -> list[str]:
    return sorted(json.loads(h)[H.MESSAGE_ID] for _, h, _ in backend.rows(audit))


def test_a_competing_consumers_acknowledgement_leaves_the_marks_of_anothers_claims(backend: Backend,
                                                                                   names: Any) -> None:
    """Two consumers of one queue, B claiming first: the claim table's identity numbers B's
    claims below A's. Each fails one message. A acknowledges with audit copies, then B: A takes
    only its own mark and forgets only what no claim needs, so B's failed message keeps its mark
    until B's acknowledgement, and neither failed message is audited."""
    q, e, audit = (backend.create_queue(names(n)) for n in ("Sales", "error", "audit"))
    settings: dict[str, Any] = {"audit_queue": backend.address(audit), "claim_ahead": False}
    with receiving(backend, q, e, consumer="B", **settings) as b, receiving(backend, q, e, consumer="A", **settings) as a:
        backend.send_many(q, [(nsb_headers(f"b{i}"), b"x") for i in range(3)])
        b_start = b.initial_offset()
        b_end = b.latest(b_start, 1000)
        b_rows = {row.message_id: row.claim_seq for row in read_batch(b, b_start, b_end)}
        backend.send_many(q, [(nsb_headers(f"a{i}"), b"x") for i in range(3)])
        a_start = a.initial_offset()
        a_end = a.latest(a_start, 1000)
        a_rows = {row.message_id: row.claim_seq for row in read_batch(a, a_start, a_end)}
        assert sorted(b_rows) == ["b0", "b1", "b2"] and sorted(a_rows) == ["a0", "a1", "a2"]
        assert max(b_rows.values()) < min(a_rows.values())
        assert _mark(backend, q, [b_rows["b1"]]) == 1 and _mark(backend, q, [a_rows["a1"]]) == 1
        assert _mark(backend, q, [a_rows["a1"]]) == 0  # a dispatch retried marks nothing twice

        a.ack(a_end)
        assert _audited(backend, audit) == ["a0", "a2"]
        assert _marks(backend, a) == 1, "B's mark stays: its claim is still there"
        b.ack(b_end)
        assert _audited(backend, audit) == ["a0", "a2", "b0", "b2"]
        assert _marks(backend, b) == 0
        assert backend.count(q) == 0 and backend.held(q) == 0


def test_an_acknowledgement_without_copies_leaves_no_mark(backend: Backend, names: Any) -> None:
    """A reader with nothing to copy for the platform does not read the marks; the forget of its
    acknowledged batches deletes them, and a mark of a claim table that is gone is never taken
    for a claim of another (the marks are by the claim table's identity)."""
    q, e = (backend.create_queue(names(n)) for n in ("Sales", "error"))
    with receiving(backend, q, e, claim_ahead=False) as r:
        backend.send_many(q, [(nsb_headers(f"m{i}"), b"x") for i in range(5)])
        start = r.initial_offset()
        end = r.latest(start, 1000)
        seqs = sorted(row.claim_seq for row in read_batch(r, start, end))
        assert _mark(backend, q, seqs[1:3]) == 2
        assert _marks(backend, r) == 2
        r.ack(end)
        assert _marks(backend, r) == 0
        assert backend.count(q) == 0 and backend.held(q) == 0


def test_a_mark_of_a_queue_without_a_claim_table_writes_nothing(backend: Backend, names: Any) -> None:
    """The sink names the queue its rows came from; a queue no reader of ours has read (no claim
    table) has no claim to mark."""
    q = backend.create_queue(names("NeverRead"))
    conn = backend.dialect.connect(backend.parsed)
    try:  # the tables, as a sink's set-up makes them
        assert settled.ensure(backend.dialect, backend.parsed, conn, settled.SINK)
    finally:
        conn.close()
    assert _mark(backend, q, [1, 2]) == 0

"""Hundreds of tenant queues in one stream (schema per tenant, `queuePattern`) on a server that
allows 30 connections: the stream holds a handful, whatever number of queues it reads."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from test_queues import fifo_and_once

from backends import PG_NSB_CREATE_QUEUE, Backend, nsb_headers
from processes import START, Job, run_to_end, wait_for
from spark_qtransport.connections import parse_url
from spark_qtransport.dialects import dialect_for
from spark_qtransport.errors import DatabaseError
from spark_qtransport.spark.versions import capabilities
from spark_qtransport.transport import session as db

pytestmark = pytest.mark.db  # a server of its own with few connections

CHILD = Path(__file__).with_name("crash_child.py")
#: the server's connection limit: far below what a connection (or two) per queue would need
MAX_CONNECTIONS = 30
TENANTS, JOINING, PER_TENANT = 300, 20, 8
LEFT = re.compile(r'queue "?tenant_0007"?\."?audit"? left')


@pytest.fixture(scope="module")
def small() -> Iterator[Backend]:
    """A server of its own, with max_connections 30 (and pg_stat_statements). The test's own connections name themselves
    (the connector's are named spark-qtransport); `small.stream_url` is the stream's."""
    from spark_qtransport.cli.embedded import EmbeddedPostgres

    with EmbeddedPostgres(fsync=False, settings={"max_connections": str(MAX_CONNECTIONS),
                                                 "shared_preload_libraries": "pg_stat_statements"}) as pg:
        be = Backend(pg.url + ("&" if "?" in pg.url else "?") + "application_name=tests")
        be.stream_url = pg.url  # type: ignore[attr-defined]
        yield be


def reset_statements(c: Any) -> None:
    """Start pg_stat_statements afresh for a test that counts statements: after the 300-queue
    stream (`test_300_...`) this server kept no entry for new plain statements (SELECT, INSERT;
    seen on PostgreSQL 18) until a reset, so a count could come out 0 whatever ran."""
    c.execute("SELECT pg_stat_statements_reset()")


def connector_connections(be: Backend) -> list[Any]:
    with be.connect() as c:
        return c.execute("SELECT pid, backend_start, state, left(query, 60) FROM pg_catalog.pg_stat_activity"
                         " WHERE application_name = 'spark-qtransport'").fetchall()


def tenant(i: int) -> str:
    return f"tenant_{i:04d}.audit"


def create_tenants(be: Backend, numbers: range) -> None:
    """Each tenant's schema and queue, by NServiceBus's DDL, in one transaction."""
    with be.connect(autocommit=False) as conn:
        cur = conn.cursor()
        for i in numbers:
            cur.execute(f'CREATE SCHEMA "tenant_{i:04d}"')
            cur.execute(PG_NSB_CREATE_QUEUE.format(be.q(tenant(i))))
        conn.commit()


def produce(be: Backend, sent: dict[str, int], numbers: Iterable[int], n: int) -> None:
    """`n` messages more to each tenant, ids `tenant_0001/audit-000000` ... in FIFO order."""
    with be.connect(autocommit=False) as conn:
        for i in numbers:
            queue = tenant(i)
            tag, start = queue.replace(".", "/"), sent.get(queue, 0)
            for j in range(n):
                be.send(queue, nsb_headers(f"{tag}-{start + j:06d}"), b"{}", conn=conn)
            sent[queue] = start + n
        conn.commit()


class Peak:
    """The most connections the connector held at once: all of them (`pg_stat_activity`, by its
    application name, every 50 ms) and the driver's (the sockets to the server of the query's
    source runner, the driver-side Python process, every 250 ms)."""

    def __init__(self, be: Backend) -> None:
        self.be, self.most, self.driver, self._stop = be, 0, 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        port, n = self.be.parsed.port, 0
        with self.be.connect() as conn:
            while not self._stop.wait(0.05):
                (count,) = conn.execute("SELECT count(*) FROM pg_catalog.pg_stat_activity"
                                        " WHERE application_name = 'spark-qtransport'").fetchone()
                self.most = max(self.most, int(count))
                n += 1
                if n % 5:
                    continue
                # the driver's side of a Python source runs in one Python process per query
                for p in psutil.process_iter(["cmdline"]):
                    if "pyspark.sql.streaming.python_streaming_source_runner" in (p.info["cmdline"] or ()):
                        with contextlib.suppress(psutil.Error):
                            mine = [c for c in p.net_connections("tcp") if c.raddr and c.raddr.port == port]
                            self.driver = max(self.driver, len(mine))


@pytest.mark.compat
@pytest.mark.slow(reason="300 queues drained by a job process, SIGKILLed and run again to the end")
def test_300_tenant_queues_by_pattern_on_30_connections_across_a_sigkill(small: Backend, tmp_path: Path) -> None:
    be = small
    create_tenants(be, range(1, TENANTS + 1))
    other = be.create_queue("tenant_0001.other", nsb=True)  # not matched by the pattern
    be.send(other, nsb_headers("other-1"), b"{}")
    error = be.create_queue("error")
    with be.connect() as c:
        c.execute('CREATE TABLE "sink" (message_id text PRIMARY KEY, batch_id bigint)')
        c.execute('CREATE TABLE "sink_log" (message_id text, batch_id bigint, seq bigserial)')
    sent: dict[str, int] = {}
    produce(be, sent, range(1, TENANTS + 1), PER_TENANT)
    checkpoint, markers, log = tmp_path / "ckpt", tmp_path / "markers", tmp_path / "job.log"
    markers.mkdir()
    args = [be.stream_url, "-", error, str(checkpoint), "sink", str(markers)]  # type: ignore[attr-defined]
    env = {"CRASH_QUEUE_PATTERN": '"tenant_*"."audit"'}

    def delivered(queue: str) -> int:
        with be.connect() as c:
            return int(c.execute('SELECT count(*) FROM "sink" WHERE message_id LIKE %s',
                                 (queue.replace(".", "/") + "-%",)).fetchone()[0])

    with Peak(be) as peak:
        job = Job(CHILD, args, log=log, env=env)
        wait_for(lambda: any(markers.glob("batch-*")), START, "a first batch", job)
        # tenants created mid-stream join it; one dropped once drained leaves it
        create_tenants(be, range(TENANTS + 1, TENANTS + JOINING + 1))
        produce(be, sent, range(TENANTS + 1, TENANTS + JOINING + 1), PER_TENANT)
        wait_for(lambda: be.count(tenant(7)) == 0, START, "tenant 7 drained", job)
        be.drop(tenant(7))
        wait_for(lambda: all(delivered(tenant(i)) for i in range(TENANTS + 1, TENANTS + JOINING + 1)), START,
                 "every new tenant read", job)
        # the running stream says the dropped tenant left (before the kill: on Spark 4.0/4.1 a
        # run's first batch plans over the queues matched then, and a queue dropped meanwhile,
        # with nothing held, is not named again)
        wait_for(lambda: LEFT.search(log.read_text()) is not None, START, "a line saying tenant 7 left", job)
        produce(be, sent, [i for i in range(1, TENANTS + 1, 3) if i != 7], 2)
        job.kill()
        produce(be, sent, [i for i in range(2, TENANTS + 1, 5) if i != 7], 1)
        run_to_end(CHILD, args, log=log, env=env)
        if not capabilities().admission_control:
            # Spark 4.0/4.1 commit a run's last batch when the next run starts (docs/databricks.md):
            # one more run, finding nothing new, acknowledges it
            run_to_end(CHILD, args, log=log, env=env, runs=1)

    with be.connect() as c:
        order = [r[0] for r in c.execute('SELECT message_id FROM "sink_log" ORDER BY seq')]
    first, seen = [], set()
    for m in order:  # replays after the kill deliver again (at least once); first deliveries keep FIFO
        if m not in seen:
            seen.add(m)
            first.append(m)
    fifo_and_once(first, {q.replace(".", "/"): n for q, n in sent.items()})
    # the driver closes its sessions at the end; its Python workers' connections close as they exit
    deadline = time.monotonic() + 30
    while (left := connector_connections(be)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"connections left after the run: {left}"
    assert be.count(other) == 1
    for i in (1, 2, TENANTS, TENANTS + JOINING):
        assert be.count(tenant(i)) == 0 and be.count(f'"tenant_{i:04d}"."audit.Claims"') == 0
    text = log.read_text()
    assert LEFT.search(text), "one line says the dropped tenant left"
    assert "too many clients" not in text
    # three on the driver (claims and set-ups, background, a sampler's share of nothing) and one per
    # read task of local[2] (a Python worker keeps its connection between tasks)
    print(f"peak connections: {peak.most}, of the driver: {peak.driver}")
    # the driver holds two (claims, set-ups and resolution; the background thread's), whatever
    # number of queues it reads (no monitoring here: that would be a third); each Python worker
    # one for its read tasks, kept between tasks (local[2] has been seen to keep up to four)
    assert 1 <= peak.driver <= 2, f"the driver held {peak.driver} connections at once"
    assert peak.most <= 8, f"the stream held {peak.most} connections at once"


def test_a_server_out_of_connections_is_one_line_naming_the_limit(small: Backend,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db, "NO_SLOT_WAIT", 1.0)
    url = parse_url(small.url)
    dialect = dialect_for(url)
    db.CONNECTION_LIMITS[str(url)] = MAX_CONNECTIONS  # as a stream's first connection notes it
    held = []
    try:
        while True:
            try:
                held.append(small.connect())
            except Exception:  # noqa: BLE001 - the server is full
                break
        session = db.Session(dialect, url, what="connecting for queue Sales")
        with pytest.raises(DatabaseError) as failed:
            session.run(lambda c: None)
    finally:
        for conn in held:
            conn.close()
    text = str(failed.value)
    assert "\n" not in text
    assert failed.value.operation == "connecting for queue Sales"
    assert f"limit ({MAX_CONNECTIONS})" in text and "3 connections" in text  # the limit; what a stream needs of it


def test_an_idle_trigger_runs_the_same_few_statements_for_60_queues(small: Backend) -> None:
    """No statement of its own per idle queue: the pattern resolved, every backlog in one
    statement, the progress backlog in one more; a queue created meanwhile joins at the next
    trigger. Every consumer lock is held on the one main connection."""
    from spark_qtransport.options.parse import ReaderOptions
    from spark_qtransport.transport.receiving.queueset import QueueSet

    be = small
    with be.connect() as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        reset_statements(c)
        for i in range(60):
            c.execute(f'CREATE SCHEMA "idle_{i:02d}"')
            c.execute(PG_NSB_CREATE_QUEUE.format(f'"idle_{i:02d}"."audit"'))
    be.create_queue("error")
    qs = QueueSet(ReaderOptions.stream({"url": be.stream_url, "queuePattern": '"idle_*"."audit"',  # type: ignore[attr-defined]
                                        "errorQueue": "error"}))

    def trigger(start: Any) -> Any:
        end = qs.latest(start, 1000)
        qs.ack(end, background=True)
        qs.report()
        qs.sessions.background.drain()
        return end

    def statements() -> int:
        with be.connect() as c:
            return int(c.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
                                 " WHERE query NOT ILIKE '%pg_stat%'").fetchone()[0])

    try:
        end = qs.initial_offset()
        for _ in range(3):  # set-ups, a first acknowledgement of each queue's start
            end = trigger(end)
        before = statements()
        for _ in range(5):
            end = trigger(end)
        per_trigger = (statements() - before) / 5
        # two transactions (BEGIN, the statement, COMMIT): the resolution and the backlogs (which
        # progress reports too); a queue alone would run a claim or two per trigger (60: 120+)
        assert 2 <= per_trigger <= 6, per_trigger  # (at least the resolution and the backlogs: counted)
        main = qs.sessions.main.current.info.backend_pid
        with be.connect() as c:
            (locks,) = c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s",
                                 (main,)).fetchone()
        assert locks == 60
        with be.connect() as c:
            c.execute('CREATE SCHEMA "idle_60"')
            c.execute(PG_NSB_CREATE_QUEUE.format('"idle_60"."audit"'))
        be.send("idle_60.audit", nsb_headers("late-1"), b"{}")
        end = trigger(end)
        assert end.queues['"idle_60"."audit"'].claim > 0, "the new queue joins at the next trigger"
    finally:
        qs.close()


def test_a_busy_trigger_claims_and_acknowledges_many_queues_in_one_transaction(small: Backend,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A trigger over 40 busy queues claims from 16 of them in one transaction (the lock table's
    bound, `QUEUES_PER_TRANSACTION`, made 16 here): three, and Spark's commit acknowledges them in
    three more (the server's own record: a statement trigger on each claim table logs the
    transaction it ran in); an AvailableNow run's last acknowledgements too. One queue's claim
    refused fails its transaction: each of its queues then claims alone, and the error names the
    queue at fault; no message is lost."""
    from spark_qtransport.options.parse import ReaderOptions
    from spark_qtransport.transport.receiving import queueset
    from spark_qtransport.transport.receiving.queueset import QueueSet

    monkeypatch.setattr(queueset, "QUEUES_PER_TRANSACTION", 16)

    be, n = small, 40
    queues = [f"busy_{i:02d}.audit" for i in range(n)]
    with be.connect() as c:
        for i in range(n):
            c.execute(f'CREATE SCHEMA "busy_{i:02d}"')
            c.execute(PG_NSB_CREATE_QUEUE.format(f'"busy_{i:02d}"."audit"'))
        c.execute('CREATE TABLE "xact_log" (xid bigint, op text, tenant text)')
        c.execute("CREATE FUNCTION log_xact() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                  "INSERT INTO public.xact_log VALUES (txid_current(), TG_OP, TG_TABLE_SCHEMA); RETURN NULL; END $$")
    be.create_queue("error")
    # claims in the claim table (the claimMode a stream over many queues is in but for a few queues:
    # a prepared claim is a transaction of its own, `PreparedSlots`)
    qs = QueueSet(ReaderOptions.stream({"url": be.stream_url, "queuePattern": '"busy_*"."audit"',  # type: ignore[attr-defined]
                                        "errorQueue": "error", "claimMode": "table"}))

    def fill(numbers: Iterable[int], k: int) -> None:
        with be.connect(autocommit=False) as conn:
            for i in numbers:
                for j in range(k):
                    be.send(queues[i], nsb_headers(f"{queues[i]}-{j}-{time.monotonic_ns()}"), b"{}", conn=conn)
            conn.commit()

    def logged(op: str) -> list[tuple[int, int]]:
        """(transactions, tenants) of the claim tables' `op` statements since the last call."""
        with be.connect() as c:
            rows = c.execute("DELETE FROM xact_log WHERE op = %s RETURNING xid, tenant", (op,)).fetchall()
        return [(len({x for x, _ in rows}), len({t for _, t in rows}))]

    try:
        start = qs.initial_offset()  # every queue's set-up: its claim table made
        with be.connect() as c:
            for i in range(n):
                c.execute(f'CREATE TRIGGER log_xact AFTER INSERT OR DELETE ON "busy_{i:02d}"."audit.Claims" '
                          "FOR EACH STATEMENT EXECUTE FUNCTION log_xact()")
        fill(range(n), 6)
        end = qs.latest(start, 6 * n)
        assert {k: e.claim for k, e in end.queues.items()} and all(e.claim > 0 for e in end.queues.values())
        assert logged("INSERT") == [(3, n)], "the trigger's claims were not three transactions"
        assert all(be.count(q) == 0 for q in queues)
        qs.committed(end)
        qs.sessions.background.drain()
        assert logged("DELETE") == [(3, n)], "the commit's acknowledgements were not three transactions"
        assert all(be.count(f'"busy_{i:02d}"."audit.Claims"') == 0 for i in range(n))
        assert qs.claimed == 6 * n

        # one queue's claim refused (a trigger of its own): the shared claim fails and each queue
        # claims alone, so the error names the queue at fault; nothing is lost
        fill(range(n), 2)
        with be.connect() as c:
            c.execute("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                      "RAISE EXCEPTION 'refused by a trigger'; END $$")
            c.execute('CREATE TRIGGER refuse BEFORE DELETE ON "busy_03"."audit" FOR EACH STATEMENT EXECUTE FUNCTION refuse()')
        with pytest.raises(DatabaseError, match="busy_03.*refused by a trigger"):
            qs.latest(end, 6 * n)
        # the other two parts' queues in one transaction each, then the refused part's queues alone,
        # but the refused one
        assert logged("INSERT") == [(2 + 15, 24 + 15)]
        with be.connect() as c:
            c.execute('DROP TRIGGER refuse ON "busy_03"."audit"')
        later = qs.latest(end, 6 * n)  # the claims made are held: they join this batch
        assert logged("INSERT") == [(1, 1)]
        assert qs.claimed == 8 * n
        assert all(be.count(q) == 0 for q in queues)

        # an AvailableNow run's end: the last batch's acknowledgements in one transaction
        qs.committed(later)
        qs.sessions.background.drain()
        logged("DELETE")
        fill(range(n), 1)
        qs.prepare_available_now()
        last = qs.latest(later, 6 * n)
        assert logged("INSERT") == [(3, n)]
        assert qs.latest(last, 6 * n) == last  # nothing new: the run ends, its last batch acknowledged
        assert logged("DELETE") == [(3, n)], "the run's last acknowledgements were not three transactions"
        assert all(be.count(f'"busy_{i:02d}"."audit.Claims"') == 0 for i in range(n))
    finally:
        qs.close()


def _pages_of_slices(be: Backend, schema: str, batches: list[int], sizes: Any = None) -> list[tuple[list[int], int]]:
    """A tenant queue `schema`.audit given each of `batches` messages in turn, each batch's one
    slice read (`read_chunks`, with `sizes` if given): per batch, the rows of each fetch and the
    pages read from its claim table (`ReceiveSql.read_claims` with a LIMIT, by pg_stat_statements)."""
    from spark_qtransport.transport.receiving.receiver import Receiver, read_chunks
    from spark_qtransport.transport.settings import ReceiveSettings

    with be.connect() as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        reset_statements(c)
        c.execute(f'CREATE SCHEMA "{schema}"')
        c.execute(PG_NSB_CREATE_QUEUE.format(f'"{schema}"."audit"'))
    be.create_queue("error")
    r = Receiver(ReceiveSettings.create(be.stream_url, f"{schema}.audit", error_queue="error",  # type: ignore[attr-defined]
                                        claim_ahead=False, claim_mode="table"))

    def pages() -> int:
        with be.connect() as c:
            return int(c.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE %s"
                                 " AND query LIKE %s", (f'%FROM "{schema}"."audit.Claims"%', "%ORDER BY claim_seq LIMIT%"),
                                 ).fetchone()[0])

    read = []
    try:
        start = r.initial_offset()
        for b, n in enumerate(batches):
            be.send_many(f"{schema}.audit", [(nsb_headers(f"{schema}-{b}-{i}"), b"{}") for i in range(n)])
            end = r.latest(start, n)
            (part,) = r.slices(start, end)
            before = pages()
            fetched = [len(chunk) for chunk in read_chunks(part, sizes=sizes)]
            read.append((fetched, pages() - before))
            r.ack(end)
            start = end
    finally:
        r.close()
    return read


def test_a_small_slice_is_read_in_pages_up_to_its_last_claim_and_no_further(small: Backend) -> None:
    """A tenant queue's share of a batch is a few claims: its slice is read in pages of 1 and 4
    rows, and the page that ends on the slice's last claim is its last one: no page is asked for
    only to find it empty (at 1,000 queues, a statement a queue a batch). A slice whose last page
    comes short stops there as before."""
    assert _pages_of_slices(small, "pages_00", [5, 12]) == [([1, 4], 2), ([1, 4, 7], 3)]


def test_a_tasks_later_slices_are_sized_by_the_rows_it_read_before(small: Backend) -> None:
    """A Spark task reads many tenant queues' slices one after the other: the first is read in pages
    of 1 and 4, as nothing is known of its rows; each later one asks first for as many rows as the
    rows read so far allow (`RowSizes`, at most 16), so a few claims are one page."""
    from spark_qtransport.transport.receiving.slices import RowSizes

    sizes = RowSizes()  # one task's
    assert _pages_of_slices(small, "sizes_00", [5, 5, 40], sizes) == [([1, 4], 2), ([5], 1), ([16, 24], 2)]
    assert 0 < sizes.largest < 2000


def test_a_first_fetch_sized_by_earlier_slices_stays_within_its_bounds() -> None:
    """`RowSizes.first_fetch`: one row while nothing is known; else as many as the byte budget allows
    for the largest row seen, never more than the slice's claims, the fetch's rows or 16."""
    from spark_qtransport.transport.receiving.slices import RowSizes

    sizes = RowSizes()
    assert sizes.first_fetch(5, chunk=5000, budget=16 * 2**20) == 1
    sizes.seen(1000)
    assert sizes.first_fetch(5, chunk=5000, budget=16 * 2**20) == 5
    assert sizes.first_fetch(500, chunk=5000, budget=16 * 2**20) == RowSizes.FIRST_MOST
    assert sizes.first_fetch(500, chunk=3, budget=16 * 2**20) == 3
    sizes.seen(20 * 2**20)  # a 20 MB row: one at a time, as before
    assert sizes.first_fetch(500, chunk=5000, budget=16 * 2**20) == 1
    sizes.seen(10)
    assert sizes.largest == 20 * 2**20


def _tenant_stream(be: Backend, prefix: str, n: int) -> Any:
    """`n` tenant queues "<prefix>_NN"."audit" (NServiceBus's DDL) and a stream over them by pattern,
    claims in the claim table (a `QueueSet`, driven without Spark); pg_stat_statements installed."""
    from spark_qtransport.options.parse import ReaderOptions
    from spark_qtransport.transport.receiving.queueset import QueueSet

    with be.connect() as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        for i in range(n):
            c.execute(f'CREATE SCHEMA "{prefix}_{i:02d}"')
            c.execute(PG_NSB_CREATE_QUEUE.format(f'"{prefix}_{i:02d}"."audit"'))
    be.create_queue("error")
    return QueueSet(ReaderOptions.stream({"url": be.stream_url, "queuePattern": f'"{prefix}_*"."audit"',  # type: ignore[attr-defined]
                                          "errorQueue": "error", "claimMode": "table"}))


def test_queues_acknowledged_together_look_for_retries_only_where_a_chunk_meets_one(small: Backend) -> None:
    """The acknowledgements of many queues in one transaction (`Acker.ack_in`): the retries of the
    queues whose claims hold one are acknowledged once each; a queue with none runs no statement to
    look for them (the chunk's headers, read anyway, say there is none)."""
    from spark_qtransport.wire import H

    be, n = small, 4
    acks = be.create_queue("retry_acks")
    qs = _tenant_stream(be, "retry", n)
    try:
        start = qs.initial_offset()
        for i in range(n):
            rows = [(nsb_headers(f"m{i}-{j}"), b"{}") for j in range(3)]
            if i % 2:
                rows.append((nsb_headers(f"r{i}", **{H.RETRY_UNIQUE_MESSAGE_ID: f"u-{i}", H.RETRY_ACK_QUEUE: acks}),
                             b"{}"))
            be.send_many(f"retry_{i:02d}.audit", rows)
        end = qs.latest(start, 100)
        with be.connect() as c:
            reset_statements(c)
        qs.committed(end)
        qs.sessions.background.drain()
        scans = _calls(be, "%strpos(headers%FOR UPDATE%")
        assert scans == n // 2, f"{scans} scans for retries over {n} queues, {n // 2} of them with one"
        assert sorted(json.loads(h)[H.RETRY_UNIQUE_MESSAGE_ID] for _, h, _ in be.rows(acks)) == ["u-1", "u-3"]
        assert all(be.count(f'"retry_{i:02d}"."audit.Claims"') == 0 for i in range(n))
    finally:
        qs.close()


def test_queues_acknowledged_together_forget_their_batches_in_one_statement(small: Backend) -> None:
    """The records of the batches that many queues' acknowledgements in one transaction settle go in
    one statement (`forget_together`); a queue whose claim table holds a failed mark forgets on its
    own as well, and its mark of a claim acknowledged goes with it."""
    from spark_qtransport.transport import settled
    from spark_qtransport.transport.receiving.slices import record_batch

    be, n = small, 4
    d = be.dialect
    qs = _tenant_stream(be, "forget", n)

    def records() -> int:
        return be.count(d.format_address(d.batches_table()), "WHERE claims LIKE '%forget_%'")

    try:
        start = qs.initial_offset()
        for batch_id, marked in ((0, None), (1, 2)):
            for i in range(n):
                be.send_many(f"forget_{i:02d}.audit", [(nsb_headers(f"m{i}-{j}-{batch_id}"), b"{}") for j in range(3)])
            end = qs.latest(start, 100)
            parts = qs.slices(start, end)
            record_batch(parts, query_id="forget-query", batch_id=batch_id)
            assert records() == n
            if marked is not None:  # the sink failed one message of queue 2 (its mark, as the dispatch writes it)
                part = next(p for p in parts if "forget_02" in p.queue)
                stmt = settled.note_failed(d, part.claims, [part.upto])
                with be.connect() as c:
                    c.execute(stmt.sql, stmt.params)
            with be.connect() as c:
                reset_statements(c)
            qs.committed(end)
            qs.sessions.background.drain()
            assert records() == 0
            assert _calls(be, "%AS q(claims, consumer, upto, table_id)%") == 1, "the batches' records were not forgotten in one statement"
            alone = _calls(be, "WITH marks AS (DELETE FROM%")
            assert alone == (0 if marked is None else 1), f"{alone} queues forgot alone"
            assert be.count(d.format_address(d.failed_table())) == 0
            start = end
    finally:
        qs.close()


def _calls(be: Backend, like: str) -> int:
    """Calls since the last reset of the statements whose text is LIKE `like` (pg_stat_statements)."""
    with be.connect() as c:
        return int(c.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE %s",
                             (like,)).fetchone()[0])


def _peeks(be: Backend, schema: str) -> int:
    """Backlog statements (`Dialect.backlogs`) run since the last reset that peeked `schema`'s queue."""
    with be.connect() as c:
        return int(c.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
                             " WHERE query LIKE %s AND query LIKE %s",
                             ("%ORDER BY seq DESC LIMIT%", f'%"{schema}"."audit"%')).fetchone()[0])


def _idle_triggers(qs: Any, start: Any, n: int) -> Any:
    end = start
    for _ in range(n):
        end = qs.latest(end, 100)
        qs.committed(end)
        qs.sessions.background.drain()
    return end


def test_an_idle_queue_known_empty_by_its_sequence_is_not_peeked_until_it_moves(small: Backend) -> None:
    """At each trigger one statement reads every queue's sequence; a queue known to be empty is not
    peeked again while its sequence stands still: a message that moves it is claimed at the first
    trigger after it was sent. A cached sequence tells nothing (peeked each trigger); a row that
    names its own number is found at the queue's recheck."""
    be, n = small, 4
    qs = _tenant_stream(be, "quiet", n)
    try:
        end = _idle_triggers(qs, qs.initial_offset(), 4)  # set-up; seen empty; sure
        with be.connect() as c:
            reset_statements(c)
        end = _idle_triggers(qs, end, 3)
        assert [_peeks(be, f"quiet_{i:02d}") for i in range(n)] == [0] * n, "a quiet queue was peeked"
        be.send("quiet_02.audit", nsb_headers("wakes"), b"{}")
        end = qs.latest(end, 100)
        assert end.queues['"quiet_02"."audit"'].claim > 0, "a message that moved its queue's sequence was not claimed"
        assert [_peeks(be, f"quiet_{i:02d}") for i in range(n)] == [0, 0, 1, 0]
        qs.committed(end)
        with be.connect() as c:
            c.execute('ALTER SEQUENCE "quiet_01"."audit_seq_seq" CACHE 20')  # a cached sequence tells nothing
            reset_statements(c)
        end = _idle_triggers(qs, end, 4)
        assert _peeks(be, "quiet_01") == 4 and _peeks(be, "quiet_03") == 0
        # a row that did not take its number from the sequence: found at the queue's next recheck
        from spark_qtransport.transport.receiving.quiet import RECHECK

        qs._quiet._clock = lambda: time.monotonic() + RECHECK  # noqa: SLF001 - every sure queue's recheck is due
        with be.connect() as c:
            c.execute('INSERT INTO "quiet_03"."audit" (id, headers, body, seq) VALUES (gen_random_uuid(), %s, %s, 1000)',
                      (json.dumps(nsb_headers("numbered by hand")), b"{}"))
        end = qs.latest(end, 100)
        assert end.queues['"quiet_03"."audit"'].claim > 0
        qs.committed(end)
    finally:
        qs.close()


def test_one_busy_queue_among_idle_ones_gets_the_whole_trigger(small: Backend) -> None:
    """maxMessagesPerTrigger is shared among the queues with messages waiting: the idle ones claim
    nothing, so they take no share of it (they took 1 each, and a busy queue beside 29 idle ones
    got 1 message of 20 a trigger). The progress report names only what is not 0."""
    be = small
    qs = _tenant_stream(be, "lone", 30)
    try:
        end = _idle_triggers(qs, qs.initial_offset(), 2)
        for i in range(50):
            be.send("lone_07.audit", nsb_headers(f"m{i}"), b"{}")
        before = qs.claimed
        end = qs.latest(end, 20)
        assert qs.claimed - before == 20, "the busy queue's share is the whole trigger's"
        # the progress report: totals first; a queue's counters and backlog only where not 0
        report = qs.report()
        assert report["claimed"] == 20 and report["backlog"] == 30 and report["expired"] == 0
        busy, idle = report["queues"]['"lone_07"."audit"'], report["queues"]['"lone_08"."audit"']
        assert busy["claimed"] == 20 and busy["backlog"] == 30 and "expired" not in busy
        assert sorted(idle) == ["claim", "claimTable"] and len(report["queues"]) == 30
        qs.committed(end)
    finally:
        qs.close()


def test_busy_queues_a_batch_cannot_serve_usefully_take_turns(small: Backend) -> None:
    """30 queues of 10 messages and batches of 50: five queues' 10 messages a batch, in the order of
    their keys and round again, not every queue's 1 or 2 (each queue's statements cost the server
    about as much for 10 rows as for 1). A turn whose counts were stale (another consumer took its
    queues' messages between the count and the claim) passes to the next queues in the same
    trigger, so a batch is planned while any queue has messages."""
    be, n = small, 30
    qs = _tenant_stream(be, "turn", n)
    queues = [f"turn_{i:02d}.audit" for i in range(n)]

    def fill() -> None:
        with be.connect(autocommit=False) as conn:
            for q in queues:
                for j in range(10):
                    be.send(q, nsb_headers(f"{q}-{j}-{time.monotonic_ns()}"), b"{}", conn=conn)
            conn.commit()

    def served(before: list[int]) -> list[int]:
        """The queues a batch took messages from, by number, and how many from each."""
        now = [be.count(q) for q in queues]
        return [before[i] - now[i] for i in range(n)]

    try:
        end = _idle_triggers(qs, qs.initial_offset(), 1)
        fill()
        taken = []
        for _ in range(6):
            before = [be.count(q) for q in queues]
            end = qs.latest(end, 50)
            qs.committed(end)
            qs.sessions.background.drain()
            taken.append(served(before))
        for b, batch in enumerate(taken):  # batch b took queues 5b .. 5b+4, each whole
            assert batch == [10 if 5 * b <= i < 5 * b + 5 else 0 for i in range(n)], f"batch {b}: {batch}"
        assert qs.claimed == 10 * n and qs.latest(end, 50) == end

        # the last batch's 50 messages were all there were (no turns): the next turns begin after
        # the last queue served in turns, 24
        fill()
        assert qs.waiting(end) == 10 * n  # counted: the next turn is queues 25-29
        with be.connect() as c:  # another consumer empties them before the claim
            for q in queues[25:]:
                c.execute(f'DELETE FROM "{q.split(".")[0]}"."audit"')
        before = [be.count(q) for q in queues]
        end = qs.latest(end, 50, counted=True)
        assert served(before) == [10 if i < 5 else 0 for i in range(n)], "the stale turn was not passed on"
        qs.committed(end)
    finally:
        qs.close()


def test_a_pattern_is_resolved_again_only_when_the_catalog_changes(small: Backend) -> None:
    """An idle trigger reads the catalog's version, not the pattern's candidates: a queue created,
    renamed away or dropped changes it, and the next trigger resolves the pattern again."""
    be, n = small, 4
    resolve, version = "WITH t AS MATERIALIZED%", "SELECT count(*), max(c.xmin::text::bigint)%"
    qs = _tenant_stream(be, "cat", n)
    try:
        end = _idle_triggers(qs, qs.initial_offset(), 3)
        with be.connect() as c:
            reset_statements(c)
        end = _idle_triggers(qs, end, 3)
        assert (_calls(be, resolve), _calls(be, version)) == (0, 3), "the pattern was resolved with nothing changed"
        with be.connect() as c:
            c.execute('CREATE SCHEMA "cat_99"')
            c.execute(PG_NSB_CREATE_QUEUE.format('"cat_99"."audit"'))
        be.send("cat_99.audit", nsb_headers("new tenant"), b"{}")
        end = qs.latest(end, 100)
        assert end.queues['"cat_99"."audit"'].claim > 0, "a queue created joins at the next trigger"
        qs.committed(end)
        with be.connect() as c:
            c.execute('ALTER TABLE "cat_00"."audit" RENAME TO "renamed"')
        end = _idle_triggers(qs, end, 1)
        assert '"cat_00"."audit"' not in qs.current(), "a queue renamed away is still read"
        with be.connect() as c:
            c.execute('DROP TABLE "cat_01"."audit"')
        end = _idle_triggers(qs, end, 1)
        assert '"cat_01"."audit"' not in qs.current(), "a dropped queue is still read"
        assert _calls(be, resolve) == 3
    finally:
        qs.close()


def test_an_idle_queue_with_nothing_held_is_not_planned(small: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle trigger plans no queue that has nothing waiting and nothing held beyond its start
    (`Receiver.at_rest`): its end is its start. A queue with a message is planned, and claims it."""
    from spark_qtransport.transport.receiving.receiver import Receiver

    be, n = small, 4
    qs = _tenant_stream(be, "rest", n)
    planned: list[str] = []
    begin = Receiver.begin_plan

    def counted(self: Receiver, *args: Any, **kwargs: Any) -> Any:
        planned.append(self.endpoint.queue_text)
        return begin(self, *args, **kwargs)

    try:
        end = _idle_triggers(qs, qs.initial_offset(), 3)
        monkeypatch.setattr(Receiver, "begin_plan", counted)
        after = _idle_triggers(qs, end, 3)
        assert planned == [] and after == end
        be.send("rest_02.audit", nsb_headers("wakes"), b"{}")
        after = qs.latest(after, 100)
        assert planned == ['"rest_02"."audit"'] and after.queues['"rest_02"."audit"'].claim > 0
        assert {k: e for k, e in after.queues.items() if k != '"rest_02"."audit"'} == \
            {k: e for k, e in end.queues.items() if k != '"rest_02"."audit"'}
        qs.committed(after)
    finally:
        qs.close()


def test_a_queue_whose_sender_has_not_committed_is_peeked_until_it_has(small: Backend,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A sender took its number before a peek and commits after it: the peek saw nothing, and the
    sequence does not move again. The queue is not taken as empty while a transaction holds a
    writer's lock on it, so the message is claimed at the first trigger after the commit. The
    writers' locks are read once a trigger, after the sequences of every part of the queues."""
    from spark_qtransport.transport.receiving import quiet

    monkeypatch.setattr(quiet, "SEQUENCES_PER_TRANSACTION", 2)  # two parts: 00 and 01, 02 and 03
    be = small
    qs = _tenant_stream(be, "inflight", 4)
    try:
        end = _idle_triggers(qs, qs.initial_offset(), 4)
        with be.connect(autocommit=False) as one, be.connect(autocommit=False) as other:
            be.send("inflight_01.audit", nsb_headers("late commit"), b"{}", conn=one)
            be.send("inflight_03.audit", nsb_headers("later commit"), b"{}", conn=other)
            end = _idle_triggers(qs, end, 4)  # seen empty with its sequence standing still, again and again
            assert end.queues['"inflight_01"."audit"'].claim == 0 and end.queues['"inflight_03"."audit"'].claim == 0
            with be.connect() as c:
                reset_statements(c)
            end = _idle_triggers(qs, end, 2)
            assert [_peeks(be, f"inflight_{i:02d}") for i in range(4)] == [0, 2, 0, 2]
            assert _calls(be, "%pg_sequence_last_value%") == 4, "a statement a part a trigger"
            assert _calls(be, "%pg_locks%") == 2, "the writers' locks of both parts in one statement a trigger"
            one.commit()
            other.commit()
        end = qs.latest(end, 100)
        assert end.queues['"inflight_01"."audit"'].claim > 0, "the message committed late waits for a recheck"
        assert end.queues['"inflight_03"."audit"'].claim > 0
        qs.committed(end)
    finally:
        qs.close()


def test_a_streams_set_ups_ask_what_they_share_once_per_connection(small: Backend) -> None:
    """The set-ups of a stream's queues on its main connection ask the server's version once and
    check the error queue they all name once; every queue's own table and claim table are read in
    one statement, and every consumer lock taken in one more (`look_ahead`): the very locks a
    query of the same endpoint on one of those queues then fails to take."""
    be, n = small, 5
    qs = _tenant_stream(be, "shared", n)

    try:
        qs.initial_offset()  # creates the claim tables
    finally:
        qs.close()
    qs = _tenant_stream(be, "shared", 0)  # the same queues, by the same pattern: their claim tables exist
    try:
        with be.connect() as c:
            reset_statements(c)
        qs.initial_offset()
        # the connection's limit and the server's version (one entry: the same statement to the server)
        assert _calls(be, "%current_setting($1)::int") == 2
        # every queue's own table and claim table, and the error queue, in one statement; the locks in one
        assert _calls(be, "SELECT lower(a.attname), format_type%") == 0
        assert _calls(be, "%lower(a.attname), pg_catalog.format_type%") == 1
        assert _calls(be, "%pg_try_advisory_lock%") == 1
        d = be.dialect
        with be.connect() as c:  # another session: each queue's lock, as a query of its own asks for it
            for i in range(n):
                claims = d.claims_table(d.parse_address(f"shared_{i:02d}.audit"))
                stmt = d.try_lock_consumer(claims, "audit")
                taken = c.execute(stmt.sql, stmt.params).fetchone()[0]
                assert taken is False, f"queue shared_{i:02d}: the stream's consumer lock was not held"
    finally:
        qs.close()


def test_a_streams_first_planning_reads_what_its_queues_hold_together_and_takes_over_what_one_holds(
        small: Backend, caplog: pytest.LogCaptureFixture) -> None:
    """A run's first planning over many queues reads what each holds in transactions shared by the
    queues (`QueueSet._look_first`), not a few of its own each. A queue whose consumer holds nothing
    runs nothing more; one holding another query's claims (same endpoint, a new checkpoint) reads
    its claim table's consumers and settled batches, warns that it takes them over and plans them."""
    be, n = small, 6
    qs = _tenant_stream(be, "look", n)
    try:  # another query of the same endpoint claims 3 messages of one queue and dies unacknowledged
        be.send_many('"look_04"."audit"', [(nsb_headers(f"m{i}"), b"{}") for i in range(3)])
        end = qs.latest(qs.initial_offset(), 100)
        assert end.queues['"look_04"."audit"'].claim == 3
    finally:
        qs.close()

    qs = _tenant_stream(be, "look", 0)
    try:
        start = qs.initial_offset()
        with be.connect() as c:
            reset_statements(c)
        with caplog.at_level("WARNING", logger="spark_qtransport"):
            end = qs.latest(start, 100)
        assert end.queues['"look_04"."audit"'].claim == 3, "the claims taken over were not planned again"
        warned = [r.getMessage() for r in caplog.records if "takes over" in r.getMessage()]
        assert len(warned) == 1 and 'queue "look_04"."audit"' in warned[0] and "takes over 3 message(s)" in warned[0]
        # what each consumer holds: one statement for the queues of a transaction (`Dialect.max_claims`)
        assert _calls(be, '%FROM "look_0_"."audit.Claims" WHERE consumer = $_ ORDER BY claim_seq DESC%') == 1
        assert _calls(be, "SELECT consumer, count(*)%") == 1  # only where something is held
        assert _calls(be, 'SELECT max(upto_claim) FROM%') == 1
        assert _calls(be, "BEGIN%") <= 6, "the queues' first reads are not shared"
        qs.committed(end)
    finally:
        qs.close()

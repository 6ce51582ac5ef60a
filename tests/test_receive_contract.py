"""Contract suite for receiving, run per dialect and claim form: PostgreSQL with claims in the
claim table and in prepared transactions (`claimMode`, on a server of its own that allows them), SQL
Server when configured.

Drives the same code Spark drives (claim on the driver, read slices as executors do, acknowledge)
without a SparkSession, so every dialect is held to one behaviour. Test names follow the
NServiceBus transport conformance scenarios (../shared/CONFORMANCE.md).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from backends import Backend, nsb_headers, server_of_its_own
from spark_qtransport.dialects.postgres import PostgresDialect
from spark_qtransport.errors import ConsumerBusyError, QueueNotFoundError
from spark_qtransport.options.registry import name_fields
from spark_qtransport.transport.receiving import setup
from spark_qtransport.transport.receiving.planner import LOW_WATER_TTL
from spark_qtransport.transport.receiving.receiver import ClaimOffset, Receiver, read_slice
from spark_qtransport.transport.settings import ReceiveSettings


@pytest.fixture(scope="module")
def prepared_server() -> Iterator[Any]:
    yield from server_of_its_own(max_prepared_transactions="16")


@pytest.fixture(params=["postgres", "postgres-prepared", "sqlserver"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """The suite's database (the conftest's, per dialect) and, on PostgreSQL, each claim form:
    "postgres-prepared" is a server whose `max_prepared_transactions` lets `claimMode` auto hold
    claims in prepared transactions (with SQLQUEUE_TEST_PREPARED_SLOTS set, both are)."""
    if request.param == "postgres-prepared":
        return Backend(request.getfixturevalue("prepared_server").url)
    return request.getfixturevalue("backend_of_dialect")  # type: ignore[no-any-return]


@pytest.fixture
def backend_of_dialect(request: pytest.FixtureRequest) -> Backend:
    name = request.node.callspec.params["backend"]
    if name == "sqlserver":
        if not os.environ.get("SQLQUEUE_TEST_SQLSERVER_URL"):
            pytest.skip("SQLQUEUE_TEST_SQLSERVER_URL not set")
        return Backend(os.environ["SQLQUEUE_TEST_SQLSERVER_URL"])
    return request.getfixturevalue("pg")  # type: ignore[no-any-return]


def postgres_only(backend: Backend) -> Backend:
    if backend.name != "postgres":
        pytest.skip("PostgreSQL only")
    return backend


def make_receiver(backend: Backend, queue: str, error: str, **settings: Any) -> Receiver:
    return Receiver(ReceiveSettings.create(backend.url, queue, error_queue=error, **settings))


@contextmanager
def receiving(backend: Backend, queue: str, error: str, **settings: Any) -> Iterator[Receiver]:
    """A receiver for the test's queue, closed (endpoint lock released) however the test ends."""
    r = make_receiver(backend, queue, error, **settings)
    try:
        yield r
    finally:
        r.close()


def read_batch(r: Receiver, start: ClaimOffset, end: ClaimOffset) -> list[tuple]:
    rows: list[tuple] = []
    for part in r.slices(start, end):
        rows.extend(read_slice(part))
    return rows


def drain(r: Receiver, start: ClaimOffset | None = None, *, limit: int = 1000, ack: bool = True) -> tuple[list[tuple], ClaimOffset]:
    """Run micro-batches the way Spark does until a batch comes back empty."""
    start = start or r.initial_offset()
    out: list[tuple] = []
    while True:
        end = r.latest(start, limit)
        if end == start:
            return out, start
        out.extend(read_batch(r, start, end))
        if ack:
            r.ack(end)
        start = end


@pytest.fixture
def queues(backend: Backend, names):  # type: ignore[no-untyped-def]
    q, e = names("Sales"), names("error")
    backend.create_queue(q)
    backend.create_queue(e)
    yield q, e
    backend.let_go_prepared()  # a failed test's prepared claims would hold its tables' locks
    for t in (q, e, backend.claims(q)):
        backend.drop(t)


def test_message_is_available(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    q, e = queues
    headers = nsb_headers("order-1", **{"Custom.Empty": "", "Custom.Null": None})  # type: ignore[arg-type]
    body = b'{"OrderId": 1, "bytes": "\x00\xff"}'
    nid = backend.send(q, headers, body)
    with receiving(backend, q, e) as r:
        rows, _ = drain(r)
    assert len(rows) == 1
    message_id, native_id, got_headers, got_body = rows[0][:4]
    assert message_id == "order-1"
    assert native_id == str(nid)
    assert got_headers == headers
    assert got_body == body
    assert backend.count(q) == 0


def test_unicode_in_headers(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    q, e = queues
    headers = nsb_headers(**{"Zeichen.Ünïcödé": "值 😀 \u00e9", "emoji.🚀": "𝄞 surrogate pair"})
    backend.send(q, headers, "héllo 😀".encode())
    with receiving(backend, q, e) as r:
        rows, _ = drain(r)
    assert rows[0][2] == headers
    assert rows[0][3].decode() == "héllo 😀"


def test_queue_contains_expired_messages(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    q, e = queues
    for i in range(5):
        backend.send(q, nsb_headers(f"expired-{i}"), ttbr_ms=-60_000)
    for i in range(3):
        backend.send(q, nsb_headers(f"alive-{i}"), ttbr_ms=3_600_000)
    backend.send(q, nsb_headers("forever"))
    with receiving(backend, q, e) as r:
        rows, _ = drain(r)
        assert r.stats.expired == 5
    assert sorted(row[0] for row in rows) == ["alive-0", "alive-1", "alive-2", "forever"]
    assert all(row[4] is not None for row in rows if row[0].startswith("alive"))
    assert backend.count(q) == 0
    assert backend.count(e) == 0


@pytest.mark.parametrize(
    "bad",
    [
        "<corrupted headers",
        "[1, 2, 3]",
        '{"nested": {"a": "b"}}',
        '{"number": 5}',
        '"just a string"',
        " ",  # white space is not empty: NServiceBus's JSON parse fails on it
        '{"ok": "x", "bad": [1]}',
        "{}}",
    ],
)
@pytest.mark.parametrize("helper", [False, True], ids=["builtin", "plpgsql-helper"])
def test_corrupted_headers(backend: Backend, queues, bad: str, helper: bool) -> None:  # type: ignore[no-untyped-def]
    q, e = queues
    backend.send(q, nsb_headers("before"))
    poison_id = backend.send(q, bad, b"poison body")
    backend.send(q, nsb_headers("after"))
    if helper and backend.name != "postgres":
        pytest.skip("PostgreSQL only")
    with receiving(backend, q, e) as r:
        # the PostgreSQL 13-15 path: headers checked by a PL/pgSQL helper function
        r.endpoint.dialect = PostgresDialect(force_helper=helper)
        rows, _ = drain(r)
        assert r.stats.poison == 1
    assert [row[0] for row in rows] == ["before", "after"]
    if helper:
        *_, claim_sql = r.dialect.claim(r.options.queue, r.claims, r.options.error_queue,
                                       consumer="x", limit=1, after=0, upto=None)
        assert "sqlqueue_poison_headers(" in claim_sql.sql and "pg_input_is_valid" not in claim_sql.sql
    # moved raw: same native id, headers text and body, in the claim transaction
    assert backend.rows(e) == [(str(poison_id), bad, b"poison body")]
    assert backend.count(q) == 0


@pytest.mark.parametrize("helper", [False, True], ids=["builtin", "plpgsql-helper"])
def test_corrupted_headers_of_an_expired_message(backend: Backend, queues, helper: bool) -> None:  # type: ignore[no-untyped-def]
    """NServiceBus dead-letters a row whose headers it cannot read before it looks at Expires
    (MessageRow.TryParse, then ProcessWithNativeTransaction's IsPoison): expired or not, it goes
    raw to the error queue, never deleted silently."""
    q, e = queues
    if helper and backend.name != "postgres":
        pytest.skip("PostgreSQL only")
    poison_id = backend.send(q, "<corrupted headers", b"poison body", ttbr_ms=-60_000)
    backend.send(q, nsb_headers("expired"), ttbr_ms=-60_000)
    backend.send(q, nsb_headers("after"))
    with receiving(backend, q, e) as r:
        r.endpoint.dialect = PostgresDialect(force_helper=helper) if backend.name == "postgres" else r.endpoint.dialect
        rows, _ = drain(r)
        assert (r.stats.poison, r.stats.expired) == (1, 1)
    assert [row[0] for row in rows] == ["after"]
    assert backend.rows(e) == [(str(poison_id), "<corrupted headers", b"poison body")]
    assert backend.count(q) == 0


@pytest.mark.parametrize("helper", [False, True], ids=["builtin", "plpgsql-helper"])
def test_empty_headers_are_an_empty_header_set(backend: Backend, queues, helper: bool) -> None:  # type: ignore[no-untyped-def]
    """Headers '' are no headers in NServiceBus (Message: string.IsNullOrEmpty), not corrupted:
    the message is delivered with an empty header map, its native id as message id."""
    q, e = queues
    if helper and backend.name != "postgres":
        pytest.skip("PostgreSQL only")
    empty_id = backend.send(q, "", b"no headers")
    backend.send(q, nsb_headers("after"))
    with receiving(backend, q, e) as r:
        r.endpoint.dialect = PostgresDialect(force_helper=helper) if backend.name == "postgres" else r.endpoint.dialect
        rows, _ = drain(r)
        assert r.stats.poison == 0
    assert [(row[0], row[1], row[2], row[3]) for row in rows] == [
        (str(empty_id), str(empty_id), {}, b"no headers"), ("after", rows[1][1], rows[1][2], b"{}")]
    assert backend.count(e) == 0 and backend.count(q) == 0


@pytest.mark.parametrize("helper", [False, True], ids=["builtin", "plpgsql-helper"])
def test_an_escaped_nul_in_headers_is_no_poison(backend: Backend, queues, helper: bool) -> None:  # type: ignore[no-untyped-def]
    """NServiceBus writes a NUL in a header value as the escape \\u0000 and reads it back
    (System.Text.Json); PostgreSQL's jsonb refuses that escape. The message is delivered with the
    NUL in its header, not dead-lettered."""
    q, e = queues
    if helper and backend.name != "postgres":
        pytest.skip("PostgreSQL only")
    text = '{"NServiceBus.MessageId":"nul","Note":"a\\u0000b","K\\u0000":"\\\\u0000"}'
    backend.send(q, text, b"body")
    with receiving(backend, q, e) as r:
        r.endpoint.dialect = PostgresDialect(force_helper=helper) if backend.name == "postgres" else r.endpoint.dialect
        rows, _ = drain(r)
        assert r.stats.poison == 0
    assert [(row[0], row[2]) for row in rows] == [
        ("nul", {"NServiceBus.MessageId": "nul", "Note": "a\x00b", "K\x00": "\\u0000"})]
    assert backend.count(e) == 0 and backend.count(q) == 0


def test_starting_again_with_new_messages(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    q, e = queues
    backend.send(q, nsb_headers("first"))
    r = make_receiver(backend, q, e)
    rows, last = drain(r)
    r.close()
    backend.send(q, nsb_headers("second"))
    with receiving(backend, q, e) as r2:
        rows2, _ = drain(r2, last)
    assert [x[0] for x in rows] == ["first"]
    assert [x[0] for x in rows2] == ["second"]


def test_stop_during_a_batch_redelivers_claims(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    """A batch that was claimed and read but never committed is delivered again, complete."""
    q, e = queues
    for i in range(10):
        backend.send(q, nsb_headers(f"m{i}"))
    r = make_receiver(backend, q, e)
    start = r.initial_offset()
    end = r.latest(start, 1000)
    first = [row[0] for row in read_batch(r, start, end)]
    r.close()  # the query dies here: no commit, no ack
    # same checkpoint: Spark replays batch (start, end]
    with receiving(backend, q, e) as r2:
        replay = [row[0] for row in read_batch(r2, start, end)]
        # new checkpoint: the held claims are found and delivered again
        fresh, _ = drain(r2, r2.initial_offset())
    assert first == replay == [row for row in (f"m{i}" for i in range(10))]
    assert [row[0] for row in fresh] == first


def test_deleted_checkpoint_gets_unacknowledged_claims(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    q, e = queues
    for i in range(4):
        backend.send(q, nsb_headers(f"m{i}"))
    r = make_receiver(backend, q, e)
    # two batches delivered, never acknowledged (no commit came; the query stopped before Spark
    # planned again: a planning that finds nothing new acknowledges what came before it)
    start = r.initial_offset()
    mid = r.latest(start, 2)
    end = r.latest(mid, 2)
    rows = read_batch(r, start, mid) + read_batch(r, mid, end)
    r.close()
    assert len(rows) == 4
    with receiving(backend, q, e) as r2:
        again, _ = drain(r2, r2.initial_offset())
    assert sorted(x[0] for x in again) == ["m0", "m1", "m2", "m3"]


def test_claims_a_crashed_planner_made_are_delivered(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    """The driver died after the claim committed, before Spark wrote the offset: no loss."""
    q, e = queues
    for i in range(3):
        backend.send(q, nsb_headers(f"m{i}"))
    r = make_receiver(backend, q, e)
    start = r.initial_offset()
    r.latest(start, 1000)  # claimed; Spark never learns the end offset
    r.close()
    with receiving(backend, q, e) as r2:
        rows, _ = drain(r2, start)
    assert [x[0] for x in rows] == ["m0", "m1", "m2"]


def test_fifo_in_batches(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    q, e = queues
    backend.send_many(q, [(nsb_headers(f"{i:04d}"), b"x") for i in range(250)])
    with receiving(backend, q, e, num_partitions=3) as r:
        rows, _ = drain(r, limit=40)
    assert [x[0] for x in rows] == [f"{i:04d}" for i in range(250)]
    seqs = [x[-3] for x in rows]
    assert seqs == sorted(seqs)


def test_peek_while_a_row_is_held(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    """Rows another consumer holds are skipped: no blocking, no claim of held rows."""
    q, e = queues
    backend.send(q, nsb_headers("held"))
    backend.send(q, nsb_headers("free"))
    other = backend.connect(autocommit=False)
    try:
        held = backend.receive_one(q, other)  # an NServiceBus endpoint is mid-handling this row
        assert held is not None
        with receiving(backend, q, e) as r:
            assert r.backlog() == 1
            rows, _ = drain(r)
            assert [x[0] for x in rows] == ["free"]
            assert r.backlog() == 0
    finally:
        other.rollback()  # the endpoint fails: the row is back
        other.close()
    assert backend.count(q) == 1


def test_receive_stops_at_first_empty_claim(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    """An overestimated backlog (all rows held elsewhere) costs one empty peek, not a storm."""
    q, e = queues
    for i in range(3):
        backend.send(q, nsb_headers(f"m{i}"))
    other = backend.connect(autocommit=False)
    try:
        for _ in range(3):
            assert backend.receive_one(q, other) is not None
        with receiving(backend, q, e) as r:
            start = r.initial_offset()
            assert r.latest(start, 100) == start
            assert r.stats.claims == 0  # no claim transaction ran
            assert r.stats.empty_peeks == 1
    finally:
        other.rollback()
        other.close()


def test_an_empty_queue_makes_no_write(pg: Backend, names) -> None:  # type: ignore[no-untyped-def]
    q, e = pg.create_queue(names("Idle")), pg.create_queue(names("error"))
    with receiving(pg, q, e) as r:
        start = r.initial_offset()  # set-up (claim table, lock) happens here
        with pg.connect() as watch:
            cur = watch.cursor()
            cur.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
            before = cur.fetchone()[0]
            for _ in range(20):
                assert r.latest(start, 100) == start
            cur.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
            after = cur.fetchone()[0]
        # no transaction id was assigned: nothing in the database was written
        assert after == before
        assert r.stats.claims == 0


def test_competing_consumers_never_share_a_message(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    """Two receivers with different endpoints and a raw NServiceBus consumer drain one queue."""
    q, e = queues
    total = 600
    backend.send_many(q, [(nsb_headers(f"m{i}"), b"x") for i in range(total)])
    got: dict[str, list[str]] = {"a": [], "b": [], "nsb": []}
    errors: list[BaseException] = []

    def spark_like(endpoint: str) -> None:
        r = make_receiver(backend, q, e, consumer=endpoint)
        try:
            rows, _ = drain(r, limit=25)
            got[endpoint].extend(x[0] for x in rows)
        except BaseException as exc:  # reported by the test thread below
            errors.append(exc)
        finally:
            r.close()

    def nsb() -> None:
        conn = backend.connect(autocommit=False)
        try:
            while True:
                row = backend.receive_one(q, conn)
                conn.commit()
                if row is None:
                    break
                got["nsb"].append(json.loads(row[2])["NServiceBus.MessageId"])
        finally:
            conn.close()

    threads = [threading.Thread(target=spark_like, args=("a",)), threading.Thread(target=spark_like, args=("b",)), threading.Thread(target=nsb)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    everything = got["a"] + got["b"] + got["nsb"]
    assert len(everything) == len(set(everything)) == total
    assert backend.count(q) == 0


def test_one_running_query_per_endpoint(backend: Backend, queues, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    q, e = queues
    r1 = make_receiver(backend, q, e, consumer="Billing")
    r1.initial_offset()
    r2 = make_receiver(backend, q, e, consumer="Billing")
    monkeypatch.setattr(setup, "LOCK_WAIT", 1.0)
    try:
        with pytest.raises(ConsumerBusyError, match="Billing"):
            r2.initial_offset()
    finally:
        r1.close()
        r2.close()
    r3 = make_receiver(backend, q, e, consumer="Billing")  # released on close
    r3.initial_offset()
    r3.close()


def test_a_starting_query_waits_for_a_dying_holder(backend: Backend, queues, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A killed driver's leftover process may hold the endpoint for a moment: wait, then go on,
    holding the endpoint. (Fails when the lock is never taken: no wait, and a third receiver gets
    in; or when it is not waited for: ConsumerBusyError at once.)"""
    q, e = queues
    old = make_receiver(backend, q, e)
    old.initial_offset()
    release = threading.Timer(1.5, old.close)  # the leftover process exits a little later
    release.start()
    try:
        with receiving(backend, q, e) as new:
            started = time.monotonic()
            new.initial_offset()
            waited = time.monotonic() - started
            assert waited >= 1.0, f"took the endpoint after {waited:.2f}s while its holder had it for 1.5s"
            monkeypatch.setattr(setup, "LOCK_WAIT", 0.5)
            with receiving(backend, q, e) as third, pytest.raises(ConsumerBusyError) as busy:
                third.initial_offset()
            assert busy.value.field == "consumer", "the new receiver holds the endpoint"
    finally:
        release.join()


def test_missing_queue_is_a_clear_error(backend: Backend, names) -> None:  # type: ignore[no-untyped-def]
    e = backend.create_queue(names("error"))
    r = make_receiver(backend, names("Nowhere"), e)
    with pytest.raises(QueueNotFoundError, match="^queue: queue .*Nowhere.*does not exist") as missing:
        r.initial_offset()
    r.close()
    # the transport names its setting (`field`); the reader's methods name the option (`name_fields`)
    assert name_fields(missing.value).message.startswith("option 'queue': queue ")
    assert "or set option 'createQueues')" in name_fields(missing.value).message


def test_create_queues_option(backend: Backend, names) -> None:  # type: ignore[no-untyped-def]
    q, e = names("Made"), names("error")
    with receiving(backend, q, e, create_queues=True) as r:
        r.initial_offset()
    backend.send(q, nsb_headers("x"))
    assert backend.count(q) == 1


def test_recreated_claim_table_starts_from_its_beginning(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    q, e = queues
    backend.send(q, nsb_headers("old"))
    r = make_receiver(backend, q, e)
    _, last = drain(r)
    r.close()
    backend.drop(backend.claims(q))
    backend.send(q, nsb_headers("new"))
    with receiving(backend, q, e) as r2:
        assert r2.table_id != last.table
        rows, _ = drain(r2, last)
    assert [x[0] for x in rows] == ["new"]


def test_nsb_created_queue_with_int4_seq(pg: Backend, names) -> None:  # type: ignore[no-untyped-def]
    q, e = pg.create_queue(names("Legacy"), nsb=True), pg.create_queue(names("error"), nsb=True)
    with pg.connect() as c:
        typ = c.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_name = %s AND column_name = 'seq'", (q,)
        ).fetchone()[0]
    assert typ == "integer"
    for i in range(5):
        pg.send(q, nsb_headers(f"m{i}"))
    pg.send(q, "<corrupted headers")
    with receiving(pg, q, e) as r:
        rows, _ = drain(r, limit=2)
    assert [x[0] for x in rows] == [f"m{i}" for i in range(5)]
    assert pg.count(e) == 1


@pytest.mark.parametrize(
    "address",
    [
        'Sa"les',
        "A_]_B",
        "[X]",
        "Orders.Retries",  # PostgreSQL: schema Orders, table Retries
        '"my schema"."Sales.Dotted"',
        "error]; DROP TABLE [Victim]; --",
        "'; DROP TABLE \"Victim\"; --",
        "Ünïcode 😀",
    ],
)
def test_brackets_and_special_characters_in_names(pg: Backend, address: str) -> None:
    tag = uuid.uuid4().hex[:6]
    a = pg.dialect.parse_address(address)
    name = pg.dialect.format_address(a.with_table(a.table + tag))
    err = pg.create_queue(f"err_{tag}")
    with pg.connect() as c:
        c.execute('CREATE TABLE IF NOT EXISTS "Victim" (x int)')
    pg.create_queue(name)
    pg.send(name, nsb_headers("quoted"))
    with receiving(pg, name, err) as r:
        rows, _ = drain(r)
    assert [x[0] for x in rows] == ["quoted"]
    assert rows[0][-4] == name  # the queue column is the canonical address
    with pg.connect() as c:
        assert c.execute("SELECT to_regclass('\"Victim\"') IS NOT NULL").fetchone()[0]


def test_claim_ahead_holds_the_next_batch_and_loses_nothing(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    """While a backlog remains, the next batch is claimed in the background; a stop keeps it."""
    q, e = queues
    backend.send_many(q, [(nsb_headers(f"m{i:03d}"), b"x") for i in range(25)])
    r = make_receiver(backend, q, e)
    start = r.initial_offset()
    end = r.latest(start, 10)  # claims 10, then claims the next 10 ahead
    r.planner.settle_ahead()
    assert backend.unheld(q) == 5
    if not r.endpoint.mode.prepares:
        assert backend.count(r.dialect.format_address(r.claims)) == 20
    first = [x[0] for x in read_batch(r, start, end)]
    r.close()  # stops before planning the next batch: the claimed-ahead rows are held claims
    with receiving(backend, q, e, claim_ahead=False) as r2:
        rest, _ = drain(r2, end, limit=10)
    assert first == [f"m{i:03d}" for i in range(10)]
    assert [x[0] for x in rest] == [f"m{i:03d}" for i in range(10, 25)]
    assert backend.count(q) == 0


def test_a_table_that_is_not_a_queue_is_refused(pg: Backend, names) -> None:  # type: ignore[no-untyped-def]
    from spark_qtransport.errors import SchemaError

    t, e = names("NotAQueue"), pg.create_queue(names("error"))
    with pg.connect() as c:
        c.execute(f'CREATE TABLE "{t}" (id uuid, body bytea)')
    r = make_receiver(pg, t, e)
    with pytest.raises(SchemaError, match="not a queue table: missing column\\(s\\) expires, headers, seq"):
        r.initial_offset()
    r.close()


def test_poison_whose_id_the_error_queue_holds_gets_a_new_id(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    """NServiceBus keeps the native id; if the error queue has it already, the claim must not stall."""
    pg = postgres_only(backend)
    q, e = queues
    nid = pg.send(e, "<already failed once", b"old")
    pg.send(q, "<corrupted headers", b"new", native_id=nid)
    pg.send(q, nsb_headers("next"))
    with receiving(pg, q, e) as r:
        rows, _ = drain(r)
    assert [x[0] for x in rows] == ["next"]
    assert sorted(b for _, _, b in pg.rows(e)) == [b"new", b"old"]
    assert len({i for i, _, _ in pg.rows(e)}) == 2


def test_held_claims_are_delivered_within_the_limit(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    """More held claims than a batch may take (a deleted checkpoint): batches keep to the limit."""
    q, e = queues
    backend.send_many(q, [(nsb_headers(f"m{i:02d}"), b"x") for i in range(30)])
    r = make_receiver(backend, q, e, claim_ahead=False)
    start = r.initial_offset()
    r.latest(start, 30)  # 30 claimed, never delivered: the query died
    r.close()
    with receiving(backend, q, e, claim_ahead=False) as r2:
        start = r2.initial_offset()
        sizes = []
        while True:
            end = r2.latest(start, 8)
            if end == start:
                break
            sizes.append(len(read_batch(r2, start, end)))
            r2.ack(end)
            start = end
    assert sizes == [8, 8, 8, 6]


def test_a_dropped_connection_is_retried(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    """The server ends the driver's session (failover, admin, idle kill): the next call reconnects."""
    pg = postgres_only(backend)
    q, e = queues
    pg.send_many(q, [(nsb_headers(f"m{i}"), b"x") for i in range(6)])
    with receiving(pg, q, e, claim_ahead=False) as r:
        start = r.initial_offset()
        end = r.latest(start, 3)
        with pg.connect() as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (r.main.connection().info.backend_pid,))
        r.ack(end)  # first call after the drop: reconnects, re-takes the endpoint lock, goes on
        rest, _ = drain(r, end)
    assert [x[0] for x in rest] == ["m3", "m4", "m5"]
    assert pg.count(q) == 0 and pg.count(pg.claims(q)) == 0


def test_a_reused_executor_connection_the_server_dropped_is_replaced(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    pg = postgres_only(backend)
    q, e = queues
    pg.send_many(q, [(nsb_headers(f"m{i}"), b"x") for i in range(4)])
    with receiving(pg, q, e, claim_ahead=False) as r:
        start = r.initial_offset()
        end = r.latest(start, 2)
        assert len(read_batch(r, start, end)) == 2  # leaves its connection in the executor cache
        with pg.connect() as admin:  # the server ends every other session of ours, cached one included
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'spark-qtransport' AND pid <> %s AND pid <> pg_backend_pid()",
                (r.main.connection().info.backend_pid,),
            )
        r.ack(end)
        nxt = r.latest(end, 2)
        assert [x[0] for x in read_batch(r, end, nxt)] == ["m2", "m3"]


def test_a_claim_spark_waits_for_starts_small(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    """With claim-ahead, the claim made while Spark waits is a tenth of the limit (>= 1,000);
    the next, full batch is claimed in the background."""
    pg = postgres_only(backend)
    q, e = queues
    pg.send_many(q, [(nsb_headers(f"m{i:05d}"), b"x") for i in range(5000)])
    with receiving(pg, q, e) as r:
        start = r.initial_offset()
        first = r.latest(start, 20_000)
        second = r.latest(first, 20_000)
        assert len(read_batch(r, start, first)) == 2000
        assert len(read_batch(r, first, second)) == 3000


def test_forward_destination_header_is_honoured(backend: Backend, names) -> None:  # type: ignore[no-untyped-def]
    """NServiceBus's mover puts due delayed messages into the endpoint's own input queue with
    NServiceBus.SqlServer.ForwardDestination on; the receiver forwards them in its receive
    transaction (header removed, no expiry; on PostgreSQL a new native id, as NServiceBus's
    forward sends a new MessageRow), keeps those addressed to itself
    (header removed) and sends those whose destination is missing to the error queue."""
    q, e, billing = names("Sales"), names("error"), names("Billing")
    for t in (q, e, billing):
        backend.create_queue(t)
    fwd = "NServiceBus.SqlServer.ForwardDestination"
    try:
        to_billing = backend.send(q, nsb_headers("to-billing", **{fwd: billing}), b"b", ttbr_ms=3_600_000)
        backend.send(q, nsb_headers("to-self", **{fwd: q}), b"s")
        backend.send(q, nsb_headers("plain"), b"p")
        backend.send(q, nsb_headers("to-nowhere", **{fwd: names("Nowhere")}), b"n")
        backend.send(q, nsb_headers("mentions-it", **{"Custom.Note": fwd}), b"m")
        with receiving(backend, q, e) as r:
            rows, _ = drain(r)
            assert (r.stats.forwarded, r.stats.forward_failed) == (1, 1)
        got = {row[0]: row for row in rows}
        assert sorted(got) == ["mentions-it", "plain", "to-self"]
        assert fwd not in got["to-self"][2] and got["to-self"][3] == b"s"
        assert got["mentions-it"][2]["Custom.Note"] == fwd

        ((nid, text, body),) = backend.rows(billing)
        headers = json.loads(text)
        assert (body, headers["NServiceBus.MessageId"]) == (b"b", "to-billing")
        if backend.name == "postgres":  # MessageRow.From: Guid.NewGuid()
            assert uuid.UUID(nid) != to_billing
        else:
            assert nid == str(to_billing)
        assert fwd not in headers
        assert backend.count(billing, "WHERE expires IS NULL") == 1

        ((_, text, body),) = backend.rows(e)
        failed = json.loads(text)
        assert (failed["NServiceBus.MessageId"], body) == ("to-nowhere", b"n")
        assert failed["NServiceBus.FailedQ"] == names("Nowhere") and fwd not in failed
        assert "does not exist" in failed["NServiceBus.ExceptionInfo.Message"]
        assert backend.count(q) == 0 and backend.count(backend.claims(q)) == 0
    finally:
        for t in (q, e, billing, backend.claims(q)):
            backend.drop(t)


def test_the_backlog_estimate_looks_above_the_rows_our_claims_took(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    """The estimate steps over no row this stream's claims took (held by a prepared claim, or dead
    but kept in the index while a prepared claim holds vacuum's horizon back): it looks above the
    highest one for LOW_WATER_TTL seconds, then above the claims still held only."""
    q, e = queues
    for i in range(30):
        backend.send(q, nsb_headers(f"m{i:02d}"))
    now = [1000.0]
    r = Receiver(ReceiveSettings.create(backend.url, q, error_queue=e, claim_ahead=False), clock=lambda: now[0])
    try:
        start = r.initial_offset()
        assert r.planner.estimate_floor() == 0
        end = r.latest(start, 10)
        taken = max(x.source_seq for x in read_batch(r, start, end))
        assert r.planner.estimate_floor() == taken
        assert r.backlog() == 20  # the rows no claim took, counted above the floor
        r.ack(end)
        now[0] += LOW_WATER_TTL - 1
        assert r.planner.estimate_floor() == taken
        now[0] += 2  # past the mark's life: a row released below it is counted again
        assert r.planner.estimate_floor() == max([c.high for c in r.planner.ledger.prepared()], default=0) < taken
        assert r.backlog() == 20
    finally:
        r.close()


def test_the_backlog_estimate_looks_above_a_claim_made_ahead(backend: Backend, queues) -> None:  # type: ignore[no-untyped-def]
    """A claim made ahead in the background counts as soon as it is made: the progress report's
    estimate runs on the same thread right after it, before the next batch applies it."""
    q, e = queues
    for i in range(30):
        backend.send(q, nsb_headers(f"m{i:02d}"))
    with receiving(backend, q, e) as r:
        start = r.initial_offset()
        end = r.latest(start, 10)
        ahead = r.planner._ahead  # the next 10, claimed while Spark reads these
        assert ahead is not None
        made = ahead.result().result
        assert made is not None and made.max_source is not None
        assert made.max_source > max(x.source_seq for x in read_batch(r, start, end))
        assert r.planner.estimate_floor() == made.max_source
        assert r.backlog() == 10


def test_a_claim_waits_for_a_backlog_estimate_in_flight_and_keeps_fifo(backend: Backend, queues,  # type: ignore[no-untyped-def]
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress backlog is estimated on the background thread, and the estimate locks the
    queue's first and last unlocked rows while it runs (`ReceiveSql.backlog`). A claim on the main
    session beside it skipped the head row: one message came a batch late (CI, Spark 4.3). The
    claim now waits for the estimate in flight (`Claimer.head`); the estimate here holds its locks
    for a second."""
    from spark_qtransport.transport import session as db

    postgres_only(backend)
    q, e = queues
    held = threading.Event()

    def slow_estimate(self: Receiver, session: Any) -> int:
        stmt = self.dialect.backlog(self.options.queue, above=self.planner.estimate_floor())

        def locked(c: Any) -> int:
            (n,) = db.one(c.cursor(), stmt)
            held.set()
            time.sleep(1.0)  # its row locks held, as a slow server holds them
            return int(n or 0)
        return int(session.run(locked))

    with receiving(backend, q, e, claim_ahead=False, claim_mode="table") as r:
        for i in range(10):
            backend.send(q, nsb_headers(f"m-{i:02d}"), b"{}")
        start = r.initial_offset()
        first = r.latest(start, 100)
        assert [m.message_id for m in read_batch(r, start, first)] == [f"m-{i:02d}" for i in range(10)]
        for i in range(10, 20):
            backend.send(q, nsb_headers(f"m-{i:02d}"), b"{}")
        monkeypatch.setattr(Receiver, "estimate", slow_estimate)
        r.background.submit(r._refresh_backlog)  # as a progress report does
        assert held.wait(30)
        second = r.latest(first, 100)
        assert [m.message_id for m in read_batch(r, first, second)] == [f"m-{i:02d}" for i in range(10, 20)]

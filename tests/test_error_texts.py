"""The text of each of our error classes, whole, as the real code builds it: one test per class.

Other tests check the class and fields of an error (`QueueNotFoundError.queue`,
`ConfigError.option`, ...) and at most a short fragment of its text, so a reworded message
breaks only the test here that holds its words. Each error is caused through the code path that
raises it (options parsed, a row built, a receiver or sender set up against the session's
PostgreSQL), never through Spark. Where a field of the transport is at fault the text is checked
twice: as the transport builds it (``<field>: ...``, settings fields in backticks) and as the
source and sink name it for the user (`registry.name_fields`, what `spark.surface` applies).

OutboxRaceError happens only when a concurrent cleanup deletes an outbox record between the two
statements of `Outbox.begin`; the test makes that happen, between those statements, on a second
connection (a cursor that runs the cleanup's DELETE once the INSERT has run).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

import pytest

from backends import Backend, Sender
from spark_qtransport.dialects import dialect_named
from spark_qtransport.errors import (
    ConfigError,
    ConsumerBusyError,
    DatabaseError,
    DispatchError,
    MessageError,
    OffsetError,
    OutboxConflictError,
    OutboxRaceError,
    QTransportError,
    QueueNotFoundError,
    SchemaError,
)
from spark_qtransport.options.parse import ReaderOptions
from spark_qtransport.options.registry import name_fields
from spark_qtransport.transport import session as db
from spark_qtransport.transport.receiving import setup
from spark_qtransport.transport.receiving.planner import ClaimOffset
from spark_qtransport.transport.receiving.receiver import Receiver
from spark_qtransport.transport.sending.builder import MessageBuilder
from spark_qtransport.transport.sending.messages import SendPlan
from spark_qtransport.transport.sending.outbox import Outbox

URL = "postgresql://app:s3cr3t@127.0.0.1:5432/shop"


def texts(exc: QTransportError) -> tuple[str, str]:
    """The error's text as the transport raises it, and as the source and sink show it."""
    return str(exc), str(name_fields(exc))


def set_up(pg: Backend, queue: str, error_queue: str) -> QTransportError:
    """The error a receiver's set-up raises (the first thing a stream does with its queues)."""
    r = Receiver(ReaderOptions.parse({"url": pg.url, "queue": queue, "errorQueue": error_queue}))
    try:
        with pytest.raises(QTransportError) as info:
            r.initial_offset()
    finally:
        r.close()
    return info.value


def test_config_error_text() -> None:
    with pytest.raises(ConfigError) as info:
        ReaderOptions.parse({"url": URL, "queue": "Sales", "numPartitions": "0"})
    assert str(info.value) == "option 'numPartitions' must be at least 1, not 0"
    # a settings field's error, named by the source: the field at fault and the one it refers to
    with pytest.raises(ConfigError) as info:
        ReaderOptions.parse({"url": URL, "queue": "Sales", "errorQueue": '"public"."Sales"'})
    assert str(info.value) == "option 'errorQueue' must name another queue than option 'queue'"


def test_message_error_text() -> None:
    plan = SendPlan(dialect="postgres", endpoint="Sales", default_destination=dialect_named("postgres").parse_address("Billing"),
                    reply_to=None, content_type="application/json", sink="default")
    row = {"body": b"{}", "message_id": "order-7", "message_type": "Shop.PlaceOrder", "delay": math.nan}
    with pytest.raises(MessageError) as info:
        MessageBuilder(plan, batch_id=1, attempt="a").build(row, datetime.now(timezone.utc))
    assert str(info.value) == "column 'delay' of message 'order-7': nan is not a finite number of seconds"


def test_queue_not_found_error_text(pg: Backend, names: Any) -> None:
    missing, error = names("Missing"), pg.create_queue(names("error"))
    exc = set_up(pg, missing, error)
    assert type(exc) is QueueNotFoundError
    assert texts(exc) == (
        f'queue: queue "public"."{missing}" does not exist; create it (the DDL in sql/, or set `create_queues`)',
        f"option 'queue': queue \"public\".\"{missing}\" does not exist; create it (the DDL in sql/, or set "
        "option 'createQueues')",
    )


def test_schema_error_text(pg: Backend, names: Any) -> None:
    queue, not_a_queue = pg.create_queue(names("Sales")), names("Notes")
    with pg.connect() as c:
        c.execute(f'CREATE TABLE "{not_a_queue}" (id uuid, headers text)')
    exc = set_up(pg, queue, not_a_queue)
    assert type(exc) is SchemaError
    assert texts(exc) == (
        f'error_queue: table "public"."{not_a_queue}" is not a queue table: missing column(s) body, expires, seq',
        f"option 'errorQueue': table \"public\".\"{not_a_queue}\" is not a queue table: missing column(s) body, "
        "expires, seq",
    )


def test_consumer_busy_error_text(pg: Backend, names: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(setup, "LOCK_WAIT", 0.0)  # say it at once, not after the usual wait
    queue, error = pg.create_queue(names("Sales")), pg.create_queue(names("error"))
    first = Receiver(ReaderOptions.parse({"url": pg.url, "queue": queue, "errorQueue": error}))
    try:
        first.initial_offset()  # holds the endpoint's consumer lock
        exc = set_up(pg, queue, error)
    finally:
        first.close()
    assert type(exc) is ConsumerBusyError
    said = (f"endpoint '{queue}' is already receiving from queue \"public\".\"{queue}\" in another running query "
            "(waited 0s); give each query its own ")
    assert texts(exc) == (said + "`consumer`", said + "option 'endpoint'")


def test_offset_error_text() -> None:
    with pytest.raises(OffsetError) as info:
        ClaimOffset.from_dict({"queues": {}})
    assert str(info.value) == ("this checkpoint is of a stream over several queues; a checkpoint cannot switch between "
                               "one queue and several: start this stream from a new checkpoint")


def test_outbox_conflict_error_text(pg: Backend, names: Any) -> None:
    sales, billing = pg.create_queue(names("Sales")), pg.create_queue(names("Billing"))
    s = Sender(pg, sales, destination=billing)
    s.send([{"body": b"{}", "message_type": "T", "message_id": "a"}], batch_id=0, query="query-one")
    with pytest.raises(OutboxConflictError) as info:
        s.send([{"body": b"{}", "message_type": "T", "message_id": "b"}], batch_id=0, query="query-two")
    d = pg.dialect
    conn = d.connect(pg.parsed)  # the record's time as the sender's own connection reads it
    try:
        (_, dispatched_at, *_) = db.first(conn.cursor(), d.outbox_get(s.options.outbox, sink="default", batch_id=0))
    finally:
        db.close(conn)
    said = (f"batch 0 of sink 'default' of endpoint '{sales}' was already dispatched at {dispatched_at} by another run "
            "(query query-one; this is query query-two): the checkpoint was deleted or reset, or another query sends "
            "as the same endpoint. Nothing was sent. Give this query its own {}; or, if the old checkpoint is gone "
            f"for good, delete its records: DELETE FROM \"public\".\"{sales}.Outbox\" WHERE sink = 'default'")
    assert texts(info.value) == (said.format("`sink` or `endpoint`"), said.format("option 'sinkName' or option 'endpoint'"))


class _CleanedUpMeanwhile:
    """A cursor that, once the outbox INSERT has run, deletes the batch's record on another
    connection, as `Outbox.cleanup` of a concurrent dispatch would."""

    def __init__(self, cur: Any, cleanup: Any) -> None:
        self._cur, self._cleanup = cur, cleanup

    def execute(self, *args: Any) -> Any:
        result = self._cur.execute(*args)
        if str(args[0]).lstrip().startswith("INSERT") and self._cleanup is not None:
            self._cleanup()
            self._cleanup = None
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


def test_outbox_race_error_text(pg: Backend, names: Any) -> None:
    sales = pg.create_queue(names("Sales"))
    options = Sender(pg, sales).options  # sets up the sender's tables
    d = pg.dialect
    outbox = Outbox(d, options.outbox, options.staging, options.endpoint.table, options.sink)
    conn = d.connect(pg.parsed)
    try:
        assert outbox.begin(conn.cursor(), 0, "query one") is None  # recorded: dispatched by another query
        conn.commit()

        def cleanup() -> None:
            with pg.connect() as other:
                other.execute(f"DELETE FROM {d.qualified(options.outbox)} WHERE batch_id = 0")

        with pytest.raises(OutboxRaceError) as info:
            outbox.begin(_CleanedUpMeanwhile(conn.cursor(), cleanup), 0, "query two")
    finally:
        db.close(conn)
    assert str(info.value) == "outbox record of batch 0 vanished while dispatching; retry"


def test_dispatch_error_text(pg: Backend, names: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Sender, "inline_bytes", 0)  # the task stages its rows
    sales, billing = pg.create_queue(names("Sales")), pg.create_queue(names("Billing"))
    s = Sender(pg, sales, destination=billing)
    staged = s.stage([{"body": b"{}", "message_type": "T", "message_id": "a"}], batch_id=0)
    with pg.connect() as c:  # what a restart of the database does to the UNLOGGED staging table
        c.execute(f"DELETE FROM {pg.dialect.qualified(s.options.staging)}")
    with pytest.raises(DispatchError) as info:
        s.dispatch(0, [staged])
    assert str(info.value) == (f"batch 0 of endpoint {sales}: the tasks staged 1 messages but 0 are in "
                               f"\"public\".\"{sales}.Staging\" (database restarted?). Nothing was sent; restart the "
                               "query to stage the batch again")


def test_database_error_text(pg: Backend) -> None:
    with pytest.raises(DatabaseError) as info:
        db.retrying(pg.dialect, lambda conn: conn.execute("SELECT 1/0"), connection=lambda: pg.dialect.connect(pg.parsed),
                    discard=db.close, what="read Q")
    assert str(info.value) == "read Q failed: DivisionByZero: division by zero"

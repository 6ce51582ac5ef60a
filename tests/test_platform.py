"""The Particular platform on the acknowledgement path, per dialect (PostgreSQL always, SQL Server
when configured): audit copies, forwardTo copies and ServiceControl retry acknowledgements are
written with the acknowledgement, exactly once, server-side; expired and poison messages are
never audited. Driven without Spark, as test_receive_contract does (claim, read, acknowledge)."""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from test_receive_contract import drain, receiving

from backends import Backend, nsb_headers
from spark_qtransport.wire import H, host_id, machine, parse_time

AUDIT_ADDED = (H.PROCESSING_STARTED, H.PROCESSING_ENDED, H.PROCESSING_ENDPOINT, H.PROCESSING_MACHINE, H.HOST_ID,
               H.HOST_DISPLAY_NAME)


def _queues(backend: Backend, names: Any, *kinds: str) -> list[str]:
    return [backend.create_queue(names(k)) for k in kinds]


def _headers(rows: list[tuple[str, str, bytes | None]]) -> list[dict[str, str]]:
    return [json.loads(h) for _, h, _ in rows]


def test_audit_and_forward_copies_are_made_once_with_the_acknowledgement(backend: Backend, names: Any) -> None:
    q, e, audit, copy = _queues(backend, names, "Sales", "error", "audit", "copy")
    sent_at = datetime.now(timezone.utc) - timedelta(seconds=1)
    stamp = sent_at.strftime("%Y-%m-%d %H:%M:%S:%f Z")
    messages = [(nsb_headers(f"m{i:03d}", **{H.TIME_SENT: stamp}), f"body {i} \u00e9".encode()) for i in range(30)]
    backend.send_many(q, messages)
    backend.send(q, nsb_headers("expired"), b"old", ttbr_ms=1)
    time.sleep(0.05)
    backend.send_many(q, [("{not json", b"poison")])
    with receiving(backend, q, e, audit_queue=backend.address(audit), forward_to=backend.address(copy),
                   consumer="Sales.Spark") as r:
        start = r.initial_offset()
        end = r.latest(start, 1000)
        r.slices(start, end)  # Spark asks for the partitions: the batch's planning
        before_ack = datetime.now(timezone.utc)
        assert backend.count(audit) == 0  # nothing before the acknowledgement
        r.ack(end)
        r.ack(end)  # a repeated acknowledgement copies nothing
        rest, _ = drain(r, end)
        assert rest == []
        report = r.report()
    audited, forwarded = backend.rows(audit), backend.rows(copy)
    assert len(audited) == len(forwarded) == 30 == report["audited"] == report["forwardedTo"]
    by_id = {h[H.MESSAGE_ID]: (h, body) for (_, _, body), h in zip(audited, _headers(audited), strict=True)}
    for (headers, body), (_, text, fbody) in zip(messages, forwarded, strict=True):
        got, abody = by_id[headers[H.MESSAGE_ID]]
        assert abody == body and fbody == body
        assert json.loads(text) == headers  # forwardTo: unchanged
        assert {k: v for k, v in got.items() if k not in AUDIT_ADDED} == headers  # every header kept
        started, ended = parse_time(got[H.PROCESSING_STARTED]), parse_time(got[H.PROCESSING_ENDED])
        assert started is not None and ended is not None
        assert len(got[H.PROCESSING_STARTED]) == len("2020-11-02 08:07:44:650218 Z")
        assert sent_at <= started <= ended and started <= before_ack + timedelta(seconds=5)
        assert got[H.PROCESSING_ENDPOINT] == "Sales.Spark" and got[H.PROCESSING_MACHINE] == machine()
        assert got[H.HOST_ID] == host_id("Sales.Spark") and len(got[H.HOST_ID]) == 32
        assert H.RETRY_ACK_SENT not in got
    ids = {json.loads(h)[H.MESSAGE_ID] for _, h, _ in audited}
    assert "expired" not in ids and backend.count(e) == 1  # the poison row went raw to the error queue
    assert len({row_id for row_id, _, _ in audited}) == 30  # new native ids


def test_audit_time_to_be_received_sets_expires(pg: Backend, names: Any) -> None:
    q, e, audit = _queues(pg, names, "Sales", "error", "audit")
    pg.send_many(q, [(nsb_headers("a"), b"x")])
    with receiving(pg, q, e, audit_queue=pg.address(audit), audit_ttbr_seconds=3600.0) as r:
        drain(r)
    with pg.connect() as c:
        (left,) = c.execute(f"SELECT expires - (now() AT TIME ZONE 'UTC') FROM {pg.q(audit)}").fetchone()
    assert timedelta(minutes=59) < left <= timedelta(hours=1)


def test_a_servicepulse_retry_is_acknowledged_once_and_its_audit_copy_says_so(
    backend: Backend, names: Any, caplog: Any
) -> None:
    q, e, audit, acks = _queues(backend, names, "Sales", "error", "audit", "acks")
    ack_address = backend.dialect.format_address(backend.address(acks))
    retried = nsb_headers("r1", **{H.RETRY_UNIQUE_MESSAGE_ID: "u-1", H.RETRY_ACK_QUEUE: ack_address})
    nowhere = nsb_headers("r2", **{H.RETRY_UNIQUE_MESSAGE_ID: "u-2", H.RETRY_ACK_QUEUE: "NoSuchQueue"})
    backend.send_many(q, [(nsb_headers("plain"), b"p"), (retried, b"r"), (nowhere, b"n")])
    with caplog.at_level(logging.WARNING), receiving(backend, q, e, audit_queue=backend.address(audit)) as r:
        start = r.initial_offset()
        end = r.latest(start, 1000)
        r.ack(end)
        r.ack(end)
        report = r.report()
    sent = backend.rows(acks)
    assert len(sent) == 1 and report["retryAcknowledged"] == 1 and report["retryAcknowledgementsRefused"] == 1
    (_, text, body) = sent[0]
    ack = json.loads(text)
    assert set(ack) == {H.RETRY_SUCCESSFUL, H.RETRY_UNIQUE_MESSAGE_ID, H.CONTROL_MESSAGE}
    assert ack[H.RETRY_UNIQUE_MESSAGE_ID] == "u-1" and ack[H.CONTROL_MESSAGE] == "True"
    assert parse_time(ack[H.RETRY_SUCCESSFUL]) is not None and not body
    audited = {h[H.MESSAGE_ID]: h for h in _headers(backend.rows(audit))}
    assert audited["r1"][H.RETRY_ACK_SENT] == "true"
    assert H.RETRY_ACK_SENT not in audited["r2"] and H.RETRY_ACK_SENT not in audited["plain"]
    [warned] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "acknowledgement" in r.getMessage()]
    assert "NoSuchQueue" in warned and backend.count(e) == 0  # the acknowledgement queue it could not send to


def test_retries_are_acknowledged_without_auditing_too(backend: Backend, names: Any) -> None:
    q, e, acks = _queues(backend, names, "Sales", "error", "acks")
    ack_address = backend.dialect.format_address(backend.address(acks))
    backend.send_many(q, [(nsb_headers(f"m{i}"), b"x") for i in range(5)]
                      + [(nsb_headers("r", **{H.RETRY_UNIQUE_MESSAGE_ID: "u", H.RETRY_ACK_QUEUE: ack_address}), b"y")])
    with receiving(backend, q, e, ack_batch=2) as r:
        start = r.initial_offset()
        end = r.latest(start, 1000)
        assert r.ack(end) == 6
        assert r.ack(end) == 0
    assert backend.count(acks) == 1 and backend.count(backend.claims(q)) == 0


def test_a_chunk_that_meets_a_retry_acknowledges_every_retry_up_to_the_end_once(backend: Backend, names: Any) -> None:
    """A chunk's headers name a ServicePulse retry: the retries up to the acknowledgement's end are
    acknowledged then, with those after the chunk (counted with it, and gone before the chunk that
    would have read them); the chunks between acknowledge nothing twice."""
    q, e, acks = _queues(backend, names, "Sales", "error", "acks")
    ack_address = backend.dialect.format_address(backend.address(acks))

    def retry(i: int) -> tuple[str, bytes]:
        return nsb_headers(f"r{i}", **{H.RETRY_UNIQUE_MESSAGE_ID: f"u-{i}", H.RETRY_ACK_QUEUE: ack_address}), b"r"

    backend.send_many(q, [(nsb_headers("m0"), b"x"), retry(1), (nsb_headers("m2"), b"x"), (nsb_headers("m3"), b"x"),
                          retry(4)])
    with receiving(backend, q, e, ack_batch=2) as r:
        start = r.initial_offset()
        end = r.latest(start, 1000)
        assert r.ack(end) == 5
        assert r.ack(end) == 0
        report = r.report()
    assert sorted(json.loads(h)[H.RETRY_UNIQUE_MESSAGE_ID] for _, h, _ in backend.rows(acks)) == ["u-1", "u-4"]
    assert report["retryAcknowledged"] == 2 and backend.count(backend.claims(q)) == 0


def test_a_reader_of_platform_queues_acknowledges_no_retry(backend: Backend, names: Any) -> None:
    """retryAcknowledgements=false (jobs/audit_to_delta.py on the audit queue): an audited retry's
    copy is taken like any other message, with and without copies to make."""
    q, e, audit, acks = _queues(backend, names, "audit", "error", "audit.copy", "acks")
    ack_address = backend.dialect.format_address(backend.address(acks))
    retried = nsb_headers("r", **{H.RETRY_UNIQUE_MESSAGE_ID: "u", H.RETRY_ACK_QUEUE: ack_address,
                                  H.RETRY_ACK_SENT: "true"})
    for copies in ({}, {"audit_queue": backend.address(audit)}):
        backend.send_many(q, [(nsb_headers("m"), b"x"), (retried, b"y")])
        with receiving(backend, q, e, acknowledge_retries=False, **copies) as r:
            start = r.initial_offset()
            end = r.latest(start, 1000)
            assert r.ack(end) == 2
            report = r.report()
        assert report.get("retryAcknowledged", 0) == 0 and backend.count(acks) == 0 and backend.count(backend.claims(q)) == 0
    assert backend.count(audit) == 2


def test_platform_queues_are_checked_at_start(pg: Backend, names: Any) -> None:
    import pytest

    from spark_qtransport.errors import QueueNotFoundError, SchemaError

    q, e = _queues(pg, names, "Sales", "error")
    with pytest.raises(QueueNotFoundError, match="^audit_queue: queue "), receiving(
            pg, q, e, audit_queue=pg.address(names("missing"))) as r:
        r.latest(r.initial_offset(), 10)
    claims = pg.dialect.claims_table(pg.address(q))
    with pytest.raises(SchemaError) as refused, receiving(pg, q, e, forward_to=claims) as r:
        r.latest(r.initial_offset(), 10)
    assert (refused.value.field, refused.value.queue) == ("forward_to", pg.dialect.format_address(claims))
    assert "transport itself" in str(refused.value)  # why: its own claim table, not a queue


def test_failure_headers_are_those_of_moving_to_the_error_queue() -> None:
    """MoveToError removes the retry counters; FaultMetadataExtractor and the static fault metadata
    add FailedQ, the exception, TimeOfFailure, the processing endpoint and machine, and host ids."""
    from spark_qtransport.wire import FAILURE_HEADERS, failure_headers

    got = failure_headers({H.RETRIES: "3", H.FL_RETRIES: "5", H.RETRIES_TIMESTAMP: "t", "x": "y"}, failed_q="Sales",
                          exception_type="T", message="m" * 20_000, source="s", endpoint="Sales.Spark", stack_trace="st")
    assert H.RETRIES not in got and H.FL_RETRIES not in got and got[H.RETRIES_TIMESTAMP] == "t" and got["x"] == "y"
    assert set(FAILURE_HEADERS) <= set(got) and len(got[H.EXCEPTION_MESSAGE] or "") == 16_384
    assert got[H.HOST_ID] == host_id("Sales.Spark") and got[H.HOST_DISPLAY_NAME] == machine()
    assert got[H.EXCEPTION_STACK_TRACE] == "st" and parse_time(got[H.TIME_OF_FAILURE]) is not None


def test_an_audit_queue_that_refuses_for_good_stops_the_query_and_loses_nothing(pg: Backend, names: Any) -> None:
    import pytest

    from spark_qtransport.errors import DatabaseError

    q, e, audit = _queues(pg, names, "Sales", "error", "audit")
    pg.send_many(q, [(nsb_headers(f"m{i}"), b"x") for i in range(4)])
    with pg.connect() as c:
        c.execute("CREATE OR REPLACE FUNCTION sqlqueue_test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
                  "$$ BEGIN RAISE EXCEPTION 'audit is closed'; END $$")
        c.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON {pg.q(audit)} FOR EACH ROW EXECUTE FUNCTION sqlqueue_test_refuse()")
    with receiving(pg, q, e, audit_queue=pg.address(audit)) as r:
        start = r.initial_offset()
        end = r.latest(start, 1000)
        r.ack(end, background=True)  # as Spark's commit does
        deadline = time.monotonic() + 30
        while r.acker.failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(DatabaseError, match="audit is closed"):
            r.latest(end, 1000)
    assert pg.count(pg.claims(q)) == 4 and pg.count(audit) == 0  # still claimed: delivered again after a fix


def test_acknowledgements_that_overlap_copy_each_message_once(backend: Backend, names: Any) -> None:
    """A foreground acknowledgement (a run's last batch) while the background thread still works
    through an earlier one: the two never copy the same claims."""
    q, e, audit, copy = _queues(backend, names, "Sales", "error", "audit", "copy")
    backend.send_many(q, [(nsb_headers(f"m{i:05d}"), b"x") for i in range(3000)])
    with receiving(backend, q, e, audit_queue=backend.address(audit), forward_to=backend.address(copy),
                   ack_batch=200) as r:
        start = r.initial_offset()
        middle = r.latest(start, 2000)
        end = r.latest(middle, 2000)
        r.ack(middle, background=True)
        r.ack(end)
        r.ack(end, background=True)
        r.background.submit(lambda: None).result(60)  # the background thread is done
    assert backend.count(audit) == backend.count(copy) == 3000
    assert backend.count(backend.claims(q)) == 0


def test_a_chunk_run_again_after_its_connection_died_is_counted_once(pg: Backend, names: Any) -> None:
    """The chunk's connection dies after its copies, before its commit (the server ends the session
    at the claims' DELETE, once): the session runs the chunk again on a new connection. The copies
    exist once, and the progress report counts them once (it counted the rolled-back try too)."""
    q, e, audit, copy = _queues(pg, names, "Sales", "error", "audit", "copy")
    pg.send_many(q, [(nsb_headers(f"m{i:03d}"), b"{}") for i in range(30)])
    once = names("die_once")
    with receiving(pg, q, e, audit_queue=pg.address(audit), forward_to=pg.address(copy)) as r:
        start = r.initial_offset()
        end = r.latest(start, 1000)
        r.slices(start, end)
        with pg.connect() as c:
            c.execute(f'CREATE SEQUENCE public."{once}"')
            c.execute(f'CREATE FUNCTION public."{once}"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
                      f"IF nextval('public.\"{once}\"') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF; "
                      "RETURN NULL; END $$")
            c.execute(f'CREATE TRIGGER die_once BEFORE DELETE ON {pg.q(pg.claims(q))} '
                      f'FOR EACH STATEMENT EXECUTE FUNCTION public."{once}"()')
        r.ack(end)
        report = r.report()
        with pg.connect() as c:
            (tries,) = c.execute(f'SELECT last_value FROM public."{once}"').fetchone()
    assert tries >= 2, "the chunk was run again"
    assert pg.count(audit) == pg.count(copy) == 30 == report["audited"] == report["forwardedTo"]
    assert pg.held(q) == 0
